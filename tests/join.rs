//! `join` and `union` on one node, each against a direct computation:
//! every kind of join with null keys, duplicates on both sides, keys on
//! one side only, no matches and an empty input; a union's rows.

mod common;

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use common::{ctx, ctx_with, sorted_i64};
use streambatch::prelude::*;

type Row = (Option<i64>, Option<String>, Option<String>);

/// Rows of `(k, <payload>)` in batches of `per_batch` (no rows: one
/// empty batch, which gives the schema).
fn table(payload: &str, rows: &[(Option<i64>, &str)], per_batch: usize) -> Vec<RecordBatch> {
    let chunks: Vec<&[(Option<i64>, &str)]> = match rows.is_empty() {
        true => vec![rows],
        false => rows.chunks(per_batch.max(1)).collect(),
    };
    chunks
        .into_iter()
        .map(|chunk| {
            let k: ArrayRef = Arc::new(Int64Array::from(
                chunk.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            ));
            let v: ArrayRef = Arc::new(StringArray::from(
                chunk.iter().map(|(_, v)| Some(*v)).collect::<Vec<_>>(),
            ));
            RecordBatch::try_from_iter([("k", k), (payload, v)]).unwrap()
        })
        .collect()
}

fn ints(b: &RecordBatch, name: &str) -> Vec<Option<i64>> {
    let c = b.column_by_name(name).unwrap().as_primitive::<Int64Type>();
    (0..c.len())
        .map(|i| c.is_valid(i).then(|| c.value(i)))
        .collect()
}

fn strings(b: &RecordBatch, name: &str) -> Vec<Option<String>> {
    let c = b.column_by_name(name).unwrap().as_string::<i32>();
    (0..c.len())
        .map(|i| c.is_valid(i).then(|| c.value(i).to_string()))
        .collect()
}

/// The output's rows as (k, a, b), sorted; `b` is none for semi and anti.
fn joined(out: &[RecordBatch]) -> Vec<Row> {
    let mut rows: Vec<Row> = out
        .iter()
        .flat_map(|b| {
            let (k, a) = (ints(b, "k"), strings(b, "a"));
            let r = match b.column_by_name("b") {
                Some(_) => strings(b, "b"),
                None => vec![None; b.num_rows()],
            };
            k.into_iter()
                .zip(a)
                .zip(r)
                .map(|((k, a), b)| (k, a, b))
                .collect::<Vec<_>>()
        })
        .collect();
    rows.sort();
    rows
}

/// The join computed directly: every pair compared.
fn direct(left: &[(Option<i64>, &str)], right: &[(Option<i64>, &str)], how: JoinHow) -> Vec<Row> {
    let matches = |l: Option<i64>, r: Option<i64>| l.is_some() && l == r;
    let mut rows = Vec::new();
    for (lk, la) in left {
        let hits: Vec<_> = right.iter().filter(|(rk, _)| matches(*lk, *rk)).collect();
        match how {
            JoinHow::Semi if !hits.is_empty() => rows.push((*lk, Some(la.to_string()), None)),
            JoinHow::Anti if hits.is_empty() => rows.push((*lk, Some(la.to_string()), None)),
            JoinHow::Semi | JoinHow::Anti => {}
            _ => {
                for (_, rb) in &hits {
                    rows.push((*lk, Some(la.to_string()), Some(rb.to_string())));
                }
                if hits.is_empty() && matches!(how, JoinHow::Left | JoinHow::Full) {
                    rows.push((*lk, Some(la.to_string()), None));
                }
            }
        }
    }
    if matches!(how, JoinHow::Right | JoinHow::Full) {
        for (rk, rb) in right {
            if !left.iter().any(|(lk, _)| matches(*lk, *rk)) {
                rows.push((*rk, None, Some(rb.to_string())));
            }
        }
    }
    rows.sort();
    rows
}

const HOWS: [JoinHow; 6] = JoinHow::ALL;

