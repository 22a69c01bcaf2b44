//! streambatch runs heterogeneous data pipelines (CPU preprocessing feeding
//! GPU inference) with the streaming batch model: partitions are made while
//! the job runs and stream between operators, a scheduler places each task
//! where resources and memory allow, and producers slow down before memory
//! runs out.
//!
//! ```
//! use streambatch::prelude::*;
//!
//! let ctx = Context::local().unwrap();
//! let evens = ctx
//!     .range(1_000, 8)
//!     .with_column("double", (col("id") * lit(2)))
//!     .filter((col("id") % lit(2)).eq(lit(0)))
//!     .count()
//!     .unwrap();
//! assert_eq!(evens, 500);
//! ```
//!
//! Trainers in other processes read a split's ranks with the
//! `streambatch-split` crate (a crate of its own, so that this one builds
//! no gRPC).

mod augment;
mod chunks;
mod cluster;
mod context;
mod memory;
pub mod ops;
pub mod pipeline;
mod progress;
mod runtime_dir;

pub use cluster::{main, registry, run_node};
pub use context::{Context, resolve_gpu_slots};
pub use memory::keep_freed_memory;
pub use runtime_dir::use_private_runtime_dir;
pub use streambatch_core::{
    JobId, NodeConfig, NodeId, PoolSize, Resources, StageId, StageOptions, TaskId, format_bytes,
    parse_size,
};
pub use streambatch_gpu::{GpuError, GpuKernel, GpuPool, KernelTimings};
pub use streambatch_net::{TlsFiles, init_cluster};
pub use streambatch_plan::sink::{FileFormat, ParquetWriteOptions};
pub use streambatch_plan::{
    Agg, AggKind, BatchFn, BatchOptions, BatchStream, BatchUdf, Batches, Collate, Dataset,
    EpochStream, Error, Event, EventKind, Expr, Grouped, HeldAt, HeldRows, JobStats, JoinHow,
    LostRank, Named, NodeStats, OpStats, OperatorStats, PauseCause, Pauses, Piece, Pulled,
    RankStats, Recipe, Registry, Result, ResumedWrite, Row, Split, SplitOptions, Stateful,
    StoreSample, UdfError, Value, Wait, WaitSpan, col, lit, object_bytes_read, object_gets,
    object_reads_ahead, object_url, timeline,
};
pub use streambatch_sched::{
    ClusterClient, ClusterError, ClusterNode, LocalCluster, Members, NodeInfo,
};
pub use streambatch_store::{
    ObjectStore, OutputBuffer, SharedStore, StoreConfig, StoreStats, batch_bytes,
};

/// The Arrow crates streambatch is built on, at the versions it uses:
/// build columns and schemas with these instead of pinning `arrow-array`
/// to the engine's version yourself.
///
/// ```
/// use std::sync::Arc;
/// use streambatch::arrow::array::{ArrayRef, Int64Array, RecordBatch};
///
/// let ids: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
/// let batch = RecordBatch::try_from_iter([("id", ids)]).unwrap();
/// assert_eq!(batch.schema().field(0).data_type(), &streambatch::arrow::schema::DataType::Int64);
/// ```
pub mod arrow {
    pub use arrow_array as array;
    pub use arrow_buffer as buffer;
    pub use arrow_schema as schema;
}

/// The `parquet` crate at the version streambatch reads and writes with,
/// for [`ParquetWriteOptions`]' codecs (`parquet::basic::Compression`).
pub use parquet;

/// ONNX models as operators ([`OnnxModel`]): their declarations, the
/// engines that run them, and a builder for model files.
pub use streambatch_onnx as onnx;
pub use streambatch_onnx::OnnxModel;

/// What most programs need: `use streambatch::prelude::*;`.
pub mod prelude {
    pub use crate::{
        Agg, BatchFn, BatchOptions, Context, Dataset, Error, Expr, GpuKernel, JoinHow, OnnxModel,
        ParquetWriteOptions, Resources, Result, Row, StageOptions, Stateful, UdfError, Value, col,
        lit,
    };
    pub use arrow_array::RecordBatch;
}
