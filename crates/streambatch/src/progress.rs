//! Live progress, one line per stage drawn from the executor's live stats:
//! rows done, tasks running and queued, store bytes held and what the stage
//! waits for. Bars on a terminal; a plain line per stage every few seconds
//! otherwise.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use streambatch_core::{NodeConfig, format_bytes};
use streambatch_plan::{ExecPlan, JobStats, JobStream, OperatorStats, Result, Runner};

/// A runner that draws progress bars for the jobs of another.
pub struct ProgressRunner {
    inner: Arc<dyn Runner>,
}

impl ProgressRunner {
    pub fn new(inner: Arc<dyn Runner>) -> Self {
        Self { inner }
    }
}

impl Runner for ProgressRunner {
    fn run(&self, plan: ExecPlan) -> Result<Box<dyn JobStream>> {
        let job = self.inner.run(plan)?;
        let stop = Arc::new(AtomicBool::new(false));
        let drawer = spawn_drawer(job.live_stats(), stop.clone());
        Ok(Box::new(WithProgress {
            job,
            stop,
            drawer: Some(drawer),
        }))
    }

    fn watch_split(&self, ranks: streambatch_plan::SplitWatch) {
        self.inner.watch_split(ranks);
    }

    fn config(&self) -> &NodeConfig {
        self.inner.config()
    }
}

struct WithProgress {
    job: Box<dyn JobStream>,
    stop: Arc<AtomicBool>,
    drawer: Option<JoinHandle<()>>,
}

impl WithProgress {
    fn finish(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(d) = self.drawer.take() {
            let _ = d.join();
        }
    }
}

impl Iterator for WithProgress {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let next = self.job.next();
        if !matches!(next, Some(Ok(_))) {
            self.finish();
        }
        next
    }
}

impl JobStream for WithProgress {
    fn live_stats(&self) -> Arc<Mutex<JobStats>> {
        self.job.live_stats()
    }

    fn next_rows(&mut self) -> Option<Result<usize>> {
        let next = self.job.next_rows();
        if !matches!(next, Some(Ok(_))) {
            self.finish();
        }
        next
    }
}

impl Drop for WithProgress {
    fn drop(&mut self) {
        self.finish();
    }
}

fn spawn_drawer(live: Arc<Mutex<JobStats>>, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        // The stages only: the events may be many.
        let read = || {
            let stats = live.lock().unwrap_or_else(|p| p.into_inner());
            stats.operators.clone()
        };
        if std::io::stderr().is_terminal() {
            draw_bars(read, &stop);
        } else {
            print_lines(read, &stop);
        }
    })
}

/// One line per stage: rows done, tasks running and queued, store bytes
/// its outputs hold, and what it waits for.
fn stage_line(op: &OperatorStats) -> String {
    // A fused stage's rows are those its busiest operator output: a sink
    // at its end outputs a row per file.
    let rows = op
        .ops
        .iter()
        .map(|o| o.rows)
        .max()
        .unwrap_or(0)
        .max(op.rows);
    let mut line = format!(
        "{rows} rows | {} done, {} running, {} queued | holds {}",
        op.tasks,
        op.running,
        op.queued,
        format_bytes(op.held_bytes)
    );
    if let Some(wait) = op.waiting {
        line += &format!(" | waits: {}", wait.name());
    }
    line
}

/// Live bars on a terminal, redrawn ten times a second.
fn draw_bars(read: impl Fn() -> Vec<OperatorStats>, stop: &AtomicBool) {
    let bars = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(10));
    let style = ProgressStyle::with_template("{prefix:<32} {spinner} {wide_msg}")
        .expect("a valid template");
    let mut lines: Vec<ProgressBar> = Vec::new();
    let mut draw = |stages: &[OperatorStats]| {
        while lines.len() < stages.len() {
            let bar = bars.add(ProgressBar::new_spinner().with_style(style.clone()));
            let name = &stages[lines.len()].name;
            bar.set_prefix(name.chars().take(32).collect::<String>());
            lines.push(bar);
        }
        for (bar, op) in lines.iter().zip(stages) {
            bar.set_message(stage_line(op));
            bar.tick();
        }
    };
    while !stop.load(Ordering::Relaxed) {
        draw(&read());
        std::thread::sleep(Duration::from_millis(100));
    }
    draw(&read());
    for bar in &lines {
        bar.finish();
    }
}

/// How often plain progress lines are printed when stderr is not a
/// terminal (a log file, CI).
const LINE_EVERY: Duration = Duration::from_secs(3);

/// One plain line per stage every few seconds, for logs.
fn print_lines(read: impl Fn() -> Vec<OperatorStats>, stop: &AtomicBool) {
    let started = Instant::now();
    let mut next = started + LINE_EVERY;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if Instant::now() < next {
            continue;
        }
        next += LINE_EVERY;
        let at = started.elapsed().as_secs_f64();
        for op in &read() {
            eprintln!("[{at:>6.1}s] {}: {}", op.name, stage_line(op));
        }
    }
}