/// Every kind of join of `left` and `right` against the direct
/// computation: exchanged (hash joins) and, where the kind allows, with
/// the right input broadcast.
fn check_every_kind(left: &[(Option<i64>, &str)], right: &[(Option<i64>, &str)], per_batch: usize) {
    for broadcast in [0, 512 << 10] {
        let ctx = ctx_with(|c| c.broadcast_join_bytes = broadcast);
        let l = ctx.from_batches(table("a", left, per_batch));
        let r = ctx.from_batches(table("b", right, per_batch));
        for how in HOWS {
            let ds = l.join(&r, &["k"], how).unwrap();
            let explain = ds.explain().unwrap().to_string();
            let broadcasts = broadcast > 0 && !matches!(how, JoinHow::Right | JoinHow::Full);
            assert_eq!(explain.contains("broadcast"), broadcasts, "{explain}");
            assert_eq!(!explain.contains("exchange("), broadcasts, "{explain}");
            let out = ds.collect().unwrap();
            assert_eq!(
                joined(&out),
                direct(left, right, how),
                "{how:?} {broadcasts}"
            );
        }
    }
}

#[test]
fn every_kind_of_join_with_nulls_duplicates_on_both_sides_and_one_sided_keys() {
    let left: Vec<(Option<i64>, &str)> = vec![
        (Some(1), "l1"),
        (Some(2), "l2a"),
        (Some(2), "l2b"),
        (None, "lnull"),
        (Some(3), "l3"),
        (Some(5), "l5"),
        (None, "lnull2"),
        (Some(2), "l2c"),
    ];
    let right: Vec<(Option<i64>, &str)> = vec![
        (Some(2), "r2a"),
        (Some(4), "r4"),
        (None, "rnull"),
        (Some(2), "r2b"),
        (Some(1), "r1"),
        (Some(6), "r6"),
    ];
    check_every_kind(&left, &right, 3);
}

#[test]
fn joins_with_no_match_with_an_empty_side_and_on_many_rows() {
    let left: Vec<(Option<i64>, &str)> = (0..5).map(|k| (Some(k), "l")).collect();
    let right: Vec<(Option<i64>, &str)> = (10..14).map(|k| (Some(k), "r")).collect();
    check_every_kind(&left, &right, 2);
    check_every_kind(&left, &[], 2);
    check_every_kind(&[], &right, 2);
    // A hot key, and 3,000 keys over many batches.
    let left: Vec<(Option<i64>, &str)> = (0..3_000)
        .map(|i| (Some(if i % 3 == 0 { 7 } else { i % 1_000 }), "l"))
        .collect();
    let right: Vec<(Option<i64>, &str)> = (0..2_000)
        .map(|i| (Some(if i % 100 == 0 { 7 } else { i + 500 }), "r"))
        .collect();
    check_every_kind(&left, &right, 250);
}

#[test]
fn a_key_on_hundreds_of_rows_of_both_sides_joins_in_batches_of_64_ki_rows() {
    // 300 x 300 rows of key 7: 90,000 pairs, more than one output batch.
    let left: Vec<(Option<i64>, &str)> = (0..400)
        .map(|i| (Some(if i < 300 { 7 } else { i }), "l"))
        .collect();
    let right: Vec<(Option<i64>, &str)> = (0..350)
        .map(|i| (Some(if i < 300 { 7 } else { 1_000 + i }), "r"))
        .collect();
    check_every_kind(&left, &right, 64);
    for broadcast in [0, 512 << 10] {
        let ctx = ctx_with(|c| c.broadcast_join_bytes = broadcast);
        let l = ctx.from_batches(table("a", &left, 400));
        let r = ctx.from_batches(table("b", &right, 350));
        let out = l
            .join(&r, &["k"], JoinHow::Inner)
            .unwrap()
            .collect()
            .unwrap();
        assert_eq!(out.iter().map(RecordBatch::num_rows).sum::<usize>(), 90_000);
        assert!(out.iter().all(|b| b.num_rows() <= 64 << 10));
    }
}

