//! One running job shared by `n` consumers in this process (trainer ranks,
//! a thread each): [`Dataset::streaming_split`](crate::Dataset::streaming_split).
//!
//! Each epoch runs the pipeline once, starting when every rank has asked
//! for it (after a timeout, the ranks waiting get an error naming those
//! that never asked). Partitions go to the rank that asks (demand-driven,
//! like Ray Data's output splitter): a slow rank takes fewer and holds no
//! one back. Pulling from the job is one rank at a time, the others wait
//! for that partition, not for each other's training steps.
//!
//! With `equal`, every rank gets the same number of rows per epoch. Rows
//! pulled from the job wait in a buffer until a rank may take them; a rank
//! may hold at most its share of all rows seen so far, `(delivered +
//! buffered) / n` (a partition is sliced to fit). That share only grows as
//! more rows come, so when the job ends every rank can be brought up to
//! exactly `total / n` and none is past it; the few rows left over are
//! dropped and counted ([`Split::dropped_rows`]). A rank ahead of its share
//! pulls more from the job, which the store budget throttles: a slow rank
//! slows the others only through memory. A rank that drops its epoch's
//! stream before the end leaves the epoch: the shares are the remaining
//! ranks' from then on (a share only grows by it, since the one who left
//! held no more than its own), so its rows go to them.
//!
//! A rank served to another process ([`Split::forwarded_epoch`]) counts
//! what it yields as in flight until the trainer confirms it; when the
//! trainer is lost, those rows come back ([`EpochStream::give_back`]) and
//! [`LostRank`] says whether the others share its part of the epoch or stop
//! with an error naming it ([`EpochStream::lose`]). A rank at the end of an
//! epoch waits while another rank's rows are in flight, since they may
//! come back to it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::batching::BatchOptions;
use crate::dataset::{BatchStream, Dataset};
use crate::held::{HeldRows, Piece, Pulled};
use crate::stats::{JobStats, MAX_EVENTS, RankWait};
use crate::{BatchIter, Error, Result};

/// How a dataset is split: see [`Dataset::streaming_split_with`](crate::Dataset::streaming_split_with).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitOptions {
    /// Every rank gets the same number of rows per epoch (the few left
    /// over are dropped and counted).
    pub equal: bool,
    /// How long a rank waits at an epoch's start for the others to ask.
    pub barrier_timeout: Duration,
    /// Runs epoch `e` with the source's splits in the order that seed
    /// `seed + e` gives ([`Dataset::randomize_block_order`]): a new order
    /// every epoch, the same rows.
    pub block_order_seed: Option<u64>,
    /// What the other ranks get when one is lost mid-epoch.
    pub on_lost_rank: LostRank,
    /// Starts an epoch's job as soon as one rank asks for it once the last
    /// epoch's job has ended, while the others consume their last rows:
    /// its output waits in the store (the job pauses when its budget is
    /// full) until every rank has asked. Dropped if the barrier times out.
    pub prefetch_next_epoch: bool,
    /// The number of epochs the ranks will read, from epoch 0, when known:
    /// with `prefetch_next_epoch`, epoch 0's job starts when the split is
    /// made, and the next epoch's as soon as this one's has ended, while
    /// the ranks still hold its last rows (a trainer draining its shuffle
    /// window), not when a rank asks for it. (Ranks that start at a later
    /// epoch, resuming, leave epoch 0's job to be dropped when theirs
    /// starts: leave it `None` then.)
    pub epochs: Option<usize>,
}

/// What the other ranks of a split get when one is lost mid-epoch (its
/// process died or its connection closed; see [`EpochStream::lose`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LostRank {
    /// The rows it had not taken go to the others: every row of the epoch
    /// is still delivered once across the ranks.
    #[default]
    Redistribute,
    /// Every other rank's stream ends with [`Error::SplitRankLost`] naming
    /// it, and the epoch's job stops.
    Fail,
}

