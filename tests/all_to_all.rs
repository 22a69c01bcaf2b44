//! The all-to-all operators on one node, each against a direct
//! computation: `random_shuffle` and `distinct`, through the exchange.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
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
    assert_eq!(
        parts.len(),
        8,
        "{:?}",
        parts.iter().map(Vec::len).collect::<Vec<_>>()
    );
    for part in &parts {
        let splits: std::collections::BTreeSet<i64> = part.iter().map(|id| id / 2_500).collect();
        assert_eq!(splits.len(), 8, "a reducer got rows of {splits:?} only");
        assert!(
            part.windows(2).any(|w| w[0] > w[1]),
            "a reducer kept its rows in order"
        );
        assert!(
            part.len() > 2_000 && part.len() < 3_000,
            "{} rows",
            part.len()
        );
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
fn an_exchange_over_large_files_has_a_reducer_per_partition_of_their_bytes() {
    // One file of about 1.6 MB of ids read as one split, with 256 KiB
    // partitions: reducers for its bytes, not one for its split.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ids.parquet");
    let ctx = ctx_with(|c| c.target_partition_bytes = 256 << 10);
    ctx.range(200_000, 1)
        .with_column("x", col("id") * lit(7i64))
        .write_parquet_file(&file)
        .unwrap();
    let bytes = std::fs::metadata(&file).unwrap().len();
    let ds = ctx.read_parquet(&file.display().to_string()).unwrap();
    let expected = bytes.div_ceil(256 << 10) as usize;
    assert!(expected > 1, "{bytes} bytes");
    assert_eq!(ds.exchange_partitions(), expected);
    let out = ds.random_shuffle(2).collect().unwrap();
    assert_eq!(sorted_i64(&out, "id"), (0..200_000).collect::<Vec<_>>());
    assert!(
        ds.random_shuffle(2)
            .explain()
            .unwrap()
            .to_string()
            .contains(&format!("exchange({expected})")),
    );
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

/// Column `i` of `b`, Int64 with nulls.
fn ints(b: &RecordBatch, i: usize) -> Vec<Option<i64>> {
    b.column(i).as_primitive::<Int64Type>().iter().collect()
}

/// Column `i` of `b`, Utf8 with nulls.
fn strings(b: &RecordBatch, i: usize) -> Vec<Option<String>> {
    let column = b.column(i).as_string::<i32>();
    column.iter().map(|s| s.map(String::from)).collect()
}

fn rows(batches: &[RecordBatch]) -> Vec<Key> {
    batches
        .iter()
        .flat_map(|b| ints(b, 0).into_iter().zip(strings(b, 1)))
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
        .map(|_| {
            RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from(vec![5; 100])) as _)])
                .unwrap()
        })
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
    assert!(
        explain.stages[2]
            .cut
            .as_deref()
            .unwrap()
            .contains("at random into 4")
    );
    let text = explain.to_string();
    assert!(
        text.contains("exchange(4)") && text.contains("random_shuffle"),
        "{text}"
    );
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
    assert_eq!(
        names,
        ["range", "exchange(4)", "random_shuffle->with_column"]
    );
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
    let exchange = stats
        .operators
        .iter()
        .find(|s| s.name == "exchange(4)")
        .unwrap_or_else(|| panic!("no exchange in the stats: {stats}"));
    // Every row crossed it, 8 bytes of id each at least.
    assert_eq!(exchange.rows, 1_000, "{stats}");
    assert!(exchange.bytes >= 8_000, "{stats}");
}

/// Rows (k: key with nulls and one hot value, x: Int64 with nulls,
/// y: Float64) over 5 batches.
fn grouped_input(rows: i64) -> Vec<RecordBatch> {
    (0..5)
        .map(|part| {
            let range = (part * rows / 5)..((part + 1) * rows / 5);
            // Half the rows share key 0 (a hot key); a tenth have none.
            let k: Vec<Option<i64>> = range
                .clone()
                .map(|i| match i % 10 {
                    0 => None,
                    1..=5 => Some(0),
                    _ => Some(i % 37),
                })
                .collect();
            let x: Vec<Option<i64>> = range
                .clone()
                .map(|i| (i % 7 != 3).then_some(i % 101 - 50))
                .collect();
            let y: Vec<f64> = range.map(|i| (i % 13) as f64 * 0.5).collect();
            RecordBatch::try_from_iter([
                ("k", Arc::new(Int64Array::from(k)) as _),
                ("x", Arc::new(Int64Array::from(x)) as _),
                ("y", Arc::new(arrow_array::Float64Array::from(y)) as _),
            ])
            .unwrap()
        })
        .collect()
}

