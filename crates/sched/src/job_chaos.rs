//! A deterministic simulation of the job state machine under node faults:
//! on a simulated clock, simulated nodes (each with the real [`Budgets`] as
//! its memory) run what [`JobState`] decides, while nodes are killed, join
//! and drain as a seeded schedule says, and a driver reads the outputs at
//! its own pace (finding some lost with their node). Each seed must end
//! with every source row delivered exactly once, no task started on a lost
//! node's partitions, and each node's admitted outputs within its store.
//!
//! `cargo test -p streambatch-sched chaos` runs 1,000 seeds; `SB_SIM_SEEDS=N`
//! runs N, and `SB_SIM_SEED=S` replays seed S alone (a failing seed is
//! printed with that command).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use streambatch_core::{Resources, TaskId};
use streambatch_plan::{JobStats, Recovery};

use crate::budget::Budgets;
use crate::job::{Action, FailurePolicy, Input, JobState, Keep, PieceId, ShapeKind, StageShape};
use crate::record::Recorder;
use crate::sim_parts::{CAPACITY, Held, RESERVE, ROW_BYTES, Rows, SimMemory, split_outputs};

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

    /// A number in `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
}

struct SimTask {
    stage: usize,
    node: usize,
    outputs: Vec<(u64, usize)>,
    next: usize,
    keep: Keep,
    may_spill: bool,
    /// When its next step happens.
    due: u64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Kill,
    Join,
    Drain,
}

#[derive(Clone, Copy, PartialEq)]
enum NodeState {
    Up,
    Draining,
    Gone,
}

/// The pipeline of a seed: a source, then one or two maps, or a map,
/// a repartition and a map.
fn shapes(rng: &mut Rng, splits: usize) -> Vec<StageShape> {
    let shape = |name: &str, kind| StageShape {
        name: name.into(),
        kind,
        resources: Resources::cpu(1.0),
        max_running: None,
    };
    let mut out = vec![shape("source", ShapeKind::Source { splits })];
    match rng.range(0, 3) {
        0 => out.push(shape("map", ShapeKind::Map)),
        1 => out.extend([shape("map", ShapeKind::Map), shape("map2", ShapeKind::Map)]),
        _ => out.extend([
            shape("map", ShapeKind::Map),
            shape(
                "repartition",
                ShapeKind::Repartition(rng.range(1, 5) as usize),
            ),
            shape("concat", ShapeKind::Map),
        ]),
    }
    out
}

/// What a seed's run delivered.
struct Run {
    rows: Vec<u64>,
    source: Vec<u64>,
    recovery: Recovery,
    faults: Vec<Fault>,
}

