//! The exchange on real node processes (127.0.0.1): map outputs cut on
//! one node are read by reducers on others (a shuffle, a groupby), and a node killed
//! mid-exchange costs only its map outputs, made again from lineage.

mod common;

use arrow_array::RecordBatch;
use common::{Cluster, NodeSpec};
use streambatch::{Agg, Context, Dataset, JoinHow, Resources};
use streambatch_bench::registry;

const ROWS: u64 = 96;
const SPLITS: usize = 24;

/// 96 rows of 16 KiB made by `w1.produce` (`ms` per call of 5 rows, 1 CPU),
/// shuffled.
fn shuffled(ctx: &Context, ms: u64) -> Dataset {
    let params = [ms.to_le_bytes(), (16u64 << 10).to_le_bytes()].concat();
    ctx.range(ROWS, SPLITS)
        .map_batches(
            registry().udf("w1.produce", &params).unwrap(),
            Resources::cpu(1.0).batch_rows(5),
        )
        .named("produce")
        .random_shuffle(11)
}

/// Each output partition's ids, the partitions sorted (they reach the
/// driver in the order their reducers finish).
fn partitions(out: &[RecordBatch]) -> Vec<Vec<i64>> {
    let mut parts: Vec<Vec<i64>> = out
        .iter()
        .map(|b| {
            let ids = b.column(0).as_any();
            let ids = ids.downcast_ref::<arrow_array::Int64Array>().unwrap();
            ids.values().to_vec()
        })
        .filter(|p| !p.is_empty())
        .collect();
    parts.sort();
    parts
}

fn single_node() -> Vec<Vec<i64>> {
    let local = Context::with_config(streambatch::NodeConfig {
        cpus: 2.0,
        gpus: Some(0.0),
        store_capacity: 256 << 20,
        ..Default::default()
    })
    .unwrap();
    let out = partitions(&shuffled(&local, 0).collect().unwrap());
    let mut ids: Vec<i64> = out.iter().flatten().copied().collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..ROWS as i64).collect::<Vec<_>>());
    out
}

/// The ids of the 96 produced rows joined with ids 0..48 (inner, left
/// and anti) and 0..120 (right and full: the ids no produced row has come
/// from the right), and of their union with ids 0..48, each sorted.
fn join_and_union(ctx: &Context) -> Vec<Vec<i64>> {
    let params = [0u64.to_le_bytes(), (1u64 << 10).to_le_bytes()].concat();
    let produced = ctx
        .range(ROWS, SPLITS)
        .map_batches(
            registry().udf("w1.produce", &params).unwrap(),
            Resources::cpu(1.0).batch_rows(5),
        )
        .named("produce");
    let first_half = ctx.range(ROWS / 2, 4);
    // Ids 0..120: 24 that no produced row has.
    let wider = ctx.range(ROWS + 24, 4);
    let ids = |ds: Dataset| {
        let mut ids: Vec<i64> = ds
            .collect()
            .unwrap()
            .iter()
            .flat_map(|b| {
                let c = b.column_by_name("id").unwrap().as_any();
                let c = c.downcast_ref::<arrow_array::Int64Array>().unwrap();
                c.iter().map(|id| id.expect("an id")).collect::<Vec<_>>()
            })
            .collect();
        ids.sort_unstable();
        ids
    };
    let join = |how| produced.join(&first_half, &["id"], how).unwrap();
    let join_wider = |how| produced.join(&wider, &["id"], how).unwrap();
    // The right input is small: broadcast (its rows travel in the plan),
    // but for right and full joins.
    let explain = |how| join(how).explain().unwrap().to_string();
    assert!(explain(JoinHow::Inner).contains("produce->join[inner, broadcast]"));
    assert!(
        join_wider(JoinHow::Full)
            .explain()
            .unwrap()
            .to_string()
            .contains("exchange(")
    );
    vec![
        ids(join(JoinHow::Inner)),
        ids(join(JoinHow::Left)),
        ids(join(JoinHow::Anti)),
        ids(join_wider(JoinHow::Right)),
        ids(join_wider(JoinHow::Full)),
        ids(produced.union(&[&first_half]).unwrap()),
    ]
}

