use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use streambatch_core::PartitionId;

use crate::{ObjectStore, PartitionRef, PutError, Release, StoreError, StoreStats, batch_bytes};

/// Partitions held as Arrow batches in this process's memory, never more
/// bytes than its capacity.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    capacity: u64,
    next_id: AtomicU64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    partitions: HashMap<PartitionId, RecordBatch>,
    used: u64,
    peak: u64,
}

impl MemoryStore {
    /// A store that holds at most `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        Self {
            inner: Arc::new(Inner {
                capacity,
                next_id: AtomicU64::new(1),
                state: Mutex::new(State::default()),
            }),
        }
    }
}

impl Inner {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the map half-updated: every update is
        // a single insert or remove, so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ObjectStore for MemoryStore {
    fn try_put(&self, batch: RecordBatch) -> Result<PartitionRef, PutError> {
        let bytes = batch_bytes(&batch);
        let capacity = self.inner.capacity;
        if bytes > capacity {
            return Err(PutError::TooLarge {
                needed: bytes,
                capacity,
            });
        }
        let id = PartitionId(self.inner.next_id.fetch_add(1, Ordering::Relaxed));
        let rows = batch.num_rows();
        {
            let mut state = self.inner.state();
            if state.used + bytes > capacity {
                let used = state.used;
                return Err(PutError::Full {
                    batch,
                    needed: bytes,
                    used,
                    capacity,
                });
            }
            state.used += bytes;
            state.peak = state.peak.max(state.used);
            state.partitions.insert(id, batch);
        }
        Ok(PartitionRef::new(id, rows, bytes, self.inner.clone()))
    }

    fn get(&self, id: PartitionId) -> Result<RecordBatch, StoreError> {
        self.inner.read(id)
    }

    fn stats(&self) -> StoreStats {
        let state = self.inner.state();
        StoreStats {
            capacity_bytes: self.inner.capacity,
            used_bytes: state.used,
            peak_bytes: state.peak,
            partitions: state.partitions.len(),
            spilled_bytes: 0,
            restored_bytes: 0,
        }
    }
}

impl Release for Inner {
    fn release(&self, id: PartitionId, bytes: u64) {
        let mut state = self.state();
        if state.partitions.remove(&id).is_some() {
            state.used -= bytes;
        }
    }

    fn read(&self, id: PartitionId) -> Result<RecordBatch, StoreError> {
        self.state()
            .partitions
            .get(&id)
            .cloned()
            .ok_or(StoreError::Missing(id))
    }
}