/// Per group: count, sum(x), min(x), max(x), mean(y), std(y), distinct x.
#[derive(Debug, PartialEq)]
struct Expected {
    count: i64,
    sum: Option<i64>,
    min: Option<i64>,
    max: Option<i64>,
    mean: f64,
    std: Option<f64>,
    distinct: i64,
}

fn direct(input: &[RecordBatch]) -> BTreeMap<Option<i64>, Expected> {
    // Per key: its x values and y values.
    type Values = (Vec<Option<i64>>, Vec<f64>);
    let mut by_key: BTreeMap<Option<i64>, Values> = BTreeMap::new();
    for b in input {
        let k = b.column(0).as_primitive::<Int64Type>();
        let x = b.column(1).as_primitive::<Int64Type>();
        let y = b
            .column(2)
            .as_primitive::<arrow_array::types::Float64Type>();
        for i in 0..b.num_rows() {
            let entry = by_key.entry(k.is_valid(i).then(|| k.value(i))).or_default();
            entry.0.push(x.is_valid(i).then(|| x.value(i)));
            entry.1.push(y.value(i));
        }
    }
    by_key
        .into_iter()
        .map(|(k, (xs, ys))| {
            let xs_valid: Vec<i64> = xs.iter().flatten().copied().collect();
            let n = ys.len() as f64;
            let mean = ys.iter().sum::<f64>() / n;
            let var = ys.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / (n - 1.0);
            let distinct: std::collections::BTreeSet<i64> = xs_valid.iter().copied().collect();
            (
                k,
                Expected {
                    count: xs.len() as i64,
                    sum: (!xs_valid.is_empty()).then(|| xs_valid.iter().sum()),
                    min: xs_valid.iter().min().copied(),
                    max: xs_valid.iter().max().copied(),
                    mean,
                    std: (ys.len() > 1).then(|| var.sqrt()),
                    distinct: distinct.len() as i64,
                },
            )
        })
        .collect()
}

fn aggregated(out: &[RecordBatch]) -> BTreeMap<Option<i64>, Expected> {
    let mut got = BTreeMap::new();
    for b in out {
        let int = |name: &str| {
            b.column_by_name(name)
                .unwrap()
                .as_primitive::<Int64Type>()
                .clone()
        };
        let float = |name: &str| {
            b.column_by_name(name)
                .unwrap()
                .as_primitive::<arrow_array::types::Float64Type>()
                .clone()
        };
        let (k, count, sum, min, max) = (
            int("k"),
            int("count()"),
            int("sum(x)"),
            int("min(x)"),
            int("max(x)"),
        );
        let (mean, std, distinct) = (float("mean(y)"), float("std(y)"), int("count_distinct(x)"));
        let opt = |a: &arrow_array::Int64Array, i| a.is_valid(i).then(|| a.value(i));
        for i in 0..b.num_rows() {
            let e = Expected {
                count: count.value(i),
                sum: opt(&sum, i),
                min: opt(&min, i),
                max: opt(&max, i),
                mean: mean.value(i),
                std: std.is_valid(i).then(|| std.value(i)),
                distinct: distinct.value(i),
            };
            assert!(got.insert(opt(&k, i), e).is_none(), "a group twice");
        }
    }
    got
}

fn aggs() -> Vec<Agg> {
    vec![
        Agg::count(),
        Agg::sum("x"),
        Agg::min("x"),
        Agg::max("x"),
        Agg::mean("y"),
        Agg::std("y"),
        Agg::count_distinct("x"),
    ]
}

/// Floats compared to 1e-9 relative: a sum's order differs.
fn assert_close(got: &BTreeMap<Option<i64>, Expected>, expected: &BTreeMap<Option<i64>, Expected>) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    for (k, e) in expected {
        let g = &got[k];
        assert_eq!(
            (g.count, g.sum, g.min, g.max, g.distinct),
            (e.count, e.sum, e.min, e.max, e.distinct),
            "group {k:?}"
        );
        assert!(
            close(g.mean, e.mean),
            "group {k:?}: {} vs {}",
            g.mean,
            e.mean
        );
        match (g.std, e.std) {
            (Some(a), Some(b)) => assert!(close(a, b), "group {k:?}: {a} vs {b}"),
            (a, b) => assert_eq!(a, b, "group {k:?}"),
        }
    }
}

