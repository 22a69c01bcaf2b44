//! The state of a split shared by its ranks: epochs started at their
//! barrier, pulls from the job, the buffer and the ranks' shares.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use crate::dataset::held::{HeldRows, Piece, Pulled};
use crate::error::{Error, Result};
use crate::stats::{MAX_EVENTS, RankWait};

use super::{EpochJob, LostRank, RankStats, Shared, State};

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Each rank's figures so far, its batches counted.
    pub(super) fn stats_now(&self, state: &State) -> Vec<RankStats> {
        let mut stats = state.stats.clone();
        for (rank, stats) in stats.iter_mut().enumerate() {
            stats.batches = self.batches[rank].load(Ordering::Relaxed);
        }
        stats
    }

    /// Waits until every rank asked for `epoch`, then starts its job if no
    /// rank did yet.
    pub(super) fn start(&self, epoch: usize) -> Result<()> {
        let deadline = Instant::now() + self.options.barrier_timeout;
        let mut state = self.lock();
        loop {
            if state.epoch.is_some_and(|e| e >= epoch) {
                return Ok(());
            }
            let missing: Vec<usize> = (0..self.ranks)
                .filter(|&r| state.asked[r].is_none_or(|e| e < epoch))
                .collect();
            if missing.is_empty() {
                break;
            }
            let last_ended = state.ended && state.epoch.is_some_and(|e| e + 1 == epoch);
            if self.options.prefetch_next_epoch && last_ended && state.next.is_none() {
                state.next = Some((epoch, self.begin(epoch)));
            }
            let now = Instant::now();
            if now >= deadline {
                // A prefetched job goes with the epoch, outside the lock.
                let prefetched = state.next.take();
                drop(state);
                drop(prefetched);
                return Err(Error::SplitBarrier {
                    epoch,
                    missing,
                    waited: self.options.barrier_timeout,
                });
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        while state.pulling {
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        if state.epoch.is_some_and(|e| e >= epoch) {
            return Ok(()); // another rank started it meanwhile
        }
        // The last epoch's job, if a rank left it early, is dropped (and so
        // stopped) with its rows.
        state.stream = None;
        let (stream, dataset, started) = match state.next.take() {
            Some((prefetched, job)) if prefetched == epoch => job?,
            _ => self.begin(epoch)?,
        };
        let epoch_data = Some((dataset, started));
        let stats_before = self.stats_now(&state);
        *state = State {
            asked: std::mem::take(&mut state.asked),
            left: std::mem::take(&mut state.left),
            stats_before,
            stats: std::mem::take(&mut state.stats),
            dropped: state.dropped(),
            epoch: Some(epoch),
            stream: Some(stream),
            delivered: vec![0; self.ranks],
            in_flight: vec![0; self.ranks],
            finished: vec![false; self.ranks],
            epoch_data,
            ..State::default()
        };
        self.changed.notify_all();
        Ok(())
    }

    /// Starts epoch `epoch`'s job.
    pub(super) fn begin(&self, epoch: usize) -> Result<EpochJob> {
        let planned = (self.epochs)(epoch)?;
        if !self
            .watched
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            // The runner of its first epoch shows its ranks in its metrics.
            let me = self.me.clone();
            planned.runner().watch_split(Arc::new(move || {
                me.upgrade().map(|s| s.stats_now(&s.lock()))
            }));
        }
        let dataset = match self.options.block_order_seed {
            Some(seed) => planned.randomize_block_order(seed.wrapping_add(epoch as u64)),
            None => planned,
        };
        let stream = dataset.iter_batches()?;
        Ok((stream, dataset, Instant::now()))
    }

    /// Starts the job of the epoch after `epoch`, whose job just ended,
    /// when the ranks will read it (`epochs`) and no rank started it yet.
    pub(super) fn prefetch_after(&self, state: &mut State, epoch: usize) {
        let will_read = self.options.epochs.is_some_and(|n| epoch + 1 < n);
        if self.options.prefetch_next_epoch && will_read && state.next.is_none() {
            state.next = Some((epoch + 1, self.begin(epoch + 1)));
        }
    }

    /// The next rows for `rank` (taken first from a node on host `near`,
    /// where one holds some), or `None` once it has all it gets.
    pub(super) fn next_for(
        &self,
        rank: usize,
        epoch: usize,
        forwarded: bool,
        near: Option<&str>,
    ) -> Option<Result<Piece>> {
        let mut state = self.lock();
        loop {
            if state.epoch != Some(epoch) {
                return None; // a later epoch started: this one is over
            }
            if let Some((lost, reason)) = &state.lost {
                return Some(Err(Error::SplitRankLost {
                    epoch,
                    rank: *lost,
                    reason: reason.clone(),
                }));
            }
            if let Some(message) = &state.failed {
                let message = message.clone();
                return Some(Err(Error::SplitJob { epoch, message }));
            }
            if near.is_some() {
                Self::look_ahead(&mut state);
            }
            if let Some(piece) = self.take(&mut state, rank, near) {
                if forwarded {
                    state.in_flight[rank] += piece.num_rows();
                }
                return Some(Ok(piece));
            }
            let others_in_flight = (0..self.ranks).any(|r| r != rank && state.in_flight[r] > 0);
            if state.ended && others_in_flight {
                // Those rows may come back: this rank may get some.
                state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            if state.ended {
                if self.options.equal && state.target.is_none() {
                    // This rank has its share of all rows: every rank's is
                    // that now, whoever leaves later.
                    state.target = Some(state.delivered[rank]);
                }
                let released = self.finish(&mut state, rank);
                drop(state);
                drop(released); // outside the lock
                return None;
            }
            if state.pulling {
                state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            // Pull one partition, the lock let go meanwhile.
            let mut stream = state.stream.take()?;
            state.pulling = true;
            drop(state);
            let next = {
                let _unwinding = PullGuard(self);
                stream.next_pulled()
            };
            state = self.lock();
            state.pulling = false;
            self.changed.notify_all();
            if state.epoch != Some(epoch) {
                return None;
            }
            if state.lost.is_some() {
                // The epoch stopped while this rank pulled: the job goes
                // with its stream, outside the lock.
                drop(state);
                drop(stream);
                state = self.lock();
                continue;
            }
            state.stream = Some(stream);
            if let (None, Some(Ok(Pulled::Batch(batch)))) = (&state.schema, &next) {
                state.schema = Some(batch.schema());
            }
            let piece = match next {
                Some(Ok(Pulled::Batch(batch))) => Piece::Batch(batch),
                Some(Ok(Pulled::Held(held))) => Piece::Held(held),
                Some(Ok(Pulled::Drained)) | None => {
                    if !state.ended {
                        state.ended = true;
                        self.prefetch_after(&mut state, epoch);
                    }
                    continue;
                }
                Some(Err(e)) => {
                    state.failed = Some(e.to_string());
                    continue;
                }
            };
            // An empty partition gives no rank anything.
            if piece.num_rows() > 0 {
                state.buffered += piece.num_rows();
                state.buffer.push_back((piece, Instant::now()));
            }
        }
    }

    /// Buffers the held outputs the job has handed over already, without
    /// waiting: a rank that prefers some nodes' pieces then finds them.
    pub(super) fn look_ahead(state: &mut State) {
        let State {
            stream,
            buffer,
            buffered,
            ..
        } = state;
        let Some(stream) = stream.as_mut() else {
            return; // a rank pulls
        };
        while let Some(held) = stream.next_held_ready() {
            if held.num_rows() > 0 {
                *buffered += held.num_rows();
                buffer.push_back((Piece::Held(held), Instant::now()));
            }
        }
    }

    /// `rank` has finished the epoch; once every rank still in it has,
    /// what is left in the buffer (rows no rank may take) is let go, so
    /// that the job (whose outputs held by nodes are confirmed as they
    /// go) can end. Returns it, to be dropped outside the lock.
    pub(super) fn finish(&self, state: &mut State, rank: usize) -> VecDeque<(Piece, Instant)> {
        state.finished[rank] = true;
        self.release_if_all_finished(state)
    }

    /// The buffer, taken out once every rank still in the epoch has
    /// finished it (see [`Shared::finish`]).
    pub(super) fn release_if_all_finished(&self, state: &mut State) -> VecDeque<(Piece, Instant)> {
        let all = (0..self.ranks).all(|r| state.finished[r] || state.left[r] == state.epoch);
        if !all {
            return VecDeque::new();
        }
        state.released += std::mem::take(&mut state.buffered);
        std::mem::take(&mut state.buffer)
    }

    /// Rows the ranks still in the epoch have seen (taken or buffered),
    /// and how many they are (at least 1).
    pub(super) fn seen(&self, state: &State) -> (usize, usize) {
        let present = |r: &usize| state.left[*r] != state.epoch;
        let taken: usize = (0..self.ranks)
            .filter(present)
            .map(|r| state.delivered[r])
            .sum();
        let ranks = (0..self.ranks).filter(present).count().max(1);
        (taken + state.buffered, ranks)
    }

    /// Rank `rank` dropped its stream of `epoch` before its end. Rows still
    /// in flight to its process (not given back first) are lost with it:
    /// counted, and no longer waited for by the others.
    pub(super) fn leave(&self, rank: usize, epoch: usize) {
        let mut state = self.lock();
        if state.epoch == Some(epoch) {
            let lost = std::mem::take(&mut state.in_flight[rank]);
            state.stats[rank].lost_rows += lost;
        }
        // Never back: a late leave of an earlier epoch keeps a later mark.
        if state.left[rank].is_none_or(|left| left < epoch) {
            state.left[rank] = Some(epoch);
        }
        self.changed.notify_all();
        if state.ended && state.epoch == Some(epoch) {
            let released = self.release_if_all_finished(&mut state);
            drop(state);
            drop(released);
        }
    }

    /// Rows `rank` was handed but never got (see [`EpochStream::give_back`](crate::train::split::EpochStream::give_back)):
    /// first in line for whoever asks next.
    pub(super) fn give_back(&self, rank: usize, epoch: usize, piece: Piece) {
        let mut state = self.lock();
        // Looked at under the lock: rows of an output found lost after it
        // are taken out of the buffer by that rank's `owed`.
        if let Piece::Held(held) = &piece
            && held.output_lost()
        {
            // On a lost node, as rows of its output found lost: made again.
            drop(state);
            held.lost();
            return self.owed(rank, epoch, held);
        }
        if state.epoch != Some(epoch) || piece.num_rows() == 0 {
            return;
        }
        let rows = piece.num_rows();
        state.buffered += rows;
        state.buffer.push_front((piece, Instant::now()));
        state.delivered[rank] = state.delivered[rank].saturating_sub(rows);
        state.in_flight[rank] = state.in_flight[rank].saturating_sub(rows);
        let stats = &mut state.stats[rank];
        stats.rows = stats.rows.saturating_sub(rows);
        stats.pieces = stats.pieces.saturating_sub(1);
        self.changed.notify_all();
    }

    /// Counts `rank`'s wait for data since `asked`, and (from a
    /// millisecond up) records it for `epoch`'s timeline.
    pub(super) fn waited(&self, rank: usize, epoch: usize, asked: Instant) {
        let now = Instant::now();
        let mut state = self.lock();
        state.stats[rank].waited_for_data += now - asked;
        let Some((_, started)) = state
            .epoch_data
            .as_ref()
            .filter(|_| state.epoch == Some(epoch))
        else {
            return;
        };
        let since = |at: Instant| at.saturating_duration_since(*started);
        let wait = RankWait {
            rank,
            from: since(asked),
            to: since(now),
        };
        if wait.to - wait.from >= Duration::from_millis(1) && state.rank_waits.len() < MAX_EVENTS {
            state.rank_waits.push(wait);
        }
    }

    /// Everything forwarded to `rank`'s trainer reached it.
    pub(super) fn confirm(&self, rank: usize, epoch: usize) {
        self.confirm_rows(rank, epoch, usize::MAX);
    }

    /// `rows` more of what was forwarded to `rank`'s trainer reached it.
    pub(super) fn confirm_rows(&self, rank: usize, epoch: usize, rows: usize) {
        let mut state = self.lock();
        if state.epoch == Some(epoch) && state.in_flight[rank] > 0 {
            state.in_flight[rank] = state.in_flight[rank].saturating_sub(rows);
            self.changed.notify_all();
        }
    }

    /// Rank `rank` was lost during `epoch`, as `reason` says: it leaves, or
    /// (under [`LostRank::Fail`]) the epoch stops for every rank.
    pub(super) fn lose(&self, rank: usize, epoch: usize, reason: String) {
        if self.options.on_lost_rank == LostRank::Redistribute {
            return self.leave(rank, epoch);
        }
        let mut state = self.lock();
        // An epoch whose job failed stays failed with the job's error.
        if state.epoch != Some(epoch) {
            return;
        }
        if state.lost.is_some() || state.failed.is_some() {
            let lost = std::mem::take(&mut state.in_flight[rank]);
            state.stats[rank].lost_rows += lost;
            return;
        }
        state.lost = Some((rank, reason));
        let lost = std::mem::take(&mut state.in_flight[rank]);
        state.stats[rank].lost_rows += lost;
        state.left[rank] = Some(epoch);
        let stream = state.stream.take();
        let buffer = std::mem::take(&mut state.buffer);
        state.buffered = 0;
        self.changed.notify_all();
        drop(state);
        // Stops the job and frees what it made, outside the lock.
        drop((stream, buffer));
    }

    /// Rows from the buffer that `rank` may take now: the oldest piece a
    /// node on host `near` holds, else the oldest piece, or (with `equal`)
    /// as much of it as keeps the rank within its share.
    pub(super) fn take(&self, state: &mut State, rank: usize, near: Option<&str>) -> Option<Piece> {
        let index = near
            .and_then(|host| {
                (state.buffer.iter()).position(|(piece, _)| piece.host() == Some(host))
            })
            .unwrap_or(0);
        let whole = state.buffer.get(index)?.0.num_rows();
        let rows = if self.options.equal {
            let (seen, present) = self.seen(state);
            let share = state.target.unwrap_or(seen / present);
            let allowed = share.saturating_sub(state.delivered[rank]);
            whole.min(allowed)
        } else {
            whole
        };
        if rows == 0 {
            return None;
        }
        let (piece, came) = state.buffer.remove(index)?;
        let piece = if rows < whole {
            let rest = (piece.slice(rows, whole - rows), came);
            state.buffer.insert(index, rest);
            piece.slice(0, rows)
        } else {
            piece
        };
        state.buffered -= rows;
        state.delivered[rank] += rows;
        let stats = &mut state.stats[rank];
        stats.rows += rows;
        stats.pieces += 1;
        stats.data_waited += came.elapsed();
        Some(piece)
    }

    /// Rows `rank` was handed could not be read (their node was lost):
    /// the job makes them again, and they come anew through its stream.
    /// The rest of their output still buffered is on the same node: it is
    /// taken out and made again with them (the job waits for every piece
    /// of an output before it makes it again, and no rank may be able to
    /// take those).
    pub(super) fn owed(&self, rank: usize, epoch: usize, held: &HeldRows) {
        let mut state = self.lock();
        if state.epoch != Some(epoch) {
            return;
        }
        let mut same_node = VecDeque::new();
        for (piece, came) in std::mem::take(&mut state.buffer) {
            match &piece {
                Piece::Held(rows) if rows.same_output(held) => {
                    state.buffered -= rows.num_rows();
                    rows.lost();
                    same_node.push_back((piece, came));
                }
                _ => state.buffer.push_back((piece, came)),
            }
        }
        let rows = held.num_rows();
        state.delivered[rank] = state.delivered[rank].saturating_sub(rows);
        state.in_flight[rank] = state.in_flight[rank].saturating_sub(rows);
        let stats = &mut state.stats[rank];
        stats.rows = stats.rows.saturating_sub(rows);
        stats.pieces = stats.pieces.saturating_sub(1);
        state.ended = false;
        self.changed.notify_all();
        drop(state);
        drop(same_node); // outside the lock: the job hears of the output
    }
}

/// Ends a pull that unwinds (the job's stream panicked): the other ranks
/// are told the epoch failed instead of waiting for the pull for ever.
pub(super) struct PullGuard<'a>(&'a Shared);

impl Drop for PullGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut state = self.0.lock();
            state.pulling = false;
            state.failed = Some("a rank's pull from the job panicked".into());
            self.0.changed.notify_all();
        }
    }
}
