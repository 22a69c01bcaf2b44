//! What runs a job's tasks on a node, in one process: the tasks themselves
//! (`task`), the partitions they yield (`partition`), the memory budgets
//! they yield into (`budget`), the worker threads (`worker`) taking tasks
//! from the node's board (`board`) under the node's manager (`node`, restarted by `restart`'s policy), their messages
//! (`msg`) and the node's metrics (`metrics`). Both the driver's executor
//! and a cluster node's relay build on it.

pub(crate) mod board;
pub(crate) mod budget;
#[cfg(feature = "failpoints")]
pub(crate) mod failpoint;
pub mod metrics;
pub(crate) mod msg;
pub(crate) mod node;
pub(crate) mod partitioner;
pub(crate) mod read_ahead;
pub(crate) mod restart;
pub(crate) mod task;
pub(crate) mod worker;
