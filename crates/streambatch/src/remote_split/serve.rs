use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use streambatch_net::split::{ServedEpoch, SplitServer, serve_split};
use streambatch_net::{Endpoint, Identity, Served, StreamKind, TlsFiles, handshake};
use streambatch_plan::{EpochStream, Error, Result, Split};
use streambatch_store::{ObjectStore, SharedStore, StoreConfig, ipc};

use super::{SplitHandle, locality, runtime};

/// The ranks of a split served to trainer processes, as long as it lives:
/// see [`Context::serve_splits`](crate::Context::serve_splits). Dropping it
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
    /// [`streaming_split`](crate::Dataset::streaming_split), in rank order)
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
        let spill = std::env::temp_dir().join(format!("sb-split-{}", std::process::id()));
        let pieces = SharedStore::open(StoreConfig::new(PIECES_STORE_BYTES, spill))
            .map_err(|e| failed(&e))?;
        let ranks = Arc::new(Ranks {
            service,
            splits: Mutex::new(splits),
            pieces: Arc::new(pieces),
            reading: Mutex::new(HashSet::new()),
        });
        runtime.spawn(accept(endpoint.clone(), ranks.clone()));
        let flight_listen = SocketAddr::new(listen.ip(), 0);
        let flight_addr = super::flight::start(&runtime, &identity, flight_listen, ranks.clone())?;
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
        self.ranks.pieces.stats()
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

/// The split's ranks, on the service.
pub(super) struct Ranks {
    service: u64,
    /// Emptied when the service is dropped.
    splits: Mutex<Vec<Split>>,
    pieces: Arc<SharedStore>,
    /// (rank, epoch) streams open now: one reader each.
    reading: Mutex<HashSet<(usize, u64)>>,
}

impl Ranks {
    pub(super) fn splits(&self) -> std::sync::MutexGuard<'_, Vec<Split>> {
        self.splits.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rank `rank`'s stream of epoch `epoch` for `peer` (forwarded: what
    /// it yields is in flight until confirmed), once per rank and epoch.
    pub(super) fn claim(
        &self,
        service: u64,
        rank: u32,
        epoch: u64,
        peer: &str,
    ) -> std::result::Result<EpochStream, String> {
        if service != self.service {
            return Err(format!("no split {service:016x} is served here"));
        }
        let rank = rank as usize;
        let splits = self.splits();
        let split = splits.get(rank).ok_or_else(|| {
            format!(
                "rank {rank} is not one of the split's {} ranks",
                splits.len()
            )
        })?;
        let mut reading = self.reading.lock().unwrap_or_else(|p| p.into_inner());
        if !reading.insert((rank, epoch)) {
            return Err(format!(
                "rank {rank}'s epoch {epoch} is read already (asked again by {peer})"
            ));
        }
        Ok(split.forwarded_epoch(epoch as usize))
    }
}

impl SplitServer for Ranks {
    fn open(
        &self,
        service: u64,
        rank: u32,
        epoch: u64,
        peer: &str,
    ) -> std::result::Result<Box<dyn ServedEpoch>, String> {
        let split = self.claim(service, rank, epoch, peer)?;
        Ok(Box::new(RankEpoch {
            stream: Some(split),
            pieces: self.pieces.clone(),
            unconfirmed: Vec::new(),
        }))
    }
}

/// One rank's epoch served to its trainer.
struct RankEpoch {
    stream: Option<EpochStream>,
    pieces: Arc<SharedStore>,
    /// What was sent since the trainer last confirmed, oldest first.
    unconfirmed: Vec<RecordBatch>,
}

impl Drop for RankEpoch {
    fn drop(&mut self) {
        // Dropped on a runtime thread (the service stopping mid-epoch), a
        // stream's last reference to an embedded node must go elsewhere
        // (see `SplitService`'s drop).
        if let Some(stream) = self.stream.take()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            std::thread::spawn(move || drop(stream));
        }
    }
}

impl ServedEpoch for RankEpoch {
    fn next(&mut self, shares_memory: bool) -> Option<std::result::Result<Served, String>> {
        let batch = match self.stream.as_mut()?.next()? {
            Ok(batch) => batch,
            Err(e) => return Some(Err(e.to_string())),
        };
        self.unconfirmed.push(batch.clone());
        Some(serve(&self.pieces, batch, shares_memory))
    }

    fn confirmed(&mut self) {
        self.unconfirmed.clear();
        if let Some(stream) = &self.stream {
            stream.confirm();
        }
    }

    fn lost(mut self: Box<Self>, reason: String) {
        let Some(stream) = self.stream.take() else {
            return;
        };
        // Back in their order, for whoever asks next.
        for batch in self.unconfirmed.drain(..).rev() {
            stream.give_back(batch);
        }
        tracing::warn!(%reason, "a split's trainer was lost");
        stream.lose(reason);
    }
}

/// `batch` as a trainer gets it: copied once into shared memory and named,
/// when it runs on this host and there is room (the piece stays pinned
/// until the trainer releases it); else its IPC bytes.
fn serve(
    pieces: &SharedStore,
    batch: RecordBatch,
    shares_memory: bool,
) -> std::result::Result<Served, String> {
    if shares_memory {
        // Never spills: with no room (trainers hold what they mapped, as a
        // shuffle buffer does), the piece goes as bytes instead.
        if let Ok(part) = pieces.try_put(batch.clone()) {
            let pin = pieces.pin(part.id()).map_err(|e| e.to_string())?;
            if let Some(name) = pieces.shared_name(&part) {
                return Ok(Served::Shared(name, Box::new((pin, part))));
            }
        }
    }
    let encoded = ipc::encode(&batch).map_err(|e| e.to_string())?;
    let mut bytes = vec![0u8; encoded.len];
    encoded.write_to(&mut bytes);
    Ok(Served::Bytes(Box::new(bytes)))
}
