//! ONNX models in a pipeline, each output checked against ONNX Runtime's
//! own Python API on the same inputs (`tests/onnx/reference.py`, through
//! `SB_PYTHON` with `onnxruntime` and `pyarrow`; `.ci/run` installs them):
//! the main job's convnet, a transformer encoder block at two sequence
//! lengths, a model of two inputs and two outputs, one of every element
//! type, each over batches of several sizes (a dynamic batch). And every
//! bad input the operator refuses, each with an error naming the file and
//! what was expected, before any output is written.

mod common;

#[path = "onnx/models.rs"]
mod models;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use arrow_array::types::{Float16Type, Float32Type, Int32Type, UInt8Type};
use arrow_array::{
    Array, ArrayRef, ArrowPrimitiveType, FixedSizeListArray, Int64Array, PrimitiveArray,
    RecordBatch,
};
use arrow_schema::{DataType, Field};
use common::{ctx, ctx_with};
use rand::{Rng, SeedableRng};
use streambatch::prelude::*;
use streambatch_bench::skip_test;
use streambatch_onnx::{Engine, OnnxError, OnnxModel, convnet};

/// The engines to run each model on: rten always, and ONNX Runtime where
/// its library is found (`ORT_DYLIB_PATH`; `.ci/run` sets it, and under
/// CI a missing one fails the test).
fn engines(test: &str) -> Vec<Engine> {
    let mut engines = vec![Engine::Rten];
    match Engine::Auto.resolve() {
        Engine::OnnxRuntime => engines.push(Engine::OnnxRuntime),
        _ => skip_test(
            test,
            "no ONNX Runtime library for the onnxruntime engine (set ORT_DYLIB_PATH, or run tools/setup-onnxruntime.sh)",
        ),
    }
    engines
}

/// A Python with onnxruntime and pyarrow, or `None` (the test is skipped,
/// and fails under CI).
fn python(test: &str) -> Option<String> {
    let python = std::env::var("SB_PYTHON").unwrap_or_else(|_| "python3".into());
    let found = Command::new(&python)
        .args(["-c", "import onnxruntime, pyarrow"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        skip_test(
            test,
            "no Python with onnxruntime and pyarrow (set SB_PYTHON, or pip install onnxruntime pyarrow)",
        );
    }
    found.then_some(python)
}

/// ONNX Runtime's outputs for `batch` through the model at `model`.
fn reference(python: &str, model: &Path, batch: &RecordBatch) -> RecordBatch {
    let dir = tempfile::tempdir().unwrap();
    let (source, target) = (dir.path().join("in.arrow"), dir.path().join("out.arrow"));
    let file = std::fs::File::create(&source).unwrap();
    let mut writer = arrow_ipc::writer::FileWriter::try_new(file, &batch.schema()).unwrap();
    writer.write(batch).unwrap();
    writer.finish().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/onnx/reference.py");
    let out = Command::new(python)
        .arg(script)
        .args([model, &source, &target])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reference.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = std::fs::File::open(&target).unwrap();
    let reader = arrow_ipc::reader::FileReader::try_new(file, None).unwrap();
    let batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
    arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap()
}

/// `batch` through `model` in a pipeline of `batch_rows` rows a call,
/// its rows in `id` order.
fn through_pipeline(model: OnnxModel, batch: RecordBatch, batch_rows: usize) -> RecordBatch {
    let ctx = ctx();
    let out = ctx
        .from_batches(vec![batch])
        .map_batches(model, Resources::cpu(1.0).batch_rows(batch_rows))
        .sort(&["id"], false)
        .collect()
        .unwrap();
    arrow_select::concat::concat_batches(&out[0].schema(), &out).unwrap()
}

/// Each of `want`'s columns equals `got`'s of the same name within
/// `tolerance` (relative past 1); a NaN never does.
fn assert_close(got: &RecordBatch, want: &RecordBatch, tolerance: f64, what: &str) {
    assert_eq!(got.num_rows(), want.num_rows(), "{what}: rows");
    for field in want.schema().fields() {
        let name = field.name();
        let got = got
            .column_by_name(name)
            .unwrap_or_else(|| panic!("{what}: no column {name}"));
        let (got, want) = (flat(got), flat(want.column_by_name(name).unwrap()));
        assert_eq!(got.len(), want.len(), "{what}: {name}'s values");
        assert!(!want.is_empty(), "{what}: {name} is empty");
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= tolerance * b.abs().max(1.0),
                "{what}: {name}[{i}] is {a}, ONNX Runtime says {b}"
            );
        }
    }
}

