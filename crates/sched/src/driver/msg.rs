//! The messages of a job's `Executor` and what it sends its driver. Tasks
//! reach the executor through a narrow sink (`task_event_sink`), never by
//! its message type.

use streambatch_plan::Error;

use crate::exec::partitioner::Slice;
use crate::exec::task::{TaskEvent, task_event_sink};
use crate::job::PieceId;

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

task_event_sink!(ExecutorMsg);

/// What the executor sends the driver.
pub enum JobItem {
    /// An output partition of the last stage; on a cluster, with the name
    /// the driver tells the executor it read (or lost) it by.
    Output {
        /// The rows.
        slice: Slice,
        /// Their name, when the executor waits to hear they were read.
        id: Option<PieceId>,
        /// The next output comes only once these rows are read (a sort's,
        /// in order): the driver reads them at once.
        in_order: bool,
    },
    /// Every output was handed over; the job ends once each is read (see
    /// `Action::Drained`).
    Drained,
    /// The job ended.
    End(Result<(), Error>),
}

impl JobItem {
    /// Output rows `slice`, named `id`, read at once where `in_order`.
    pub(crate) fn output(slice: Slice, id: Option<PieceId>, in_order: bool) -> Self {
        Self::Output {
            slice,
            id,
            in_order,
        }
    }
}

// The build has ractor's `cluster` feature (for remote actors), under which
// every message type says whether it can cross nodes; this one stays local.
impl ractor::Message for ExecutorMsg {}
