//! [`PartitionRef`], the counted reference to a stored partition that
//! frees it when its last clone drops, and [`PinGuard`], which keeps one in
//! memory; with [`cuts_in_order`], the check of the row groups a partition
//! may be stored with.

use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use streambatch_core::PartitionId;

use crate::{Release, StoreError};

/// A counted reference to a stored partition. Cloning is cheap; the partition
/// is freed when the last clone is dropped.
#[derive(Clone)]
pub struct PartitionRef {
    inner: Arc<Inner>,
}

struct Inner {
    id: PartitionId,
    rows: usize,
    bytes: u64,
    store: Arc<dyn Release>,
}

impl PartitionRef {
    /// Made by a store when it has stored a partition.
    pub fn new(id: PartitionId, rows: usize, bytes: u64, store: Arc<dyn Release>) -> Self {
        Self {
            inner: Arc::new(Inner {
                id,
                rows,
                bytes,
                store,
            }),
        }
    }

    /// The partition's id.
    pub fn id(&self) -> PartitionId {
        self.inner.id
    }

    /// Its rows.
    pub fn rows(&self) -> usize {
        self.inner.rows
    }

    /// Its bytes in the store.
    pub fn bytes(&self) -> u64 {
        self.inner.bytes
    }

    /// Reads it.
    pub fn get(&self) -> Result<RecordBatch, StoreError> {
        self.inner.store.clone().read(self.inner.id)
    }

    /// Reads rows `rows` of it. A spilled partition stored with groups
    /// (`ObjectStore::put_grouped`) reads only the groups that hold them.
    /// With `alone`, the batch does not hold the rest of the partition
    /// when the rows are a small part of it (they are copied): a reader
    /// keeping a destination's rows of many partitions then keeps those
    /// rows, not every partition whole.
    pub fn get_rows(
        &self,
        rows: std::ops::Range<usize>,
        alone: bool,
    ) -> Result<RecordBatch, StoreError> {
        self.inner
            .store
            .clone()
            .read_rows(self.inner.id, rows, alone)
    }
}

impl PartitionRef {
    /// Where each group of its rows starts, and the end, when it was
    /// stored with groups (`ObjectStore::put_grouped`): an exchange's map
    /// output, whose reducers its holder finds by them.
    pub fn groups(&self) -> Option<Arc<[u32]>> {
        self.inner.store.groups(self.inner.id)
    }

    /// The rows of group `group` of it, when it was stored with groups and
    /// has that group.
    pub fn group_rows(&self, group: usize) -> Option<std::ops::Range<usize>> {
        let cut = self.groups()?;
        let (start, end) = (*cut.get(group)?, *cut.get(group.checked_add(1)?)?);
        (start <= end).then_some(start as usize..end as usize)
    }
}

/// Whether `groups` (where each group starts, and the end) cut `rows`
/// rows in order: the groups a store keeps with a partition
/// (`ObjectStore::put_grouped`), as a peer's cut sent with one must be.
pub fn cuts_in_order(groups: &[u32], rows: usize) -> bool {
    groups.len() >= 2
        && groups[0] == 0
        && groups[groups.len() - 1] as usize == rows
        && groups.windows(2).all(|w| w[0] <= w[1])
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.store.release(self.id, self.bytes);
    }
}

impl fmt::Debug for PartitionRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PartitionRef({}, {} rows, {} bytes)",
            self.inner.id, self.inner.rows, self.inner.bytes
        )
    }
}

/// Keeps a partition in memory while it lives (see [`crate::ObjectStore::pin`]).
pub struct PinGuard {
    _pin: Arc<dyn std::any::Any + Send + Sync>,
}

impl PinGuard {
    /// Made by a store around its own pin record, released when dropped.
    pub fn new(pin: Arc<dyn std::any::Any + Send + Sync>) -> Self {
        Self { _pin: pin }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cut a peer sent with a map output it hands over is kept only if
    /// it cuts the rows that came, in order.
    #[test]
    fn a_cut_sent_with_a_partition_must_cut_its_rows_in_order() {
        assert!(cuts_in_order(&[0, 3, 3, 10], 10));
        for refused in [&[0, 3, 2, 10][..], &[0, 3], &[1, 10], &[10], &[]] {
            assert!(!cuts_in_order(refused, 10), "{refused:?}");
        }
    }
}
