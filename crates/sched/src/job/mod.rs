//! The state of one job as a plain struct driven by events: which inputs
//! wait for which stage, which tasks run, are paused or are retried, what a
//! limit still lets through, what a repartition has collected. Each event
//! (`on_output`, `on_paused`, `on_finished`, `on_lost`, `fail`) updates it;
//! [`JobState::advance`] then asks the [policy](crate::policy) what to run
//! and returns the decisions as [`Action`]s for the executor to carry out.
//!
//! Nothing here touches an actor, a thread or the store: partitions are any
//! [`Part`] and memory is any [`Memory`], so every decision is tested with
//! plain values (see the property tests below).

mod events;
mod exchanged;
mod flow;
mod lineage;
mod order;
pub(crate) mod piece;
mod placement;
pub mod policy;
pub(crate) mod record;

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

/// The job's maps, keyed by its own task ids and origins: hashed by
/// foldhash, since the scheduler looks them up on every event (SipHash was
/// a tenth of the 1,000-node simulation's time).
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
use std::time::Duration;

use streambatch_core::{Resources, TaskId};
use streambatch_plan::{Error, EventKind, KeyRange, OpStats, PauseCause, Stage, StageKind, Wait};

use crate::job::exchanged::Exchanged;
pub(crate) use crate::job::lineage::fingerprint_cut;
pub(crate) use crate::job::piece::{Keep, Origin, Part, PieceId};
use crate::job::piece::{LineageInput, Piece, all_held, missing};
use crate::job::record::{Recorder, StageNow};
use policy::{Decision, Snapshot, StageView};

/// A stage's tasks are queued on a node beyond its free slots only when
/// they typically compute for no longer than this: the round trip to the
/// executor that queueing saves (tens of microseconds between threads) is
/// then a noticeable part of each task, and a queued task waits little.
const QUEUE_TASKS_UNDER: Duration = Duration::from_millis(1);

/// How many of a stage's oldest queued inputs a new task looks through for
/// one held on its own node.
const LOCAL_SEARCH: usize = 64;

/// What the job state asks of memory when it decides. Each node has its
/// own store and its own budgets: an output counts where it is stored.
pub(crate) trait Memory {
    /// Whether an output of `bytes` bytes of `stage` fits its budget and
    /// the store of `node` now.
    fn fits(&self, node: usize, stage: usize, bytes: u64) -> bool;
    /// Partitions the store of `node` has freed so far.
    fn frees(&self, node: usize) -> u64;
    /// Bytes of `stage`'s outputs held now, on all nodes.
    fn held(&self, stage: usize) -> u64;
    /// The capacity of the store of `node`.
    fn capacity(&self, node: usize) -> u64;
    /// Bytes of tasks' input held outside the store that `fits` already
    /// counts on `node` (a node's own budgets count a hold once the task
    /// opened; a driver's shadow of a remote node's budgets never does).
    fn outside(&self, node: usize) -> u64;
}

/// What a started task runs over, as the executor hands it over: a source
/// split or parts of upstream partitions. (The job keeps the same input as
/// a [`LineageInput`], named by origin, to run it again; a stage opens it
/// as `streambatch_plan::TaskInput`, batches read.)
#[derive(Clone)]
pub(crate) enum RunInput<P> {
    /// The i-th split of the source.
    Split(usize),
    /// Upstream rows, and for a sort's reducer the keys it keeps of them.
    Parts(Vec<P>, Option<Arc<KeyRange>>),
}

/// A task to start, as [`Action::Start`] carries it: `task` of `stage` on
/// `node` over `input`, storing the outputs `keep` names (an attempt after
/// the first skips what earlier ones delivered). With `may_spill`, its
/// outputs may go over budget and the store spills to make room.
pub(crate) struct Start<P> {
    pub(crate) task: TaskId,
    pub(crate) stage: usize,
    pub(crate) node: usize,
    pub(crate) input: RunInput<P>,
    /// A hash exchange's reducer: the rows its holders must find in all
    /// (the cuts summed as they arrived), checked where it runs.
    pub(crate) rows: Option<u64>,
    pub(crate) keep: Keep,
    pub(crate) may_spill: bool,
}

