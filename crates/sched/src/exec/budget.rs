//! Memory budgets of a job's stages over the store's capacity.
//!
//! Each stage that runs tasks is reserved `reserve` bytes for its outputs;
//! the rest of the capacity is a pool shared by all. A stage's outputs beyond
//! its reserve draw on the pool. So the outputs of all stages together never
//! exceed the capacity, and a downstream stage always has room for a
//! partition even when upstream stages have filled the pool: the job cannot
//! stall with memory full of inputs that nobody can consume.
//!
//! A reserve starts at the largest partition a stage may emit and shrinks
//! to the largest it has emitted ([`Budgets::fit_reserve`]): a stage whose
//! outputs are small (a sink's counts, an inference stage's ids) leaves the
//! rest to the pool, where upstream stages can use it.
//!
//! An admitted output holds a [`Reservation`] until the partition is
//! consumed; dropping it returns the bytes and tells the executor.
//!
//! A task that keeps input in memory outside the store while it runs (a
//! binary file read whole) takes a [`Hold`] on those bytes: outputs then
//! have that much less room, so that the files held and the store's
//! contents together stay within the capacity. A sort's or join's reducer
//! holds its input through a [`ReducerPool`] instead, which grows as the
//! reducer keeps input and gives back what it spills.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use streambatch_plan::MemoryPool;

/// A sort or join reducer holds up to this many partitions' worth of its
/// input (the job's target partition size) before it writes to scratch
/// files: an input of the size the exchange meant (about one) never does;
/// one that a hot key made several times larger does, rather than fill
/// memory. What it holds counts against the store's capacity
/// ([`input_held_cap`]).
pub const REDUCER_HELD_PARTITIONS: u64 = 4;

/// What a task of `stage` may hold of its input outside the store for a
/// partition size of `target_bytes`: a sort's or join's reducer holds up
/// to [`REDUCER_HELD_PARTITIONS`] partitions before it writes scratch
/// files; 0 for other stages, which stream their input.
pub fn input_held_cap(stage: &streambatch_plan::Stage, target_bytes: u64) -> u64 {
    match stage.writes_scratch() {
        true => REDUCER_HELD_PARTITIONS * target_bytes,
        false => 0,
    }
}

/// What happens when memory is returned (the executor re-runs its policy).
pub type OnRelease = Arc<dyn Fn() + Send + Sync>;

/// The budgets of one job.
#[derive(Clone)]
pub struct Budgets {
    inner: Arc<Inner>,
}

struct Inner {
    capacity: u64,
    /// Each stage's use, added up with other budgets sharing the totals.
    totals: StageTotals,
    /// The reserves as the job started: the most a reserve grows back to.
    initial: Vec<u64>,
    state: Mutex<State>,
    on_release: OnRelease,
    /// Whether a release is told (`on_release`): only while the job may
    /// wait on memory (see [`Budgets::listen`]).
    listening: AtomicBool,
}

/// Reserves and use per stage, changed together under one lock.
struct State {
    reserve: Vec<u64>,
    used: Vec<u64>,
    /// Bytes tasks hold outside the store ([`Hold`]).
    outside: u64,
}

impl State {
    /// The shared pool: what the reserves leave of the capacity.
    fn pool(&self, capacity: u64) -> u64 {
        capacity.saturating_sub(self.reserve.iter().sum::<u64>() + self.outside)
    }

    /// Bytes of the pool in use: each stage's use beyond its reserve.
    fn pool_used(&self) -> u64 {
        self.used
            .iter()
            .zip(&self.reserve)
            .map(|(u, r)| u.saturating_sub(*r))
            .sum()
    }

    /// Whether `bytes` more of `stage` fit: within its reserve, or the
    /// excess within what is left of the pool.
    fn fits(&self, capacity: u64, stage: usize, bytes: u64) -> bool {
        // A reserve that grew back may be lent out still: never past the capacity.
        if self.used.iter().sum::<u64>() + self.outside + bytes > capacity {
            return false;
        }
        let reserve = self.reserve[stage];
        let after = self.used[stage] + bytes;
        if after <= reserve {
            return true;
        }
        let pool_after =
            self.pool_used() - self.used[stage].saturating_sub(reserve) + (after - reserve);
        pool_after <= self.pool(capacity)
    }
}

impl Budgets {
    /// Budgets for stages whose reserves are `reserve` (0 for stages that
    /// keep no outputs), sharing `capacity` bytes in all.
    pub fn new(capacity: u64, reserve: Vec<u64>, on_release: OnRelease) -> Self {
        let totals = StageTotals::new(reserve.len());
        Self::adding_to(totals, capacity, reserve, on_release)
    }

