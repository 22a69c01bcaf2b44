//! Property tests of the job state machine, with no actor, thread or store:
//! simulated nodes (one to three) run what [`JobState`] decides, in an
//! order proptest picks (outputs, pauses for memory, finishes and lost
//! workers interleaved), each with the real [`Budgets`] as its memory.
//! Whatever the order, every source row reaches the driver exactly once, a
//! limit lets exactly its rows through, a repartition keeps every row, and
//! the outputs admitted on each node never exceed its store's capacity.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use streambatch_core::{Resources, TaskId};
use streambatch_plan::{JobStats, KeySample};

use crate::exec::budget::Budgets;
use crate::job::record::Recorder;
use crate::job::{Action, FailurePolicy, JobState, Keep, RunInput, ShapeKind, StageShape, Start};
use crate::sim::Pipeline;
use crate::sim::parts::{
    CAPACITY, Held, RESERVE, ROW_BYTES, Rows, SimMemory, node_budgets, split_outputs,
};

/// A task the simulated node runs: the rows of each output it will yield.
struct SimTask {
    stage: usize,
    node: usize,
    outputs: Vec<(u64, usize)>,
    next: usize,
    keep: Keep,
    may_spill: bool,
}

fn shapes(pipeline: Pipeline, splits: usize, pooled: bool) -> Vec<StageShape> {
    let mut out = pipeline.shapes(splits);
    if pooled {
        out[1].max_running = Some(1);
    }
    out
}

/// What a simulated job delivered.
struct Outcome {
    rows: Vec<u64>,
    stats: JobStats,
    lost: u64,
}