/// A decision for the executor to carry out, in order.
pub(crate) enum Action<P> {
    /// Start a task (see [`Start`]).
    Start(Start<P>),
    /// Resume the paused `task` on `node`, where it paused.
    Resume {
        task: TaskId,
        node: usize,
        may_spill: bool,
    },
    /// Hand rows of an output of the last stage to the driver; `id` names
    /// them, should the driver find them lost (see [`JobState::on_read`]).
    Emit { part: P, id: PieceId },
    /// Every output was handed to the driver, and some are not read yet:
    /// the job ends once they are (the driver may hold them unread, handing
    /// them on, and need to know that no more will come).
    Drained,
    /// `stage`'s remaining work is not needed: its tasks stop early and its
    /// paused tasks are dropped.
    Cancel { stage: usize },
    /// `stage`'s memory reserve fits its largest output so far.
    FitReserve { stage: usize, bytes: u64 },
    /// Copy output `origin` of `stage`, held on a draining node (`part` is
    /// rows of it there), to node `to`, and report it with
    /// [`JobState::on_moved`]: the drained node need not wait for it to be
    /// consumed before it leaves.
    Move {
        origin: Origin,
        stage: usize,
        part: P,
        to: usize,
    },
    /// The job ended.
    End(Result<(), Error>),
}

/// What the job state knows of a stage of the plan.
#[derive(Clone, Debug)]
pub(crate) struct StageShape {
    pub(crate) name: String,
    pub(crate) kind: ShapeKind,
    pub(crate) resources: Resources,
    /// The most tasks at once (a stateful operator's pool).
    pub(crate) max_running: Option<usize>,
    /// A source's bytes each split's task holds outside the store while it
    /// runs ([`streambatch_plan::SourceSplit::held_bytes`]); empty when
    /// none do.
    pub(crate) held_bytes: Vec<u64>,
    /// Its tasks reduce a sort's exchange: their outputs are in order.
    pub(crate) ordered: bool,
    /// What a task holds of its input outside the store at most (a sort's
    /// or join's reducer: `exec::budget::input_held_cap`); 0
    /// for stages that stream their input.
    pub(crate) input_held_cap: u64,
}

/// The kind of a stage, without its operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ShapeKind {
    Source { splits: usize },
    Map,
    Limit(usize),
    Repartition(usize),
    Exchange(usize),
}

impl ShapeKind {
    fn runs_tasks(self) -> bool {
        matches!(self, Self::Source { .. } | Self::Map)
    }
}

impl StageShape {
    /// The shape of a stage of a physical plan.
    pub(crate) fn of(stage: &Stage) -> Self {
        let kind = match &stage.kind {
            StageKind::Source { splits, .. } => ShapeKind::Source {
                splits: splits.len(),
            },
            StageKind::Map { .. } => ShapeKind::Map,
            StageKind::Limit(n) => ShapeKind::Limit(*n),
            StageKind::Repartition(n) => ShapeKind::Repartition(*n),
            StageKind::Exchange(n) => ShapeKind::Exchange(*n),
        };
        let held_bytes = match &stage.kind {
            StageKind::Source { splits, .. } if splits.iter().any(|s| s.held_bytes() > 0) => {
                splits.iter().map(|s| s.held_bytes()).collect()
            }
            _ => Vec::new(),
        };
        let ordered = match &stage.kind {
            StageKind::Map { ops } => ops.first().is_some_and(|(_, op)| {
                matches!(
                    op.kind,
                    streambatch_plan::OpKind::Reduce(streambatch_plan::Reduce::Sort { .. })
                )
            }),
            _ => false,
        };
        Self {
            name: stage.name.clone(),
            kind,
            resources: stage.options.resources,
            max_running: stage.options.pool.map(|p| p.max),
            held_bytes,
            ordered,
            input_held_cap: 0,
        }
    }
}

