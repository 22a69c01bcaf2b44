//! Memory budgets of a job's stages over the store's capacity.
//!
//! Each stage that runs tasks is reserved `reserve` bytes for its outputs;
//! the rest of the capacity is a pool shared by all. A stage's outputs beyond
//! its reserve draw on the pool. So the outputs of all stages together never
//! exceed the capacity, and a downstream stage always has room for a
//! partition even when upstream stages have filled the pool: the job cannot
//! stall with memory full of inputs that nobody can consume.
//!
//! An admitted output holds a [`Reservation`] until the partition is
//! consumed; dropping it returns the bytes and tells the executor.

use std::sync::{Arc, Mutex};

/// What happens when memory is returned (the executor re-runs its policy).
pub type OnRelease = Arc<dyn Fn() + Send + Sync>;

/// The budgets of one job.
#[derive(Clone)]
pub struct Budgets {
    inner: Arc<Inner>,
}

struct Inner {
    reserve: Vec<u64>,
    pool: u64,
    used: Mutex<Vec<u64>>,
    on_release: OnRelease,
}

impl Budgets {
    /// Budgets for stages whose reserves are `reserve` (0 for stages that
    /// keep no outputs), sharing `capacity` bytes in all.
    pub fn new(capacity: u64, reserve: Vec<u64>, on_release: OnRelease) -> Self {
        let pool = capacity.saturating_sub(reserve.iter().sum());
        let used = Mutex::new(vec![0; reserve.len()]);
        Self {
            inner: Arc::new(Inner {
                reserve,
                pool,
                used,
                on_release,
            }),
        }
    }

    fn pool_used(&self, used: &[u64]) -> u64 {
        used.iter()
            .zip(&self.inner.reserve)
            .map(|(u, r)| u.saturating_sub(*r))
            .sum()
    }

    /// True when `bytes` more outputs of `stage` fit its budget now.
    pub fn fits(&self, stage: usize, bytes: u64) -> bool {
        let used = self.inner.used.lock().unwrap_or_else(|p| p.into_inner());
        self.fits_locked(&used, stage, bytes)
    }

    fn fits_locked(&self, used: &[u64], stage: usize, bytes: u64) -> bool {
        let reserve = self.inner.reserve[stage];
        let after = used[stage] + bytes;
        if after <= reserve {
            return true;
        }
        let pool_after =
            self.pool_used(used) - used[stage].saturating_sub(reserve) + (after - reserve);
        pool_after <= self.inner.pool
    }

    /// Reserves `bytes` for an output of `stage`, or `None` when they do not fit.
    pub fn try_admit(&self, stage: usize, bytes: u64) -> Option<Reservation> {
        let mut used = self.inner.used.lock().unwrap_or_else(|p| p.into_inner());
        if !self.fits_locked(&used, stage, bytes) {
            return None;
        }
        used[stage] += bytes;
        Some(Reservation {
            budgets: self.clone(),
            stage,
            bytes,
            notify: true,
        })
    }

    /// Reserves `bytes` for an output of `stage` even over budget: for a task
    /// the executor lets spill because nothing else can progress.
    pub fn force_admit(&self, stage: usize, bytes: u64) -> Reservation {
        self.inner.used.lock().unwrap_or_else(|p| p.into_inner())[stage] += bytes;
        Reservation {
            budgets: self.clone(),
            stage,
            bytes,
            notify: true,
        }
    }

    /// Bytes of `stage`'s outputs held now.
    pub fn used(&self, stage: usize) -> u64 {
        self.inner.used.lock().unwrap_or_else(|p| p.into_inner())[stage]
    }
}

/// Bytes of a stage's budget held by one output partition; returned on drop.
pub struct Reservation {
    budgets: Budgets,
    stage: usize,
    bytes: u64,
    notify: bool,
}

impl Reservation {
    /// Returns the bytes without telling the executor: for a reservation
    /// whose partition was never stored, so nothing was waiting on it.
    pub fn cancel(mut self) {
        self.notify = false;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        {
            let mut used = self
                .budgets
                .inner
                .used
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            used[self.stage] -= self.bytes;
        }
        if self.notify {
            (self.budgets.inner.on_release)();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budgets(capacity: u64, reserve: Vec<u64>) -> Budgets {
        Budgets::new(capacity, reserve, Arc::new(|| {}))
    }

    #[test]
    fn a_stage_always_keeps_its_reserve() {
        let b = budgets(100, vec![10, 10]);
        // Stage 0 takes its reserve and the whole pool.
        let _held: Vec<_> = (0..9).map(|_| b.try_admit(0, 10).unwrap()).collect();
        assert!(b.try_admit(0, 10).is_none(), "stage 0 is at its limit");
        assert!(
            b.try_admit(1, 10).is_some(),
            "stage 1's reserve is still there"
        );
    }

    #[test]
    fn dropping_a_reservation_returns_bytes_and_notifies() {
        let released = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = released.clone();
        let b = Budgets::new(
            30,
            vec![10, 10],
            Arc::new(move || {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }),
        );
        let r = b.try_admit(0, 20).unwrap();
        assert!(b.try_admit(0, 1).is_none());
        drop(r);
        assert_eq!(b.used(0), 0);
        assert_eq!(released.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(b.try_admit(0, 20).is_some());
    }

    proptest::proptest! {
        #[test]
        fn outputs_never_exceed_capacity(ops in proptest::collection::vec((0usize..3, 1u64..40, proptest::bool::ANY), 1..200)) {
            let b = budgets(100, vec![10, 10, 10]);
            let mut held: Vec<Reservation> = Vec::new();
            for (stage, bytes, release) in ops {
                if release && !held.is_empty() {
                    held.remove(bytes as usize % held.len());
                } else if let Some(r) = b.try_admit(stage, bytes) {
                    held.push(r);
                }
                let total: u64 = (0..3).map(|s| b.used(s)).sum();
                proptest::prop_assert!(total <= 100);
            }
        }
    }
}
