//! The one place a job's stats are written: the [`Recorder`]. The job's
//! state machine reports to it; the driver reads the same stats live.

use super::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use streambatch_core::{StageId, TaskId};
use streambatch_plan::{
    Event, EventKind, JobStats, MAX_EVENTS, OpStats, OperatorStats, PauseCause, StoreSample, Wait,
    WaitSpan,
};

/// Writes a job's [`JobStats`], shared with the driver for a live view.
pub(crate) struct Recorder {
    live: Arc<Mutex<JobStats>>,
    started: Instant,
    /// When each stage's first task started: its wall time runs from then.
    first_start: Vec<Option<Instant>>,
    /// Whether events and store samples are kept (`record_timeline`).
    timeline: bool,
    /// Paused tasks: since when, and why.
    paused: HashMap<TaskId, (Duration, PauseCause)>,
    /// Per task: when its current run computed on its worker, told with its
    /// end or pause (see [`Recorder::ran`]).
    ran: HashMap<TaskId, (Instant, Instant)>,
    /// Per stage, what it waits for and since when.
    waiting: Vec<Option<(Wait, Duration)>>,
    /// Events not yet in the shared stats: they go there once per decision
    /// pass ([`Recorder::stages_now`]) rather than a lock per event.
    pending: Vec<Event>,
    /// Events recorded so far, pending ones included.
    recorded: usize,
    /// The store's spilled and restored bytes when the job started: a store
    /// counts from when it opened, the job from when it started.
    store_before: (u64, u64),
}

/// A stage as the job state sees it after deciding.
pub(crate) struct StageNow {
    pub(crate) queued: usize,
    pub(crate) held_bytes: u64,
    pub(crate) waiting: Option<Wait>,
}

impl Recorder {
    /// A recorder for stages named `names`, over a store of `capacity` bytes.
    pub(crate) fn new(live: Arc<Mutex<JobStats>>, names: Vec<String>, capacity: u64) -> Self {
        let stages = names.len();
        {
            let mut stats = lock(&live);
            stats.operators = names
                .into_iter()
                .map(|name| OperatorStats {
                    name,
                    ..Default::default()
                })
                .collect();
            stats.peak_running = vec![0; stages];
            stats.store_capacity = capacity;
        }
        Self {
            live,
            started: Instant::now(),
            first_start: vec![None; stages],
            timeline: true,
            paused: HashMap::default(),
            ran: HashMap::default(),
            waiting: vec![None; stages],
            pending: Vec::new(),
            recorded: 0,
            store_before: (0, 0),
        }
    }

    /// Keeps no events nor store samples when `on` is false: the counters
    /// and pause time by cause are all a job then reports.
    pub(crate) fn record_timeline(mut self, on: bool) -> Self {
        self.timeline = on;
        self
    }

    /// The store had spilled and restored these bytes before the job
    /// started: the job's figures leave them out.
    pub(crate) fn store_before(mut self, spilled: u64, restored: u64) -> Self {
        self.store_before = (spilled, restored);
        self
    }

