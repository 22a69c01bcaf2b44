//! The messages of the scheduler's actors, in one place so that actors
//! import their peers' messages, never their peers.

use std::sync::Arc;

use streambatch_core::JobId;
use streambatch_plan::Error;

use crate::job::PieceId;
use crate::partition::Slice;
use crate::task::{JobCtx, TaskEvent, TaskRun};

/// Events the `Executor` reacts to.
pub enum ExecutorMsg {
    /// A task of the job reported.
    Task(TaskEvent),
    /// A cluster node reported on one of the job's tasks.
    Node(crate::wire::NodeEvent),
    /// A cluster node of the job was lost.
    NodeLost(String),
    /// The cluster's head, named, was lost: the job ends.
    HeadLost(String),
    /// Nodes joined the cluster and took the job (they wait in the
    /// executor's `Joining` queue): they get tasks from now.
    NodeJoined,
    /// The driver dropped the job's output: the job ends.
    Cancel,
    /// A supervisor ends the job: a part it depends on failed.
    Abort(streambatch_plan::Error),
    /// Output memory was returned; paused work may fit now.
    MemoryFreed,
    /// The driver read the output rows `id` names (`read`), or found them
    /// lost with their node (see `JobState::on_read`).
    Read {
        /// The rows.
        id: PieceId,
        /// Whether it could read them.
        read: bool,
    },
}

impl From<TaskEvent> for ExecutorMsg {
    fn from(event: TaskEvent) -> Self {
        Self::Task(event)
    }
}

impl TryFrom<ExecutorMsg> for TaskEvent {
    type Error = ExecutorMsg;

    fn try_from(msg: ExecutorMsg) -> Result<Self, ExecutorMsg> {
        match msg {
            ExecutorMsg::Task(event) => Ok(event),
            other => Err(other),
        }
    }
}

/// What the executor sends the driver.
pub enum JobItem {
    /// An output partition of the last stage; on a cluster, with the name
    /// the driver tells the executor it read (or lost) it by.
    Output {
        /// The rows.
        slice: Slice,
        /// Their name, when the executor waits to hear they were read.
        id: Option<PieceId>,
    },
    /// The job ended.
    End(Result<(), Error>),
}

/// Messages of the `NodeManager`.
pub enum NodeMsg {
    /// Run a task. `pool` is the most workers its stage may use.
    Run {
        /// The task.
        run: Box<TaskRun>,
        /// The stage's pool size, for stages with stateful operators.
        pool: Option<usize>,
    },
    /// A worker finished its task.
    WorkerIdle {
        /// The worker.
        index: usize,
    },
    /// Set up a stage's stateful operators on `workers` workers ahead of
    /// its tasks (a pool's `min`).
    SetUp {
        /// The job.
        job: Arc<JobCtx>,
        /// The stage.
        stage: usize,
        /// How many workers.
        workers: usize,
    },
    /// A job ended: its pools are gone.
    JobEnded {
        /// The job.
        job: JobId,
    },
}

/// Messages of a `Worker`.
pub enum WorkerMsg {
    /// Run this task.
    Run(Box<TaskRun>),
    /// Set up the stateful operators of a stage of a job.
    SetUp(Arc<JobCtx>, usize),
    /// The thread caught a panic; the worker fails with it.
    Panicked(String),
}

// The build has ractor's `cluster` feature (for remote actors), under which
// every message type says whether it can cross nodes; these stay local.
impl ractor::Message for ExecutorMsg {}
impl ractor::Message for NodeMsg {}
impl ractor::Message for WorkerMsg {}
