//! Live progress bars, one per stage, drawn from the executor's live stats.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use arrow_array::RecordBatch;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use streambatch_core::{NodeConfig, format_bytes};
use streambatch_plan::{ExecPlan, JobStats, JobStream, Result, Runner};

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
}

impl Drop for WithProgress {
    fn drop(&mut self) {
        self.finish();
    }
}

fn spawn_drawer(live: Arc<Mutex<JobStats>>, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let bars = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(10));
        let style =
            ProgressStyle::with_template("{prefix:<40} {spinner} {msg}").expect("a valid template");
        let mut lines: Vec<ProgressBar> = Vec::new();
        let mut draw = |stats: &JobStats| {
            while lines.len() < stats.operators.len() {
                let bar = bars.add(ProgressBar::new_spinner().with_style(style.clone()));
                bar.set_prefix(
                    stats.operators[lines.len()]
                        .name
                        .chars()
                        .take(40)
                        .collect::<String>(),
                );
                lines.push(bar);
            }
            for (bar, op) in lines.iter().zip(&stats.operators) {
                bar.set_message(format!(
                    "{} tasks done, {} running | {} rows, {} | {:.0} rows/s",
                    op.tasks,
                    op.running,
                    op.rows,
                    format_bytes(op.bytes),
                    op.rows_per_s()
                ));
                bar.tick();
            }
        };
        while !stop.load(Ordering::Relaxed) {
            draw(&live.lock().unwrap_or_else(|p| p.into_inner()));
            std::thread::sleep(Duration::from_millis(100));
        }
        draw(&live.lock().unwrap_or_else(|p| p.into_inner()));
        for bar in &lines {
            bar.finish();
        }
    })
}
