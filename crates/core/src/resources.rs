//! What an operator asks to run with: the logical CPU and GPU slots and
//! memory one task holds ([`Resources`]), and its rows per call, fusing and
//! worker pool ([`StageOptions`], [`PoolSize`]).

/// Logical resources one task of an operator holds while it runs.
///
/// Slots are logical, as in Ray: a node declares how many CPU and GPU slots it
/// has, and the scheduler never runs tasks whose sum exceeds them.
///
/// ```
/// use streambatch_core::Resources;
/// let r = Resources::gpu(1.0).with_memory(512 << 20);
/// assert_eq!((r.cpus, r.gpus, r.memory_bytes), (0.0, 1.0, 512 << 20));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resources {
    /// CPU slots held by one task.
    pub cpus: f64,
    /// GPU slots held by one task.
    pub gpus: f64,
    /// Memory one task is expected to use beyond its partitions (informational).
    pub memory_bytes: u64,
}

impl Default for Resources {
    fn default() -> Self {
        Self::cpu(1.0)
    }
}

impl Resources {
    /// A task holding `n` CPU slots and no GPU.
    pub fn cpu(n: f64) -> Self {
        Self {
            cpus: n,
            gpus: 0.0,
            memory_bytes: 0,
        }
    }

    /// A task holding `n` GPU slots and no CPU slot (the GPU stage's host
    /// thread is not counted, as in Ray's `num_gpus` actors).
    pub fn gpu(n: f64) -> Self {
        Self {
            cpus: 0.0,
            gpus: n,
            memory_bytes: 0,
        }
    }

    /// The same resources with a memory estimate per task.
    pub fn with_memory(self, bytes: u64) -> Self {
        Self {
            memory_bytes: bytes,
            ..self
        }
    }

    /// Stage options with these resources and batches of `rows` rows.
    pub fn batch_rows(self, rows: usize) -> StageOptions {
        StageOptions::from(self).batch_rows(rows)
    }

    /// Stage options with these resources, run by a pool of `min..=max`
    /// long-lived workers.
    pub fn pool(self, min: usize, max: usize) -> StageOptions {
        StageOptions::from(self).pool(min, max)
    }

    /// Stage options with these resources, never fused with a neighbour.
    pub fn no_fuse(self) -> StageOptions {
        StageOptions::from(self).no_fuse()
    }

    /// True when `self` fits in `free`.
    pub fn fits_in(&self, free: &Resources) -> bool {
        const EPS: f64 = 1e-9;
        self.cpus <= free.cpus + EPS && self.gpus <= free.gpus + EPS
    }
}

/// How many long-lived workers an actor-pool operator runs: it starts `min`
/// and grows to `max` while tasks wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSize {
    /// Workers set up when the job starts.
    pub min: usize,
    /// The most workers (and so the most tasks of this operator at once).
    pub max: usize,
}

/// How one operator runs: its resources, the rows per call of its function,
/// and, for stateful operators, its worker pool.
///
/// ```
/// use streambatch_core::{Resources, StageOptions};
/// let o: StageOptions = Resources::cpu(1.0).batch_rows(64);
/// assert_eq!(o.batch_rows, Some(64));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct StageOptions {
    /// Resources held by each task.
    pub resources: Resources,
    /// Rows handed to each call of the operator's function; `None` passes
    /// batches as they come.
    pub batch_rows: Option<usize>,
    /// The worker pool of a stateful operator.
    pub pool: Option<PoolSize>,
    /// Keeps the operator in a stage of its own even when its resources
    /// equal its neighbour's, so that its outputs and its neighbour's are
    /// separate partitions with separate memory budgets.
    pub no_fuse: bool,
}

impl StageOptions {
    /// Batches of `rows` rows per call.
    pub fn batch_rows(mut self, rows: usize) -> Self {
        self.batch_rows = Some(rows.max(1));
        self
    }

    /// Never fused with the operator before or after it.
    ///
    /// ```
    /// use streambatch_core::Resources;
    /// assert!(Resources::cpu(1.0).no_fuse().no_fuse);
    /// ```
    pub fn no_fuse(mut self) -> Self {
        self.no_fuse = true;
        self
    }

    /// A pool of `min..=max` workers.
    pub fn pool(mut self, min: usize, max: usize) -> Self {
        let max = max.max(1);
        self.pool = Some(PoolSize {
            min: min.min(max),
            max,
        });
        self
    }
}

impl From<Resources> for StageOptions {
    fn from(resources: Resources) -> Self {
        Self {
            resources,
            batch_rows: None,
            pool: None,
            no_fuse: false,
        }
    }
}
