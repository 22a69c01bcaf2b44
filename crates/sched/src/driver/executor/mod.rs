//! The Executor: one actor per job, a thin shell around the job's
//! [`JobState`]. It feeds the state every event its tasks report, then
//! carries out the decisions the state returns: tasks go to a node,
//! outputs of the last stage stream to the driver as soon as they exist.
//!
//! It runs in the process that submitted the job. Its tasks run either on
//! the embedded node of that process ([`Local`]) or on the nodes of a
//! cluster ([`Remote`]), reached through their agents.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use streambatch_core::{JobId, NodeConfig, TaskId};
use streambatch_plan::{Error, ExecPlan, JobStats, KeySample};
use streambatch_store::ObjectStore;

use crate::driver::msg::{ExecutorMsg, JobItem};
use crate::driver::remote::{OrderError, RemoteNode, part_spec};
use crate::exec::budget::{Budgets, StageTotals};
use crate::exec::msg::NodeMsg;
use crate::exec::partition::{RemotePart, RemoteSource, Slice};
use crate::exec::task::{JobCtx, TaskEvent, TaskRun};
use crate::job::record::Recorder;
use crate::job::{Action, FailurePolicy, JobState, Memory, Origin, Part, RunInput, StageShape};
use crate::wire::{Happened, InputSpec, JobKey, JobOrder, KeyRangeSpec, NodeEvent, StoreView};

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

/// Nodes that took a running job, waiting for its executor to add them.
pub(crate) type Joining = Arc<std::sync::Mutex<Vec<RemoteNode>>>;

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
    backend: Backend,
    output: Sender<JobItem>,
}

enum Backend {
    Local(Local),
    Remote(Remote),
}

/// Tasks on this process's node.
struct Local {
    ctx: Arc<JobCtx>,
    manager: ActorRef<NodeMsg>,
    store: Arc<dyn ObjectStore>,
    /// Paused tasks, holding their pending outputs, until resumed.
    paused: HashMap<TaskId, Box<TaskRun>>,
    /// A task could not be sent: the node manager has stopped.
    manager_stopped: bool,
    /// Splits after a starting task's whose first bytes are fetched ahead
    /// ([`READ_AHEAD_PER_SLOT`] per slot).
    read_ahead: usize,
    /// Per stage, one past the last split read ahead.
    read_ahead_to: Vec<usize>,
    /// Owns what this job reads ahead.
    read_ahead_owner: streambatch_plan::ReadAheadOwner,
}

impl Drop for Local {
    /// What was read ahead for tasks that never read it (never started, or
    /// cancelled first) is let go.
    fn drop(&mut self) {
        streambatch_plan::forget_read_ahead(self.read_ahead_owner);
    }
}

/// Tasks the embedded node may hold per slot beyond those running (see
/// `JobState::queueing`).
const QUEUED_PER_SLOT: usize = 4;

/// Splits the embedded node reads ahead per slot (`read_ahead.rs` in the
/// plan crate): more hide more of a store's latency. W4 from S3 with each
/// request answered 20 ms late, on 2 slots, ran 1.26x, 1.57x and 1.83x
/// as fast as without, reading 1, 2 and 4 splits ahead.
const READ_AHEAD_PER_SLOT: usize = 2;

/// How long a job whose node manager stopped waits for the Supervisor to
/// say why before it fails with `Error::NodeStopped`.
const MANAGER_STOPPED_AFTER: std::time::Duration = std::time::Duration::from_millis(500);

/// Tasks on cluster nodes.
struct Remote {
    key: JobKey,
    nodes: Vec<RemoteNode>,
    source: Arc<dyn RemoteSource>,
    /// Per node: the job's budgets there, as this executor accounts them
    /// (each node enforces its own; these steer the decisions).
    shadows: Vec<Budgets>,
    /// Per node: its store as its last event saw it.
    stores: Vec<StoreView>,
    /// Each stage's memory reserve, for the budgets of a node that joins.
    reserve: Vec<u64>,
    joining: Joining,
    /// Per node: it was lost (its events are not heard any more).
    gone: Vec<bool>,
    /// Partitions asked to move off a draining node, by holder and id:
    /// which output they are, of which stage, and whether their cut goes
    /// with them (`JobOrder::Adopt.with_cut`).
    adopting: HashMap<(String, u64), (Origin, usize, bool)>,
}

/// Memory as the local store and the job's budgets have it now.
struct LiveMemory<'a> {
    budgets: &'a Budgets,
    store: &'a dyn ObjectStore,
}

