//! GPU kernels on a real adapter (lavapipe in CI): results equal to a CPU
//! reference, compile errors that name the kernel and line. Without an
//! adapter a GPU test is skipped and says so in the test output; with
//! CI=true it fails instead.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int32Type};
use arrow_array::{
    ArrayRef, FixedSizeListArray, Float32Array, Int32Array, Int64Array, RecordBatch,
};
use arrow_schema::{DataType, Field};
use streambatch::ops::{self, EMBED_DIM};
use streambatch::prelude::*;
use streambatch::{GpuPool, NodeConfig};
use streambatch_bench as bench;

/// True when an adapter exists. Otherwise the test is skipped and says so
/// ([`bench::skip_test`]: in the test output, and in `.ci/run`'s count of
/// skips); under CI it fails instead.
fn gpu_present(test: &str) -> bool {
    if GpuPool::global().is_empty() {
        bench::skip_test(
            test,
            "no GPU adapter: install mesa-vulkan-drivers (lavapipe)",
        );
        return false;
    }
    true
}

fn gpu_ctx() -> Context {
    Context::with_config(NodeConfig {
        cpus: 2.0,
        gpus: None,
        // CI has only lavapipe, a software adapter, which "auto" leaves out.
        gpu_software: true,
        store_capacity: 1 << 30,
        target_partition_bytes: 4 << 20,
        ..NodeConfig::default()
    })
    .unwrap()
}

/// max |a - b| / max |b|; NaN where any element is NaN, infinite where the
/// lengths differ, so that `relative_error(..) < tol` fails for both (a
/// maximum folded with `f64::max` would skip NaN: an all-NaN result would
/// pass).
fn relative_error(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let nan_max = |m: f64, x: f64| {
        if m.is_nan() || x.is_nan() {
            f64::NAN
        } else {
            m.max(x)
        }
    };
    let scale = want
        .iter()
        .map(|x| x.abs() as f64)
        .fold(0.0, nan_max)
        .max(1e-30);
    got.iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0.0, nan_max)
        / scale
}

#[test]
fn the_relative_error_of_a_nan_or_a_wrong_length_fails_the_bound() {
    // What the tests below assert of every result.
    let passes = |got: &[f32], want: &[f32]| relative_error(got, want) < 1e-4;
    let want = [1.0f32, -2.0, 0.5];
    assert!(passes(&want, &want));
    assert!(!passes(&[f32::NAN; 3], &want));
    assert!(!passes(&[1.0, f32::NAN, 0.5], &want));
    assert!(!passes(&[1.0, -2.0, f32::INFINITY], &want));
    assert!(!passes(&[1.0, -2.0], &want));
    assert!(!passes(&[1.0, -2.0, 0.6], &want));
}

const SAXPY: &str = r#"
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> n: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> m: array<i32>;
struct Params { rows: u32, a: f32, b: f32, _pad: u32 }
@group(0) @binding(4) var<uniform> params: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i >= params.rows) { return; }
    y[i] = params.a * x[i] + params.b;
    m[i] = n[i] * 3 - 1;
}
"#;

