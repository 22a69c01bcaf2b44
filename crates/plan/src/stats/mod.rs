//! What a job did: per-operator counters, store memory, recorded events,
//! what each rank of a split got, and the job's timeline (`timeline`).
//!
//! It imports only `sink` (a timeline file is written whole) and `error`.

pub mod timeline;

use std::fmt;
use std::time::Duration;

use streambatch_core::{StageId, TaskId, format_bytes};

/// Counters of one stage (one or more fused operators).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OperatorStats {
    /// The stage's operator names joined by `->`.
    pub name: String,
    /// Tasks finished.
    pub tasks: u64,
    /// Tasks running now (live view only).
    pub running: u64,
    /// Rows output.
    pub rows: u64,
    /// Bytes output.
    pub bytes: u64,
    /// From the first task's start to the last task's end.
    pub wall: Duration,
    /// Sum of the time its tasks ran.
    pub busy: Duration,
    /// Tasks retried after a worker panic.
    pub retries: u64,
    /// The operators fused in this stage, each with its own counts.
    pub ops: Vec<OpStats>,
    /// Inputs waiting for a task (live view only).
    pub queued: u64,
    /// Bytes of its outputs the store holds (live view only).
    pub held_bytes: u64,
    /// Why it runs no more tasks now, when it has work left (live view
    /// only).
    pub waiting: Option<Wait>,
}

/// Why a stage with work left runs no more tasks now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Nothing to run yet: the stages before it have not made its input.
    Input,
    /// Inputs wait, and no node has a free slot of the kind it needs (or
    /// its worker pool is full).
    NoSlot,
    /// Its outputs do not fit its memory budget: inputs wait, or tasks
    /// paused.
    OutputBudget,
    /// Tasks paused because the store had no room.
    StoreFull,
}

impl Wait {
    /// A short name: "input", "no slot", "output budget", "store full".
    pub fn name(self) -> &'static str {
        match self {
            Self::Input => "input",
            Self::NoSlot => "no slot",
            Self::OutputBudget => "output budget",
            Self::StoreFull => "store full",
        }
    }
}

/// A time a stage waited for a slot or for memory (a [`Wait`] other than
/// [`Wait::Input`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitSpan {
    /// The stage.
    pub stage: StageId,
    /// What it waited for.
    pub wait: Wait,
    /// Since the job started.
    pub from: Duration,
    /// Since the job started.
    pub to: Duration,
}

/// What one operator inside a fused stage produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpStats {
    /// The operator's name.
    pub name: String,
    /// Rows it output.
    pub rows: u64,
    /// Bytes it output.
    pub bytes: u64,
    /// Time spent in it (not in the operators before it), over all tasks.
    pub busy: Duration,
    /// What the operator itself reports (a GPU kernel: device, upload,
    /// compute and readback seconds).
    pub metrics: Vec<(String, String)>,
}

impl OperatorStats {
    /// Output rows per second of wall time.
    pub fn rows_per_s(&self) -> f64 {
        let s = self.wall.as_secs_f64();
        if s > 0.0 { self.rows as f64 / s } else { 0.0 }
    }
}

/// One step of a task's life, recorded in order by the executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A task was handed its input and dispatched.
    TaskStarted,
    /// A task yielded an output partition.
    PartitionYielded,
    /// A task paused because its output did not fit in memory.
    TaskSuspended,
    /// A paused task was dispatched again.
    TaskResumed,
    /// A task whose worker panicked was queued again.
    TaskRetried,
    /// A task finished.
    TaskFinished,
    /// A task whose operator failed was skipped (`max_errored_partitions`).
    TaskSkipped,
}

/// Why a task paused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseCause {
    /// Its output did not fit its stage's memory budget.
    OutputBudget,
    /// The store had no room for its output.
    StoreFull,
}

impl PauseCause {
    /// A short name: "output budget", "store full".
    pub fn name(self) -> &'static str {
        match self {
            Self::OutputBudget => "output budget",
            Self::StoreFull => "store full",
        }
    }
}

