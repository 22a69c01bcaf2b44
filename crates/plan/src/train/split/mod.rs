//! One running job shared by `n` consumers in this process (trainer ranks,
//! a thread each): [`Dataset::streaming_split`](crate::dataset::Dataset::streaming_split).
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
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use arrow_schema::SchemaRef;

use crate::dataset::held::Piece;
use crate::dataset::{BatchStream, Dataset};
use crate::error::{Error, Result};
use crate::stats::{JobStats, RankStats, RankWait};
use crate::train::batching::BatchOptions;
use crate::udf::BatchIter;

mod epoch;
mod shared;

pub use epoch::{BatchCount, Confirmer, EpochStream};

/// How a dataset is split: see [`Dataset::streaming_split_with`](crate::dataset::Dataset::streaming_split_with).
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
    /// How long a trainer process (a rank served over QUIC or Flight) may
    /// hold rows it was sent without asking for more or confirming them,
    /// before it counts as lost: its unsent rows go to the others (as
    /// `on_lost_rank` says), the rows it held are counted in
    /// [`RankStats::lost_rows`], and the log names it. Without a limit one
    /// stuck trainer would hold up every rank at the epoch's end. Default:
    /// 10 minutes (longer than a checkpoint or an evaluation a trainer
    /// may run between two asks; raise it for longer ones).
    pub stalled_trainer_timeout: Duration,
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
            stalled_trainer_timeout: Duration::from_secs(600),
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
        self.open_epoch(epoch, false).counting_batches()
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
        EpochStream::new(self.rank, epoch, forwarded, self.shared.clone())
    }

    /// This rank's batches of epoch `epoch`, cut as `options` says (and
    /// counted in its [`RankStats::batches`]).
    pub fn iter_batches(&self, epoch: usize, options: BatchOptions) -> Result<BatchIter> {
        let stream = self.open_epoch(epoch, false);
        let count = stream.batch_count();
        Ok(crate::train::batching::counted(
            options.cut(stream)?,
            move || count.add(1),
        ))
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
        crate::stats::timeline::write(&stats, path)
    }

    /// What each rank of the split got so far, by rank.
    pub fn stats(&self) -> Vec<RankStats> {
        self.shared.stats_now(&self.shared.lock())
    }
}