    fn stats(&self) -> MutexGuard<'_, JobStats> {
        lock(&self.live)
    }

    /// The job runs on cluster nodes named `names` (in the job state's order).
    pub(crate) fn nodes(&self, names: &[String]) {
        self.stats().nodes = names
            .iter()
            .map(|name| streambatch_plan::NodeStats {
                name: name.clone(),
                ..Default::default()
            })
            .collect();
    }

    /// Node `name` joined the job (numbered after the others).
    pub(crate) fn node_joined(&self, name: &str) {
        self.stats().nodes.push(streambatch_plan::NodeStats {
            name: name.to_string(),
            ..Default::default()
        });
    }

    /// Cluster node `node` finished a task.
    pub(crate) fn node_finished(&self, node: usize) {
        if let Some(n) = self.stats().nodes.get_mut(node) {
            n.tasks += 1;
        }
    }

    /// Cluster node `node`'s inputs from other nodes so far.
    pub(crate) fn node_inputs(&self, node: usize, shared: u64, quic: u64, quic_bytes: u64) {
        if let Some(n) = self.stats().nodes.get_mut(node) {
            (n.inputs_shared, n.inputs_quic, n.quic_bytes) = (shared, quic, quic_bytes);
        }
    }

    /// Cluster node `node`'s store now: bytes held and spilled so far.
    pub(crate) fn node_store(&self, node: usize, used: u64, spilled: u64) {
        if let Some(n) = self.stats().nodes.get_mut(node) {
            n.peak_store_bytes = n.peak_store_bytes.max(used);
            n.spilled_bytes = spilled;
        }
    }

    /// Records `kind` for `task` of `stage` on `node`, with its time since
    /// the job started.
    pub(crate) fn event(&mut self, stage: usize, task: TaskId, kind: EventKind, node: usize) {
        self.event_sized(stage, task, kind, node, 0, None);
    }

    /// [`Recorder::event`] with the bytes it concerns and, for a pause,
    /// its cause.
    pub(crate) fn event_sized(
        &mut self,
        stage: usize,
        task: TaskId,
        kind: EventKind,
        node: usize,
        bytes: u64,
        cause: Option<PauseCause>,
    ) {
        let at = self.started.elapsed();
        let ended = self.paused.remove(&task);
        if let Some((since, cause)) = ended {
            self.stats().pauses.add(cause, at.saturating_sub(since));
        }
        if kind == EventKind::TaskSuspended {
            let cause = cause.unwrap_or(PauseCause::OutputBudget);
            self.paused.insert(task, (at, cause));
        }
        let ran = match kind {
            EventKind::TaskFinished | EventKind::TaskSuspended | EventKind::TaskRetried => {
                let since = |t: Instant| t.saturating_duration_since(self.started);
                self.ran
                    .remove(&task)
                    .map(|(from, to)| (since(from), since(to)))
            }
            _ => None,
        };
        if !self.timeline || self.recorded >= MAX_EVENTS {
            return;
        }
        self.recorded += 1;
        self.pending.push(Event {
            stage: StageId(stage),
            task,
            kind,
            at,
            node: node as u32,
            bytes,
            cause,
            ran,
        });
    }

    /// Task `task`'s run, ending or pausing now, computed on its worker
    /// from `from` to `to`: the event of its end says so.
    pub(crate) fn ran(&mut self, task: TaskId, from: Instant, to: Instant) {
        if self.timeline {
            self.ran.insert(task, (from, to));
        }
    }

    /// A task of `stage` started or resumed; `running` of its tasks run now.
    pub(crate) fn task_started(&mut self, stage: usize, running: usize) {
        self.first_start[stage].get_or_insert_with(Instant::now);
        let mut stats = self.stats();
        stats.operators[stage].running = running as u64;
        stats.peak_running[stage] = stats.peak_running[stage].max(running as u64);
    }

    /// A task of `stage` let go of its slot; `running` of its tasks run now.
    pub(crate) fn task_stopped(&self, stage: usize, running: usize) {
        self.stats().operators[stage].running = running as u64;
    }

    /// A task of `stage` finished after computing for `busy`; `ops` are the
    /// counts of the stage's operators so far.
    pub(crate) fn task_finished(&self, stage: usize, busy: Duration, ops: Vec<OpStats>) {
        let wall = self.first_start[stage].map_or(Duration::ZERO, |t| t.elapsed());
        let mut stats = self.stats();
        let op = &mut stats.operators[stage];
        op.tasks += 1;
        op.busy += busy;
        op.wall = wall;
        op.ops = ops;
    }

    /// `stage` output `rows` rows in `bytes` bytes.
    pub(crate) fn output(&self, stage: usize, rows: usize, bytes: u64) {
        let mut stats = self.stats();
        stats.operators[stage].rows += rows as u64;
        stats.operators[stage].bytes += bytes;
    }

    /// Exchange `stage` handed `rows` rows in `bytes` bytes to its reducers.
    pub(crate) fn exchanged(&self, stage: usize, rows: usize, bytes: u64) {
        self.output(stage, rows, bytes);
        let at = self.started.elapsed();
        self.stats().exchanges.push(streambatch_plan::Exchanged {
            stage,
            at,
            rows: rows as u64,
            bytes,
        });
    }

    /// A task was skipped after its operator failed.
    pub(crate) fn errored(&self, task: streambatch_plan::ErroredTask) {
        self.stats().errored.push(task);
    }

    /// Node `name` was lost while the job ran.
    pub(crate) fn node_lost(&self, name: &str) {
        self.stats().recovery.nodes_lost.push(name.to_string());
    }

    /// `n` partitions the job still needed were lost.
    pub(crate) fn lost_partitions(&self, n: usize) {
        self.stats().recovery.lost_partitions += n as u64;
    }

    /// An output of `stage` was made again.
    pub(crate) fn remade(&self, stage: usize) {
        let _ = stage;
        self.stats().recovery.remade_partitions += 1;
    }

    /// A finished task of `stage` runs again to make lost outputs.
    pub(crate) fn rerun(&self, stage: usize) {
        let _ = stage;
        self.stats().recovery.rerun_tasks += 1;
    }

    /// A task of `stage` is retried.
    pub(crate) fn retry(&self, stage: usize) {
        self.stats().operators[stage].retries += 1;
    }

    /// The store holds `used` bytes in memory now and has spilled
    /// `spilled` so far (sampled when either changed).
    pub(crate) fn store_now(&self, used: u64, spilled: u64) {
        let spilled = spilled.saturating_sub(self.store_before.0);
        let at = self.started.elapsed();
        let mut stats = self.stats();
        stats.peak_store_bytes = stats.peak_store_bytes.max(used);
        let changed = stats
            .store_samples
            .last()
            .is_none_or(|s| (s.used, s.spilled) != (used, spilled));
        if self.timeline && changed && stats.store_samples.len() < MAX_EVENTS {
            stats.store_samples.push(StoreSample { at, used, spilled });
        }
    }

    /// What each stage waits for now, with its queue and held bytes; the
    /// timeline keeps the times stages waited for a slot or memory.
    pub(crate) fn stages_now(&mut self, now: &[StageNow]) {
        let at = self.started.elapsed();
        let mut spans = Vec::new();
        for (stage, n) in now.iter().enumerate() {
            let Some(was) = self.waiting.get_mut(stage) else {
                continue;
            };
            let wait = n.waiting.filter(|w| *w != Wait::Input);
            if was.map(|(w, _)| w) != wait {
                if let Some((w, since)) = was.take() {
                    spans.push(WaitSpan {
                        stage: StageId(stage),
                        wait: w,
                        from: since,
                        to: at,
                    });
                }
                *was = wait.map(|w| (w, at));
            }
        }
        let mut stats = lock(&self.live);
        stats.events.append(&mut self.pending);
        for (op, n) in stats.operators.iter_mut().zip(now) {
            op.queued = n.queued as u64;
            op.held_bytes = n.held_bytes;
            op.waiting = n.waiting;
        }
        if self.timeline {
            let room = MAX_EVENTS.saturating_sub(stats.waits.len());
            stats.waits.extend(spans.into_iter().take(room));
        }
    }

    /// The job ended; the store's counters at that moment.
    pub(crate) fn ended(&mut self, used: u64, spilled: u64, restored: u64) {
        let wall = self.started.elapsed();
        let paused = std::mem::take(&mut self.paused);
        let waiting = std::mem::take(&mut self.waiting);
        let pending = std::mem::take(&mut self.pending);
        let mut stats = self.stats();
        stats.events.extend(pending);
        for (stage, open) in waiting.into_iter().enumerate() {
            if let Some((wait, from)) = open.filter(|_| self.timeline) {
                let span = WaitSpan {
                    stage: StageId(stage),
                    wait,
                    from,
                    to: wall,
                };
                stats.waits.push(span);
            }
        }
        for op in &mut stats.operators {
            (op.queued, op.held_bytes, op.waiting) = (0, 0, None);
        }
        for (since, cause) in paused.into_values() {
            stats.pauses.add(cause, wall.saturating_sub(since));
        }
        stats.wall = wall;
        stats.peak_store_bytes = stats.peak_store_bytes.max(used);
        stats.spilled_bytes = spilled.saturating_sub(self.store_before.0);
        stats.restored_bytes = restored.saturating_sub(self.store_before.1);
    }

    /// The recovery counts so far.
    pub(crate) fn recovery(&self) -> streambatch_plan::Recovery {
        self.stats().recovery.clone()
    }

    /// A copy of the stats so far.
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> JobStats {
        let mut stats = self.stats().clone();
        stats.events.extend(self.pending.iter().copied());
        stats
    }
}

fn lock(live: &Mutex<JobStats>) -> MutexGuard<'_, JobStats> {
    live.lock().unwrap_or_else(|p| p.into_inner())
}
