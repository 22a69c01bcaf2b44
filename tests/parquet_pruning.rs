//! Row-group pruning: a `filter` right after `read_parquet` reads only the
//! row groups whose statistics allow a match, and its rows are exactly the
//! rows the predicate selects from the whole file.

mod common;

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use common::ctx;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use streambatch::prelude::*;

const ROWS: i64 = 10_000;
const GROUP_ROWS: usize = 1_000;

/// Ten row groups: `id` sorted, `name` sorted (`n00000`...), `score` with
/// a NaN in group 3, `maybe` null in groups 0-4 and `id` in 5-9.
fn input() -> RecordBatch {
    let id = Int64Array::from_iter_values(0..ROWS);
    let name = StringArray::from_iter_values((0..ROWS).map(|i| format!("n{i:05}")));
    let score = Float64Array::from_iter_values((0..ROWS).map(|i| {
        if i == 3_500 {
            f64::NAN
        } else {
            i as f64 / 10.0
        }
    }));
    let maybe = Int64Array::from_iter((0..ROWS).map(|i| (i >= 5_000).then_some(i)));
    RecordBatch::try_from_iter([
        ("id", Arc::new(id) as ArrayRef),
        ("name", Arc::new(name) as ArrayRef),
        ("score", Arc::new(score) as ArrayRef),
        ("maybe", Arc::new(maybe) as ArrayRef),
    ])
    .unwrap()
}

fn write(path: &std::path::Path, batch: &RecordBatch) {
    write_with(path, batch, WriterProperties::builder());
}

/// `batch` in row groups of [`GROUP_ROWS`], with the writer's other
/// settings from `props`.
fn write_with(
    path: &std::path::Path,
    batch: &RecordBatch,
    props: parquet::file::properties::WriterPropertiesBuilder,
) {
    let props = props.set_max_row_group_row_count(Some(GROUP_ROWS)).build();
    let mut w = ArrowWriter::try_new(
        std::fs::File::create(path).unwrap(),
        batch.schema(),
        Some(props),
    )
    .unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// The ids `predicate` selects from `batch`, directly.
fn selected(batch: &RecordBatch, predicate: &Expr) -> Vec<i64> {
    let mask = predicate.evaluate_predicate(batch).unwrap();
    let kept = arrow_select::filter::filter_record_batch(batch, &mask).unwrap();
    kept.column(0).as_primitive::<Int64Type>().values().to_vec()
}

#[test]
fn a_filter_after_read_parquet_reads_only_the_row_groups_that_can_match() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sorted.parquet");
    let batch = input();
    write(&path, &batch);
    let ctx = ctx();
    // Each predicate, with the row groups it must read at most.
    let cases: Vec<(Expr, u64)> = vec![
        (col("id").gt_eq(lit(9_500)), 1),
        (col("id").lt(lit(1_000)), 1),
        (lit(2_500).eq(col("id")), 1),
        (lit(1_000).gt(col("id")), 1),
        (col("id").not_eq(lit(5)), 10),
        (col("id").gt(lit(ROWS)), 0),
        (col("id").lt(lit(1_500)).or(col("id").gt_eq(lit(8_000))), 4),
        (col("id").gt_eq(lit(2_000)).and(col("id").lt(lit(4_000))), 2),
        (
            col("name")
                .gt_eq(lit("n07000"))
                .and(col("name").lt(lit("n08000"))),
            1,
        ),
        (col("maybe").is_null(), 5),
        (col("maybe").is_null().not(), 5),
        // NaN sits outside min and max: the group holding one may match.
        (col("score").gt(lit(900.0)), 2),
        // Not a column against a constant: nothing is known, all are read.
        ((col("id") % lit(1_000)).eq(lit(0)), 10),
        // The part that is known prunes; the other keeps what it may.
        (
            col("id")
                .lt(lit(1_000))
                .and((col("id") % lit(7)).eq(lit(0))),
            1,
        ),
    ];
    for (predicate, most_groups) in cases {
        let ds = ctx
            .read_parquet(path.to_str().unwrap())
            .unwrap()
            .filter(predicate.clone());
        let mut got = common::sorted_i64(&ds.collect().unwrap(), "id");
        got.sort_unstable();
        assert_eq!(got, selected(&batch, &predicate), "rows of `{predicate}`");
        let read = ds.stats().unwrap().operators[0].ops[0].rows;
        assert!(
            read <= most_groups * GROUP_ROWS as u64,
            "`{predicate}` read {read} rows, at most {most_groups} row groups expected"
        );
    }
}

