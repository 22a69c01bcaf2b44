//! A split of a job on real node processes (127.0.0.1), read by trainers
//! that fetch their pieces from the nodes holding them, with their own
//! certificates: by shared memory on the nodes' host, as bytes otherwise,
//! none through the driver; a node killed while trainers fetch from it
//! costs only its rows, which come again, each once.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use common::{Cluster, NodeSpec};
use streambatch::{Context, SplitOptions, TlsFiles};
use streambatch_split::{PieceSources, RemoteSplit, SplitContext, SplitHandle};

/// What a trainer got: its ids of each epoch, and where its pieces came from.
type Got = (Vec<Vec<i64>>, PieceSources);

/// Reads `epochs` epochs of `handle` on a thread of its own as a trainer
/// holding `cert`'s certificate (mapping nothing where `apart`), waiting
/// `step` after each piece and counting pieces in `pieces`.
fn trainer(
    cluster: &Cluster,
    (cert, apart): (&str, bool),
    handle: &SplitHandle,
    (epochs, step): (usize, Duration),
    pieces: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<Got> {
    let tls = TlsFiles::in_dir(&cluster.dir.path().join("tls"), cert);
    let handle = handle.clone();
    std::thread::spawn(move || {
        let split = RemoteSplit::open(&tls, &handle).unwrap();
        let split = if apart {
            split.without_shared_memory()
        } else {
            split
        };
        let mut got = vec![];
        for epoch in 0..epochs {
            let mut ids = vec![];
            for batch in split.epoch(epoch).unwrap() {
                let batch = batch.unwrap();
                ids.extend(batch.column(0).as_primitive::<Int64Type>().values());
                pieces.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(step);
            }
            got.push(ids);
        }
        (got, split.piece_sources())
    })
}

/// Joins a trainer; a hang past `within` fails the test.
fn finish(trainer: std::thread::JoinHandle<Got>, within: Duration) -> Got {
    let started = std::time::Instant::now();
    while !trainer.is_finished() {
        assert!(started.elapsed() < within, "a trainer hung");
        std::thread::sleep(Duration::from_millis(50));
    }
    trainer.join().unwrap()
}

#[test]
fn trainers_fetch_their_pieces_from_the_nodes_that_hold_them() {
    let cluster = Cluster::start(&[NodeSpec::cpu("worker-1", 2), NodeSpec::cpu("worker-2", 2)]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let options = SplitOptions {
        equal: true,
        epochs: Some(2),
        ..SplitOptions::default()
    };
    let splits = ctx
        .range(4_001, 16)
        .streaming_split_with(2, options)
        .unwrap();
    let service = ctx.serve_splits(splits).unwrap();
    let handles = service.handles();
    let read = (2, Duration::ZERO);
    let near = trainer(
        &cluster,
        ("spare-1", false),
        &handles[0],
        read,
        Arc::default(),
    );
    let apart = trainer(
        &cluster,
        ("spare-2", true),
        &handles[1],
        read,
        Arc::default(),
    );
    let (near, apart) = (
        finish(near, Duration::from_secs(120)),
        finish(apart, Duration::from_secs(120)),
    );
    for epoch in 0..2 {
        assert_eq!(near.0[epoch].len(), 2_000, "equal shares");
        assert_eq!(apart.0[epoch].len(), 2_000, "equal shares");
        let mut all = [near.0[epoch].clone(), apart.0[epoch].clone()].concat();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 4_000, "no row twice in epoch {epoch}");
    }
    assert_eq!(service.dropped_rows(), 1);
    // Every piece from the node holding it, none through the driver.
    let (near, apart) = (near.1, apart.1);
    assert!(near.node_memory > 0, "{near:?}");
    assert_eq!(
        (near.driver, near.node_bytes, near.unfetched),
        (0, 0, 0),
        "{near:?}"
    );
    assert!(apart.node_bytes > 0, "{apart:?}");
    assert_eq!(
        (apart.driver, apart.node_memory, apart.unfetched),
        (0, 0, 0),
        "{apart:?}"
    );
}

#[test]
fn a_node_killed_while_trainers_fetch_from_it_costs_only_its_rows_each_once() {
    killed_while_trainers_fetch(false);
}

#[test]
fn a_node_killed_while_trainers_fetch_equal_shares_from_it_costs_only_its_rows() {
    killed_while_trainers_fetch(true);
}

/// Kills worker-2 (SIGKILL) once the trainers got 4 pieces of a split
/// (`equal` or not): every row still reaches one trainer once.
fn killed_while_trainers_fetch(equal: bool) {
    let mut cluster = Cluster::start_configured(
        &[NodeSpec::cpu("worker-1", 2), NodeSpec::cpu("worker-2", 2)],
        "128MiB",
        "node_timeout_ms = 2000\n",
    );
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let splits = ctx.range(3_000, 30).streaming_split(2, equal).unwrap();
    let service = ctx.serve_splits(splits).unwrap();
    let handles = service.handles();
    let pieces = Arc::new(AtomicUsize::new(0));
    // Slow trainers: outputs wait on both nodes, unread, when it dies.
    let read = (1, Duration::from_millis(100));
    let near = trainer(
        &cluster,
        ("spare-1", false),
        &handles[0],
        read,
        pieces.clone(),
    );
    let apart = trainer(
        &cluster,
        ("spare-2", true),
        &handles[1],
        read,
        pieces.clone(),
    );
    while pieces.load(Ordering::Relaxed) < 4 {
        assert!(
            !near.is_finished() && !apart.is_finished(),
            "the trainers ended early"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let node = cluster.nodes.iter_mut().find(|n| n.name == "worker-2");
    node.unwrap().kill_hard();
    let (near, apart) = (
        finish(near, Duration::from_secs(180)),
        finish(apart, Duration::from_secs(180)),
    );
    if equal {
        assert_eq!(near.0[0].len(), apart.0[0].len(), "equal shares");
    }
    let mut all = [near.0[0].clone(), apart.0[0].clone()].concat();
    all.sort_unstable();
    assert_eq!(all, (0..3_000).collect::<Vec<_>>(), "every row once");
    assert_eq!(service.dropped_rows(), 0);
    // Fetches from the lost node failed, and its rows came again.
    let unfetched = near.1.unfetched + apart.1.unfetched;
    assert!(unfetched > 0, "no fetch failed: {:?} {:?}", near.1, apart.1);
}

#[test]
fn a_sorted_datasets_split_reaches_one_rank_in_order() {
    // A sort's outputs come one at a time, each once the last is read: the
    // driver reads them as they come, and sends them itself.
    let cluster = Cluster::start(&[NodeSpec::cpu("worker-1", 2), NodeSpec::cpu("worker-2", 2)]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let sorted = ctx.range(3_000, 6).sort(&["id"], true);
    let service = ctx
        .serve_splits(sorted.streaming_split(1, false).unwrap())
        .unwrap();
    let handle = &service.handles()[0];
    let read = (1, Duration::ZERO);
    let got = finish(
        trainer(&cluster, ("spare-1", false), handle, read, Arc::default()),
        Duration::from_secs(120),
    );
    assert_eq!(got.0[0], (0..3_000).rev().collect::<Vec<i64>>(), "in order");
    assert!(
        got.1.driver > 0 && got.1.node_memory + got.1.node_bytes == 0,
        "{:?}",
        got.1
    );
}