/// A paused task: the output it holds and, when the store turned it away,
/// the store's free count then (only a later free can make room).
struct Paused {
    task: TaskId,
    node: usize,
    pending_bytes: u64,
    store_full_at: Option<u64>,
}

struct StageState<P> {
    queue: VecDeque<LineageInput<P>>,
    /// Queued inputs with lost pieces, waiting for them to be made again.
    blocked: Vec<LineageInput<P>>,
    retry: VecDeque<TaskId>,
    /// Tasks to run again whose input has lost pieces.
    blocked_tasks: Vec<TaskId>,
    paused: Vec<Paused>,
    next_split: usize,
    splits: usize,
    /// Tasks placed and not paused, queued ones included.
    running: usize,
    /// Of those, tasks queued on their node beyond its free slots.
    queued: usize,
    done: bool,
    cancelled: bool,
    limit_left: usize,
    collected: Vec<Piece<P>>,
    /// An exchange's: what its map outputs' cuts add up to, so far.
    cut_sums: Option<exchanged::CutSums>,
    typical_bytes: u64,
    /// Outputs made and tasks finished so far, and how long a task
    /// typically computes (a moving average; zero before the first ends).
    outputs: u64,
    finished: u64,
    typical_busy: Duration,
    /// The largest output partition so far: the stage's memory reserve.
    largest_bytes: u64,
}

impl<P: Part> StageState<P> {
    fn new(kind: ShapeKind) -> Self {
        Self {
            queue: VecDeque::new(),
            blocked: Vec::new(),
            retry: VecDeque::new(),
            blocked_tasks: Vec::new(),
            paused: Vec::new(),
            next_split: 0,
            splits: match kind {
                ShapeKind::Source { splits } => splits,
                _ => 0,
            },
            running: 0,
            queued: 0,
            done: false,
            cancelled: false,
            limit_left: match kind {
                ShapeKind::Limit(n) => n,
                _ => 0,
            },
            collected: Vec::new(),
            cut_sums: None,
            typical_bytes: 0,
            outputs: 0,
            finished: 0,
            typical_busy: Duration::ZERO,
            largest_bytes: 0,
        }
    }

    /// Inputs a task could start on now.
    fn waiting(&self) -> usize {
        self.queue.len() + self.retry.len() + (self.splits - self.next_split)
    }

    /// Inputs a new task may start on: only re-runs once the stage is
    /// cancelled (a later stage still needs what they make).
    fn startable(&self) -> usize {
        if self.cancelled {
            self.retry.len()
        } else {
            self.waiting()
        }
    }

    /// Nothing waits, runs, pauses or waits for a lost piece.
    fn idle(&self) -> bool {
        self.waiting() == 0
            && self.running == 0
            && self.paused.is_empty()
            && self.blocked.is_empty()
            && self.blocked_tasks.is_empty()
            && all_held(&self.collected)
    }
}

/// A task from its start to its end: its input is kept for a retry.
struct TaskRecord<P> {
    stage: usize,
    /// The node it runs on (or last ran on).
    node: usize,
    input: LineageInput<P>,
    attempts: u32,
    /// Outputs delivered so far (`u32::MAX` once the task had finished).
    delivered: u32,
    /// Delivered outputs, lost since, that the next attempt makes again.
    again: BTreeSet<u32>,
    /// Those asked for while an attempt runs: the one after makes them.
    again_next: BTreeSet<u32>,
    /// Running or paused on `node` (not waiting to start).
    placed: bool,
    /// Handed to `node` beyond its free slots, to start in the next one
    /// that frees: it holds none of the job's count of the node's slots.
    queued: bool,
    /// Started or resumed to spill, memory being full (see
    /// `force_if_stuck`).
    spilling: bool,
    /// Run again after it had finished: its input was freed, not lost.
    rerun: bool,
    /// A reducer's rows, while an attempt is placed: the attempt may still
    /// read them after the exchange lets them go or moves them.
    holding: Vec<P>,
    /// Times it was run again, after it had finished, because outputs of
    /// it were lost with their node.
    reruns: u32,
}

