//! The all-to-all operators on one node, each against a direct
//! computation: `random_shuffle` and `distinct`, through the exchange.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch, StringArray};
use common::{ctx, ctx_with, sorted_i64};
use streambatch::prelude::*;

fn ids(batch: &RecordBatch) -> Vec<i64> {
    batch
        .column_by_name("id")
        .unwrap()
        .as_primitive::<Int64Type>()
        .values()
        .to_vec()
}

/// Each output partition's ids, the partitions in a fixed order (the
/// driver gets them in the order the reducers finish).
fn partitions(out: &[RecordBatch]) -> Vec<Vec<i64>> {
    let mut parts: Vec<Vec<i64>> = out.iter().map(ids).filter(|p| !p.is_empty()).collect();
    parts.sort();
    parts
}

#[test]
fn random_shuffle_moves_every_row_once_to_a_place_its_seed_fixes() {
    let ds = |seed| ctx().range(20_000, 8).random_shuffle(seed);
    let out = ds(7).collect().unwrap();
    assert_eq!(sorted_i64(&out, "id"), (0..20_000).collect::<Vec<_>>());
    assert_eq!(partitions(&out), partitions(&ds(7).collect().unwrap()));
    assert_ne!(partitions(&out), partitions(&ds(8).collect().unwrap()));
    // One reducer per source split; each holds rows of every split, in no
    // split's order.
    let parts = partitions(&out);
    assert_eq!(parts.len(), 8, "{:?}", parts.iter().map(Vec::len).collect::<Vec<_>>());
    for part in &parts {
        let splits: std::collections::BTreeSet<i64> = part.iter().map(|id| id / 2_500).collect();
        assert_eq!(splits.len(), 8, "a reducer got rows of {splits:?} only");
        assert!(part.windows(2).any(|w| w[0] > w[1]), "a reducer kept its rows in order");
        assert!(part.len() > 2_000 && part.len() < 3_000, "{} rows", part.len());
    }
}

#[test]
fn an_exchange_cuts_reducer_outputs_at_the_target_size() {
    // 64 KiB partitions: a reducer's 100,000 rows (800 KB of ids) leave in
    // several outputs, none above the target.
    let ctx = ctx_with(|c| c.target_partition_bytes = 64 << 10);
    let out = ctx.range(200_000, 2).random_shuffle(1).collect().unwrap();
    assert_eq!(sorted_i64(&out, "id"), (0..200_000).collect::<Vec<_>>());
    assert!(out.len() >= 20, "{} outputs", out.len());
    assert!(out.iter().all(|b| b.num_rows() * 8 <= 64 << 10));
}

#[test]
fn random_shuffle_of_nothing_and_of_one_row() {
    let empty = ctx().range(0, 1).random_shuffle(3).collect().unwrap();
    assert_eq!(empty.iter().map(RecordBatch::num_rows).sum::<usize>(), 0);
    let one = ctx().range(1, 1).random_shuffle(3).collect().unwrap();
    assert_eq!(sorted_i64(&one, "id"), [0]);
}

/// Rows (id, name) with duplicates and nulls in both columns.
fn with_duplicates() -> Vec<RecordBatch> {
    (0..6)
        .map(|part| {
            let ids: Vec<Option<i64>> = (0..500)
                .map(|i| ((i + part) % 7 != 0).then_some((i * 13 + part) % 40))
                .collect();
            let names: Vec<Option<String>> = (0..500)
                .map(|i| ((i + part) % 5 != 0).then(|| format!("n{}", i % 3)))
                .collect();
            RecordBatch::try_from_iter([
                ("id", Arc::new(Int64Array::from(ids)) as _),
                ("name", Arc::new(StringArray::from(names)) as _),
            ])
            .unwrap()
        })
        .collect()
}

type Key = (Option<i64>, Option<String>);

fn rows(batches: &[RecordBatch]) -> Vec<Key> {
    batches
        .iter()
        .flat_map(|b| {
            let ids: Vec<Option<i64>> = b.column(0).as_primitive::<Int64Type>().iter().collect();
            let names: Vec<Option<String>> = b
                .column(1)
                .as_string::<i32>()
                .iter()
                .map(|s| s.map(String::from))
                .collect();
            ids.into_iter().zip(names)
        })
        .collect()
}

#[test]
fn distinct_keeps_each_row_once_nulls_included() {
    let input = with_duplicates();
    let mut expected: Vec<Key> = rows(&input);
    expected.sort();
    expected.dedup();
    let out = ctx().from_batches(input).distinct().collect().unwrap();
    let mut got = rows(&out);
    got.sort();
    assert_eq!(got, expected);
    assert!(got.iter().any(|(id, name)| id.is_none() && name.is_none()));
    // Every row its own group, and all rows one group.
    let unique = ctx().range(3_000, 3).distinct().collect().unwrap();
    assert_eq!(sorted_i64(&unique, "id"), (0..3_000).collect::<Vec<_>>());
    let same: Vec<RecordBatch> = (0..4)
        .map(|_| RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from(vec![5; 100])) as _)]).unwrap())
        .collect();
    let one = ctx().from_batches(same).distinct().collect().unwrap();
    assert_eq!(sorted_i64(&one, "id"), [5]);
}

#[test]
fn an_exchange_after_a_limit_runs_its_map_side_as_a_task_of_its_own() {
    let ds = ctx().range(1_000, 4).limit(300).random_shuffle(2);
    let explain = ds.explain().unwrap();
    let kinds: Vec<&str> = explain.stages.iter().map(|s| s.kind).collect();
    assert_eq!(kinds, ["source", "limit", "map", "exchange", "map"]);
    assert!(explain.stages[2].cut.as_deref().unwrap().contains("at random into 4"));
    let text = explain.to_string();
    assert!(text.contains("exchange(4)") && text.contains("random_shuffle"), "{text}");
    let out = ds.collect().unwrap();
    let got = sorted_i64(&out, "id");
    assert_eq!(got.len(), 300);
    let mut dedup = got.clone();
    dedup.dedup();
    assert_eq!(dedup, got, "no row twice");
}

#[test]
fn later_operators_fuse_into_the_reducers() {
    let ds = ctx()
        .range(1_000, 4)
        .random_shuffle(2)
        .with_column("twice", col("id") * lit(2i64));
    let names = ds.explain().unwrap().stage_names();
    assert_eq!(names, ["range", "exchange(4)", "random_shuffle->with_column"]);
    let out = ds.collect().unwrap();
    let pairs: BTreeMap<i64, i64> = out
        .iter()
        .flat_map(|b| {
            ids(b).into_iter().zip(
                b.column_by_name("twice")
                    .unwrap()
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec(),
            )
        })
        .collect();
    assert_eq!(pairs.len(), 1_000);
    assert!(pairs.iter().all(|(id, twice)| *twice == id * 2));
    let stats = ds.stats().unwrap();
    let names: Vec<&str> = stats.operators.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"exchange(4)"), "{names:?}");
}