#[test]
fn an_element_wise_kernel_matches_the_cpu() {
    if !gpu_present("an_element_wise_kernel_matches_the_cpu") {
        return;
    }
    let rows = 10_000;
    let xs: Vec<f32> = (0..rows).map(|i| (i as f32).sin() * 100.0).collect();
    let ns: Vec<i32> = (0..rows).map(|i| i as i32 - 5000).collect();
    let batch = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..rows as i64)) as ArrayRef,
        ),
        ("x", Arc::new(Float32Array::from(xs.clone())) as ArrayRef),
        ("n", Arc::new(Int32Array::from(ns.clone())) as ArrayRef),
    ])
    .unwrap();
    let params: Vec<u8> = [
        0u32.to_le_bytes(),
        2.5f32.to_le_bytes(),
        (-1.25f32).to_le_bytes(),
        0u32.to_le_bytes(),
    ]
    .concat();
    let kernel = GpuKernel::from_wgsl("saxpy", SAXPY)
        .unwrap()
        .params(&params);
    let ds = gpu_ctx()
        .from_batches(vec![batch])
        .map_batches(kernel.clone(), Resources::gpu(1.0).batch_rows(3000));
    let out = ds.collect().unwrap();
    let mut got: Vec<(i64, f32, i32)> = out
        .iter()
        .flat_map(|b| {
            assert_eq!(
                b.schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>(),
                ["id", "y", "m"]
            );
            let id = b
                .column(0)
                .as_primitive::<arrow_array::types::Int64Type>()
                .values()
                .to_vec();
            let y = b.column(1).as_primitive::<Float32Type>().values().to_vec();
            let m = b.column(2).as_primitive::<Int32Type>().values().to_vec();
            (0..id.len()).map(move |i| (id[i], y[i], m[i]))
        })
        .collect();
    got.sort_by_key(|r| r.0);
    assert_eq!(got.len(), rows);
    let want_y: Vec<f32> = xs.iter().map(|x| 2.5 * x - 1.25).collect();
    let got_y: Vec<f32> = got.iter().map(|r| r.1).collect();
    assert!(
        relative_error(&got_y, &want_y) < 1e-4,
        "relative error {}",
        relative_error(&got_y, &want_y)
    );
    assert_eq!(
        got.iter().map(|r| r.2).collect::<Vec<_>>(),
        ns.iter().map(|n| n * 3 - 1).collect::<Vec<_>>()
    );
    // Four batches of at most 3,000 rows; the stats split the GPU time.
    assert_eq!(kernel.timings().calls, 4);
    let stats = ds.stats().unwrap();
    let gpu = stats.operators[1]
        .ops
        .iter()
        .find(|o| o.name == "saxpy")
        .unwrap();
    let keys: Vec<&str> = gpu.metrics.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["device", "upload_s", "compute_s", "readback_s"]);
    assert!(stats.to_string().contains("compute_s="), "{stats}");
}

#[test]
fn the_w4_matmul_matches_the_cpu_reference() {
    if !gpu_present("the_w4_matmul_matches_the_cpu_reference") {
        return;
    }
    let rows = 70; // one batch of 64 and one of 6
    let dir = tempfile::tempdir().unwrap();
    bench::make_images(dir.path(), 1, rows, 7).unwrap();
    let ctx = gpu_ctx();
    let kernel = ops::gpu_embedder(42).unwrap();
    let out = ctx
        .read_parquet(dir.path().to_str().unwrap())
        .unwrap()
        .map_batches(ops::preprocess, Resources::cpu(1.0))
        .map_batches(kernel.clone(), Resources::gpu(1.0).batch_rows(64))
        .collect()
        .unwrap();
    let images = ctx
        .read_parquet(dir.path().to_str().unwrap())
        .unwrap()
        .collect()
        .unwrap();
    let weights = ops::embedding_weights(42);
    let mut checked = 0;
    for b in &out {
        let ids = b.column(0).as_primitive::<arrow_array::types::Int64Type>();
        let emb = b.column(1).as_fixed_size_list();
        assert_eq!(emb.value_length() as usize, EMBED_DIM);
        for (r, id) in ids.values().iter().enumerate() {
            let image = images.iter().find_map(|i| {
                let ids = i.column(0).as_primitive::<arrow_array::types::Int64Type>();
                ids.values()
                    .iter()
                    .position(|x| x == id)
                    .map(|p| i.column(1).as_binary::<i32>().value(p).to_vec())
            });
            let want = bench::reference_embedding(&image.unwrap(), &weights);
            let got = emb.value(r).as_primitive::<Float32Type>().values().to_vec();
            let err = relative_error(&got, &want);
            assert!(err < 1e-4, "row {id}: relative error {err}");
            checked += 1;
        }
    }
    assert_eq!(checked, rows);
    assert_eq!(kernel.timings().calls, 2);
    assert!(kernel.device().is_some());
}

#[test]
fn a_kernel_that_does_not_compile_names_the_kernel_and_line() {
    let source = "@compute @workgroup_size(1)\nfn main() {\n    let x: f32 = undefined_name;\n}\n";
    let err = GpuKernel::from_wgsl("bad_kernel", source)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bad_kernel") && err.contains("line 3"),
        "{err}"
    );
    let err = GpuKernel::from_wgsl("typo", "@compute @workgroup_size(1) fn main( {}")
        .unwrap_err()
        .to_string();
    assert!(err.contains("typo") && err.contains("line 1"), "{err}");
}

