//! A deterministic simulation of the job state machine under node faults:
//! on a simulated clock, simulated nodes (each with the real budgets as its
//! memory) run what the job state decides, while nodes are killed, join
//! and drain as a schedule says, and a driver reads the outputs at its own
//! pace (finding some lost with their node). A run ends with the rows the
//! driver read, which must be every source row exactly once; it fails
//! (`Err`) when a task starts on a lost node's partitions or a node admits
//! more than its store.
//!
//! The same simulation is the scheduler's benchmark: with many nodes and
//! tasks that take no time ([`Scenario::wide`]), it measures how many tasks
//! per second the job state and the policy dispatch, with no actor, worker
//! or store in the way.
//!
//! ```
//! use streambatch_sched::sim::{Scenario, run};
//!
//! let done = run(&Scenario::wide(20, 500)).expect("every row once");
//! assert_eq!(done.rows.len(), 1_500); // 500 splits of 3 rows
//! assert!(done.faults.len() == 4 && done.recovery.remade_partitions > 0);
//! ```

#[cfg(test)]
mod chaos;
#[cfg(test)]
mod job_tests;
pub(crate) mod parts;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use streambatch_core::{Resources, TaskId};
use streambatch_plan::{JobStats, Recovery};

use crate::exec::budget::{Budgets, Hold};
use crate::job::record::Recorder;
use crate::job::{
    Action, FailurePolicy, JobState, Keep, Origin, PieceId, RunInput, ShapeKind, StageShape, Start,
    input_hold,
};
use crate::sim::parts::{
    CAPACITY, Held, RESERVE, ROW_BYTES, Rows, SimMemory, node_budgets, split_outputs,
};

/// A small deterministic generator (SplitMix64): the same seed, the same run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..hi` (`lo` when the range is empty).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % hi.saturating_sub(lo).max(1)
    }
}

/// What happens to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// An up node (chosen by the seed) is killed with what it holds.
    Kill,
    /// A new node joins.
    Join,
    /// An up node drains: it takes no new task and leaves once the job has
    /// nothing there.
    Drain,
}

/// The stages after the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pipeline {
    /// This many maps.
    Maps(usize),
    /// A map, a repartition into this many groups, and a map.
    Repartition(usize),
    /// A map, a limit of this many rows, and a map.
    Limit(usize),
    /// A map cutting each output into `n` destinations by range of row id
    /// (as a sort's cut: destination `d` holds the `d`-th `n`-th of the
    /// ids), the exchange, and its reducers, their outputs passed on in
    /// order when `ordered` (as a sort's).
    Exchange {
        /// Destinations.
        n: usize,
        /// As a sort's reducers.
        ordered: bool,
    },
}

impl Pipeline {
    /// The destinations stage `stage`'s outputs are cut into, if it is an
    /// exchange's map side.
    fn cut_at(self, stage: usize) -> Option<usize> {
        match self {
            Pipeline::Exchange { n, .. } if stage == 1 => Some(n),
            _ => None,
        }
    }

    /// What a task of stage `stage` holds of its input outside the store
    /// at most: an exchange's reducer holds up to a quarter of a 4 KB
    /// store, as a sort's or join's does up to its cap.
    fn input_held_cap(self, stage: usize) -> u64 {
        match self {
            Pipeline::Exchange { .. } if stage == 3 => CAPACITY / 4,
            _ => 0,
        }
    }
}

/// What a simulated job is: its nodes, its source, its pipeline, its
/// faults and how long things take on the simulated clock.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Seeds the choices made while it runs (step times, which node a
    /// fault hits).
    pub seed: u64,
    /// Nodes at the start.
    pub nodes: usize,
    /// CPU slots per node.
    pub cpus: f64,
    /// Rows of each source split (a task yields three rows per output).
    pub split_rows: Vec<usize>,
    /// The stages after the source.
    pub pipeline: Pipeline,
    /// Each fault with the count of events handled before it.
    pub faults: Vec<(u64, Fault)>,
    /// Simulated time one step of a task takes (an output or its end), as
    /// a range; `0..0` for tasks that take no time.
    pub step_time: std::ops::Range<u64>,
    /// Simulated time between two reads of the driver, as a range.
    pub read_gap: std::ops::Range<u64>,
    /// Store bytes per node (a row is 100 bytes).
    pub capacity: u64,
    /// Retries a task gets (`max_task_retries`).
    pub max_task_retries: u32,
    /// Whether the job's recorder keeps its timeline (`record_timeline`).
    pub record_timeline: bool,
    /// The driver keeps every output it reads (a `collect`), holding its
    /// share of its node's budget until the job ends.
    pub driver_keeps: bool,
}

