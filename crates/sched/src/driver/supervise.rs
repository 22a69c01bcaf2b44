//! The `Supervisor` at the root of a process that runs jobs (the embedded
//! node, a cluster driver); the restart policies it applies are
//! `exec::restart`'s. A cluster node's root is `cluster::root::NodeRoot`;
//! docs/architecture.md draws every tree.
//!
//! What the Supervisor's children cost when they fail:
//!
//! - the embedded node's `NodeManager` is started again after a backoff,
//!   within `RestartPolicy::NODE_MANAGER`. The tasks its workers ran are
//!   lost, and a late report of one could not be told from its retry's, so
//!   the jobs running on it end with [`Error::ActorFailed`]; the store and
//!   its partitions outlive it, and the next job runs on the new manager;
//! - an `Executor` is not started again: its job state is the job, and a
//!   new one would deliver rows twice. Its job ends with
//!   [`Error::ActorFailed`] and everything it held, here and on the nodes,
//!   is freed;
//! - a `JobPort`, or a driver's transport (`NodeServer`), is not started
//!   again: the jobs that depend on it end with [`Error::ActorFailed`].

use std::collections::HashMap;
use std::sync::mpsc::Sender;
use std::time::Instant;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use streambatch_core::JobId;
use streambatch_plan::Error;

use crate::driver::executor::{Executor, ExecutorArgs, Nodes};
use crate::driver::msg::{ExecutorMsg, JobItem};
use crate::driver::port::{ExecutorCell, JobPort};
use crate::exec::msg::NodeMsg;
use crate::exec::node::{NodeArgs, NodeManager};
use crate::exec::restart::{RestartPolicy, Restarts};
use crate::wire::JobKey;
use crate::wire::msg::PortMsg;

/// The error that ends a job because `actor` failed.
fn failed(actor: &str, reason: impl Into<String>) -> Error {
    Error::ActorFailed {
        actor: actor.into(),
        reason: reason.into(),
    }
}

/// The Supervisor actor.
pub(crate) struct Supervisor;

/// What it is started with.
pub(crate) struct SupervisorArgs {
    /// The embedded node's manager, supervised here; `None` on a driver.
    pub(crate) manager: Option<NodeArgs>,
}

/// Messages of the Supervisor.
pub(crate) enum SupervisorMsg {
    /// Starts a job of the embedded node: its executor, made by `job` for
    /// the current manager, as a child.
    StartLocalJob { job: LocalJob, reply: JobReply },
    /// Starts a cluster job's executor as a child; `end` frees what the
    /// job holds on its nodes, should the executor fail.
    StartJob {
        args: Box<ExecutorArgs>,
        end: Box<dyn FnOnce() + Send>,
        reply: JobReply,
    },
    /// Opens a job's port as a child.
    OpenPort {
        key: JobKey,
        executor: ExecutorCell,
        reply: RpcReplyPort<Result<ActorRef<PortMsg>, Error>>,
    },
    /// A driver's transport: its NodeServer is a child from now on.
    Transport(ActorId),
    /// Starts the manager again (sent after its backoff).
    RestartManager,
}

impl ractor::Message for SupervisorMsg {}

/// Where a job's start is answered: its executor, or why it did not start.
type JobReply = RpcReplyPort<Result<ActorRef<ExecutorMsg>, Error>>;

/// A running job, as its supervisor knows it.
struct Job {
    id: JobId,
    executor: ActorRef<ExecutorMsg>,
    output: Sender<JobItem>,
    local: bool,
    end: Option<Box<dyn FnOnce() + Send>>,
}

/// A local job, made for the manager it will run on.
type LocalJob = Box<dyn FnOnce(ActorRef<NodeMsg>) -> ExecutorArgs + Send>;

/// The embedded node's manager and its restarts.
struct Manager {
    args: NodeArgs,
    /// `Err(why)` while it is down, or after it was given up.
    current: Result<ActorRef<NodeMsg>, String>,
    /// While it is down, to be started again: jobs waiting for it.
    waiting: Option<Vec<(LocalJob, JobReply)>>,
    restarts: Restarts,
}

/// The Supervisor's state.
pub(crate) struct SupervisorState {
    manager: Option<Manager>,
    jobs: HashMap<ActorId, Job>,
    ports: HashMap<ActorId, ExecutorCell>,
    transport: Option<ActorId>,
}

impl SupervisorState {
    /// Starts the manager again, and the jobs that waited for it.
    async fn restart_manager(&mut self, myself: &ActorRef<SupervisorMsg>) {
        let Some(manager) = &mut self.manager else {
            return;
        };
        let args = manager.args.clone();
        let waiting = manager.waiting.take().unwrap_or_default();
        match Actor::spawn_linked(None, NodeManager, args, myself.get_cell()).await {
            Ok((actor, _)) => {
                tracing::info!("the node manager started again");
                manager.current = Ok(actor.clone());
                for (job, reply) in waiting {
                    let started = self.start_job(myself, job(actor.clone()), None).await;
                    let _ = reply.send(started);
                }
            }
            Err(e) => {
                let why = format!("it did not start again: {e}");
                tracing::error!(%why, "the node manager is given up");
                for (_, reply) in waiting {
                    let _ = reply.send(Err(failed("the node manager", why.clone())));
                }
                manager.current = Err(why);
            }
        }
    }

