//! A model read from an S3-compatible store (moto's server on 127.0.0.1,
//! as in `tests/object_store.rs`): `OnnxModel::open("s3://...")` runs as
//! the same file read locally does, a node rebuilding the operator from
//! its recipe reads the object again and checks it by its hash, and a
//! missing object is an error naming its URL.

mod common;

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Float32Type;
use arrow_array::{ArrayRef, FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field};
use common::ctx;
use streambatch::BatchUdf;
use streambatch::prelude::*;
use streambatch_bench::S3Server;
use streambatch_onnx::{Engine, OnnxError, OnnxModel, convnet};

fn pixels(rows: usize) -> RecordBatch {
    let values: Vec<f32> = (0..rows * 64 * 64 * 3)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let list = FixedSizeListArray::try_new(
        item,
        64 * 64 * 3,
        Arc::new(Float32Array::from(values)),
        None,
    )
    .unwrap();
    RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..rows as i64)) as ArrayRef,
        ),
        ("pixels", Arc::new(list) as ArrayRef),
    ])
    .unwrap()
}

fn embeddings(model: OnnxModel, batch: RecordBatch) -> Vec<f32> {
    let out = ctx()
        .from_batches(vec![batch])
        .map_batches(model, Resources::cpu(1.0).batch_rows(4))
        .sort(&["id"], false)
        .collect()
        .unwrap();
    out.iter()
        .flat_map(|b| {
            let list = b.column_by_name("embedding").unwrap().as_fixed_size_list();
            list.values()
                .as_primitive::<Float32Type>()
                .values()
                .to_vec()
        })
        .collect()
}

/// One test, one server: the client reads its endpoint from the
/// environment, which tests running side by side would share.
#[test]
fn a_model_in_an_object_store_runs_as_its_local_copy_does() {
    let Some(s3) =
        S3Server::start_for_test("a_model_in_an_object_store_runs_as_its_local_copy_does")
    else {
        return;
    };
    s3.make_bucket("models");
    let bytes = convnet(21);
    s3.put("models", "team/convnet.onnx", &bytes);
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("convnet.onnx");
    std::fs::write(&local, &bytes).unwrap();

    let remote = OnnxModel::open("s3://models/team/convnet.onnx")
        .unwrap()
        .engine(Engine::Rten);
    assert_eq!(remote.info().sha256, streambatch_onnx::sha256_hex(&bytes));
    let want = embeddings(
        OnnxModel::open(&local).unwrap().engine(Engine::Rten),
        pixels(10),
    );
    let got = embeddings(remote.clone(), pixels(10));
    assert_eq!(got.len(), 10 * 256);
    assert_eq!(
        got, want,
        "the object's model gave other embeddings than the file's"
    );

    // A node rebuilds the operator from its recipe: it reads the object
    // itself, and refuses one that differs from what the driver read (here
    // the recipe sent to another key, which holds another model).
    let recipe = remote.recipe().unwrap();
    OnnxModel::from_recipe(&recipe.params).unwrap();
    s3.put("models", "team/other.onnx", &convnet(22));
    let params = String::from_utf8(recipe.params.clone()).unwrap();
    let moved = params.replace("team/convnet.onnx", "team/other.onnx");
    assert_ne!(moved, params);
    let err = OnnxModel::from_recipe(moved.as_bytes()).err().unwrap();
    assert!(matches!(err, OnnxError::Differs { .. }), "{err}");

    let err = OnnxModel::open("s3://models/team/missing.onnx")
        .err()
        .unwrap();
    assert!(matches!(err, OnnxError::Fetch { .. }), "{err}");
    assert!(
        err.to_string().contains("s3://models/team/missing.onnx"),
        "{err}"
    );
}
