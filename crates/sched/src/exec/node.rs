//! The NodeManager: one per node. It owns the node's Workers, hands each task
//! to an idle one (spawning a worker when none is idle), keeps a stateful
//! stage's tasks on the workers that host its instances, and supervises:
//! a worker that fails is restarted and its task reported lost, so the
//! executor retries it.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Instant;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use streambatch_core::{JobId, NodeId, TaskId};

use crate::exec::msg::{NodeMsg, Work, WorkerMsg};
use crate::exec::restart::{RestartPolicy, Restarts};
use crate::exec::task::{TaskEvent, TaskEvents, TaskRun};
use crate::exec::worker::{Idle, Worker, WorkerArgs, WorkerThreads};

/// The NodeManager actor.
pub(crate) struct NodeManager;

/// What a NodeManager is started with.
#[derive(Clone)]
pub(crate) struct NodeArgs {
    /// The node's id, named in every task's span.
    pub(crate) id: NodeId,
    /// Where its workers register their threads.
    pub(crate) threads: WorkerThreads,
}

struct Slot {
    actor: ActorRef<WorkerMsg>,
    /// Its thread's work.
    work: mpsc::Sender<Work>,
    /// Set by its thread when done.
    idle: Arc<Idle>,
    /// The task it was last handed (`None` for a pool's set-up) and where
    /// the task's job hears of it; current while the worker is not idle.
    busy: Option<(Option<TaskId>, TaskEvents)>,
    /// Stateful stages, by (job, stage), whose instances this worker holds.
    hosts: HashSet<(JobId, usize)>,
}

/// The NodeManager's state.
pub struct NodeState {
    workers: Vec<Slot>,
    waiting: VecDeque<(Box<TaskRun>, Option<usize>)>,
    /// How many wait, for the workers (see `Idle`).
    waiting_count: Arc<AtomicUsize>,
    /// Its workers' failures, against `RestartPolicy::WORKER`.
    restarts: Restarts,
    id: NodeId,
    threads: WorkerThreads,
}

impl Actor for NodeManager {
    type Msg = NodeMsg;
    type State = NodeState;
    type Arguments = NodeArgs;

    async fn pre_start(
        &self,
        _: ActorRef<NodeMsg>,
        args: NodeArgs,
    ) -> Result<NodeState, ActorProcessingErr> {
        Ok(NodeState {
            workers: Vec::new(),
            waiting: VecDeque::new(),
            waiting_count: Arc::default(),
            restarts: Restarts::new(RestartPolicy::WORKER),
            id: args.id,
            threads: args.threads,
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<NodeMsg>,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        for w in &state.workers {
            w.actor.stop(None);
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<NodeMsg>,
        msg: NodeMsg,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            NodeMsg::Run { run, pool } => {
                state.waiting.push_back((run, pool));
                state.count_waiting();
            }
            NodeMsg::WorkerIdle => {}
            NodeMsg::SetUp {
                job,
                stage,
                workers,
            } => {
                let key = (job.job, stage);
                for _ in 0..workers {
                    let Some(index) = state.pick(key, None, &myself).await? else {
                        break;
                    };
                    let slot = &mut state.workers[index];
                    slot.hosts.insert(key);
                    slot.hand((None, job.events.clone()), Work::SetUp(job.clone(), stage))?;
                }
            }
            NodeMsg::JobEnded { job } => {
                for w in &mut state.workers {
                    w.hosts.retain(|(j, _)| *j != job);
                }
            }
        }
        state.assign(&myself).await
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<NodeMsg>,
        event: SupervisionEvent,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, reason) = match event {
            SupervisionEvent::ActorFailed(cell, err) => (cell, err.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.unwrap_or_else(|| "worker stopped".into()))
            }
            _ => return Ok(()),
        };
        let Some(index) = state
            .workers
            .iter()
            .position(|w| w.actor.get_id() == cell.get_id())
        else {
            return Ok(());
        };
        // Workers restart at once (the policy's backoff is zero); past its
        // limit the manager fails, and its supervisor decides.
        if let Err(limit) = state.restarts.failed(Instant::now()) {
            return Err(format!("its workers failed too often: {limit}; last: {reason}").into());
        }
        tracing::warn!(worker = index, %reason, "worker failed; restarting it");
        let fresh = state.spawn_worker(&myself, index).await?;
        let slot = std::mem::replace(&mut state.workers[index], fresh);
        if !slot.idle.is_idle()
            && let Some((Some(task), events)) = slot.busy
        {
            let _ = events.send_message(TaskEvent::Lost {
                task,
                message: reason,
            });
        }
        state.assign(&myself).await
    }
}

