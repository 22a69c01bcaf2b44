//! A split's ranks over Arrow Flight, for trainers in any language: `DoGet`
//! with a ticket naming the split, the rank and the epoch
//! ([`SplitHandle::flight_ticket`]) streams the rank's rows of that epoch.
//! gRPC runs over TLS 1.3 on streambatch's own rustls acceptor, a client
//! certificate of the cluster required, as for QUIC. A row counts as
//! delivered once handed to gRPC (Flight has no per-message
//! acknowledgement); a client that goes away leaves the epoch, and what it
//! did not take goes to the other ranks.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use streambatch_net::Identity;
use streambatch_plan::{EpochStream, Error, Result};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::{Request, Response, Status, Streaming};

use crate::SplitHandle;
use crate::ranks::Ranks;

/// How long a client may take over its TLS handshake.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);

impl SplitHandle {
    /// The Flight ticket for this rank's epoch `epoch`:
    /// `SERVICE/RANK/EPOCH`, `SERVICE` in hexadecimal.
    ///
    /// ```
    /// let handle: streambatch_split::SplitHandle =
    ///     "sbsplit://driver@127.0.0.1:7500/00000000000000ff/1/2".parse().unwrap();
    /// assert_eq!(handle.flight_ticket(3), b"00000000000000ff/1/3".to_vec());
    /// ```
    pub fn flight_ticket(&self, epoch: usize) -> Vec<u8> {
        format!("{:016x}/{}/{epoch}", self.service, self.rank).into_bytes()
    }
}

/// Parses a ticket into (service, rank, epoch).
fn parse_ticket(ticket: &[u8]) -> std::result::Result<(u64, u32, u64), Status> {
    let bad = || Status::invalid_argument("a split ticket is SERVICE/RANK/EPOCH");
    let text = std::str::from_utf8(ticket).map_err(|_| bad())?;
    let mut parts = text.split('/');
    let (Some(service), Some(rank), Some(epoch), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    Ok((
        u64::from_str_radix(service, 16).map_err(|_| bad())?,
        rank.parse().map_err(|_| bad())?,
        epoch.parse().map_err(|_| bad())?,
    ))
}

/// Listens on `listen` (TCP) and serves Flight until the runtime stops.
pub(crate) fn start(
    runtime: &tokio::runtime::Runtime,
    identity: &Identity,
    listen: SocketAddr,
    ranks: Arc<Ranks>,
) -> Result<SocketAddr> {
    let failed = |e: &dyn std::fmt::Display| Error::Start {
        what: "the split's Flight service",
        source: e.to_string().into(),
    };
    let acceptor = identity.grpc_acceptor().map_err(|e| failed(&e))?;
    let listener = runtime
        .block_on(TcpListener::bind(listen))
        .map_err(|e| failed(&e))?;
    let addr = listener.local_addr().map_err(|e| failed(&e))?;
    let (connections, incoming) = tokio::sync::mpsc::channel::<TlsConn>(16);
    runtime.spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, connections) = (acceptor.clone(), connections.clone());
            // Each handshake on its own: a silent stranger holds up nobody.
            tokio::spawn(async move {
                let accepted = tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(tcp)).await;
                if let Ok(Ok(tls)) = accepted {
                    let _ = connections.send(TlsConn(tls)).await;
                }
            });
        }
    });
    let incoming = futures::stream::unfold(incoming, |mut incoming| async move {
        let conn = incoming.recv().await?;
        Some((Ok::<_, std::io::Error>(conn), incoming))
    });
    let service = FlightServiceServer::new(SplitFlight { ranks });
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    Ok(addr)
}

/// A client's TLS connection, as tonic serves it.
struct TlsConn(tokio_rustls::server::TlsStream<TcpStream>);

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = Option<SocketAddr>;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.get_ref().0.peer_addr().ok()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The Flight service of a split.
struct SplitFlight {
    ranks: Arc<Ranks>,
}