    /// Starts `args`'s executor as a child, and keeps what ends its job
    /// should it fail.
    async fn start_job(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        args: ExecutorArgs,
        end: Option<Box<dyn FnOnce() + Send>>,
    ) -> Result<ActorRef<ExecutorMsg>, Error> {
        let local = matches!(args.nodes, Nodes::Local { .. });
        let (id, output) = (args.job, args.output.clone());
        let (executor, _) = Actor::spawn_linked(None, Executor, args, myself.get_cell())
            .await
            .map_err(|e| Error::Start {
                what: "the executor",
                source: e.into(),
            })?;
        let job = Job {
            id,
            executor: executor.clone(),
            output,
            local,
            end,
        };
        self.jobs.insert(executor.get_id(), job);
        Ok(executor)
    }

    /// Ends the running jobs that `affected` picks: `what` failed.
    fn abort_jobs(&self, what: &str, why: &str, affected: impl Fn(&Job) -> bool) {
        for job in self.jobs.values().filter(|j| affected(j)) {
            let error = failed(what, why);
            let _ = job.executor.cast(ExecutorMsg::Abort(error));
        }
    }
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let manager = match args.manager {
            Some(node) => {
                let (actor, _) =
                    Actor::spawn_linked(None, NodeManager, node.clone(), myself.get_cell()).await?;
                Some(Manager {
                    args: node,
                    current: Ok(actor),
                    waiting: None,
                    restarts: Restarts::new(RestartPolicy::NODE_MANAGER),
                })
            }
            None => None,
        };
        Ok(SupervisorState {
            manager,
            jobs: HashMap::new(),
            ports: HashMap::new(),
            transport: None,
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(Ok(manager)) = state.manager.as_ref().map(|m| &m.current) {
            manager.stop(None);
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::StartLocalJob { job, reply } => {
                match state.manager.as_mut().map(|m| (&m.current, &mut m.waiting)) {
                    Some((Ok(manager), _)) => {
                        let manager = manager.clone();
                        let started = state.start_job(&myself, job(manager), None).await;
                        let _ = reply.send(started);
                    }
                    // It starts again soon: the job waits for it.
                    Some((Err(_), Some(waiting))) => waiting.push((job, reply)),
                    Some((Err(why), None)) => {
                        let _ = reply.send(Err(failed("the node manager", why.clone())));
                    }
                    None => {
                        let why = "a driver runs no local job".into();
                        let _ = reply.send(Err(Error::Invalid(why)));
                    }
                }
            }
            SupervisorMsg::StartJob { args, end, reply } => {
                let started = state.start_job(&myself, *args, Some(end)).await;
                let _ = reply.send(started);
            }
            SupervisorMsg::OpenPort {
                key,
                executor,
                reply,
            } => {
                let spawned =
                    Actor::spawn_linked(None, JobPort, (key, executor.clone()), myself.get_cell())
                        .await;
                let _ = reply.send(match spawned {
                    Ok((port, _)) => {
                        state.ports.insert(port.get_id(), executor);
                        Ok(port)
                    }
                    Err(e) => Err(Error::Start {
                        what: "the job's port",
                        source: e.into(),
                    }),
                });
            }
            SupervisorMsg::Transport(id) => state.transport = Some(id),
            SupervisorMsg::RestartManager => state.restart_manager(&myself).await,
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (id, failure) = match event {
            SupervisionEvent::ActorFailed(cell, err) => (cell.get_id(), Some(err.to_string())),
            SupervisionEvent::ActorTerminated(cell, _, _) => (cell.get_id(), None),
            _ => return Ok(()),
        };
        if let Some(job) = state.jobs.remove(&id) {
            // A job whose executor stopped has ended; one that failed ends here.
            if let Some(why) = failure {
                tracing::error!(%why, "a job's executor failed; the job ends");
                if job.local
                    && let Some(Ok(manager)) = state.manager.as_ref().map(|m| &m.current)
                {
                    let _ = manager.cast(NodeMsg::JobEnded { job: job.id });
                }
                if let Some(end) = job.end {
                    end();
                }
                let _ = job
                    .output
                    .send(JobItem::End(Err(failed("the job's executor", why))));
            }
            return Ok(());
        }
        if let Some(executor) = state.ports.remove(&id) {
            if let (Some(why), Some(executor)) = (failure, executor.get()) {
                let error = failed("the job's port", why);
                let _ = executor.cast(ExecutorMsg::Abort(error));
            }
            return Ok(());
        }
        if state.transport == Some(id) {
            let why = failure.unwrap_or_else(|| "it stopped".into());
            state.abort_jobs("the driver's transport", &why, |_| true);
            return Ok(());
        }
        let Some(manager) = &mut state.manager else {
            return Ok(());
        };
        if !matches!(&manager.current, Ok(m) if m.get_id() == id) {
            return Ok(());
        }
        let why = failure.unwrap_or_else(|| "it stopped".into());
        match manager.restarts.failed(Instant::now()) {
            Ok(backoff) => {
                tracing::warn!(%why, ?backoff, "the node manager failed; starting it again");
                manager.current = Err(format!("it failed ({why}) and is starting again"));
                manager.waiting = Some(Vec::new());
                myself.send_after(backoff, || SupervisorMsg::RestartManager);
            }
            Err(limit) => {
                tracing::error!(%why, %limit, "the node manager is given up");
                manager.current = Err(format!("{limit}; last: {why}"));
            }
        }
        state.abort_jobs("the node manager", &why, |j| j.local);
        Ok(())
    }
}