/// Runs seed `seed`; `Err` says what went wrong.
fn run(seed: u64) -> Result<Run, String> {
    let mut rng = Rng(seed);
    let split_rows: Vec<usize> = (0..rng.range(1, 10))
        .map(|_| rng.range(0, 13) as usize)
        .collect();
    let shapes = shapes(&mut rng, split_rows.len());
    let stages = shapes.len();
    let reserves: Vec<u64> = shapes
        .iter()
        .map(|s| match s.kind {
            ShapeKind::Source { .. } | ShapeKind::Map => RESERVE,
            _ => 0,
        })
        .collect();
    let nodes = rng.range(2, 5) as usize;
    let cpus = rng.range(1, 4) as f64;
    let names = shapes.iter().map(|s| s.name.clone()).collect();
    let live = Arc::new(Mutex::new(JobStats::default()));
    let recorder = Recorder::new(live, names, CAPACITY);
    let mut job = JobState::<Rows>::new(
        shapes,
        vec![Resources::cpu(cpus); nodes],
        FailurePolicy {
            max_task_retries: 3,
            ..Default::default()
        },
        recorder,
    )
    .with_lineage();
    let new_budgets = || Budgets::new(CAPACITY, reserves.clone(), Arc::new(|| {}));
    let mut budgets: Vec<Budgets> = (0..nodes).map(|_| new_budgets()).collect();
    let mut state = vec![NodeState::Up; nodes];
    let bases: Vec<u64> = split_rows
        .iter()
        .scan(0u64, |next, &n| {
            let base = *next;
            *next += n as u64 + 1_000;
            Some(base)
        })
        .collect();
    let source: Vec<u64> = split_rows
        .iter()
        .zip(&bases)
        .flat_map(|(&n, &b)| b..b + n as u64)
        .collect();
    // Up to three faults at seeded times.
    let mut schedule: Vec<(u64, Fault)> = (0..rng.range(0, 4))
        .map(|_| {
            let fault =
                [Fault::Kill, Fault::Kill, Fault::Join, Fault::Drain][rng.range(0, 4) as usize];
            (rng.range(1, 60), fault)
        })
        .collect();
    schedule.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
    let mut faults = Vec::new();

    let forced = Arc::new(AtomicUsize::new(0));
    let mut running: BTreeMap<TaskId, SimTask> = BTreeMap::new();
    let mut paused: HashMap<TaskId, SimTask> = HashMap::new();
    let mut cancelled: HashSet<usize> = HashSet::new();
    let mut outbox: VecDeque<(Rows, PieceId)> = VecDeque::new();
    let mut next_read = 0u64;
    let mut rows = Vec::new();
    let mut clock = 0u64;
    let mut ended = None;
    for _ in 0..200_000 {
        for action in job.advance(&SimMemory(&budgets)) {
            match action {
                Action::Start {
                    task,
                    stage,
                    node,
                    input,
                    keep,
                    may_spill,
                } => {
                    if state[node] != NodeState::Up {
                        return Err(format!("task {task} started on node {node}, not up"));
                    }
                    let outputs = match input {
                        Input::Split(i) => split_outputs(bases[i], split_rows[i]),
                        Input::Parts(parts) => {
                            if let Some(p) = parts.iter().find(|p| state[p.node] == NodeState::Gone)
                            {
                                return Err(format!(
                                    "task {task} reads rows held by node {}, which is gone",
                                    p.node
                                ));
                            }
                            parts.iter().map(|p| (p.start, p.len)).collect()
                        }
                    };
                    let due = clock + rng.range(1, 6);
                    let t = SimTask {
                        stage,
                        node,
                        outputs,
                        next: 0,
                        keep,
                        may_spill,
                        due,
                    };
                    running.insert(task, t);
                }
                Action::Resume {
                    task,
                    node,
                    may_spill,
                } => {
                    let mut t = paused.remove(&task).ok_or("only a paused task resumes")?;
                    if t.node != node || state[node] == NodeState::Gone {
                        return Err(format!("task {task} resumed on node {node}"));
                    }
                    t.may_spill = may_spill;
                    t.due = clock + rng.range(1, 6);
                    running.insert(task, t);
                }
                Action::Emit { part, id } => outbox.push_back((part, id)),
                Action::Cancel { stage } => {
                    cancelled.insert(stage);
                    paused.retain(|_, t| t.stage != stage);
                }
                Action::FitReserve { stage, bytes } => {
                    budgets.iter().for_each(|b| b.fit_reserve(stage, bytes))
                }
                Action::End(result) => ended = Some(result),
            }
        }
        if let Some(result) = ended {
            result.map_err(|e| format!("the job failed: {e}"))?;
            if !outbox.is_empty() {
                return Err("the job ended before the driver read every output".into());
            }
            let stats = job.recorder().snapshot();
            return Ok(Run {
                rows,
                source,
                recovery: stats.recovery,
                faults,
            });
        }
        if forced.load(Ordering::SeqCst) == 0 {
            for (node, b) in budgets.iter().enumerate() {
                let held: u64 = (0..stages).map(|s| b.used(s)).sum();
                if held > CAPACITY {
                    return Err(format!(
                        "node {node}: {held} bytes admitted over {CAPACITY}"
                    ));
                }
            }
        }
        // A drained node leaves once the job has nothing there.
        for (node, node_state) in state.iter_mut().enumerate() {
            if *node_state == NodeState::Draining && job.left_cleanly(node) {
                *node_state = NodeState::Gone;
                let before = job.recorder().snapshot().recovery;
                job.on_node_lost(node, &format!("n{node}"));
                if job.recorder().snapshot().recovery != before {
                    return Err(format!("drained node {node} left, and work was redone"));
                }
            }
        }
        // The next event on the clock: a task's step, a driver read, a fault.
        let task_due = running.values().map(|t| t.due).min();
        let read_due = (!outbox.is_empty()).then_some(next_read.max(clock));
        let fault_due = schedule.last().map(|(at, _)| (*at).max(clock));
        let Some(now) = [task_due, read_due, fault_due].into_iter().flatten().min() else {
            return Err(format!(
                "the job is stuck: nothing runs, nothing to read; faults {faults:?}\n{}",
                job.describe()
            ));
        };
        clock = now;
        if fault_due == Some(now) {
            let (_, fault) = schedule.pop().expect("due");
            let up: Vec<usize> = (0..state.len())
                .filter(|&n| state[n] == NodeState::Up)
                .collect();
            match fault {
                Fault::Kill | Fault::Drain if up.len() < 2 => continue,
                Fault::Kill => {
                    let node = up[rng.range(0, up.len() as u64) as usize];
                    state[node] = NodeState::Gone;
                    running.retain(|_, t| t.node != node);
                    paused.retain(|_, t| t.node != node);
                    job.on_node_lost(node, &format!("n{node}"));
                }
                Fault::Join => {
                    budgets.push(new_budgets());
                    state.push(NodeState::Up);
                    job.add_node(Resources::cpu(cpus));
                }
                Fault::Drain => {
                    let node = up[rng.range(0, up.len() as u64) as usize];
                    state[node] = NodeState::Draining;
                    job.drain_node(node);
                }
            }
            faults.push(fault);
            continue;
        }
        if read_due == Some(now) {
            let (part, id) = outbox.pop_front().expect("due");
            let read = state[part.node] != NodeState::Gone;
            if read {
                rows.extend(part.start..part.start + part.len as u64);
            }
            job.on_read(id, read);
            next_read = clock + rng.range(0, 4);
            continue;
        }
        let id = *running
            .iter()
            .find(|(_, t)| t.due == now)
            .map(|(id, _)| id)
            .expect("due");
        let t = running.get_mut(&id).expect("found above");
        t.due = clock + rng.range(1, 6);
        while t.next < t.outputs.len() && !t.keep.stores(t.next as u32) {
            t.next += 1;
        }
        let all_kept = t.next > 0 && t.keep.done_after(t.next as u32 - 1);
        if cancelled.contains(&t.stage) || t.next == t.outputs.len() || all_kept {
            running.remove(&id);
            if let Some(stage) = job.on_finished(id) {
                job.record_finished(stage, Default::default(), Vec::new());
            }
            continue;
        }
        let (start, len) = t.outputs[t.next];
        let bytes = len as u64 * ROW_BYTES;
        let budget = &budgets[t.node];
        let Some(held) = Held::admit(budget, t.stage, bytes, t.may_spill, &forced) else {
            let t = running.remove(&id).expect("found above");
            if job.on_paused(id, bytes, None) {
                paused.insert(id, t);
            }
            continue;
        };
        let seq = t.next as u32;
        t.next += 1;
        let part = Rows {
            start,
            len,
            bytes,
            node: t.node,
            _held: Arc::new(held),
        };
        job.on_output(id, seq, part);
    }
    Err("the job does not end".into())
}

