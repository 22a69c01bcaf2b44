//! The crate's [`Error`]: what a plan, a source, an operator or a sink
//! can fail with, each naming the file, operator or node at fault, and
//! `bad_file` for a file that cannot be read as its format. The bottom
//! floor of the crate, imported by every folder.

use std::path::PathBuf;

use arrow_schema::ArrowError;
use streambatch_core::{ConfigError, Resources};

/// An error from another crate (the store, a GPU kernel, a user function),
/// kept with its type: `source()` and `downcast_ref` reach it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Everything that can end a streambatch job. Each variant names what a user
/// can act on: the file, the operator, the key.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A node's configuration is bad.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A path, glob or directory that matched no file.
    #[error("no input files: {pattern} matches nothing")]
    NoFiles {
        /// The path or pattern given.
        pattern: String,
    },
    /// A file could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done ("reading", "writing", ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file's contents could not be decoded (corrupt Parquet, bad CSV).
    #[error("cannot read {path}: {message}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What the decoder said.
        message: String,
    },
    /// A file could not be written (the encoder failed, or the disk).
    #[error("cannot write {path}: {message}")]
    WriteFailed {
        /// The file.
        path: PathBuf,
        /// What the encoder said.
        message: String,
    },
    /// Input files whose schemas disagree.
    #[error("schema of {path} differs from {first}: expected {expected}, found {found}")]
    SchemaMismatch {
        /// The file that disagrees.
        path: PathBuf,
        /// The first file, whose schema the others must match.
        first: PathBuf,
        /// The first file's schema.
        expected: String,
        /// This file's schema.
        found: String,
    },
    /// A user function (or a GPU kernel) returned an error, or its set-up
    /// failed.
    #[error("operator `{operator}` failed: {source}")]
    Udf {
        /// The operator's name.
        operator: String,
        /// The function's error, with its own type.
        source: BoxError,
    },
    /// A user function panicked on every attempt.
    #[error("operator `{operator}` panicked {attempts} time(s), giving up: {message}")]
    Panicked {
        /// The operator's name.
        operator: String,
        /// How often the task was tried.
        attempts: u32,
        /// The panic message.
        message: String,
    },
    /// An Arrow computation (an expression, a concatenation) failed.
    #[error("operator `{operator}`: {source}")]
    Arrow {
        /// The operator's name.
        operator: String,
        /// The cause.
        source: ArrowError,
    },
    /// A call the plan cannot carry out (a missing column, a bad argument).
    #[error("invalid plan: {0}")]
    Invalid(String),
    /// Ranks of a streaming split that did not ask for an epoch in time:
    /// the ranks waiting for them give up.
    #[error("epoch {epoch} of the split: rank(s) {missing:?} did not ask for it within {waited:?}")]
    SplitBarrier {
        /// The epoch waited for.
        epoch: usize,
        /// The ranks that never asked.
        missing: Vec<usize>,
        /// How long the others waited.
        waited: std::time::Duration,
    },
    /// The job of a streaming split's epoch failed; every rank is told.
    #[error("epoch {epoch} of the split failed: {message}")]
    SplitJob {
        /// The epoch.
        epoch: usize,
        /// The job's error.
        message: String,
    },
    /// A rank of a streaming split was lost mid-epoch (its process died or
    /// its connection closed) under [`LostRank::Fail`](crate::train::split::LostRank::Fail):
    /// every other rank is told.
    #[error("epoch {epoch} of the split: rank {rank} was lost ({reason})")]
    SplitRankLost {
        /// The epoch.
        epoch: usize,
        /// The rank lost.
        rank: usize,
        /// How it was lost.
        reason: String,
    },
    /// A split served to another process could not be served or read: the
    /// handle (driver, rank) and the reason.
    #[error("split {handle}: {message}")]
    RemoteSplit {
        /// The split's handle.
        handle: String,
        /// What went wrong.
        message: String,
    },
    /// An operator's task needs more slots than the node has: it could
    /// never run.
    #[error(
        "operator `{operator}` needs {} CPU and {} GPU slots per task, but the node has {} CPU and {} GPU slots{}",
        need.cpus, need.gpus, have.cpus, have.gpus,
        if need.gpus > have.gpus && have.gpus == 0.0 {
            " (no GPU adapter was found, or the node sets gpus = 0; run the operator on the CPU instead)"
        } else { "" }
    )]
    NoSlots {
        /// The operator (stage) that cannot run.
        operator: String,
        /// What one of its tasks holds.
        need: Resources,
        /// What the node has.
        have: Resources,
    },
    /// The object store failed while `context` (storing an output of a
    /// stage, reading an input, opening the store).
    #[error("{context}: {source}")]
    Store {
        /// What was being done, naming the stage where there is one.
        context: String,
        /// The store's error, with its type.
        source: BoxError,
    },
    /// Part of the engine could not start (the runtime, the node manager).
    #[error("cannot start {what}: {source}")]
    Start {
        /// What did not start.
        what: &'static str,
        /// Why.
        source: BoxError,
    },
    /// A cluster node reported a failure of the job's work.
    #[error("on node {node}: {message}")]
    OnNode {
        /// The node.
        node: String,
        /// Its error, as it reported it.
        message: String,
    },
    /// The cluster's head was lost while the job ran (its membership is
    /// gone; the job ends, as a Ray job ends with its GCS).
    #[error("the cluster's head, node {node}, was lost while the job ran")]
    HeadLost {
        /// The head.
        node: String,
    },
    /// A cluster node running the job's work was lost (it stopped or its
    /// connection broke).
    #[error("node {node} was lost while the job ran")]
    NodeLost {
        /// The node.
        node: String,
    },
    /// A partition the job needs was lost with its node and cannot be made
    /// again.
    #[error("a partition of `{operator}` was lost and cannot be made again: {why}")]
    PartitionLost {
        /// The stage (its fused operators' names) that made it.
        operator: String,
        /// Why not.
        why: String,
    },
    /// The node manager stopped while the job still had tasks to run.
    #[error("the node manager has stopped; the job cannot go on")]
    NodeStopped,
    /// A part of the job's machinery failed and its supervisor ended the
    /// job (docs/architecture.md, "Supervision").
    #[error("{actor} failed, so the job ended: {reason}")]
    ActorFailed {
        /// What failed ("the job's executor", "the node manager", ...).
        actor: String,
        /// Why.
        reason: String,
    },
    /// The executor stopped without saying how the job ended.
    #[error("the executor stopped without finishing the job")]
    JobLost,
}

/// The result type of streambatch's planning and execution.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// True for an operator's own failure (a UDF's `Err`, output Arrow
    /// rejects, an input file it cannot decode): the same input would fail
    /// again, so it is retried only if the job asks (`retry_user_errors`)
    /// and may be skipped (`max_errored_partitions`). Anything else met by
    /// a task is a system failure, retried up to `max_task_retries`.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            Self::Udf { .. } | Self::Arrow { .. } | Self::BadFile { .. }
        )
    }

    /// Wraps an Arrow error raised while running `operator`.
    pub fn arrow(operator: &str, source: ArrowError) -> Self {
        Self::Arrow {
            operator: operator.to_string(),
            source,
        }
    }

    /// A store error met while `context`.
    pub fn store(context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Store {
            context: context.into(),
            source: source.into(),
        }
    }

    /// An I/O error on `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// A file that could not be decoded, with what the decoder said.
pub(crate) fn bad_file(path: &std::path::Path, e: impl std::fmt::Display) -> Error {
    Error::BadFile {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}