/// A recorded event: which task of which stage did what, where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// The stage's position in the plan.
    pub stage: StageId,
    /// The task.
    pub task: TaskId,
    /// What happened.
    pub kind: EventKind,
    /// When, since the job started: a timeline of the job.
    pub at: Duration,
    /// The node it happened on: its place in [`JobStats::nodes`] (0 on the
    /// embedded node).
    pub node: u32,
    /// The partition's bytes (`PartitionYielded`), or the output's a
    /// paused task holds (`TaskSuspended`); else 0.
    pub bytes: u64,
    /// Why the task paused (`TaskSuspended` only).
    pub cause: Option<PauseCause>,
    /// For a task's end or pause, where its node timed the run: when it
    /// computed on its worker, since the job started. A run begins after
    /// its start event (the message's way to the worker, or a wait on the
    /// node's board for a slot).
    pub ran: Option<(Duration, Duration)>,
}

/// The store's bytes at one moment of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreSample {
    /// Since the job started.
    pub at: Duration,
    /// Bytes held in memory (on every node of the job).
    pub used: u64,
    /// Bytes written to spill files so far (on every node of the job).
    pub spilled: u64,
}

/// The stats of one job.
#[derive(Clone, Debug, Default)]
pub struct JobStats {
    /// One entry per stage, source first.
    pub operators: Vec<OperatorStats>,
    /// The job's wall time.
    pub wall: Duration,
    /// The store's capacity.
    pub store_capacity: u64,
    /// The most bytes the store held at once during the job.
    pub peak_store_bytes: u64,
    /// Bytes spilled to disk: partitions, and reducers' scratch files.
    pub spilled_bytes: u64,
    /// Bytes restored from disk.
    pub restored_bytes: u64,
    /// The most tasks of each stage that ran at once.
    pub peak_running: Vec<u64>,
    /// Task events in the order the executor saw them (the first
    /// [`MAX_EVENTS`] only).
    pub events: Vec<Event>,
    /// The store's bytes over the job, as the executor saw them change
    /// (the first [`MAX_EVENTS`] only).
    pub store_samples: Vec<StoreSample>,
    /// Per cluster node (empty for a job on the embedded node).
    pub nodes: Vec<NodeStats>,
    /// Tasks whose operator failed and that the job skipped, as
    /// `max_errored_partitions` allows: their input is not in the output.
    pub errored: Vec<ErroredTask>,
    /// What the job did again after losing nodes.
    pub recovery: Recovery,
    /// Tasks paused for memory, by cause (kept whether or not the job
    /// records its timeline).
    pub pauses: Pauses,
    /// Times stages waited for a slot or memory (the first
    /// [`MAX_EVENTS`], when the job records its timeline).
    pub waits: Vec<WaitSpan>,
    /// For an epoch's job of a streaming split, the times its ranks'
    /// trainers waited for data (see `Split::epoch_stats`).
    pub rank_waits: Vec<RankWait>,
    /// For an epoch's job of a streaming split, what each rank got of it
    /// (rows, pieces, batches, waits), by rank.
    pub rank_totals: Vec<RankStats>,
    /// Each exchange's hand-over to its reducers: when, and what crossed.
    pub exchanges: Vec<Exchanged>,
}

/// What crossed an exchange when it handed its map outputs to the
/// reducers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exchanged {
    /// The exchange's stage.
    pub stage: usize,
    /// Since the job started.
    pub at: Duration,
    /// Rows that crossed it.
    pub rows: u64,
    /// Bytes that crossed it (the map outputs' partitions).
    pub bytes: u64,
}

/// A time a trainer rank of a streaming split waited for its next rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankWait {
    /// The rank.
    pub rank: usize,
    /// Since the job started.
    pub from: Duration,
    /// Since the job started.
    pub to: Duration,
}

/// Pauses of a job's tasks for memory, by cause. A pause runs from the
/// task's `TaskSuspended` to its next step (it resumed, was retried or
/// dropped), or to the job's end.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pauses {
    /// Pauses because an output did not fit its stage's budget.
    pub output_budget_count: u64,
    /// Task-time paused for that cause.
    pub output_budget: Duration,
    /// Pauses because the store had no room.
    pub store_full_count: u64,
    /// Task-time paused for that cause.
    pub store_full: Duration,
}

