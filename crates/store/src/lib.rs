//! The streambatch object store: where partitions live between the operator
//! that yields them and the one that consumes them.
//!
//! [`ObjectStore`] is the interface the executor uses; [`MemoryStore`] keeps
//! partitions as Arrow batches in process memory with strict capacity
//! accounting. A partition lives as long as a [`PartitionRef`] to it: dropping
//! the last one frees it (RAII), so nothing has to remember to delete.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{Int64Array, RecordBatch};
//! use streambatch_store::{MemoryStore, ObjectStore};
//!
//! let store = MemoryStore::new(1 << 20);
//! let batch = RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from(vec![1, 2, 3])) as _)]).unwrap();
//! let part = store.try_put(batch.clone()).unwrap();
//! assert_eq!(part.get().unwrap(), batch);
//! assert!(store.stats().used_bytes > 0);
//! drop(part);
//! assert_eq!(store.stats().used_bytes, 0);
//! ```

mod error;
mod memory;
mod partition;

pub use error::{PutError, StoreError};
pub use memory::MemoryStore;
pub use partition::PartitionRef;
pub use streambatch_core::batch_bytes;

use arrow_array::RecordBatch;
use streambatch_core::PartitionId;

/// Counters of a store, read at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Bytes the store may hold in memory.
    pub capacity_bytes: u64,
    /// Bytes held now.
    pub used_bytes: u64,
    /// The most bytes held at any instant since the store was made.
    pub peak_bytes: u64,
    /// Partitions held now.
    pub partitions: usize,
    /// Bytes written to spill files (0 for a store that does not spill).
    pub spilled_bytes: u64,
    /// Bytes read back from spill files.
    pub restored_bytes: u64,
}

/// A store of immutable partitions, each one Arrow `RecordBatch`.
///
/// `try_put` never waits and never exceeds capacity: when the batch does not
/// fit it hands the batch back in [`PutError::Full`], so that the caller (a
/// task) can pause and retry once memory is freed, without losing data.
pub trait ObjectStore: Send + Sync + 'static {
    /// Stores `batch`, returning the first reference to it.
    fn try_put(&self, batch: RecordBatch) -> Result<PartitionRef, PutError>;
    /// Reads a live partition.
    fn get(&self, id: PartitionId) -> Result<RecordBatch, StoreError>;
    /// The store's counters.
    fn stats(&self) -> StoreStats;
}

/// Releases a partition when its last reference goes. Implemented by stores.
pub trait Release: Send + Sync {
    /// Frees the partition `id` of `bytes` bytes.
    fn release(&self, id: PartitionId, bytes: u64);
    /// Reads the partition `id`.
    fn read(&self, id: PartitionId) -> Result<RecordBatch, StoreError>;
}
