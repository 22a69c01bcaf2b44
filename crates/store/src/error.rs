use std::path::PathBuf;

use arrow_array::RecordBatch;
use streambatch_core::{PartitionId, format_bytes};

/// Errors of the object store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The partition is not (or no longer) in the store.
    #[error("partition {0} is not in the store")]
    Missing(PartitionId),
    /// A spilled partition could not be read back.
    #[error("partition {id} cannot be restored: {message}")]
    Spill {
        /// The partition.
        id: PartitionId,
        /// What went wrong (a missing or corrupt spill file).
        message: String,
    },
    /// Memory is full of partitions that are pinned or being read.
    #[error("no room to restore partition {id} ({} needed of {}): every partition in memory is pinned or in use", format_bytes(*needed), format_bytes(*capacity))]
    NoRoom {
        /// The partition.
        id: PartitionId,
        /// Its size.
        needed: u64,
        /// The capacity.
        capacity: u64,
    },
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A shared-memory segment could not be made or opened.
    #[error("shared memory: {0}")]
    Segment(String),
    /// A batch could not be encoded or decoded.
    #[error("arrow ipc: {0}")]
    Arrow(String),
}

impl StoreError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A put that did not happen. The batch is handed back, never dropped.
#[derive(Debug, thiserror::Error)]
pub enum PutError {
    /// Storing the batch would exceed the store's capacity.
    #[error(
        "object store full: a partition of {} does not fit ({} of {} in use)",
        format_bytes(*needed), format_bytes(*used), format_bytes(*capacity)
    )]
    Full {
        /// The batch that was not stored.
        batch: RecordBatch,
        /// Its size.
        needed: u64,
        /// Bytes in use.
        used: u64,
        /// The capacity.
        capacity: u64,
    },
    /// The batch alone is larger than the whole store: only `put` (which
    /// spills) can take it.
    #[error(
        "a partition of {} can never fit in an object store of {}",
        format_bytes(*needed), format_bytes(*capacity)
    )]
    TooLarge {
        /// The batch that was not stored.
        batch: RecordBatch,
        /// Its size.
        needed: u64,
        /// The capacity.
        capacity: u64,
    },
    /// The store failed.
    #[error(transparent)]
    Store(StoreError),
}
