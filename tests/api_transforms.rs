//! Each transform against a direct computation on the same data.

mod common;

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use common::{ctx, sorted_i64};
use streambatch::prelude::*;

#[test]
fn map_applies_a_row_function() {
    let rows = ctx()
        .range(1000, 7)
        .map(|r: Row| {
            Ok::<_, UdfError>(
                Row::new()
                    .with("id", r.int("id").unwrap())
                    .with("sq", r.int("id").unwrap() * r.int("id").unwrap()),
            )
        })
        .iter_rows()
        .unwrap()
        .collect::<Result<Vec<_>>>()
        .unwrap();
    let mut got: Vec<(i64, i64)> = rows
        .iter()
        .map(|r| (r.int("id").unwrap(), r.int("sq").unwrap()))
        .collect();
    got.sort();
    assert_eq!(got, (0..1000).map(|i| (i, i * i)).collect::<Vec<_>>());
}

#[test]
fn map_batches_closure_and_batch_rows() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sizes = seen.clone();
    let out = ctx()
        .range(1000, 4)
        .map_batches(
            move |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                sizes.lock().unwrap().push(b.num_rows());
                let ids = b.column(0).as_primitive::<Int64Type>();
                let tripled: ArrayRef = Arc::new(Int64Array::from_iter_values(
                    ids.values().iter().map(|v| v * 3),
                ));
                Ok(RecordBatch::try_from_iter([
                    ("id", b.column(0).clone()),
                    ("t", tripled),
                ])?)
            },
            Resources::cpu(1.0).batch_rows(64),
        )
        .collect()
        .unwrap();
    assert_eq!(
        sorted_i64(&out, "t"),
        (0..1000).map(|i| i * 3).collect::<Vec<_>>()
    );
    // 4 partitions of 250 rows: 3 full batches of 64 and one of 58 each.
    let mut sizes = seen.lock().unwrap().clone();
    sizes.sort();
    assert_eq!(sizes, [vec![58; 4], vec![64; 12]].concat());
}

struct Offset {
    by: i64,
}

impl BatchFn for Offset {
    fn call(&mut self, b: RecordBatch) -> std::result::Result<RecordBatch, UdfError> {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let shifted: ArrayRef = Arc::new(Int64Array::from_iter_values(
            ids.values().iter().map(|v| v + self.by),
        ));
        Ok(RecordBatch::try_from_iter([("shifted", shifted)])?)
    }
}

#[test]
fn map_batches_stateful_operator() {
    let op = Stateful::new("offset", || Ok::<_, UdfError>(Offset { by: 1_000_000 }));
    let out = ctx()
        .range(500, 5)
        .map_batches(op, Resources::cpu(1.0).pool(1, 2))
        .collect()
        .unwrap();
    assert_eq!(
        sorted_i64(&out, "shifted"),
        (1_000_000..1_000_500).collect::<Vec<_>>()
    );
}

#[test]
fn flat_map_expands_rows() {
    let rows = ctx()
        .range(100, 3)
        .flat_map(|r: Row| {
            let id = r.int("id").unwrap();
            Ok::<_, UdfError>(
                (0..id % 4)
                    .map(|k| Row::new().with("id", id).with("k", k))
                    .collect(),
            )
        })
        .iter_rows()
        .unwrap()
        .collect::<Result<Vec<_>>>()
        .unwrap();
    let mut got: Vec<(i64, i64)> = rows
        .iter()
        .map(|r| (r.int("id").unwrap(), r.int("k").unwrap()))
        .collect();
    got.sort();
    let expected: Vec<(i64, i64)> = (0..100)
        .flat_map(|i| (0..i % 4).map(move |k| (i, k)))
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn filter_by_expression_and_by_closure() {
    let ctx = ctx();
    let by_expr = ctx
        .range(1000, 8)
        .filter((col("id") % lit(7)).eq(lit(3)).and(col("id").gt(lit(100))))
        .collect()
        .unwrap();
    let expected: Vec<i64> = (0..1000).filter(|i| i % 7 == 3 && *i > 100).collect();
    assert_eq!(sorted_i64(&by_expr, "id"), expected);
    let by_closure = ctx
        .range(1000, 8)
        .filter(|r: &Row| r.int("id").unwrap() % 7 == 3 && r.int("id").unwrap() > 100)
        .collect()
        .unwrap();
    assert_eq!(sorted_i64(&by_closure, "id"), expected);
    // A closure filter keeps the column types.
    assert_eq!(by_closure[0].schema(), by_expr[0].schema());
}

#[test]
fn select_and_with_column_compute_expressions() {
    let out = ctx()
        .range(300, 3)
        .with_column("half", col("id") / lit(2.0))
        .with_column("big", col("id").gt_eq(lit(150)))
        .select([col("id"), col("half"), col("big"), (col("id") * lit(10))])
        .collect()
        .unwrap();
    let schema = out[0].schema();
    let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["id", "half", "big", "(id * 10)"]);
    for b in &out {
        let id = b.column(0).as_primitive::<Int64Type>();
        let half = b.column(1).as_primitive::<Float64Type>();
        let big = b.column(2).as_boolean();
        let tens = b.column(3).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            let v = id.value(i);
            assert_eq!(half.value(i), v as f64 / 2.0);
            assert_eq!(big.value(i), v >= 150);
            assert_eq!(tens.value(i), v * 10);
        }
    }
    assert_eq!(sorted_i64(&out, "id"), (0..300).collect::<Vec<_>>());
}