impl Default for SplitOptions {
    fn default() -> Self {
        Self {
            equal: false,
            barrier_timeout: Duration::from_secs(600),
            block_order_seed: None,
            on_lost_rank: LostRank::default(),
            prefetch_next_epoch: true,
            epochs: None,
        }
    }
}

/// What makes epoch `e`'s pipeline (see [`Split::per_epoch`]).
type EpochPlan = dyn Fn(usize) -> Result<Dataset> + Send + Sync;

/// One rank's share of a split dataset. `Send`: hand each to its thread.
pub struct Split {
    rank: usize,
    shared: Arc<Shared>,
}

struct Shared {
    /// This split itself, for the metrics to read while it lives.
    me: std::sync::Weak<Shared>,
    /// Whether a runner shows this split in its metrics yet.
    watched: std::sync::atomic::AtomicBool,
    /// Each epoch's pipeline.
    epochs: Box<EpochPlan>,
    ranks: usize,
    options: SplitOptions,
    state: Mutex<State>,
    changed: Condvar,
    /// Per rank, batches its consumer got ([`RankStats::batches`]): apart
    /// from the state, so that counting takes no lock and holds no
    /// reference to the split (a server counts on its runtime's threads).
    batches: Arc<[AtomicUsize]>,
}

#[derive(Default)]
struct State {
    /// Per rank, the last epoch it asked for, and the last it left before
    /// its end.
    asked: Vec<Option<usize>>,
    left: Vec<Option<usize>>,
    /// The epoch whose job runs (or ran last).
    epoch: Option<usize>,
    /// That epoch's job; `None` while a rank pulls from it.
    stream: Option<BatchStream>,
    pulling: bool,
    /// The job has handed over every output (it may still make again one
    /// found lost: see [`EpochStream::owed`]).
    ended: bool,
    /// Rows pulled and not yet handed to a rank, oldest first, with when
    /// they came.
    buffer: VecDeque<(Piece, Instant)>,
    buffered: usize,
    /// Rows let go once every rank still in the epoch had finished it.
    released: usize,
    /// Per rank, whether it has finished this epoch.
    finished: Vec<bool>,
    /// Per rank, rows handed to it this epoch.
    delivered: Vec<usize>,
    /// Per rank, rows forwarded to its process and not yet confirmed.
    in_flight: Vec<usize>,
    /// With `equal`, every rank's rows once one rank has finished the
    /// epoch: a rank leaving later cannot make the others' shares grow.
    target: Option<usize>,
    failed: Option<String>,
    /// Under [`LostRank::Fail`], the rank lost this epoch and how.
    lost: Option<(usize, String)>,
    /// Rows no rank took of the epoch before this one (see `dropped_rows`).
    dropped: usize,
    /// Per rank, over all epochs.
    stats: Vec<RankStats>,
    /// `stats` as this epoch began.
    stats_before: Vec<RankStats>,
    /// The epoch's pipeline (its job's stats once it ended) and when its
    /// job started.
    epoch_data: Option<(Dataset, Instant)>,
    /// Times the ranks waited for data this epoch (the first
    /// [`MAX_EVENTS`]), for the epoch's timeline.
    rank_waits: Vec<RankWait>,
    /// The next epoch's job, started early (`prefetch_next_epoch`).
    next: Option<(usize, Result<EpochJob>)>,
    /// The schema of the epoch's rows, from the first partition pulled
    /// (even an empty one, which no rank gets).
    schema: Option<SchemaRef>,
}

/// An epoch's running job, its pipeline and when it started.
type EpochJob = (BatchStream, Dataset, Instant);

/// What one rank of a split got, over all its epochs so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankStats {
    /// Rows handed to it.
    pub rows: usize,
    /// Pieces of partitions handed to it (before any batching).
    pub pieces: usize,
    /// Batches its consumer got: as [`Split::iter_batches`] (or a trainer
    /// process's `iter_batches`, which reports them) cut them; a consumer
    /// of [`Split::epoch`] or of Arrow Flight gets each piece as a batch.
    pub batches: usize,
    /// Time it waited for data: in the epoch's barrier, for the job, for
    /// another rank's pull.
    pub waited_for_data: Duration,
    /// Time what it took had waited for it in the split's buffer, summed
    /// over its pieces: the job's output waiting for this trainer.
    pub data_waited: Duration,
}

