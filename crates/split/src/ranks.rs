//! The ranks of a split as a service serves them, over QUIC or Arrow
//! Flight: each (rank, epoch) stream claimed by one reader, what it yields
//! in flight until its trainer confirms it, and given back to the split
//! when the trainer is lost. Rows a cluster node holds go to a trainer as
//! where to fetch them; a trainer on that node's host is handed them first.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use streambatch_net::split::{FetchFrom, ServedEpoch, SplitItem, SplitServer};
use streambatch_net::{Locality, RowRange, Served};
use streambatch_plan::{EpochStream, HeldRows, Piece, Split};
use streambatch_store::{ObjectStore, SharedStore, ipc};

/// The split's ranks, on the service.
pub(crate) struct Ranks {
    service: u64,
    /// Emptied when the service is dropped.
    splits: Mutex<Vec<Split>>,
    pieces: Arc<SharedStore>,
    /// (rank, epoch) streams open now: one reader each.
    reading: Mutex<HashSet<(usize, u64)>>,
}

impl Ranks {
    pub(crate) fn new(service: u64, splits: Vec<Split>, pieces: SharedStore) -> Self {
        Self {
            service,
            splits: Mutex::new(splits),
            pieces: Arc::new(pieces),
            reading: Mutex::new(HashSet::new()),
        }
    }

    /// The counters of the shared memory pieces are copied into.
    pub(crate) fn pieces_stats(&self) -> streambatch_store::StoreStats {
        self.pieces.stats()
    }

    pub(crate) fn splits(&self) -> std::sync::MutexGuard<'_, Vec<Split>> {
        self.splits.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rank `rank`'s stream of epoch `epoch` for `peer` (forwarded: what
    /// it yields is in flight until confirmed), once per rank and epoch.
    pub(crate) fn claim(
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
        (peer, from): (&str, &Locality),
    ) -> std::result::Result<Box<dyn ServedEpoch>, String> {
        let mut split = self.claim(service, rank, epoch, peer)?;
        split.prefer_host(from.host.clone());
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
    unconfirmed: Vec<Piece>,
}

impl Drop for RankEpoch {
    fn drop(&mut self) {
        let Some(stream) = self.stream.take() else {
            return;
        };
        // Dropped before its end without `lost` (the pull panicked, a
        // piece could not be served): what it had sent but not had
        // confirmed goes back, so that no row is lost and no rank waits
        // for it.
        let unconfirmed = std::mem::take(&mut self.unconfirmed);
        let end = move || {
            if !stream.is_done() || !unconfirmed.is_empty() {
                give_back(&stream, unconfirmed);
                stream.lose("its stream on the service ended before the epoch did");
            }
        };
        // Dropped on a runtime thread (the service stopping mid-epoch), a
        // stream's last reference to an embedded node must go elsewhere
        // (see `SplitService`'s drop).
        match tokio::runtime::Handle::try_current() {
            Ok(_) => drop(std::thread::spawn(end)),
            Err(_) => end(),
        }
    }
}

/// Hands `unconfirmed` (oldest first) back to the split, in their order,
/// for whoever asks next.
fn give_back(stream: &EpochStream, unconfirmed: Vec<Piece>) {
    for piece in unconfirmed.into_iter().rev() {
        stream.give_back(piece);
    }
}

impl ServedEpoch for RankEpoch {
    fn next(&mut self, shares_memory: bool) -> Option<std::result::Result<SplitItem, String>> {
        let piece = match self.stream.as_mut()?.next_piece()? {
            Ok(piece) => piece,
            Err(e) => return Some(Err(e.to_string())),
        };
        self.unconfirmed.push(piece.clone());
        Some(match piece {
            Piece::Batch(batch) => serve(&self.pieces, batch, shares_memory).map(SplitItem::Served),
            Piece::Held(held) => Ok(SplitItem::Fetch(fetch_from(&held))),
        })
    }

    fn unfetched(
        &mut self,
        shares_memory: bool,
        reason: &str,
    ) -> Option<std::result::Result<Served, String>> {
        let Some(Piece::Held(held)) = self.unconfirmed.pop() else {
            return None;
        };
        tracing::debug!(%reason, rows = ?held, "a trainer could not fetch rows; the driver reads them");
        match held.read() {
            Ok(batch) => {
                self.unconfirmed.push(Piece::Batch(batch.clone()));
                Some(serve(&self.pieces, batch, shares_memory))
            }
            Err(error) => {
                // The node is lost: the job makes the rows again.
                tracing::warn!(%error, "rows a trainer could not fetch could not be read either");
                self.stream.as_ref()?.owed(&held);
                None
            }
        }
    }

    fn confirmed(&mut self) {
        self.unconfirmed.clear();
        if let Some(stream) = &self.stream {
            stream.confirm();
        }
    }

    fn batch_counter(&self) -> Box<dyn Fn(u64) + Send> {
        let count = self.stream.as_ref().map(EpochStream::batch_count);
        Box::new(move |n| {
            if let Some(count) = &count {
                count.add(usize::try_from(n).unwrap_or(usize::MAX));
            }
        })
    }

    fn lost(mut self: Box<Self>, reason: String) {
        let Some(stream) = self.stream.take() else {
            return;
        };
        give_back(&stream, std::mem::take(&mut self.unconfirmed));
        tracing::warn!(%reason, "a split's trainer was lost");
        stream.lose(reason);
    }

    fn stall_limit(&self) -> std::time::Duration {
        self.stream.as_ref().map_or(
            std::time::Duration::MAX,
            EpochStream::stalled_trainer_timeout,
        )
    }

    fn stalled(mut self: Box<Self>, reason: String) {
        let Some(stream) = self.stream.take() else {
            return;
        };
        // Sent to a trainer that is alive but stuck: it may still read
        // them, so they are not given to another (they are counted lost).
        self.unconfirmed.clear();
        tracing::warn!(%reason, "a split's trainer stalled; its rows go to the others");
        stream.lose(reason);
    }
}

/// Where a trainer fetches `held` from.
fn fetch_from(held: &HeldRows) -> FetchFrom {
    let at = held.at();
    let (offset, len) = held.partition_rows();
    FetchFrom {
        node: at.node.clone(),
        addr: at.addr.clone(),
        locality: Locality {
            host: at.host.clone(),
            store_dir: at.store_dir.clone(),
        },
        partition: at.partition,
        partition_rows: at.partition_rows as u64,
        rows: RowRange {
            offset: offset as u64,
            len: len as u64,
        },
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