impl Memory for LiveMemory<'_> {
    fn fits(&self, _node: usize, stage: usize, bytes: u64) -> bool {
        let store = self.store.stats();
        let free = store.capacity_bytes.saturating_sub(store.used_bytes);
        self.budgets.fits(stage, bytes) && bytes <= free
    }

    fn frees(&self, _node: usize) -> u64 {
        self.store.stats().frees
    }

    fn held(&self, stage: usize) -> u64 {
        self.budgets.used(stage)
    }

    fn capacity(&self, _node: usize) -> u64 {
        self.budgets.capacity()
    }

    fn outside(&self, _node: usize) -> u64 {
        self.budgets.outside()
    }
}

impl Memory for Remote {
    fn fits(&self, node: usize, stage: usize, bytes: u64) -> bool {
        let store = self.stores[node];
        self.shadows[node].fits(stage, bytes) && bytes <= store.capacity.saturating_sub(store.used)
    }

    fn frees(&self, node: usize) -> u64 {
        self.stores[node].frees
    }

    fn held(&self, stage: usize) -> u64 {
        self.shadows.first().map_or(0, |b| b.totals().held(stage))
    }

    fn capacity(&self, node: usize) -> u64 {
        self.stores[node].capacity
    }

    fn outside(&self, _node: usize) -> u64 {
        0
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
        let me = myself.clone();
        let events = myself.get_derived();
        let notify = move || -> Arc<dyn Fn() + Send + Sync> {
            let me = myself.clone();
            Arc::new(move || {
                let _ = me.cast(ExecutorMsg::MemoryFreed);
            })
        };
        let names = plan.stages.iter().map(|s| s.name.clone()).collect();
        let mut shapes: Vec<StageShape> = plan.stages.iter().map(StageShape::of).collect();
        let failures = FailurePolicy::of(&args.config);
        let (backend, free, capacity, target_bytes) = match args.nodes {
            Nodes::Local { manager, store } => {
                let capacity = store.stats().capacity_bytes;
                let (target_bytes, reserve) =
                    plan.sizing(args.config.target_partition_bytes, capacity);
                let budgets = Budgets::new(capacity, reserve, notify());
                let ctx = Arc::new(JobCtx {
                    job: args.job,
                    plan: plan.clone(),
                    store: store.clone(),
                    budgets,
                    events,
                    target_bytes,
                    cancelled: plan.stages.iter().map(|_| Default::default()).collect(),
                });
                let slots = args.config.slots();
                let local = Local {
                    ctx,
                    manager,
                    store,
                    paused: HashMap::new(),
                    manager_stopped: false,
                    read_ahead: READ_AHEAD_PER_SLOT * (slots.cpus + slots.gpus).ceil() as usize,
                    read_ahead_to: vec![0; plan.stages.len()],
                    read_ahead_owner: streambatch_plan::ReadAheadOwner::new(),
                };
                let free = vec![slots];
                (Backend::Local(local), free, capacity, target_bytes)
            }
            Nodes::Remote {
                key,
                port,
                nodes,
                source,
                joining,
            } => {
                let _ = port.set(me.clone());
                let smallest = nodes.iter().map(|n| n.capacity).min().unwrap_or(1);
                let (target_bytes, reserve) =
                    plan.sizing(args.config.target_partition_bytes, smallest);
                let totals = StageTotals::new(reserve.len());
                let shadow = |n: &RemoteNode| {
                    Budgets::adding_to(totals.clone(), n.capacity, reserve.clone(), notify())
                };
                let shadows = nodes.iter().map(shadow).collect();
                let joined_reserve = reserve.clone();
                let stores = nodes
                    .iter()
                    .map(|n| StoreView {
                        capacity: n.capacity,
                        ..Default::default()
                    })
                    .collect();
                let free = nodes.iter().map(|n| n.slots).collect();
                let gone = vec![false; nodes.len()];
                let remote = Remote {
                    gone,
                    key,
                    nodes,
                    source,
                    shadows,
                    stores,
                    reserve: joined_reserve,
                    joining,
                    adopting: HashMap::new(),
                };
                let total = remote.nodes.iter().map(|n| n.capacity).sum();
                (Backend::Remote(remote), free, total, target_bytes)
            }
        };
        for (shape, stage) in shapes.iter_mut().zip(&plan.stages) {
            shape.input_held_cap = stage.input_held_cap(target_bytes);
        }
        // A cluster node's relay counts spills from the job's start itself.
        let (spilled, restored) = match &backend {
            Backend::Local(local) => {
                let store = local.store.stats();
                (store.spilled_bytes, store.restored_bytes)
            }
            Backend::Remote(_) => (0, 0),
        };
        let recorder = Recorder::new(args.live, names, capacity)
            .record_timeline(args.config.record_timeline)
            .store_before(spilled, restored);
        if let Backend::Remote(remote) = &backend {
            let names: Vec<String> = remote.nodes.iter().map(|n| n.name.clone()).collect();
            recorder.nodes(&names);
        }
        let job = JobState::new(shapes, free, failures, recorder);
        // A cluster job may lose nodes: it keeps what it needs to make
        // their partitions again. The embedded node queues a few tasks per
        // slot, so that a worker finishing a short task starts the next at
        // once instead of waiting for this actor to hear of it and decide
        // (a round trip between threads, about as long as a small task).
        let job = match &backend {
            Backend::Remote(_) => job.with_lineage(),
            Backend::Local(_) => {
                let slots = args.config.slots();
                let room = QUEUED_PER_SLOT * (slots.cpus + slots.gpus).ceil() as usize;
                job.queueing(0, room)
            }
        };
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
        #[cfg(feature = "failpoints")]
        if matches!(msg, ExecutorMsg::Task(_) | ExecutorMsg::Node(_)) {
            crate::exec::failpoint::executor(state.job_id());
        }
        match msg {
            ExecutorMsg::Task(event) => state.on_task_event(event),
            ExecutorMsg::Node(event) => state.on_node_event(event),
            ExecutorMsg::NodeLost(node) => state.on_node_lost(node),
            ExecutorMsg::HeadLost(node) => state.job.fail(Error::HeadLost { node }),
            ExecutorMsg::NodeJoined => {
                let joined = match &state.backend {
                    Backend::Remote(remote) => std::mem::take(
                        &mut *remote.joining.lock().unwrap_or_else(|p| p.into_inner()),
                    ),
                    Backend::Local(_) => Vec::new(),
                };
                for node in joined {
                    state.on_node_joined(node, myself.clone());
                }
            }
            ExecutorMsg::Cancel => state.job.cancel(),
            ExecutorMsg::Abort(error) => state.job.fail(error),
            ExecutorMsg::MemoryFreed => {}
            ExecutorMsg::Read { id, read } => state.job.on_read(id, read),
        }
        state.carry_out(&myself);
        Ok(())
    }
}

