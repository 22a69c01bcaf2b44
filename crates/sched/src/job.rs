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

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use streambatch_core::{Resources, TaskId};
use streambatch_plan::{Error, EventKind, OpStats, Stage, StageKind};

use crate::policy::{self, Decision, Snapshot, StageView};
use crate::record::Recorder;

/// Rows of a stored partition, as the job state sees them.
pub(crate) trait Part: Clone {
    /// Rows in this part.
    fn rows(&self) -> usize;
    /// Bytes of the whole partition behind it.
    fn bytes(&self) -> u64;
    /// Rows `offset..offset + len` of this part.
    fn sub(&self, offset: usize, len: usize) -> Self;
    /// The node that holds it.
    fn node(&self) -> usize;
}

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
    /// Start `task` of `stage` over `input`; its first `skip` outputs were
    /// delivered by an earlier attempt. With `may_spill`, its outputs may go
    /// over budget and the store spills to make room.
    Start {
        task: TaskId,
        stage: usize,
        node: usize,
        input: Input<P>,
        skip: u32,
        may_spill: bool,
    },
    /// Resume the paused `task` on `node`, where it paused.
    Resume {
        task: TaskId,
        node: usize,
        may_spill: bool,
    },
    /// Hand an output of the last stage to the driver.
    Emit(P),
    /// `stage`'s remaining work is not needed: its tasks stop early and its
    /// paused tasks are dropped.
    Cancel { stage: usize },
    /// `stage`'s memory reserve fits its largest output so far.
    FitReserve { stage: usize, bytes: u64 },
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
        Self {
            name: stage.name.clone(),
            kind,
            resources: stage.options.resources,
            max_running: stage.options.pool.map(|p| p.max),
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
    queue: VecDeque<Vec<P>>,
    retry: VecDeque<TaskId>,
    paused: Vec<Paused>,
    next_split: usize,
    splits: usize,
    running: usize,
    done: bool,
    cancelled: bool,
    limit_left: usize,
    collected: Vec<P>,
    typical_bytes: u64,
    /// The largest output partition so far: the stage's memory reserve.
    largest_bytes: u64,
}

impl<P> StageState<P> {
    fn new(kind: ShapeKind) -> Self {
        Self {
            queue: VecDeque::new(),
            retry: VecDeque::new(),
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

    fn waiting(&self) -> usize {
        self.queue.len() + self.retry.len() + (self.splits - self.next_split)
    }
}

/// A task from its start to its end: its input is kept for a retry.
struct TaskRecord<P> {
    stage: usize,
    /// The node it runs on (or last ran on).
    node: usize,
    input: Input<P>,
    attempts: u32,
    delivered: u32,
}

/// What a job does when a task fails (see `NodeConfig`'s keys of the same
/// names).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FailurePolicy {
    /// Tries after the first for a system failure (and for an operator's
    /// error when `retry_user_errors`).
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
    /// Free slots per node.
    free: Vec<Resources>,
    /// Per node: it drains (no new task starts there).
    draining: Vec<bool>,
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
        Self {
            shapes,
            stages,
            tasks: HashMap::new(),
            draining: vec![false; free.len()],
            free,
            next_node: 0,
            next_task: 0,
            failures,
            skipped: 0,
            recorder,
            actions: Vec::new(),
            ended: false,
        }
    }

    /// A node with `free` slots joins the job; returns its number.
    pub(crate) fn add_node(&mut self, free: Resources) -> usize {
        self.free.push(free);
        self.draining.push(false);
        self.free.len() - 1
    }

    /// Node `node` drains: no new task starts there (its paused tasks may
    /// still resume, since their outputs wait there).
    pub(crate) fn drain_node(&mut self, node: usize) {
        if let Some(d) = self.draining.get_mut(node) {
            *d = true;
        }
    }

    /// True when node `node` drained and the job has nothing there: no
    /// task placed on it, no partition it holds still to be read. Its
    /// leaving then costs the job nothing.
    pub(crate) fn left_cleanly(&self, node: usize) -> bool {
        let here = |p: &P| p.node() == node;
        self.draining.get(node).copied().unwrap_or(false)
            && !self.tasks.values().any(|t| t.node == node)
            && !self.stages.iter().any(|s| {
                s.queue.iter().flatten().any(here)
                    || s.collected.iter().any(here)
                    || s.paused.iter().any(|p| p.node == node)
            })
    }

