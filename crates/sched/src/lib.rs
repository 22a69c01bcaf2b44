//! The streaming executor of streambatch, as ractor actors:
//!
//! - [`Executor`](executor::Executor), one per job: keeps stage queues,
//!   asks the [policy] what to run on every event, routes outputs;
//! - [`NodeManager`](node::NodeManager), one per node: owns and supervises
//!   the workers, keeps stateful stages on the workers hosting them;
//! - [`Worker`](worker::Worker), one per slot: runs tasks on its own thread.
//!
//! Tasks yield partitions as soon as they hold `target_partition_bytes`;
//! a stage's outputs count against its memory [budget]; a task whose output
//! does not fit pauses without holding its slot. [`LocalCluster`] runs all of
//! it in one process.

pub mod budget;
pub mod executor;
mod local;
pub mod node;
pub mod partition;
pub mod policy;
pub mod task;
pub mod worker;

pub use local::LocalCluster;
