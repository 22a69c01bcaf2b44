//! Memory a spilling reducer holds, asked for as its input grows and
//! given back when it spills (as DataFusion's `MemoryReservation` over a
//! `MemoryPool`).
//!
//! A reducer (a sort's runs, a join's buckets) grows its
//! [`MemoryReservation`] by each batch it keeps; when the pool refuses, it
//! writes what it holds to scratch files and frees the reservation. What
//! grants the bytes is the runner's affair: the scheduler's pool counts
//! them against the node's store budget, so that what reducers hold and
//! what the store holds stay within one capacity together.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Grants and takes back the bytes of [`MemoryReservation`]s.
pub trait MemoryPool: Send + Sync {
    /// Grants `bytes` more, or refuses them (the reducer then spills).
    fn try_grow(&self, bytes: u64) -> bool;
    /// Takes back `bytes` granted earlier.
    fn shrink(&self, bytes: u64);
}

/// Bytes one reducer holds of a [`MemoryPool`]; given back on drop.
///
/// ```
/// use std::sync::Arc;
/// use streambatch_plan::{FixedPool, MemoryReservation};
///
/// let pool = Arc::new(FixedPool::new(100));
/// let mut reservation = MemoryReservation::new(pool.clone());
/// assert!(reservation.try_grow(60));
/// assert!(!reservation.try_grow(60)); // past the pool: spill instead
/// assert_eq!(reservation.free(), 60);
/// assert_eq!(pool.used(), 0);
/// ```
pub struct MemoryReservation {
    pool: Arc<dyn MemoryPool>,
    bytes: u64,
}

impl MemoryReservation {
    /// An empty reservation of `pool`.
    pub fn new(pool: Arc<dyn MemoryPool>) -> Self {
        Self { pool, bytes: 0 }
    }

    /// Bytes held now.
    pub fn size(&self) -> u64 {
        self.bytes
    }

    /// Holds `bytes` more if the pool grants them.
    pub fn try_grow(&mut self, bytes: u64) -> bool {
        let granted = self.pool.try_grow(bytes);
        if granted {
            self.bytes += bytes;
        }
        granted
    }

    /// Gives back all it holds; returns how much that was.
    pub fn free(&mut self) -> u64 {
        let bytes = std::mem::take(&mut self.bytes);
        if bytes > 0 {
            self.pool.shrink(bytes);
        }
        bytes
    }
}

impl Drop for MemoryReservation {
    fn drop(&mut self) {
        self.free();
    }
}

impl std::fmt::Debug for MemoryReservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryReservation")
            .field("bytes", &self.bytes)
            .finish()
    }
}

/// A pool of a fixed number of bytes, shared by its reservations: for a
/// reducer run outside a scheduler (tests, an embedder's own loop).
#[derive(Debug)]
pub struct FixedPool {
    limit: u64,
    used: AtomicU64,
}

impl FixedPool {
    /// A pool that grants up to `limit` bytes at once.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            used: AtomicU64::new(0),
        }
    }

    /// Bytes granted now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}

impl MemoryPool for FixedPool {
    fn try_grow(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&after| after <= self.limit)
            })
            .is_ok()
    }

    fn shrink(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_share_the_pool_and_give_back_on_drop() {
        let pool = Arc::new(FixedPool::new(100));
        let mut a = MemoryReservation::new(pool.clone());
        let mut b = MemoryReservation::new(pool.clone());
        assert!(a.try_grow(70));
        assert!(!b.try_grow(31), "70 + 31 is past the limit");
        assert!(b.try_grow(30));
        assert_eq!((a.size(), b.size(), pool.used()), (70, 30, 100));
        drop(a);
        assert_eq!(pool.used(), 30);
        assert!(b.try_grow(70));
        assert_eq!(b.free(), 100);
        assert_eq!(pool.used(), 0);
    }
}