#[test]
fn a_shuffle_on_two_nodes_gives_the_single_node_output() {
    let expected = single_node();
    let cluster = Cluster::start(&[NodeSpec::cpu("worker-1", 2), NodeSpec::cpu("worker-2", 2)]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let ds = shuffled(&ctx, 0);
    assert_eq!(partitions(&ds.collect().unwrap()), expected);
    // A groupby's partial states cross nodes as its rows do.
    let grouped = shuffled(&ctx, 0)
        .groupby(&[])
        .aggregate(&[Agg::count(), Agg::sum("id"), Agg::min("id"), Agg::max("id")])
        .collect()
        .unwrap();
    let row: Vec<i64> = grouped
        .iter()
        .filter(|b| b.num_rows() > 0)
        .flat_map(|b| {
            (0..4).map(move |c| {
                let c = b.column(c).as_any();
                c.downcast_ref::<arrow_array::Int64Array>()
                    .unwrap()
                    .value(0)
            })
        })
        .collect();
    let n = ROWS as i64;
    assert_eq!(row, [n, n * (n - 1) / 2, 0, n - 1]);
    // A groupby by a key: partial states cut by its hash across nodes.
    let per_id = shuffled(&ctx, 0)
        .groupby(&["id"])
        .aggregate(&[Agg::count()])
        .collect()
        .unwrap();
    let mut ids: Vec<i64> = Vec::new();
    for b in &per_id {
        let column = |i: usize| {
            let c = b.column(i).as_any();
            c.downcast_ref::<arrow_array::Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        };
        assert!(column(1).iter().all(|&c| c == 1), "a row counted twice");
        ids.extend(column(0));
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..n).collect::<Vec<_>>());
    // A sort, its ranges taken from its map outputs' samples on the nodes:
    // the order of the single-node run.
    let sorted: Vec<i64> = shuffled(&ctx, 0)
        .sort(&["id"], true)
        .collect()
        .unwrap()
        .iter()
        .flat_map(|b| {
            let ids = b.column(0).as_any();
            ids.downcast_ref::<arrow_array::Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        })
        .collect();
    assert_eq!(sorted, (0..n).rev().collect::<Vec<_>>());
    // A join and a union read their two inputs on both nodes.
    let local = Context::with_config(streambatch::NodeConfig {
        cpus: 2.0,
        gpus: Some(0.0),
        ..Default::default()
    })
    .unwrap();
    let got = join_and_union(&ctx);
    assert_eq!(got, join_and_union(&local));
    let mut union: Vec<i64> = (0..n).chain(0..n / 2).collect();
    union.sort_unstable();
    let expected = [
        (0..n / 2).collect(),
        (0..n).collect(),
        (n / 2..n).collect(),
        (0..n + 24).collect(),
        (0..n + 24).collect(),
        union,
    ];
    assert_eq!(got, expected);
    let stats = ds.stats().unwrap();
    for node in ["worker-1", "worker-2"] {
        let n = stats.nodes.iter().find(|n| n.name == node).unwrap();
        assert!(n.tasks > 0, "{node} ran no task: {stats}");
    }
}

/// A reducer names its destination of each map output, and the output's
/// holder finds its rows by the cut its store keeps: a peer sharing the
/// holder's store maps them (the holder names the rows), others get them
/// over QUIC; the output is the single-node run's either way.
#[test]
fn reducers_read_their_destination_by_shared_memory_and_over_quic() {
    let expected = single_node();
    let cluster = Cluster::start(&[
        NodeSpec::cpu("worker-1", 2),
        NodeSpec::cpu("worker-2", 2),
        NodeSpec::cpu("worker-3", 2).sharing_store_with("worker-1"),
    ]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let ds = shuffled(&ctx, 0);
    assert_eq!(partitions(&ds.collect().unwrap()), expected);
    let stats = ds.stats().unwrap();
    let pulled = |by: fn(&streambatch::NodeStats) -> u64| stats.nodes.iter().map(by).sum::<u64>();
    assert!(
        pulled(|n| n.inputs_shared) > 0,
        "none by shared memory: {stats}"
    );
    assert!(pulled(|n| n.inputs_quic) > 0, "none over QUIC: {stats}");
}

#[test]
fn a_node_killed_mid_exchange_costs_only_its_map_outputs() {
    let expected = single_node();
    let mut cluster = Cluster::start(&[NodeSpec::cpu("worker-1", 2), NodeSpec::cpu("worker-2", 2)]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    // 24 map tasks of 100 ms on 4 slots: about 0.6 s of map side, and no
    // reducer starts before the last map output is in.
    let ds = shuffled(&ctx, 100);
    let batches = ds.iter_batches().unwrap();
    // Killed once it has made two map outputs (which wait for the rest).
    let live = batches.live_stats();
    let started = std::time::Instant::now();
    let made_by = |name: &str| {
        let stats = live.lock().unwrap();
        stats
            .nodes
            .iter()
            .find(|n| n.name == name)
            .map_or(0, |n| n.tasks)
    };
    while made_by("worker-2") < 2 {
        assert!(started.elapsed().as_secs() < 20, "worker-2 ran no task");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let node = cluster.nodes.iter_mut().find(|n| n.name == "worker-2");
    node.unwrap().kill_hard();
    let out: Vec<RecordBatch> = batches.map(|b| b.unwrap()).collect();
    assert_eq!(partitions(&out), expected);
    let stats = ds.stats().unwrap();
    let r = &stats.recovery;
    assert_eq!(r.nodes_lost, vec!["worker-2".to_string()], "{stats}");
    assert!(
        r.lost_partitions > 0,
        "worker-2 held no map output: {stats}"
    );
    assert_eq!(r.remade_partitions, r.lost_partitions, "{stats}");
    // A map task reads its source split: re-making its output re-runs it
    // alone.
    assert!(r.rerun_tasks <= r.lost_partitions, "{stats}");
}
