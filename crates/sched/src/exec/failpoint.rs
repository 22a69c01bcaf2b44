//! Deterministic fault injection, compiled only with the `failpoints`
//! feature (the tests' builds). `SB_FAILPOINTS` names the faults, `;`
//! between them:
//!
//! - `worker.panic=SEED:PERCENT`: a worker panics before running a task,
//!   for about PERCENT % of tasks, chosen by a hash of SEED, the job's id
//!   and the task's; each chosen task panics once per process, so its
//!   retry runs (and a loop of jobs panics in every job).
//! - `worker.sleep=MS`: a worker sleeps MS milliseconds before each task
//!   (a job slow enough to be killed half-way).
//! - `store.put=SEED:PERCENT`: storing a task's output fails (a store
//!   error, a system failure) for about PERCENT % of (task, output) pairs,
//!   each once per process.
//! - `fetch=SEED:PERCENT`: pulling an input partition from another node
//!   fails for about PERCENT % of (task, partition) pairs, once each.
//! - `executor.panic=JOB`: the executor of job JOB (this process's job
//!   ids) panics on the first task event it handles.
//! - `relay.panic=N`: the relay that handles the N-th job order this
//!   process gets panics (once per process).
//!
//! (Not a `STREAMBATCH_` variable: those are config keys.)

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use streambatch_core::TaskId;

struct Faults {
    worker_panic: Option<(u64, u64)>,
    worker_sleep: Option<u64>,
    store_put: Option<(u64, u64)>,
    fetch: Option<(u64, u64)>,
    executor_panic: Option<u64>,
    relay_panic: Option<u64>,
    /// What each fault has hit in this process, so that each hits once.
    hit: Mutex<HashSet<(&'static str, u64, u64)>>,
}

fn faults() -> &'static Faults {
    static FAULTS: OnceLock<Faults> = OnceLock::new();
    FAULTS.get_or_init(|| {
        let spec = std::env::var("SB_FAILPOINTS").unwrap_or_default();
        let chance = |name: &str| {
            spec.split(';').find_map(|f| {
                let (seed, percent) = f.strip_prefix(name)?.strip_prefix('=')?.split_once(':')?;
                Some((seed.parse().ok()?, percent.parse().ok()?))
            })
        };
        let worker_panic = chance("worker.panic");
        let number = |name: &str| {
            spec.split(';')
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
        };
        Faults {
            worker_panic,
            worker_sleep: number("worker.sleep"),
            executor_panic: number("executor.panic"),
            relay_panic: number("relay.panic"),
            store_put: chance("store.put"),
            fetch: chance("fetch"),
            hit: Mutex::default(),
        }
    })
}

/// Sleeps as `worker.sleep` says, then panics if `worker.panic` chose
/// `task` of job `job` and it has not panicked here yet.
pub(crate) fn worker(job: u64, task: TaskId) {
    let faults = faults();
    if let Some(ms) = faults.worker_sleep {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    if faults.hits("worker.panic", faults.worker_panic, task.0, job) {
        panic!("failpoint worker.panic: job {job}, task {task}");
    }
}

/// Panics if `executor.panic` names `job` (once).
pub(crate) fn executor(job: u64) {
    let faults = faults();
    if faults.executor_panic == Some(job) && faults.once("executor.panic", job, 0) {
        panic!("failpoint executor.panic: job {job}");
    }
}

/// Counts an order of `job` that a relay handles, and panics if it is
/// the one `relay.panic` names.
pub(crate) fn relay(job: u64) {
    static ORDERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let order = ORDERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    if faults().relay_panic == Some(order) {
        panic!("failpoint relay.panic: job {job}, order {order}");
    }
}

/// An error if `store.put` chose output `seq` of `task` (once).
pub(crate) fn store_put(task: TaskId, seq: u32) -> Option<String> {
    let faults = faults();
    faults
        .hits("store.put", faults.store_put, task.0, seq.into())
        .then(|| format!("failpoint store.put: task {task}, output {seq}"))
}

/// An error if `fetch` chose partition `partition` for `task` (once).
pub(crate) fn fetch(task: TaskId, partition: u64) -> Option<String> {
    let faults = faults();
    faults
        .hits("fetch", faults.fetch, task.0, partition)
        .then(|| format!("failpoint fetch: task {task}, partition {partition}"))
}

impl Faults {
    /// True the first time `fault` (set to `chance`) chooses `(a, b)`.
    fn hits(&self, fault: &'static str, chance: Option<(u64, u64)>, a: u64, b: u64) -> bool {
        let Some((seed, percent)) = chance else {
            return false;
        };
        let key = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_mul(0xD1B5_4A32_D192_ED03);
        streambatch_core::mix64(seed ^ key) % 100 < percent && self.once(fault, a, b)
    }

    /// True the first time `fault` hits `(a, b)` in this process.
    fn once(&self, fault: &'static str, a: u64, b: u64) -> bool {
        let mut hit = self.hit.lock().unwrap_or_else(|p| p.into_inner());
        hit.insert((fault, a, b))
    }
}
