//! The messages of a node's own actors (its `NodeManager` and `Worker`s),
//! apart from the actors, so that each imports its peer's messages, never
//! its peer. The executor's messages are the driver's (`driver::msg`); the
//! ones that cross the wire are `wire::msg`.

use std::sync::Arc;

use streambatch_core::JobId;

use crate::exec::task::{JobCtx, TaskRun};

/// Messages of the `NodeManager`.
pub enum NodeMsg {
    /// Run a task. `pool` is the most workers its stage may use.
    Run {
        /// The task.
        run: Box<TaskRun>,
        /// The stage's pool size, for stages with stateful operators.
        pool: Option<usize>,
    },
    /// A worker went idle while tasks waited for one.
    WorkerIdle,
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

/// Work for a worker's thread, taken from the node's board (not sent
/// through the actor: a hop less per task).
pub enum Work {
    /// Run this task.
    Task(Box<TaskRun>),
    /// Set up the stateful operators of a stage of a job.
    SetUp(Arc<JobCtx>, usize),
}

/// Messages of a `Worker` actor, which exists to be supervised.
pub enum WorkerMsg {
    /// The thread caught a panic; the worker fails with it.
    Panicked(String),
}

// The build has ractor's `cluster` feature (for remote actors), under which
// every message type says whether it can cross nodes; these stay local.
impl ractor::Message for NodeMsg {}
impl ractor::Message for WorkerMsg {}
