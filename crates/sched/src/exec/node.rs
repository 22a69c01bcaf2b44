//! The NodeManager: one per node. It owns the node's Workers, hands each task
//! to an idle one (spawning a worker when none is idle), keeps a stateful
//! stage's tasks on the workers that host its instances, and supervises:
//! a worker that fails is restarted and its task reported lost, so the
//! executor retries it.

use std::collections::{HashSet, VecDeque};
use std::time::Instant;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use streambatch_core::{JobId, NodeId, TaskId};

use crate::exec::msg::{NodeMsg, WorkerMsg};
use crate::exec::restart::{RestartPolicy, Restarts};
use crate::exec::task::{TaskEvent, TaskEvents, TaskRun};
use crate::exec::worker::{Worker, WorkerArgs, WorkerThreads};

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
    /// The task it runs (`None` while it sets up a pool) and where the
    /// task's job hears of it.
    busy: Option<(Option<TaskId>, TaskEvents)>,
    /// Stateful stages, by (job, stage), whose instances this worker holds.
    hosts: HashSet<(JobId, usize)>,
}

/// The NodeManager's state.
pub struct NodeState {
    workers: Vec<Slot>,
    waiting: VecDeque<(Box<TaskRun>, Option<usize>)>,
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
            NodeMsg::Run { run, pool } => state.waiting.push_back((run, pool)),
            NodeMsg::WorkerIdle { index } => state.workers[index].busy = None,
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
                    slot.busy = Some((None, job.events.clone()));
                    slot.hosts.insert(key);
                    let msg = WorkerMsg::SetUp(job.clone(), stage);
                    slot.actor.cast(msg).map_err(|_| "worker mailbox closed")?;
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
        let (actor, _) = spawn_worker(&myself, index, state.id, &state.threads).await?;
        let slot = std::mem::replace(
            &mut state.workers[index],
            Slot {
                actor,
                busy: None,
                hosts: HashSet::new(),
            },
        );
        if let Some((Some(task), events)) = slot.busy {
            let _ = events.send_message(TaskEvent::Lost {
                task,
                message: reason,
            });
        }
        state.assign(&myself).await
    }
}

async fn spawn_worker(
    node: &ActorRef<NodeMsg>,
    index: usize,
    node_id: NodeId,
    threads: &WorkerThreads,
) -> Result<(ActorRef<WorkerMsg>, ractor::concurrency::JoinHandle<()>), ActorProcessingErr> {
    let args = WorkerArgs {
        index,
        node_id,
        node: node.clone(),
        threads: threads.clone(),
    };
    Ok(Actor::spawn_linked(None, Worker, args, node.get_cell()).await?)
}

impl NodeState {
    /// Hands waiting tasks to workers, in order, as far as workers allow.
    async fn assign(&mut self, myself: &ActorRef<NodeMsg>) -> Result<(), ActorProcessingErr> {
        let mut still_waiting = VecDeque::new();
        while let Some((run, pool)) = self.waiting.pop_front() {
            let key = (run.job.job, run.stage);
            match self.pick(key, pool, myself).await? {
                Some(index) => {
                    let slot = &mut self.workers[index];
                    slot.busy = Some((Some(run.task), run.job.events.clone()));
                    if pool.is_some() {
                        slot.hosts.insert((run.job.job, run.stage));
                    }
                    slot.actor
                        .cast(WorkerMsg::Run(run))
                        .map_err(|_| "worker mailbox closed")?;
                }
                None => still_waiting.push_back((run, pool)),
            }
        }
        self.waiting = still_waiting;
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
        let idle = |w: &Slot| w.busy.is_none();
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
            let setting_up = |w: &Slot| w.hosts.contains(&key) && matches!(w.busy, Some((None, _)));
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
        let (actor, _) = spawn_worker(myself, index, self.id, &self.threads).await?;
        self.workers.push(Slot {
            actor,
            busy: None,
            hosts: HashSet::new(),
        });
        Ok(Some(index))
    }
}
