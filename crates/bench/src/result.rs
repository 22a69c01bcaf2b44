//! What one benchmark run reports: [`BenchResult`] and its JSON line, the
//! process's peak memory, and the `{"progress": ...}` lines a workload that
//! iterates its output prints on the way.

use std::time::{Duration, Instant};

use streambatch::{JobStats, StoreStats};

/// The result of one benchmark run: the JSON line `streambatch bench` prints.
#[derive(Debug, Clone)]
pub struct BenchResult {
    /// `w1`, `w3`, ...
    pub workload: String,
    /// The settings that vary between runs.
    pub config: String,
    /// Wall time.
    pub wall: Duration,
    /// Output rows.
    pub rows: u64,
    /// Partitions processed.
    pub partitions: u64,
    /// Ideal wall time, where the workload defines one.
    pub ideal: Option<Duration>,
    /// The store's high-water mark during the run.
    pub store_peak_bytes: u64,
    /// Bytes spilled.
    pub spilled_bytes: u64,
    /// Whether the output matched the expected one.
    pub correct: bool,
    /// Workload-specific figures, added to the JSON line.
    pub extra: Vec<(String, serde_json::Value)>,
    /// The timed job's stats (with its timeline, when the node recorded
    /// one).
    pub stats: JobStats,
}

impl BenchResult {
    /// A run's result: partitions are the source tasks (from the job's
    /// stats); the store's peak and spilled bytes come from the store the
    /// job ran on (`Context::store_stats`).
    pub fn new(
        workload: &str,
        config: String,
        wall: Duration,
        rows: u64,
        stats: &JobStats,
        store: &StoreStats,
        correct: bool,
    ) -> Self {
        Self {
            workload: workload.into(),
            config,
            wall,
            rows,
            partitions: stats.operators.first().map_or(0, |o| o.tasks),
            ideal: None,
            store_peak_bytes: store.peak_bytes,
            spilled_bytes: store.spilled_bytes,
            correct,
            extra: Vec::new(),
            stats: stats.clone(),
        }
    }

    /// The JSON line (keys of `docs/workloads.md`). `peak_rss_mib` is this
    /// process's VmHWM, read now: call it when the run has ended.
    pub fn to_json(&self) -> String {
        let wall = self.wall.as_secs_f64();
        let mut line = serde_json::json!({
            "workload": self.workload,
            "system": "streambatch",
            "config": self.config,
            "wall_s": round(wall),
            "rows": self.rows,
            "rows_per_s": round(self.rows as f64 / wall),
            "partitions_per_s": round(self.partitions as f64 / wall),
            "efficiency": self.ideal.map(|i| round(i.as_secs_f64() / wall)),
            "peak_rss_mib": peak_rss_mib(),
            "store_peak_bytes": self.store_peak_bytes,
            "spilled_bytes": self.spilled_bytes,
            "correct": self.correct,
        });
        for (key, value) in &self.extra {
            line[key] = value.clone();
        }
        line.to_string()
    }
}

pub(crate) fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// This process's peak resident memory in MiB (VmHWM), where Linux reports it.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(round(kib / 1024.0))
}

/// Progress of a workload that iterates its output: with `to_stdout`, a
/// `{"progress": {...}}` JSON line at most once a second, so that a harness
/// that stops a run at its time limit can report the rate it reached.
pub struct ProgressLines {
    to_stdout: bool,
    started: Instant,
    last: Instant,
    rows: u64,
    partitions: u64,
}

impl ProgressLines {
    /// Counts from now; prints only when `to_stdout`.
    pub fn new(to_stdout: bool) -> Self {
        let now = Instant::now();
        Self {
            to_stdout,
            started: now,
            last: now,
            rows: 0,
            partitions: 0,
        }
    }

    /// One output batch of `rows` rows arrived.
    pub fn add(&mut self, rows: u64) {
        self.rows += rows;
        self.partitions += 1;
        if self.to_stdout && self.last.elapsed() >= Duration::from_secs(1) {
            self.last = Instant::now();
            let line = serde_json::json!({"progress": {
                "rows": self.rows,
                "partitions": self.partitions,
                "elapsed_s": round(self.started.elapsed().as_secs_f64()),
            }});
            println!("{line}");
        }
    }

    /// Rows counted so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }
}