/// Runs a job over splits of `split_rows` rows each on `nodes` nodes of
/// `cpus` slots, each of which may queue `queue` tasks beyond them (every
/// task is short), taking the next event from `choices` (then always the
/// first task's next step). A queued task runs at once, as if a slot had
/// freed: what matters here is that the job's counts come out right.
fn simulate(
    pipeline: Pipeline,
    split_rows: &[usize],
    (nodes, cpus, queue): (usize, f64, usize),
    pooled: bool,
    choices: &[u16],
) -> Result<Outcome, TestCaseError> {
    let shapes = shapes(pipeline, split_rows.len(), pooled);
    let names = shapes.iter().map(|s| s.name.clone()).collect();
    let live = Arc::new(Mutex::new(JobStats::default()));
    let recorder = Recorder::new(live, names, CAPACITY);
    let reserves: Vec<u64> = shapes
        .iter()
        .map(|s| match s.kind {
            ShapeKind::Source { .. } | ShapeKind::Map => RESERVE,
            _ => 0,
        })
        .collect();
    let budgets: Vec<Budgets> = node_budgets(nodes, CAPACITY, &reserves);
    let forced = Arc::new(AtomicUsize::new(0));
    let free = vec![Resources::cpu(cpus); nodes];
    let mut job = JobState::<Rows>::new(
        shapes,
        free,
        FailurePolicy {
            max_task_retries: 3,
            ..Default::default()
        },
        recorder,
    );
    for node in 0..nodes {
        job = job.queueing(node, queue);
    }
    let bases: Vec<u64> = split_rows
        .iter()
        .scan(0u64, |next, &n| {
            let base = *next;
            *next += n as u64 + 1_000;
            Some(base)
        })
        .collect();

    let mut running: BTreeMap<TaskId, SimTask> = BTreeMap::new();
    let mut paused: HashMap<TaskId, SimTask> = HashMap::new();
    let mut cancelled: HashSet<usize> = HashSet::new();
    let mut attempts: HashMap<TaskId, u32> = HashMap::new();
    let (mut rows, mut lost, mut step) = (Vec::new(), 0u64, 0usize);
    let mut ended = None;
    while ended.is_none() {
        for action in job.advance(&SimMemory(&budgets)) {
            match action {
                Action::Start(start) => {
                    let outputs = match start.input {
                        RunInput::Split(i) => split_outputs(bases[i], split_rows[i]),
                        RunInput::Parts(parts, _) => {
                            parts.iter().map(|p| (p.start, p.len)).collect()
                        }
                    };
                    let task = SimTask {
                        stage: start.stage,
                        node: start.node,
                        outputs,
                        next: 0,
                        keep: start.keep,
                        may_spill: start.may_spill,
                    };
                    running.insert(start.task, task);
                }
                Action::Resume {
                    task,
                    node,
                    may_spill,
                } => {
                    let mut t = paused.remove(&task).expect("only a paused task resumes");
                    prop_assert_eq!(t.node, node, "a task resumes where it paused");
                    t.may_spill = may_spill;
                    running.insert(task, t);
                }
                Action::Emit { part, .. } => rows.extend(part.start..part.start + part.len as u64),
                Action::Cancel { stage } => {
                    cancelled.insert(stage);
                    paused.retain(|_, t| t.stage != stage);
                }
                Action::FitReserve { stage, bytes } => {
                    budgets.iter().for_each(|b| b.fit_reserve(stage, bytes))
                }
                Action::End(result) => ended = Some(result),
                Action::Drained => {}
                Action::Move { .. } => panic!("no node drains here"),
            }
        }
        if ended.is_some() {
            break;
        }
        if forced.load(Ordering::SeqCst) == 0 {
            for (node, b) in budgets.iter().enumerate() {
                let held: u64 = (0..job_stages(pipeline)).map(|s| b.used(s)).sum();
                prop_assert!(
                    held <= CAPACITY,
                    "node {node}: {held} bytes admitted over {CAPACITY}"
                );
            }
        }
        prop_assert!(!running.is_empty(), "the job is stuck: nothing runs");
        step += 1;
        prop_assert!(step < 100_000, "the job does not end");
        let choice = choices.get(step).copied().unwrap_or(1) as usize;
        let ids: Vec<TaskId> = running.keys().copied().collect();
        let id = ids[choice % ids.len()];
        let tries = attempts.entry(id).or_default();
        if (choice / ids.len()).is_multiple_of(8) && *tries < 2 {
            *tries += 1;
            lost += 1;
            running.remove(&id);
            job.on_lost(id, "injected".into());
            continue;
        }
        let t = running.get_mut(&id).expect("picked from running");
        while t.next < t.outputs.len() && !t.keep.stores(t.next as u32) {
            t.next += 1;
        }
        if cancelled.contains(&t.stage) || t.next == t.outputs.len() {
            running.remove(&id);
            if let Some(stage) = job.on_finished(id) {
                job.record_finished(stage, Duration::from_micros(20), Vec::new());
            }
            continue;
        }
        let (start, len) = t.outputs[t.next];
        let bytes = len as u64 * ROW_BYTES;
        let node = t.node;
        let budget = &budgets[node];
        let Some(held) = Held::admit(budget, t.stage, bytes, t.may_spill, &forced) else {
            let t = running.remove(&id).expect("picked from running");
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
            node,
            _held: Arc::new(held),
            groups: None,
            sample: None,
            cut_at_holder: false,
        };
        job.on_output(id, seq, part);
    }
    prop_assert!(
        matches!(ended, Some(Ok(()))),
        "the job failed: {:?}",
        ended.and_then(|r| r.err())
    );
    Ok(Outcome {
        rows,
        stats: job.recorder().snapshot(),
        lost,
    })
}

fn job_stages(pipeline: Pipeline) -> usize {
    match pipeline {
        Pipeline::Maps(n) => 1 + n,
        Pipeline::Limit(_) | Pipeline::Repartition(_) | Pipeline::Exchange { .. } => 4,
    }
}

