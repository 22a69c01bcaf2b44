//! Parquet in an S3-compatible store (moto's server on 127.0.0.1) read on
//! two node processes: each node reads its own splits from the store, with
//! its own environment, and the driver plans from the objects' footers;
//! then the nodes write a result back, each uploading its own parts, and
//! the driver commits the write.

mod common;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use common::{Cluster, NodeSpec};
use streambatch::{Context, NodeConfig};
use streambatch_bench::S3Server;

#[test]
fn both_nodes_read_their_splits_of_an_s3_prefix() {
    let Some(s3) = S3Server::start_for_test("both_nodes_read_their_splits_of_an_s3_prefix") else {
        return;
    };
    // Eight Parquet files of ids 0..8,000, written locally, then stored.
    let dir = tempfile::tempdir().unwrap();
    let local = Context::with_config(NodeConfig {
        cpus: 2.0,
        gpus: Some(0.0),
        ..Default::default()
    })
    .unwrap();
    let files = dir.path().join("ids");
    local.range(8_000, 8).write_parquet(&files).unwrap();
    s3.make_bucket("lake");
    for entry in std::fs::read_dir(&files).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        s3.put(
            "lake",
            &format!("ids/{name}"),
            &std::fs::read(&path).unwrap(),
        );
    }
    let node = |name| {
        s3.env()
            .iter()
            .fold(NodeSpec::cpu(name, 2), |spec, (k, v)| spec.with_env(k, v))
    };
    let cluster = Cluster::start(&[node("worker-1"), node("worker-2")]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let ds = ctx.read_parquet("s3://lake/ids/").unwrap();
    let mut ids: Vec<i64> = ds
        .collect()
        .unwrap()
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..8_000).collect::<Vec<_>>());
    let stats = ds.stats().unwrap();
    for name in ["worker-1", "worker-2"] {
        let n = stats.nodes.iter().find(|n| n.name == name).unwrap();
        assert!(n.tasks > 0, "{name} read no split: {stats}");
    }
    let written = ds.write_parquet("s3://lake/copy/").unwrap();
    assert_eq!(written.len(), 8, "a part per split: {written:?}");
    let stats = ds.stats().unwrap();
    for name in ["worker-1", "worker-2"] {
        let n = stats.nodes.iter().find(|n| n.name == name).unwrap();
        assert!(n.tasks > 0, "{name} wrote no part: {stats}");
    }
    let back = local
        .read_parquet("s3://lake/copy/")
        .unwrap()
        .collect()
        .unwrap();
    let mut copied: Vec<i64> = back
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    copied.sort_unstable();
    assert_eq!(copied, ids);
    let keys = s3.keys("lake", "copy/");
    assert_eq!(
        keys.len(),
        9,
        "the parts and the manifest, no staging: {keys:?}"
    );
}
