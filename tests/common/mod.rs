//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use streambatch::{Context, NodeConfig};

/// A node with 4 CPU slots, no GPU, a 1 GiB store and 1 MiB partitions.
pub fn ctx() -> Context {
    ctx_with(|_| {})
}

/// A test node with settings changed by `edit`.
pub fn ctx_with(edit: impl FnOnce(&mut NodeConfig)) -> Context {
    let mut config = NodeConfig {
        cpus: 4.0,
        gpus: Some(0.0),
        store_capacity: 1 << 30,
        target_partition_bytes: 1 << 20,
        ..NodeConfig::default()
    };
    edit(&mut config);
    Context::with_config(config).expect("a test node starts")
}

/// All values of an Int64 column across batches, sorted.
pub fn sorted_i64(batches: &[RecordBatch], column: &str) -> Vec<i64> {
    let mut v: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            b.column_by_name(column)
                .expect("column present")
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect();
    v.sort_unstable();
    v
}

/// A batch with an Int64 column `id` and a Utf8 column `name` (`n<id>`).
pub fn people(ids: std::ops::Range<i64>) -> RecordBatch {
    let names: Vec<String> = ids.clone().map(|i| format!("n{i}")).collect();
    RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(ids)) as ArrayRef,
        ),
        ("name", Arc::new(StringArray::from(names)) as ArrayRef),
    ])
    .unwrap()
}

/// Writes `batch` as one Parquet file.
pub fn write_parquet_file(path: &std::path::Path, batch: &RecordBatch) {
    let file = std::fs::File::create(path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// The names in `dir`, hidden ones too, sorted (none when it is absent).
pub fn visible_files(dir: &std::path::Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