#[test]
fn a_column_the_kernel_cannot_read_names_kernel_and_column() {
    if !gpu_present("a_column_the_kernel_cannot_read_names_kernel_and_column") {
        return;
    }
    let field = Arc::new(Field::new("item", DataType::Float32, false));
    let list = FixedSizeListArray::new(field, 2, Arc::new(Float32Array::from(vec![1.0; 8])), None);
    let batch = RecordBatch::try_from_iter([
        (
            "x",
            Arc::new(Int64Array::from(vec![1, 2, 3, 4])) as ArrayRef,
        ),
        ("n", Arc::new(list) as ArrayRef),
    ])
    .unwrap();
    let kernel = GpuKernel::from_wgsl("saxpy", SAXPY).unwrap();
    let err = gpu_ctx()
        .from_batches(vec![batch])
        .map_batches(kernel, Resources::gpu(1.0))
        .count()
        .unwrap_err()
        .to_string();
    assert!(err.contains("saxpy") && err.contains("`x`"), "{err}");
}

#[test]
fn a_toml_pipeline_runs_a_wgsl_kernel_and_matches_the_reference() {
    if !gpu_present("a_toml_pipeline_runs_a_wgsl_kernel_and_matches_the_reference") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    bench::make_images(&images, 2, 40, 42).unwrap();
    let kernel =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/pipelines/embed.wgsl");
    let shipped = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/pipelines/embed.toml"),
    )
    .unwrap();
    // The shipped pipeline, pointed at this test's files.
    let text = source_replaced(&shipped, &images.display().to_string())
        .replace(
            "\"embed.wgsl\"",
            &format!("{:?}", kernel.display().to_string()),
        )
        .replace(
            "\"../../out/embeddings-pipeline\"",
            &format!("{:?}", dir.path().join("out").display().to_string()),
        );
    let file = dir.path().join("embed.toml");
    std::fs::write(&file, text).unwrap();
    let run = streambatch::pipeline::run_pipeline(&file).unwrap();
    assert!(run.summary.contains("wrote"), "{}", run.summary);
    let ctx = gpu_ctx();
    let check = bench::check_embeddings(&ctx, &images, &dir.path().join("out"), 42).unwrap();
    assert!(check.all_match(), "{check:?}");
    assert_eq!(check.rows, 80);
    assert_eq!(
        ctx.read_parquet(dir.path().join("out").to_str().unwrap())
            .unwrap()
            .count()
            .unwrap(),
        80
    );
}

/// `pipeline` with its `read_parquet = ...` line reading `path` instead.
fn source_replaced(pipeline: &str, path: &str) -> String {
    let mut replaced = 0;
    let lines: Vec<String> = pipeline
        .lines()
        .map(|l| {
            if l.starts_with("read_parquet = ") {
                replaced += 1;
                format!("read_parquet = {path:?}")
            } else {
                l.to_string()
            }
        })
        .collect();
    assert_eq!(replaced, 1, "one source line in {pipeline}");
    lines.join("\n")
}

#[test]
fn a_bad_pipeline_file_names_the_file_and_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    std::fs::write(&file, "[source]\nrange = { n = 10, partitions = 2 }\n[[ops]]\nop = \"explode\"\n[sink]\ncount = true\n").unwrap();
    let err = streambatch::pipeline::run_pipeline(&file)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("p.toml") && err.contains("explode"), "{err}");
    std::fs::write(&file, "[source]\nrange = { n = 10, partitions = 2 }\n[[ops]]\nop = \"wgsl\"\nname = \"k\"\nfile = \"missing.wgsl\"\n[sink]\ncount = true\n").unwrap();
    let err = streambatch::pipeline::run_pipeline(&file)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("missing.wgsl"), "{err}");
    std::fs::write(
        &file,
        "[source]\nrange = { n = 10, partitions = 2 }\n[sink]\ncount = true\n",
    )
    .unwrap();
    assert_eq!(
        streambatch::pipeline::run_pipeline(&file).unwrap().summary,
        "10 rows"
    );
}
