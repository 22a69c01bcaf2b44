//! The fault simulation ([`crate::sim`]) over many seeds: each must end
//! with every source row delivered exactly once, no task started on a lost
//! node's partitions, each node's admitted outputs within its store, and
//! nothing redone for a node that drained.
//!
//! `cargo test -p streambatch-sched chaos` runs 1,000 seeds; `SB_SIM_SEEDS=N`
//! runs N, and `SB_SIM_SEED=S` replays seed S alone (a failing seed is
//! printed with that command).

use crate::sim::{Fault, Scenario, run};

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
    let (mut drained, mut moved) = (0, 0);
    for seed in seeds() {
        let replay = format!("replay: SB_SIM_SEED={seed} cargo test -p streambatch-sched chaos");
        let scenario = Scenario::seeded(seed);
        let run = run(&scenario)
            .unwrap_or_else(|why| panic!("seed {seed}: {why}\n{scenario:?}\n{replay}"));
        if let Err(why) = run.check_exactly_once().and(run.check_in_order()) {
            panic!("seed {seed}: {why}\n{scenario:?}\n{replay}");
        }
        let r = &run.recovery;
        // (Behind a limit, a lost partition the cancelled stages no longer
        // need is not made again.)
        assert!(
            run.limit.is_some() || r.remade_partitions >= r.lost_partitions,
            "seed {seed}: {r:?}: a lost partition was not made again\n{replay}"
        );
        killed += run.faults.iter().filter(|f| **f == Fault::Kill).count();
        remade += run.recovery.remade_partitions;
        drained += run.drained_left;
        moved += run.moved;
        runs += 1;
    }
    eprintln!(
        "{runs} seeds: {killed} nodes killed, {remade} partitions made again, {drained} drained nodes left, {moved} outputs moved off them"
    );
    if runs >= 1_000 {
        // The seeds exercise recovery, not only clean runs.
        assert!(killed > 300, "only {killed} nodes killed over {runs} seeds");
        assert!(
            remade > 100,
            "only {remade} partitions made again over {runs} seeds"
        );
        assert!(drained > 50, "only {drained} drained nodes left");
        assert!(moved > 50, "only {moved} outputs moved off drained nodes");
    }
}

/// A sort four times the stores' size, its outputs kept by the driver as
/// it reads them (a `collect`): the kept outputs hold memory no wait frees,
/// so the job lets tasks spill rather than wait for them.
#[test]
fn a_sort_larger_than_the_stores_ends_while_the_driver_keeps_its_outputs() {
    let scenario = Scenario {
        nodes: 2,
        cpus: 2.0,
        split_rows: vec![12; 30],
        pipeline: crate::sim::Pipeline::Exchange {
            n: 6,
            ordered: true,
        },
        faults: Vec::new(),
        driver_keeps: true,
        ..Scenario::seeded(0)
    };
    let run = run(&scenario).expect("the job ends");
    run.check_exactly_once().and(run.check_in_order()).unwrap();
}

#[test]
fn the_same_seed_replays_the_same_run() {
    for seed in [3, 17, 99] {
        let scenario = Scenario::seeded(seed);
        let (a, b) = (run(&scenario).unwrap(), run(&scenario).unwrap());
        assert_eq!(a.rows, b.rows, "seed {seed}: outputs in the same order");
        assert_eq!(a.recovery, b.recovery);
        assert_eq!(a.faults, b.faults);
    }
}

/// The benchmark's scenario, smaller: every fault happens mid-job, and
/// every row still arrives once.
#[test]
fn a_wide_job_with_tasks_that_take_no_time_survives_its_faults() {
    let run = run(&Scenario::wide(100, 5_000)).expect("the job ends");
    run.check_exactly_once().expect("every row once");
    assert_eq!(
        run.faults,
        [Fault::Kill, Fault::Join, Fault::Drain, Fault::Kill]
    );
    let r = &run.recovery;
    assert_eq!(r.nodes_lost.len(), 2, "{r:?}: the drained node is not lost");
    assert_eq!(run.drained_left, 1, "the drained node left mid-job");
    assert!(r.remade_partitions > 0, "{r:?}");
    assert!(run.tasks > 10_000, "{} tasks", run.tasks);
}
