//! A Worker: one slot's thread. The thread takes its work from the node's
//! board (`board`) and reports outcomes straight to the task's job through
//! its event sink, so a task costs the thread one message out and none in.
//! The actor exists to be supervised: a task that panics takes the worker
//! down with it (the actor fails with the panic), and the NodeManager's
//! supervision restarts the worker and reports the task lost.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use streambatch_core::{NodeId, TaskId};

use crate::exec::board::Board;
use crate::exec::msg::{NodeMsg, Work, WorkerMsg};
use crate::exec::task::{InstanceCache, Outcome, TaskEvent, set_up_stage};

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
    /// The node manager, told when the worker goes idle while it holds
    /// tasks for a pool's worker.
    pub node: ActorRef<NodeMsg>,
    /// Where the worker registers its thread.
    pub threads: WorkerThreads,
    /// Where its work comes from.
    pub(crate) board: Arc<Board>,
}

impl Actor for Worker {
    type Msg = WorkerMsg;
    type State = ();
    type Arguments = WorkerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<WorkerMsg>,
        args: WorkerArgs,
    ) -> Result<(), ActorProcessingErr> {
        let threads = args.threads.clone();
        let thread = std::thread::Builder::new()
            .name(format!("streambatch-worker-{}", args.index))
            .spawn(move || run_work(myself, args))?;
        let mut threads = threads.lock().unwrap_or_else(|p| p.into_inner());
        threads.retain(|t| !t.is_finished());
        threads.push(thread);
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<WorkerMsg>,
        msg: WorkerMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            WorkerMsg::Panicked(message) => Err(message.into()),
        }
    }
}

fn run_work(me: ActorRef<WorkerMsg>, args: WorkerArgs) {
    let mut instances = InstanceCache::new();
    while let Some(work) = args.board.next(args.index) {
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
                if args.board.done(args.index) {
                    let _ = args.node.cast(NodeMsg::WorkerIdle);
                }
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
        Outcome::Finished { busy, last, ran } => TaskEvent::Finished {
            task,
            busy,
            last,
            ran,
        },
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