/// Seeds to run: `SB_SIM_SEED=S` replays one, `SB_SIM_SEEDS=N` runs N.
fn seeds() -> std::ops::Range<u64> {
    let var = |name| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    match (var("SB_SIM_SEED"), var("SB_SIM_SEEDS")) {
        (Some(seed), _) => seed..seed + 1,
        (None, n) => 0..n.unwrap_or(1_000),
    }
}

#[test]
fn chaos_every_row_once_whatever_nodes_fail_join_or_drain() {
    let (mut killed, mut remade, mut runs) = (0, 0, 0);
    for seed in seeds() {
        let run = run(seed).unwrap_or_else(|why| {
            panic!("seed {seed}: {why}\nreplay: SB_SIM_SEED={seed} cargo test -p streambatch-sched chaos")
        });
        let mut rows = run.rows;
        rows.sort_unstable();
        assert!(
            rows == run.source,
            "seed {seed}: the driver got {} rows, {} expected (lost or twice)\nreplay: SB_SIM_SEED={seed} cargo test -p streambatch-sched chaos",
            rows.len(),
            run.source.len()
        );
        let r = &run.recovery;
        assert!(
            r.remade_partitions >= r.lost_partitions,
            "seed {seed}: {r:?}: a lost partition was not made again"
        );
        killed += run.faults.iter().filter(|f| **f == Fault::Kill).count();
        remade += run.recovery.remade_partitions;
        runs += 1;
    }
    if runs >= 1_000 {
        // The seeds exercise recovery, not only clean runs.
        assert!(killed > 300, "only {killed} nodes killed over {runs} seeds");
        assert!(
            remade > 100,
            "only {remade} partitions made again over {runs} seeds"
        );
    }
}

#[test]
fn the_same_seed_replays_the_same_run() {
    for seed in [3, 17, 99] {
        let (a, b) = (run(seed).unwrap(), run(seed).unwrap());
        assert_eq!(a.rows, b.rows, "seed {seed}: outputs in the same order");
        assert_eq!(a.recovery, b.recovery);
        assert_eq!(a.faults, b.faults);
    }
}