fn source_rows(split_rows: &[usize]) -> Vec<u64> {
    let mut next = 0u64;
    let mut all = Vec::new();
    for &n in split_rows {
        all.extend(next..next + n as u64);
        next += n as u64 + 1_000;
    }
    all
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_source_row_reaches_the_driver_once_under_retries(
        split_rows in prop::collection::vec(0usize..12, 1..8),
        maps in 1usize..4,
        nodes in 1usize..4,
        cpus in 1u32..4,
        queue in 0usize..4,
        pooled in any::<bool>(),
        choices in prop::collection::vec(any::<u16>(), 0..400),
    ) {
        let out = simulate(Pipeline::Maps(maps), &split_rows, (nodes, cpus as f64, queue), pooled, &choices)?;
        prop_assert_eq!(sorted(out.rows), source_rows(&split_rows));
        let retries: u64 = out.stats.operators.iter().map(|o| o.retries).sum();
        prop_assert_eq!(retries, out.lost, "every lost task is retried and counted");
    }

    #[test]
    fn a_limit_lets_exactly_its_rows_through(
        split_rows in prop::collection::vec(0usize..12, 1..8),
        n in 0usize..60,
        nodes in 1usize..4,
        cpus in 1u32..4,
        queue in 0usize..4,
        choices in prop::collection::vec(any::<u16>(), 0..400),
    ) {
        let out = simulate(Pipeline::Limit(n), &split_rows, (nodes, cpus as f64, queue), false, &choices)?;
        let all = source_rows(&split_rows);
        let got = sorted(out.rows);
        prop_assert_eq!(got.len(), n.min(all.len()));
        prop_assert!(got.windows(2).all(|w| w[0] < w[1]), "no row twice");
        prop_assert!(got.iter().all(|r| all.binary_search(r).is_ok()), "only source rows");
    }

    #[test]
    fn a_repartition_keeps_every_row(
        split_rows in prop::collection::vec(0usize..12, 1..8),
        n in 1usize..6,
        nodes in 1usize..4,
        cpus in 1u32..4,
        choices in prop::collection::vec(any::<u16>(), 0..400),
    ) {
        let out = simulate(Pipeline::Repartition(n), &split_rows, (nodes, cpus as f64, 0), false, &choices)?;
        prop_assert_eq!(sorted(out.rows), source_rows(&split_rows));
        let total = split_rows.iter().sum::<usize>();
        let concat_tasks = out.stats.operators[3].tasks as usize;
        prop_assert_eq!(concat_tasks, n.min(total), "one task per non-empty group");
    }
}

/// A source whose splits hold large inputs outside the store (binary files
/// read whole): two large ones never run on a node at once, a small one
/// runs beside a large one, and a large one runs once the other ended.
#[test]
fn tasks_holding_large_inputs_take_turns() {
    let mut shapes = Pipeline::Maps(0).shapes(4);
    // Beside the largest hold, the others may take half the capacity.
    let large = CAPACITY / 2 + 1;
    shapes[0].held_bytes = vec![large, 1, large, 1];
    let names = shapes.iter().map(|s| s.name.clone()).collect();
    let recorder = Recorder::new(Arc::new(Mutex::new(JobStats::default())), names, CAPACITY);
    let budgets = node_budgets(1, CAPACITY, &[RESERVE]);
    let mut job = JobState::<Rows>::new(
        shapes,
        vec![Resources::cpu(4.0)],
        FailurePolicy::default(),
        recorder,
    );
    let started = |actions: Vec<Action<Rows>>| -> Vec<(TaskId, usize)> {
        actions
            .into_iter()
            .filter_map(|a| match a {
                Action::Start(Start {
                    task,
                    input: RunInput::Split(i),
                    ..
                }) => Some((task, i)),
                _ => None,
            })
            .collect()
    };
    let first = started(job.advance(&SimMemory(&budgets)));
    let splits: Vec<usize> = first.iter().map(|&(_, i)| i).collect();
    assert_eq!(splits, vec![0, 1], "split 2 waits for split 0's hold");
    // Split 1 (small) ends: split 2 still waits.
    job.on_finished(first[1].0);
    assert!(started(job.advance(&SimMemory(&budgets))).is_empty());
    // Split 0 ends: split 2 starts, and split 3 (small) beside it.
    job.on_finished(first[0].0);
    let next: Vec<usize> = started(job.advance(&SimMemory(&budgets)))
        .iter()
        .map(|&(_, i)| i)
        .collect();
    assert_eq!(next, vec![2, 3]);
}