#[test]
fn groupby_aggregates_as_a_direct_computation_with_nulls_and_a_hot_key() {
    let input = grouped_input(20_000);
    let expected = direct(&input);
    let ds = ctx().from_batches(input).groupby(&["k"]).aggregate(&aggs());
    let got = aggregated(&ds.collect().unwrap());
    assert_close(&got, &expected);
    assert!(got[&Some(0)].count >= 10_000, "the hot key");
    assert!(got.contains_key(&None), "the null key");
    // The map side aggregates before the exchange: the stage names say so.
    let names = ds.explain().unwrap().stage_names();
    assert_eq!(
        names,
        [
            "from_batches->partial_aggregate",
            "exchange(5)",
            "aggregate"
        ]
    );
}

#[test]
fn groupby_with_every_row_its_own_group_one_group_and_no_rows() {
    // Every row its own group: keys 0..n.
    let out = ctx()
        .range(5_000, 4)
        .groupby(&["id"])
        .aggregate(&[Agg::count(), Agg::sum("id")])
        .collect()
        .unwrap();
    assert_eq!(out.iter().map(RecordBatch::num_rows).sum::<usize>(), 5_000);
    for b in &out {
        let count = b
            .column_by_name("count()")
            .unwrap()
            .as_primitive::<Int64Type>();
        assert!(count.values().iter().all(|&c| c == 1));
        assert_eq!(
            ids(b),
            b.column_by_name("sum(id)")
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        );
    }
    // No keys: one group of every row.
    let all = ctx()
        .range(5_000, 4)
        .groupby(&[])
        .aggregate(&[Agg::count(), Agg::sum("id"), Agg::max("id")])
        .collect()
        .unwrap();
    let rows: Vec<_> = all.iter().filter(|b| b.num_rows() > 0).collect();
    assert_eq!(rows.len(), 1);
    let col = |n: &str| {
        rows[0]
            .column_by_name(n)
            .unwrap()
            .as_primitive::<Int64Type>()
            .value(0)
    };
    assert_eq!(
        (col("count()"), col("sum(id)"), col("max(id)")),
        (5_000, (0..5_000).sum(), 4_999)
    );
    // No rows: no groups.
    let none = ctx()
        .range(0, 1)
        .groupby(&["id"])
        .aggregate(&[Agg::count()])
        .collect()
        .unwrap();
    assert_eq!(none.iter().map(RecordBatch::num_rows).sum::<usize>(), 0);
    // A key that is not there is named.
    let err = ctx()
        .range(10, 1)
        .groupby(&["nope"])
        .aggregate(&[Agg::count()])
        .collect()
        .unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
}

#[test]
fn a_toml_pipeline_shuffles_dedups_and_aggregates() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    let write = |aggs: &str| {
        let text = format!(
            "[node]\ncpus = 2\ngpus = 0\n\n[source]\nrange = {{ n = 1000, partitions = 4 }}\n\n\
             [[ops]]\nop = \"random_shuffle\"\nseed = 3\n\n[[ops]]\nop = \"distinct\"\n\n\
             [[ops]]\nop = \"sort\"\nkeys = [\"id\"]\ndescending = true\n\n\
             [[ops]]\nop = \"groupby\"\nkeys = []\naggs = {aggs}\n\n\
             [sink]\nwrite_parquet = \"out\"\n"
        );
        std::fs::write(&file, text).unwrap();
    };
    write(r#"["count()", "sum(id)", "max(id)"]"#);
    let explained = streambatch::pipeline::explain_pipeline(&file, None).unwrap();
    assert!(
        explained.contains("exchange(4)") && explained.contains("aggregate"),
        "{explained}"
    );
    streambatch::pipeline::run_pipeline(&file).unwrap();
    let out = ctx()
        .read_parquet(&dir.path().join("out").display().to_string())
        .unwrap()
        .collect()
        .unwrap();
    let rows: Vec<&RecordBatch> = out.iter().filter(|b| b.num_rows() > 0).collect();
    assert_eq!(rows.len(), 1);
    let col = |n: &str| {
        rows[0]
            .column_by_name(n)
            .unwrap()
            .as_primitive::<Int64Type>()
            .value(0)
    };
    assert_eq!(
        (col("count()"), col("sum(id)"), col("max(id)")),
        (1000, 499_500, 999)
    );
    // A sort then a limit: the 5 greatest ids.
    std::fs::write(
        &file,
        "[node]\ncpus = 2\ngpus = 0\n\n[source]\nrange = { n = 1000, partitions = 4 }\n\n\
         [[ops]]\nop = \"random_shuffle\"\nseed = 3\n\n\
         [[ops]]\nop = \"sort\"\nkeys = [\"id\"]\ndescending = true\n\n\
         [[ops]]\nop = \"limit\"\nn = 5\n\n[sink]\nwrite_parquet = \"top\"\n",
    )
    .unwrap();
    streambatch::pipeline::run_pipeline(&file).unwrap();
    let top = ctx()
        .read_parquet(&dir.path().join("top").display().to_string())
        .unwrap()
        .collect()
        .unwrap();
    assert_eq!(sorted_i64(&top, "id"), [995, 996, 997, 998, 999]);
    write(r#"["median(id)"]"#);
    let err = streambatch::pipeline::run_pipeline(&file)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("p.toml") && err.contains("median(id)"),
        "{err}"
    );
}

