//! Deterministic fault injection, compiled only with the `failpoints`
//! feature (the tests' builds). `SB_FAILPOINTS` names the faults, `;`
//! between them:
//!
//! - `worker.panic=SEED:PERCENT`: a worker panics before running a task,
//!   for about PERCENT % of task ids, chosen by a hash of SEED and the id;
//!   each chosen task panics once per process, so its retry runs.
//! - `worker.sleep=MS`: a worker sleeps MS milliseconds before each task
//!   (a job slow enough to be killed half-way).
//!
//! (Not a `STREAMBATCH_` variable: those are config keys.)

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use streambatch_core::TaskId;

struct Faults {
    worker_panic: Option<(u64, u64)>,
    worker_sleep: Option<u64>,
    panicked: Mutex<HashSet<TaskId>>,
}

fn faults() -> &'static Faults {
    static FAULTS: OnceLock<Faults> = OnceLock::new();
    FAULTS.get_or_init(|| {
        let spec = std::env::var("SB_FAILPOINTS").unwrap_or_default();
        let worker_panic = spec.split(';').find_map(|f| {
            let (seed, percent) = f.strip_prefix("worker.panic=")?.split_once(':')?;
            Some((seed.parse().ok()?, percent.parse().ok()?))
        });
        let worker_sleep = spec
            .split(';')
            .find_map(|f| f.strip_prefix("worker.sleep=")?.parse().ok());
        Faults {
            worker_panic,
            worker_sleep,
            panicked: Mutex::default(),
        }
    })
}

/// Sleeps as `worker.sleep` says, then panics if `worker.panic` chose
/// `task` and it has not panicked here yet.
pub(crate) fn worker(task: TaskId) {
    let faults = faults();
    if let Some(ms) = faults.worker_sleep {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    let Some((seed, percent)) = faults.worker_panic else {
        return;
    };
    if mix(seed ^ task.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)) % 100 < percent
        && faults
            .panicked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(task)
    {
        panic!("failpoint worker.panic: task {task}");
    }
}

/// SplitMix64's finaliser: a well-spread hash of one word.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}
