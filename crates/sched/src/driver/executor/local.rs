//! The executor's local backend: a job whose tasks run on the embedded node
//! of this process. Tasks go to its NodeManager as `TaskRun`s, paused ones
//! are held here until resumed, the node's store and the job's budgets are
//! its memory, and the splits after a starting task's are read ahead.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ractor::ActorRef;
use streambatch_core::{NodeConfig, TaskId};
use streambatch_plan::{Error, ExecPlan};
use streambatch_store::ObjectStore;

use crate::driver::executor::{Backend, Opened, Opening, memory_freed};
use crate::driver::msg::ExecutorMsg;
use crate::exec::budget::Budgets;
use crate::exec::msg::NodeMsg;
use crate::exec::partitioner::Slice;
use crate::exec::task::{JobCtx, TaskRun};
use crate::job::{Action, JobState, Memory, RunInput, Start};

/// Tasks on this process's node.
pub(super) struct Local {
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

/// Memory as the local store and the job's budgets have it now.
impl Memory for Local {
    fn fits(&self, _node: usize, stage: usize, bytes: u64) -> bool {
        let store = self.store.stats();
        let free = store.capacity_bytes.saturating_sub(store.used_bytes);
        self.ctx.budgets.fits(stage, bytes) && bytes <= free
    }

    fn frees(&self, _node: usize) -> u64 {
        self.store.stats().frees
    }

    fn held(&self, stage: usize) -> u64 {
        self.ctx.budgets.used(stage)
    }

    fn capacity(&self, _node: usize) -> u64 {
        self.ctx.budgets.capacity()
    }

    fn outside(&self, _node: usize) -> u64 {
        self.ctx.budgets.outside()
    }
}

impl Local {
    /// Opens the job on the embedded node `manager`, storing into `store`.
    pub(super) fn open(
        opening: Opening<'_>,
        manager: ActorRef<NodeMsg>,
        store: Arc<dyn ObjectStore>,
    ) -> Opened {
        let Opening {
            job,
            plan,
            config,
            myself,
        } = opening;
        let capacity = store.stats().capacity_bytes;
        let (target_bytes, reserve) = plan.sizing(config.target_partition_bytes, capacity);
        let budgets = Budgets::new(capacity, reserve, memory_freed(myself));
        let events = myself.get_derived();
        let ctx = JobCtx::new(
            job,
            plan.clone(),
            store.clone(),
            budgets,
            events,
            target_bytes,
        );
        let slots = config.slots();
        let local = Local {
            ctx: Arc::new(ctx),
            manager,
            store,
            paused: HashMap::new(),
            manager_stopped: false,
            read_ahead: READ_AHEAD_PER_SLOT * (slots.cpus + slots.gpus).ceil() as usize,
            read_ahead_to: vec![0; plan.stages.len()],
            read_ahead_owner: streambatch_plan::ReadAheadOwner::new(),
        };
        let store = local.store.stats();
        Opened {
            store_before: (store.spilled_bytes, store.restored_bytes),
            backend: Box::new(local),
            free: vec![slots],
            capacity,
            target_bytes,
        }
    }

    /// Starts a task: splits start (run or queue here) in order
    /// (`JobState::start`), and the next ones' first bytes are fetched
    /// meanwhile, each split's once.
    fn start(&mut self, start: Start<Slice>) {
        if let RunInput::Split(i) = start.input {
            let stage = start.stage;
            let to = &mut self.read_ahead_to[stage];
            for next in (*to).max(i + 1)..=i + self.read_ahead {
                self.ctx.plan.stages[stage].read_ahead(next, self.read_ahead_owner);
            }
            *to = (*to).max(i + self.read_ahead + 1);
        }
        let (task, stage) = (start.task, start.stage);
        let mut run = TaskRun::new(self.ctx.clone(), task, stage, start.input, start.keep);
        run.may_spill = start.may_spill;
        self.run(Box::new(run));
    }

    fn run(&mut self, run: Box<TaskRun>) {
        let pool = self.ctx.plan.stages[run.stage].options.pool.map(|p| p.max);
        if self.manager.cast(NodeMsg::Run { run, pool }).is_err() {
            self.manager_stopped = true;
        }
    }
}

impl Backend for Local {
    #[cfg(feature = "failpoints")]
    fn job_id(&self) -> u64 {
        self.ctx.job.0
    }

    /// The embedded node queues a few tasks per slot, so that a worker
    /// finishing a short task starts the next at once instead of waiting
    /// for this actor to hear of it and decide (a round trip between
    /// threads, about as long as a small task).
    fn configure(&self, job: JobState<Slice>, config: &NodeConfig) -> JobState<Slice> {
        let slots = config.slots();
        let room = QUEUED_PER_SLOT * (slots.cpus + slots.gpus).ceil() as usize;
        job.queueing(0, room)
    }

    /// Sets up the first `min` workers of each stateful stage's pool (a
    /// cluster node sets up its pools as tasks arrive).
    fn start_pools(&self, plan: &ExecPlan) {
        for (stage, spec) in plan.stages.iter().enumerate() {
            let Some(pool) = spec.options.pool else {
                continue;
            };
            if pool.min > 0 && !spec.stateful_ops().is_empty() {
                let msg = NodeMsg::SetUp {
                    job: self.ctx.clone(),
                    stage,
                    workers: pool.min,
                };
                let _ = self.manager.cast(msg);
            }
        }
    }

    fn advance(&self, job: &mut JobState<Slice>) -> Vec<Action<Slice>> {
        job.advance(self)
    }

    fn listen(&self, on: bool) {
        self.ctx.budgets.listen(on);
    }

    fn store_now(&self) -> (u64, u64) {
        let stats = self.store.stats();
        (stats.used_bytes, stats.spilled_bytes)
    }

    fn after_pass(&mut self, myself: &ActorRef<ExecutorMsg>) {
        if std::mem::take(&mut self.manager_stopped) {
            // A manager that failed is reported by the Supervisor, with
            // why (`Abort`); one that stopped quietly, by this.
            myself.send_after(MANAGER_STOPPED_AFTER, || {
                ExecutorMsg::Abort(Error::NodeStopped)
            });
        }
    }

    fn names_outputs(&self) -> bool {
        false
    }

    fn apply(&mut self, action: Action<Slice>, _job: &mut JobState<Slice>) {
        match action {
            Action::Start(start) => self.start(start),
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

    fn end(&self, job: &mut JobState<Slice>) {
        let store = self.store.stats();
        job.recorder_mut()
            .ended(store.used_bytes, store.spilled_bytes, store.restored_bytes);
        let msg = NodeMsg::JobEnded { job: self.ctx.job };
        let _ = self.manager.cast(msg);
    }

    fn paused(&mut self, run: Box<TaskRun>) {
        self.paused.insert(run.task, run);
    }

    /// The embedded node is the job's only one: the job cannot go on.
    fn node_lost(&mut self, job: &mut JobState<Slice>, name: String) {
        job.fail(Error::NodeLost { node: name });
    }
}
