//! Each consuming call against a direct computation, Parquet round trips
//! included.

mod common;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_schema::DataType;
use common::{ctx, people, sorted_i64, visible_files};
use streambatch::prelude::*;

#[test]
fn iter_batches_streams_all_rows() {
    let total: i64 = ctx()
        .range(5000, 9)
        .iter_batches()
        .unwrap()
        .map(|b| {
            b.unwrap()
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .iter()
                .sum::<i64>()
        })
        .sum();
    assert_eq!(total, (0..5000).sum::<i64>());
}

#[test]
fn iter_batches_with_cuts_exact_batches_and_shuffles_every_row_once() {
    let ds = ctx().range(1000, 7);
    let ids = |options: BatchOptions| -> (Vec<usize>, Vec<i64>) {
        let batches: Vec<RecordBatch> = ds
            .iter_batches_with(options)
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        let sizes = batches.iter().map(RecordBatch::num_rows).collect();
        let ids = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        (sizes, ids)
    };
    let (sizes, mut in_order) = ids(BatchOptions::rows(64));
    assert_eq!(sizes.iter().sum::<usize>(), 1000);
    assert!(
        sizes[..sizes.len() - 1].iter().all(|&n| n == 64),
        "{sizes:?}"
    );
    assert_eq!(sizes.last(), Some(&(1000 % 64)));
    in_order.sort_unstable();
    assert_eq!(in_order, (0..1000).collect::<Vec<_>>());
    let (sizes, shuffled) = ids(BatchOptions::rows(64).drop_last(true).local_shuffle(300, 3));
    assert_eq!(sizes, vec![64; 1000 / 64]);
    assert!(shuffled.windows(2).any(|w| w[0] > w[1]), "no row moved");
    let mut once = shuffled.clone();
    once.sort_unstable();
    once.dedup();
    assert_eq!(once.len(), shuffled.len(), "a row came twice");
}

#[test]
fn iter_rows_and_take() {
    let ctx = ctx();
    let rows: Vec<Row> = ctx
        .from_batches(vec![people(0..50)])
        .iter_rows()
        .unwrap()
        .collect::<Result<_>>()
        .unwrap();
    assert_eq!(rows.len(), 50);
    for r in &rows {
        assert_eq!(r.str("name").unwrap(), format!("n{}", r.int("id").unwrap()));
    }
    let taken = ctx
        .from_batches(vec![people(0..50), people(50..100)])
        .take(7)
        .unwrap();
    assert_eq!(taken.len(), 7);
    for r in &taken {
        assert_eq!(r.str("name").unwrap(), format!("n{}", r.int("id").unwrap()));
    }
}

#[test]
fn count_matches() {
    let ctx = ctx();
    assert_eq!(ctx.range(12_345, 11).count().unwrap(), 12_345);
    assert_eq!(
        ctx.range(100, 4)
            .filter(col("id").lt(lit(10)))
            .count()
            .unwrap(),
        10
    );
}

#[test]
fn schema_known_without_running_and_computed_when_needed() {
    let ctx = ctx();
    let ds = ctx.range(10, 2).with_column("half", col("id") / lit(2.0));
    let schema = ds.schema().unwrap();
    assert_eq!(schema.field(1).data_type(), &DataType::Float64);
    assert!(ds.stats().is_none(), "the static schema ran no job");
    let mapped = ds
        .map(|r: Row| Ok::<_, UdfError>(Row::new().with("s", format!("{}", r.int("id").unwrap()))));
    assert_eq!(
        mapped.schema().unwrap().field(0).data_type(),
        &DataType::Utf8
    );
}

#[test]
fn write_parquet_round_trips_values() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let ctx = ctx();
    let written = ctx
        .from_batches(vec![people(0..300), people(300..1000)])
        .write_parquet(&out)
        .unwrap();
    assert!(!written.is_empty());
    assert!(
        visible_files(&out)
            .iter()
            .all(|f| f.starts_with("part-") && f.ends_with(".parquet")),
        "{:?}",
        visible_files(&out)
    );
    let back = ctx
        .read_parquet(out.to_str().unwrap())
        .unwrap()
        .iter_rows()
        .unwrap()
        .collect::<Result<Vec<_>>>()
        .unwrap();
    let mut got: Vec<(i64, String)> = back
        .iter()
        .map(|r| (r.int("id").unwrap(), r.str("name").unwrap().to_string()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        (0..1000).map(|i| (i, format!("n{i}"))).collect::<Vec<_>>()
    );
    // A second write replaces the first.
    ctx.range(10, 1).write_parquet(&out).unwrap();
    assert_eq!(
        ctx.read_parquet(out.to_str().unwrap())
            .unwrap()
            .count()
            .unwrap(),
        10
    );
}

#[test]
fn csv_to_parquet_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from("a,b\n");
    for i in 0..100 {
        text.push_str(&format!("{i},{}\n", i * i));
    }
    std::fs::write(dir.path().join("in.csv"), text).unwrap();
    let ctx = ctx();
    ctx.read_csv(dir.path().join("in.csv").to_str().unwrap())
        .unwrap()
        .write_parquet(dir.path().join("pq"))
        .unwrap();
    let back = ctx
        .read_parquet(dir.path().join("pq").to_str().unwrap())
        .unwrap()
        .collect()
        .unwrap();
    let mut pairs: Vec<(i64, i64)> = back
        .iter()
        .flat_map(|b| {
            let a = b.column(0).as_primitive::<Int64Type>().values().to_vec();
            let c = b.column(1).as_primitive::<Int64Type>().values().to_vec();
            a.into_iter().zip(c)
        })
        .collect();
    pairs.sort();
    assert_eq!(pairs, (0..100).map(|i| (i, i * i)).collect::<Vec<_>>());
}

#[test]
fn materialize_keeps_results_and_stats() {
    let ctx = ctx();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = calls.clone();
    let ds = ctx.range(100, 4).map_batches(
        move |b: RecordBatch| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, UdfError>(b)
        },
        Resources::cpu(1.0),
    );
    let m = ds.materialize().unwrap();
    let after_first = calls.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        sorted_i64(&m.collect().unwrap(), "id"),
        (0..100).collect::<Vec<_>>()
    );
    assert_eq!(m.count().unwrap(), 100);
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        after_first,
        "materialized data is not recomputed"
    );
}

#[test]
fn stats_count_tasks_rows_and_bytes_per_operator() {
    let ds = ctx()
        .range(1000, 10)
        .map_batches(|b: RecordBatch| Ok::<_, UdfError>(b), Resources::cpu(0.5))
        .named("noop");
    assert_eq!(ds.count().unwrap(), 1000);
    let stats = ds.stats().unwrap();
    assert_eq!(stats.operators.len(), 2);
    assert_eq!(stats.operators[0].name, "range");
    assert_eq!(
        (
            stats.operators[0].tasks,
            stats.operators[0].rows,
            stats.operators[0].bytes
        ),
        (10, 1000, 8000)
    );
    assert_eq!(
        (
            stats.operators[1].name.as_str(),
            stats.operators[1].tasks,
            stats.operators[1].rows
        ),
        ("noop", 10, 1000)
    );
    assert!(stats.peak_store_bytes >= 800 && stats.peak_store_bytes <= stats.store_capacity);
    let table = stats.to_string();
    assert!(
        table.contains("noop") && table.contains("rows in/s") && table.contains("rows out"),
        "{table}"
    );
}
