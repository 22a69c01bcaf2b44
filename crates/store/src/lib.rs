//! The streambatch object store: where partitions live between the operator
//! that yields them and the one that consumes them. It can be embedded alone.
//!
//! [`SharedStore`] keeps each partition as an Arrow IPC stream in a few
//! large shared-memory segments, pre-faulted once and carved up by an
//! allocator (as Ray's plasma store does). [`ObjectStore::get`] returns a
//! `RecordBatch` whose buffers point into the segment: no copy, no decode
//! pass. Another process on the host can open a partition by its name
//! ([`open_shared`], which validates the bytes it finds). Over capacity, [`ObjectStore::put`] spills the least
//! recently used partitions that nobody pins or reads to IPC files with a
//! CRC-32 in a directory private to the node's user, and `get` maps them
//! back, validated. A partition lives as long as a
//! [`PartitionRef`] (or a batch read from it): dropping the last frees its
//! memory and its spill file.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{Int64Array, RecordBatch};
//! use streambatch_store::{ObjectStore, SharedStore, StoreConfig};
//!
//! let spill = tempfile::tempdir().unwrap();
//! let store = SharedStore::open(StoreConfig::new(32 << 20, spill.path())).unwrap();
//! let batch = RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from(vec![1, 2, 3])) as _)]).unwrap();
//! let part = store.put(batch.clone()).unwrap();
//! let read = part.get().unwrap();
//! assert_eq!(read, batch);
//! drop((part, read));
//! assert_eq!(store.stats().used_bytes, 0);
//! ```

mod alloc;
mod error;
pub mod ipc;
mod output;
mod reference;
mod segment;
mod shared;
mod spill;
mod spill_writer;

pub use error::{PutError, SpillError, StoreError};
pub use output::{OutputBuffer, with_output_store};
pub use reference::{PartitionRef, PinGuard, cuts_in_order};
pub use shared::{
    SharedPartition, SharedStore, StoreConfig, open_shared, open_shared_keeping,
    open_shared_unchecked,
};
pub use streambatch_core::batch_bytes;

use std::sync::Arc;

use arrow_array::RecordBatch;
use streambatch_core::PartitionId;

/// Counters of a store, read at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Bytes the store may hold in memory.
    pub capacity_bytes: u64,
    /// Bytes held in memory now.
    pub used_bytes: u64,
    /// The most bytes held in memory at any instant since the store opened.
    pub peak_bytes: u64,
    /// Partitions held (in memory or spilled).
    pub partitions: usize,
    /// Bytes written to spill files, and to reducers' scratch files (sort runs,
    /// join buckets) in its spill directory.
    pub spilled_bytes: u64,
    /// Bytes read back from spill files.
    pub restored_bytes: u64,
    /// Partitions freed since the store opened: a waiter for memory
    /// compares it with the count it saw when it started to wait.
    pub frees: u64,
}

/// A store of immutable partitions, each one Arrow `RecordBatch`.
pub trait ObjectStore: Send + Sync + 'static {
    /// Stores `batch` if it fits in memory now; otherwise hands it back in
    /// [`PutError::Full`] (never spills), so that the caller can wait.
    fn try_put(&self, batch: RecordBatch) -> Result<PartitionRef, PutError>;
    /// Stores `batch`, spilling least recently used partitions (or, when
    /// none can go, this one) to disk to stay within capacity.
    fn put(&self, batch: RecordBatch) -> Result<PartitionRef, StoreError>;
    /// [`ObjectStore::try_put`] of a batch whose rows are read in groups
    /// (an exchange's map output, a group per destination): `groups` holds
    /// where each starts, and the end. Spilled, each group is written to be
    /// read back alone ([`PartitionRef::get_rows`]). Groups that do not cut
    /// the rows in order are ignored.
    fn try_put_grouped(
        &self,
        batch: RecordBatch,
        groups: &[u32],
    ) -> Result<PartitionRef, PutError> {
        let _ = groups;
        self.try_put(batch)
    }
    /// [`ObjectStore::put`] of a batch whose rows are read in groups (see
    /// [`ObjectStore::try_put_grouped`]).
    fn put_grouped(&self, batch: RecordBatch, groups: &[u32]) -> Result<PartitionRef, StoreError> {
        let _ = groups;
        self.put(batch)
    }
    /// Reads a live partition.
    fn get(&self, id: PartitionId) -> Result<RecordBatch, StoreError>;
    /// Keeps a partition in memory (restoring it if spilled) until the
    /// guard drops.
    fn pin(&self, id: PartitionId) -> Result<PinGuard, StoreError>;
    /// The store's counters.
    fn stats(&self) -> StoreStats;
    /// Room for a `len`-byte output buffer in the store's memory, which a
    /// later put of a batch holding it adopts without a copy; `None` (the
    /// default) when the store has no room or does not place buffers.
    fn reserve(&self, len: usize) -> Option<OutputBuffer> {
        let _ = len;
        None
    }
    /// A directory for a task's own scratch files (a sort's runs), on the
    /// store's spill disk, made if it is not yet; `None` (the default)
    /// when the store has none.
    fn scratch_dir(&self) -> Result<Option<&std::path::Path>, StoreError> {
        Ok(None)
    }
    /// Counts `bytes` a task wrote to files of [`ObjectStore::scratch_dir`]
    /// among the bytes spilled (the default counts nothing).
    fn count_scratch(&self, bytes: u64) {
        let _ = bytes;
    }
}

/// Frees and reads partitions for [`PartitionRef`]. Implemented by stores.
pub trait Release: Send + Sync {
    /// Frees the partition `id` of `bytes` bytes (once nobody reads it).
    fn release(&self, id: PartitionId, bytes: u64);
    /// Reads the partition `id`.
    fn read(self: Arc<Self>, id: PartitionId) -> Result<RecordBatch, StoreError>;
    /// Reads rows `rows` of partition `id`; see [`PartitionRef::get_rows`].
    fn read_rows(
        self: Arc<Self>,
        id: PartitionId,
        rows: std::ops::Range<usize>,
        alone: bool,
    ) -> Result<RecordBatch, StoreError> {
        let _ = alone;
        let batch = self.read(id)?;
        if rows.start > rows.end || rows.end > batch.num_rows() {
            return Err(StoreError::RowsOutOfRange {
                id,
                held: batch.num_rows(),
                rows,
            });
        }
        Ok(batch.slice(rows.start, rows.len()))
    }
    /// Where each group of partition `id`'s rows starts, and the end, when
    /// it was stored with groups ([`ObjectStore::put_grouped`]); the
    /// default keeps none.
    fn groups(&self, id: PartitionId) -> Option<Arc<[u32]>> {
        let _ = id;
        None
    }
}
