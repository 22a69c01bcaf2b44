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

pub(crate) mod piece;
pub mod policy;
pub(crate) mod record;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use streambatch_core::{Resources, TaskId};
use streambatch_plan::{Error, EventKind, OpStats, PauseCause, Stage, StageKind, Wait};

pub(crate) use crate::job::piece::{Keep, Origin, Part, PieceId};
use crate::job::piece::{Piece, TaskInput, all_held, missing};
use crate::job::record::{Recorder, StageNow};
use policy::{Decision, Snapshot, StageView};

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

/// The input of a task: a source split or parts of upstream partitions.
#[derive(Clone)]
pub(crate) enum Input<P> {
    /// The i-th split of the source.
    Split(usize),
    /// Upstream rows.
    Parts(Vec<P>),
}

/// A decision for the executor to carry out, in order.
pub(crate) enum Action<P> {
    /// Start `task` of `stage` over `input`, storing the outputs `keep`
    /// names (an attempt after the first skips what earlier ones
    /// delivered). With `may_spill`, its outputs may go over budget and
    /// the store spills to make room.
    Start {
        task: TaskId,
        stage: usize,
        node: usize,
        input: Input<P>,
        keep: Keep,
        may_spill: bool,
    },
    /// Resume the paused `task` on `node`, where it paused.
    Resume {
        task: TaskId,
        node: usize,
        may_spill: bool,
    },
    /// Hand rows of an output of the last stage to the driver; `id` names
    /// them, should the driver find them lost (see [`JobState::on_read`]).
    Emit { part: P, id: PieceId },
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
}

/// The kind of a stage, without its operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ShapeKind {
    Source { splits: usize },
    Map,
    Limit(usize),
    Repartition(usize),
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
        };
        let held_bytes = match &stage.kind {
            StageKind::Source { splits, .. } if splits.iter().any(|s| s.held_bytes() > 0) => {
                splits.iter().map(|s| s.held_bytes()).collect()
            }
            _ => Vec::new(),
        };
        Self {
            name: stage.name.clone(),
            kind,
            resources: stage.options.resources,
            max_running: stage.options.pool.map(|p| p.max),
            held_bytes,
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
    queue: VecDeque<Vec<Piece<P>>>,
    /// Queued inputs with lost pieces, waiting for them to be made again.
    blocked: Vec<Vec<Piece<P>>>,
    retry: VecDeque<TaskId>,
    /// Tasks to run again whose input has lost pieces.
    blocked_tasks: Vec<TaskId>,
    paused: Vec<Paused>,
    next_split: usize,
    splits: usize,
    running: usize,
    done: bool,
    cancelled: bool,
    limit_left: usize,
    collected: Vec<Piece<P>>,
    typical_bytes: u64,
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
            done: false,
            cancelled: false,
            limit_left: match kind {
                ShapeKind::Limit(n) => n,
                _ => 0,
            },
            collected: Vec::new(),
            typical_bytes: 0,
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
    input: TaskInput<P>,
    attempts: u32,
    /// Outputs delivered so far (`u32::MAX` once the task had finished).
    delivered: u32,
    /// Delivered outputs, lost since, that the next attempt makes again.
    again: BTreeSet<u32>,
    /// Those asked for while an attempt runs: the one after makes them.
    again_next: BTreeSet<u32>,
    /// Running or paused on `node` (not waiting to start).
    placed: bool,
    /// Run again after it had finished: its input was freed, not lost.
    rerun: bool,
    /// Times it was run again, after it had finished, because outputs of
    /// it were lost with their node.
    reruns: u32,
}

