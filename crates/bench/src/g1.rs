//! G1 (docs/workloads.md): the H2O db-benchmark's groupby questions 1-5 on
//! its 10-million-row table, read from the Parquet files
//! `tools/bench/g1.py make` writes, each question a job of
//! `read_parquet_columns -> groupby -> aggregate`. Each answer is given as
//! its checksum (groups, then the sum over the groups of each aggregate
//! column), which the harness compares with DuckDB's.

use std::path::Path;
use std::time::Instant;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{Array, RecordBatch};
use streambatch::{Agg, Context, Error, NodeConfig, Result};

use crate::BenchResult;

/// Rows of the table.
pub const G1_ROWS: u64 = 10_000_000;

/// Keys and aggregates of questions 1-5, as `tools/bench/g1.py` has them.
fn questions() -> Vec<(Vec<&'static str>, Vec<Agg>)> {
    vec![
        (vec!["id1"], vec![Agg::sum("v1")]),
        (vec!["id1", "id2"], vec![Agg::sum("v1")]),
        (vec!["id3"], vec![Agg::sum("v1"), Agg::mean("v3")]),
        (
            vec!["id4"],
            vec![Agg::mean("v1"), Agg::mean("v2"), Agg::mean("v3")],
        ),
        (
            vec!["id6"],
            vec![Agg::sum("v1"), Agg::sum("v2"), Agg::sum("v3")],
        ),
    ]
}

/// The sum of a numeric column's values, as f64 (NaN for another type).
pub(crate) fn column_sum(column: &dyn Array) -> f64 {
    if let Some(ints) = column.as_primitive_opt::<Int64Type>() {
        return ints.iter().flatten().map(|v| v as f64).sum();
    }
    match column.as_primitive_opt::<Float64Type>() {
        Some(floats) => floats.iter().flatten().sum(),
        None => f64::NAN,
    }
}

/// G1 over the Parquet files in `dir`, on an embedded node of `base`'s
/// settings.
pub fn g1(dir: &Path, base: &NodeConfig) -> Result<BenchResult> {
    if !dir.join("part-7.parquet").exists() {
        return Err(Error::Invalid(format!(
            "no G1 table in {}: make it with `.venv-bench/bin/python tools/bench/g1.py make {}`",
            dir.display(),
            dir.display()
        )));
    }
    let ctx = Context::with_config(base.clone())?;
    let path = dir.display().to_string();
    let started = Instant::now();
    let mut checksums = Vec::new();
    let mut seconds = Vec::new();
    let mut stats = None;
    for (keys, aggs) in questions() {
        let asked = Instant::now();
        let mut columns: Vec<&str> = keys.clone();
        for agg in &aggs {
            let column = agg.column.as_deref().expect("G1 aggregates name a column");
            if !columns.contains(&column) {
                columns.push(column);
            }
        }
        let ds = ctx
            .read_parquet_columns(&path, &columns)?
            .groupby(&keys)
            .aggregate(&aggs);
        let out: Vec<RecordBatch> = ds.collect()?;
        let groups: usize = out.iter().map(RecordBatch::num_rows).sum();
        let mut checksum = vec![groups as f64];
        for agg in &aggs {
            let name = agg.name();
            let sum = out
                .iter()
                .map(|b| b.column_by_name(&name).map_or(f64::NAN, |c| column_sum(c)))
                .sum::<f64>();
            checksum.push(sum);
        }
        checksums.push(checksum);
        seconds.push(asked.elapsed().as_secs_f64());
        stats = ds.stats();
    }
    let wall = started.elapsed();
    let correct = checksums
        .iter()
        .all(|c| c[0] > 0.0 && c.iter().all(|x| x.is_finite()));
    let mut result = BenchResult::new(
        "g1",
        "G1_1e7_1e2_0_0, questions 1-5".into(),
        wall,
        G1_ROWS * checksums.len() as u64,
        &stats.unwrap_or_default(),
        &ctx.store_stats(),
        correct,
    );
    result.extra = vec![
        ("checksums".into(), serde_json::json!(checksums)),
        (
            "question_s".into(),
            serde_json::json!(seconds.iter().map(|s| crate::round(*s)).collect::<Vec<_>>()),
        ),
    ];
    Ok(result)
}