/// A finished task's lineage: enough to run it again.
struct Made<P> {
    stage: usize,
    input: LineageInput<P>,
    reruns: u32,
}

/// What a job does when a task fails (see `NodeConfig`'s keys of the same
/// names).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FailurePolicy {
    /// Tries after the first for a system failure (and for an operator's
    /// error when `retry_user_errors`); also how often a finished task is
    /// run again to make its lost outputs.
    pub(crate) max_task_retries: u32,
    pub(crate) retry_user_errors: bool,
    /// Tasks whose operator failed that may be skipped.
    pub(crate) max_errored_partitions: u32,
}

impl FailurePolicy {
    pub(crate) fn of(config: &streambatch_core::NodeConfig) -> Self {
        Self {
            max_task_retries: config.max_task_retries,
            retry_user_errors: config.retry_user_errors,
            max_errored_partitions: config.max_errored_partitions,
        }
    }
}

/// The state of one job.
pub(crate) struct JobState<P> {
    shapes: Vec<StageShape>,
    stages: Vec<StageState<P>>,
    tasks: HashMap<TaskId, TaskRecord<P>>,
    /// Finished tasks' lineage, kept when the job may lose nodes.
    made: Option<HashMap<TaskId, Made<P>>>,
    /// Rows the driver found lost, waiting to be made again.
    reemit: Vec<Piece<P>>,
    /// Outputs handed to the driver that it has not yet said it read
    /// (counted only when the job keeps lineage).
    unread: usize,
    /// Whether the driver was told the job is drained since the last
    /// output it was handed (see [`Action::Drained`]).
    told_drained: bool,
    /// Free slots per node.
    free: Vec<Resources>,
    /// All slots per node.
    slots: Vec<Resources>,
    /// Per node: how many tasks it may be handed beyond its free slots
    /// (its board holds them for the next free slot), and how many it has.
    queue_room: Vec<usize>,
    queued: Vec<usize>,
    /// The nodes with queue room left, asked after `open`.
    queue_open: BTreeSet<usize>,
    /// Per node: it drains (no new task starts there).
    draining: Vec<bool>,
    /// Per node: it was lost.
    lost: Vec<bool>,
    /// The nodes not lost whose free slots fit some stage's task: the only
    /// ones a decision can place work on, so that a round of decisions on a
    /// busy cluster costs what it decides, not the number of nodes.
    open: BTreeSet<usize>,
    /// Per node, per stage: the node is not lost and its free slots fit a
    /// task of the stage; `fitting` counts such nodes per stage, so that
    /// reporting what a stage waits for costs no pass over the nodes.
    fits_here: Vec<Vec<bool>>,
    fitting: Vec<usize>,
    /// Outputs asked to move off a draining node, with that node.
    moving: HashMap<Origin, usize>,
    /// Something may have come to rest on a draining node (its drain, an
    /// output there, a task waiting to run again): look for what to move.
    hand_over_due: bool,
    /// The node the next round of decisions starts with, so that work
    /// spreads over nodes.
    next_node: usize,
    next_task: u64,
    failures: FailurePolicy,
    /// Tasks skipped so far under `max_errored_partitions`.
    skipped: u32,
    recorder: Recorder,
    actions: Vec<Action<P>>,
    ended: bool,
    /// When a stage reduces a sort: its outputs go on in range order (the
    /// last such stage's).
    order: Option<order::EmitOrder<P>>,
    /// A sort's outputs waiting for the driver to read the one before
    /// (when the job keeps lineage, see `JobState::emit`).
    to_driver: VecDeque<Piece<P>>,
    /// A fingerprint of where each exchanged map output was cut (and of a
    /// sort's output's key sample), taken as it arrives: a map output made
    /// again must be cut the same, since reducers read their rows of it
    /// by the cut. A fingerprint, not the cut: the cuts are M x N numbers.
    exchanged: HashMap<Origin, u64>,
    /// Per stage: the exchange before it, once it has all its map outputs
    /// (the stage's tasks are its reducers).
    exchanges: Vec<Option<Exchanged<P>>>,
    /// Tasks running (placed) that were started or resumed to spill: kept
    /// as a count, since `force_if_stuck` asks on every advance.
    spilling_tasks: usize,
}