/// A finished task's lineage: enough to run it again.
struct Made<P> {
    stage: usize,
    input: TaskInput<P>,
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
    /// Free slots per node.
    free: Vec<Resources>,
    /// All slots per node.
    slots: Vec<Resources>,
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
        let nodes = free.len();
        let stage_count = shapes.len();
        let mut job = Self {
            shapes,
            stages,
            tasks: HashMap::new(),
            made: None,
            reemit: Vec::new(),
            unread: 0,
            draining: vec![false; free.len()],
            lost: vec![false; free.len()],
            open: BTreeSet::new(),
            fits_here: vec![vec![false; stage_count]; nodes],
            fitting: vec![0; stage_count],
            moving: HashMap::new(),
            hand_over_due: false,
            slots: free.clone(),
            free,
            next_node: 0,
            next_task: 0,
            failures,
            skipped: 0,
            recorder,
            actions: Vec::new(),
            ended: false,
        };
        (0..nodes).for_each(|node| job.reopen(node));
        job
    }

    /// The job keeps every finished task's lineage, so that it survives
    /// the loss of a node (see [`JobState::on_node_lost`]), and ends only
    /// once the driver has read every output ([`JobState::on_read`]).
    pub(crate) fn with_lineage(mut self) -> Self {
        self.made = Some(HashMap::new());
        self
    }

    /// A node with `free` slots joins the job; returns its number.
    pub(crate) fn add_node(&mut self, free: Resources) -> usize {
        self.free.push(free);
        self.slots.push(free);
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
        self.draining.get(node).copied().unwrap_or(false)
            && !self.tasks.values().any(|t| {
                t.placed && t.node == node
                    || matches!(&t.input, TaskInput::Pieces(pieces) if pieces.iter().any(here))
            })
            && !self.stages.iter().any(|s| {
                s.queue.iter().flatten().any(here)
                    || s.blocked.iter().flatten().any(here)
                    || s.collected.iter().any(here)
            })
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

    /// The stage of a task that has not finished.
    pub(crate) fn stage_of(&self, task: TaskId) -> Option<usize> {
        self.tasks.get(&task).map(|r| r.stage)
    }

    /// The node task `task` runs (or is paused) on.
    pub(crate) fn node_of(&self, task: TaskId) -> Option<usize> {
        self.tasks.get(&task).filter(|r| r.placed).map(|r| r.node)
    }

    /// Task `task` stored its `seq`-th output.
    pub(crate) fn on_output(&mut self, task: TaskId, seq: u32, part: P) {
        let Some(record) = self.tasks.get_mut(&task) else {
            return;
        };
        let origin = Origin { task, seq };
        self.hand_over_due |= self.draining[part.node()];
        if seq < record.delivered {
            if record.again.remove(&seq) {
                let stage = record.stage;
                self.remade(stage, origin, part);
            }
            return;
        }
        record.delivered = seq.saturating_add(1);
        let (stage, node) = (record.stage, record.node);
        if self.stages[stage].cancelled {
            return;
        }
        let bytes = part.bytes();
        self.recorder
            .event_sized(stage, task, EventKind::PartitionYielded, node, bytes, None);
        let s = &mut self.stages[stage];
        s.typical_bytes = if s.typical_bytes == 0 {
            bytes
        } else {
            (s.typical_bytes * 7 + bytes) / 8
        };
        if bytes > s.largest_bytes {
            s.largest_bytes = bytes;
            self.actions.push(Action::FitReserve { stage, bytes });
        }
        self.recorder.output(stage, part.rows(), bytes);
        self.route(stage + 1, Piece::whole(origin, part));
    }

    /// Task `task` paused, holding an output of `pending_bytes`. False when
    /// its stage is no longer needed: the task is dropped.
    pub(crate) fn on_paused(
        &mut self,
        task: TaskId,
        pending_bytes: u64,
        store_full_at: Option<u64>,
    ) -> bool {
        let Some((stage, node)) = self.placed(task) else {
            return false;
        };
        self.release(node, stage);
        let cause = match store_full_at {
            Some(_) => PauseCause::StoreFull,
            None => PauseCause::OutputBudget,
        };
        self.recorder.event_sized(
            stage,
            task,
            EventKind::TaskSuspended,
            node,
            pending_bytes,
            Some(cause),
        );
        let rerun = self.tasks.get(&task).is_some_and(|r| r.rerun);
        let s = &mut self.stages[stage];
        if (s.cancelled && !rerun) || self.ended {
            self.drop_task(task);
            return false;
        }
        s.paused.push(Paused {
            task,
            node,
            pending_bytes,
            store_full_at,
        });
        true
    }

    /// Task `task` finished. Returns its stage, whose counts the caller
    /// records with [`JobState::record_finished`].
    pub(crate) fn on_finished(&mut self, task: TaskId) -> Option<usize> {
        let (stage, node) = self.placed(task)?;
        let mut record = self.tasks.remove(&task).expect("placed above");
        self.release(node, stage);
        self.recorder
            .event(stage, task, EventKind::TaskFinished, node);
        if !record.again.is_empty() && self.stages[stage].cancelled {
            // It stopped early with its stage, before the outputs it was
            // to make again: a re-run makes them.
            self.forget_task(task, record);
            return Some(stage);
        }
        if !record.again.is_empty() {
            let operator = self.shapes[stage].name.clone();
            self.end(Err(Error::PartitionLost {
                operator,
                why:
                    "running its task again made fewer outputs (is an operator not deterministic?)"
                        .into(),
            }));
            return Some(stage);
        }
        record.delivered = u32::MAX;
        if !record.again_next.is_empty() {
            // Asked for while this attempt ran past them: once more.
            record.placed = false;
            self.tasks.insert(task, record);
            self.requeue(task);
        } else if let Some(made) = &mut self.made {
            let input = record.input.forget();
            let reruns = record.reruns;
            made.insert(
                task,
                Made {
                    stage,
                    input,
                    reruns,
                },
            );
        }
        Some(stage)
    }

    /// Records the counts of a finished task's stage.
    pub(crate) fn record_finished(&self, stage: usize, busy: Duration, ops: Vec<OpStats>) {
        self.recorder.task_finished(stage, busy, ops);
    }

    /// Task `task`'s worker died (`message`): the task is retried, or the
    /// job fails once it has been tried `max_task_retries + 1` times.
    pub(crate) fn on_lost(&mut self, task: TaskId, message: String) {
        let Some(record) = self.tasks.get(&task).filter(|r| r.placed) else {
            return;
        };
        if record.attempts < self.failures.max_task_retries {
            return self.retry(task, message);
        }
        let (stage, node, attempts) = (record.stage, record.node, record.attempts + 1);
        self.release(node, stage);
        let operator = self.shapes[stage].name.clone();
        self.end(Err(Error::Panicked {
            operator,
            attempts,
            message,
        }));
    }

    /// Task `task` failed with `error`, an operator's own (`user_error`) or
    /// a system failure. A system failure is retried up to
    /// `max_task_retries`, and so is an operator's error when
    /// `retry_user_errors`; an operator's error that is not (or no longer)
    /// retried skips the task while `max_errored_partitions` allows, listing
    /// it in the stats. Otherwise the job fails with `error`.
    pub(crate) fn on_errored(&mut self, task: TaskId, error: Error, user_error: bool) {
        let Some(record) = self.tasks.get(&task).filter(|r| r.placed) else {
            return;
        };
        let retried = !user_error || self.failures.retry_user_errors;
        if retried && record.attempts < self.failures.max_task_retries {
            return self.retry(task, error.to_string());
        }
        if user_error && self.skipped < self.failures.max_errored_partitions {
            self.skipped += 1;
            let record = self.tasks.remove(&task).expect("looked up above");
            self.release(record.node, record.stage);
            self.recorder
                .event(record.stage, task, EventKind::TaskSkipped, record.node);
            self.recorder.errored(streambatch_plan::ErroredTask {
                stage: self.shapes[record.stage].name.clone(),
                task,
                input: record.input.describe(),
                message: error.to_string(),
            });
            tracing::warn!(%task, %error, "task skipped (max_errored_partitions)");
            return;
        }
        self.end(Err(error));
    }

    /// Node `node` (named `name`) is gone, with the tasks placed there and
    /// the partitions it held. Those tasks run again elsewhere; the lost
    /// partitions the job still needs are made again by running the tasks
    /// that made them (their inputs too, down to the source, as far as
    /// those were freed); the rest of the job goes on meanwhile. Without
    /// lineage (a job on the embedded node) the job fails.
    pub(crate) fn on_node_lost(&mut self, node: usize, name: &str) {
        if self.ended || self.lost.get(node).copied().unwrap_or(true) {
            return;
        }
        let clean = self.left_cleanly(node);
        self.lost[node] = true;
        self.draining[node] = true;
        self.reopen(node);
        self.moving.retain(|_, from| *from != node);
        if clean {
            tracing::info!(node = %name, "a drained node left");
            return;
        }
        if self.made.is_none() {
            return self.fail(Error::NodeLost { node: name.into() });
        }
        tracing::warn!(node = %name, "node lost; making its partitions again");
        self.recorder.node_lost(name);
        let mut needed = BTreeSet::new();
        for s in &mut self.stages {
            for mut entry in std::mem::take(&mut s.queue) {
                entry.iter_mut().for_each(|p| {
                    p.lose(node);
                });
                if all_held(&entry) {
                    s.queue.push_back(entry);
                } else {
                    s.blocked.push(entry);
                }
            }
            for piece in s.blocked.iter_mut().flatten().chain(&mut s.collected) {
                piece.lose(node);
            }
            needed.extend(s.blocked.iter().flat_map(|e| missing(e)));
            needed.extend(missing(&s.collected));
        }
        for record in self.tasks.values_mut() {
            // A task placed elsewhere may have read its input already: its
            // lost pieces are made again only should it run again.
            record.input.lose(node);
        }
        let mut there: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, r)| r.placed && r.node == node)
            .map(|(t, _)| *t)
            .collect();
        there.sort_unstable(); // the same order in every replay
        for task in there {
            let stage = self.tasks[&task].stage;
            let paused = &mut self.stages[stage].paused;
            match paused.iter().position(|p| p.task == task) {
                Some(at) => {
                    paused.remove(at);
                }
                None => self.release(node, stage),
            }
            let record = self.tasks.get_mut(&task).expect("listed above");
            record.attempts += 1;
            let attempts = record.attempts;
            if attempts > self.failures.max_task_retries {
                let operator = self.shapes[stage].name.clone();
                return self.fail(Error::PartitionLost {
                    operator,
                    why: format!("its task was tried {attempts} times"),
                });
            }
            self.recorder.retry(stage);
            self.recorder
                .event(stage, task, EventKind::TaskRetried, node);
            self.requeue(task);
        }
        self.sort_waiting_tasks();
        for s in &self.stages {
            for task in &s.blocked_tasks {
                needed.extend(self.tasks[task].input.missing());
            }
        }
        for origin in needed {
            self.demand(origin, true);
        }
        if self.stranded().is_some() {
            self.fail(Error::NodeLost { node: name.into() });
        }
    }

    /// The driver tried to read the rows `id` names: `read` says whether it
    /// could. Rows it could not read (their node is gone) are made again
    /// and handed to it anew.
    pub(crate) fn on_read(&mut self, id: PieceId, read: bool) {
        if self.made.is_none() {
            return;
        }
        self.unread = self.unread.saturating_sub(1);
        if !read && !self.ended {
            self.reemit.push(Piece::lost(id));
            self.demand(id.from, true);
            if let Some(operator) = self.stranded() {
                self.fail(Error::PartitionLost {
                    operator,
                    why: "no node left can run its task".into(),
                });
            }
        }
    }

    /// Output `origin`, asked to move off a draining node, is now held as
    /// `whole` on another: every piece of it the job holds there and has
    /// not handed to a task takes its rows from `whole` instead, so that
    /// the draining node is asked for it no more.
    pub(crate) fn on_moved(&mut self, origin: Origin, whole: P) {
        let Some(from) = self.moving.remove(&origin) else {
            return;
        };
        let mut moved = |piece: &mut Piece<P>| {
            if piece.id.from == origin && piece.part.as_ref().is_some_and(|p| p.node() == from) {
                piece.part = Some(whole.sub(piece.id.offset, piece.id.len));
            }
        };
        self.for_each_unplaced_piece(&mut moved);
    }

    /// Asks for the outputs held on draining nodes that the job still needs
    /// to be moved to nodes that stay (spread over them in turn), each once.
    fn hand_over(&mut self) {
        if !std::mem::take(&mut self.hand_over_due) {
            return;
        }
        let draining: Vec<bool> = (0..self.free.len())
            .map(|n| self.draining[n] && !self.lost[n])
            .collect();
        if !draining.contains(&true) {
            return;
        }
        let stays: Vec<usize> = (0..self.free.len())
            .filter(|&n| !self.draining[n] && !self.lost[n])
            .collect();
        if stays.is_empty() {
            return;
        }
        let mut asked = Vec::new();
        let moving = std::mem::take(&mut self.moving);
        self.for_each_unplaced_piece(&mut |piece: &mut Piece<P>| {
            if let Some(part) = &piece.part {
                let from = part.node();
                if draining[from] && !moving.contains_key(&piece.id.from) {
                    asked.push((piece.id.from, from, part.clone()));
                }
            }
        });
        self.moving = moving;
        for (origin, from, part) in asked {
            if self.moving.contains_key(&origin) {
                continue; // another piece of the same output
            }
            let Some(stage) = self.stage_of(origin.task).or_else(|| {
                self.made
                    .as_ref()
                    .and_then(|m| m.get(&origin.task))
                    .map(|m| m.stage)
            }) else {
                continue;
            };
            let to = stays[self.moving.len() % stays.len()];
            self.moving.insert(origin, from);
            self.actions.push(Action::Move {
                origin,
                stage,
                part,
                to,
            });
        }
    }

    /// Calls `f` on every piece the job holds that no task has been handed:
    /// queued, waiting for a lost piece, collected by a repartition, or the
    /// input of a task waiting to run (again).
    fn for_each_unplaced_piece(&mut self, f: &mut impl FnMut(&mut Piece<P>)) {
        for s in &mut self.stages {
            s.queue.iter_mut().flatten().for_each(&mut *f);
            s.blocked.iter_mut().flatten().for_each(&mut *f);
            s.collected.iter_mut().for_each(&mut *f);
        }
        for record in self.tasks.values_mut().filter(|r| !r.placed) {
            if let TaskInput::Pieces(pieces) = &mut record.input {
                pieces.iter_mut().for_each(&mut *f);
            }
        }
    }

    /// Lets go of `task`'s slot and queues it again (`message` says why).
    fn retry(&mut self, task: TaskId, message: String) {
        let record = self.tasks.get_mut(&task).expect("the caller found it");
        record.attempts += 1;
        let (stage, node, attempts) = (record.stage, record.node, record.attempts);
        self.release(node, stage);
        tracing::warn!(%task, attempts, %message, "task failed; retrying");
        self.recorder.retry(stage);
        self.recorder
            .event(stage, task, EventKind::TaskRetried, node);
        self.requeue(task);
    }

    /// Queues a task that is not placed to run (again): to start once its
    /// input is whole (its lost pieces are asked for), or dropped when its
    /// stage is no longer needed.
    fn requeue(&mut self, task: TaskId) {
        self.hand_over_due = true;
        let record = self.tasks.get_mut(&task).expect("the caller found it");
        record.placed = false;
        let next = std::mem::take(&mut record.again_next);
        record.again.extend(next);
        let stage = record.stage;
        let missing = record.input.missing();
        let lost = !record.rerun;
        let s = &mut self.stages[stage];
        if s.cancelled && lost {
            // Not a re-run: no more of its outputs are needed.
            self.drop_task(task);
        } else if missing.is_empty() {
            s.retry.push_back(task);
        } else {
            s.blocked_tasks.push(task);
            for origin in missing {
                self.demand(origin, lost);
            }
        }
    }

    /// Output `origin` is needed and gone: its task is asked to make it
    /// again, run again first when it had finished (its own inputs asked
    /// for in turn). `lost` when it was lost with its node, not freed after
    /// use: only those re-runs count against `max_task_retries` (one loss
    /// may re-run a source task once for each of its readers).
    fn demand(&mut self, origin: Origin, lost: bool) {
        if self.ended {
            return;
        }
        if let Some(record) = self.tasks.get_mut(&origin.task) {
            let asked = if !record.placed {
                record.again.insert(origin.seq)
            } else if !record.again.contains(&origin.seq) {
                // This attempt is past it, or not asked to make it.
                record.again_next.insert(origin.seq)
            } else {
                false
            };
            if asked && lost {
                self.recorder.lost_partitions(1);
            }
            return;
        }
        let Some(made) = self.made.as_mut().and_then(|m| m.remove(&origin.task)) else {
            return self.fail(Error::PartitionLost {
                operator: "(unknown)".into(),
                why: format!("task {} that made it is not known", origin.task),
            });
        };
        if lost && made.reruns >= self.failures.max_task_retries.max(1) {
            return self.fail(Error::PartitionLost {
                operator: self.shapes[made.stage].name.clone(),
                why: format!("its task was already run again {} times", made.reruns),
            });
        }
        self.tasks.insert(
            origin.task,
            TaskRecord {
                stage: made.stage,
                node: 0,
                input: made.input,
                attempts: 0,
                delivered: u32::MAX,
                again: BTreeSet::from([origin.seq]),
                again_next: BTreeSet::new(),
                placed: false,
                rerun: true,
                reruns: made.reruns + u32::from(lost),
            },
        );
        self.recorder.rerun(made.stage);
        if lost {
            self.recorder.lost_partitions(1);
        }
        self.requeue(origin.task);
    }

    /// Output `origin` of a task of `stage` was made again: every piece
    /// waiting for it is filled, and what waited on them goes on.
    fn remade(&mut self, stage: usize, origin: Origin, whole: P) {
        self.recorder.remade(stage);
        for s in &mut self.stages {
            for entry in &mut s.blocked {
                entry.iter_mut().for_each(|p| {
                    p.fill(origin, &whole);
                });
            }
            for entry in std::mem::take(&mut s.blocked) {
                if all_held(&entry) {
                    s.queue.push_front(entry);
                } else {
                    s.blocked.push(entry);
                }
            }
            for piece in &mut s.collected {
                piece.fill(origin, &whole);
            }
        }
        for record in self.tasks.values_mut() {
            record.input.fill(origin, &whole);
        }
        self.sort_waiting_tasks();
        for mut piece in std::mem::take(&mut self.reemit) {
            if piece.fill(origin, &whole) {
                self.emit(piece);
            } else {
                self.reemit.push(piece);
            }
        }
    }

    /// Sorts each stage's tasks waiting to run again by their input: whole
    /// ones to the retry queue, in order, those missing a piece aside.
    fn sort_waiting_tasks(&mut self) {
        for s in &mut self.stages {
            let waiting: Vec<TaskId> = s.retry.drain(..).chain(s.blocked_tasks.drain(..)).collect();
            for task in waiting {
                if self.tasks[&task].input.missing().is_empty() {
                    s.retry.push_back(task);
                } else {
                    s.blocked_tasks.push(task);
                }
            }
        }
    }

    /// A stage with work left whose task fits no node that takes tasks.
    fn stranded(&self) -> Option<String> {
        let takes = |need: &Resources| {
            (0..self.slots.len()).any(|n| !self.draining[n] && need.fits_in(&self.slots[n]))
        };
        self.shapes
            .iter()
            .zip(&self.stages)
            .find(|(shape, s)| {
                shape.kind.runs_tasks() && !(s.done && s.idle()) && !takes(&shape.resources)
            })
            .map(|(shape, _)| shape.name.clone())
    }

    fn running_anywhere(&self) -> usize {
        self.stages.iter().map(|s| s.running).sum()
    }

    /// What the job holds, for a simulation that finds it stuck.
    pub(crate) fn describe(&self) -> String {
        let mut out = String::new();
        for (i, s) in self.stages.iter().enumerate() {
            out += &format!(
                "stage {i}: done {} cancelled {} queue {} blocked {:?} retry {:?} blocked_tasks {:?} paused {} running {} collected {} (missing {:?})\n",
                s.done,
                s.cancelled,
                s.queue.len(),
                s.blocked
                    .iter()
                    .map(|e| missing(e).collect::<Vec<_>>())
                    .collect::<Vec<_>>(),
                s.retry,
                s.blocked_tasks,
                s.paused.len(),
                s.running,
                s.collected.len(),
                missing(&s.collected).collect::<Vec<_>>(),
            );
        }
        let mut tasks: Vec<_> = self.tasks.iter().collect();
        tasks.sort_by_key(|(t, _)| **t);
        for (t, r) in tasks {
            out += &format!(
                "task {t}: stage {} node {} placed {} delivered {} again {:?} next {:?} missing {:?}\n",
                r.stage,
                r.node,
                r.placed,
                r.delivered,
                r.again,
                r.again_next,
                r.input.missing()
            );
        }
        out += &format!(
            "reemit {:?} unread {} draining {:?} lost {:?} free {:?}",
            self.reemit.iter().map(|p| p.id).collect::<Vec<_>>(),
            self.unread,
            self.draining,
            self.lost,
            self.free.iter().map(|f| f.cpus).collect::<Vec<_>>()
        );
        out
    }

    /// The job fails with `error`.
    pub(crate) fn fail(&mut self, error: Error) {
        self.end(Err(error));
    }

    /// The driver no longer wants outputs: the job ends without error.
    pub(crate) fn cancel(&mut self) {
        self.end(Ok(()));
    }

    /// Decides what runs next: starts and resumes what the policy allows,
    /// settles finished stages, lets one task spill when nothing else can
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
            }
        }
        std::mem::take(&mut self.actions)
    }

    /// Tells the recorder what each stage waits for, having decided.
    fn report_stages(&mut self, memory: &impl Memory) {
        let now: Vec<StageNow> = (0..self.stages.len())
            .map(|i| {
                let (s, shape) = (&self.stages[i], &self.shapes[i]);
                let runs_tasks = shape.kind.runs_tasks();
                let queued = if runs_tasks { s.startable() } else { 0 };
                let waiting = if s.done || !runs_tasks {
                    None
                } else if let Some(p) = s.paused.first() {
                    Some(match p.store_full_at {
                        Some(_) => Wait::StoreFull,
                        None => Wait::OutputBudget,
                    })
                } else if queued > 0 {
                    let pool_full = shape.max_running.is_some_and(|max| s.running >= max);
                    if pool_full || self.fitting[i] == 0 {
                        Some(Wait::NoSlot)
                    } else {
                        // A slot is free: the policy held the input back
                        // for its memory budget.
                        Some(Wait::OutputBudget)
                    }
                } else if s.running == 0 {
                    Some(Wait::Input)
                } else {
                    None
                };
                StageNow {
                    queued,
                    held_bytes: memory.held(i),
                    waiting,
                }
            })
            .collect();
        self.recorder.stages_now(&now);
    }

    /// Asks the policy for one decision per node per pass, so that tasks
    /// spread over the nodes (a stage capped by its pool too), until a pass
    /// decides nothing. The first pass asks the open nodes, from a node
    /// that moves on each pass; later ones only the nodes that decided in
    /// the pass before, since a decision never makes room on another node.
    fn decide(&mut self, memory: &impl Memory) {
        let first = self.next_node;
        let mut decided = Vec::new();
        let (mut from, mut wrapped) = (first, false);
        while self.has_work() {
            let next = if wrapped {
                self.open.range(from..first).next()
            } else {
                self.open.range(from..).next()
            };
            match next.copied() {
                Some(node) => {
                    from = node + 1;
                    if self.decide_on(memory, node) {
                        decided.push(node);
                    }
                }
                None if !wrapped => (from, wrapped) = (0, true),
                None => break,
            }
        }
        while !decided.is_empty() {
            self.next_node = (self.next_node + 1) % self.free.len();
            decided.rotate_left(1);
            let asked = std::mem::take(&mut decided);
            for node in asked {
                if !self.has_work() {
                    break;
                }
                if self.decide_on(memory, node) {
                    decided.push(node);
                }
            }
        }
        self.next_node = (self.next_node + 1) % self.free.len();
    }

    /// Carries out the policy's decision for `node`, if any; true if there
    /// was one.
    fn decide_on(&mut self, memory: &impl Memory, node: usize) -> bool {
        let paused_here = || {
            self.stages
                .iter()
                .flat_map(|s| &s.paused)
                .any(|p| p.node == node)
        };
        if self.draining[node] && !paused_here() {
            return false;
        }
        let snapshot = self.snapshot(memory, node);
        match policy::next_decision(&snapshot) {
            Some(decision) => {
                if tracing::enabled!(target: "streambatch::schedule", tracing::Level::DEBUG) {
                    self.log_decision(&snapshot, decision, node);
                }
                self.carry_out(decision, node, false);
                true
            }
            None => false,
        }
    }

    /// Logs a decision with its reason (`RUST_LOG=streambatch=debug`).
    fn log_decision(&self, snapshot: &Snapshot, decision: Decision, node: usize) {
        let (what, stage) = match decision {
            Decision::Resume { stage, .. } => ("resume a task", stage),
            Decision::Dispatch { stage } => ("start a task", stage),
        };
        tracing::debug!(
            target: "streambatch::schedule",
            stage = %self.shapes[stage].name,
            node,
            reason = %policy::reason(snapshot, decision),
            "{what}"
        );
    }

    /// Some stage has an input to start a task on, or a paused task.
    fn has_work(&self) -> bool {
        self.stages.iter().zip(&self.shapes).any(|(s, shape)| {
            !s.paused.is_empty() || (shape.kind.runs_tasks() && s.startable() > 0)
        })
    }

    /// Keeps `open`, `fits_here` and `fitting` up to date after `node`'s
    /// free slots changed.
    fn reopen(&mut self, node: usize) {
        let free = self.free[node];
        let mut fits = false;
        for (stage, shape) in self.shapes.iter().enumerate() {
            let here =
                !self.lost[node] && shape.kind.runs_tasks() && shape.resources.fits_in(&free);
            let was = std::mem::replace(&mut self.fits_here[node][stage], here);
            match (was, here) {
                (false, true) => self.fitting[stage] += 1,
                (true, false) => self.fitting[stage] -= 1,
                _ => {}
            }
            fits |= here;
        }
        if fits {
            self.open.insert(node);
        } else {
            self.open.remove(&node);
        }
    }

    /// Every stage is done and idle, and the driver has every output.
    fn finished(&self) -> bool {
        self.stages.iter().all(|s| s.done && s.idle()) && self.reemit.is_empty() && self.unread == 0
    }

    /// What the policy sees of node `node`: its free slots, the tasks
    /// paused there, and its memory.
    fn snapshot(&self, memory: &impl Memory, node: usize) -> Snapshot {
        let holding = self.holding(node);
        // Holds `fits` does not count yet: tasks started and not opened, or
        // all of them where the budgets are a remote node's shadow. (Asked
        // only when there are holds: it takes the budgets' lock.)
        let unseen = match holding.all {
            0 => 0,
            all => all.saturating_sub(memory.outside(node)),
        };
        let stages = self
            .stages
            .iter()
            .zip(&self.shapes)
            .enumerate()
            .map(|(i, (s, shape))| {
                let runs = shape.kind.runs_tasks() && !self.draining[node];
                let here = || s.paused.iter().filter(|p| p.node == node);
                let paused_fits = here()
                    .map(|p| {
                        let freed_since = p.store_full_at.is_none_or(|at| memory.frees(node) > at);
                        freed_since && memory.fits(node, i, p.pending_bytes + unseen)
                    })
                    .collect();
                StageView {
                    waiting_inputs: if runs { s.startable() } else { 0 },
                    paused_fits,
                    paused: here().map(|p| p.pending_bytes).collect(),
                    running: s.running,
                    resources: shape.resources,
                    max_running: shape.max_running,
                    budget_fits_typical: memory.fits(node, i, s.typical_bytes + unseen)
                        && hold_fits(
                            next_held_bytes(s, shape, &self.tasks),
                            holding,
                            memory.capacity(node),
                        ),
                }
            })
            .collect();
        Snapshot {
            stages,
            free: self.free[node],
        }
    }

    /// Bytes the tasks placed on `node` (running or paused) hold outside
    /// the store ([`StageShape::held_bytes`]); 0 without a source that
    /// holds any, which costs nothing to find.
    fn holding(&self, node: usize) -> Holding {
        let mut holding = Holding::default();
        if self.shapes.iter().all(|s| s.held_bytes.is_empty()) {
            return holding;
        }
        for r in self.tasks.values().filter(|r| r.placed && r.node == node) {
            if let TaskInput::Split(i) = r.input {
                let held = self.shapes[r.stage].held_bytes.get(i).copied();
                let held = held.unwrap_or_default();
                holding.all += held;
                holding.largest = holding.largest.max(held);
            }
        }
        holding
    }

    /// Starts or resumes a task on `node` as decided (a decision's paused
    /// index counts the tasks paused on that node).
    fn carry_out(&mut self, decision: Decision, node: usize, may_spill: bool) {
        let (stage, task, kind) = match decision {
            Decision::Resume { stage, index } => {
                let paused = &mut self.stages[stage].paused;
                let at = paused
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.node == node)
                    .nth(index)
                    .map(|(at, _)| at)
                    .expect("the policy resumes a task paused on this node");
                let task = paused.remove(at).task;
                self.actions.push(Action::Resume {
                    task,
                    node,
                    may_spill,
                });
                (stage, task, EventKind::TaskResumed)
            }
            Decision::Dispatch { stage } => {
                let task = self.start(stage, node, may_spill);
                (stage, task, EventKind::TaskStarted)
            }
        };
        let resources = self.shapes[stage].resources;
        self.free[node].cpus -= resources.cpus;
        self.free[node].gpus -= resources.gpus;
        self.reopen(node);
        let s = &mut self.stages[stage];
        s.running += 1;
        let running = s.running;
        self.recorder.task_started(stage, running);
        self.recorder.event(stage, task, kind, node);
    }

    /// A new task of `stage` on `node`: a retry first, else the next split,
    /// else the first input held on that node, else the oldest input.
    fn start(&mut self, stage: usize, node: usize, may_spill: bool) -> TaskId {
        let s = &mut self.stages[stage];
        if let Some(task) = s.retry.pop_front() {
            let record = self
                .tasks
                .get_mut(&task)
                .expect("a retried task has a record");
            record.node = node;
            record.placed = true;
            self.actions.push(Action::Start {
                task,
                stage,
                node,
                input: held_input(&record.input),
                keep: Keep::of(record.delivered, &record.again),
                may_spill,
            });
            return task;
        }
        let input = if s.next_split < s.splits {
            s.next_split += 1;
            TaskInput::Split(s.next_split - 1)
        } else {
            let on_node = |p: &Piece<P>| p.part.as_ref().is_some_and(|p| p.node() == node);
            // Only the oldest inputs are searched, so that a long queue
            // costs no more per start than a short one.
            let local = s
                .queue
                .iter()
                .take(LOCAL_SEARCH)
                .position(|pieces| pieces.first().is_some_and(on_node))
                .unwrap_or(0);
            TaskInput::Pieces(
                s.queue
                    .remove(local)
                    .expect("the policy dispatches only stages with input"),
            )
        };
        let task = TaskId(self.next_task);
        self.next_task += 1;
        self.actions.push(Action::Start {
            task,
            stage,
            node,
            input: held_input(&input),
            keep: Keep::all(),
            may_spill,
        });
        self.tasks.insert(
            task,
            TaskRecord {
                stage,
                node,
                input,
                attempts: 0,
                delivered: 0,
                again: BTreeSet::new(),
                again_next: BTreeSet::new(),
                placed: true,
                rerun: false,
                reruns: 0,
            },
        );
        task
    }

    /// The stage and node of a task placed on a node.
    fn placed(&self, task: TaskId) -> Option<(usize, usize)> {
        self.tasks
            .get(&task)
            .filter(|r| r.placed)
            .map(|r| (r.stage, r.node))
    }

    /// A task of `stage` gave its slot on `node` back.
    fn release(&mut self, node: usize, stage: usize) {
        let resources = self.shapes[stage].resources;
        self.free[node].cpus += resources.cpus;
        self.free[node].gpus += resources.gpus;
        self.reopen(node);
        self.stages[stage].running -= 1;
        self.recorder
            .task_stopped(stage, self.stages[stage].running);
    }

    /// Nothing runs and the last stage holds nothing the driver has not
    /// taken, yet work remains: memory is full of partitions that only more
    /// input could consume (a repartition larger than the store). Runs one
    /// task that may spill. True when it did.
    fn force_if_stuck(&mut self, memory: &impl Memory) -> bool {
        let last = self
            .shapes
            .iter()
            .rposition(|s| s.kind.runs_tasks())
            .unwrap_or(0);
        if self.running_anywhere() > 0 || memory.held(last) > 0 || self.finished() {
            return false;
        }
        for node in 0..self.free.len() {
            if let Some(decision) = policy::forced_decision(&self.snapshot(memory, node)) {
                tracing::debug!(
                    target: "streambatch::schedule",
                    ?decision,
                    node,
                    reason = "memory is full and nothing can run",
                    "let a task spill"
                );
                self.carry_out(decision, node, true);
                return true;
            }
        }
        false
    }

    /// Hands rows to the driver (counted until it says it read them, when
    /// the job keeps lineage).
    fn emit(&mut self, piece: Piece<P>) {
        let part = piece.part.expect("only held rows are handed out");
        if self.made.is_some() {
            self.unread += 1;
        }
        self.actions.push(Action::Emit { part, id: piece.id });
    }

    /// Hands an output of stage `to - 1` to stage `to` (or the driver).
    fn route(&mut self, to: usize, piece: Piece<P>) {
        if to == self.stages.len() {
            return self.emit(piece);
        }
        match self.shapes[to].kind {
            ShapeKind::Limit(_) => {
                let s = &mut self.stages[to];
                let take = piece.id.len.min(s.limit_left);
                if take == 0 {
                    return;
                }
                s.limit_left -= take;
                self.recorder.output(to, take, 0);
                self.route(to + 1, piece.sub(0, take));
                self.check_limits();
            }
            ShapeKind::Repartition(_) => self.stages[to].collected.push(piece),
            ShapeKind::Source { .. } | ShapeKind::Map => {
                self.stages[to].queue.push_back(vec![piece])
            }
        }
    }

    /// A limit that has all its rows ends every stage before it.
    fn check_limits(&mut self) {
        let Some(limit) = (0..self.stages.len()).rev().find(|&i| {
            matches!(self.shapes[i].kind, ShapeKind::Limit(_)) && self.stages[i].limit_left == 0
        }) else {
            return;
        };
        for stage in 0..=limit {
            let s = &mut self.stages[stage];
            if !s.cancelled {
                self.actions.push(Action::Cancel { stage });
            }
            s.cancelled = true;
            s.done = true;
            s.queue.clear();
            s.blocked.clear();
            s.collected.clear();
            s.next_split = s.splits;
            // Re-runs go on: a later stage waits for what they make again.
            // The other tasks not running are dropped (paused ones too: the
            // nodes drop them on `Cancel`).
            let tasks = &mut self.tasks;
            let rerun = |task: &TaskId| tasks.get(task).is_some_and(|r| r.rerun);
            let paused = std::mem::take(&mut s.paused);
            let (paused, dropped): (Vec<Paused>, Vec<Paused>) =
                paused.into_iter().partition(|p| rerun(&p.task));
            s.paused = paused;
            let (retry, dropped_retry): (Vec<TaskId>, Vec<TaskId>) =
                s.retry.drain(..).partition(rerun);
            s.retry = retry.into();
            let (blocked, dropped_blocked): (Vec<TaskId>, Vec<TaskId>) =
                s.blocked_tasks.drain(..).partition(rerun);
            s.blocked_tasks = blocked;
            let dropped: Vec<TaskId> = dropped
                .into_iter()
                .map(|p| p.task)
                .chain(dropped_retry)
                .chain(dropped_blocked)
                .collect();
            for task in dropped {
                self.drop_task(task);
            }
        }
    }

    /// Drops a task its cancelled stage no longer needs, keeping its
    /// lineage when it delivered outputs: a later stage may still need one
    /// of them made again, and those it was asked to make again are asked
    /// of a re-run.
    fn drop_task(&mut self, task: TaskId) {
        if let Some(record) = self.tasks.remove(&task) {
            self.forget_task(task, record);
        }
    }

    /// [`JobState::drop_task`] for a record already taken out.
    fn forget_task(&mut self, task: TaskId, record: TaskRecord<P>) {
        if let Some(made) = self.made.as_mut().filter(|_| record.delivered > 0) {
            let made_task = Made {
                stage: record.stage,
                input: record.input.forget(),
                reruns: record.reruns,
            };
            made.insert(task, made_task);
        }
        for seq in record.again.into_iter().chain(record.again_next) {
            self.demand(Origin { task, seq }, false);
        }
    }

    /// Marks stages whose input is complete and whose tasks are all done;
    /// a finished repartition hands its groups on. True when something changed.
    fn settle(&mut self) -> bool {
        let mut changed = false;
        for i in 0..self.stages.len() {
            if self.stages[i].done {
                continue;
            }
            if i > 0 && !self.stages[i - 1].done {
                break;
            }
            let s = &self.stages[i];
            match self.shapes[i].kind {
                ShapeKind::Repartition(n) => {
                    if !all_held(&s.collected) {
                        break;
                    }
                    let groups = regroup(std::mem::take(&mut self.stages[i].collected), n);
                    let next = i + 1;
                    let runs_tasks = next < self.stages.len()
                        && matches!(
                            self.shapes[next].kind,
                            ShapeKind::Source { .. } | ShapeKind::Map
                        );
                    if runs_tasks {
                        self.stages[next].queue.extend(groups);
                    } else {
                        // A limit (or the driver) takes rows, not task inputs.
                        for piece in groups.into_iter().flatten() {
                            self.route(next, piece);
                        }
                    }
                }
                ShapeKind::Limit(_) => {}
                _ if !s.idle() => break,
                _ => {}
            }
            self.stages[i].done = true;
            changed = true;
        }
        changed
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
        }
        self.reemit.clear();
        self.actions.push(Action::End(result));
    }
}

