//! The in-process workloads W1 (a heterogeneous pipeline under a memory
//! cap), W2 (memory-limited expansion) and W3 (scheduling overhead), each
//! run on one node of this process and checked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, BinaryArray, Int64Array, RecordBatch};
use streambatch::{Context, NodeConfig, Resources, Result, UdfError};

use crate::rows::{Rows, W1_ROW_BYTES, check_rows, filled_rows, taking};
use crate::{BenchResult, ProgressLines, check_ids};

/// W1: the paper's heterogeneous pipeline under a memory cap, scaled 1/10.
/// 8 CPU and 4 GPU logical slots; `produce` (0.5 s per 5 rows, 10 MiB rows)
/// -> `consume` (0.05 s per row, a new 10 MiB row) -> `inference` (1 GPU,
/// 0.05 s per row; checks every byte of each row, outputs its id; a row
/// not holding its bytes fails the job). Correct when each id of 0..800
/// comes out exactly once.
pub fn w1(store_cap: u64, base: &NodeConfig, progress: &mut ProgressLines) -> Result<BenchResult> {
    let config = NodeConfig {
        cpus: 8.0,
        gpus: Some(4.0),
        store_capacity: store_cap,
        ..base.clone()
    };
    let ctx = Context::with_config(config)?;
    let started = Instant::now();
    let ds = ctx
        .range(800, 160)
        .flat_map_batches(
            // Each row in a buffer of its own, as a producer of rows makes them.
            |b: RecordBatch| {
                let ids = b.column(0);
                taking(Duration::from_millis(500), || {
                    (0..ids.len())
                        .map(|i| filled_rows(&ids.slice(i, 1), W1_ROW_BYTES, Rows::Heap))
                        .collect::<Vec<_>>()
                })
            },
            Resources::cpu(1.0).batch_rows(5),
        )
        .named("produce")
        .map_batches(
            |b: RecordBatch| {
                taking(Duration::from_millis(50), || {
                    filled_rows(b.column(0), W1_ROW_BYTES, Rows::Output)
                })
            },
            Resources::cpu(1.0).batch_rows(1),
        )
        .named("consume")
        .map_batches(
            |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                // The check of every byte is part of the stage's 0.05 s.
                taking(Duration::from_millis(50), || check_rows(&b, W1_ROW_BYTES))?;
                Ok(b.project(&[0])?)
            },
            Resources::gpu(1.0).batch_rows(1),
        )
        .named("inference");
    let ids = check_ids(&ds, progress, 800)?;
    let wall = started.elapsed();
    let stats = ds.stats().unwrap_or_default();
    let config = format!("store_cap={}", streambatch::format_bytes(store_cap));
    let rows = progress.rows();
    let correct = ids.each_once();
    Ok(BenchResult {
        ideal: Some(Duration::from_secs_f64((160.0 * 0.5 + 800.0 * 0.05) / 8.0)),
        ..BenchResult::new(
            "w1",
            config,
            wall,
            rows,
            &stats,
            &ctx.store_stats(),
            correct,
        )
    })
}

/// The untimed run W3 makes first, on the same node, before its timed
/// shape: rows and partitions (the peers' scripts warm up with the same).
pub const W3_WARM_UP: (u64, usize) = (1_000, 20);

/// W3: scheduling overhead. `rows` one-integer rows in `partitions`
/// partitions through a no-op `map_batches`, then count; timed after one
/// untimed run of [`W3_WARM_UP`]'s shape on the same node.
pub fn w3(rows: u64, partitions: usize, base: &NodeConfig) -> Result<BenchResult> {
    let ctx = Context::with_config(base.clone())?;
    let no_op = |ctx: &Context, rows: u64, partitions: usize| {
        let ds = ctx
            .range(rows, partitions)
            .map_batches(|b: RecordBatch| Ok::<_, UdfError>(b), Resources::cpu(1.0));
        ds.count().map(|count| (count as u64, ds))
    };
    no_op(&ctx, W3_WARM_UP.0, W3_WARM_UP.1)?;
    let started = Instant::now();
    let (count, ds) = no_op(&ctx, rows, partitions)?;
    let wall = started.elapsed();
    let stats = ds.stats().unwrap_or_default();
    let config = format!("rows={rows},partitions={partitions}");
    Ok(BenchResult::new(
        "w3",
        config,
        wall,
        count,
        &stats,
        &ctx.store_stats(),
        count == rows,
    ))
}

/// Bytes of one W2 row: 10 MiB and one byte, so that a row of the constant
/// byte `v` sums to `v` mod 256.
const W2_ROW_BYTES: usize = (10 << 20) + 1;

/// W2: memory-limited expansion with real bytes. 100 rows; stage A makes 10
/// rows of 10 MiB per row (10 GiB in all), one at a time; stage B (`no_fuse`,
/// so it runs as its own stage and every row crosses the store) reduces each
/// row to its byte sum mod 256 in about 20 ms. Count and check every sum.
pub fn w2(store_cap: u64, base: &NodeConfig, progress: &mut ProgressLines) -> Result<BenchResult> {
    let config = NodeConfig {
        store_capacity: store_cap,
        ..base.clone()
    };
    let ctx = Context::with_config(config)?;
    let started = Instant::now();
    let ds = ctx
        .range(100, 100)
        .flat_map_batches(
            |b: RecordBatch| {
                let id = b.column(0).as_primitive::<Int64Type>().value(0);
                (0..10i64).map(move |k| -> std::result::Result<RecordBatch, UdfError> {
                    let value = ((id * 10 + k) % 251) as u8;
                    let data: ArrayRef = Arc::new(BinaryArray::from_vec(vec![
                        vec![value; W2_ROW_BYTES].as_slice(),
                    ]));
                    let key: ArrayRef = Arc::new(Int64Array::from(vec![id * 10 + k]));
                    Ok(RecordBatch::try_from_iter([("key", key), ("data", data)])?)
                })
            },
            Resources::cpu(1.0).batch_rows(1),
        )
        .named("expand")
        .map_batches(
            |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                let data = b
                    .column_by_name("data")
                    .ok_or("no column `data`")?
                    .as_binary::<i32>();
                let sums: Int64Array = taking(Duration::from_millis(20), || {
                    data.iter()
                        .map(|d| d.map(|d| d.iter().map(|&x| x as i64).sum::<i64>() % 256))
                        .collect()
                });
                let key = b.column_by_name("key").ok_or("no column `key`")?.clone();
                Ok(RecordBatch::try_from_iter([
                    ("key", key),
                    ("sum", Arc::new(sums) as ArrayRef),
                ])?)
            },
            // Its own stage: fused with `expand`, a task would hold ten
            // 10 MiB rows and the stage's budget would cover both.
            Resources::cpu(1.0).no_fuse().batch_rows(1),
        )
        .named("reduce");
    let mut correct = true;
    for batch in ds.iter_batches()? {
        let batch = batch?;
        progress.add(batch.num_rows() as u64);
        let keys = batch.column(0).as_primitive::<Int64Type>();
        let sums = batch.column(1).as_primitive::<Int64Type>();
        correct &= keys
            .values()
            .iter()
            .zip(sums.values())
            .all(|(k, s)| *s == k % 251);
    }
    let wall = started.elapsed();
    let rows = progress.rows();
    let stats = ds.stats().unwrap_or_default();
    let config = format!("store_cap={}", streambatch::format_bytes(store_cap));
    Ok(BenchResult::new(
        "w2",
        config,
        wall,
        rows,
        &stats,
        &ctx.store_stats(),
        correct && rows == 1000,
    ))
}
