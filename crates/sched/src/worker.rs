//! A Worker: one slot's thread. The actor receives tasks and hands them to
//! its own OS thread, so no handler ever blocks; the thread reports outcomes
//! straight to the job's executor. A task that panics takes the worker down
//! with it (the handler returns the panic as an error), and the
//! NodeManager's supervision restarts the worker and reports the task lost.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::executor::ExecutorMsg;
use crate::node::NodeMsg;
use crate::task::{InstanceCache, Outcome, TaskRun};

/// Messages of a Worker.
pub enum WorkerMsg {
    /// Run this task.
    Run(Box<TaskRun>),
    /// The thread caught a panic; the worker fails with it.
    Panicked(String),
}

/// The Worker actor.
pub struct Worker;

/// What a Worker is started with (and restarted with).
pub struct WorkerArgs {
    /// Its index among the node's workers.
    pub index: usize,
    /// The node manager, told when the worker is idle.
    pub node: ActorRef<NodeMsg>,
}

/// A Worker's state: the channel to its thread.
pub struct WorkerState {
    tasks: mpsc::Sender<Box<TaskRun>>,
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
        let (tasks, inbox) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("streambatch-worker-{}", args.index))
            .spawn(move || run_tasks(inbox, myself, args))?;
        Ok(WorkerState { tasks })
    }

    async fn handle(
        &self,
        _: ActorRef<WorkerMsg>,
        msg: WorkerMsg,
        state: &mut WorkerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            WorkerMsg::Run(run) => {
                state
                    .tasks
                    .send(run)
                    .map_err(|_| "worker thread has exited")?;
                Ok(())
            }
            WorkerMsg::Panicked(message) => Err(message.into()),
        }
    }
}

fn run_tasks(inbox: mpsc::Receiver<Box<TaskRun>>, me: ActorRef<WorkerMsg>, args: WorkerArgs) {
    let mut instances = InstanceCache::new();
    while let Ok(run) = inbox.recv() {
        let (task, executor) = (run.task, run.job.executor.clone());
        instances.retain(|_, (job, _)| job.strong_count() > 0);
        let outcome = catch_unwind(AssertUnwindSafe(|| run.drive(&mut instances)));
        let report = match outcome {
            Ok(Outcome::Finished { busy }) => ExecutorMsg::Finished { task, busy },
            Ok(Outcome::Paused(run)) => ExecutorMsg::Paused(run),
            Ok(Outcome::Failed(error)) => ExecutorMsg::Failed { task, error },
            Err(panic) => {
                // The node manager restarts this worker and tells the executor.
                let _ = me.cast(WorkerMsg::Panicked(panic_message(&*panic)));
                return;
            }
        };
        // Sends fail only once the job or node has stopped; nobody is waiting then.
        let _ = executor.cast(report);
        let _ = args.node.cast(NodeMsg::WorkerIdle { index: args.index });
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a task panicked".into())
}