impl Pauses {
    /// Adds `other`'s pauses to these.
    pub fn merge(&mut self, other: &Pauses) {
        self.output_budget_count += other.output_budget_count;
        self.output_budget += other.output_budget;
        self.store_full_count += other.store_full_count;
        self.store_full += other.store_full;
    }

    /// Counts a pause of `cause` that lasted `time`.
    pub fn add(&mut self, cause: PauseCause, time: Duration) {
        match cause {
            PauseCause::OutputBudget => {
                self.output_budget_count += 1;
                self.output_budget += time;
            }
            PauseCause::StoreFull => {
                self.store_full_count += 1;
                self.store_full += time;
            }
        }
    }
}

/// What a job did again after losing cluster nodes: their running tasks
/// are retried (counted in each operator's `retries`), and the partitions
/// they held that the job still needed are made again.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recovery {
    /// Nodes lost while the job ran (a drained node that left with
    /// nothing of the job is not).
    pub nodes_lost: Vec<String>,
    /// Partitions lost with them that the job still needed.
    pub lost_partitions: u64,
    /// Partitions made again: the lost ones, and upstream ones, freed
    /// after use, that making them again read.
    pub remade_partitions: u64,
    /// Finished tasks run again to make them.
    pub rerun_tasks: u64,
}

/// A task the job skipped after its operator failed.
#[derive(Clone, Debug, PartialEq)]
pub struct ErroredTask {
    /// The stage (its fused operators' names).
    pub stage: String,
    /// The task.
    pub task: TaskId,
    /// What it read: a source split, or how many input partitions and rows.
    pub input: String,
    /// The error.
    pub message: String,
}

/// What one cluster node did for a job.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeStats {
    /// The node.
    pub name: String,
    /// Tasks it finished.
    pub tasks: u64,
    /// Input partitions it read from another node's shared memory.
    pub inputs_shared: u64,
    /// Input partitions it pulled from another node over QUIC.
    pub inputs_quic: u64,
    /// Bytes of those.
    pub quic_bytes: u64,
    /// The most bytes its store held (as its events reported).
    pub peak_store_bytes: u64,
    /// Bytes its store spilled during the job.
    pub spilled_bytes: u64,
}

/// Events kept per job; later ones are counted in stats but not recorded.
pub const MAX_EVENTS: usize = 200_000;

impl JobStats {
    /// The total rows out of the last stage.
    pub fn output_rows(&self) -> u64 {
        self.operators.last().map_or(0, |o| o.rows)
    }

    /// The rows into stage `stage`: what a user counts it by. The rows the
    /// stage before it output; for the first stage, the rows its first
    /// operator (the source) output, its rows read. A stage's own `rows`
    /// are its output, which a sink at its end makes one row per file.
    ///
    /// `None` where it was not counted: a first stage that fuses several
    /// operators (its name joins them with `->`) with no count of its
    /// source, as on a cluster, whose nodes report no per-operator rows.
    pub fn rows_in(&self, stage: usize) -> Option<u64> {
        match stage.checked_sub(1) {
            Some(before) => Some(self.operators.get(before).map_or(0, |o| o.rows)),
            None => match self.operators.first() {
                None => Some(0),
                Some(o) => match o.ops.first() {
                    Some(source) => Some(source.rows),
                    None if o.name.contains("->") => None,
                    None => Some(o.rows),
                },
            },
        }
    }

    /// The position of the first event matching `f`.
    pub fn position(&self, f: impl Fn(&Event) -> bool) -> Option<usize> {
        self.events.iter().position(f)
    }

