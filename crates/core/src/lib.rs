//! Types and helpers shared by every streambatch crate: ids, [`Resources`]
//! and [`StageOptions`], node configuration ([`NodeConfig`]) and its error
//! type ([`ConfigError`]), byte sizes ([`parse_size`], [`batch_bytes`]),
//! stable hashes ([`fnv1a`]), whether a file's writer process lives
//! ([`may_be_alive`]), direct-I/O file writing ([`DirectWriter`]) and
//! long-lived worker threads ([`Workers`]).
//!
//! This crate knows nothing of actors, sockets or GPUs, so that each of the
//! store, the planner and the scheduler can be embedded on its own.

mod config;
mod direct;
mod hash;
mod ids;
mod process;
mod resources;
mod size;
mod workers;

pub use config::{ConfigError, NodeConfig};
pub use direct::{AlignedBlock, BLOCK, DirectWriter, open_direct};
pub use hash::{fnv1a, mix64};
pub use ids::{JobId, NodeId, PartitionId, StageId, TaskId};
pub use process::{may_be_alive, pid_namespace};
pub use resources::{PoolSize, Resources, StageOptions};
pub use size::{batch_bytes, format_bytes, parse_size};
pub use workers::Workers;