    /// The job's stats recorder.
    pub(crate) fn recorder(&self) -> &Recorder {
        &self.recorder
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

    /// The node task `task` was placed on, while it runs.
    pub(crate) fn node_of(&self, task: TaskId) -> Option<usize> {
        self.tasks.get(&task).map(|r| r.node)
    }

    /// Task `task` stored its `seq`-th output.
    pub(crate) fn on_output(&mut self, task: TaskId, seq: u32, part: P) {
        let Some(record) = self.tasks.get_mut(&task) else {
            return;
        };
        if seq < record.delivered {
            return;
        }
        record.delivered = seq.saturating_add(1);
        let stage = record.stage;
        if self.stages[stage].cancelled {
            return;
        }
        self.recorder
            .event(stage, task, EventKind::PartitionYielded);
        let bytes = part.bytes();
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
        self.route(stage + 1, part);
    }

    /// Task `task` paused, holding an output of `pending_bytes`. False when
    /// its stage is no longer needed: the task is dropped.
    pub(crate) fn on_paused(
        &mut self,
        task: TaskId,
        pending_bytes: u64,
        store_full_at: Option<u64>,
    ) -> bool {
        let Some((stage, node)) = self.tasks.get(&task).map(|r| (r.stage, r.node)) else {
            return false;
        };
        self.release(node, stage);
        self.recorder.event(stage, task, EventKind::TaskSuspended);
        let s = &mut self.stages[stage];
        if s.cancelled || self.ended {
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
        let record = self.tasks.remove(&task)?;
        let stage = record.stage;
        self.release(record.node, stage);
        self.recorder.event(stage, task, EventKind::TaskFinished);
        Some(stage)
    }

    /// Records the counts of a finished task's stage.
    pub(crate) fn record_finished(&self, stage: usize, busy: Duration, ops: Vec<OpStats>) {
        self.recorder.task_finished(stage, busy, ops);
    }

    /// Task `task`'s worker died (`message`): the task is retried, or the
    /// job fails once it has been tried `max_task_retries + 1` times.
    pub(crate) fn on_lost(&mut self, task: TaskId, message: String) {
        let Some(record) = self.tasks.get(&task) else {
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
        let Some(record) = self.tasks.get(&task) else {
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
                .event(record.stage, task, EventKind::TaskSkipped);
            self.recorder.errored(streambatch_plan::ErroredTask {
                stage: self.shapes[record.stage].name.clone(),
                task,
                input: describe(&record.input),
                message: error.to_string(),
            });
            tracing::warn!(%task, %error, "task skipped (max_errored_partitions)");
            return;
        }
        self.end(Err(error));
    }

    /// Lets go of `task`'s slot and queues it again (`message` says why).
    fn retry(&mut self, task: TaskId, message: String) {
        let record = self.tasks.get_mut(&task).expect("the caller found it");
        record.attempts += 1;
        let (stage, node, attempts) = (record.stage, record.node, record.attempts);
        self.release(node, stage);
        tracing::warn!(%task, attempts, %message, "task failed; retrying");
        self.recorder.retry(stage);
        self.recorder.event(stage, task, EventKind::TaskRetried);
        if !self.stages[stage].cancelled {
            self.stages[stage].retry.push_back(task);
        }
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
                // One decision per node per pass, so that tasks spread over
                // the nodes (a stage capped by its pool too).
                let nodes = self.free.len();
                loop {
                    let mut decided = false;
                    for i in 0..nodes {
                        let node = (self.next_node + i) % nodes;
                        if let Some(d) = policy::next_decision(&self.snapshot(memory, node)) {
                            self.carry_out(d, node, false);
                            decided = true;
                        }
                    }
                    self.next_node = (self.next_node + 1) % nodes;
                    if !decided {
                        break;
                    }
                }
                if self.settle() {
                    continue;
                }
                if !self.force_if_stuck(memory) {
                    break;
                }
            }
            if self.stages.iter().all(|s| s.done) {
                self.end(Ok(()));
            }
        }
        std::mem::take(&mut self.actions)
    }

    /// What the policy sees of node `node`: its free slots, the tasks
    /// paused there, and its memory.
    fn snapshot(&self, memory: &impl Memory, node: usize) -> Snapshot {
        let stages = self
            .stages
            .iter()
            .zip(&self.shapes)
            .enumerate()
            .map(|(i, (s, shape))| {
                let runs = shape.kind.runs_tasks() && !s.done && !self.draining[node];
                let here = || s.paused.iter().filter(|p| p.node == node);
                let paused_fits = here()
                    .map(|p| {
                        let freed_since = p.store_full_at.is_none_or(|at| memory.frees(node) > at);
                        freed_since && memory.fits(node, i, p.pending_bytes)
                    })
                    .collect();
                StageView {
                    waiting_inputs: if runs { s.waiting() } else { 0 },
                    paused_fits,
                    paused: here().map(|p| p.pending_bytes).collect(),
                    running: s.running,
                    resources: shape.resources,
                    max_running: shape.max_running,
                    budget_fits_typical: memory.fits(node, i, s.typical_bytes),
                }
            })
            .collect();
        Snapshot {
            stages,
            free: self.free[node],
        }
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
        let s = &mut self.stages[stage];
        s.running += 1;
        let running = s.running;
        self.recorder.task_started(stage, running);
        self.recorder.event(stage, task, kind);
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
            self.actions.push(Action::Start {
                task,
                stage,
                node,
                input: record.input.clone(),
                skip: record.delivered,
                may_spill,
            });
            return task;
        }
        let input = if s.next_split < s.splits {
            s.next_split += 1;
            Input::Split(s.next_split - 1)
        } else {
            let local = s
                .queue
                .iter()
                .position(|parts| parts.first().is_some_and(|p| p.node() == node))
                .unwrap_or(0);
            Input::Parts(
                s.queue
                    .remove(local)
                    .expect("the policy dispatches only stages with input"),
            )
        };
        let task = TaskId(self.next_task);
        self.next_task += 1;
        self.tasks.insert(
            task,
            TaskRecord {
                stage,
                node,
                input: input.clone(),
                attempts: 0,
                delivered: 0,
            },
        );
        self.actions.push(Action::Start {
            task,
            stage,
            node,
            input,
            skip: 0,
            may_spill,
        });
        task
    }

