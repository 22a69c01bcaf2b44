//! W4 (batch inference on Parquet files) on the CPU, scaled down: every
//! embedding written is checked against the direct f64 computation, and
//! `rows` in the JSON line is the rows written and checked.

use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Float32Type;
use arrow_array::{Array, ArrayRef, FixedSizeListArray, Float32Array, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::ArrowWriter;
use streambatch::NodeConfig;
use streambatch_bench::{self as bench, Device};

#[test]
fn w4_on_the_cpu_writes_and_checks_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("images");
    // 200 images in 4 files: 64-row batches and a remainder of 8.
    bench::make_images(&input, 4, 50, 42).unwrap();
    let base = NodeConfig {
        cpus: 2.0,
        gpus: Some(0.0),
        store_capacity: 256 << 20,
        spill_dir: dir.path().join("spill"),
        ..NodeConfig::default()
    };
    let output = dir.path().join("out");
    let result = bench::w4_on(Device::Cpu, &input, &output, &base).unwrap();
    assert!(result.correct, "{}", result.to_json());
    assert_eq!(result.rows, 200);
    let line: serde_json::Value = serde_json::from_str(&result.to_json()).unwrap();
    assert_eq!(line["rows"], 200);
    assert_eq!(line["rows_matching"], 200);
    assert_eq!(line["images"], 200);
    assert!(line["store_peak_bytes"].as_u64().unwrap() > 0);

    // Every row is checked: one wrong embedding is found.
    let ctx = streambatch::Context::with_config(base).unwrap();
    let check = bench::check_embeddings(&ctx, &input, &output, 42).unwrap();
    assert!(check.all_match());
    let other_seed = bench::check_embeddings(&ctx, &input, &output, 7).unwrap();
    assert_eq!(other_seed.matching, 0);
    assert!(!other_seed.all_match());

    // One embedding of NaN among 200 right ones is found; so is an all-NaN
    // output (a maximum error folded from 0 would skip NaN and pass both).
    for all in [false, true] {
        let nan_out = dir.path().join(format!("out-nan-{all}"));
        write_with_nan(&ctx, &output, &nan_out, all);
        let check = bench::check_embeddings(&ctx, &input, &nan_out, 42).unwrap();
        assert_eq!(check.rows, 200);
        assert_eq!(check.matching, if all { 0 } else { 199 }, "{check:?}");
        assert!(!check.all_match());
    }
}

/// Copies the embeddings in `from` to one Parquet file in `to`, the first
/// row's embedding (or, with `all`, every one) made NaN.
fn write_with_nan(ctx: &streambatch::Context, from: &Path, to: &Path, all: bool) {
    let batches = ctx
        .read_parquet(from.to_str().unwrap())
        .unwrap()
        .collect()
        .unwrap();
    std::fs::create_dir_all(to).unwrap();
    let file = std::fs::File::create(to.join("part-0.parquet")).unwrap();
    let mut writer = ArrowWriter::try_new(file, batches[0].schema(), None).unwrap();
    for (b, batch) in batches.iter().enumerate() {
        let at = batch.schema().index_of("embedding").unwrap();
        let list = batch.column(at).as_fixed_size_list();
        let mut values = list
            .values()
            .as_primitive::<Float32Type>()
            .values()
            .to_vec();
        let width = list.value_length() as usize;
        let nan = if all {
            values.len()
        } else if b == 0 {
            width
        } else {
            0
        };
        values[..nan].fill(f32::NAN);
        let DataType::FixedSizeList(field, _) = list.data_type() else {
            panic!("`embedding` is not a fixed-size list");
        };
        let list = FixedSizeListArray::new(
            field.clone(),
            width as i32,
            Arc::new(Float32Array::from(values)),
            None,
        );
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        columns[at] = Arc::new(list);
        writer
            .write(&RecordBatch::try_new(batch.schema(), columns).unwrap())
            .unwrap();
    }
    writer.close().unwrap();
}
