//! Parquet read from an S3-compatible store: moto's server, started here on
//! 127.0.0.1 from a Python that has it (`SB_PYTHON`, else `python3`;
//! `.ci/run` installs it). A prefix, a glob, columns with a filter that
//! prunes row groups, and the errors for a missing object and bucket.

mod common;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch, StringArray};
use common::ctx;
use streambatch::prelude::*;
use streambatch_bench::{S3Server, skip_test};

/// Four Parquet files of 2,500 rows (ids 0..10,000 in order, a name each),
/// row groups of 500 rows, as local files.
pub fn parquet_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    (0..4)
        .map(|f| {
            let ids: Vec<i64> = (f * 2_500..(f + 1) * 2_500).collect();
            let names: Vec<String> = ids.iter().map(|i| format!("n{i}")).collect();
            let batch = RecordBatch::try_from_iter([
                ("id", std::sync::Arc::new(Int64Array::from(ids)) as _),
                ("name", std::sync::Arc::new(StringArray::from(names)) as _),
            ])
            .unwrap();
            let path = dir.join(format!("part-{f}.parquet"));
            let props = parquet::file::properties::WriterProperties::builder()
                .set_max_row_group_row_count(Some(500))
                .build();
            let file = std::fs::File::create(&path).unwrap();
            let mut writer =
                parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
            writer.write(&batch).unwrap();
            writer.close().unwrap();
            path
        })
        .collect()
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    let mut ids: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let id = b.column_by_name("id").unwrap();
            id.as_primitive::<Int64Type>().values().to_vec()
        })
        .collect();
    ids.sort_unstable();
    ids
}

#[test]
fn parquet_reads_from_an_s3_prefix_a_glob_and_with_pruning() {
    let Some(s3) = S3Server::start() else {
        return skip_test(
            "parquet_reads_from_an_s3_prefix_a_glob_and_with_pruning",
            "no Python with moto's server (set SB_PYTHON, or pip install 'moto[server]')",
        );
    };
    for (key, value) in s3.env() {
        // SAFETY: this binary's one test sets these before any thread
        // reads the environment (the store's builder reads it on use).
        unsafe { std::env::set_var(key, value) };
    }
    s3.make_bucket("data");
    let dir = tempfile::tempdir().unwrap();
    for path in parquet_files(dir.path()) {
        let name = path.file_name().unwrap().to_str().unwrap();
        s3.put(
            "data",
            &format!("events/{name}"),
            &std::fs::read(&path).unwrap(),
        );
    }
    // Hidden and marker objects are not data.
    s3.put("data", "events/_SUCCESS", &[]);
    let ctx = ctx();
    let all = ctx.read_parquet("s3://data/events/").unwrap();
    assert_eq!(
        ids(&all.collect().unwrap()),
        (0..10_000).collect::<Vec<_>>()
    );
    let two = ctx
        .read_parquet("s3://data/events/part-[12].parquet")
        .unwrap();
    assert_eq!(
        ids(&two.collect().unwrap()),
        (2_500..7_500).collect::<Vec<_>>()
    );
    let one = ctx.read_parquet("s3://data/events/part-3.parquet").unwrap();
    assert_eq!(
        ids(&one.collect().unwrap()),
        (7_500..10_000).collect::<Vec<_>>()
    );
    // Only the id column, and only row groups that may hold ids >= 9,600.
    let pruned = ctx
        .read_parquet_columns("s3://data/events/", &["id"])
        .unwrap()
        .filter(col("id").gt_eq(lit(9_600i64)));
    let out = pruned.collect().unwrap();
    assert!(out.iter().all(|b| b.num_columns() == 1));
    assert_eq!(ids(&out), (9_600..10_000).collect::<Vec<_>>());
    // Missing: the URL named.
    let missing = ctx
        .read_parquet("s3://data/nothing/")
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(missing.contains("s3://data/nothing/"), "{missing}");
    let bucket = ctx
        .read_parquet("s3://no-such-bucket/x.parquet")
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(bucket.contains("s3://no-such-bucket/x.parquet"), "{bucket}");
}
