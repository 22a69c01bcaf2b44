//! The Executor: one actor per job. It keeps each stage's input queue,
//! running and paused tasks, and asks the policy what to run on every event
//! (a task started, yielded, paused, finished or was lost; memory was freed).
//! Outputs of the last stage stream to the driver as soon as they exist.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use streambatch_core::{NodeConfig, Resources, TaskId};
use streambatch_plan::{
    Error, Event, EventKind, ExecPlan, JobStats, MAX_EVENTS, OperatorStats, StageKind,
};
use streambatch_store::ObjectStore;

use crate::budget::Budgets;
use crate::node::NodeMsg;
use crate::partition::Slice;
use crate::policy::{self, Decision, Snapshot, StageView};
use crate::task::{JobCtx, RunInput, TaskRun};

/// Events the executor reacts to.
pub enum ExecutorMsg {
    /// A task stored its `seq`-th output.
    Output {
        /// The task.
        task: TaskId,
        /// The output's position among the task's outputs.
        seq: u32,
        /// The output.
        slice: Slice,
    },
    /// A task paused: its next output does not fit in memory yet.
    Paused(Box<TaskRun>),
    /// A task finished.
    Finished {
        /// The task.
        task: TaskId,
        /// Time it computed.
        busy: Duration,
    },
    /// An operator failed (in a task or its set-up): the job ends.
    Failed(Error),
    /// A task's worker died (a panic); the task is retried.
    WorkerLost {
        /// The task.
        task: TaskId,
        /// The panic message.
        message: String,
    },
    /// Output memory was returned; paused work may fit now.
    MemoryFreed,
}

/// What the executor sends the driver.
pub enum JobItem {
    /// An output partition of the last stage.
    Output(Slice),
    /// The job ended.
    End(Result<(), Error>),
}

/// The Executor actor.
pub struct Executor;

/// What a job's executor is started with.
pub struct ExecutorArgs {
    /// The job's id.
    pub job: u64,
    /// The physical plan.
    pub plan: Arc<ExecPlan>,
    /// The node that runs its tasks.
    pub node: ActorRef<NodeMsg>,
    /// The node's settings (slots, partition size, retries).
    pub config: NodeConfig,
    /// The node's store.
    pub store: Arc<dyn ObjectStore>,
    /// Where outputs go.
    pub output: Sender<JobItem>,
    /// Stats, updated live.
    pub live: Arc<Mutex<JobStats>>,
}

struct StageState {
    queue: VecDeque<Vec<Slice>>,
    retry: VecDeque<TaskId>,
    paused: Vec<TaskRun>,
    next_split: usize,
    splits: usize,
    running: usize,
    done: bool,
    limit_left: usize,
    collected: Vec<Slice>,
    typical_bytes: u64,
    /// The largest output partition so far: the stage's memory reserve.
    largest_bytes: u64,
    first_start: Option<Instant>,
}

impl StageState {
    fn waiting(&self) -> usize {
        self.queue.len() + self.retry.len() + (self.splits - self.next_split)
    }
}

struct TaskRecord {
    stage: usize,
    input: RunInput,
    attempts: u32,
    delivered: u32,
}

/// The executor's state.
pub struct ExecState {
    ctx: Arc<JobCtx>,
    node: ActorRef<NodeMsg>,
    store: Arc<dyn ObjectStore>,
    free: Resources,
    stages: Vec<StageState>,
    tasks: HashMap<TaskId, TaskRecord>,
    next_task: u64,
    max_retries: u32,
    output: Sender<JobItem>,
    live: Arc<Mutex<JobStats>>,
    started: Instant,
    ended: bool,
}

