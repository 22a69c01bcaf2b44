//! A split's ranks over Arrow Flight, for trainers in any language: `DoGet`
//! with a ticket naming the split, the rank and the epoch
//! ([`SplitHandle::flight_ticket`]) streams the rank's rows of that epoch.
//! gRPC runs over TLS 1.3 on streambatch's own rustls acceptor, a client
//! certificate of the cluster required, as for QUIC.
//!
//! Flight has no per-message acknowledgement, so by default a row counts
//! as delivered once handed to gRPC: a client that goes away leaves the
//! epoch, and what had not been handed over goes to the other ranks (what
//! gRPC had buffered for it is gone with it). A client that wants every
//! row exactly once asks with a confirming ticket
//! ([`SplitHandle::flight_ticket_confirming`]) and says, with the `confirm`
//! action, how many batches it has read: what it had not confirmed when it
//! went away goes to the other ranks. Either way a client that stops
//! reading for the split's `stalled_trainer_timeout` leaves the epoch
//! (what it held counted in `RankStats::lost_rows`), so no rank waits for
//! it for ever.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

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
use streambatch_plan::{BatchCount, Confirmer, EpochStream, Error, Piece, Result};
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

    /// The Flight ticket for this rank's epoch `epoch`, read by a client
    /// that confirms what it has read (`SERVICE/RANK/EPOCH/confirm`): it
    /// sends the action `confirm` with the body `SERVICE/RANK/EPOCH/N`, N
    /// the batches it has read so far, and what it had not confirmed when
    /// it goes away goes to the other ranks.
    ///
    /// ```
    /// let handle: streambatch_split::SplitHandle =
    ///     "sbsplit://driver@127.0.0.1:7500/00000000000000ff/1/2".parse().unwrap();
    /// assert_eq!(handle.flight_ticket_confirming(3), b"00000000000000ff/1/3/confirm".to_vec());
    /// ```
    pub fn flight_ticket_confirming(&self, epoch: usize) -> Vec<u8> {
        let mut ticket = self.flight_ticket(epoch);
        ticket.extend_from_slice(b"/confirm");
        ticket
    }
}

/// A rank's epoch as a ticket names it: (service, rank, epoch).
type StreamKey = (u64, u32, u64);

/// Parses a ticket into its stream and whether its client confirms.
fn parse_ticket(ticket: &[u8]) -> std::result::Result<(StreamKey, bool), Status> {
    let bad = || Status::invalid_argument("a split ticket is SERVICE/RANK/EPOCH[/confirm]");
    let text = std::str::from_utf8(ticket).map_err(|_| bad())?;
    let (text, confirms) = match text.strip_suffix("/confirm") {
        Some(text) => (text, true),
        None => (text, false),
    };
    Ok((parse_key(text).ok_or_else(bad)?, confirms))
}