/// The parts of an input whose pieces are all held.
fn held_input<P: Part>(input: &TaskInput<P>) -> Input<P> {
    match input {
        TaskInput::Split(i) => Input::Split(*i),
        TaskInput::Pieces(pieces) => Input::Parts(
            pieces
                .iter()
                .map(|p| p.part.clone().expect("a task starts on held input"))
                .collect(),
        ),
    }
}

/// Cuts the rows of `pieces` into `n` groups of (nearly) equal rows, in order.
fn regroup<P: Part>(pieces: Vec<Piece<P>>, n: usize) -> Vec<Vec<Piece<P>>> {
    let total: usize = pieces.iter().map(|p| p.id.len).sum();
    let mut groups: Vec<Vec<Piece<P>>> = (0..n).map(|_| Vec::new()).collect();
    let (mut group, mut filled) = (0, 0);
    let want = |g: usize| (g + 1) * total / n - g * total / n;
    for piece in pieces {
        let rows = piece.id.len;
        let mut offset = 0;
        while offset < rows {
            while group < n - 1 && filled == want(group) {
                group += 1;
                filled = 0;
            }
            let room = if group == n - 1 {
                usize::MAX
            } else {
                want(group) - filled
            };
            let take = (rows - offset).min(room);
            groups[group].push(piece.sub(offset, take));
            offset += take;
            filled += take;
        }
    }
    groups.retain(|g| !g.is_empty());
    groups
}