    /// The stats as JSON: per stage (with its fused operators), per node,
    /// the store, pauses by cause, recovery and skipped tasks; durations
    /// in seconds. Events are left out (see `timeline` for them).
    ///
    /// ```
    /// let stats = streambatch_plan::JobStats::default();
    /// assert_eq!(stats.to_json()["wall_s"], 0.0);
    /// ```
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let operators: Vec<_> = self
            .operators
            .iter()
            .enumerate()
            .map(|(stage, o)| {
                let ops: Vec<_> = o
                    .ops
                    .iter()
                    .map(|op| {
                        json!({
                            "name": op.name, "rows": op.rows, "bytes": op.bytes,
                            "busy_s": op.busy.as_secs_f64(),
                            "metrics": op.metrics.iter().map(|(k, v)| (k.clone(), json!(v)))
                                .collect::<serde_json::Map<_, _>>(),
                        })
                    })
                    .collect();
                json!({
                    "name": o.name, "tasks": o.tasks, "rows_in": self.rows_in(stage),
                    "rows": o.rows, "bytes": o.bytes,
                    "wall_s": o.wall.as_secs_f64(), "busy_s": o.busy.as_secs_f64(),
                    "rows_per_s": o.rows_per_s(), "retries": o.retries, "ops": ops,
                })
            })
            .collect();
        let nodes: Vec<_> = self
            .nodes
            .iter()
            .map(|n| {
                json!({
                    "name": n.name, "tasks": n.tasks, "inputs_shared": n.inputs_shared,
                    "inputs_quic": n.inputs_quic, "quic_bytes": n.quic_bytes,
                    "peak_store_bytes": n.peak_store_bytes, "spilled_bytes": n.spilled_bytes,
                })
            })
            .collect();
        let errored: Vec<_> = self
            .errored
            .iter()
            .map(|e| json!({"stage": e.stage, "task": e.task.0, "input": e.input, "message": e.message}))
            .collect();
        let p = &self.pauses;
        let r = &self.recovery;
        json!({
            "wall_s": self.wall.as_secs_f64(),
            "output_rows": self.output_rows(),
            "operators": operators,
            "nodes": nodes,
            "store": {
                "capacity_bytes": self.store_capacity, "peak_bytes": self.peak_store_bytes,
                "spilled_bytes": self.spilled_bytes, "restored_bytes": self.restored_bytes,
            },
            "pauses": {
                "output_budget": {"count": p.output_budget_count, "seconds": p.output_budget.as_secs_f64()},
                "store_full": {"count": p.store_full_count, "seconds": p.store_full.as_secs_f64()},
            },
            "recovery": {
                "nodes_lost": r.nodes_lost, "lost_partitions": r.lost_partitions,
                "remade_partitions": r.remade_partitions, "rerun_tasks": r.rerun_tasks,
            },
            "errored": errored,
        })
    }

    /// Time tasks spent paused for memory, summed over tasks, by cause:
    /// (output budget, store full).
    pub fn pause_time(&self) -> (Duration, Duration) {
        (self.pauses.output_budget, self.pauses.store_full)
    }
}