/// A job of a source, a map, an exchange to `n` reducers and the reducers
/// (holding up to `cap` of their input) on one node of four CPU slots,
/// with that node's budgets and a count of outputs forced past them.
fn exchange_on_one_node(n: usize, cap: u64) -> (JobState<Rows>, Vec<Budgets>, Arc<AtomicUsize>) {
    let mut shapes = Pipeline::Exchange { n, ordered: false }.shapes(1);
    shapes[3].input_held_cap = cap;
    let names = shapes.iter().map(|s| s.name.clone()).collect();
    let recorder = Recorder::new(Arc::new(Mutex::new(JobStats::default())), names, CAPACITY);
    let budgets = node_budgets(1, CAPACITY, &[RESERVE, RESERVE, 0, RESERVE]);
    let job = JobState::new(
        shapes,
        vec![Resources::cpu(4.0)],
        FailurePolicy::default(),
        recorder,
    );
    (job, budgets, Arc::new(AtomicUsize::new(0)))
}

/// A sort's or join's reducers hold their input outside the store (up to
/// their stage's cap): three reducers whose holds do not fit beside each
/// other take turns on a node with slots for all, where reducers that
/// stream their input start at once; every reducer runs in the end.
#[test]
fn reducers_holding_large_inputs_take_turns() {
    for (cap, at_once) in [(0, 3), (CAPACITY / 2 + 1, 1)] {
        let (mut job, budgets, forced) = exchange_on_one_node(3, cap);
        // One row to each reducer, in a map output whose partition says it
        // is large (its budget takes a few bytes): a third of it each,
        // more than half the cap.
        let output = |groups: Option<Arc<[u32]>>| Rows {
            start: 0,
            len: 3,
            bytes: 6_300,
            node: 0,
            _held: Arc::new(Held::admit(&budgets[0], 1, 3, true, &forced).unwrap()),
            groups,
            sample: None,
            cut_at_holder: false,
        };
        let starts = |actions: Vec<Action<Rows>>| -> Vec<(TaskId, usize)> {
            actions
                .into_iter()
                .filter_map(|a| match a {
                    Action::Start(start) => Some((start.task, start.stage)),
                    _ => None,
                })
                .collect()
        };
        let source = starts(job.advance(&SimMemory(&budgets)));
        assert_eq!(source.len(), 1);
        job.on_output(source[0].0, 0, output(None));
        job.on_finished(source[0].0);
        let map = starts(job.advance(&SimMemory(&budgets)));
        assert_eq!(map, vec![(map[0].0, 1)]);
        job.on_output(map[0].0, 0, output(Some(vec![0, 1, 2, 3].into())));
        job.on_finished(map[0].0);
        let mut ran = 0;
        let mut started = starts(job.advance(&SimMemory(&budgets)));
        assert_eq!(started.len(), at_once, "cap {cap}: {started:?}");
        while let Some((task, stage)) = started.pop() {
            assert_eq!(stage, 3);
            ran += 1;
            job.on_finished(task);
            started.extend(starts(job.advance(&SimMemory(&budgets))));
            assert!(started.len() <= at_once, "cap {cap}: {started:?}");
        }
        assert_eq!(ran, 3, "cap {cap}");
    }
}

