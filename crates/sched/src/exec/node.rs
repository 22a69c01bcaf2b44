//! The NodeManager: one per node. It owns the node's Workers and its board
//! (`board`): a task any worker may run goes on the board, where the next
//! worker free takes it (a worker is added while more tasks could start
//! than workers wait); a stateful stage's task goes to a worker that hosts
//! its instances. It supervises: a worker that fails is restarted and its
//! task reported lost, so the executor retries it.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Instant;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use streambatch_core::{JobId, NodeId, Resources};

use crate::exec::board::{Board, NOTHING};
use crate::exec::msg::{NodeMsg, Work, WorkerMsg};
use crate::exec::restart::{RestartPolicy, Restarts};
use crate::exec::task::{TaskEvent, TaskRun};
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
    /// The node's CPU and GPU slots: no more runs at once.
    pub(crate) capacity: Resources,
    /// Where the board counts the tasks holding a slot (the node's metrics).
    pub(crate) busy: Arc<AtomicUsize>,
}

struct Slot {
    actor: ActorRef<WorkerMsg>,
    /// Stateful stages, by (job, stage), whose instances this worker holds.
    hosts: HashSet<(JobId, usize)>,
}

/// The NodeManager's state.
pub struct NodeState {
    workers: Vec<Slot>,
    board: Arc<Board>,
    /// Tasks of stateful stages waiting for a worker of their pool, with
    /// the pool's size.
    waiting: VecDeque<(Box<TaskRun>, usize)>,
    /// Its workers' failures, against `RestartPolicy::WORKER`.
    restarts: Restarts,
    id: NodeId,
    threads: WorkerThreads,
}

impl Drop for NodeState {
    fn drop(&mut self) {
        // However the manager ends, its workers' threads end with it.
        self.board.close();
    }
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
            board: Arc::new(Board::new(args.capacity, args.busy)),
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
        state.board.close();
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
            NodeMsg::Run { run, pool: None } => {
                if state.board.post(run) {
                    state.add_worker(&myself).await?;
                }
            }
            NodeMsg::Run {
                run,
                pool: Some(max),
            } => state.waiting.push_back((run, max)),
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
                    state.workers[index].hosts.insert(key);
                    let events = job.events.clone();
                    let work = Work::SetUp(job.clone(), stage);
                    state.board.direct(index, work, NOTHING, None, events);
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
        let (running, handed) = state.board.lost(index);
        let actor = state.spawn_worker(&myself, index).await?;
        state.workers[index] = Slot {
            actor,
            hosts: HashSet::new(),
        };
        if let Some(running) = running
            && let Some(task) = running.task
        {
            let _ = running.events.send_message(TaskEvent::Lost {
                task,
                message: reason,
            });
        }
        // A pool's task handed to the worker and not begun waits again.
        if let Some(run) = handed {
            let pool = run.job.plan.stages[run.stage].options.pool;
            let max = pool.map_or(1, |p| p.max);
            state.waiting.push_front((run, max));
        }
        state.assign(&myself).await
    }
}

impl NodeState {
    /// Starts the worker of seat `index` on the board.
    fn spawn_worker(
        &self,
        node: &ActorRef<NodeMsg>,
        index: usize,
    ) -> impl Future<Output = Result<ActorRef<WorkerMsg>, ActorProcessingErr>> + Send + use<> {
        let args = WorkerArgs {
            index,
            node_id: self.id,
            node: node.clone(),
            threads: self.threads.clone(),
            board: self.board.clone(),
        };
        // The future holds nothing of `self` (the state is not `Sync`).
        let supervisor = node.get_cell();
        async move {
            let (actor, _) = Actor::spawn_linked(None, Worker, args, supervisor).await?;
            Ok(actor)
        }
    }

    /// A new worker, on a new seat of the board; its index.
    async fn add_worker(&mut self, node: &ActorRef<NodeMsg>) -> Result<usize, ActorProcessingErr> {
        let index = self.board.add_worker();
        debug_assert_eq!(index, self.workers.len());
        let actor = self.spawn_worker(node, index).await?;
        self.workers.push(Slot {
            actor,
            hosts: HashSet::new(),
        });
        Ok(index)
    }

    /// Hands waiting tasks of stateful stages to their pools' workers, in
    /// order, as far as workers allow. What waits is counted on the board
    /// first, so that a worker going idle meanwhile says so.
    async fn assign(&mut self, myself: &ActorRef<NodeMsg>) -> Result<(), ActorProcessingErr> {
        self.board.set_held(self.waiting.len());
        let mut still_waiting = VecDeque::new();
        while let Some((run, max)) = self.waiting.pop_front() {
            let key = (run.job.job, run.stage);
            match self.pick(key, Some(max), myself).await? {
                Some(index) => {
                    self.workers[index].hosts.insert(key);
                    let resources = run.job.plan.stages[run.stage].options.resources;
                    let (task, events) = (Some(run.task), run.job.events.clone());
                    self.board
                        .direct(index, Work::Task(run), resources, task, events);
                }
                None => still_waiting.push_back((run, max)),
            }
        }
        self.waiting = still_waiting;
        self.board.set_held(self.waiting.len());
        Ok(())
    }

    /// The worker for a task of stage `key`: for a pool of `pool` workers,
    /// an idle worker already hosting it, or a new host while the pool has
    /// room; otherwise (a set-up) any idle worker, preferring ones that
    /// host no pool. Adds a worker when needed.
    async fn pick(
        &mut self,
        key: (JobId, usize),
        pool: Option<usize>,
        myself: &ActorRef<NodeMsg>,
    ) -> Result<Option<usize>, ActorProcessingErr> {
        let board = &self.board;
        let idle = |(i, _): &(usize, &Slot)| board.is_idle(*i);
        let hosts = |(_, w): &(usize, &Slot)| w.hosts.contains(&key);
        if let Some(max) = pool {
            if let Some((i, _)) = self
                .workers
                .iter()
                .enumerate()
                .find(|w| idle(w) && hosts(w))
            {
                return Ok(Some(i));
            }
            // A host still setting up will be ready soon: wait for it
            // rather than set up one more.
            let setting_up = |w: &(usize, &Slot)| hosts(w) && board.sets_up(w.0);
            if self.workers.iter().enumerate().any(|w| setting_up(&w)) {
                return Ok(None);
            }
            if self.workers.iter().enumerate().filter(hosts).count() >= max {
                return Ok(None);
            }
        }
        let free_of_pools = |(_, w): &(usize, &Slot)| w.hosts.is_empty();
        let candidates = || self.workers.iter().enumerate();
        if let Some((i, _)) = candidates().find(|w| idle(w) && free_of_pools(w)) {
            return Ok(Some(i));
        }
        if let Some((i, _)) = candidates().find(|w| idle(w) && !hosts(w)) {
            return Ok(Some(i));
        }
        self.add_worker(myself).await.map(Some)
    }
}
