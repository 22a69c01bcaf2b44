//! The streaming executor of streambatch, as ractor actors:
//!
//! - the `Executor`, one per job: a thin actor around the job's pure state
//!   machine (`JobState`), which routes partitions between stages and asks
//!   the [policy] what to run on every event;
//! - the `NodeManager`, one per node: owns and supervises the workers,
//!   keeps stateful stages on the workers hosting them;
//! - a `Worker` per slot: runs tasks on its own thread.
//!
//! Tasks yield partitions as soon as they hold `target_partition_bytes`;
//! a stage's outputs count against its memory budget; a task whose output
//! does not fit pauses without holding its slot. Tasks report through a
//! narrow event sink, never the executor's own reference. [`LocalCluster`]
//! runs all of it in one process.
//!
//! Modules import only downward: `policy`, `budget` and `record` at the
//! bottom; `job` (the state machine) on `policy` and `record`; `partition`
//! and `task` on those; `msg` (every actor's messages) on `task`; the
//! actors (`worker`, `node`, `executor`) on `msg`; `local` on the actors.

mod cluster;
mod driver;
mod error;
pub(crate) mod exec;
pub(crate) mod job;
pub mod sim;
mod wire;

pub use exec::metrics;
pub use job::policy;

pub use cluster::ClusterNode;
pub use driver::client::ClusterClient;
pub use driver::local::LocalCluster;
pub use error::ClusterError;
pub use wire::{Members, NodeInfo};
