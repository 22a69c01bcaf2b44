//! What the job state's simulations share (`sim`, `job_tests`):
//! partitions of source rows held on a simulated node, holding their share
//! of its budget, and each node's budgets as the job's memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use streambatch_plan::KeySample;

use crate::exec::budget::{Budgets, Reservation, StageTotals};
use crate::job::{Memory, Part};

pub(crate) const ROW_BYTES: u64 = 100;
pub(crate) const CAPACITY: u64 = 4_000;
pub(crate) const RESERVE: u64 = 1_000;
/// Rows per output of a source task.
pub(crate) const CHUNK: usize = 3;

/// Source rows `start..start + len`, of a partition of `bytes` bytes whose
/// budget is held while any part of it lives.
#[derive(Clone)]
pub(crate) struct Rows {
    pub(crate) start: u64,
    pub(crate) len: usize,
    pub(crate) bytes: u64,
    pub(crate) node: usize,
    pub(crate) _held: Arc<Held>,
    /// An exchange's map output: where each destination's rows start.
    pub(crate) groups: Option<Arc<[u32]>>,
    /// A sort's map output: its keys' sample.
    pub(crate) sample: Option<Arc<KeySample>>,
    /// A hash exchange's map output whose cut its holder alone keeps: the
    /// job sees no `groups` then, which stand for what the holder keeps.
    pub(crate) cut_at_holder: bool,
}

pub(crate) struct Held {
    pub(crate) _reservation: Reservation,
    /// Counts live outputs admitted over budget (by a task allowed to spill).
    pub(crate) forced: Option<Arc<AtomicUsize>>,
}

impl Held {
    /// Admits an output of `bytes` bytes of `stage` to `budget`: forced
    /// (over budget, counted in `forced` while it lives) when the task may
    /// spill, else only when it fits. `None`: the task must pause.
    pub(crate) fn admit(
        budget: &Budgets,
        stage: usize,
        bytes: u64,
        may_spill: bool,
        forced: &Arc<AtomicUsize>,
    ) -> Option<Self> {
        if may_spill {
            forced.fetch_add(1, Ordering::SeqCst);
            return Some(Held {
                _reservation: budget.force_admit(stage, bytes),
                forced: Some(forced.clone()),
            });
        }
        let reservation = budget.try_admit(stage, bytes).ok()?;
        Some(Held {
            _reservation: reservation,
            forced: None,
        })
    }
}

/// The outputs of a source task over `rows` rows from id `base` on: the
/// first id and length of each, `CHUNK` rows at a time.
pub(crate) fn split_outputs(base: u64, rows: usize) -> Vec<(u64, usize)> {
    (0..rows)
        .step_by(CHUNK)
        .map(|o| (base + o as u64, CHUNK.min(rows - o)))
        .collect()
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(forced) = &self.forced {
            forced.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Part for Rows {
    fn rows(&self) -> usize {
        self.len
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }

    fn sub(&self, offset: usize, len: usize) -> Self {
        assert!(offset + len <= self.len, "a part is cut within its rows");
        let whole = offset == 0 && len == self.len;
        Self {
            start: self.start + offset as u64,
            len,
            groups: self.groups.clone().filter(|_| whole),
            sample: self.sample.clone().filter(|_| whole),
            cut_at_holder: self.cut_at_holder && whole,
            ..self.clone()
        }
    }

    fn node(&self) -> usize {
        self.node
    }

    fn groups(&self) -> Option<&Arc<[u32]>> {
        self.groups.as_ref().filter(|_| !self.cut_at_holder)
    }

    fn sample(&self) -> Option<&Arc<KeySample>> {
        self.sample.as_ref()
    }

    fn keep_groups(&mut self, old: &Self) {
        if self.groups.is_none() && old.len == self.len {
            self.groups = old.groups.clone();
            self.sample = old.sample.clone();
            self.cut_at_holder = old.cut_at_holder;
        }
    }

    fn forget_cut(&mut self) {
        self.cut_at_holder = self.groups.is_some();
    }

    fn cut_at_holder(&self) -> bool {
        self.cut_at_holder
    }

    /// As a holder finds them: by the cut it keeps.
    fn group(&self, d: usize) -> Self {
        assert!(self.cut_at_holder, "a destination is found by a kept cut");
        let cut = self.groups.as_ref().expect("its holder keeps its cut");
        self.sub(cut[d] as usize, (cut[d + 1] - cut[d]) as usize)
    }
}

/// Each node's budgets, all adding to one [`StageTotals`] (see
/// [`node_budgets`]).
pub(crate) struct SimMemory<'a>(pub(crate) &'a [Budgets]);

/// Budgets for `nodes` nodes of `capacity` bytes, adding to one total.
pub(crate) fn node_budgets(nodes: usize, capacity: u64, reserves: &[u64]) -> Vec<Budgets> {
    let totals = StageTotals::new(reserves.len());
    let new = |_| Budgets::adding_to(totals.clone(), capacity, reserves.to_vec(), Arc::new(|| {}));
    (0..nodes).map(new).collect()
}

impl Memory for SimMemory<'_> {
    fn fits(&self, node: usize, stage: usize, bytes: u64) -> bool {
        self.0[node].fits(stage, bytes)
    }

    fn frees(&self, _node: usize) -> u64 {
        0
    }

    fn held(&self, stage: usize) -> u64 {
        self.0.first().map_or(0, |b| b.totals().held(stage))
    }

    fn capacity(&self, node: usize) -> u64 {
        self.0[node].capacity()
    }

    fn outside(&self, node: usize) -> u64 {
        self.0[node].outside()
    }
}