/// `SERVICE/RANK/EPOCH`, `SERVICE` in hexadecimal.
fn parse_key(text: &str) -> Option<StreamKey> {
    let mut parts = text.split('/');
    let (Some(service), Some(rank), Some(epoch), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    Some((
        u64::from_str_radix(service, 16).ok()?,
        rank.parse().ok()?,
        epoch.parse().ok()?,
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
    let service = FlightServiceServer::new(SplitFlight {
        ranks,
        confirming: Arc::default(),
    });
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
    /// The streams of confirming clients, open now.
    confirming: Arc<Mutex<HashMap<StreamKey, Confirming>>>,
}

/// A confirming client's stream: what it has not confirmed, and what
/// confirms its rows to the split.
type Confirming = (Arc<Mutex<Unread>>, Confirmer);

/// A confirming client's batches handed to gRPC that it has not yet said
/// it read, oldest first, and how many it has confirmed in all.
#[derive(Default)]
struct Unread {
    batches: VecDeque<RecordBatch>,
    confirmed: u64,
}

impl Unread {
    /// The client has read `total` batches in all: the rows of those not
    /// confirmed before.
    fn confirm(&mut self, total: u64) -> usize {
        let mut rows = 0;
        while self.confirmed < total {
            let Some(batch) = self.batches.pop_front() else {
                break; // more than it was handed: a report not trusted
            };
            rows += batch.num_rows();
            self.confirmed += 1;
        }
        rows
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Batches gRPC has taken, and whether the producer has stopped the
/// stream (after which gRPC takes none: what is left in the channel went
/// back to the split). One lock, so that a batch is either taken or given
/// back, never both.
#[derive(Default)]
struct Handed {
    taken: u64,
    stopped: bool,
}

/// What the gRPC side does as it hands each batch over: counts it, and
/// confirms its rows (by default) or keeps it until the client confirms.
struct HandOver {
    handed: Arc<Mutex<Handed>>,
    batches: BatchCount,
    confirmer: Confirmer,
    unread: Option<Arc<Mutex<Unread>>>,
}

impl HandOver {
    /// Takes `batch` for gRPC; `false` once the producer stopped the
    /// stream.
    fn take(&self, batch: &RecordBatch) -> bool {
        let mut handed = lock(&self.handed);
        if handed.stopped {
            return false;
        }
        handed.taken += 1;
        drop(handed);
        match &self.unread {
            Some(unread) => lock(unread).batches.push_back(batch.clone()),
            None => self.confirmer.rows(batch.num_rows()),
        }
        // The empty batch that tells a rank without rows its columns is
        // no batch of rows.
        if batch.num_rows() > 0 {
            self.batches.add(1);
        }
        true
    }
}

/// A rank's epoch as a stream of batches: pulled on a blocking thread (the
/// epoch's barrier and the job block), two batches ahead at most. A rank
/// that gets no rows still sends an empty batch, so that its reader learns
/// the columns (a Flight stream without a schema is an error to it).
fn batches(
    stream: EpochStream,
    unread: Option<Arc<Mutex<Unread>>>,
    on_end: impl FnOnce() + Send + 'static,
) -> BoxStream<'static, std::result::Result<RecordBatch, FlightError>> {
    let (sender, receiver) = tokio::sync::mpsc::channel(2);
    let hand_over = HandOver {
        handed: Arc::default(),
        batches: stream.batch_count(),
        confirmer: stream.confirmer(),
        unread: unread.clone(),
    };
    let producer = Producer {
        runtime: tokio::runtime::Handle::current(),
        limit: stream.stalled_trainer_timeout(),
        stream,
        sender,
        sent: VecDeque::new(),
        handed: hand_over.handed.clone(),
        trimmed: 0,
        unread,
    };
    tokio::task::spawn_blocking(move || {
        producer.run();
        on_end();
    });
    futures::stream::unfold(
        (receiver, hand_over, false),
        |(mut receiver, hand_over, ended)| async move {
            if ended {
                return None;
            }
            let next = receiver.recv().await?;
            match &next {
                Ok(batch) if !hand_over.take(batch) => {
                    // Stopped (stalled): an error, not a clean end.
                    let stopped = "the split's service stopped this stream: its reader stalled";
                    let error = FlightError::ExternalError(stopped.into());
                    Some((Err(error), (receiver, hand_over, true)))
                }
                _ => Some((next, (receiver, hand_over, false))),
            }
        },
    )
    .boxed()
}

/// The blocking side of a rank's Flight stream: pulls the epoch's rows and
/// sends them on, and gives back what never reached the client.
struct Producer {
    runtime: tokio::runtime::Handle,
    limit: Duration,
    stream: EpochStream,
    sender: tokio::sync::mpsc::Sender<std::result::Result<RecordBatch, FlightError>>,
    /// Batches sent on and not yet taken by gRPC, oldest first (the
    /// first `trimmed` taken are dropped from here after each send).
    sent: VecDeque<RecordBatch>,
    handed: Arc<Mutex<Handed>>,
    trimmed: u64,
    unread: Option<Arc<Mutex<Unread>>>,
}

/// Why a send did not go through.
enum Stop {
    Gone,
    Stalled,
}

impl Producer {
    fn run(mut self) {
        let mut sent_any = false;
        while let Some(next) = self.stream.next() {
            sent_any = true;
            let batch = match next {
                Ok(batch) => batch,
                Err(e) => {
                    // The epoch failed: every rank hears it; nothing to give back.
                    let _ = self
                        .sender
                        .blocking_send(Err(FlightError::ExternalError(Box::new(e))));
                    return;
                }
            };
            self.sent.push_back(batch.clone());
            if let Err(stop) = self.send(batch) {
                return self.stop(stop);
            }
            self.trim();
        }
        if !sent_any && let Some(schema) = self.stream.schema() {
            let empty = RecordBatch::new_empty(schema);
            self.sent.push_back(empty.clone());
            if let Err(stop) = self.send(empty) {
                return self.stop(stop);
            }
        }
        self.settle();
    }

    fn send(&self, batch: RecordBatch) -> std::result::Result<(), Stop> {
        let send = tokio::time::timeout(self.limit, self.sender.send(Ok(batch)));
        match self.runtime.block_on(send) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Stop::Gone),
            Err(_) => Err(Stop::Stalled),
        }
    }

    /// Drops from `sent` what gRPC has taken; what is left never left.
    fn trim(&mut self) {
        let taken = lock(&self.handed).taken;
        self.trim_to(taken);
    }

    fn trim_to(&mut self, taken: u64) {
        while self.trimmed < taken && self.sent.pop_front().is_some() {
            self.trimmed += 1;
        }
    }

    /// The epoch's rows are all sent on: waits (up to the limit) until
    /// gRPC has taken them and a confirming client has confirmed them.
    fn settle(mut self) {
        // No deadline where the limit is past any instant (`Duration::MAX`).
        let deadline = Instant::now().checked_add(self.limit);
        loop {
            self.trim();
            let unconfirmed = self
                .unread
                .as_ref()
                .is_some_and(|u| !lock(u).batches.is_empty());
            if self.sent.is_empty() && !unconfirmed {
                return;
            }
            // The sender is still held here: gRPC dropped the stream before
            // its end, as it does when the client goes away.
            if self.sender.is_closed() {
                return self.stop(Stop::Gone);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return self.stop(Stop::Stalled);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The client went away (its rows not handed over, and with a
    /// confirming client those it did not confirm, go back to the split)
    /// or stalled (only what it never got goes back; what it holds is
    /// counted lost): either way the rank leaves the epoch.
    fn stop(mut self, stop: Stop) {
        // gRPC takes nothing more: what is in the channel goes back.
        let taken = {
            let mut handed = lock(&self.handed);
            handed.stopped = true;
            handed.taken
        };
        self.trim_to(taken);
        let mut back: Vec<RecordBatch> = Vec::new();
        if let (Stop::Gone, Some(unread)) = (&stop, &self.unread) {
            back.extend(lock(unread).batches.drain(..));
        }
        back.extend(self.sent.drain(..));
        for batch in back.into_iter().rev() {
            self.stream.give_back(Piece::Batch(batch));
        }
        let reason = match stop {
            Stop::Gone => "its Flight client went away before the end of the epoch".to_string(),
            Stop::Stalled => format!(
                "its Flight client stalled: it read nothing for {} s",
                self.limit.as_secs()
            ),
        };
        tracing::warn!(%reason, "a split's trainer left");
        self.stream.lose(reason);
    }
}

type Stream<T> = BoxStream<'static, std::result::Result<T, Status>>;

fn unsupported<T>(what: &str) -> std::result::Result<T, Status> {
    Err(Status::unimplemented(format!(
        "a split's Flight service serves DoGet and the confirm action only, not {what}"
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
        let (key, confirms) = parse_ticket(&request.get_ref().ticket)?;
        let (service, rank, epoch) = key;
        let stream = self
            .ranks
            .claim(service, rank, epoch, &peer)
            .map_err(Status::not_found)?;
        let unread = confirms.then(|| {
            let unread = Arc::new(Mutex::new(Unread::default()));
            let entry = (unread.clone(), stream.confirmer());
            lock(&self.confirming).insert(key, entry);
            unread
        });
        let confirming = self.confirming.clone();
        let on_end = move || drop(lock(&confirming).remove(&key));
        let data = FlightDataEncoderBuilder::new()
            .build(batches(stream, unread, on_end))
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

    /// `confirm`, body `SERVICE/RANK/EPOCH/N`: a confirming client has read
    /// N batches of that stream in all.
    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> std::result::Result<Response<Self::DoActionStream>, Status> {
        let action = request.get_ref();
        if action.r#type != "confirm" {
            return unsupported(&format!("the action `{}`", action.r#type));
        }
        let bad = || Status::invalid_argument("confirm takes SERVICE/RANK/EPOCH/BATCHES");
        let body = std::str::from_utf8(&action.body).map_err(|_| bad())?;
        let (key, total) = body.rsplit_once('/').ok_or_else(bad)?;
        let key = parse_key(key).ok_or_else(bad)?;
        let total: u64 = total.parse().map_err(|_| bad())?;
        let open = lock(&self.confirming).get(&key).cloned();
        let Some((unread, confirmer)) = open else {
            return Err(Status::not_found(format!(
                "no confirming stream of rank {} epoch {} is open",
                key.1, key.2
            )));
        };
        // Under the lock, so that a stop giving back what is unread
        // cannot give back these too.
        let mut unread = lock(&unread);
        let rows = unread.confirm(total);
        confirmer.rows(rows);
        drop(unread);
        Ok(Response::new(futures::stream::empty().boxed()))
    }

    async fn list_actions(
        &self,
        _: Request<Empty>,
    ) -> std::result::Result<Response<Self::ListActionsStream>, Status> {
        unsupported("ListActions")
    }
}
