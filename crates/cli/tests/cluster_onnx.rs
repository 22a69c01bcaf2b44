//! An ONNX model on a 2-node cluster of real node processes: every node
//! rebuilds the operator from its recipe and runs the same model, each
//! row's output exact; a node whose copy of the model differs from the
//! driver's refuses the task, naming the model and both hashes; a model
//! the driver sends reaches nodes that have no copy of the file.

mod common;

use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type};
use common::{Cluster, NodeSpec};
use streambatch::onnx::{Attr, Dim, ElemType, ModelBuilder};
use streambatch::{Context, OnnxModel, Resources};

/// Checks every row of a job's output of [`model`]`(0.5)`, the id
/// column fed to the model coming back as `id2`; the rows.
fn check_rows(ds: &streambatch::Dataset) -> usize {
    let mut rows = 0;
    for batch in ds.iter_batches().unwrap() {
        let batch = batch.unwrap();
        let half = batch
            .column_by_name("half")
            .unwrap()
            .as_primitive::<Float32Type>();
        let twice = batch
            .column_by_name("id2")
            .unwrap()
            .as_primitive::<Int64Type>();
        for (h, t) in half.values().iter().zip(twice.values()) {
            assert_eq!(*t % 2, 0);
            assert_eq!(*h, (*t / 2) as f32 * 0.5, "row of id {}", t / 2);
        }
        rows += batch.num_rows();
    }
    rows
}

/// Runs [`model`]`(0.5)` as `onnx` over 4,000 rows: every row checked,
/// and every node ran some of it.
fn run_on_every_node(ctx: &Context, onnx: OnnxModel) {
    let ds = ctx
        .range(4_000, 16)
        .map_batches(onnx, Resources::cpu(1.0).batch_rows(100));
    assert_eq!(check_rows(&ds), 4_000);
    let stats = ds.stats().unwrap();
    for node in &stats.nodes {
        assert!(node.tasks > 0, "no task ran on {}: {stats}", node.name);
    }
}

/// `id` (i64) to `half = f32(id) * 0.5` and `twice = id + id`.
fn model(scale: f32) -> Vec<u8> {
    let batch = || Dim::Dynamic(Some("N".into()));
    let mut m = ModelBuilder::new(17);
    m.input("id", ElemType::I64, &[batch()]);
    m.node("Cast", &["id"], &["idf"], vec![Attr::Int("to", 1)]);
    let w = m.weight("scale", &[], vec![scale]);
    m.node("Mul", &["idf", &w], &["half"], vec![]);
    m.node("Add", &["id", "id"], &["twice"], vec![]);
    m.output("half", ElemType::F32, &[batch()]);
    m.output("twice", ElemType::I64, &[batch()]);
    m.to_bytes()
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn every_node_runs_the_same_model_and_a_differing_copy_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("scale.onnx");
    write(&file, &model(0.5));
    let cluster = Cluster::start(&[NodeSpec::cpu("worker-1", 2), NodeSpec::cpu("worker-2", 2)]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    // The id column feeds the model, so it comes back as `id` again.
    let onnx = OnnxModel::open(&file).unwrap().output("twice", "id2");
    run_on_every_node(&ctx, onnx);

    // A model the driver sends: its file is gone before the job starts, so
    // a node can only run the copy that came from the driver.
    let only_here = dir.path().join("driver-only.onnx");
    write(&only_here, &model(0.5));
    let sent = OnnxModel::open(&only_here)
        .unwrap()
        .output("twice", "id2")
        .send_to_nodes();
    std::fs::remove_file(&only_here).unwrap();
    run_on_every_node(&ctx, sent);
    // Unsent, such a model is a path no node can read.
    let kept = dir.path().join("kept-back.onnx");
    write(&kept, &model(0.5));
    let unsent = OnnxModel::open(&kept).unwrap().output("twice", "id2");
    std::fs::remove_file(&kept).unwrap();
    let err = ctx
        .range(100, 2)
        .map_batches(unsent, Resources::cpu(1.0))
        .count()
        .expect_err("no node can read the file");
    assert!(err.to_string().contains("kept-back.onnx"), "{err}");

    // The driver planned with one model; the nodes' copy is now another.
    let planned = OnnxModel::open(&file).unwrap();
    write(&file, &model(2.0));
    let err = ctx
        .range(100, 2)
        .map_batches(planned, Resources::cpu(1.0))
        .count()
        .expect_err("a node with another copy refuses");
    let text = err.to_string();
    assert!(
        text.contains("scale.onnx") && text.contains("every node must run the same model"),
        "{text}"
    );
}