/// Rows (a: Int64 with nulls and repeats, b: Utf8 with nulls, id) over 6
/// batches, in no order.
fn unsorted(rows: i64) -> Vec<RecordBatch> {
    (0..6)
        .map(|part| {
            let range: Vec<i64> = (part * rows / 6..(part + 1) * rows / 6).collect();
            let a: Vec<Option<i64>> = range
                .iter()
                .map(|i| (i % 11 != 4).then_some((i * 7_919) % 503 - 250))
                .collect();
            let b: Vec<Option<String>> = range
                .iter()
                .map(|i| (i % 13 != 6).then(|| format!("s{}", (i * 31) % 17)))
                .collect();
            RecordBatch::try_from_iter([
                ("a", Arc::new(Int64Array::from(a)) as _),
                ("b", Arc::new(StringArray::from(b)) as _),
                ("id", Arc::new(Int64Array::from(range)) as _),
            ])
            .unwrap()
        })
        .collect()
}

/// (a, b, id) of every row, in the order of the batches.
fn abs(batches: &[RecordBatch]) -> Vec<(Option<i64>, Option<String>, i64)> {
    batches
        .iter()
        .flat_map(|b| {
            let (a, s, id) = (ints(b, 0), strings(b, 1), ids(b));
            a.into_iter().zip(s).zip(id).map(|((a, s), id)| (a, s, id))
        })
        .collect()
}

/// `Option`'s order with `None` last (ascending) and first (descending).
fn key_order(x: &Option<i64>, y: &Option<i64>, descending: bool) -> std::cmp::Ordering {
    let ord = match (x, y) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, _) => std::cmp::Ordering::Greater,
        (_, None) => std::cmp::Ordering::Less,
        (Some(x), Some(y)) => x.cmp(y),
    };
    if descending { ord.reverse() } else { ord }
}

#[test]
fn sort_orders_every_row_by_its_keys_with_nulls_last_then_first_descending() {
    let input = unsorted(30_000);
    for descending in [false, true] {
        let ds = ctx().from_batches(input.clone()).sort(&["a"], descending);
        let out = ds.collect().unwrap();
        let got = abs(&out);
        let mut expected = abs(&input);
        expected.sort_by(|x, y| key_order(&x.0, &y.0, descending));
        let keys = |rows: &[(Option<i64>, Option<String>, i64)]| {
            rows.iter().map(|r| r.0).collect::<Vec<_>>()
        };
        assert_eq!(keys(&got), keys(&expected), "descending {descending}");
        let (mut g, mut e) = (got.clone(), expected.clone());
        g.sort();
        e.sort();
        assert_eq!(g, e, "the same rows");
        assert!(out.len() > 1, "one output: nothing was exchanged");
    }
}

#[test]
fn sort_by_two_keys_and_a_stable_order_within_a_reducer() {
    let input = unsorted(12_000);
    let out = ctx()
        .from_batches(input.clone())
        .sort(&["b", "a"], false)
        .collect()
        .unwrap();
    let got = abs(&out);
    let mut expected = abs(&input);
    let string_order = |x: &Option<String>, y: &Option<String>| match (x, y) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, _) => std::cmp::Ordering::Greater,
        (_, None) => std::cmp::Ordering::Less,
        (Some(x), Some(y)) => x.cmp(y),
    };
    expected.sort_by(|x, y| string_order(&x.1, &y.1).then(key_order(&x.0, &y.0, false)));
    let keys = |rows: &[(Option<i64>, Option<String>, i64)]| {
        rows.iter().map(|r| (r.1.clone(), r.0)).collect::<Vec<_>>()
    };
    assert_eq!(keys(&got), keys(&expected));
}

