//! The Executor: one actor per job, a thin shell around the job's
//! [`JobState`]. It feeds the state every event its tasks report, then
//! carries out the decisions the state returns: tasks go to the node,
//! outputs of the last stage stream to the driver as soon as they exist.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use streambatch_core::{JobId, NodeConfig, Resources, TaskId};
use streambatch_plan::{Error, ExecPlan, JobStats};
use streambatch_store::ObjectStore;

use crate::budget::Budgets;
use crate::job::{Action, JobState, Memory, StageShape};
use crate::msg::{ExecutorMsg, JobItem, NodeMsg};
use crate::partition::Slice;
use crate::record::Recorder;
use crate::task::{JobCtx, TaskEvent, TaskRun};

/// The Executor actor.
pub(crate) struct Executor;

/// What a job's executor is started with.
pub(crate) struct ExecutorArgs {
    /// The job's id.
    pub(crate) job: JobId,
    /// The physical plan.
    pub(crate) plan: Arc<ExecPlan>,
    /// The node that runs its tasks.
    pub(crate) node: ActorRef<NodeMsg>,
    /// The node's settings (slots, partition size, retries).
    pub(crate) config: NodeConfig,
    /// The node's store.
    pub(crate) store: Arc<dyn ObjectStore>,
    /// Where outputs go.
    pub(crate) output: Sender<JobItem>,
    /// Stats, updated live.
    pub(crate) live: Arc<Mutex<JobStats>>,
}

/// The executor's state: the job's state and what carries out its decisions.
pub(crate) struct ExecState {
    job: JobState<Slice>,
    ctx: Arc<JobCtx>,
    node: ActorRef<NodeMsg>,
    store: Arc<dyn ObjectStore>,
    /// Paused tasks, holding their pending outputs, until resumed.
    paused: HashMap<TaskId, Box<TaskRun>>,
    output: Sender<JobItem>,
}

/// Memory as the store and the job's budgets have it now.
struct LiveMemory<'a> {
    budgets: &'a Budgets,
    store: &'a dyn ObjectStore,
}

impl Memory for LiveMemory<'_> {
    fn fits(&self, stage: usize, bytes: u64) -> bool {
        let store = self.store.stats();
        let free = store.capacity_bytes.saturating_sub(store.used_bytes);
        self.budgets.fits(stage, bytes) && bytes <= free
    }

    fn frees(&self) -> u64 {
        self.store.stats().frees
    }

    fn held(&self, stage: usize) -> u64 {
        self.budgets.used(stage)
    }
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
        let names = plan.stages.iter().map(|s| s.name.clone()).collect();
        let recorder = Recorder::new(args.live, names, capacity);
        let shapes = plan.stages.iter().map(StageShape::of).collect();
        let free = Resources {
            cpus: args.config.cpus,
            gpus: args.config.gpus.unwrap_or(0.0),
            memory_bytes: 0,
        };
        let job = JobState::new(shapes, free, args.config.max_task_retries, recorder);
        let cancelled = plan.stages.iter().map(|_| Default::default()).collect();
        let ctx = Arc::new(JobCtx {
            job: args.job,
            plan,
            store: args.store.clone(),
            budgets,
            events: myself.get_derived(),
            target_bytes,
            cancelled,
        });
        Ok(ExecState {
            job,
            ctx,
            node: args.node,
            store: args.store,
            paused: HashMap::new(),
            output: args.output,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<ExecutorMsg>,
        state: &mut ExecState,
    ) -> Result<(), ActorProcessingErr> {
        match state.job.check_resources() {
            Ok(()) => state.start_pools(),
            Err(e) => state.job.fail(e),
        }
        state.carry_out(&myself);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ExecutorMsg>,
        msg: ExecutorMsg,
        state: &mut ExecState,
    ) -> Result<(), ActorProcessingErr> {
        if state.job.ended() {
            return Ok(());
        }
        match msg {
            ExecutorMsg::Task(event) => state.on_task_event(event),
            ExecutorMsg::MemoryFreed => {}
        }
        state.carry_out(&myself);
        Ok(())
    }
}

impl ExecState {
    fn on_task_event(&mut self, event: TaskEvent) {
        let job = &mut self.job;
        match event {
            TaskEvent::Output { task, seq, slice } => job.on_output(task, seq, slice),
            TaskEvent::Paused(run) => {
                if job.on_paused(run.task, run.pending_bytes(), run.store_full_at) {
                    self.paused.insert(run.task, run);
                }
            }
            TaskEvent::Finished { task, busy } => {
                if let Some(stage) = job.on_finished(task) {
                    let ops = self.ctx.plan.stages[stage].op_stats();
                    job.record_finished(stage, busy, ops);
                }
            }
            TaskEvent::Failed(error) => job.fail(error),
            TaskEvent::Lost { task, message } => job.on_lost(task, message),
        }
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

    /// Carries out the job state's decisions until it has none left; stops
    /// the actor once the job has ended.
    fn carry_out(&mut self, myself: &ActorRef<ExecutorMsg>) {
        loop {
            let memory = LiveMemory {
                budgets: &self.ctx.budgets,
                store: self.store.as_ref(),
            };
            let actions = self.job.advance(&memory);
            if actions.is_empty() {
                break;
            }
            for action in actions {
                self.apply(action);
            }
        }
        self.job
            .recorder()
            .store_used(self.store.stats().used_bytes);
        if self.job.ended() {
            myself.stop(None);
        }
    }

    fn apply(&mut self, action: Action<Slice>) {
        match action {
            Action::Start {
                task,
                stage,
                input,
                skip,
                may_spill,
            } => {
                let mut run = TaskRun::new(self.ctx.clone(), task, stage, input, skip);
                run.may_spill = may_spill;
                self.run(Box::new(run));
            }
            Action::Resume { task, may_spill } => {
                if let Some(mut run) = self.paused.remove(&task) {
                    run.may_spill = may_spill;
                    self.run(run);
                }
            }
            Action::Emit(slice) => {
                if self.output.send(JobItem::Output(slice)).is_err() {
                    // The driver dropped the stream: the job is cancelled.
                    self.job.cancel();
                }
            }
            Action::Cancel { stage } => {
                self.ctx.cancelled[stage].store(true, Ordering::Relaxed);
                self.paused.retain(|_, run| run.stage != stage);
            }
            Action::FitReserve { stage, bytes } => self.ctx.budgets.fit_reserve(stage, bytes),
            Action::End(result) => {
                let store = self.store.stats();
                self.job.recorder().ended(
                    store.used_bytes,
                    store.spilled_bytes,
                    store.restored_bytes,
                );
                let _ = self.node.cast(NodeMsg::JobEnded { job: self.ctx.job });
                let _ = self.output.send(JobItem::End(result));
            }
        }
    }

    fn run(&mut self, run: Box<TaskRun>) {
        let pool = self.ctx.plan.stages[run.stage].options.pool.map(|p| p.max);
        if self.node.cast(NodeMsg::Run { run, pool }).is_err() {
            self.job.fail(Error::NodeStopped);
        }
    }
}
