use arrow_array::RecordBatch;
use streambatch_core::{PartitionId, format_bytes};

/// Errors of the object store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The partition is not (or no longer) in the store.
    #[error("partition {0} is not in the store")]
    Missing(PartitionId),
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
    /// The batch alone is larger than the whole store.
    #[error(
        "a partition of {} can never fit in an object store of {}; raise store_capacity or lower target_partition_bytes",
        format_bytes(*needed), format_bytes(*capacity)
    )]
    TooLarge {
        /// Its size.
        needed: u64,
        /// The capacity.
        capacity: u64,
    },
}