impl RankStats {
    /// What was added to these figures since `before`.
    fn since(&self, before: &RankStats) -> RankStats {
        RankStats {
            rows: self.rows.saturating_sub(before.rows),
            pieces: self.pieces.saturating_sub(before.pieces),
            batches: self.batches.saturating_sub(before.batches),
            waited_for_data: self.waited_for_data.saturating_sub(before.waited_for_data),
            data_waited: self.data_waited.saturating_sub(before.data_waited),
        }
    }
}

impl State {
    /// Rows of the last epoch whose job ended that no rank took (once it
    /// ended, what is still buffered; before, the epoch before's).
    fn dropped(&self) -> usize {
        match self.ended {
            true => self.buffered + self.released,
            false => self.dropped,
        }
    }
}

impl Dataset {
    /// `n` splits of one running job, each to be consumed by one rank (a
    /// thread of this process): see [`Split`]. With `equal`, every rank
    /// gets the same number of rows per epoch.
    pub fn streaming_split(&self, n: usize, equal: bool) -> Result<Vec<Split>> {
        let options = SplitOptions {
            equal,
            ..SplitOptions::default()
        };
        self.streaming_split_with(n, options)
    }

    /// [`streaming_split`](Dataset::streaming_split) with every option.
    pub fn streaming_split_with(&self, n: usize, options: SplitOptions) -> Result<Vec<Split>> {
        let dataset = self.clone();
        Split::per_epoch(n, options, move |_| Ok(dataset.clone()))
    }
}

impl Split {
    /// `n` splits of one job per epoch, epoch `e`'s job running the
    /// pipeline `plan(e)` makes: operators seeded by the epoch (as
    /// streambatch's `ops::random_resized_crop` and `ops::flip` are) then
    /// change every epoch. `plan` runs once per epoch, when the
    /// epoch starts; its error is the error of every rank's stream.
    pub fn per_epoch(
        n: usize,
        options: SplitOptions,
        plan: impl Fn(usize) -> Result<Dataset> + Send + Sync + 'static,
    ) -> Result<Vec<Split>> {
        if n == 0 {
            return Err(Error::Invalid(
                "a streaming split needs at least one rank".into(),
            ));
        }
        let state = State {
            asked: vec![None; n],
            left: vec![None; n],
            delivered: vec![0; n],
            in_flight: vec![0; n],
            finished: vec![false; n],
            stats: vec![RankStats::default(); n],
            ..State::default()
        };
        let shared = Arc::new_cyclic(|me| Shared {
            me: me.clone(),
            watched: Default::default(),
            epochs: Box::new(plan),
            ranks: n,
            options,
            state: Mutex::new(state),
            changed: Condvar::new(),
            batches: (0..n).map(|_| AtomicUsize::new(0)).collect(),
        });
        if options.prefetch_next_epoch && options.epochs.is_some_and(|n| n > 0) {
            // The ranks will read epoch 0: its job starts now, so that its
            // first rows are ready when they ask.
            let first = shared.begin(0);
            shared.lock().next = Some((0, first));
        }
        Ok((0..n)
            .map(|rank| Split {
                rank,
                shared: shared.clone(),
            })
            .collect())
    }
}

impl Split {
    /// This split's rank, 0 to n - 1.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// This rank's partitions of epoch `epoch`. The epoch's job starts at
    /// the first `next()` once every rank has asked for it.
    pub fn epoch(&self, epoch: usize) -> EpochStream {
        let mut stream = self.open_epoch(epoch, false);
        stream.counts_batches = true;
        stream
    }

