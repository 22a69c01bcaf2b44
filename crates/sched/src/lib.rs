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
//! The crate is in folders by concern, each importing only those above it
//! here (checked by `tests/layout.rs`):
//!
//! - `job`: the job as a pure state machine driven by events (`JobState`),
//!   the [policy], pieces of partitions, the recorder of its stats;
//! - `wire`: what crosses between processes (rkyv payloads, the plan as it
//!   travels, the agents' and ports' messages, process groups, joining);
//! - `exec`: what runs tasks on a node (tasks, partitions, memory budgets,
//!   workers, the node manager, metrics), on `job`;
//! - `sim`: the seeded fault simulation, on `job` and `exec`;
//! - `driver`: a job's executor, supervisor, output and port, the embedded
//!   node ([`LocalCluster`]) and the connection to a cluster
//!   ([`ClusterClient`]), on `job`, `exec` and `wire`;
//! - `cluster`: a node process ([`ClusterNode`]): its root, agent, relays
//!   and store server, on `job`, `exec` and `wire`. `driver` and `cluster`
//!   never import each other: what both need is in `wire` or `exec`.

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
pub use driver::embedded::LocalCluster;
pub use error::ClusterError;
pub use wire::{Members, NodeInfo};
