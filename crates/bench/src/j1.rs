//! J1 (docs/workloads.md): TPC-H-shaped `lineitem` (6 million rows) joined
//! with `orders` (1.5 million) on the order key, revenue summed by the
//! order's priority, read from the Parquet files `tools/bench/j1.py make`
//! writes: `read_parquet -> with_column(revenue) -> join -> groupby ->
//! aggregate`, one job. The answer is given as its checksum (groups, then
//! the sum over the groups of each aggregate column), which the harness
//! compares with DuckDB's.

use std::path::Path;
use std::time::Instant;

use arrow_array::RecordBatch;
use streambatch::{Agg, Context, Error, JoinHow, NodeConfig, Result, col, lit};

use crate::BenchResult;
use crate::g1::column_sum;

/// J1 over the tables in `dir` (`lineitem/` and `orders/`), on an embedded
/// node of `base`'s settings.
pub fn j1(dir: &Path, base: &NodeConfig) -> Result<BenchResult> {
    if !dir.join("orders/part-3.parquet").exists() {
        return Err(Error::Invalid(format!(
            "no J1 tables in {}: make them with `.venv-bench/bin/python tools/bench/j1.py make {}`",
            dir.display(),
            dir.display()
        )));
    }
    let ctx = Context::with_config(base.clone())?;
    let table = |name: &str| dir.join(name).display().to_string();
    let started = Instant::now();
    let lineitem = ctx
        .read_parquet_columns(
            &table("lineitem"),
            &["l_orderkey", "l_extendedprice", "l_discount"],
        )?
        .with_column(
            "revenue",
            col("l_extendedprice") * (lit(1.0) - col("l_discount")),
        )
        .select([col("l_orderkey"), col("revenue")]);
    let orders = ctx.read_parquet_columns(&table("orders"), &["o_orderkey", "o_orderpriority"])?;
    let aggs = [Agg::count(), Agg::sum("revenue")];
    let ds = lineitem
        .join_on(&orders, &["l_orderkey"], &["o_orderkey"], JoinHow::Inner)?
        .groupby(&["o_orderpriority"])
        .aggregate(&aggs);
    let out: Vec<RecordBatch> = ds.collect()?;
    let wall = started.elapsed();
    let groups: usize = out.iter().map(RecordBatch::num_rows).sum();
    let mut checksum = vec![groups as f64];
    for agg in &aggs {
        let name = agg.name();
        checksum.push(
            out.iter()
                .map(|b| b.column_by_name(&name).map_or(f64::NAN, |c| column_sum(c)))
                .sum::<f64>(),
        );
    }
    let joined = checksum[1];
    let correct = groups == 5 && checksum.iter().all(|x| x.is_finite());
    let mut result = BenchResult::new(
        "j1",
        "lineitem 6M x orders 1.5M, revenue by priority".into(),
        wall,
        if joined.is_finite() { joined as u64 } else { 0 },
        &ds.stats().unwrap_or_default(),
        &ctx.store_stats(),
        correct,
    );
    result.extra = vec![("checksums".into(), serde_json::json!([checksum]))];
    Ok(result)
}
