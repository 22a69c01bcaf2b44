//! A Worker: one slot's thread. The actor receives work and hands it to its
//! own OS thread, so no handler ever blocks; the thread reports outcomes
//! straight to the task's job through its event sink. A task that panics takes the worker down
//! with it (the handler returns the panic as an error), and the
//! NodeManager's supervision restarts the worker and reports the task lost.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, mpsc};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use streambatch_core::{NodeId, TaskId};

use crate::exec::msg::{NodeMsg, WorkerMsg};
use crate::exec::task::{InstanceCache, JobCtx, Outcome, TaskEvent, TaskRun, set_up_stage};

/// The Worker actor.
pub struct Worker;

/// The OS threads of a node's workers, so that a node shutting down can
/// wait for them to let go of what they hold (store partitions).
pub type WorkerThreads = Arc<Mutex<Vec<std::thread::JoinHandle<()>>>>;

/// What a Worker is started with (and restarted with).
pub struct WorkerArgs {
    /// Its index among the node's workers.
    pub index: usize,
    /// Its node, named in the span of every task it runs.
    pub node_id: NodeId,
    /// The node manager, told when the worker is idle.
    pub node: ActorRef<NodeMsg>,
    /// Where the worker registers its thread.
    pub threads: WorkerThreads,
}

/// What the worker's thread is handed.
enum Work {
    Task(Box<TaskRun>),
    SetUp(Arc<JobCtx>, usize),
}

/// A Worker's state: the channel to its thread.
pub struct WorkerState {
    work: mpsc::Sender<Work>,
}

impl Actor for Worker {
    type Msg = WorkerMsg;
    type State = WorkerState;
    type Arguments = WorkerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<WorkerMsg>,
        args: WorkerArgs,
    ) -> Result<WorkerState, ActorProcessingErr> {
        let (work, inbox) = mpsc::channel();
        let threads = args.threads.clone();
        let thread = std::thread::Builder::new()
            .name(format!("streambatch-worker-{}", args.index))
            .spawn(move || run_work(inbox, myself, args))?;
        let mut threads = threads.lock().unwrap_or_else(|p| p.into_inner());
        threads.retain(|t| !t.is_finished());
        threads.push(thread);
        Ok(WorkerState { work })
    }

    async fn handle(
        &self,
        _: ActorRef<WorkerMsg>,
        msg: WorkerMsg,
        state: &mut WorkerState,
    ) -> Result<(), ActorProcessingErr> {
        let work = match msg {
            WorkerMsg::Run(run) => Work::Task(run),
            WorkerMsg::SetUp(job, stage) => Work::SetUp(job, stage),
            WorkerMsg::Panicked(message) => return Err(message.into()),
        };
        state
            .work
            .send(work)
            .map_err(|_| "worker thread has exited")?;
        Ok(())
    }
}

fn run_work(inbox: mpsc::Receiver<Work>, me: ActorRef<WorkerMsg>, args: WorkerArgs) {
    let mut instances = InstanceCache::new();
    while let Ok(work) = inbox.recv() {
        instances.retain(|_, (job, _)| job.strong_count() > 0);
        let (events, outcome) = match work {
            Work::Task(run) => {
                let (task, events) = (run.task, run.job.events.clone());
                let span = tracing::info_span!(
                    "task",
                    job = %run.job.job,
                    stage = %run.job.plan.stages[run.stage].name,
                    %task,
                    node = %args.node_id,
                );
                let _entered = span.enter();
                let outcome = catch_unwind(AssertUnwindSafe(|| {
                    #[cfg(feature = "failpoints")]
                    crate::exec::failpoint::worker(run.job.job.0, task);
                    run.drive(&mut instances)
                }));
                (events, outcome.map(|o| Some(report(task, o))))
            }
            Work::SetUp(job, stage) => {
                let outcome = catch_unwind(AssertUnwindSafe(|| {
                    set_up_stage(&job, stage, &mut instances)
                }));
                (
                    job.events.clone(),
                    outcome.map(|r| r.err().map(TaskEvent::Failed)),
                )
            }
        };
        match outcome {
            Ok(report) => {
                // Sends fail only once the job or node has stopped; nobody waits then.
                if let Some(report) = report {
                    let _ = events.send_message(report);
                }
                let _ = args.node.cast(NodeMsg::WorkerIdle { index: args.index });
            }
            Err(panic) => {
                // The node manager restarts this worker and tells the executor.
                let _ = me.cast(WorkerMsg::Panicked(panic_message(&*panic)));
                return;
            }
        }
    }
}

fn report(task: TaskId, outcome: Outcome) -> TaskEvent {
    match outcome {
        Outcome::Finished { busy } => TaskEvent::Finished { task, busy },
        Outcome::Paused(run) => TaskEvent::Paused(run),
        Outcome::Failed(error) => TaskEvent::Errored { task, error },
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a task panicked".into())
}