#[test]
fn limit_takes_exactly_n_rows_from_the_source() {
    let out = ctx().range(10_000, 20).limit(1234).collect().unwrap();
    let ids = sorted_i64(&out, "id");
    assert_eq!(ids.len(), 1234);
    let mut dedup = ids.clone();
    dedup.dedup();
    assert_eq!(dedup.len(), 1234, "no row twice");
    assert!(ids.iter().all(|i| (0..10_000).contains(i)));
}

#[test]
fn a_limit_after_a_repartition_takes_n_of_its_rows() {
    // The repartition's groups go to the limit as rows: it runs no tasks.
    let out = ctx()
        .range(1000, 10)
        .repartition(4)
        .limit(100)
        .collect()
        .unwrap();
    let ids = sorted_i64(&out, "id");
    assert_eq!(ids.len(), 100);
    let mut dedup = ids.clone();
    dedup.dedup();
    assert_eq!(dedup.len(), 100, "no row twice");
}

#[test]
fn repartition_regroups_rows_evenly() {
    let ds = ctx().range(1003, 17).repartition(5);
    let out = ds.collect().unwrap();
    let mut sizes: Vec<usize> = out.iter().map(|b| b.num_rows()).collect();
    sizes.sort();
    assert_eq!(sizes, vec![200, 200, 201, 201, 201]);
    assert_eq!(sorted_i64(&out, "id"), (0..1003).collect::<Vec<_>>());
}

#[test]
fn consecutive_operators_with_equal_resources_fuse() {
    let ds = ctx()
        .range(10, 1)
        .filter(col("id").gt(lit(2)))
        .map_batches(|b: RecordBatch| Ok::<_, UdfError>(b), Resources::gpu(1.0))
        .named("gpu_op")
        .with_column("x", col("id"));
    assert_eq!(
        ds.explain().unwrap().stage_names(),
        vec!["range->filter", "gpu_op", "with_column"]
    );
}

#[test]
fn flat_map_batches_streams_generated_batches() {
    let out = ctx()
        .range(50, 5)
        .flat_map_batches(
            |b: RecordBatch| {
                let ids = b.column(0).as_primitive::<Int64Type>().values().to_vec();
                ids.into_iter().map(|id| {
                    let copies: ArrayRef = Arc::new(Int64Array::from_iter_values(
                        (0..id % 3).map(|k| id * 10 + k),
                    ));
                    RecordBatch::try_from_iter([("v", copies)])
                })
            },
            Resources::cpu(1.0).batch_rows(4),
        )
        .collect()
        .unwrap();
    let expected: Vec<i64> = (0..50)
        .flat_map(|id| (0..id % 3).map(move |k| id * 10 + k))
        .collect();
    assert_eq!(sorted_i64(&out, "v"), expected);
}

#[test]
fn an_operator_marked_no_fuse_keeps_a_stage_of_its_own() {
    let ds = ctx()
        .range(10, 1)
        .map_batches(|b: RecordBatch| Ok::<_, UdfError>(b), Resources::cpu(1.0))
        .named("expand")
        .map_batches(
            |b: RecordBatch| Ok::<_, UdfError>(b),
            Resources::cpu(1.0).no_fuse(),
        )
        .named("reduce")
        .map_batches(|b: RecordBatch| Ok::<_, UdfError>(b), Resources::cpu(1.0))
        .named("after");
    assert_eq!(
        ds.explain().unwrap().stage_names(),
        vec!["range->expand", "reduce", "after"]
    );
    assert_eq!(ds.count().unwrap(), 10);
}