#[test]
fn sort_of_nothing_of_one_key_and_in_outputs_cut_at_the_target() {
    let none = ctx().range(0, 3).sort(&["id"], false).collect().unwrap();
    assert_eq!(none.iter().map(RecordBatch::num_rows).sum::<usize>(), 0);
    // One key for every row: one range holds them all.
    let same: Vec<RecordBatch> = (0..4)
        .map(|p| {
            RecordBatch::try_from_iter([
                ("k", Arc::new(Int64Array::from(vec![9; 500])) as _),
                (
                    "id",
                    Arc::new(Int64Array::from_iter_values(p * 500..(p + 1) * 500)) as _,
                ),
            ])
            .unwrap()
        })
        .collect();
    let one = ctx()
        .from_batches(same)
        .sort(&["k"], false)
        .collect()
        .unwrap();
    assert_eq!(sorted_i64(&one, "id"), (0..2_000).collect::<Vec<_>>());
    // Every row its own key, outputs of 64 KiB: many outputs, in order.
    let ctx = ctx_with(|c| c.target_partition_bytes = 64 << 10);
    let out = ctx
        .range(200_000, 8)
        .random_shuffle(5)
        .sort(&["id"], true)
        .collect()
        .unwrap();
    assert!(out.len() >= 20, "{} outputs", out.len());
    let got: Vec<i64> = out.iter().flat_map(ids).collect();
    assert_eq!(got, (0..200_000).rev().collect::<Vec<_>>());
    // A limit after a sort takes the first rows in order.
    let top = ctx
        .range(10_000, 8)
        .random_shuffle(1)
        .sort(&["id"], false)
        .limit(10);
    let first: Vec<i64> = top.collect().unwrap().iter().flat_map(ids).collect();
    assert_eq!(first, (0..10).collect::<Vec<_>>());
    let missing = ctx
        .range(10, 2)
        .sort(&["nope"], false)
        .collect()
        .unwrap_err();
    assert!(missing.to_string().contains("nope"), "{missing}");
}

/// A sort takes its ranges from samples its map tasks keep as the input
/// streams: the pipeline before it runs once over each row (no sampling
/// pass before the job), and the ranges hold about equal rows.
#[test]
fn a_sort_reads_its_input_once_and_cuts_even_ranges() {
    let rows = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = rows.clone();
    let count = move |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
        seen.fetch_add(b.num_rows(), std::sync::atomic::Ordering::Relaxed);
        Ok(b)
    };
    let ctx = ctx_with(|c| c.target_partition_bytes = 64 << 10);
    let ds = ctx
        .range(100_000, 8)
        .random_shuffle(3)
        .map_batches(count, Resources::cpu(1.0))
        .sort(&["id"], false);
    let out = ds.collect().unwrap();
    let got: Vec<i64> = out.iter().flat_map(ids).collect();
    assert_eq!(got, (0..100_000).collect::<Vec<_>>());
    assert_eq!(rows.load(std::sync::atomic::Ordering::Relaxed), 100_000);
    // Distinct keys: as many ranges as reducers asked for, one per split.
    let stats = ds.stats().unwrap();
    let sort = stats
        .operators
        .iter()
        .find(|o| o.name.starts_with("sort"))
        .unwrap_or_else(|| panic!("no sort in the stats: {stats}"));
    assert_eq!((sort.tasks, sort.rows), (8, 100_000), "{stats}");
    let explain = ds.explain().unwrap().to_string();
    assert!(
        explain.contains("ranges of id sampled as it streams"),
        "{explain}"
    );
}