#[test]
fn filters_one_after_another_prune_by_all_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sorted.parquet");
    let batch = input();
    write(&path, &batch);
    let ds = ctx()
        .read_parquet(path.to_str().unwrap())
        .unwrap()
        .filter(col("id").gt_eq(lit(2_000)))
        .filter(col("id").lt(lit(4_000)))
        .filter(col("name").gt_eq(lit("n03500")));
    let got = common::sorted_i64(&ds.collect().unwrap(), "id");
    // Each filter alone would read two row groups or more; together, one.
    assert_eq!(got, (3_500..4_000).collect::<Vec<_>>());
    assert_eq!(
        ds.stats().unwrap().operators[0].ops[0].rows,
        GROUP_ROWS as u64
    );
}

#[test]
fn pruning_keeps_the_filters_own_errors_and_what_it_cannot_judge() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sorted.parquet");
    let batch = input();
    write(&path, &batch);
    let ctx = ctx();
    // A column the read leaves out: the filter's error, whatever pruning
    // would have kept.
    let err = ctx
        .read_parquet_columns(path.to_str().unwrap(), &["name"])
        .unwrap()
        .filter(col("id").gt(lit(ROWS)))
        .count()
        .unwrap_err();
    assert!(err.to_string().contains("no column `id`"), "{err}");
    // ... also when a later filter could prune by a column that is read.
    let err = ctx
        .read_parquet_columns(path.to_str().unwrap(), &["name"])
        .unwrap()
        .filter(col("id").gt(lit(ROWS)))
        .filter(col("name").gt_eq(lit("zzz")))
        .count()
        .unwrap_err();
    assert!(err.to_string().contains("no column `id`"), "{err}");
    // A predicate that is not boolean: an error from the job, not a panic.
    let err = ctx
        .read_parquet(path.to_str().unwrap())
        .unwrap()
        .filter(col("id").not())
        .count()
        .unwrap_err();
    assert!(err.to_string().contains("not boolean"), "{err}");

    // Without statistics nothing is known: every row group is read.
    let bare = dir.path().join("bare.parquet");
    let no_stats = WriterProperties::builder()
        .set_statistics_enabled(parquet::file::properties::EnabledStatistics::None);
    write_with(&bare, &batch, no_stats);
    for predicate in [col("maybe").is_null(), col("id").gt_eq(lit(9_500))] {
        let ds = ctx
            .read_parquet(bare.to_str().unwrap())
            .unwrap()
            .filter(predicate.clone());
        let got = common::sorted_i64(&ds.collect().unwrap(), "id");
        assert_eq!(got, selected(&batch, &predicate), "rows of `{predicate}`");
        assert_eq!(
            ds.stats().unwrap().operators[0].ops[0].rows,
            ROWS as u64,
            "`{predicate}`"
        );
    }

    // Row groups of one value each pruned by `!=` that value, and a
    // dictionary column (its bounds are values): every group read.
    let ones = Int64Array::from_iter_values((0..ROWS).map(|i| i / GROUP_ROWS as i64));
    let colours: arrow_array::DictionaryArray<arrow_array::types::Int32Type> = (0..ROWS)
        .map(|i| ["red", "green"][(i / GROUP_ROWS as i64) as usize % 2])
        .collect();
    let other = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..ROWS)) as ArrayRef,
        ),
        ("group", Arc::new(ones) as ArrayRef),
        ("colour", Arc::new(colours) as ArrayRef),
    ])
    .unwrap();
    let path = dir.path().join("groups.parquet");
    write(&path, &other);
    for (predicate, groups) in [
        (col("group").not_eq(lit(3)), 9),
        (col("colour").eq(lit("red")), 10),
    ] {
        let ds = ctx
            .read_parquet(path.to_str().unwrap())
            .unwrap()
            .filter(predicate.clone());
        let got = common::sorted_i64(&ds.collect().unwrap(), "id");
        assert_eq!(got, selected(&other, &predicate), "rows of `{predicate}`");
        let read = ds.stats().unwrap().operators[0].ops[0].rows;
        assert_eq!(read, groups * GROUP_ROWS as u64, "`{predicate}`");
    }
}

#[test]
fn a_filter_after_another_operator_reads_every_row_group() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sorted.parquet");
    write(&path, &input());
    let ds = ctx()
        .read_parquet(path.to_str().unwrap())
        .unwrap()
        .select([col("id")])
        .filter(col("id").gt_eq(lit(9_500)));
    assert_eq!(ds.count().unwrap(), 500);
    assert_eq!(ds.stats().unwrap().operators[0].ops[0].rows, ROWS as u64);
}