impl Scenario {
    /// A small job chosen by `seed`: 1 to 9 splits of up to 12 rows, a
    /// source then one or two maps, a repartition, a limit or an exchange, 2 to 4 nodes of 1 to
    /// 3 slots and 4 KB of store each, and up to three faults.
    pub fn seeded(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let split_rows = (0..rng.range(1, 10))
            .map(|_| rng.range(0, 13) as usize)
            .collect();
        let pipeline = match rng.range(0, 5) {
            0 => Pipeline::Maps(1),
            1 => Pipeline::Maps(2),
            2 => Pipeline::Repartition(rng.range(1, 5) as usize),
            3 => Pipeline::Limit(rng.range(0, 60) as usize),
            _ => Pipeline::Exchange {
                n: rng.range(1, 5) as usize,
                ordered: rng.range(0, 2) == 1,
            },
        };
        let nodes = rng.range(2, 5) as usize;
        let cpus = rng.range(1, 4) as f64;
        let faults = (0..rng.range(0, 4))
            .map(|_| {
                let at = rng.range(1, 100);
                let fault =
                    [Fault::Kill, Fault::Kill, Fault::Join, Fault::Drain][rng.range(0, 4) as usize];
                (at, fault)
            })
            .collect();
        let driver_keeps = rng.range(0, 2) == 1;
        Self {
            seed,
            nodes,
            cpus,
            split_rows,
            pipeline,
            faults,
            step_time: 1..6,
            read_gap: 0..4,
            capacity: CAPACITY,
            max_task_retries: 3,
            record_timeline: true,
            driver_keeps,
        }
    }

    /// A job of `splits` splits of three rows through a source and a map on
    /// `nodes` nodes of 8 slots, whose tasks and reads take no time, with
    /// memory to spare: a node is killed a fifth of the way through, one
    /// joins, one drains, and another is killed at four fifths.
    pub fn wide(nodes: usize, splits: usize) -> Self {
        // About five events a split: a source output and end, a map output
        // and end, a read.
        let events = 5 * splits as u64;
        let at = |fifths: u64| events * fifths / 5;
        Self {
            seed: 1,
            nodes,
            cpus: 8.0,
            split_rows: vec![3; splits],
            pipeline: Pipeline::Maps(1),
            faults: vec![
                (at(1), Fault::Kill),
                (at(2), Fault::Join),
                (at(3), Fault::Drain),
                (at(4), Fault::Kill),
            ],
            step_time: 0..0,
            read_gap: 0..0,
            capacity: 1 << 40,
            max_task_retries: 3,
            record_timeline: true,
            driver_keeps: false,
        }
    }
}