    /// [`Budgets::new`], adding each stage's use to `totals` (shared by a
    /// job's budgets on all its nodes).
    pub fn adding_to(
        totals: StageTotals,
        capacity: u64,
        reserve: Vec<u64>,
        on_release: OnRelease,
    ) -> Self {
        let used = vec![0; reserve.len()];
        Self {
            inner: Arc::new(Inner {
                capacity,
                totals,
                initial: reserve.clone(),
                state: Mutex::new(State {
                    reserve,
                    used,
                    outside: 0,
                }),
                on_release,
                listening: AtomicBool::new(true),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True when `bytes` more outputs of `stage` fit its budget now.
    pub fn fits(&self, stage: usize, bytes: u64) -> bool {
        self.state().fits(self.inner.capacity, stage, bytes)
    }

    /// Sets `stage`'s reserve to `largest_output` (the largest partition it
    /// has emitted), never above its reserve at the start: the rest goes to
    /// the pool. A larger partition later grows it back.
    pub fn fit_reserve(&self, stage: usize, largest_output: u64) {
        let reserve = largest_output.min(self.inner.initial[stage]);
        self.state().reserve[stage] = reserve;
    }

    /// Reserves `bytes` for an output of `stage`, or says why they do not
    /// fit.
    pub fn try_admit(&self, stage: usize, bytes: u64) -> Result<Reservation, Refused> {
        let mut state = self.state();
        if !state.fits(self.inner.capacity, stage, bytes) {
            let used: u64 = state.used.iter().sum::<u64>() + state.outside;
            return Err(Refused {
                stage,
                needed: bytes,
                held: state.used[stage],
                reserve: state.reserve[stage],
                free: self.inner.capacity.saturating_sub(used),
                capacity: self.inner.capacity,
            });
        }
        state.used[stage] += bytes;
        self.inner.totals.add(stage, bytes);
        Ok(Reservation {
            budgets: self.clone(),
            stage,
            bytes,
            notify: true,
        })
    }

    /// Reserves `bytes` for an output of `stage` even over budget: for a task
    /// the executor lets spill because nothing else can progress.
    pub fn force_admit(&self, stage: usize, bytes: u64) -> Reservation {
        self.state().used[stage] += bytes;
        self.inner.totals.add(stage, bytes);
        Reservation {
            budgets: self.clone(),
            stage,
            bytes,
            notify: true,
        }
    }

    /// Bytes of `stage`'s outputs held now.
    pub fn used(&self, stage: usize) -> u64 {
        self.state().used[stage]
    }

    /// Whether releases are told from now on. The executor listens while
    /// its job may wait on memory (a task could start but for memory), and
    /// not otherwise: then the next task to end decides anew anyway, and a
    /// message per released output would only wake it for nothing. It
    /// turns listening on before each decision pass, so that no release
    /// during the pass goes unheard.
    pub fn listen(&self, on: bool) {
        self.inner.listening.store(on, Ordering::SeqCst);
    }

    /// Tells a release, if anyone listens.
    fn released(&self) {
        if self.inner.listening.load(Ordering::SeqCst) {
            (self.inner.on_release)();
        }
    }

    /// The totals this budget adds its stages' use to.
    pub fn totals(&self) -> &StageTotals {
        &self.inner.totals
    }

    /// The capacity the budgets share.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// Bytes held outside the store now ([`Budgets::hold`]).
    pub fn outside(&self) -> u64 {
        self.state().outside
    }

    /// Takes `bytes` off the room outputs have, for input a task keeps in
    /// memory outside the store, until the hold drops. Always granted (the
    /// executor decides which tasks start, `job::hold_fits`): one hold may
    /// exceed the capacity, and outputs then wait until the executor lets
    /// a task spill because nothing else can run.
    pub fn hold(&self, bytes: u64) -> Hold {
        self.state().outside += bytes;
        Hold {
            budgets: self.clone(),
            bytes,
        }
    }
}

/// Each stage's outputs held over several [`Budgets`] (one per node of a
/// job), kept as reservations come and go: reading them costs no pass over
/// the nodes, which a decision on every event cannot afford on a thousand.
#[derive(Clone)]
pub struct StageTotals(Arc<[AtomicU64]>);

impl StageTotals {
    /// Totals for `stages` stages, all zero.
    pub fn new(stages: usize) -> Self {
        Self((0..stages).map(|_| AtomicU64::new(0)).collect())
    }

    /// Bytes of `stage`'s outputs held now, over all the budgets.
    pub fn held(&self, stage: usize) -> u64 {
        self.0[stage].load(Ordering::Relaxed)
    }

    fn add(&self, stage: usize, bytes: u64) {
        self.0[stage].fetch_add(bytes, Ordering::Relaxed);
    }

    fn sub(&self, stage: usize, bytes: u64) {
        self.0[stage].fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Bytes a running task keeps in memory outside the store; returned on drop.
pub struct Hold {
    budgets: Budgets,
    bytes: u64,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.budgets.state().outside -= self.bytes;
        self.budgets.released();
    }
}

/// A spilling reducer's memory for its input (plan's [`MemoryPool`]): at
/// most `cap` bytes ([`input_held_cap`]), held outside the store as a
/// [`Hold`] is. The reducer starts with what the executor admitted it for
/// (`job::hold_fits`) and keeps that until it first spills; from then on
/// the hold follows what its reservation holds, so that what it gives
/// back by spilling is room for outputs and other tasks at once.
pub struct ReducerPool {
    budgets: Budgets,
    cap: u64,
    state: Mutex<PoolState>,
}

struct PoolState {
    /// Bytes the reservation holds.
    used: u64,
    /// Bytes admitted at the start, until the first spill.
    admitted: u64,
    /// Bytes counted outside the store now: the larger of the two.
    held: u64,
}

impl ReducerPool {
    /// A pool of at most `cap` bytes, `admitted` of them held from now.
    pub fn new(budgets: Budgets, cap: u64, admitted: u64) -> Self {
        budgets.state().outside += admitted;
        Self {
            budgets,
            cap,
            state: Mutex::new(PoolState {
                used: 0,
                admitted,
                held: admitted,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts outside the store what `state` holds now; tells a release.
    fn settle(&self, state: &mut PoolState) {
        let held = state.used.max(state.admitted);
        let mut budgets = self.budgets.state();
        budgets.outside = budgets.outside - state.held + held;
        drop(budgets);
        let released = held < state.held;
        state.held = held;
        if released {
            self.budgets.released();
        }
    }
}

impl MemoryPool for ReducerPool {
    fn try_grow(&self, bytes: u64) -> bool {
        let mut state = self.state();
        if state.used + bytes > self.cap {
            return false;
        }
        state.used += bytes;
        self.settle(&mut state);
        true
    }

    fn shrink(&self, bytes: u64) {
        let mut state = self.state();
        state.used -= bytes;
        state.admitted = 0;
        self.settle(&mut state);
    }
}

impl Drop for ReducerPool {
    fn drop(&mut self) {
        let held = self.state().held;
        self.budgets.state().outside -= held;
        self.budgets.released();
    }
}

/// Why an output was not admitted: what it needed and what there was, the
/// way DataFusion's memory pool reports it. The task holding the output
/// pauses until memory is returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "stage {stage} cannot reserve {needed} bytes for an output: it holds {held} \
     (reserve {reserve}); {free} bytes of the store's {capacity} are free to the job"
)]
pub struct Refused {
    /// The stage's position in the plan.
    pub stage: usize,
    /// Bytes of the output.
    pub needed: u64,
    /// Bytes of the stage's outputs held now.
    pub held: u64,
    /// The stage's own reserve.
    pub reserve: u64,
    /// Bytes of the capacity that no stage holds.
    pub free: u64,
    /// The store's capacity.
    pub capacity: u64,
}

/// Bytes of a stage's budget held by one output partition; returned on drop.
pub struct Reservation {
    budgets: Budgets,
    stage: usize,
    bytes: u64,
    notify: bool,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("stage", &self.stage)
            .field("bytes", &self.bytes)
            .finish()
    }
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
        self.budgets.state().used[self.stage] -= self.bytes;
        self.budgets.inner.totals.sub(self.stage, self.bytes);
        if self.notify {
            self.budgets.released();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_leaves_outputs_less_room_until_it_drops() {
        let b = budgets(100, vec![10]);
        let hold = b.hold(60);
        assert!(b.fits(0, 40));
        assert!(!b.fits(0, 41));
        let refused = b.try_admit(0, 50).unwrap_err();
        assert_eq!(refused.free, 40);
        // Outputs only count as the stage's use.
        let _r = b.try_admit(0, 40).unwrap();
        assert_eq!(b.used(0), 40);
        drop(hold);
        assert!(b.fits(0, 60));
    }

    /// A reducer's pool holds its admission until it first spills, grows
    /// up to its cap as it keeps input, and gives back what it spills:
    /// each step is room outputs have or lack, and a release is told.
    #[test]
    fn a_reducer_pool_grows_with_its_input_and_gives_back_what_it_spills() {
        let releases = Arc::new(AtomicU64::new(0));
        let told = releases.clone();
        let b = Budgets::new(
            100,
            vec![0],
            Arc::new(move || {
                told.fetch_add(1, Ordering::Relaxed);
            }),
        );
        let pool = Arc::new(ReducerPool::new(b.clone(), 50, 30));
        assert_eq!(b.outside(), 30, "the admission is held from the start");
        let mut reservation = streambatch_plan::MemoryReservation::new(pool.clone());
        assert!(reservation.try_grow(20));
        assert_eq!(b.outside(), 30, "within the admission");
        assert!(reservation.try_grow(20));
        assert_eq!(b.outside(), 40);
        assert!(!b.fits(0, 61));
        assert!(!reservation.try_grow(11), "past the cap: spill");
        assert_eq!(reservation.free(), 40);
        assert_eq!(b.outside(), 0, "a spill gives back the admission too");
        assert!(releases.load(Ordering::Relaxed) > 0);
        assert!(reservation.try_grow(10));
        assert_eq!(b.outside(), 10);
        drop(reservation);
        drop(pool);
        assert_eq!(b.outside(), 0);
    }

    fn budgets(capacity: u64, reserve: Vec<u64>) -> Budgets {
        Budgets::new(capacity, reserve, Arc::new(|| {}))
    }

    #[test]
    fn a_stage_always_keeps_its_reserve() {
        let b = budgets(100, vec![10, 10]);
        // Stage 0 takes its reserve and the whole pool.
        let _held: Vec<_> = (0..9).map(|_| b.try_admit(0, 10).unwrap()).collect();
        assert!(b.try_admit(0, 10).is_err(), "stage 0 is at its limit");
        assert!(
            b.try_admit(1, 10).is_ok(),
            "stage 1's reserve is still there"
        );
    }

    #[test]
    fn a_reserve_fitted_to_small_outputs_leaves_the_rest_to_the_pool() {
        let b = budgets(100, vec![30, 30]);
        let held: Vec<_> = (0..7).map(|_| b.try_admit(0, 10).unwrap()).collect();
        assert!(
            b.try_admit(0, 10).is_err(),
            "stage 1's reserve of 30 is kept"
        );
        b.fit_reserve(1, 1);
        let more: Vec<_> = (0..2).map(|_| b.try_admit(0, 10).unwrap()).collect();
        assert!(
            b.try_admit(0, 10).is_err(),
            "90 held, 1 reserved for stage 1"
        );
        assert!(b.fits(1, 1), "stage 1 keeps room for its output");
        b.fit_reserve(1, 1_000);
        assert!(b.fits(1, 10), "the reserve grew back to what is free");
        assert!(!b.fits(1, 11), "but never past the capacity");
        drop((held, more));
        let again: Vec<_> = (0..7).map(|_| b.try_admit(0, 10).unwrap()).collect();
        assert!(b.try_admit(0, 10).is_err(), "stage 1's reserve is 30 again");
        drop(again);
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
        assert!(b.try_admit(0, 1).is_err());
        drop(r);
        assert_eq!(b.used(0), 0);
        assert_eq!(released.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(b.try_admit(0, 20).is_ok());
    }

    #[test]
    fn a_refusal_names_the_stage_the_bytes_and_what_is_free() {
        let b = budgets(100, vec![10, 10]);
        let _held = b.try_admit(0, 90).unwrap();
        let refused = b.try_admit(0, 5).unwrap_err();
        assert_eq!(
            refused,
            Refused {
                stage: 0,
                needed: 5,
                held: 90,
                reserve: 10,
                free: 10,
                capacity: 100,
            }
        );
        assert_eq!(
            refused.to_string(),
            "stage 0 cannot reserve 5 bytes for an output: it holds 90 (reserve 10); \
             10 bytes of the store's 100 are free to the job"
        );
    }

    proptest::proptest! {
        #[test]
        fn outputs_never_exceed_capacity(ops in proptest::collection::vec((0usize..3, 1u64..40, proptest::bool::ANY), 1..200)) {
            let b = budgets(100, vec![10, 10, 10]);
            let mut held: Vec<Reservation> = Vec::new();
            for (stage, bytes, release) in ops {
                if release && !held.is_empty() {
                    held.remove(bytes as usize % held.len());
                } else if let Ok(r) = b.try_admit(stage, bytes) {
                    held.push(r);
                }
                let total: u64 = (0..3).map(|s| b.used(s)).sum();
                proptest::prop_assert!(total <= 100);
            }
        }
    }
}