fn flat(column: &ArrayRef) -> Vec<f64> {
    let mut values = column.clone();
    while let Some(list) = values.as_any().downcast_ref::<FixedSizeListArray>() {
        values = list.values().slice(
            list.value_offset_at(0),
            list.len() * list.value_length() as usize,
        );
    }
    let values = arrow_cast::cast(&values, &DataType::Float64).unwrap();
    let values = values
        .as_any()
        .downcast_ref::<arrow_array::Float64Array>()
        .unwrap();
    values.values().to_vec()
}

fn list<T: ArrowPrimitiveType>(values: Vec<T::Native>, width: usize) -> ArrayRef {
    let item = Arc::new(Field::new("item", T::DATA_TYPE, false));
    let values = Arc::new(PrimitiveArray::<T>::from_iter_values(values));
    Arc::new(FixedSizeListArray::try_new(item, width as i32, values, None).unwrap())
}

fn with_ids(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
    let rows = columns[0].1.len() as i64;
    let mut all = vec![(
        "id",
        Arc::new(Int64Array::from_iter_values(0..rows)) as ArrayRef,
    )];
    all.extend(columns);
    RecordBatch::try_from_iter(all).unwrap()
}

fn floats(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-2.0..2.0)).collect()
}

fn model_file(dir: &Path, name: &str, bytes: Vec<u8>) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Every model, at batches of 1, 3 and all rows, equals ONNX Runtime.
#[test]
fn models_in_a_pipeline_give_onnx_runtimes_answers() {
    let Some(python) = python("models_in_a_pipeline_give_onnx_runtimes_answers") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let rows = 7;
    let mut cases: Vec<(&str, PathBuf, RecordBatch)> = vec![(
        "convnet",
        model_file(dir.path(), "convnet.onnx", convnet(11)),
        with_ids(vec![(
            "pixels",
            list::<Float32Type>(floats(&mut rng, rows * 64 * 64 * 3), 64 * 64 * 3),
        )]),
    )];
    let encoder = model_file(dir.path(), "encoder.onnx", models::encoder_block(5));
    for seq in [5, 9] {
        let width = seq * models::MODEL_DIM;
        let tokens = list::<Float32Type>(floats(&mut rng, rows * width), width);
        cases.push((
            "encoder block",
            encoder.clone(),
            with_ids(vec![("tokens", tokens)]),
        ));
    }
    let ids = Arc::new(Int64Array::from_iter_values(
        (0..rows as i64).map(|i| i * 1_000 - 3),
    ));
    cases.push((
        "two inputs, two outputs",
        model_file(dir.path(), "two.onnx", models::two_in_two_out(8)),
        with_ids(vec![
            (
                "features",
                list::<Float32Type>(floats(&mut rng, rows * 4), 4),
            ),
            ("ids", ids),
        ]),
    ));
    let halves = floats(&mut rng, rows * 2)
        .into_iter()
        .map(half::f16::from_f32)
        .collect();
    cases.push((
        "every element type",
        model_file(dir.path(), "types.onnx", models::every_type(9)),
        with_ids(vec![
            (
                "bytes",
                list::<UInt8Type>((0..rows * 4).map(|i| (i * 37 % 256) as u8).collect(), 4),
            ),
            (
                "counts",
                list::<Int32Type>((0..rows as i32 * 2).map(|i| i * 7 - 20).collect(), 2),
            ),
            ("halves", list::<Float16Type>(halves, 2)),
        ]),
    ));
    let engines = engines("models_in_a_pipeline_give_onnx_runtimes_answers");
    for (what, model, batch) in cases {
        let want = reference(&python, &model, &batch);
        // An f16 output is compared at f16's precision.
        let tolerance = match what {
            "every element type" => 2e-3,
            _ => 1e-4,
        };
        for &engine in &engines {
            for batch_rows in [1, 3, rows] {
                let op = OnnxModel::open(&model).unwrap().engine(engine);
                let got = through_pipeline(op, batch.clone(), batch_rows);
                assert_eq!(got.column(0).len(), rows, "{what}");
                let case = format!("{what}, {engine:?}, {batch_rows} rows a call");
                assert_close(&got, &want, tolerance, &case);
            }
        }
    }
}