/// An exchange of M map outputs to N reducers: the job keeps each output
/// once (without its cut, which its holder keeps) and each reducer as its
/// place, not a slice of every output for every reducer (M x N); a
/// started reducer is handed its rows of every output, and once every
/// reducer has finished no output is held.
#[test]
fn an_exchange_keeps_each_map_output_once_whatever_its_reducers() {
    let (m, n) = (60, 50);
    let (mut job, budgets, forced) = exchange_on_one_node(n, 0);
    let held = Arc::new(Held::admit(&budgets[0], 1, 1, true, &forced).unwrap());
    // A map output of one row per destination.
    let output = |groups: Option<Arc<[u32]>>| Rows {
        start: 0,
        len: n,
        bytes: 10,
        node: 0,
        _held: held.clone(),
        groups,
        sample: None,
        cut_at_holder: false,
    };
    let starts = |actions: Vec<Action<Rows>>| -> Vec<(TaskId, usize, RunInput<Rows>)> {
        actions
            .into_iter()
            .filter_map(|a| match a {
                Action::Start(start) => Some((start.task, start.stage, start.input)),
                _ => None,
            })
            .collect()
    };
    let source = starts(job.advance(&SimMemory(&budgets)));
    job.on_output(source[0].0, 0, output(None));
    job.on_finished(source[0].0);
    let map = {
        let started = starts(job.advance(&SimMemory(&budgets)));
        assert_eq!(started.len(), 1);
        started[0].0 // its input, the source's output, let go
    };
    let cut: Arc<[u32]> = (0..=n as u32).collect();
    for seq in 0..m as u32 {
        job.on_output(map, seq, output(Some(cut.clone())));
        assert_eq!(job.cut_numbers_kept(), 0, "the holder keeps the cut");
    }
    job.on_finished(map);
    let mut started = starts(job.advance(&SimMemory(&budgets)));
    assert_eq!(job.cut_numbers_kept(), 0);
    let kept = job.pieces_kept();
    // The outputs, and the four reducers started: their rows while placed.
    assert_eq!(kept, m + started.len() * m, "for {m} outputs");
    assert!(!started.is_empty());
    let mut ran = 0;
    while let Some((task, stage, input)) = started.pop() {
        assert_eq!(stage, 3);
        let RunInput::Parts(parts, None) = input else {
            panic!("a reducer is handed parts");
        };
        assert_eq!(parts.len(), m, "one row of every output");
        assert!(parts.iter().all(|p| p.len == 1));
        ran += 1;
        job.on_finished(task);
        started.extend(starts(job.advance(&SimMemory(&budgets))));
    }
    assert_eq!(ran, n);
    assert_eq!(Arc::strong_count(&held), 1, "no output is held any more");
}

/// A map output's cut, and a sort's output's keys' sample.
type Cut = (Vec<u32>, Option<[u8; 3]>);

/// A map output lost after its reducers got their rows (a sort's ranges,
/// a hash exchange's destinations), made again with other keys or
/// destinations (an operator that is not deterministic): the job ends
/// with an error naming the stage, not with rows lost or twice.
#[test]
fn an_exchange_output_made_again_cut_otherwise_ends_the_job() {
    // Two rows, one to each reducer; made again, both to the first.
    let sort: [Cut; 2] = [
        (vec![0, 1, 2], Some([1, 5, 5])),
        (vec![0, 1, 2], Some([1, 7, 7])),
    ];
    let hash: [Cut; 2] = [(vec![0, 1, 2], None), (vec![0, 2, 2], None)];
    for (ordered, [first, remade]) in [(true, sort), (false, hash)] {
        made_again_cut_otherwise(ordered, first, remade);
    }
}

