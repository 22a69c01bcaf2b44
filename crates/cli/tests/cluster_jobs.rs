//! Jobs on real node processes (127.0.0.1): a W1-shaped job on 1, 2 and 4
//! worker nodes gives the output of the single-node run; tasks run on every
//! node; partitions made on one node are consumed on another, by shared
//! memory between nodes that share a store directory and over QUIC between
//! nodes that do not.

mod common;

use common::{Cluster, NodeSpec};
use streambatch::Context;
use streambatch_bench::{Shape, registry, w1_pipeline};

/// A small W1: 40 rows of 64 KiB, quick sleeps.
fn shape() -> Shape {
    Shape {
        rows: 40,
        partitions: 8,
        row_bytes: 64 << 10,
        millis: (20, 5, 5),
    }
}

/// Rows out and the sum of their ids.
fn run(ctx: &Context) -> (streambatch::JobStats, u64, i64) {
    let ds = w1_pipeline(
        ctx.range(shape().rows, shape().partitions),
        &registry(),
        shape(),
    )
    .unwrap();
    let mut rows = 0;
    let mut sum = 0;
    for batch in ds.iter_batches().unwrap() {
        let batch = batch.unwrap();
        rows += batch.num_rows() as u64;
        let ids = batch
            .column(0)
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .unwrap();
        sum += ids.values().iter().sum::<i64>();
    }
    (ds.stats().unwrap(), rows, sum)
}

#[test]
fn a_w1_shaped_job_gives_the_single_node_output_on_1_2_and_4_nodes() {
    let local = Context::with_config(streambatch::NodeConfig {
        cpus: 4.0,
        gpus: Some(2.0),
        store_capacity: 256 << 20,
        ..Default::default()
    })
    .unwrap();
    let (_, rows, sum) = run(&local);
    assert_eq!((rows, sum), (40, (0..40).sum::<i64>()));

    for workers in [1, 2, 4] {
        // N CPU nodes feeding one GPU node, as in W5; the GPU node shares
        // its store directory with worker-1 only.
        let mut specs: Vec<NodeSpec> = (1..=workers)
            .map(|i| NodeSpec::cpu(&format!("worker-{i}"), 2))
            .collect();
        specs.push(NodeSpec::gpu("gpu", 2).sharing_store_with("worker-1"));
        let cluster = Cluster::start(&specs);
        let ctx = Context::connect(cluster.driver_config()).unwrap();
        let (stats, got_rows, got_sum) = run(&ctx);
        assert_eq!((got_rows, got_sum), (rows, sum), "{workers} workers");
        assert_eq!(stats.nodes.len(), workers + 1, "{stats}");
        for node in &stats.nodes {
            assert!(node.tasks > 0, "no task ran on {}: {stats}", node.name);
        }
        let gpu = stats.nodes.iter().find(|n| n.name == "gpu").unwrap();
        assert!(gpu.inputs_shared > 0, "none by shared memory: {stats}");
        if workers > 1 {
            assert!(
                gpu.inputs_quic > 0 && gpu.quic_bytes > 0,
                "none over QUIC: {stats}"
            );
        }
    }
}