/// A key on three quarters of the right's 20,000 rows: its reducer's
/// input is many times its budget (four 16 KiB partitions), so it joins
/// through buckets written to the store's spill directory (`join_spill`);
/// every kind of join equals the direct computation, and no bucket file
/// is left.
#[test]
fn a_reducer_whose_input_a_hot_key_swells_joins_through_buckets_on_disk() {
    let spill = tempfile::tempdir().unwrap();
    let ctx = ctx_with(|c| {
        c.broadcast_join_bytes = 0;
        c.target_partition_bytes = 16 << 10;
        c.spill_dir = spill.path().to_path_buf();
    });
    let names: Vec<String> = (0..20_000).map(|i| format!("p{i}")).collect();
    let left: Vec<(Option<i64>, &str)> = (0..2_000)
        .map(|i| ((i % 13 != 0).then_some(i % 500), names[i as usize].as_str()))
        .collect();
    let right: Vec<(Option<i64>, &str)> = (0..20_000)
        .map(|i| {
            let key = if i % 4 != 0 { 7 } else { 300 + i % 900 };
            ((i % 17 != 0).then_some(key), names[i as usize].as_str())
        })
        .collect();
    let l = ctx.from_batches(table("a", &left, 500));
    let r = ctx.from_batches(table("b", &right, 2_000));
    for how in HOWS {
        let ds = l.join(&r, &["k"], how).unwrap();
        let out = ds.collect().unwrap();
        assert_eq!(joined(&out), direct(&left, &right, how), "{how:?}");
        // The store (1 GiB) spills nothing here: these are the buckets' bytes.
        let spilled = ds.stats().unwrap().spilled_bytes;
        assert!(
            spilled > 64 << 10,
            "{how:?}: {spilled} bytes of buckets written"
        );
    }
    let left_behind: Vec<_> = std::fs::read_dir(spill.path())
        .unwrap()
        .flatten()
        .flat_map(|store| {
            std::fs::read_dir(store.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .filter(|f| f.file_name().to_string_lossy().contains("join-bucket"))
        .map(|f| f.path())
        .collect();
    assert!(left_behind.is_empty(), "{left_behind:?}");
}

#[test]
fn null_typed_keys_match_nothing_and_a_split_after_a_join_is_refused() {
    let ctx = ctx_with(|c| c.broadcast_join_bytes = 0);
    let nulls = |payload: &str, n: usize| {
        let k: ArrayRef = Arc::new(arrow_array::NullArray::new(n));
        let v: ArrayRef = Arc::new(StringArray::from(vec!["x"; n]));
        RecordBatch::try_from_iter([("k", k), (payload, v)]).unwrap()
    };
    let l = ctx.from_batches(vec![nulls("a", 3)]);
    let r = ctx.from_batches(vec![nulls("b", 2)]);
    let rows = |how| {
        let out = l.join(&r, &["k"], how).unwrap().collect().unwrap();
        out.iter().map(RecordBatch::num_rows).sum::<usize>()
    };
    assert_eq!(
        HOWS.map(rows),
        [0, 3, 2, 5, 0, 3],
        "inner, left, right, full, semi, anti"
    );
    // Each side of a train_test_split samples what its source reads: not
    // a sample of a join's output.
    let joined = l.join(&r, &["k"], JoinHow::Inner).unwrap();
    let err = joined.train_test_split(0.5, 1).err().unwrap().to_string();
    assert!(err.contains("after `join`"), "{err}");
}

#[test]
fn a_broadcast_join_after_an_aggregate_and_a_right_input_too_large_to_broadcast() {
    // The left input is an aggregate, which only a broadcast join takes.
    let ctx = ctx();
    let per_bucket = ctx
        .range(10_000, 4)
        .with_column("bucket", col("id") % lit(100i64))
        .groupby(&["bucket"])
        .aggregate(&[Agg::count()]);
    let names = ctx
        .range(50, 1)
        .with_column("bucket", col("id") * lit(2i64))
        .select([col("bucket")]);
    let even = per_bucket.join(&names, &["bucket"], JoinHow::Semi).unwrap();
    let out = even.collect().unwrap();
    let mut buckets = sorted_i64(&out, "bucket");
    buckets.dedup();
    assert_eq!(buckets, (0..50).map(|b| b * 2).collect::<Vec<_>>());
    assert_eq!(sorted_i64(&out, "count()"), vec![100; 50]);
    // Its right input over the limit: exchanged, and refused after the
    // aggregate, naming it.
    let small = ctx_with(|c| c.broadcast_join_bytes = 1 << 10);
    let left = small.range(1_000, 2);
    let right = small.range(1_000, 2);
    let ds = left.join(&right, &["id"], JoinHow::Inner).unwrap();
    assert!(ds.explain().unwrap().to_string().contains("exchange("));
    assert_eq!(ds.count().unwrap(), 1_000);
    let grouped = left.groupby(&["id"]).aggregate(&[Agg::count()]);
    let err = grouped.join(&right, &["id"], JoinHow::Inner).err().unwrap();
    assert!(err.to_string().contains("`aggregate`"), "{err}");
}

#[test]
fn join_on_differently_named_keys_of_two_columns_renames_a_clash() {
    let ctx = ctx();
    let left = ctx.range(1_000, 4).with_column("g", col("id") % lit(10i64));
    let right = ctx
        .range(20, 2)
        .with_column("key", col("id") % lit(10i64))
        .with_column("half", col("id") / lit(10i64));
    let out = left
        .join_on(&right, &["g", "id"], &["key", "half"], JoinHow::Inner)
        .unwrap();
    let schema = out.schema().unwrap();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["id", "g", "id_right", "key", "half"]);
    let batches = out.collect().unwrap();
    // Left rows with id < 2 match the right row (key = id % 10 = g, half = id).
    let mut got: Vec<(i64, i64)> = batches
        .iter()
        .flat_map(|b| {
            let id = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
            let r = b
                .column_by_name("id_right")
                .unwrap()
                .as_primitive::<Int64Type>();
            (0..b.num_rows())
                .map(|i| (id.value(i), r.value(i)))
                .collect::<Vec<_>>()
        })
        .collect();
    got.sort();
    assert_eq!(got, [(0, 0), (1, 11)]);
}

#[test]
fn a_join_refuses_what_it_cannot_run_naming_it() {
    // Exchanged: each input must fuse into a source task.
    let ctx = ctx_with(|c| c.broadcast_join_bytes = 0);
    let ids = ctx.range(10, 1);
    let strs = ctx.from_batches(table("a", &[(Some(1), "x")], 1));
    let texts = strs.with_column("id", col("a"));
    let err = |r: Result<Dataset>| r.err().expect("refused").to_string();
    let e = err(ids.join(&texts, &["id"], JoinHow::Inner));
    assert!(
        e.contains("`id`") && e.contains("Int64") && e.contains("Utf8"),
        "{e}"
    );
    let e = err(ids.join(&strs, &["nope"], JoinHow::Inner));
    assert!(e.contains("no key column `nope`"), "{e}");
    let e = err(ids.limit(3).join(&ids, &["id"], JoinHow::Inner));
    assert!(e.contains("`limit`"), "{e}");
    let e = err(ids.random_shuffle(1).union(&[&ids]));
    assert!(e.contains("`random_shuffle`"), "{e}");
}

#[test]
fn union_reads_every_input_with_its_own_operators() {
    let ctx = ctx();
    let a = ctx.range(1_000, 3);
    let b = ctx
        .range(500, 2)
        .with_column("id", col("id") + lit(10_000i64));
    let c = ctx.range(300, 1).filter(col("id").lt(lit(100i64)));
    let all = a.union(&[&b, &c]).unwrap();
    let mut expected: Vec<i64> = (0..1_000).chain(10_000..10_500).chain(0..100).collect();
    expected.sort();
    assert_eq!(sorted_i64(&all.collect().unwrap(), "id"), expected);
    // Operators after the union run on all of it; a union of a union.
    let doubled = all.with_column("id", col("id") * lit(2i64));
    let more = doubled.union(&[&ctx.range(2, 1)]).unwrap();
    let mut expected: Vec<i64> = expected.iter().map(|v| v * 2).chain([0, 1]).collect();
    expected.sort();
    assert_eq!(sorted_i64(&more.collect().unwrap(), "id"), expected);
    assert_eq!(more.count().unwrap(), 1_602);
    let explain = more.explain().unwrap().to_string();
    assert!(explain.contains("union(union("), "{explain}");
}

#[test]
fn a_join_then_a_groupby_and_a_sort() {
    // Sales of 100,000 rows over 50 products, joined with the products'
    // categories, summed by category.
    let ctx = ctx();
    let sales = ctx
        .range(100_000, 8)
        .with_column("product", col("id") % lit(50i64));
    let products = ctx
        .range(40, 2)
        .with_column("product", col("id"))
        .with_column("category", col("id") % lit(4i64))
        .select([col("product"), col("category")]);
    let by_category = sales
        .join(&products, &["product"], JoinHow::Inner)
        .unwrap()
        .groupby(&["category"])
        .aggregate(&[Agg::count(), Agg::sum("id")])
        .sort(&["category"], false);
    let out = by_category.collect().unwrap();
    let got: Vec<(i64, i64, i64)> = out
        .iter()
        .flat_map(|b| {
            let c = b.column(0).as_primitive::<Int64Type>();
            let n = b.column(1).as_primitive::<Int64Type>();
            let s = b.column(2).as_primitive::<Int64Type>();
            (0..b.num_rows())
                .map(|i| (c.value(i), n.value(i), s.value(i)))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut expected = vec![(0, 0, 0); 4];
    for id in 0..100_000i64 {
        let product = id % 50;
        if product < 40 {
            let e = &mut expected[(product % 4) as usize];
            *e = (product % 4, e.1 + 1, e.2 + id);
        }
    }
    assert_eq!(got, expected);
    let explain = by_category.explain().unwrap().to_string();
    // The 40 products are broadcast to the sales' tasks.
    assert!(
        explain.contains("with_column->join[inner, broadcast]"),
        "{explain}"
    );
}

#[test]
fn a_toml_pipeline_joins_and_unions() {
    let dir = tempfile::tempdir().unwrap();
    // The right input: ids 0..100 with their squares, as Parquet.
    let squares = ctx()
        .range(100, 2)
        .with_column("square", col("id") * col("id"));
    squares.write_parquet(dir.path().join("squares")).unwrap();
    let file = dir.path().join("p.toml");
    std::fs::write(
        &file,
        "[node]\ncpus = 2\ngpus = 0\n\n[source]\nrange = { n = 1000, partitions = 4 }\n\n\
         [[ops]]\nop = \"union\"\nwith = [{ range = { n = 50, partitions = 1 } }]\n\n\
         [[ops]]\nop = \"join\"\nwith = { read_parquet = \"squares\" }\non = [\"id\"]\n\n\
         [sink]\nwrite_parquet = \"out\"\n",
    )
    .unwrap();
    let explained = streambatch::pipeline::explain_pipeline(&file, None).unwrap();
    assert!(
        explained.contains("union(range, range)->join[inner, broadcast]"),
        "{explained}"
    );
    streambatch::pipeline::run_pipeline(&file).unwrap();
    let out = ctx()
        .read_parquet(&dir.path().join("out").display().to_string())
        .unwrap()
        .collect()
        .unwrap();
    // Ids 0..50 twice (both inputs of the union), 50..100 once.
    let mut expected: Vec<i64> = (0..100).chain(0..50).collect();
    expected.sort();
    assert_eq!(sorted_i64(&out, "id"), expected);
    let mut squares: Vec<i64> = expected.iter().map(|v| v * v).collect();
    squares.sort();
    assert_eq!(sorted_i64(&out, "square"), squares);
    // A join that is not one is named with the file.
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("on = [", "how = \"outer\"\non = [")).unwrap();
    let err = streambatch::pipeline::run_pipeline(&file)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("p.toml") && err.contains("no join `outer`"),
        "{err}"
    );
}

#[test]
fn the_stats_and_the_timeline_show_what_crossed_each_exchange() {
    let ctx = ctx_with(|c| c.broadcast_join_bytes = 0);
    let left = ctx.range(10_000, 4);
    let right = ctx.range(5_000, 2);
    let joined = left.join(&right, &["id"], JoinHow::Inner).unwrap();
    assert_eq!(joined.count().unwrap(), 5_000);
    let stats = joined.stats().unwrap();
    // One exchange: the two inputs' 15,000 ids (8 bytes each, and the
    // partitions' framing) crossed it once.
    assert_eq!(stats.exchanges.len(), 1, "{stats}");
    let crossed = stats.exchanges[0];
    assert_eq!(crossed.rows, 15_000);
    assert!(crossed.bytes >= 15_000 * 8, "{crossed:?}");
    let stage = &stats.operators[crossed.stage];
    assert!(stage.name.starts_with("exchange("), "{}", stage.name);
    assert_eq!((stage.rows, stage.bytes), (crossed.rows, crossed.bytes));
    let trace = streambatch::timeline::chrome_trace(&stats).to_string();
    assert!(trace.contains("\"exchanged bytes\""), "no exchange counter");
    assert!(
        trace.contains(&format!("\"bytes\":{}", crossed.bytes)),
        "{trace}"
    );
}