    /// [`epoch`](Split::epoch), for a server forwarding the rank's rows to
    /// a trainer in another process: what it yields is in flight until
    /// [`EpochStream::confirm`] (the trainer got it) or
    /// [`EpochStream::give_back`] (it never will), and no rank ends the
    /// epoch while rows are in flight.
    pub fn forwarded_epoch(&self, epoch: usize) -> EpochStream {
        self.open_epoch(epoch, true)
    }

    fn open_epoch(&self, epoch: usize, forwarded: bool) -> EpochStream {
        let mut state = self.shared.lock();
        state.asked[self.rank] = Some(epoch);
        self.shared.changed.notify_all();
        EpochStream {
            rank: self.rank,
            epoch,
            forwarded,
            near: None,
            counts_batches: false,
            shared: self.shared.clone(),
            started: false,
            done: false,
        }
    }

    /// This rank's batches of epoch `epoch`, cut as `options` says (and
    /// counted in its [`RankStats::batches`]).
    pub fn iter_batches(&self, epoch: usize, options: BatchOptions) -> Result<BatchIter> {
        let stream = self.open_epoch(epoch, false);
        let count = stream.batch_count();
        Ok(crate::batching::counted(options.cut(stream)?, move || {
            count.add(1)
        }))
    }

    /// Rows of the last epoch whose job ended that no rank took: with
    /// `equal`, what the equal shares left over (fewer than the ranks
    /// still in it), and a leaving rank's rows when every other rank had
    /// already finished. Final once every rank has finished the epoch.
    pub fn dropped_rows(&self) -> usize {
        self.shared.lock().dropped()
    }

    /// The stats of the last epoch's job once it ended, with the times the
    /// ranks waited for data in it (`rank_waits`) and what each got of it
    /// (`rank_totals`); `None` before.
    pub fn epoch_stats(&self) -> Option<JobStats> {
        let state = self.shared.lock();
        let mut stats = state.epoch_data.as_ref()?.0.stats()?;
        stats.rank_waits = state.rank_waits.clone();
        stats.rank_totals = (self.shared.stats_now(&state).iter())
            .zip(
                state
                    .stats_before
                    .iter()
                    .chain(std::iter::repeat(&RankStats::default())),
            )
            .map(|(now, before)| now.since(before))
            .collect();
        Some(stats)
    }

    /// Writes the last epoch's timeline to `path` (see
    /// [`Dataset::write_timeline`]), with a track per rank showing when
    /// its trainer waited for data.
    pub fn write_timeline(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let path = path.as_ref();
        let stats = self.epoch_stats().ok_or_else(|| {
            Error::Invalid(format!(
                "no timeline to write to {}: no epoch of the split has ended yet",
                path.display()
            ))
        })?;
        crate::timeline::write(&stats, path)
    }