impl<P: Part> JobState<P> {
    /// A job of `shapes` on nodes with `free` slots each (at least one
    /// node), meeting failed tasks as `failures` says.
    pub(crate) fn new(
        shapes: Vec<StageShape>,
        free: Vec<Resources>,
        failures: FailurePolicy,
        recorder: Recorder,
    ) -> Self {
        let stages = shapes.iter().map(|s| StageState::new(s.kind)).collect();
        let order = shapes
            .iter()
            .rposition(|s| s.ordered)
            .map(order::EmitOrder::new);
        let nodes = free.len();
        let stage_count = shapes.len();
        let mut job = Self {
            shapes,
            stages,
            tasks: HashMap::default(),
            made: None,
            reemit: Vec::new(),
            unread: 0,
            told_drained: false,
            draining: vec![false; free.len()],
            lost: vec![false; free.len()],
            open: BTreeSet::new(),
            fits_here: vec![vec![false; stage_count]; nodes],
            fitting: vec![0; stage_count],
            moving: HashMap::default(),
            hand_over_due: false,
            slots: free.clone(),
            queue_room: vec![0; nodes],
            queued: vec![0; nodes],
            queue_open: BTreeSet::new(),
            free,
            next_node: 0,
            next_task: 0,
            failures,
            skipped: 0,
            recorder,
            actions: Vec::new(),
            ended: false,
            order,
            to_driver: VecDeque::new(),
            exchanged: HashMap::default(),
            exchanges: (0..stage_count).map(|_| None).collect(),
            spilling_tasks: 0,
        };
        (0..nodes).for_each(|node| job.reopen(node));
        job
    }

    /// The job keeps every finished task's lineage, so that it survives
    /// the loss of a node (see [`JobState::on_node_lost`]), and ends only
    /// once the driver has read every output ([`JobState::on_read`]).
    pub(crate) fn with_lineage(mut self) -> Self {
        self.made = Some(HashMap::default());
        self
    }

    /// Node `node` may be handed up to `room` tasks beyond its free slots,
    /// which its workers start as slots free without waiting for the next
    /// decision (a queued task holds the memory its output will need).
    pub(crate) fn queueing(mut self, node: usize, room: usize) -> Self {
        self.queue_room[node] = room;
        self.reopen(node);
        self
    }

    /// A node with `free` slots joins the job; returns its number.
    pub(crate) fn add_node(&mut self, free: Resources) -> usize {
        self.free.push(free);
        self.slots.push(free);
        self.queue_room.push(0);
        self.queued.push(0);
        self.draining.push(false);
        self.lost.push(false);
        self.fits_here.push(vec![false; self.shapes.len()]);
        let node = self.free.len() - 1;
        self.reopen(node);
        node
    }

    /// Node `node` drains: no new task starts there (its paused tasks may
    /// still resume, since their outputs wait there).
    pub(crate) fn drain_node(&mut self, node: usize) {
        if let Some(d) = self.draining.get_mut(node) {
            *d = true;
            self.hand_over_due = true;
        }
    }