fn made_again_cut_otherwise(ordered: bool, first: Cut, remade: Cut) {
    let shapes = Pipeline::Exchange { n: 2, ordered }.shapes(1);
    let names: Vec<String> = shapes.iter().map(|s| s.name.clone()).collect();
    let map_name = names[1].clone();
    let recorder = Recorder::new(Arc::new(Mutex::new(JobStats::default())), names, CAPACITY);
    let budgets = node_budgets(2, CAPACITY, &[RESERVE, RESERVE, 0, RESERVE]);
    let forced = Arc::new(AtomicUsize::new(0));
    let mut job = JobState::<Rows>::new(
        shapes,
        vec![Resources::cpu(3.0), Resources::cpu(3.0)],
        FailurePolicy {
            max_task_retries: 3,
            ..Default::default()
        },
        recorder,
    )
    .with_lineage();
    let sample = |keys: Option<[u8; 3]>| {
        let sample = KeySample::from_parts(keys?.to_vec(), vec![1, 2, 3]).unwrap();
        Some(Arc::new(sample))
    };
    let output = |node, groups: Option<Arc<[u32]>>, sample| Rows {
        start: 0,
        len: 2,
        bytes: 200,
        node,
        _held: Arc::new(Held::admit(&budgets[node], 1, 200, true, &forced).unwrap()),
        groups,
        sample,
        cut_at_holder: false,
    };
    let starts = |actions: Vec<Action<Rows>>| -> Vec<(TaskId, usize)> {
        actions
            .into_iter()
            .filter_map(|a| match a {
                Action::Start(start) => Some((start.task, start.stage, start.node)),
                _ => None,
            })
            .map(|(task, stage, _)| (task, stage))
            .collect()
    };
    let source = starts(job.advance(&SimMemory(&budgets)));
    job.on_output(source[0].0, 0, output(0, None, None));
    job.on_finished(source[0].0);
    let map = starts(job.advance(&SimMemory(&budgets)));
    assert_eq!(map.len(), 1);
    // A sort's two chunks of one row, keys 1 and 5, the last key 5: two
    // ranges.
    job.on_output(
        map[0].0,
        0,
        output(1, Some(first.0.into()), sample(first.1)),
    );
    job.on_finished(map[0].0);
    let reducers = starts(job.advance(&SimMemory(&budgets)));
    assert!(
        reducers.iter().all(|&(_, stage)| stage == 3),
        "{reducers:?}"
    );
    assert_eq!(reducers.len(), 2);
    // Node 1 goes with the map output; its task runs again, on node 0.
    job.on_node_lost(1, "node-1");
    // Its input, freed once read, is made again first.
    let again = starts(job.advance(&SimMemory(&budgets)));
    assert_eq!(again, [source[0]]);
    job.on_output(source[0].0, 0, output(0, None, None));
    job.on_finished(source[0].0);
    let again = starts(job.advance(&SimMemory(&budgets)));
    assert_eq!(again, [map[0]]);
    job.on_output(
        map[0].0,
        0,
        output(0, Some(remade.0.into()), sample(remade.1)),
    );
    let ended = job
        .advance(&SimMemory(&budgets))
        .into_iter()
        .find_map(|a| match a {
            Action::End(result) => Some(result),
            _ => None,
        });
    let err = ended.expect("the job ended").unwrap_err().to_string();
    assert!(err.contains("other destinations or keys"), "{err}");
    assert!(err.contains(&map_name), "{err}");
}

