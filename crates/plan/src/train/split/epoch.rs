//! One rank's stream of one epoch, and its batch count.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::dataset::held::{HeldRows, Piece};
use crate::error::Result;

use super::Shared;

/// One rank's partitions of one epoch (see [`Split::epoch`](crate::train::split::Split::epoch)).
/// Dropped before its end, its rank leaves the epoch.
pub struct EpochStream {
    rank: usize,
    epoch: usize,
    forwarded: bool,
    /// The host whose nodes' pieces this rank takes first.
    near: Option<String>,
    /// Whether each piece it yields counts as a batch delivered (its
    /// consumer takes pieces as they come).
    counts_batches: bool,
    shared: Arc<Shared>,
    started: bool,
    done: bool,
}

impl Drop for EpochStream {
    fn drop(&mut self) {
        if !self.done {
            self.shared.leave(self.rank, self.epoch);
        }
    }
}

impl EpochStream {
    pub(super) fn new(rank: usize, epoch: usize, forwarded: bool, shared: Arc<Shared>) -> Self {
        Self {
            rank,
            epoch,
            forwarded,
            near: None,
            counts_batches: false,
            shared,
            started: false,
            done: false,
        }
    }

    /// Each piece it yields counts as a batch its consumer got.
    pub(super) fn counting_batches(mut self) -> Self {
        self.counts_batches = true;
        self
    }

    /// Every piece this forwarded stream yielded reached its trainer.
    pub fn confirm(&self) {
        self.shared.confirm(self.rank, self.epoch);
    }

    /// Confirms rows of this forwarded stream from another task (a server
    /// that sees them handed over while the stream pulls).
    pub fn confirmer(&self) -> Confirmer {
        Confirmer {
            shared: self.shared.clone(),
            rank: self.rank,
            epoch: self.epoch,
        }
    }

    /// How long its trainer may hold rows without asking for more
    /// ([`SplitOptions::stalled_trainer_timeout`](crate::SplitOptions::stalled_trainer_timeout)).
    pub fn stalled_trainer_timeout(&self) -> std::time::Duration {
        self.shared.options.stalled_trainer_timeout
    }

    /// Hands back rows this forwarded stream yielded that never reached
    /// the trainer (its process was lost before confirming them): the next
    /// rank to ask gets them, so no row is lost.
    pub fn give_back(&self, piece: Piece) {
        self.shared.give_back(self.rank, self.epoch, piece);
    }

    /// Rows this stream yielded held by a node could not be read by
    /// anyone (the node was lost; [`HeldRows::read`](crate::dataset::held::HeldRows::read)
    /// reported them): they are no longer this rank's, and the job makes
    /// them again for whichever rank asks.
    pub fn owed(&self, held: &HeldRows) {
        self.shared.owed(self.rank, self.epoch, held);
    }

    /// Takes first what nodes on host `host` (a boot id) hold: a trainer
    /// there fetches it from their shared memory.
    pub fn prefer_host(&mut self, host: impl Into<String>) {
        self.near = Some(host.into());
    }

    /// The next piece, as [`Iterator::next`] but where a node holds the
    /// rows leaving them there (a forwarded stream's trainer fetches
    /// them): see [`Piece`].
    pub fn next_piece(&mut self) -> Option<Result<Piece>> {
        if self.done {
            return None;
        }
        let asked = Instant::now();
        let next = match self.started {
            false => {
                self.started = true;
                match self.shared.start(self.epoch) {
                    Ok(()) => self.pull(),
                    Err(e) => Some(Err(e)),
                }
            }
            true => self.pull(),
        };
        self.shared.waited(self.rank, self.epoch, asked);
        self.done = !matches!(next, Some(Ok(_)));
        next
    }

    fn pull(&self) -> Option<Result<Piece>> {
        let near = self.near.as_deref();
        self.shared
            .next_for(self.rank, self.epoch, self.forwarded, near)
    }

    /// This rank was lost (its process died or disconnected), as `reason`
    /// says (rows still in flight to it, not given back first, are lost
    /// with it and counted in [`RankStats::lost_rows`](crate::stats::RankStats::lost_rows)): under [`LostRank::Redistribute`](crate::train::split::LostRank::Redistribute) it leaves the epoch and the
    /// others take its rows; under [`LostRank::Fail`](crate::train::split::LostRank::Fail) every other rank's
    /// stream ends with an error naming it.
    pub fn lose(mut self, reason: impl Into<String>) {
        // A forwarded stream may have ended with rows still in flight.
        if !self.done || self.forwarded {
            self.done = true;
            self.shared.lose(self.rank, self.epoch, reason.into());
        }
    }

    /// Counts the batches this rank's consumer gets where they are cut
    /// elsewhere (by a trainer process, or a Flight stream's messages).
    pub fn batch_count(&self) -> BatchCount {
        BatchCount {
            counts: self.shared.batches.clone(),
            rank: self.rank,
        }
    }

    /// Whether this stream has ended (its rank has all it gets, or an error).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The schema of the epoch's rows, once its job started: from a
    /// partition any rank was handed, else from the pipeline where that
    /// knows it without rows. For a rank that got no rows and must still
    /// tell its reader the columns (a Flight stream starts with them).
    pub fn schema(&self) -> Option<SchemaRef> {
        let state = self.shared.lock();
        if state.epoch != Some(self.epoch) {
            return None;
        }
        let planned = || state.epoch_data.as_ref()?.0.known_schema();
        state.schema.clone().or_else(planned)
    }
}

impl Iterator for EpochStream {
    type Item = Result<RecordBatch>;

    /// The next rows, read in this process where a node holds them; rows
    /// whose node was lost are made again by the job and come later.
    fn next(&mut self) -> Option<Result<RecordBatch>> {
        loop {
            return match self.next_piece()? {
                Ok(piece) => match piece.read() {
                    Ok(batch) => {
                        if self.counts_batches {
                            self.batch_count().add(1);
                        }
                        Some(Ok(batch))
                    }
                    Err(error) => {
                        tracing::warn!(%error, "rows of a split could not be read from their node; the job makes them again");
                        if let Piece::Held(held) = &piece {
                            self.owed(held);
                        }
                        continue;
                    }
                },
                Err(e) => Some(Err(e)),
            };
        }
    }
}

/// Confirms rows a forwarded stream yielded (see [`EpochStream::confirmer`]).
#[derive(Clone)]
pub struct Confirmer {
    shared: Arc<Shared>,
    rank: usize,
    epoch: usize,
}

impl Confirmer {
    /// `rows` more of what the stream yielded reached its trainer.
    pub fn rows(&self, rows: usize) {
        self.shared.confirm_rows(self.rank, self.epoch, rows);
    }
}

/// Adds to a rank's batches delivered ([`RankStats::batches`](crate::stats::RankStats::batches)). Holds
/// the counts alone, not the split.
#[derive(Clone)]
pub struct BatchCount {
    counts: Arc<[AtomicUsize]>,
    rank: usize,
}

impl BatchCount {
    /// `n` more batches reached the rank's consumer.
    pub fn add(&self, n: usize) {
        let count = &self.counts[self.rank];
        // Saturating: a peer's report is not trusted to stay in range.
        let _ = count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
            Some(c.saturating_add(n))
        });
    }
}