    /// True when node `node` drained and the job has nothing there: no
    /// task placed on it, no partition it holds still to be read (queued,
    /// or the input of a task, which may not have read it yet). Its
    /// leaving then costs the job nothing.
    pub(crate) fn left_cleanly(&self, node: usize) -> bool {
        let here = |p: &Piece<P>| p.part.as_ref().is_some_and(|p| p.node() == node);
        let held_here = |parts: &[P]| parts.iter().any(|p| p.node() == node);
        self.draining.get(node).copied().unwrap_or(false)
            && !self.tasks.values().any(|t| {
                t.placed && t.node == node
                    || t.input.pieces().iter().any(here)
                    || held_here(&t.holding)
            })
            && !self.stages.iter().any(|s| {
                s.queue.iter().flat_map(LineageInput::pieces).any(here)
                    || s.blocked.iter().flat_map(LineageInput::pieces).any(here)
                    || s.collected.iter().any(here)
            })
            && !self
                .exchanges
                .iter()
                .flatten()
                .any(|e| e.pieces().any(here))
            && !self.to_driver.iter().any(here)
            && !self.order.as_ref().is_some_and(|o| o.held().any(here))
    }

    /// The job's stats recorder.
    pub(crate) fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    /// The recorder, to close the job's stats.
    pub(crate) fn recorder_mut(&mut self) -> &mut Recorder {
        &mut self.recorder
    }

    /// True once the job has ended.
    pub(crate) fn ended(&self) -> bool {
        self.ended
    }

    /// A stage whose task needs more than any node has would never run:
    /// an error naming it, instead of waiting forever.
    pub(crate) fn check_resources(&self) -> Result<(), Error> {
        for shape in self.shapes.iter().filter(|s| s.kind.runs_tasks()) {
            let need = shape.resources;
            if !self.free.iter().any(|f| need.fits_in(f)) {
                let have = self
                    .free
                    .iter()
                    .copied()
                    .max_by(|a, b| (a.cpus + a.gpus).total_cmp(&(b.cpus + b.gpus)))
                    .unwrap_or_default();
                return Err(Error::NoSlots {
                    operator: shape.name.clone(),
                    need,
                    have,
                });
            }
        }
        Ok(())
    }

    /// A task could start now but for memory (or a full pool): some node
    /// has a free slot that fits a stage, and some stage has work. Only
    /// then can memory returned start a task; otherwise the next task to
    /// end makes room first.
    pub(crate) fn may_wait_on_memory(&self) -> bool {
        !self.open.is_empty() && self.has_work()
    }

    /// The stage of a task that has not finished.
    pub(crate) fn stage_of(&self, task: TaskId) -> Option<usize> {
        self.tasks.get(&task).map(|r| r.stage)
    }

    /// The fingerprint of exchanged map output `origin`'s cut, as it
    /// arrived (see [`fingerprint_cut`]).
    pub(crate) fn cut_fingerprint(&self, origin: Origin) -> Option<u64> {
        self.exchanged.get(&origin).copied()
    }

    /// The node task `task` runs (or is paused) on.
    pub(crate) fn node_of(&self, task: TaskId) -> Option<usize> {
        self.tasks.get(&task).filter(|r| r.placed).map(|r| r.node)
    }

    /// Decides what runs next: starts and resumes what the policy allows,
    /// settles finished stages, lets tasks spill when nothing else can
    /// progress, and ends the job once every stage is done. Returns the
    /// decisions taken since the last call.
    pub(crate) fn advance(&mut self, memory: &impl Memory) -> Vec<Action<P>> {
        if !self.ended {
            loop {
                self.decide(memory);
                if self.settle() {
                    continue;
                }
                if !self.force_if_stuck(memory) {
                    break;
                }
            }
            self.hand_over();
            self.report_stages(memory);
            if self.finished() {
                self.end(Ok(()));
            } else if self.drained() && !self.told_drained {
                self.told_drained = true;
                self.actions.push(Action::Drained);
            }
        }
        std::mem::take(&mut self.actions)
    }

