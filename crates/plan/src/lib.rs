//! The plan side of streambatch: the lazy [`Dataset`] builder, the logical
//! plan, the user-function traits ([`BatchFn`], [`BatchUdf`], rows),
//! expressions ([`col`], [`lit`]), the fusion of consecutive operators with
//! equal resources into stages, and the sources, exchanges and sinks that
//! tasks run.
//!
//! This crate decides *what* runs and how a task runs it, and the partition
//! size and store reserves a plan implies ([`ExecPlan::sizing`]); where and
//! when a task runs, and what memory it may take, is the scheduler's
//! (`streambatch-sched`). Consuming calls hand an [`ExecPlan`] to a
//! [`Runner`].
//!
//! The modules are folders by concern, each importing only those below it
//! (checked by `tests/layout.rs`), from the bottom up:
//!
//! - `error`: the crate's [`Error`].
//! - `udf`: what a user writes into a plan: function traits, expressions,
//!   rows, recipes.
//! - `object`: object stores: files, writes, manifests, credentials.
//! - `read`, `exchange`, `sink`: what a task runs at a plan's start (the
//!   readers), across an exchange (cut, sort, group, join and their
//!   spilling reducers) and at its end (the writers).
//! - `stats`: what a job did, and its timeline.
//! - `logical`: the plan and its operators, which name every family above.
//! - `dataset`: the [`Dataset`] builder and its all-to-all, join, union and
//!   write calls.
//! - `train`: what a trainer reads: batches, a shuffle window, splits.

mod dataset;
mod error;
mod exchange;
mod logical;
mod object;
mod read;
pub mod sink;
mod stats;
mod train;
mod udf;

pub use dataset::held::{HeldAt, HeldRows, HeldSource, Piece, Pulled};
pub use dataset::write::ResumedWrite;
pub use dataset::{BatchStream, Dataset, Grouped, JobStream, Runner, SplitWatch};
pub use error::{BoxError, Error, Result};
pub use exchange::archive::{schema_bytes, schema_of};
pub use exchange::group::aggregate::{Agg, AggKind, Step};
pub use exchange::join::hash::{Broadcast, Join, JoinHow, Probe, SIDE_TAG};
pub use exchange::reservation::{FixedPool, MemoryPool, MemoryReservation};
pub use exchange::scratch::Scratch;
pub use exchange::sort::range as key_range;
pub use exchange::sort::range::KeyRange;
pub use exchange::sort::sample::KeySample;
pub use exchange::{Cut, Exchange, Reduce};
pub use logical::explain::{Explain, StageExplain};
pub use logical::ops;
pub use logical::ops::{OpCounter, OpKind, OpSpec, SharedInstance, TaskEnv};
pub use logical::plan::{ExecPlan, LogicalOp, LogicalPlan, Stage, StageKind, TaskInput};
pub use logical::side::Side;
pub use logical::source::SourceSplit;
pub use object::files::{
    bytes_read as object_bytes_read, gets as object_gets, read_object, url_of as object_url,
};
pub use object::read_ahead::{
    ReadAheadOwner, forget as forget_read_ahead, taken as object_reads_ahead,
};
pub use read::images::ImageSize;
pub use read::row_sample::RowSample;
pub use stats::timeline;
pub use stats::{
    ErroredTask, Event, EventKind, Exchanged, JobStats, MAX_EVENTS, NodeStats, OpStats,
    OperatorStats, PauseCause, Pauses, RankStats, RankWait, Recovery, StoreSample, Wait, WaitSpan,
};
pub use train::batching::{BatchOptions, Batches, Collate, Prefetched, counted};
pub use train::split::{BatchCount, Confirmer, EpochStream, LostRank, Split, SplitOptions};
pub use udf::blob::Blob;
pub use udf::expr::{BinaryOp, Expr, Literal, col, lit};
pub use udf::recipe::{Named, Registry, UdfFactory};
pub use udf::row::{Row, Value, batch_to_rows, rows_to_batch};
pub use udf::{
    BatchFn, BatchGeneratorFn, BatchIter, BatchUdf, Predicate, Recipe, RowFlatMapFn, RowMapFn,
    Stateful, UdfError,
};
