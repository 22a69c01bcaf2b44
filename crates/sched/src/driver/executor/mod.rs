//! The Executor: one actor per job, a thin shell around the job's
//! [`JobState`]. It feeds the state every event its tasks report, then
//! carries out the decisions the state returns: tasks go to a node,
//! outputs of the last stage stream to the driver as soon as they exist.
//!
//! It runs in the process that submitted the job. Its tasks run either on
//! the embedded node of that process (`local`) or on the nodes of a
//! cluster, reached through their agents (`remote`). This module holds
//! what both share: the actor, its loop and the events both hear; what
//! differs is behind [`Backend`], which each of them implements.

mod local;
pub(crate) mod remote;

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use streambatch_core::{JobId, NodeConfig, Resources};
use streambatch_plan::{Error, ExecPlan, JobStats};
use streambatch_store::ObjectStore;

use crate::driver::executor::local::Local;
use crate::driver::executor::remote::{Joining, Remote, RemoteNode};
use crate::driver::msg::{ExecutorMsg, JobItem};
use crate::exec::msg::NodeMsg;
use crate::exec::partitioner::{RemoteSource, Slice};
use crate::exec::task::{TaskEvent, TaskRun};
use crate::job::record::Recorder;
use crate::job::{Action, FailurePolicy, JobState, StageShape};
use crate::wire::{JobKey, NodeEvent};

/// The Executor actor.
pub(crate) struct Executor;

/// Where a job's tasks run.
pub(crate) enum Nodes {
    /// The embedded node of this process.
    Local {
        /// Its NodeManager.
        manager: ActorRef<NodeMsg>,
        /// Its store.
        store: Arc<dyn ObjectStore>,
    },
    /// Cluster nodes, each started for this job (see `JobStart`).
    Remote {
        /// The job's name on the nodes.
        key: JobKey,
        /// Where the job's port finds this executor: set before the first
        /// task goes out, so that no event of the job is dropped.
        port: crate::driver::port::ExecutorCell,
        /// The nodes, in the order the job state numbers them.
        nodes: Vec<RemoteNode>,
        /// Reads and releases their partitions.
        source: Arc<dyn RemoteSource>,
        /// Nodes that join while the job runs (see `ExecutorMsg::NodeJoined`).
        joining: Joining,
    },
}

/// What a job's executor is started with.
pub(crate) struct ExecutorArgs {
    /// The job's id.
    pub(crate) job: JobId,
    /// The physical plan.
    pub(crate) plan: Arc<ExecPlan>,
    /// Where its tasks run.
    pub(crate) nodes: Nodes,
    /// The settings of the job (partition size, retries) and, for a local
    /// job, of its node.
    pub(crate) config: NodeConfig,
    /// Where outputs go.
    pub(crate) output: Sender<JobItem>,
    /// Stats, updated live.
    pub(crate) live: Arc<Mutex<JobStats>>,
}

/// The executor's state: the job's state and what carries out its decisions.
pub(crate) struct ExecState {
    job: JobState<Slice>,
    plan: Arc<ExecPlan>,
    backend: Box<dyn Backend>,
    output: Sender<JobItem>,
}

/// What a backend opens a job with.
struct Opening<'a> {
    job: JobId,
    plan: &'a Arc<ExecPlan>,
    config: &'a NodeConfig,
    /// The executor.
    myself: &'a ActorRef<ExecutorMsg>,
}

/// A backend as it opened a job.
struct Opened {
    backend: Box<dyn Backend>,
    /// Per node, its slots.
    free: Vec<Resources>,
    /// The bytes the job's stores hold in all.
    capacity: u64,
    /// The job's partition size.
    target_bytes: u64,
    /// Bytes the store had spilled and restored before the job started.
    store_before: (u64, u64),
}

/// Where the job's tasks run, and what differs with that: the embedded
/// node ([`Local`]) or cluster nodes ([`Remote`]).
trait Backend: Send {
    /// The job's id, as its failpoints name it.
    #[cfg(feature = "failpoints")]
    fn job_id(&self) -> u64;

    /// Tells `recorder` of the job's nodes, before the job starts.
    fn record_nodes(&self, _recorder: &Recorder) {}

    /// The job state as this backend runs it (queueing on the local node,
    /// keeping lineage on a cluster).
    fn configure(&self, job: JobState<Slice>, config: &NodeConfig) -> JobState<Slice>;

    /// Sets up what the job needs before its first decision (the local
    /// node's pools of stateful workers).
    fn start_pools(&self, _plan: &ExecPlan) {}

    /// The job state's next decisions, on memory as this backend sees it.
    fn advance(&self, job: &mut JobState<Slice>) -> Vec<Action<Slice>>;

    /// Whether the job's budgets tell this executor of memory returned.
    fn listen(&self, on: bool);

    /// Bytes the job's stores hold in memory now, and have spilled so far.
    fn store_now(&self) -> (u64, u64);

    /// After a pass of decisions: acts on what carrying them out found
    /// (the local node's manager had stopped).
    fn after_pass(&mut self, _myself: &ActorRef<ExecutorMsg>) {}

    /// Whether the driver tells which outputs it read (so the job knows
    /// which to make again, should their node be lost).
    fn names_outputs(&self) -> bool;

    /// Carries out a decision other than those the executor handles itself.
    fn apply(&mut self, action: Action<Slice>, job: &mut JobState<Slice>);

    /// The job ended: it records the end and lets its nodes go.
    fn end(&self, job: &mut JobState<Slice>);