impl ExecState {
    #[cfg(feature = "failpoints")]
    fn job_id(&self) -> u64 {
        match &self.backend {
            Backend::Local(local) => local.ctx.job.0,
            Backend::Remote(remote) => remote.key.job,
        }
    }

    fn on_task_event(&mut self, event: TaskEvent) {
        let job = &mut self.job;
        match event {
            TaskEvent::Output { task, seq, slice } => job.on_output(task, seq, slice),
            TaskEvent::Paused(run) => {
                if let Some((from, to)) = run.ran {
                    job.recorder_mut().ran(run.task, from, to);
                }
                if job.on_paused(run.task, run.pending_bytes(), run.store_full_at)
                    && let Backend::Local(local) = &mut self.backend
                {
                    local.paused.insert(run.task, run);
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

    /// A node joins the running job: the others learn where it listens
    /// (to fetch its outputs), and it gets slots, a shadow budget and
    /// stats of its own.
    fn on_node_joined(&mut self, node: RemoteNode, me: ActorRef<ExecutorMsg>) {
        let Backend::Remote(remote) = &mut self.backend else {
            return;
        };
        let peer = JobOrder::Peer {
            name: node.name.clone(),
            addr: node.addr.clone(),
        };
        for other in &remote.nodes {
            let _ = other.order(&remote.key, peer.clone());
        }
        let notify = Arc::new(move || {
            let _ = me.cast(ExecutorMsg::MemoryFreed);
        });
        let totals = remote.shadows[0].totals().clone();
        let reserve = remote.reserve.clone();
        let shadow = Budgets::adding_to(totals, node.capacity, reserve, notify);
        remote.shadows.push(shadow);
        remote.stores.push(StoreView {
            capacity: node.capacity,
            ..Default::default()
        });
        remote.gone.push(false);
        self.job.recorder().node_joined(&node.name);
        let number = self.job.add_node(node.slots);
        debug_assert_eq!(number, remote.nodes.len());
        remote.nodes.push(node);
    }

    /// A node of the job is gone: what it ran and held is made again on
    /// the others (nothing, when it drained and held nothing the job needs).
    fn on_node_lost(&mut self, name: String) {
        let Backend::Remote(remote) = &mut self.backend else {
            return self.job.fail(Error::NodeLost { node: name });
        };
        if let Some(node) = remote.nodes.iter().position(|n| n.name == name) {
            remote.gone[node] = true;
            self.job.on_node_lost(node, &name);
        }
    }

    fn on_node_event(&mut self, event: NodeEvent) {
        let Backend::Remote(remote) = &mut self.backend else {
            return;
        };
        let Some(node) = remote.nodes.iter().position(|n| n.name == event.node) else {
            return;
        };
        if remote.gone[node] {
            return;
        }
        if let Happened::RelayFailed { message } = &event.happened {
            tracing::warn!(node = %event.node, %message, "the job's relay failed; the node is lost to the job");
            return self.on_node_lost(event.node);
        }
        remote.stores[node] = event.store;
        let pulled = event.pulled;
        let job = &mut self.job;
        // A node speaks only for the tasks placed on it.
        let task = match event.happened {
            Happened::Output { task, .. }
            | Happened::Errored { task, .. }
            | Happened::Paused { task, .. }
            | Happened::Finished { task, .. }
            | Happened::Lost { task, .. } => Some(TaskId(task)),
            Happened::Failed { .. }
            | Happened::MemoryFreed
            | Happened::Draining
            | Happened::Adopted { .. }
            | Happened::RelayFailed { .. } => None,
        };
        if task.is_some_and(|task| job.node_of(task) != Some(node)) {
            return;
        }
        job.recorder()
            .node_inputs(node, pulled.shared, pulled.quic, pulled.quic_bytes);
        job.recorder()
            .node_store(node, event.store.used, event.store.spilled);
        match event.happened {
            Happened::Output {
                task,
                seq,
                id,
                rows,
                bytes,
                groups,
                sample,
            } => {
                let sample = sample.map(|s| KeySample::from_parts(s.bytes, s.ends));
                let sample = match sample.transpose() {
                    Ok(sample) => sample,
                    Err(message) => {
                        let node = event.node;
                        return job.fail(Error::OnNode { node, message });
                    }
                };
                let task = TaskId(task);
                let stage = job.stage_of(task);
                let shadow = stage.map(|s| remote.shadows[node].force_admit(s, bytes));
                let part = RemotePart::new(
                    (node, event.node),
                    (id, rows as usize, bytes),
                    remote.source.clone(),
                    shadow,
                );
                let mut slice = Slice::remote(part);
                // Checked where the exchange reads them (the count, the
                // end); each start is kept within the rows as it is sliced.
                if !groups.is_empty() {
                    slice = slice.with_groups(groups.into());
                }
                if let Some(sample) = sample {
                    slice = slice.with_sample(Arc::new(sample));
                }
                job.on_output(task, seq, slice);
            }
            Happened::Paused {
                task,
                pending_bytes,
                store_full_at,
            } => {
                job.on_paused(TaskId(task), pending_bytes, store_full_at);
            }
            Happened::Finished { task, busy_us } => {
                if let Some(stage) = job.on_finished(TaskId(task)) {
                    let busy = std::time::Duration::from_micros(busy_us);
                    job.record_finished(stage, busy, Vec::new());
                    job.recorder().node_finished(node);
                }
            }
            Happened::Failed { message } => job.fail(Error::OnNode {
                node: event.node,
                message,
            }),
            Happened::Errored {
                message,
                user_error,
                ..
            } => {
                let error = Error::OnNode {
                    node: event.node,
                    message,
                };
                job.on_errored(task.expect("an errored task names it"), error, user_error)
            }
            Happened::Lost { task, message } => job.on_lost(TaskId(task), message),
            Happened::MemoryFreed => {}
            Happened::Draining => job.drain_node(node),
            Happened::Adopted {
                holder,
                from,
                id,
                rows,
                bytes,
                cut,
            } => {
                let adopting = remote.adopting.remove(&(holder.clone(), from));
                let Some((origin, stage, with_cut)) = adopting else {
                    return;
                };
                // A map output's cut must have come whole: a reducer's rows
                // are found by it. Else the copy goes, the output stays.
                if with_cut && cut != job.cut_fingerprint(origin) {
                    tracing::warn!(node = %event.node, %holder, partition = from, "a moved map output came with another cut; it stays where it was");
                    let source = remote.source.clone();
                    return source.release(&event.node, id);
                }
                let shadow = remote.shadows[node].force_admit(stage, bytes);
                let part = RemotePart::new(
                    (node, event.node),
                    (id, rows as usize, bytes),
                    remote.source.clone(),
                    Some(shadow),
                );
                job.on_moved(origin, Slice::remote(part));
            }
            Happened::RelayFailed { .. } => {} // handled above
        }
    }

    /// Sets up the first `min` workers of each stateful stage's pool (on
    /// the local node; a cluster node sets up its pools as tasks arrive).
    fn start_pools(&self) {
        let Backend::Local(local) = &self.backend else {
            return;
        };
        for (stage, spec) in self.plan.stages.iter().enumerate() {
            let Some(pool) = spec.options.pool else {
                continue;
            };
            if pool.min > 0 && !spec.stateful_ops().is_empty() {
                let msg = NodeMsg::SetUp {
                    job: local.ctx.clone(),
                    stage,
                    workers: pool.min,
                };
                let _ = local.manager.cast(msg);
            }
        }
    }

    /// Carries out the job state's decisions until it has none left; stops
    /// the actor once the job has ended.
    fn carry_out(&mut self, myself: &ActorRef<ExecutorMsg>) {
        self.listen(true);
        loop {
            let actions = match &self.backend {
                Backend::Local(local) => self.job.advance(&LiveMemory {
                    budgets: &local.ctx.budgets,
                    store: local.store.as_ref(),
                }),
                Backend::Remote(remote) => self.job.advance(remote),
            };
            if actions.is_empty() {
                break;
            }
            for action in actions {
                self.apply(action);
            }
        }
        self.listen(self.job.may_wait_on_memory());
        let (used, spilled) = self.store_now();
        self.job.recorder().store_now(used, spilled);
        if let Backend::Local(local) = &mut self.backend
            && std::mem::take(&mut local.manager_stopped)
        {
            // A manager that failed is reported by the Supervisor, with
            // why (`Abort`); one that stopped quietly, by this.
            myself.send_after(MANAGER_STOPPED_AFTER, || {
                ExecutorMsg::Abort(Error::NodeStopped)
            });
        }
        if self.job.ended() {
            myself.stop(None);
        }
    }

    /// Whether the job's budgets tell this executor of memory returned.
    fn listen(&self, on: bool) {
        match &self.backend {
            Backend::Local(local) => local.ctx.budgets.listen(on),
            Backend::Remote(remote) => remote.shadows.iter().for_each(|b| b.listen(on)),
        }
    }

    /// Bytes the job's stores hold in memory now, and have spilled so far.
    fn store_now(&self) -> (u64, u64) {
        match &self.backend {
            Backend::Local(local) => {
                let stats = local.store.stats();
                (stats.used_bytes, stats.spilled_bytes)
            }
            Backend::Remote(remote) => remote
                .stores
                .iter()
                .fold((0, 0), |(u, s), v| (u + v.used, s + v.spilled)),
        }
    }

    fn apply(&mut self, action: Action<Slice>) {
        match action {
            Action::Emit { part: slice, id } => {
                let id = matches!(self.backend, Backend::Remote(_)).then_some(id);
                let output = JobItem::output(slice, id, self.job.one_at_a_time());
                if self.output.send(output).is_err() {
                    // The driver dropped the stream: the job is cancelled.
                    self.job.cancel();
                }
            }
            Action::End(result) => {
                match &self.backend {
                    Backend::Local(local) => {
                        let store = local.store.stats();
                        self.job.recorder_mut().ended(
                            store.used_bytes,
                            store.spilled_bytes,
                            store.restored_bytes,
                        );
                        let msg = NodeMsg::JobEnded { job: local.ctx.job };
                        let _ = local.manager.cast(msg);
                    }
                    Backend::Remote(remote) => {
                        let (used, spilled) = self.store_now();
                        self.job.recorder_mut().ended(used, spilled, 0);
                        remote.tell_all(JobOrder::End);
                    }
                }
                let _ = self.output.send(JobItem::End(result));
            }
            Action::Drained => drop(self.output.send(JobItem::Drained)),
            other => match &mut self.backend {
                Backend::Local(local) => local.apply(other),
                Backend::Remote(remote) => remote.apply(other, &mut self.job),
            },
        }
    }
}

impl Local {
    fn apply(&mut self, action: Action<Slice>) {
        match action {
            Action::Start {
                task,
                stage,
                input,
                keep,
                may_spill,
                ..
            } => {
                // Splits start (run or queue here) in order
                // (`JobState::start`): the next ones' first bytes are
                // fetched meanwhile, each split's once.
                if let RunInput::Split(i) = input {
                    let to = &mut self.read_ahead_to[stage];
                    for next in (*to).max(i + 1)..=i + self.read_ahead {
                        self.ctx.plan.stages[stage].read_ahead(next, self.read_ahead_owner);
                    }
                    *to = (*to).max(i + self.read_ahead + 1);
                }
                let mut run = TaskRun::new(self.ctx.clone(), task, stage, input, keep);
                run.may_spill = may_spill;
                self.run(Box::new(run));
            }
            Action::Resume {
                task, may_spill, ..
            } => {
                if let Some(mut run) = self.paused.remove(&task) {
                    run.may_spill = may_spill;
                    self.run(run);
                }
            }
            Action::Cancel { stage } => {
                self.ctx.cancelled[stage].store(true, Ordering::Relaxed);
                self.paused
                    .retain(|_, run| run.stage != stage || run.remakes_only());
            }
            Action::FitReserve { stage, bytes } => self.ctx.budgets.fit_reserve(stage, bytes),
            Action::Move { .. } => unreachable!("one node does not drain"),
            Action::Emit { .. } | Action::End(_) | Action::Drained => {
                unreachable!("the executor's")
            }
        }
    }

    fn run(&mut self, run: Box<TaskRun>) {
        let pool = self.ctx.plan.stages[run.stage].options.pool.map(|p| p.max);
        if self.manager.cast(NodeMsg::Run { run, pool }).is_err() {
            self.manager_stopped = true;
        }
    }
}

impl Remote {
    fn apply(&mut self, action: Action<Slice>, job: &mut JobState<Slice>) {
        match action {
            Action::Start {
                task,
                stage,
                node,
                input,
                rows,
                keep,
                may_spill,
            } => {
                let (input, range) = match input {
                    RunInput::Split(i) => (InputSpec::Split(i as u64), None),
                    RunInput::Parts(parts, range) => (
                        InputSpec::Parts(parts.iter().map(part_spec).collect()),
                        range,
                    ),
                };
                let range = range.map(|r| KeyRangeSpec {
                    lo: r.lo.clone(),
                    hi: r.hi.clone(),
                });
                let order = JobOrder::Run {
                    task: task.0,
                    stage: stage as u64,
                    input,
                    keep_from: keep.from,
                    keep_again: keep.again,
                    may_spill,
                    range,
                    rows,
                };
                self.tell(node, order, job);
            }
            Action::Resume {
                task,
                node,
                may_spill,
            } => {
                let order = JobOrder::Resume {
                    task: task.0,
                    may_spill,
                };
                self.tell(node, order, job);
            }
            Action::Cancel { stage } => self.tell_all(JobOrder::Cancel {
                stage: stage as u64,
            }),
            Action::FitReserve { stage, bytes } => {
                for shadow in &self.shadows {
                    shadow.fit_reserve(stage, bytes);
                }
                self.tell_all(JobOrder::FitReserve {
                    stage: stage as u64,
                    bytes,
                });
            }
            Action::Move {
                origin,
                stage,
                part: slice,
                to,
            } => {
                let part = slice
                    .remote_part()
                    .expect("a cluster job's partitions are on its nodes");
                let with_cut = slice.cut_at_holder();
                let (holder, id) = (part.holder.clone(), part.id);
                let order = JobOrder::Adopt {
                    holder: holder.clone(),
                    id,
                    rows: part.rows as u64,
                    stage: stage as u64,
                    with_cut,
                };
                self.adopting
                    .insert((holder, id), (origin, stage, with_cut));
                self.tell(to, order, job);
            }
            Action::Emit { .. } | Action::End(_) | Action::Drained => {
                unreachable!("the executor's")
            }
        }
    }

    /// Sends `node` an order; a node that cannot be reached is lost.
    fn tell(&mut self, node: usize, order: JobOrder, job: &mut JobState<Slice>) {
        let target = &self.nodes[node];
        match target.order(&self.key, order) {
            Ok(()) => {}
            Err(OrderError::Gone) => {
                self.gone[node] = true;
                job.on_node_lost(node, &target.name.clone());
            }
            Err(too_large) => job.fail(too_large.why(&target.name)),
        }
    }

    fn tell_all(&self, order: JobOrder) {
        for (node, gone) in self.nodes.iter().zip(&self.gone) {
            if !gone {
                let _ = node.order(&self.key, order.clone());
            }
        }
    }
}