impl fmt::Display for JobStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .operators
            .iter()
            .map(|o| o.name.len())
            .max()
            .unwrap_or(8)
            .clamp(8, 60);
        writeln!(
            f,
            "{:<width$} {:>7} {:>10} {:>10} {:>11} {:>9} {:>12}",
            "operator", "tasks", "rows in", "rows out", "bytes out", "wall s", "rows in/s"
        )?;
        let rate = |rows: u64, time: Duration| {
            if time.is_zero() {
                0.0
            } else {
                rows as f64 / time.as_secs_f64()
            }
        };
        for (stage, o) in self.operators.iter().enumerate() {
            let name: String = o.name.chars().take(width).collect();
            let counted = self.rows_in(stage);
            let rows_in = counted.unwrap_or(0);
            let (shown_in, shown_rate) = match counted {
                Some(n) => (n.to_string(), format!("{:.0}", rate(n, o.wall))),
                None => ("-".to_string(), "-".to_string()),
            };
            writeln!(
                f,
                "{name:<width$} {:>7} {:>10} {:>10} {:>11} {:>9.2} {:>12}",
                o.tasks,
                shown_in,
                o.rows,
                format_bytes(o.bytes),
                o.wall.as_secs_f64(),
                shown_rate
            )?;
            if o.ops.len() > 1 || o.ops.iter().any(|op| !op.metrics.is_empty()) {
                // Each operator reads what the one before it output; the
                // first, what the stage reads.
                let mut op_in = rows_in;
                for op in &o.ops {
                    let name: String = format!("  {}", op.name).chars().take(width).collect();
                    writeln!(
                        f,
                        "{name:<width$} {:>7} {:>10} {:>10} {:>11} {:>9.2} {:>12.0}",
                        "",
                        op_in,
                        op.rows,
                        format_bytes(op.bytes),
                        op.busy.as_secs_f64(),
                        rate(op_in, op.busy)
                    )?;
                    op_in = op.rows;
                    if !op.metrics.is_empty() {
                        let shown: Vec<String> =
                            op.metrics.iter().map(|(k, v)| format!("{k}={v}")).collect();
                        writeln!(f, "    {}", shown.join(", "))?;
                    }
                }
            }
        }
        writeln!(
            f,
            "(rows in: what the stage read, the rows out of the stage above, - where not counted \
             (a cluster's fused first stage); rows out: what it output, \
             a row per file for a sink; indented: operators fused into the stage above, their time \
             busy time summed over tasks)"
        )?;
        for e in &self.errored {
            writeln!(
                f,
                "skipped: task {} of `{}` ({}): {}",
                e.task, e.stage, e.input, e.message
            )?;
        }
        let r = &self.recovery;
        if !r.nodes_lost.is_empty() || r.lost_partitions > 0 {
            writeln!(
                f,
                "recovery: lost node(s) {}; {} partition(s) lost, {} made again by {} task(s) run again",
                r.nodes_lost.join(", "),
                r.lost_partitions,
                r.remade_partitions,
                r.rerun_tasks
            )?;
        }
        let (budget, full) = self.pause_time();
        if !(budget + full).is_zero() {
            writeln!(
                f,
                "paused for memory (task-seconds): output budget {:.2}, store full {:.2}",
                budget.as_secs_f64(),
                full.as_secs_f64()
            )?;
        }
        if !self.nodes.is_empty() {
            writeln!(
                f,
                "{:<12} {:>7} {:>14} {:>12} {:>11} {:>11} {:>11}",
                "node",
                "tasks",
                "inputs shared",
                "inputs QUIC",
                "QUIC bytes",
                "store peak",
                "spilled"
            )?;
            for n in &self.nodes {
                writeln!(
                    f,
                    "{:<12} {:>7} {:>14} {:>12} {:>11} {:>11} {:>11}",
                    n.name,
                    n.tasks,
                    n.inputs_shared,
                    n.inputs_quic,
                    format_bytes(n.quic_bytes),
                    format_bytes(n.peak_store_bytes),
                    format_bytes(n.spilled_bytes)
                )?;
            }
        }
        write!(
            f,
            "wall {:.2} s; peak store {} of {}; spilled {}, restored {}",
            self.wall.as_secs_f64(),
            format_bytes(self.peak_store_bytes),
            format_bytes(self.store_capacity),
            format_bytes(self.spilled_bytes),
            format_bytes(self.restored_bytes)
        )
    }
}

/// What one rank of a split got, over all its epochs so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankStats {
    /// Rows handed to it.
    pub rows: usize,
    /// Pieces of partitions handed to it (before any batching).
    pub pieces: usize,
    /// Batches its consumer got: as [`Split::iter_batches`](crate::Split::iter_batches) (or a trainer
    /// process's `iter_batches`, which reports them) cut them; a consumer
    /// of [`Split::epoch`](crate::Split::epoch) or of Arrow Flight gets each piece as a batch.
    pub batches: usize,
    /// Time it waited for data: in the epoch's barrier, for the job, for
    /// another rank's pull.
    pub waited_for_data: Duration,
    /// Time what it took had waited for it in the split's buffer, summed
    /// over its pieces: the job's output waiting for this trainer.
    pub data_waited: Duration,
    /// Rows forwarded to its process that it may never have read, and
    /// that no other rank got: in flight when its trainer stalled past
    /// [`SplitOptions::stalled_trainer_timeout`](crate::SplitOptions::stalled_trainer_timeout)
    /// (a confirming Flight client's unconfirmed rows among them). Rows a
    /// lost trainer had not been sent go to the others and are not counted
    /// here; nor are rows a Flight client that does not confirm had taken
    /// through gRPC (they count as delivered).
    pub lost_rows: usize,
}