impl Actor for Executor {
    type Msg = ExecutorMsg;
    type State = ExecState;
    type Arguments = ExecutorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ExecutorMsg>,
        args: ExecutorArgs,
    ) -> Result<ExecState, ActorProcessingErr> {
        let plan = args.plan;
        let capacity = args.store.stats().capacity_bytes;
        let task_stages = plan.stages.iter().filter(|s| s.runs_tasks()).count().max(1) as u64;
        // Partitions small enough that every stage's reserve holds one.
        let target_bytes = args
            .config
            .target_partition_bytes
            .min(capacity / (2 * task_stages))
            .max(1);
        let reserve = plan
            .stages
            .iter()
            .map(|s| if s.runs_tasks() { target_bytes } else { 0 })
            .collect();
        let notify = myself.clone();
        let budgets = Budgets::new(
            capacity,
            reserve,
            Arc::new(move || {
                let _ = notify.cast(ExecutorMsg::MemoryFreed);
            }),
        );
        let stages = plan
            .stages
            .iter()
            .map(|s| StageState {
                queue: VecDeque::new(),
                retry: VecDeque::new(),
                paused: Vec::new(),
                next_split: 0,
                splits: match &s.kind {
                    StageKind::Source { splits, .. } => splits.len(),
                    _ => 0,
                },
                running: 0,
                done: false,
                limit_left: match s.kind {
                    StageKind::Limit(n) => n,
                    _ => 0,
                },
                collected: Vec::new(),
                typical_bytes: 0,
                largest_bytes: 0,
                first_start: None,
            })
            .collect();
        {
            let mut live = args.live.lock().unwrap_or_else(|p| p.into_inner());
            live.operators = plan
                .stages
                .iter()
                .map(|s| OperatorStats {
                    name: s.name.clone(),
                    ..Default::default()
                })
                .collect();
            live.peak_running = vec![0; plan.stages.len()];
            live.store_capacity = capacity;
        }
        let cancelled = plan.stages.iter().map(|_| Default::default()).collect();
        let ctx = Arc::new(JobCtx {
            job: args.job,
            plan,
            store: args.store.clone(),
            budgets,
            executor: myself,
            target_bytes,
            cancelled,
        });
        Ok(ExecState {
            ctx,
            node: args.node,
            store: args.store,
            free: Resources {
                cpus: args.config.cpus,
                gpus: args.config.gpus.unwrap_or(0.0),
                memory_bytes: 0,
            },
            stages,
            tasks: HashMap::new(),
            next_task: 0,
            max_retries: args.config.max_task_retries,
            output: args.output,
            live: args.live,
            started: Instant::now(),
            ended: false,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<ExecutorMsg>,
        state: &mut ExecState,
    ) -> Result<(), ActorProcessingErr> {
        if let Err(e) = state.check_resources() {
            state.end(Err(e));
            myself.stop(None);
            return Ok(());
        }
        state.start_pools();
        state.check_limits();
        state.advance(&myself);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ExecutorMsg>,
        msg: ExecutorMsg,
        state: &mut ExecState,
    ) -> Result<(), ActorProcessingErr> {
        if state.ended {
            return Ok(());
        }
        match msg {
            ExecutorMsg::Output { task, seq, slice } => state.on_output(task, seq, slice),
            ExecutorMsg::Paused(run) => state.on_paused(*run),
            ExecutorMsg::Finished { task, busy } => state.on_finished(task, busy),
            ExecutorMsg::Failed(error) => state.end(Err(error)),
            ExecutorMsg::WorkerLost { task, message } => state.on_lost(task, message),
            ExecutorMsg::MemoryFreed => {}
        }
        state.advance(&myself);
        Ok(())
    }
}

impl ExecState {
    fn stats(&self) -> std::sync::MutexGuard<'_, JobStats> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, stage: usize, task: TaskId, kind: EventKind) {
        let mut stats = self.stats();
        if stats.events.len() < MAX_EVENTS {
            let at = self.started.elapsed();
            stats.events.push(Event {
                stage,
                task,
                kind,
                at,
            });
        }
    }

    /// A stage whose task needs more than the node has would never run:
    /// fail at once, naming it, instead of waiting forever.
    fn check_resources(&self) -> Result<(), Error> {
        for stage in self.ctx.plan.stages.iter().filter(|s| s.runs_tasks()) {
            let need = stage.options.resources;
            if !need.fits_in(&self.free) {
                let hint = if need.gpus > self.free.gpus && self.free.gpus == 0.0 {
                    " (no GPU adapter was found, or the node sets gpus = 0; run the operator on the CPU instead)"
                } else {
                    ""
                };
                return Err(Error::Invalid(format!(
                    "operator `{}` needs {} CPU and {} GPU slots per task, but the node has {} CPU and {} GPU slots{hint}",
                    stage.name, need.cpus, need.gpus, self.free.cpus, self.free.gpus
                )));
            }
        }
        Ok(())
    }

    /// Sets up the first `min` workers of each stateful stage's pool.
    fn start_pools(&self) {
        for (stage, spec) in self.ctx.plan.stages.iter().enumerate() {
            let Some(pool) = spec.options.pool else {
                continue;
            };
            if pool.min > 0 && !spec.stateful_ops().is_empty() {
                let msg = NodeMsg::SetUp {
                    job: self.ctx.clone(),
                    stage,
                    workers: pool.min,
                };
                let _ = self.node.cast(msg);
            }
        }
    }

    fn resources(&self, stage: usize) -> Resources {
        self.ctx.plan.stages[stage].options.resources
    }

    /// Runs what the policy allows, settles finished stages, and repeats
    /// until nothing changes; then ends the job if every stage is done.
    fn advance(&mut self, myself: &ActorRef<ExecutorMsg>) {
        if self.ended {
            return;
        }
        loop {
            self.schedule();
            if self.ended {
                break;
            }
            if self.settle() {
                continue;
            }
            if !self.force_if_stuck() {
                break;
            }
        }
        let used = self.store.stats().used_bytes;
        {
            let mut stats = self.stats();
            stats.peak_store_bytes = stats.peak_store_bytes.max(used);
        }
        if !self.ended && self.stages.iter().all(|s| s.done) {
            self.end(Ok(()));
        }
        if self.ended {
            myself.stop(None);
        }
    }

    fn snapshot(&self) -> Snapshot {
        let store = self.store.stats();
        let store_free = store.capacity_bytes.saturating_sub(store.used_bytes);
        let budgets = &self.ctx.budgets;
        let stages = self
            .stages
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let stage = &self.ctx.plan.stages[i];
                let runs = stage.runs_tasks() && !s.done;
                let paused: Vec<u64> = s.paused.iter().map(|r| r.pending_bytes()).collect();
                // A task the store turned away waits for a free since then.
                let paused_fits = s
                    .paused
                    .iter()
                    .zip(&paused)
                    .map(|(run, b)| {
                        let freed_since = run.store_full_at.is_none_or(|at| store.frees > at);
                        freed_since && budgets.fits(i, *b) && *b <= store_free
                    })
                    .collect();
                StageView {
                    waiting_inputs: if runs { s.waiting() } else { 0 },
                    paused_fits,
                    paused,
                    running: s.running,
                    resources: stage.options.resources,
                    max_running: stage.options.pool.map(|p| p.max),
                    budget_fits_typical: budgets.fits(i, s.typical_bytes)
                        && s.typical_bytes <= store_free,
                }
            })
            .collect();
        Snapshot {
            stages,
            free: self.free,
        }
    }

    fn schedule(&mut self) {
        while let Some(decision) = policy::next_decision(&self.snapshot()) {
            if !self.carry_out(decision, false) {
                return;
            }
        }
    }

    /// Starts or resumes a task as decided. False when the node is gone.
    fn carry_out(&mut self, decision: Decision, may_spill: bool) -> bool {
        let (stage, mut run, kind) = match decision {
            Decision::Resume { stage, index } => (
                stage,
                Box::new(self.stages[stage].paused.remove(index)),
                EventKind::TaskResumed,
            ),
            Decision::Dispatch { stage } => (
                stage,
                Box::new(self.new_task(stage)),
                EventKind::TaskStarted,
            ),
        };
        run.may_spill = may_spill;
        let resources = self.resources(stage);
        self.free.cpus -= resources.cpus;
        self.free.gpus -= resources.gpus;
        let s = &mut self.stages[stage];
        s.running += 1;
        s.first_start.get_or_insert_with(Instant::now);
        let running = s.running as u64;
        {
            let mut stats = self.stats();
            stats.operators[stage].running = running;
            stats.peak_running[stage] = stats.peak_running[stage].max(running);
        }
        self.record(stage, run.task, kind);
        let pool = self.ctx.plan.stages[stage].options.pool.map(|p| p.max);
        if self.node.cast(NodeMsg::Run { run, pool }).is_err() {
            self.end(Err(Error::Execution("the node manager has stopped".into())));
            return false;
        }
        true
    }

    /// Nothing runs, the driver holds no output, yet work remains: memory is
    /// full of partitions that only more input could consume (a repartition
    /// larger than the store). Runs one task that may spill. True when it did.
    fn force_if_stuck(&mut self) -> bool {
        let running = self.stages.iter().any(|s| s.running > 0);
        let last = self
            .ctx
            .plan
            .stages
            .iter()
            .rposition(|s| s.runs_tasks())
            .unwrap_or(0);
        if running || self.ctx.budgets.used(last) > 0 || self.stages.iter().all(|s| s.done) {
            return false;
        }
        let Some(decision) = policy::forced_decision(&self.snapshot()) else {
            return false;
        };
        tracing::debug!(
            ?decision,
            "memory is full and nothing can run: letting a task spill"
        );
        self.carry_out(decision, true);
        true
    }

    fn new_task(&mut self, stage: usize) -> TaskRun {
        let s = &mut self.stages[stage];
        if let Some(task) = s.retry.pop_front() {
            let record = &self.tasks[&task];
            return TaskRun::new(
                self.ctx.clone(),
                task,
                stage,
                record.input.clone(),
                record.delivered,
            );
        }
        let input = if s.next_split < s.splits {
            s.next_split += 1;
            RunInput::Split(s.next_split - 1)
        } else {
            RunInput::Slices(
                s.queue
                    .pop_front()
                    .expect("the policy dispatches only stages with input"),
            )
        };
        let task = TaskId(self.next_task);
        self.next_task += 1;
        self.tasks.insert(
            task,
            TaskRecord {
                stage,
                input: input.clone(),
                attempts: 0,
                delivered: 0,
            },
        );
        TaskRun::new(self.ctx.clone(), task, stage, input, 0)
    }

    fn release(&mut self, stage: usize) {
        let resources = self.resources(stage);
        self.free.cpus += resources.cpus;
        self.free.gpus += resources.gpus;
        self.stages[stage].running -= 1;
        let running = self.stages[stage].running as u64;
        self.stats().operators[stage].running = running;
    }

    fn on_output(&mut self, task: TaskId, seq: u32, slice: Slice) {
        let Some(record) = self.tasks.get_mut(&task) else {
            return;
        };
        if seq < record.delivered {
            return;
        }
        record.delivered = seq + 1;
        let stage = record.stage;
        if self.ctx.cancelled[stage].load(Ordering::Relaxed) {
            return;
        }
        self.record(stage, task, EventKind::PartitionYielded);
        let bytes = slice.partition_bytes();
        let s = &mut self.stages[stage];
        s.typical_bytes = if s.typical_bytes == 0 {
            bytes
        } else {
            (s.typical_bytes * 7 + bytes) / 8
        };
        if bytes > s.largest_bytes {
            s.largest_bytes = bytes;
            self.ctx.budgets.fit_reserve(stage, bytes);
        }
        {
            let mut stats = self.stats();
            stats.operators[stage].rows += slice.len as u64;
            stats.operators[stage].bytes += bytes;
        }
        self.route(stage + 1, slice);
    }

    /// Hands an output of stage `to - 1` to stage `to` (or the driver).
    fn route(&mut self, to: usize, slice: Slice) {
        if to == self.stages.len() {
            if self.output.send(JobItem::Output(slice)).is_err() {
                // The driver dropped the stream: the job is cancelled.
                self.end(Ok(()));
            }
            return;
        }
        match self.ctx.plan.stages[to].kind {
            StageKind::Limit(_) => {
                let s = &mut self.stages[to];
                let take = slice.len.min(s.limit_left);
                if take == 0 {
                    return;
                }
                s.limit_left -= take;
                self.stats().operators[to].rows += take as u64;
                self.route(to + 1, slice.sub(0, take));
                self.check_limits();
            }
            StageKind::Repartition(_) => self.stages[to].collected.push(slice),
            StageKind::Source { .. } | StageKind::Map { .. } => {
                self.stages[to].queue.push_back(vec![slice])
            }
        }
    }

    /// A limit that has all its rows ends every stage before it.
    fn check_limits(&mut self) {
        let Some(limit) = (0..self.stages.len()).rev().find(|&i| {
            matches!(self.ctx.plan.stages[i].kind, StageKind::Limit(_))
                && self.stages[i].limit_left == 0
        }) else {
            return;
        };
        for i in 0..=limit {
            self.ctx.cancelled[i].store(true, Ordering::Relaxed);
            let s = &mut self.stages[i];
            s.done = true;
            s.queue.clear();
            s.retry.clear();
            s.paused.clear();
            s.collected.clear();
            s.next_split = s.splits;
        }
    }

    fn on_paused(&mut self, run: TaskRun) {
        let stage = run.stage;
        self.release(stage);
        self.record(stage, run.task, EventKind::TaskSuspended);
        if !self.ctx.cancelled[stage].load(Ordering::Relaxed) {
            self.stages[stage].paused.push(run);
        }
    }

    fn on_finished(&mut self, task: TaskId, busy: Duration) {
        let Some(record) = self.tasks.remove(&task) else {
            return;
        };
        let stage = record.stage;
        self.release(stage);
        self.record(stage, task, EventKind::TaskFinished);
        let wall = self.stages[stage]
            .first_start
            .map_or(Duration::ZERO, |t| t.elapsed());
        let ops = self.ctx.plan.stages[stage].op_stats();
        let mut stats = self.stats();
        let op = &mut stats.operators[stage];
        op.tasks += 1;
        op.busy += busy;
        op.wall = wall;
        op.ops = ops;
    }

    fn on_lost(&mut self, task: TaskId, message: String) {
        let Some(record) = self.tasks.get_mut(&task) else {
            return;
        };
        record.attempts += 1;
        let (stage, attempts) = (record.stage, record.attempts);
        self.release(stage);
        if attempts > self.max_retries {
            let operator = self.ctx.plan.stages[stage].name.clone();
            self.end(Err(Error::Panicked {
                operator,
                attempts,
                message,
            }));
            return;
        }
        tracing::warn!(%task, attempts, %message, "task lost with its worker; retrying");
        self.stats().operators[stage].retries += 1;
        self.record(stage, task, EventKind::TaskRetried);
        if !self.ctx.cancelled[stage].load(Ordering::Relaxed) {
            self.stages[stage].retry.push_back(task);
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
            match self.ctx.plan.stages[i].kind {
                StageKind::Repartition(n) => {
                    let groups = regroup(std::mem::take(&mut self.stages[i].collected), n);
                    self.stages[i + 1].queue.extend(groups);
                }
                StageKind::Limit(_) => {}
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
        for flag in &self.ctx.cancelled {
            flag.store(true, Ordering::Relaxed);
        }
        for s in &mut self.stages {
            s.queue.clear();
            s.paused.clear();
            s.collected.clear();
        }
        {
            let store = self.store.stats();
            let mut stats = self.stats();
            stats.wall = self.started.elapsed();
            stats.peak_store_bytes = stats.peak_store_bytes.max(store.used_bytes);
            stats.spilled_bytes = store.spilled_bytes;
            stats.restored_bytes = store.restored_bytes;
        }
        let _ = self.node.cast(NodeMsg::JobEnded { job: self.ctx.job });
        let _ = self.output.send(JobItem::End(result));
    }
}

/// Cuts the rows of `slices` into `n` groups of (nearly) equal rows, in order.
fn regroup(slices: Vec<Slice>, n: usize) -> Vec<Vec<Slice>> {
    let total: usize = slices.iter().map(|s| s.len).sum();
    let mut groups: Vec<Vec<Slice>> = (0..n).map(|_| Vec::new()).collect();
    let (mut group, mut filled) = (0, 0);
    let want = |g: usize| (g + 1) * total / n - g * total / n;
    for slice in slices {
        let mut offset = 0;
        while offset < slice.len {
            while group < n - 1 && filled == want(group) {
                group += 1;
                filled = 0;
            }
            let room = if group == n - 1 {
                usize::MAX
            } else {
                want(group) - filled
            };
            let take = (slice.len - offset).min(room);
            groups[group].push(slice.sub(offset, take));
            offset += take;
            filled += take;
        }
    }
    groups.retain(|g| !g.is_empty());
    groups
}