/// What the next task `start` gives `stage` holds outside the store while
/// it runs: its split's held bytes, for a retry (which goes first) as for
/// a new split.
fn next_held_bytes<P>(
    stage: &StageState<P>,
    shape: &StageShape,
    tasks: &HashMap<TaskId, TaskRecord<P>>,
) -> u64 {
    let split = match stage.retry.front() {
        Some(task) => match tasks.get(task).map(|r| &r.input) {
            Some(TaskInput::Split(i)) => *i,
            _ => return 0,
        },
        None => stage.next_split,
    };
    shape.held_bytes.get(split).copied().unwrap_or(0)
}

/// Whether a task holding `next` bytes outside the store may start on a
/// node whose tasks hold `holding` (in all, and the largest) and whose
/// store holds `capacity`: one task may hold any amount, the others
/// together at most half the capacity. So two large files are never held
/// at once, small ones are read beside a large one, and outputs keep room
/// (the budgets give them what the holds leave).
fn hold_fits(next: u64, holding: Holding, capacity: u64) -> bool {
    let all = holding.all + next;
    next == 0 || all - holding.largest.max(next) <= capacity / 2
}

/// Bytes tasks placed on a node hold outside the store.
#[derive(Clone, Copy, Default)]
struct Holding {
    all: u64,
    largest: u64,
}