    /// A task paused, as the job state holds it: kept until it resumes
    /// (where this backend holds paused tasks).
    fn paused(&mut self, _run: Box<TaskRun>) {}

    /// Nodes joined the cluster and took the job (they wait in `Joining`).
    fn joined(&mut self, _job: &mut JobState<Slice>, _myself: &ActorRef<ExecutorMsg>) {}

    /// Node `name` of the job is gone.
    fn node_lost(&mut self, job: &mut JobState<Slice>, name: String);

    /// A cluster node reported.
    fn node_event(&mut self, _job: &mut JobState<Slice>, _event: NodeEvent) {}
}

/// Tells the executor `myself` of memory returned.
fn memory_freed(myself: &ActorRef<ExecutorMsg>) -> Arc<dyn Fn() + Send + Sync> {
    let me = myself.clone();
    Arc::new(move || {
        let _ = me.cast(ExecutorMsg::MemoryFreed);
    })
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
        let names = plan.stages.iter().map(|s| s.name.clone()).collect();
        let mut shapes: Vec<StageShape> = plan.stages.iter().map(StageShape::of).collect();
        let failures = FailurePolicy::of(&args.config);
        let opening = Opening {
            job: args.job,
            plan: &plan,
            config: &args.config,
            myself: &myself,
        };
        let opened = match args.nodes {
            Nodes::Local { manager, store } => Local::open(opening, manager, store),
            Nodes::Remote {
                key,
                port,
                nodes,
                source,
                joining,
            } => Remote::open(opening, key, port, nodes, source, joining),
        };
        let Opened {
            backend,
            free,
            capacity,
            target_bytes,
            store_before: (spilled, restored),
        } = opened;
        for (shape, stage) in shapes.iter_mut().zip(&plan.stages) {
            shape.input_held_cap = crate::exec::budget::input_held_cap(stage, target_bytes);
        }
        let recorder = Recorder::new(args.live, names, capacity)
            .record_timeline(args.config.record_timeline)
            .store_before(spilled, restored);
        backend.record_nodes(&recorder);
        let job = JobState::new(shapes, free, failures, recorder);
        let job = backend.configure(job, &args.config);
        Ok(ExecState {
            job,
            plan,
            backend,
            output: args.output,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<ExecutorMsg>,
        state: &mut ExecState,
    ) -> Result<(), ActorProcessingErr> {
        match state.job.check_resources() {
            Ok(()) => state.backend.start_pools(&state.plan),
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
        #[cfg(feature = "failpoints")]
        if matches!(msg, ExecutorMsg::Task(_) | ExecutorMsg::Node(_)) {
            crate::exec::failpoint::executor(state.backend.job_id());
        }
        let job = &mut state.job;
        match msg {
            ExecutorMsg::Task(event) => state.on_task_event(event),
            ExecutorMsg::Node(event) => state.backend.node_event(job, event),
            ExecutorMsg::NodeLost(node) => state.backend.node_lost(job, node),
            ExecutorMsg::HeadLost(node) => job.fail(Error::HeadLost { node }),
            ExecutorMsg::NodeJoined => state.backend.joined(job, &myself),
            ExecutorMsg::Cancel => job.cancel(),
            ExecutorMsg::Abort(error) => job.fail(error),
            ExecutorMsg::MemoryFreed => {}
            ExecutorMsg::Read { id, read } => job.on_read(id, read),
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
                if let Some((from, to)) = run.ran {
                    job.recorder_mut().ran(run.task, from, to);
                }
                if job.on_paused(run.task, run.pending_bytes(), run.store_full_at) {
                    self.backend.paused(run);
                }
            }
            TaskEvent::Finished {
                task,
                busy,
                last,
                ran,
            } => {
                if let Some((seq, slice)) = last {
                    job.on_output(task, seq, slice);
                }
                if let Some((from, to)) = ran {
                    job.recorder_mut().ran(task, from, to);
                }
                if let Some(stage) = job.on_finished(task) {
                    let ops = self.plan.stages[stage].op_stats();
                    job.record_finished(stage, busy, ops);
                }
            }
            TaskEvent::Failed(error) => job.fail(error),
            TaskEvent::Errored { task, error } => {
                let user_error = error.is_user_error();
                job.on_errored(task, error, user_error)
            }
            TaskEvent::Lost { task, message } => job.on_lost(task, message),
        }
    }

    /// Carries out the job state's decisions until it has none left; stops
    /// the actor once the job has ended.
    fn carry_out(&mut self, myself: &ActorRef<ExecutorMsg>) {
        self.backend.listen(true);
        loop {
            let actions = self.backend.advance(&mut self.job);
            if actions.is_empty() {
                break;
            }
            for action in actions {
                self.apply(action);
            }
        }
        self.backend.listen(self.job.may_wait_on_memory());
        let (used, spilled) = self.backend.store_now();
        self.job.recorder().store_now(used, spilled);
        self.backend.after_pass(myself);
        if self.job.ended() {
            myself.stop(None);
        }
    }

    fn apply(&mut self, action: Action<Slice>) {
        match action {
            Action::Emit { part: slice, id } => {
                let id = self.backend.names_outputs().then_some(id);
                let output = JobItem::output(slice, id, self.job.one_at_a_time());
                if self.output.send(output).is_err() {
                    // The driver dropped the stream: the job is cancelled.
                    self.job.cancel();
                }
            }
            Action::End(result) => {
                self.backend.end(&mut self.job);
                let _ = self.output.send(JobItem::End(result));
            }
            Action::Drained => drop(self.output.send(JobItem::Drained)),
            other => self.backend.apply(other, &mut self.job),
        }
    }
}