    /// A task of `stage` gave its slot on `node` back.
    fn release(&mut self, node: usize, stage: usize) {
        let resources = self.shapes[stage].resources;
        self.free[node].cpus += resources.cpus;
        self.free[node].gpus += resources.gpus;
        self.stages[stage].running -= 1;
        self.recorder
            .task_stopped(stage, self.stages[stage].running);
    }

    /// Nothing runs and the last stage holds nothing the driver has not
    /// taken, yet work remains: memory is full of partitions that only more
    /// input could consume (a repartition larger than the store). Runs one
    /// task that may spill. True when it did.
    fn force_if_stuck(&mut self, memory: &impl Memory) -> bool {
        let running = self.stages.iter().any(|s| s.running > 0);
        let last = self
            .shapes
            .iter()
            .rposition(|s| s.kind.runs_tasks())
            .unwrap_or(0);
        if running || memory.held(last) > 0 || self.stages.iter().all(|s| s.done) {
            return false;
        }
        for node in 0..self.free.len() {
            if let Some(decision) = policy::forced_decision(&self.snapshot(memory, node)) {
                tracing::debug!(
                    ?decision,
                    node,
                    "memory is full and nothing can run: letting a task spill"
                );
                self.carry_out(decision, node, true);
                return true;
            }
        }
        false
    }

    /// Hands an output of stage `to - 1` to stage `to` (or the driver).
    fn route(&mut self, to: usize, part: P) {
        if to == self.stages.len() {
            self.actions.push(Action::Emit(part));
            return;
        }
        match self.shapes[to].kind {
            ShapeKind::Limit(_) => {
                let s = &mut self.stages[to];
                let take = part.rows().min(s.limit_left);
                if take == 0 {
                    return;
                }
                s.limit_left -= take;
                self.recorder.output(to, take, 0);
                self.route(to + 1, part.sub(0, take));
                self.check_limits();
            }
            ShapeKind::Repartition(_) => self.stages[to].collected.push(part),
            ShapeKind::Source { .. } | ShapeKind::Map => {
                self.stages[to].queue.push_back(vec![part])
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
            s.retry.clear();
            s.paused.clear();
            s.collected.clear();
            s.next_split = s.splits;
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
            let idle = s.waiting() == 0 && s.running == 0 && s.paused.is_empty();
            match self.shapes[i].kind {
                ShapeKind::Repartition(n) => {
                    let groups = regroup(std::mem::take(&mut self.stages[i].collected), n);
                    self.stages[i + 1].queue.extend(groups);
                }
                ShapeKind::Limit(_) => {}
                _ if !idle => break,
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
            s.paused.clear();
            s.collected.clear();
        }
        self.actions.push(Action::End(result));
    }
}

/// Cuts the rows of `parts` into `n` groups of (nearly) equal rows, in order.
fn regroup<P: Part>(parts: Vec<P>, n: usize) -> Vec<Vec<P>> {
    let total: usize = parts.iter().map(Part::rows).sum();
    let mut groups: Vec<Vec<P>> = (0..n).map(|_| Vec::new()).collect();
    let (mut group, mut filled) = (0, 0);
    let want = |g: usize| (g + 1) * total / n - g * total / n;
    for part in parts {
        let mut offset = 0;
        while offset < part.rows() {
            while group < n - 1 && filled == want(group) {
                group += 1;
                filled = 0;
            }
            let room = if group == n - 1 {
                usize::MAX
            } else {
                want(group) - filled
            };
            let take = (part.rows() - offset).min(room);
            groups[group].push(part.sub(offset, take));
            offset += take;
            filled += take;
        }
    }
    groups.retain(|g| !g.is_empty());
    groups
}

/// What a task read, for the stats of a skipped one.
fn describe<P: Part>(input: &Input<P>) -> String {
    match input {
        Input::Split(i) => format!("source split {i}"),
        Input::Parts(parts) => {
            let rows: usize = parts.iter().map(Part::rows).sum();
            format!("{} input partition(s), {rows} rows", parts.len())
        }
    }
}
