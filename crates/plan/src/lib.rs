//! The plan side of streambatch: the lazy [`Dataset`] builder, the logical
//! plan, the user-function traits ([`BatchFn`], [`BatchUdf`], rows),
//! expressions ([`col`], [`lit`]), the fusion of consecutive operators with
//! equal resources into stages, and the sources and sinks.
//!
//! This crate decides *what* runs; it knows nothing of scheduling or of where
//! data lives. Consuming calls hand an [`ExecPlan`] to a [`Runner`].

mod aggregate;
mod all_to_all;
mod aws_profile;
mod batching;
mod dataset;
mod error;
mod exchange;
mod explain;
mod expr;
mod gather;
mod hash_join;
mod held;
mod images;
mod join;
mod join_spill;
pub mod key_range;
mod key_sample;
mod manifest;
mod object_files;
mod object_runtime;
mod object_writes;
pub mod ops;
mod packed_keys;
mod parquet_source;
pub mod partition;
mod plan;
mod prune;
mod read_ahead;
mod reading;
mod recipe;
mod row;
mod row_sample;
mod scratch;
mod shuffle_window;
mod side;
pub mod sink;
mod sort_runs;
mod sorted;
mod source;
mod split;
mod stats;
pub mod timeline;
mod train_test_split;
mod udf;
mod union;
mod write;

pub use aggregate::{Agg, AggKind, Step};
pub use all_to_all::Grouped;
pub use batching::{BatchOptions, Batches, Collate, Prefetched, counted};
pub use dataset::{BatchStream, Dataset, JobStream, Runner, SplitWatch};
pub use error::{BoxError, Error, Result};
pub use exchange::{Cut, Exchange, Reduce};
pub use explain::{Explain, StageExplain};
pub use expr::{BinaryOp, Expr, Literal, col, lit};
pub use hash_join::{Broadcast, Join, JoinHow, Probe, SIDE_TAG};
pub use held::{HeldAt, HeldRows, HeldSource, Piece, Pulled};
pub use images::ImageSize;
pub use key_range::KeyRange;
pub use key_sample::KeySample;
pub use object_files::{
    bytes_read as object_bytes_read, gets as object_gets, url_of as object_url,
};
pub use ops::{OpCounter, OpKind, OpSpec, SharedInstance, TaskEnv};
pub use plan::{
    ExecPlan, LogicalOp, LogicalPlan, REDUCER_HELD_PARTITIONS, Stage, StageKind, TaskInput,
};
pub use read_ahead::{ReadAheadOwner, forget as forget_read_ahead, taken as object_reads_ahead};
pub use recipe::{Named, Recipe, Registry, UdfFactory};
pub use row::{Row, Value, batch_to_rows, rows_to_batch};
pub use row_sample::RowSample;
pub use scratch::Scratch;
pub use side::Side;
pub use source::SourceSplit;
pub use split::{BatchCount, EpochStream, LostRank, RankStats, Split, SplitOptions};
pub use stats::{
    ErroredTask, Event, EventKind, Exchanged, JobStats, MAX_EVENTS, NodeStats, OpStats,
    OperatorStats, PauseCause, Pauses, RankWait, Recovery, StoreSample, Wait, WaitSpan,
};
pub use udf::{
    BatchFn, BatchGeneratorFn, BatchUdf, Predicate, RowFlatMapFn, RowMapFn, Stateful, UdfError,
};
pub use write::ResumedWrite;

/// A stream of batches: what sources yield and operators transform.
pub type BatchIter = Box<dyn Iterator<Item = Result<arrow_array::RecordBatch>> + Send>;