/// A file that is not ONNX, a truncated one, and an operator the engine
/// lacks: each refused when the operator is made, naming the file.
#[test]
fn a_model_that_cannot_load_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let text = model_file(
        dir.path(),
        "notes.onnx",
        b"just some text, not a model".to_vec(),
    );
    let e = OnnxModel::open(&text).err().expect("text is refused");
    assert!(matches!(e, OnnxError::NotOnnx { .. }), "{e}");
    assert!(
        e.to_string().contains("notes.onnx") && e.to_string().contains("not an ONNX model"),
        "{e}"
    );

    let whole = convnet(1);
    let truncated = model_file(dir.path(), "cut.onnx", whole[..whole.len() / 2].to_vec());
    let e = OnnxModel::open(&truncated)
        .err()
        .expect("a truncated file is refused");
    assert!(e.to_string().contains("cut.onnx"), "{e}");

    let missing = dir.path().join("absent.onnx");
    let e = OnnxModel::open(&missing)
        .err()
        .expect("a missing file is refused");
    assert!(e.to_string().contains("absent.onnx"), "{e}");

    let unknown = model_file(dir.path(), "unknown.onnx", models::unknown_op());
    let model = OnnxModel::open(&unknown).unwrap();
    assert_eq!(model.info().ops, vec!["NoSuchOperator".to_string()]);
    for engine in engines("a_model_that_cannot_load_is_refused_naming_the_file") {
        let e = model
            .clone()
            .engine(engine)
            .session(1)
            .err()
            .expect("an unknown operator is refused");
        let text = e.to_string();
        assert!(
            text.contains("unknown.onnx") && text.contains("NoSuchOperator"),
            "{engine:?}: {text}"
        );
    }
}

/// A column of the wrong type or shape, a column missing, a mapping to an
/// input the model lacks, and a model whose output disagrees with its
/// declaration: each an error naming the column or output and what was
/// expected, and a job writing Parquet writes nothing.
#[test]
fn a_batch_that_does_not_fit_the_model_is_refused_before_any_output() {
    let dir = tempfile::tempdir().unwrap();
    let two = model_file(dir.path(), "two.onnx", models::two_in_two_out(1));
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let good = || {
        with_ids(vec![
            ("features", list::<Float32Type>(vec![0.5; 8], 4)),
            ("ids", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
        ])
    };
    let mut session = OnnxModel::open(&two).unwrap().session(1).unwrap();
    assert_eq!(session.run(&good()).unwrap().num_rows(), 2);

    let wrong_type = with_ids(vec![
        ("features", list::<Float32Type>(vec![0.5; 8], 4)),
        ("ids", list::<Float32Type>(vec![1.0, 2.0], 1)),
    ]);
    let e = session.run(&wrong_type).unwrap_err().to_string();
    assert!(
        e.contains("two.onnx") && e.contains("`ids`") && e.contains("takes i64"),
        "{e}"
    );

    let wrong_width = with_ids(vec![
        ("features", list::<Float32Type>(floats(&mut rng, 6), 3)),
        ("ids", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
    ]);
    let e = session.run(&wrong_width).unwrap_err().to_string();
    assert!(
        e.contains("`features`") && e.contains("takes 4 values"),
        "{e}"
    );

    let missing = with_ids(vec![("features", list::<Float32Type>(vec![0.5; 8], 4))]);
    let e = session.run(&missing).unwrap_err().to_string();
    assert!(
        e.contains("model input `ids`") && e.contains("has none"),
        "{e}"
    );

    let e = OnnxModel::open(&two)
        .unwrap()
        .input("labels", "ids")
        .checked()
        .err()
        .expect("an input the model lacks");
    assert!(
        e.to_string().contains("`labels`") && e.to_string().contains("`features`, `ids`"),
        "{e}"
    );

    let lying = model_file(dir.path(), "lying.onnx", models::lying_output());
    // ONNX Runtime may refuse the model itself, when loading or running
    // it, in its own words; rten computes, and the operator's check
    // refuses the output.
    for engine in engines("a_batch_that_does_not_fit_the_model_is_refused_before_any_output") {
        let batch = with_ids(vec![("x", list::<Float32Type>(vec![1.0; 4], 2))]);
        let model = OnnxModel::open(&lying).unwrap().engine(engine);
        let e = model
            .session(1)
            .and_then(|mut session| session.run(&batch))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("lying.onnx") && e.contains("y"),
            "{engine:?}: {e}"
        );
        if engine == Engine::Rten {
            assert!(e.contains("y: f32[N, 5]") && e.contains("[2, 3]"), "{e}");
        }
    }

    // In a job: it fails naming the model, and its output folder holds no file.
    let ctx = ctx();
    let out = dir.path().join("out");
    let err = ctx
        .from_batches(vec![good(), wrong_type])
        .map_batches(OnnxModel::open(&two).unwrap(), Resources::cpu(1.0))
        .write_parquet(&out)
        .expect_err("the job fails");
    assert!(err.to_string().contains("takes i64"), "{err}");
    assert!(
        common::visible_files(&out).is_empty(),
        "{:?}",
        common::visible_files(&out)
    );
}

/// `explain()` shows the model's declarations before the job runs.
#[test]
fn explain_shows_the_models_inputs_outputs_and_opset() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_file(dir.path(), "convnet.onnx", convnet(2));
    let ctx = ctx();
    let explain = ctx
        .range(10, 1)
        .map_batches(OnnxModel::open(&model).unwrap(), Resources::cpu(1.0))
        .explain()
        .unwrap()
        .to_string();
    assert!(explain.contains("convnet.onnx"), "{explain}");
    assert!(explain.contains("pixels: f32[N, 64, 64, 3]"), "{explain}");
    assert!(
        explain.contains("embedding: f32[N, 256]") && explain.contains("opset 17"),
        "{explain}"
    );
}