    /// What each rank of the split got so far, by rank.
    pub fn stats(&self) -> Vec<RankStats> {
        self.shared.stats_now(&self.shared.lock())
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Each rank's figures so far, its batches counted.
    fn stats_now(&self, state: &State) -> Vec<RankStats> {
        let mut stats = state.stats.clone();
        for (rank, stats) in stats.iter_mut().enumerate() {
            stats.batches = self.batches[rank].load(Ordering::Relaxed);
        }
        stats
    }

    /// Waits until every rank asked for `epoch`, then starts its job if no
    /// rank did yet.
    fn start(&self, epoch: usize) -> Result<()> {
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
    fn begin(&self, epoch: usize) -> Result<EpochJob> {
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
    fn prefetch_after(&self, state: &mut State, epoch: usize) {
        let will_read = self.options.epochs.is_some_and(|n| epoch + 1 < n);
        if self.options.prefetch_next_epoch && will_read && state.next.is_none() {
            state.next = Some((epoch + 1, self.begin(epoch + 1)));
        }
    }

    /// The next rows for `rank` (taken first from a node on host `near`,
    /// where one holds some), or `None` once it has all it gets.
    fn next_for(
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
    fn look_ahead(state: &mut State) {
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
    fn finish(&self, state: &mut State, rank: usize) -> VecDeque<(Piece, Instant)> {
        state.finished[rank] = true;
        self.release_if_all_finished(state)
    }

    /// The buffer, taken out once every rank still in the epoch has
    /// finished it (see [`Shared::finish`]).
    fn release_if_all_finished(&self, state: &mut State) -> VecDeque<(Piece, Instant)> {
        let all = (0..self.ranks).all(|r| state.finished[r] || state.left[r] == state.epoch);
        if !all {
            return VecDeque::new();
        }
        state.released += std::mem::take(&mut state.buffered);
        std::mem::take(&mut state.buffer)
    }

    /// Rows the ranks still in the epoch have seen (taken or buffered),
    /// and how many they are (at least 1).
    fn seen(&self, state: &State) -> (usize, usize) {
        let present = |r: &usize| state.left[*r] != state.epoch;
        let taken: usize = (0..self.ranks)
            .filter(present)
            .map(|r| state.delivered[r])
            .sum();
        let ranks = (0..self.ranks).filter(present).count().max(1);
        (taken + state.buffered, ranks)
    }

    /// Rank `rank` dropped its stream of `epoch` before its end.
    fn leave(&self, rank: usize, epoch: usize) {
        let mut state = self.lock();
        state.left[rank] = Some(epoch);
        self.changed.notify_all();
        if state.ended && state.epoch == Some(epoch) {
            let released = self.release_if_all_finished(&mut state);
            drop(state);
            drop(released);
        }
    }

    /// Rows `rank` was handed but never got (see [`EpochStream::give_back`]):
    /// first in line for whoever asks next.
    fn give_back(&self, rank: usize, epoch: usize, piece: Piece) {
        if let Piece::Held(held) = &piece
            && held.output_lost()
        {
            // On a lost node, as rows of its output found lost: made again.
            held.lost();
            return self.owed(rank, epoch, held);
        }
        let mut state = self.lock();
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
    fn waited(&self, rank: usize, epoch: usize, asked: Instant) {
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
    fn confirm(&self, rank: usize, epoch: usize) {
        let mut state = self.lock();
        if state.epoch == Some(epoch) && state.in_flight[rank] > 0 {
            state.in_flight[rank] = 0;
            self.changed.notify_all();
        }
    }

    /// Rank `rank` was lost during `epoch`, as `reason` says: it leaves, or
    /// (under [`LostRank::Fail`]) the epoch stops for every rank.
    fn lose(&self, rank: usize, epoch: usize, reason: String) {
        self.confirm(rank, epoch);
        if self.options.on_lost_rank == LostRank::Redistribute {
            return self.leave(rank, epoch);
        }
        let mut state = self.lock();
        if state.epoch != Some(epoch) || state.lost.is_some() {
            return;
        }
        state.lost = Some((rank, reason));
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
    fn take(&self, state: &mut State, rank: usize, near: Option<&str>) -> Option<Piece> {
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
    fn owed(&self, rank: usize, epoch: usize, held: &HeldRows) {
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
struct PullGuard<'a>(&'a Shared);

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

/// One rank's partitions of one epoch (see [`Split::epoch`]).
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
    /// Every piece this forwarded stream yielded reached its trainer.
    pub fn confirm(&self) {
        self.shared.confirm(self.rank, self.epoch);
    }

    /// Hands back rows this forwarded stream yielded that never reached
    /// the trainer (its process was lost before confirming them): the next
    /// rank to ask gets them, so no row is lost.
    pub fn give_back(&self, piece: Piece) {
        self.shared.give_back(self.rank, self.epoch, piece);
    }

    /// Rows this stream yielded held by a node could not be read by
    /// anyone (the node was lost; [`HeldRows::read`](crate::HeldRows::read)
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
    /// says: under [`LostRank::Redistribute`] it leaves the epoch and the
    /// others take its rows; under [`LostRank::Fail`] every other rank's
    /// stream ends with an error naming it.
    pub fn lose(mut self, reason: impl Into<String>) {
        if !self.done {
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

/// Adds to a rank's batches delivered ([`RankStats::batches`]). Holds
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
