//! The job state machine and the policy alone, on virtual nodes whose tasks
//! take no time: how many tasks per second the scheduler's decisions
//! dispatch, with no actor, worker or store in the way.
//!
//! ```
//! let run = streambatch_sched::sim::dispatch(10, 2_000);
//! assert_eq!(run.tasks, 4_000); // a source task and a map task per split
//! assert!(run.rows_out == 2_000);
//! ```

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use streambatch_core::Resources;
use streambatch_plan::JobStats;

use crate::job::{Action, FailurePolicy, Input, JobState, Memory, Part, ShapeKind, StageShape};
use crate::record::Recorder;

/// What a simulated job did.
#[derive(Clone, Copy, Debug)]
pub struct DispatchRun {
    /// Tasks started.
    pub tasks: u64,
    /// Rows the last stage handed out (one per split).
    pub rows_out: u64,
    /// Time spent deciding and bookkeeping, start to end.
    pub elapsed: Duration,
}

impl DispatchRun {
    /// Tasks dispatched per second.
    pub fn tasks_per_s(&self) -> f64 {
        self.tasks as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

/// A one-row partition held on a virtual node.
#[derive(Clone)]
struct Row(usize);

impl Part for Row {
    fn rows(&self) -> usize {
        1
    }

    fn bytes(&self) -> u64 {
        1
    }

    fn sub(&self, _offset: usize, _len: usize) -> Self {
        self.clone()
    }

    fn node(&self) -> usize {
        self.0
    }
}

/// Memory that always has room: the simulation measures decisions only.
struct Unbounded;

impl Memory for Unbounded {
    fn fits(&self, _node: usize, _stage: usize, _bytes: u64) -> bool {
        true
    }

    fn frees(&self, _node: usize) -> u64 {
        0
    }

    fn held(&self, _stage: usize) -> u64 {
        0
    }
}

/// Runs a job of a source over `splits` splits and one map stage on
/// `nodes` virtual nodes of 8 CPU slots each. Every task yields one row and
/// finishes the moment it starts.
pub fn dispatch(nodes: usize, splits: usize) -> DispatchRun {
    let shape = |name: &str, kind| StageShape {
        name: name.into(),
        kind,
        resources: Resources::cpu(1.0),
        max_running: None,
    };
    let shapes = vec![
        shape("source", ShapeKind::Source { splits }),
        shape("map", ShapeKind::Map),
    ];
    let names = shapes.iter().map(|s| s.name.clone()).collect();
    let recorder = Recorder::new(Arc::new(Mutex::new(JobStats::default())), names, u64::MAX);
    let free = vec![Resources::cpu(8.0); nodes.max(1)];
    let mut job = JobState::<Row>::new(shapes, free, FailurePolicy::default(), recorder);
    let (mut tasks, mut rows_out) = (0, 0);
    let mut started = Vec::new();
    let clock = Instant::now();
    'run: loop {
        for action in job.advance(&Unbounded) {
            match action {
                Action::Start {
                    task, node, input, ..
                } => {
                    tasks += 1;
                    let node = match input {
                        Input::Split(_) => node,
                        Input::Parts(parts) => parts.first().map_or(node, Part::node),
                    };
                    started.push((task, node));
                }
                Action::Emit { .. } => rows_out += 1,
                Action::End(_) => break 'run,
                Action::Resume { .. } | Action::Cancel { .. } | Action::FitReserve { .. } => {}
            }
        }
        if started.is_empty() {
            break;
        }
        for (task, node) in started.drain(..) {
            job.on_output(task, 0, Row(node));
            job.on_finished(task);
        }
    }
    DispatchRun {
        tasks,
        rows_out,
        elapsed: clock.elapsed(),
    }
}