impl RankStats {
    /// What was added to these figures since `before`.
    pub(crate) fn since(&self, before: &RankStats) -> RankStats {
        RankStats {
            rows: self.rows.saturating_sub(before.rows),
            pieces: self.pieces.saturating_sub(before.pieces),
            batches: self.batches.saturating_sub(before.batches),
            waited_for_data: self.waited_for_data.saturating_sub(before.waited_for_data),
            data_waited: self.data_waited.saturating_sub(before.data_waited),
            lost_rows: self.lost_rows.saturating_sub(before.lost_rows),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str, rows: u64, busy_s: u64) -> OpStats {
        OpStats {
            name: name.into(),
            rows,
            bytes: rows * 100,
            busy: Duration::from_secs(busy_s),
            metrics: Vec::new(),
        }
    }

    /// The main job's shape: read -> preprocess, then embed -> write_parquet
    /// (a sink: one row per file), 64,000 images in 128 files.
    fn main_job() -> JobStats {
        JobStats {
            operators: vec![
                OperatorStats {
                    name: "read_parquet->preprocess".into(),
                    tasks: 128,
                    rows: 64_000,
                    wall: Duration::from_secs(4),
                    ops: vec![op("read_parquet", 64_000, 2), op("preprocess", 64_000, 6)],
                    ..Default::default()
                },
                OperatorStats {
                    name: "embed->write_parquet".into(),
                    tasks: 1_000,
                    rows: 128,
                    wall: Duration::from_secs(4),
                    ops: vec![op("embed", 64_000, 8), op("write_parquet", 128, 2)],
                    ..Default::default()
                },
            ],
            wall: Duration::from_secs(5),
            ..Default::default()
        }
    }

    #[test]
    fn a_stage_ending_in_a_sink_is_counted_by_the_rows_it_read() {
        let stats = main_job();
        assert_eq!(
            (stats.rows_in(0), stats.rows_in(1)),
            (Some(64_000), Some(64_000))
        );
        let table = stats.to_string();
        let lines: Vec<&str> = table.lines().collect();
        let cells = |start: &str| -> Vec<String> {
            let line = lines.iter().find(|l| l.starts_with(start)).unwrap();
            line[start.len()..]
                .split_whitespace()
                .map(String::from)
                .collect()
        };
        assert!(
            lines[0].contains("rows in") && lines[0].contains("rows out"),
            "{table}"
        );
        assert!(lines[0].contains("rows in/s"), "{table}");
        // tasks, rows in, rows out, bytes (two words), wall s, rows in/s.
        let embed_stage = cells("embed->write_parquet");
        assert_eq!(embed_stage[..3], ["1000", "64000", "128"], "{table}");
        assert_eq!(embed_stage[6], "16000", "64,000 rows in over 4 s: {table}");
        let first = cells("read_parquet->preprocess");
        assert_eq!(first[..3], ["128", "64000", "64000"], "{table}");
        assert_eq!(first[6], "16000", "{table}");
        // The fused operators: each reads what the one before it output.
        let write = cells("  write_parquet");
        assert_eq!(write[..2], ["64000", "128"], "{table}");
        assert_eq!(write[5], "32000", "64,000 rows in over 2 busy s: {table}");
        let embed = cells("  embed");
        assert_eq!(embed[..2], ["64000", "64000"], "{table}");
        assert_eq!(stats.to_json()["operators"][1]["rows_in"], 64_000);
        assert_eq!(stats.to_json()["operators"][1]["rows"], 128);
    }

    #[test]
    fn a_first_stage_without_operators_reads_what_it_outputs() {
        let stats = JobStats {
            operators: vec![OperatorStats {
                name: "range".into(),
                rows: 10,
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(stats.rows_in(0), Some(10));
        assert_eq!(stats.rows_in(5), Some(0));
        assert_eq!(JobStats::default().rows_in(0), Some(0));
    }

    #[test]
    fn a_fused_first_stage_without_operator_counts_shows_no_rows_in() {
        // A cluster's nodes report no per-operator rows: the stage's output
        // (a row per file) must not pass for what it read.
        let stats = JobStats {
            operators: vec![OperatorStats {
                name: "read_parquet->preprocess->write_parquet".into(),
                rows: 128,
                tasks: 128,
                wall: Duration::from_secs(4),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(stats.rows_in(0), None);
        let table = stats.to_string();
        let row = table.lines().nth(1).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[1..3], ["128", "-"], "{table}");
        assert_eq!(cells.last(), Some(&"-"), "{table}");
        assert_eq!(
            stats.to_json()["operators"][0]["rows_in"],
            serde_json::Value::Null
        );
    }
}