impl Slot {
    fn is_idle(&self) -> bool {
        self.idle.is_idle()
    }

    /// Hands the worker's thread `work` for `busy`.
    fn hand(
        &mut self,
        busy: (Option<TaskId>, TaskEvents),
        work: Work,
    ) -> Result<(), ActorProcessingErr> {
        self.busy = Some(busy);
        self.idle.take();
        self.work
            .send(work)
            .map_err(|_| "worker thread has exited")?;
        Ok(())
    }
}

impl NodeState {
    /// A new worker (a restarted one keeps its index).
    fn spawn_worker(
        &self,
        node: &ActorRef<NodeMsg>,
        index: usize,
    ) -> impl Future<Output = Result<Slot, ActorProcessingErr>> + Send + use<> {
        let (work, inbox) = mpsc::channel();
        let idle = Arc::new(Idle::new(self.waiting_count.clone()));
        let args = WorkerArgs {
            index,
            node_id: self.id,
            node: node.clone(),
            threads: self.threads.clone(),
            inbox,
            idle: idle.clone(),
        };
        // The future holds nothing of `self` (the state is not `Sync`).
        let supervisor = node.get_cell();
        async move {
            let (actor, _) = Actor::spawn_linked(None, Worker, args, supervisor).await?;
            Ok(Slot {
                actor,
                work,
                idle,
                busy: None,
                hosts: HashSet::new(),
            })
        }
    }

    /// Publishes how many tasks wait, before looking for idle workers.
    fn count_waiting(&self) {
        self.waiting_count
            .store(self.waiting.len(), Ordering::SeqCst);
    }

    /// Hands waiting tasks to workers, in order, as far as workers allow.
    async fn assign(&mut self, myself: &ActorRef<NodeMsg>) -> Result<(), ActorProcessingErr> {
        let mut still_waiting = VecDeque::new();
        while let Some((run, pool)) = self.waiting.pop_front() {
            let key = (run.job.job, run.stage);
            match self.pick(key, pool, myself).await? {
                Some(index) => {
                    let slot = &mut self.workers[index];
                    if pool.is_some() {
                        slot.hosts.insert((run.job.job, run.stage));
                    }
                    let busy = (Some(run.task), run.job.events.clone());
                    slot.hand(busy, Work::Task(run))?;
                }
                None => still_waiting.push_back((run, pool)),
            }
        }
        self.waiting = still_waiting;
        self.count_waiting();
        Ok(())
    }

    /// The worker for `run`: for a pooled stage, an idle worker already
    /// hosting it, or a new host while the pool has room; otherwise any idle
    /// worker, preferring ones that host no pool. Spawns a worker when needed.
    async fn pick(
        &mut self,
        key: (JobId, usize),
        pool: Option<usize>,
        myself: &ActorRef<NodeMsg>,
    ) -> Result<Option<usize>, ActorProcessingErr> {
        let idle = Slot::is_idle;
        if let Some(max) = pool {
            if let Some(i) = self
                .workers
                .iter()
                .position(|w| idle(w) && w.hosts.contains(&key))
            {
                return Ok(Some(i));
            }
            // A host still setting up will be ready soon: wait for it
            // rather than set up one more.
            let setting_up = |w: &Slot| {
                w.hosts.contains(&key) && !w.is_idle() && matches!(w.busy, Some((None, _)))
            };
            if self.workers.iter().any(setting_up) {
                return Ok(None);
            }
            if self
                .workers
                .iter()
                .filter(|w| w.hosts.contains(&key))
                .count()
                >= max
            {
                return Ok(None);
            }
        }
        if let Some(i) = self
            .workers
            .iter()
            .position(|w| idle(w) && w.hosts.is_empty())
        {
            return Ok(Some(i));
        }
        if let Some(i) = self
            .workers
            .iter()
            .position(|w| idle(w) && !w.hosts.contains(&key))
        {
            return Ok(Some(i));
        }
        let index = self.workers.len();
        let slot = self.spawn_worker(myself, index).await?;
        self.workers.push(slot);
        Ok(Some(index))
    }
}