    /// Every stage is done and idle, and the driver has every output.
    fn finished(&self) -> bool {
        self.drained() && self.unread == 0
    }

    /// Every stage is done and idle, and every output was handed to the
    /// driver (which may not have read them all).
    fn drained(&self) -> bool {
        self.stages.iter().all(|s| s.done && s.idle())
            && self.reemit.is_empty()
            && self.to_driver.is_empty()
    }

    fn end(&mut self, result: Result<(), Error>) {
        if self.ended {
            return;
        }
        self.ended = true;
        for (stage, s) in self.stages.iter_mut().enumerate() {
            if !s.cancelled {
                self.actions.push(Action::Cancel { stage });
            }
            s.cancelled = true;
            s.queue.clear();
            s.blocked.clear();
            s.paused.clear();
            s.collected.clear();
            s.cut_sums = None;
        }
        self.exchanges.iter_mut().for_each(|e| *e = None);
        self.reemit.clear();
        self.to_driver.clear();
        self.actions.push(Action::End(result));
    }
}

/// What a task over `parts` holds outside the store when its stage's tasks
/// hold at most `cap` bytes of their input: their bytes, up to `cap`.
pub(crate) fn input_hold<'a, P: Part + 'a>(
    cap: u64,
    parts: impl IntoIterator<Item = &'a P>,
) -> u64 {
    match cap {
        0 => 0,
        _ => parts
            .into_iter()
            .map(Part::sliced_bytes)
            .sum::<u64>()
            .min(cap),
    }
}

impl<P: Part> JobState<P> {
    /// The exchange before `stage`, whose reducers its tasks are.
    fn exchange(&self, stage: usize) -> &Exchanged<P> {
        self.exchanges[stage]
            .as_ref()
            .expect("a reducer's stage keeps its exchange")
    }

    /// The origins of the rows `input` of a task of `stage` reads that are
    /// not held.
    fn missing_input(&self, stage: usize, input: &LineageInput<P>) -> Vec<Origin> {
        match input {
            LineageInput::Reducer(place) => self.exchange(stage).missing(*place),
            _ => missing(input.pieces()).collect(),
        }
    }

    /// The parts of an input of a task of `stage` whose rows are all held.
    fn held_input(&self, stage: usize, input: &LineageInput<P>) -> RunInput<P> {
        match input {
            LineageInput::Split(i) => RunInput::Split(*i),
            LineageInput::Pieces(pieces) => RunInput::Parts(
                pieces
                    .iter()
                    .map(|p| p.part.clone().expect("a task starts on held input"))
                    .collect(),
                None,
            ),
            LineageInput::Reducer(place) => {
                let exchange = self.exchange(stage);
                RunInput::Parts(exchange.parts(*place), exchange.range(*place))
            }
        }
    }

    /// The rows the holders of a hash exchange reducer's input must find
    /// for it (see [`Start::rows`]); `None` for other tasks.
    fn rows_found_by_holders(&self, stage: usize, input: &LineageInput<P>) -> Option<u64> {
        match input {
            LineageInput::Reducer(place) => self.exchange(stage).rows_found_by_holders(*place),
            _ => None,
        }
    }

    /// What a task of `stage` reads, in words.
    fn describe_input(&self, stage: usize, input: &LineageInput<P>) -> String {
        match input {
            LineageInput::Split(i) => format!("source split {i}"),
            LineageInput::Pieces(pieces) => {
                let rows: usize = pieces.iter().map(|p| p.id.len).sum();
                format!("{} input partition(s), {rows} rows", pieces.len())
            }
            LineageInput::Reducer(place) => self.exchange(stage).describe(*place),
        }
    }

    /// Reducer `place` of `stage`'s exchange finished, or will not run.
    fn reducer_done(&mut self, stage: usize, input: &LineageInput<P>) {
        if let (LineageInput::Reducer(place), Some(exchange)) = (input, &mut self.exchanges[stage])
        {
            exchange.finished(*place);
        }
    }
}