/// A rank's epoch as a stream of batches: pulled on a blocking thread (the
/// epoch's barrier and the job block), two batches ahead at most. A rank
/// that gets no rows still sends an empty batch, so that its reader learns
/// the columns (a Flight stream without a schema is an error to it).
fn batches(
    mut stream: EpochStream,
) -> BoxStream<'static, std::result::Result<RecordBatch, FlightError>> {
    let (sender, receiver) = tokio::sync::mpsc::channel(2);
    // Each piece is a batch to the client (its own re-batching unseen).
    let batches = stream.batch_count();
    tokio::task::spawn_blocking(move || {
        let mut sent_any = false;
        loop {
            // Handed to gRPC: delivered.
            stream.confirm();
            let Some(next) = stream.next() else {
                if let Some(schema) = stream.schema().filter(|_| !sent_any) {
                    let _ = sender.blocking_send(Ok(RecordBatch::new_empty(schema)));
                }
                return;
            };
            sent_any = true;
            let next = next.map_err(|e| FlightError::ExternalError(Box::new(e)));
            let failed = next.is_err();
            // The client went away: dropping the stream leaves the epoch.
            if sender.blocking_send(next).is_err() || failed {
                return;
            }
            batches.add(1);
        }
    });
    futures::stream::unfold(receiver, |mut receiver| async move {
        let next = receiver.recv().await?;
        Some((next, receiver))
    })
    .boxed()
}

type Stream<T> = BoxStream<'static, std::result::Result<T, Status>>;

fn unsupported<T>(what: &str) -> std::result::Result<T, Status> {
    Err(Status::unimplemented(format!(
        "a split's Flight service serves DoGet only, not {what}"
    )))
}

#[tonic::async_trait]
impl FlightService for SplitFlight {
    type HandshakeStream = Stream<HandshakeResponse>;
    type ListFlightsStream = Stream<FlightInfo>;
    type DoGetStream = Stream<FlightData>;
    type DoPutStream = Stream<PutResult>;
    type DoActionStream = Stream<arrow_flight::Result>;
    type ListActionsStream = Stream<ActionType>;
    type DoExchangeStream = Stream<FlightData>;

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> std::result::Result<Response<Self::DoGetStream>, Status> {
        let peer = match request.extensions().get::<Option<SocketAddr>>() {
            Some(Some(addr)) => format!("the Flight client at {addr}"),
            _ => "a Flight client".to_string(),
        };
        let (service, rank, epoch) = parse_ticket(&request.get_ref().ticket)?;
        let stream = self
            .ranks
            .claim(service, rank, epoch, &peer)
            .map_err(Status::not_found)?;
        let data = FlightDataEncoderBuilder::new()
            .build(batches(stream))
            .map(|data| data.map_err(Status::from));
        Ok(Response::new(data.boxed()))
    }

    async fn handshake(
        &self,
        _: Request<Streaming<HandshakeRequest>>,
    ) -> std::result::Result<Response<Self::HandshakeStream>, Status> {
        unsupported("Handshake")
    }

    async fn list_flights(
        &self,
        _: Request<Criteria>,
    ) -> std::result::Result<Response<Self::ListFlightsStream>, Status> {
        unsupported("ListFlights")
    }

    async fn get_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        unsupported("GetFlightInfo")
    }

    async fn poll_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<PollInfo>, Status> {
        unsupported("PollFlightInfo")
    }

    async fn get_schema(
        &self,
        _: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<SchemaResult>, Status> {
        unsupported("GetSchema")
    }

    async fn do_put(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> std::result::Result<Response<Self::DoPutStream>, Status> {
        unsupported("DoPut")
    }

    async fn do_exchange(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> std::result::Result<Response<Self::DoExchangeStream>, Status> {
        unsupported("DoExchange")
    }

    async fn do_action(
        &self,
        _: Request<Action>,
    ) -> std::result::Result<Response<Self::DoActionStream>, Status> {
        unsupported("DoAction")
    }

    async fn list_actions(
        &self,
        _: Request<Empty>,
    ) -> std::result::Result<Response<Self::ListActionsStream>, Status> {
        unsupported("ListActions")
    }
}