/// `streambatch run`'s TOML: `op = "onnx"` runs the model file the
/// pipeline names (relative to it) on each engine, and every row it
/// writes equals ONNX Runtime's answer.
#[test]
fn a_toml_pipeline_runs_a_model_with_onnx_runtimes_answers() {
    let test = "a_toml_pipeline_runs_a_model_with_onnx_runtimes_answers";
    let Some(python) = python(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let model = model_file(dir.path(), "convnet.onnx", convnet(5));
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let rows = 10;
    let input = with_ids(vec![(
        "pixels",
        list::<Float32Type>(floats(&mut rng, rows * 64 * 64 * 3), 64 * 64 * 3),
    )]);
    let file = std::fs::File::create(dir.path().join("in.parquet")).unwrap();
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, input.schema(), None).unwrap();
    writer.write(&input).unwrap();
    writer.close().unwrap();
    let want = reference(&python, &model, &input);
    for engine in engines(test) {
        let name = match engine {
            Engine::OnnxRuntime => "onnxruntime",
            _ => "rten",
        };
        let pipeline = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &pipeline,
            format!(
                r#"
[source]
read_parquet = "in.parquet"

[[ops]]
op = "onnx"
model = "convnet.onnx"
outputs = {{ embedding = "embedding" }}
engine = "{name}"
cpus = 1
batch_rows = 3
workers = 2

[sink]
write_parquet = "out-{name}"
"#
            ),
        )
        .unwrap();
        streambatch::pipeline::run_pipeline(&pipeline).unwrap();
        let out = ctx()
            .read_parquet(&dir.path().join(format!("out-{name}")).display().to_string())
            .unwrap()
            .sort(&["id"], false)
            .collect()
            .unwrap();
        let got = arrow_select::concat::concat_batches(&out[0].schema(), &out).unwrap();
        assert_close(&got, &want, 1e-4, &format!("TOML pipeline, {name}"));
    }
}

/// A model stage holding a GPU slot computes on a GPU provider or fails
/// naming why, before any output: rten computes on the CPU only; ONNX
/// Runtime takes its CUDA provider, whose absence (a CPU-only library, as
/// here) is an error, never a silent run on the CPU while the slot is
/// held. Where the provider loads (onnxruntime-gpu on an NVIDIA GPU), the
/// answers are ONNX Runtime's on the CPU.
#[test]
fn a_gpu_stage_runs_on_a_gpu_provider_or_is_refused_naming_why() {
    let test = "a_gpu_stage_runs_on_a_gpu_provider_or_is_refused_naming_why";
    let dir = tempfile::tempdir().unwrap();
    let model = model_file(dir.path(), "convnet.onnx", convnet(4));
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let batch = with_ids(vec![(
        "pixels",
        list::<Float32Type>(floats(&mut rng, 3 * 64 * 64 * 3), 64 * 64 * 3),
    )]);
    let on_gpu = |engine: Engine| {
        let ctx = ctx_with(|c| c.gpus = Some(1.0));
        let op = OnnxModel::open(&model).unwrap().engine(engine);
        ctx.from_batches(vec![batch.clone()])
            .map_batches(op, Resources::gpu(1.0).batch_rows(2))
            .collect()
    };
    let err = on_gpu(Engine::Rten)
        .expect_err("rten on a GPU slot")
        .to_string();
    assert!(
        err.contains("rten computes on the CPU only") && err.contains("convnet.onnx"),
        "{err}"
    );
    if !engines(test).contains(&Engine::OnnxRuntime) {
        return;
    }
    match on_gpu(Engine::OnnxRuntime) {
        Err(e) => {
            let e = e.to_string();
            assert!(
                e.contains("CUDA provider did not load") && e.contains("convnet.onnx"),
                "{e}"
            );
        }
        Ok(out) => {
            let got = arrow_select::concat::concat_batches(&out[0].schema(), &out).unwrap();
            let cpu = through_pipeline(OnnxModel::open(&model).unwrap(), batch.clone(), 3);
            assert_close(&got, &cpu, 1e-3, "the CUDA provider against the CPU");
        }
    }
}
