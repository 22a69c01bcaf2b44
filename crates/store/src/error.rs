//! The store's errors: [`StoreError`] for an operation that failed,
//! [`SpillError`] for a spill file that cannot be read back, and
//! [`PutError`] for a put that did not happen, which hands the batch back.

use std::path::PathBuf;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use streambatch_core::{PartitionId, format_bytes};

/// Errors of the object store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The partition is not (or no longer) in the store.
    #[error("partition {0} is not in the store")]
    Missing(PartitionId),
    /// A spilled partition could not be read back.
    #[error("partition {id} cannot be restored: {source}")]
    Spill {
        /// The partition.
        id: PartitionId,
        /// What went wrong with its spill file.
        #[source]
        source: SpillError,
    },
    /// Rows asked of a partition that does not hold them.
    #[error("rows {}..{} asked of partition {id}, which holds {held}", rows.start, rows.end)]
    RowsOutOfRange {
        /// The partition.
        id: PartitionId,
        /// The rows asked for.
        rows: std::ops::Range<usize>,
        /// The rows it holds.
        held: usize,
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
    /// The spill directory is not private to this node's user: another
    /// user could read its partitions or plant files in it.
    #[error("spill directory {path}: {problem}")]
    SpillDir {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it and what to do.
        problem: String,
    },
    /// The capacity asked for is more than the shared-memory file system
    /// has free: segments beyond it would kill the process (SIGBUS) when
    /// touched.
    #[error(
        "store capacity {} is more than {path} has free ({}): lower store_capacity, or enlarge {path} (e.g. `mount -o remount,size=... {path}`, or docker's --shm-size)",
        format_bytes(*capacity), format_bytes(*available)
    )]
    ShmTooSmall {
        /// The capacity asked for.
        capacity: u64,
        /// Bytes free there.
        available: u64,
        /// The file system: /dev/shm.
        path: PathBuf,
    },
    /// A partition that went to disk as it was put is lost: its spill
    /// file could not be written.
    #[error("partition {id} is lost: writing its spill file {path} failed: {message}")]
    SpillWrite {
        /// The partition.
        id: PartitionId,
        /// Its spill file.
        path: PathBuf,
        /// Why the write failed.
        message: String,
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
    #[error("shared memory: cannot {action} segment `{name}`: {source}")]
    Segment {
        /// What was tried: `create` or `open`.
        action: &'static str,
        /// The segment.
        name: String,
        /// The cause, from the shared-memory backing.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A name given to [`open_shared`](crate::open_shared) is not of the
    /// form `segment@offset+len`.
    #[error("`{name}` is not a partition name (segment@offset+len)")]
    BadName {
        /// The name given.
        name: String,
    },
    /// A shared partition's offset and length do not lie inside its segment
    /// (or overflow when added).
    #[error(
        "a partition at offset {offset} of length {len} lies outside segment `{segment}` ({segment_len} bytes)"
    )]
    OutOfBounds {
        /// The segment.
        segment: String,
        /// The partition's offset in it.
        offset: u64,
        /// The partition's length.
        len: u64,
        /// The segment's size.
        segment_len: u64,
    },
    /// A shared partition's bytes are not a valid Arrow IPC stream.
    #[error("segment `{segment}`, partition at offset {offset} of length {len}: {source}")]
    Invalid {
        /// The segment.
        segment: String,
        /// The partition's offset in it.
        offset: u64,
        /// The partition's length.
        len: u64,
        /// What Arrow found wrong.
        #[source]
        source: ArrowError,
    },
    /// A batch could not be encoded as Arrow IPC.
    #[error("arrow ipc: encoding a partition: {0}")]
    Encode(#[source] ArrowError),
    /// A partition in memory could not be decoded.
    #[error("arrow ipc: partition {id}: {source}")]
    Decode {
        /// The partition.
        id: PartitionId,
        /// The cause.
        #[source]
        source: ArrowError,
    },
}

/// Why a spill file could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum SpillError {
    /// The file could not be opened or mapped (missing, unreadable).
    #[error("spill file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is shorter than its trailer or lacks the magic.
    #[error("spill file {path} is truncated or not a spill file")]
    Truncated {
        /// The file.
        path: PathBuf,
    },
    /// The length or CRC-32 in the trailer does not match the contents.
    #[error("spill file {path} is corrupt (checksum mismatch)")]
    Corrupt {
        /// The file.
        path: PathBuf,
    },
    /// The contents passed the checksum but do not decode.
    #[error("spill file {path}: arrow ipc: {source}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: ArrowError,
    },
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
