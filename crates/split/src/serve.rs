//! The driver's side: [`SplitService`] serves every rank of one split to
//! trainer processes, over QUIC on an endpoint of its own (the driver's
//! cluster certificate, a trainer's required) and over Arrow Flight, until
//! it is dropped.

use std::net::SocketAddr;
use std::sync::Arc;

use streambatch_core::NodeConfig;
use streambatch_net::split::serve_split;
use streambatch_net::{Endpoint, Identity, StreamKind, TlsFiles, handshake};
use streambatch_plan::{Error, Result, Split};
use streambatch_store::{SharedStore, StoreConfig};

use crate::ranks::Ranks;
use crate::{SplitHandle, locality, runtime};

/// The ranks of a split served to trainer processes, as long as it lives:
/// see [`SplitContext::serve_splits`](crate::SplitContext::serve_splits). Dropping it
/// stops serving (trainers reading get an error).
pub struct SplitService {
    handles: Vec<SplitHandle>,
    endpoint: Endpoint,
    flight_addr: SocketAddr,
    ranks: Arc<Ranks>,
    /// Always `Some` until dropped.
    runtime: Option<tokio::runtime::Runtime>,
}

/// What a trainer on this host maps, copied once into shared memory.
const PIECES_STORE_BYTES: u64 = 512 << 20;

impl SplitService {
    /// Serves `splits` (the ranks of one
    /// [`streaming_split`](streambatch::Dataset::streaming_split), in rank order)
    /// on `listen` (port 0 picks one) to trainers holding a certificate of
    /// the cluster whose CA `tls` names; the service presents `tls`'s own
    /// certificate.
    pub fn start(splits: Vec<Split>, tls: &TlsFiles, listen: SocketAddr) -> Result<Self> {
        let failed = |e: &dyn std::fmt::Display| Error::Start {
            what: "the split service",
            source: e.to_string().into(),
        };
        if splits.is_empty() || splits.iter().enumerate().any(|(i, s)| s.rank() != i) {
            return Err(Error::Invalid(
                "serve_splits takes every rank of one streaming split, in rank order".into(),
            ));
        }
        let identity = Identity::load(tls).map_err(|e| failed(&e))?;
        let runtime = runtime("the split service's runtime")?;
        let endpoint = {
            let _entered = runtime.enter();
            Endpoint::bind(listen, &identity).map_err(|e| failed(&e))?
        };
        let service = service_id();
        let handles = (0..splits.len())
            .map(|rank| SplitHandle {
                server: identity.name(),
                addr: endpoint.local_addr(),
                service,
                rank,
                ranks: splits.len(),
            })
            .collect();
        // Under the node's spill directory (private, its name taken by
        // no other user), in a store directory of its own.
        let mut pieces = StoreConfig::new(PIECES_STORE_BYTES, NodeConfig::default().spill_dir);
        pieces.namespace = "split".into();
        let pieces = SharedStore::open(pieces).map_err(|e| failed(&e))?;
        let ranks = Arc::new(Ranks::new(service, splits, pieces));
        runtime.spawn(accept(endpoint.clone(), ranks.clone()));
        let flight_listen = SocketAddr::new(listen.ip(), 0);
        let flight_addr = crate::flight::start(&runtime, &identity, flight_listen, ranks.clone())?;
        Ok(Self {
            handles,
            endpoint,
            flight_addr,
            ranks,
            runtime: Some(runtime),
        })
    }

    /// One handle per rank, in rank order.
    pub fn handles(&self) -> &[SplitHandle] {
        &self.handles
    }

    /// The counters of the shared memory that pieces for trainers on this
    /// host are copied into (held until each trainer lets its piece go).
    pub fn pieces_stats(&self) -> streambatch_store::StoreStats {
        self.ranks.pieces_stats()
    }

    /// What each rank got so far, by rank (see [`Split::stats`]).
    pub fn stats(&self) -> Vec<streambatch_plan::RankStats> {
        self.ranks
            .splits()
            .first()
            .map(Split::stats)
            .unwrap_or_default()
    }

    /// Rows of the last finished epoch no rank took (see
    /// [`Split::dropped_rows`]).
    pub fn dropped_rows(&self) -> usize {
        self.ranks.splits().first().map_or(0, Split::dropped_rows)
    }

    /// Where the service serves Arrow Flight (TCP, TLS with a client
    /// certificate of the cluster): `DoGet` with
    /// [`SplitHandle::flight_ticket`] streams a rank's epoch.
    pub fn flight_addr(&self) -> SocketAddr {
        self.flight_addr
    }

    /// Where the service listens (QUIC).
    pub fn addr(&self) -> SocketAddr {
        self.endpoint.local_addr()
    }
}

impl Drop for SplitService {
    fn drop(&mut self) {
        self.endpoint.close();
        // The splits go here, not on a runtime thread: the last of them may
        // hold the last reference to an embedded node, whose own runtime
        // cannot be dropped from inside another's.
        drop(std::mem::take(&mut *self.ranks.splits()));
        // A pull blocked on the job (a rank waiting at its barrier) must
        // not hold up the driver: its thread ends with the process.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// An id no other service of this process or host is likely to have (it
/// only tells a trainer it reached the split it was given).
fn service_id() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one((std::process::id(), std::time::SystemTime::now()))
}

/// Accepts trainers; each connection's split streams are served on tasks
/// of their own, any other stream kind closes the connection.
async fn accept(endpoint: Endpoint, ranks: Arc<Ranks>) {
    let here = locality();
    while let Some(incoming) = endpoint.incoming().await {
        let (ranks, here) = (ranks.clone(), here.clone());
        tokio::spawn(async move {
            let Some(peer) = handshake(incoming).await else {
                return;
            };
            while let Some((kind, send, recv)) = peer.accept().await {
                if kind != StreamKind::Split {
                    let problem = format!("a {kind:?} stream to a split service");
                    return peer.refuse(&streambatch_net::FrameError::Malformed(problem));
                }
                let (peer, ranks, here) = (peer.clone(), ranks.clone(), here.clone());
                tokio::spawn(async move {
                    serve_split(&peer, send, recv, ranks.as_ref(), &here).await;
                });
            }
        });
    }
}