/// A hot key: nine rows in ten share one key, so one reducer's range is
/// many times the target size; it sorts its range as runs written to the
/// store's spill directory and merged (`sort_runs`), the output in order
/// with every row, and no run file left behind.
#[test]
fn a_sort_whose_range_a_hot_key_swells_merges_runs_from_disk() {
    let spill = tempfile::tempdir().unwrap();
    let ctx = ctx_with(|c| {
        c.target_partition_bytes = 64 << 10;
        c.spill_dir = spill.path().to_path_buf();
    });
    let rows = 300_000i64;
    let input: Vec<RecordBatch> = (0..6)
        .map(|part| {
            let ids: Vec<i64> = (part * rows / 6..(part + 1) * rows / 6).collect();
            let keys: Vec<Option<i64>> = ids
                .iter()
                .map(|i| match i % 10 {
                    0 => Some((i * 7_919) % 100_003),
                    7 => None,
                    _ => Some(50_000),
                })
                .collect();
            RecordBatch::try_from_iter([
                ("a", Arc::new(Int64Array::from(keys)) as _),
                ("id", Arc::new(Int64Array::from(ids)) as _),
            ])
            .unwrap()
        })
        .collect();
    for descending in [false, true] {
        let ds = ctx.from_batches(input.clone()).sort(&["a"], descending);
        let out = ds.collect().unwrap();
        // The store (1 GiB) spills nothing here: these are the runs' bytes.
        let spilled = ds.stats().unwrap().spilled_bytes;
        assert!(spilled > 1 << 20, "{spilled} bytes of runs written");
        let got: Vec<Option<i64>> = out.iter().flat_map(|b| ints(b, 0)).collect();
        let mut expected: Vec<Option<i64>> = input.iter().flat_map(|b| ints(b, 0)).collect();
        expected.sort_by(|x, y| key_order(x, y, descending));
        assert_eq!(got, expected, "descending {descending}");
        assert_eq!(sorted_i64(&out, "id"), (0..rows).collect::<Vec<_>>());
    }
    let left: Vec<_> = walk(spill.path())
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("sort-run"))
        .collect();
    assert!(left.is_empty(), "run files left: {left:?}");
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| match e.path() {
            p if p.is_dir() => walk(&p),
            p => vec![p],
        })
        .collect()
}

#[test]
fn map_groups_calls_its_function_once_per_whole_group() {
    let input = grouped_input(20_000);
    let expected = direct(&input);
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    // One row per group: its key, rows and the sum of x; a call that sees
    // two keys fails the job.
    let per_group = move |group: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let k = group.column(0).as_primitive::<Int64Type>();
        let key = k.is_valid(0).then(|| k.value(0));
        if (0..k.len()).any(|i| (k.is_valid(i).then(|| k.value(i))) != key) {
            return Err("a call saw two groups".into());
        }
        let x = group.column(1).as_primitive::<Int64Type>();
        let sum: i64 = x.iter().flatten().sum();
        Ok(RecordBatch::try_from_iter([
            ("k", Arc::new(Int64Array::from(vec![key])) as _),
            (
                "rows",
                Arc::new(Int64Array::from(vec![group.num_rows() as i64])) as _,
            ),
            ("sum", Arc::new(Int64Array::from(vec![sum])) as _),
        ])?)
    };
    let out = ctx()
        .from_batches(input)
        .groupby(&["k"])
        .map_groups(per_group, Resources::cpu(1.0).batch_rows(7))
        .collect()
        .unwrap();
    let mut got = BTreeMap::new();
    for b in &out {
        let col = |i: usize| b.column(i).as_primitive::<Int64Type>().clone();
        let (k, rows, sum) = (col(0), col(1), col(2));
        for i in 0..b.num_rows() {
            let key = k.is_valid(i).then(|| k.value(i));
            assert!(
                got.insert(key, (rows.value(i), sum.value(i))).is_none(),
                "{key:?} twice"
            );
        }
    }
    let want: BTreeMap<Option<i64>, (i64, i64)> = expected
        .iter()
        .map(|(k, e)| (*k, (e.count, e.sum.unwrap_or(0))))
        .collect();
    assert_eq!(got, want);
    assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), want.len());
}

#[test]
fn unique_keeps_each_value_of_a_column_once_null_included() {
    let input = with_duplicates();
    let mut expected: Vec<Option<String>> = rows(&input).into_iter().map(|(_, n)| n).collect();
    expected.sort();
    expected.dedup();
    let out = ctx().from_batches(input).unique("name").collect().unwrap();
    assert!(out.iter().all(|b| b.num_columns() == 1));
    let mut got: Vec<Option<String>> = out.iter().flat_map(|b| strings(b, 0)).collect();
    got.sort();
    assert_eq!(got, expected);
    assert!(got.contains(&None));
}