impl Pipeline {
    /// The job's stages: a source over `splits` splits, then these; each
    /// stage's task takes one CPU slot.
    pub(crate) fn shapes(self, splits: usize) -> Vec<StageShape> {
        let shape = |name: &str, kind| StageShape {
            name: name.into(),
            kind,
            resources: Resources::cpu(1.0),
            max_running: None,
            held_bytes: Vec::new(),
            ordered: false,
            input_held_cap: 0,
        };
        let mut out = vec![shape("source", ShapeKind::Source { splits })];
        match self {
            Pipeline::Maps(n) => out.extend((0..n).map(|_| shape("map", ShapeKind::Map))),
            Pipeline::Repartition(n) => out.extend([
                shape("map", ShapeKind::Map),
                shape("repartition", ShapeKind::Repartition(n)),
                shape("concat", ShapeKind::Map),
            ]),
            Pipeline::Limit(n) => out.extend([
                shape("map", ShapeKind::Map),
                shape("limit", ShapeKind::Limit(n)),
                shape("after", ShapeKind::Map),
            ]),
            Pipeline::Exchange { n, ordered } => out.extend([
                shape("map", ShapeKind::Map),
                shape("exchange", ShapeKind::Exchange(n)),
                StageShape {
                    ordered,
                    input_held_cap: self.input_held_cap(3),
                    ..shape("reduce", ShapeKind::Map)
                },
            ]),
        }
        out
    }
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct SimRun {
    /// The rows the driver read, in the order it read them.
    pub rows: Vec<u64>,
    /// Every source row, in order.
    pub source: Vec<u64>,
    /// The rows a limit lets through, if the pipeline has one.
    pub limit: Option<usize>,
    /// For an ordered exchange: its destinations and the ids' span.
    pub ordered: Option<(u64, u64)>,
    /// The job's recovery counts.
    pub recovery: Recovery,
    /// The faults that happened.
    pub faults: Vec<Fault>,
    /// Drained nodes that left before the job ended.
    pub drained_left: usize,
    /// Outputs moved off draining nodes.
    pub moved: usize,
    /// Tasks started (retries and re-runs included).
    pub tasks: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl SimRun {
    /// Tasks started per second of wall time.
    pub fn tasks_per_s(&self) -> f64 {
        self.tasks as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// For an ordered exchange: `Err` unless the driver read every
    /// destination's rows before the next one's (a sort's ranges in order).
    pub fn check_in_order(&self) -> Result<(), String> {
        let Some((n, span)) = self.ordered else {
            return Ok(());
        };
        let destination = |row: u64| row * n / span.max(1);
        match self
            .rows
            .windows(2)
            .find(|w| destination(w[1]) < destination(w[0]))
        {
            Some(w) => Err(format!(
                "row {} (destination {}) came after row {} (destination {})",
                w[1],
                destination(w[1]),
                w[0],
                destination(w[0])
            )),
            None => Ok(()),
        }
    }

    /// `Err` unless the driver read every source row exactly once (under a
    /// limit of n rows: n of them, or all when fewer, each once).
    pub fn check_exactly_once(&self) -> Result<(), String> {
        let mut seen = HashSet::new();
        let twice = self.rows.iter().filter(|r| !seen.insert(**r)).count();
        let source: HashSet<&u64> = self.source.iter().collect();
        let unknown = self.rows.iter().filter(|r| !source.contains(r)).count();
        let want = self
            .limit
            .map_or(self.source.len(), |n| n.min(self.source.len()));
        if twice == 0 && unknown == 0 && self.rows.len() == want {
            return Ok(());
        }
        Err(format!(
            "the driver read {} rows where {want} were due: {twice} twice, {unknown} not from the source",
            self.rows.len()
        ))
    }
}

/// Runs `scenario`; `Err` says what went wrong.
pub fn run(scenario: &Scenario) -> Result<SimRun, String> {
    Sim::new(scenario).run()
}

struct SimTask {
    stage: usize,
    node: usize,
    outputs: Vec<(u64, usize)>,
    next: usize,
    keep: Keep,
    may_spill: bool,
    /// Tells this task's current entry in the queue of due steps from
    /// older ones.
    turn: u64,
    /// What it holds of its input outside the store, as a node's reducer
    /// does from its start to its end.
    _hold: Option<Hold>,
}

#[derive(Clone, Copy, PartialEq)]
enum NodeState {
    Up,
    Draining,
    Gone,
}

/// The next thing to happen.
enum Event {
    Fault(Fault),
    Read,
    Move,
    Step(TaskId),
}

/// An output on its way off a draining node.
struct Moving {
    due: u64,
    origin: Origin,
    stage: usize,
    to: usize,
}

struct Sim<'a> {
    scenario: &'a Scenario,
    rng: Rng,
    job: JobState<Rows>,
    reserves: Vec<u64>,
    budgets: Vec<Budgets>,
    state: Vec<NodeState>,
    draining: Vec<usize>,
    bases: Vec<u64>,
    /// Faults still to come, the next last.
    schedule: Vec<(u64, Fault)>,
    faults: Vec<Fault>,
    drained_left: usize,
    moved: usize,
    /// Outputs admitted over budget that still live.
    forced: Arc<AtomicUsize>,
    running: HashMap<TaskId, SimTask>,
    /// Per node: tasks running or paused there.
    tasks_on: Vec<usize>,
    /// Running tasks' next steps: when, which task, which turn of it.
    due: BinaryHeap<Reverse<(u64, TaskId, u64)>>,
    turns: u64,
    paused: HashMap<TaskId, SimTask>,
    cancelled: HashSet<usize>,
    outbox: VecDeque<(Rows, PieceId)>,
    /// Every output's rows, for a copy of it moved off a draining node.
    wholes: HashMap<Origin, (u64, usize)>,
    moves: VecDeque<Moving>,
    next_read: u64,
    rows: Vec<u64>,
    /// What the driver read and keeps (`Scenario::driver_keeps`).
    kept: Vec<Rows>,
    clock: u64,
    events: u64,
    tasks: u64,
}

impl<'a> Sim<'a> {
    fn new(scenario: &'a Scenario) -> Self {
        let shapes = scenario.pipeline.shapes(scenario.split_rows.len());
        let reserves = shapes
            .iter()
            .map(|s| match s.kind {
                ShapeKind::Source { .. } | ShapeKind::Map => RESERVE,
                _ => 0,
            })
            .collect();
        let names = shapes.iter().map(|s| s.name.clone()).collect();
        let recorder = Recorder::new(
            Arc::new(Mutex::new(JobStats::default())),
            names,
            scenario.capacity,
        )
        .record_timeline(scenario.record_timeline);
        let nodes = scenario.nodes.max(1);
        let job = JobState::<Rows>::new(
            shapes,
            vec![Resources::cpu(scenario.cpus); nodes],
            FailurePolicy {
                max_task_retries: scenario.max_task_retries,
                ..Default::default()
            },
            recorder,
        )
        .with_lineage();
        let bases = scenario
            .split_rows
            .iter()
            .scan(0u64, |next, &n| {
                let base = *next;
                *next += n as u64 + 1_000;
                Some(base)
            })
            .collect();
        let mut schedule = scenario.faults.clone();
        schedule.sort_by_key(|(at, _)| Reverse(*at));
        let mut sim = Self {
            scenario,
            rng: Rng(scenario.seed),
            job,
            reserves,
            budgets: Vec::new(),
            state: vec![NodeState::Up; nodes],
            draining: Vec::new(),
            bases,
            schedule,
            faults: Vec::new(),
            drained_left: 0,
            moved: 0,
            forced: Arc::new(AtomicUsize::new(0)),
            running: HashMap::new(),
            tasks_on: vec![0; nodes],
            due: BinaryHeap::new(),
            turns: 0,
            paused: HashMap::new(),
            cancelled: HashSet::new(),
            outbox: VecDeque::new(),
            wholes: HashMap::new(),
            moves: VecDeque::new(),
            next_read: 0,
            rows: Vec::new(),
            kept: Vec::new(),
            clock: 0,
            events: 0,
            tasks: 0,
        };
        sim.budgets = node_budgets(nodes, sim.scenario.capacity, &sim.reserves);
        sim
    }

    /// A joining node's budgets, adding to the others' totals.
    fn new_budgets(&self) -> Budgets {
        let totals = self.budgets[0].totals().clone();
        let reserves = self.reserves.clone();
        Budgets::adding_to(totals, self.scenario.capacity, reserves, Arc::new(|| {}))
    }

    fn run(mut self) -> Result<SimRun, String> {
        let started = Instant::now();
        let max_events = 200_000.max(100 * self.scenario.split_rows.len() as u64);
        while self.events < max_events {
            for action in self.job.advance(&SimMemory(&self.budgets)) {
                if let Some(result) = self.act(action)? {
                    result.map_err(|e| format!("the job failed: {e}"))?;
                    if !self.outbox.is_empty() {
                        return Err("the job ended before the driver read every output".into());
                    }
                    return Ok(self.finish(started.elapsed()));
                }
            }
            self.leave_drained()?;
            let Some((at, event)) = self.next_event() else {
                return Err(format!(
                    "the job is stuck: nothing runs, nothing to read; faults {:?}\n{}",
                    self.faults,
                    self.job.describe()
                ));
            };
            self.clock = at;
            self.events += 1;
            match event {
                Event::Fault(fault) => self.fault(fault),
                Event::Read => self.read(),
                Event::Move => self.arrive(),
                Event::Step(task) => self.step(task)?,
            }
        }
        Err("the job does not end".into())
    }

    /// One past the greatest source row id.
    fn span(&self) -> u64 {
        let last = self.scenario.split_rows.last().copied().unwrap_or(0);
        self.bases.last().map_or(0, |b| b + last as u64)
    }

    fn finish(self, elapsed: Duration) -> SimRun {
        let ordered = match self.scenario.pipeline {
            Pipeline::Exchange { n, ordered: true } => Some((n as u64, self.span())),
            _ => None,
        };
        let source = self
            .scenario
            .split_rows
            .iter()
            .zip(&self.bases)
            .flat_map(|(&n, &b)| b..b + n as u64)
            .collect();
        let limit = match self.scenario.pipeline {
            Pipeline::Limit(n) => Some(n),
            _ => None,
        };
        SimRun {
            rows: self.rows,
            source,
            limit,
            ordered,
            recovery: self.job.recorder().recovery(),
            faults: self.faults,
            drained_left: self.drained_left,
            moved: self.moved,
            tasks: self.tasks,
            elapsed,
        }
    }

    /// Carries out one of the job's decisions; `Some` when the job ended.
    fn act(&mut self, action: Action<Rows>) -> Result<Option<Result<(), String>>, String> {
        match action {
            Action::Start(start) => self.start(start)?,
            Action::Resume {
                task,
                node,
                may_spill,
            } => {
                let mut t = self
                    .paused
                    .remove(&task)
                    .ok_or("only a paused task resumes")?;
                if t.node != node || self.state[node] == NodeState::Gone {
                    return Err(format!("task {task} resumed on node {node}"));
                }
                t.may_spill = may_spill;
                self.schedule_step(task, t);
            }
            Action::Emit { part, id } => self.outbox.push_back((part, id)),
            Action::Cancel { stage } => {
                self.cancelled.insert(stage);
                let tasks_on = &mut self.tasks_on;
                self.paused.retain(|_, t| {
                    let keep = t.stage != stage || t.keep.remakes_only();
                    if !keep {
                        tasks_on[t.node] -= 1;
                    }
                    keep
                });
            }
            Action::FitReserve { stage, bytes } => self
                .budgets
                .iter()
                .for_each(|b| b.fit_reserve(stage, bytes)),
            Action::Move {
                origin, stage, to, ..
            } => {
                // In order, each after a step's time.
                let time = &self.scenario.step_time;
                let after = self.moves.back().map_or(0, |m| m.due);
                let due = (self.clock + self.rng.range(time.start, time.end)).max(after);
                self.moves.push_back(Moving {
                    due,
                    origin,
                    stage,
                    to,
                });
            }
            Action::End(result) => return Ok(Some(result.map_err(|e| e.to_string()))),
            Action::Drained => {}
        }
        Ok(None)
    }

    /// Starts a task the job decided on, checking what it reads.
    fn start(&mut self, start: Start<Rows>) -> Result<(), String> {
        let (task, node) = (start.task, start.node);
        if self.state[node] != NodeState::Up {
            return Err(format!("task {task} started on node {node}, not up"));
        }
        // What the holders find for a hash exchange's reducer adds up to
        // what the cuts said, as a node checks.
        if let (Some(rows), RunInput::Parts(parts, _)) = (start.rows, &start.input) {
            let found: usize = parts.iter().map(|p| p.len).sum();
            if found as u64 != rows {
                return Err(format!(
                    "task {task}: holders found {found} rows, cuts said {rows}"
                ));
            }
        }
        let cap = self.scenario.pipeline.input_held_cap(start.stage);
        let hold = match &start.input {
            RunInput::Parts(parts, _) if cap > 0 => {
                Some(self.budgets[node].hold(input_hold(cap, parts)))
            }
            _ => None,
        };
        let outputs = match start.input {
            RunInput::Split(i) => split_outputs(self.bases[i], self.scenario.split_rows[i]),
            RunInput::Parts(parts, _) => {
                if let Some(p) = parts.iter().find(|p| self.state[p.node] == NodeState::Gone) {
                    return Err(format!(
                        "task {task} reads rows held by node {}, which is gone",
                        p.node
                    ));
                }
                // A reducer's part of an output holding no rows of its
                // destination makes nothing.
                parts
                    .iter()
                    .filter(|p| p.len > 0)
                    .map(|p| (p.start, p.len))
                    .collect()
            }
        };
        self.tasks += 1;
        self.tasks_on[node] += 1;
        let t = SimTask {
            stage: start.stage,
            node,
            outputs,
            next: 0,
            keep: start.keep,
            may_spill: start.may_spill,
            turn: 0,
            _hold: hold,
        };
        self.schedule_step(task, t);
        Ok(())
    }

    /// An output moved off a draining node lands on its new node, if that
    /// node is still up and its budget has room.
    fn arrive(&mut self) {
        let m = self.moves.pop_front().expect("a move is due");
        let (start, len) = self.wholes[&m.origin];
        let bytes = len as u64 * ROW_BYTES;
        if self.state[m.to] != NodeState::Up {
            return;
        }
        let budget = &self.budgets[m.to];
        if let Some(held) = Held::admit(budget, m.stage, bytes, false, &self.forced) {
            let whole = Rows {
                start,
                len,
                bytes,
                node: m.to,
                _held: Arc::new(held),
                groups: None,
                sample: None,
                cut_at_holder: false,
            };
            self.job.on_moved(m.origin, whole);
            self.moved += 1;
        }
    }

    /// Runs `task`'s next step after a step's time.
    fn schedule_step(&mut self, task: TaskId, mut t: SimTask) {
        let time = &self.scenario.step_time;
        let at = self.clock + self.rng.range(time.start, time.end);
        self.turns += 1;
        t.turn = self.turns;
        self.due.push(Reverse((at, task, t.turn)));
        self.running.insert(task, t);
    }

    /// The next event on the clock: a fault once its count of events has
    /// passed (or nothing else can happen), else a driver read or a task's
    /// step, whichever is due first.
    fn next_event(&mut self) -> Option<(u64, Event)> {
        let fault_now = self
            .schedule
            .last()
            .is_some_and(|(at, _)| self.events >= *at);
        let step = self.next_step();
        let read = (!self.outbox.is_empty()).then_some(self.next_read.max(self.clock));
        let moved = self.moves.front().map(|m| m.due.max(self.clock));
        if fault_now || (step.is_none() && read.is_none() && moved.is_none()) {
            let (_, fault) = self.schedule.pop()?;
            return Some((self.clock, Event::Fault(fault)));
        }
        // At the same time: a read, then a move, then a step.
        let step_at = step.map(|(at, _)| at);
        let first = [read, moved, step_at].into_iter().flatten().min()?;
        if read == Some(first) {
            Some((first, Event::Read))
        } else if moved == Some(first) {
            Some((first, Event::Move))
        } else {
            let (at, task) = step?;
            self.due.pop();
            Some((at, Event::Step(task)))
        }
    }

    /// The running task whose step is due first, dropping entries of tasks
    /// that stopped or were scheduled again since.
    fn next_step(&mut self) -> Option<(u64, TaskId)> {
        while let Some(Reverse((at, task, turn))) = self.due.peek().copied() {
            if self.running.get(&task).is_some_and(|t| t.turn == turn) {
                return Some((at, task));
            }
            self.due.pop();
        }
        None
    }

    fn fault(&mut self, fault: Fault) {
        let up: Vec<usize> = (0..self.state.len())
            .filter(|&n| self.state[n] == NodeState::Up)
            .collect();
        match fault {
            Fault::Kill | Fault::Drain if up.len() < 2 => return,
            Fault::Kill => {
                let node = up[self.rng.range(0, up.len() as u64) as usize];
                self.state[node] = NodeState::Gone;
                self.running.retain(|_, t| t.node != node);
                self.paused.retain(|_, t| t.node != node);
                self.tasks_on[node] = 0;
                self.job.on_node_lost(node, &format!("n{node}"));
            }
            Fault::Join => {
                self.budgets.push(self.new_budgets());
                self.state.push(NodeState::Up);
                self.tasks_on.push(0);
                self.job.add_node(Resources::cpu(self.scenario.cpus));
            }
            Fault::Drain => {
                let node = up[self.rng.range(0, up.len() as u64) as usize];
                self.state[node] = NodeState::Draining;
                self.draining.push(node);
                self.job.drain_node(node);
            }
        }
        self.faults.push(fault);
    }

    /// The driver reads the oldest output, unless its node is gone.
    fn read(&mut self) {
        let (part, id) = self.outbox.pop_front().expect("an output is waiting");
        let read = self.state[part.node] != NodeState::Gone;
        if read {
            self.rows.extend(part.start..part.start + part.len as u64);
            if self.scenario.driver_keeps {
                self.kept.push(part);
            }
        }
        self.job.on_read(id, read);
        let gap = &self.scenario.read_gap;
        self.next_read = self.clock + self.rng.range(gap.start, gap.end);
    }

    /// A drained node leaves once the job has nothing there and the driver
    /// has read what it holds, and nothing may be redone for it.
    fn leave_drained(&mut self) -> Result<(), String> {
        for node in std::mem::take(&mut self.draining) {
            // Cheap checks first: the job's own is a pass over its tasks.
            let busy = self.tasks_on[node] > 0;
            if busy
                || self.outbox.iter().any(|(part, _)| part.node == node)
                || !self.job.left_cleanly(node)
            {
                self.draining.push(node);
                continue;
            }
            self.state[node] = NodeState::Gone;
            self.drained_left += 1;
            let before = self.job.recorder().recovery();
            self.job.on_node_lost(node, &format!("n{node}"));
            if self.job.recorder().recovery() != before {
                return Err(format!("drained node {node} left, and work was redone"));
            }
        }
        Ok(())
    }

    /// Task `id`'s next step: its next output (if the store admits it, else
    /// it pauses) or its end.
    fn step(&mut self, id: TaskId) -> Result<(), String> {
        let mut t = self.running.remove(&id).expect("a due task runs");
        while t.next < t.outputs.len() && !t.keep.stores(t.next as u32) {
            t.next += 1;
        }
        let all_kept = t.next > 0 && t.keep.done_after(t.next as u32 - 1);
        let cancelled = self.cancelled.contains(&t.stage) && !t.keep.remakes_only();
        if cancelled || t.next == t.outputs.len() || all_kept {
            self.tasks_on[t.node] -= 1;
            if let Some(stage) = self.job.on_finished(id) {
                self.job.record_finished(stage, Duration::ZERO, Vec::new());
            }
            return Ok(());
        }
        let (start, len) = t.outputs[t.next];
        let bytes = len as u64 * ROW_BYTES;
        let budget = &self.budgets[t.node];
        let Some(held) = Held::admit(budget, t.stage, bytes, t.may_spill, &self.forced) else {
            if self.job.on_paused(id, bytes, None) {
                self.paused.insert(id, t);
            } else {
                self.tasks_on[t.node] -= 1;
            }
            return Ok(());
        };
        if self.forced.load(Ordering::SeqCst) == 0 {
            let held: u64 = (0..self.reserves.len()).map(|s| budget.used(s)).sum();
            if held > self.scenario.capacity {
                return Err(format!(
                    "node {}: {held} bytes admitted over {}",
                    t.node, self.scenario.capacity
                ));
            }
        }
        let seq = t.next as u32;
        t.next += 1;
        self.wholes.insert(Origin { task: id, seq }, (start, len));
        let part = Rows {
            start,
            len,
            bytes,
            node: t.node,
            _held: Arc::new(held),
            // Destination d: the ids of the d-th n-th of the span.
            groups: self.scenario.pipeline.cut_at(t.stage).map(|n| {
                (0..=n as u64)
                    .map(|d| {
                        let bound = (d * self.span()).div_ceil(n as u64);
                        bound.saturating_sub(start).min(len as u64) as u32
                    })
                    .collect()
            }),
            sample: None,
            cut_at_holder: false,
        };
        self.schedule_step(id, t);
        self.job.on_output(id, seq, part);
        Ok(())
    }
}