/// A large split retried after its node is lost waits while another large
/// split runs on the node left, and starts once that one ended.
#[test]
fn a_retried_large_split_waits_for_the_other_large_one() {
    let mut shapes = Pipeline::Maps(0).shapes(3);
    let large = CAPACITY / 2 + 1;
    shapes[0].held_bytes = vec![large, large, 1];
    let names = shapes.iter().map(|s| s.name.clone()).collect();
    let recorder = Recorder::new(Arc::new(Mutex::new(JobStats::default())), names, CAPACITY);
    let budgets = node_budgets(2, CAPACITY, &[RESERVE]);
    let mut job = JobState::<Rows>::new(
        shapes,
        vec![Resources::cpu(2.0), Resources::cpu(1.0)],
        FailurePolicy {
            max_task_retries: 3,
            ..Default::default()
        },
        recorder,
    )
    .with_lineage();
    let started = |actions: Vec<Action<Rows>>| -> Vec<(TaskId, usize, usize)> {
        actions
            .into_iter()
            .filter_map(|a| match a {
                Action::Start(Start {
                    task,
                    node,
                    input: RunInput::Split(i),
                    ..
                }) => Some((task, node, i)),
                _ => None,
            })
            .collect()
    };
    let mut first = started(job.advance(&SimMemory(&budgets)));
    first.sort_by_key(|&(_, _, split)| split);
    let node_of = |split: usize| first.iter().find(|&&(_, _, i)| i == split).unwrap().1;
    // One large split per node, the small one beside the first.
    assert_eq!(first.len(), 3, "{first:?}");
    assert_ne!(node_of(0), node_of(1));
    let (stays, lost) = (node_of(0), node_of(1));
    assert_eq!(node_of(2), stays);
    job.on_finished(first[2].0);
    job.on_node_lost(lost, "worker-lost");
    // Split 1 is retried on the node left, where split 0 still runs: it waits.
    let retried = started(job.advance(&SimMemory(&budgets)));
    assert!(retried.is_empty(), "{retried:?}");
    job.on_finished(first[0].0);
    let retried = started(job.advance(&SimMemory(&budgets)));
    let placed: Vec<(usize, usize)> = retried.iter().map(|&(_, n, i)| (n, i)).collect();
    assert_eq!(placed, vec![(stays, 1)]);
}

/// A node with queue room is handed tasks beyond its free slots once a
/// stage's tasks are known to be short, as many as the room and no more;
/// a stage of long tasks, or one not yet timed, gets its slots only. A
/// queued task that ends gives back its place in the queue, not a slot.
#[test]
fn short_tasks_queue_beyond_the_slots_long_ones_do_not() {
    for (busy, queued) in [
        (Duration::from_micros(30), 3),
        (Duration::from_millis(30), 0),
    ] {
        let shapes = Pipeline::Maps(0).shapes(40);
        let names = shapes.iter().map(|s| s.name.clone()).collect();
        let recorder = Recorder::new(Arc::new(Mutex::new(JobStats::default())), names, CAPACITY);
        let budgets = node_budgets(1, CAPACITY, &[RESERVE]);
        let mut job = JobState::<Rows>::new(
            shapes,
            vec![Resources::cpu(2.0)],
            FailurePolicy::default(),
            recorder,
        )
        .queueing(0, 3);
        let started = |actions: Vec<Action<Rows>>| -> Vec<TaskId> {
            actions
                .into_iter()
                .filter_map(|a| match a {
                    Action::Start(start) => Some(start.task),
                    _ => None,
                })
                .collect()
        };
        let memory = SimMemory(&budgets);
        let mut running = started(job.advance(&memory));
        assert_eq!(running.len(), 2, "not timed yet: its slots only");
        let finish = |job: &mut JobState<Rows>, task: TaskId| {
            let forced = Arc::new(AtomicUsize::new(0));
            let held = Held::admit(&budgets[0], 0, ROW_BYTES, false, &forced).unwrap();
            let part = Rows {
                start: task.0 * 10,
                len: 1,
                bytes: ROW_BYTES,
                node: 0,
                _held: Arc::new(held),
                groups: None,
                sample: None,
                cut_at_holder: false,
            };
            job.on_output(task, 0, part);
            let stage = job.on_finished(task).unwrap();
            job.record_finished(stage, busy, Vec::new());
        };
        for _ in 0..3 {
            let task = running.remove(0);
            finish(&mut job, task);
            running.extend(started(job.advance(&memory)));
            assert_eq!(running.len(), 2 + queued, "{busy:?}");
        }
        assert_eq!(job.recorder().snapshot().peak_running[0], 2);
    }
}
