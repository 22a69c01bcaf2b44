//! S1 (docs/workloads.md): 40 million rows of a 10-byte random key and a
//! 90-byte random payload (4 GB, the Parquet files `tools/bench/s1.py
//! make` writes) sorted by key through a store capped at 512 MiB and
//! written as Parquet: `read_parquet -> sort -> write_parquet`, one job
//! (after the sort's sampling job). `tools/bench/s1.py run streambatch`
//! runs it and checks the output's order, rows and checksum as it checks
//! every system's; here `correct` says that the files written hold as many
//! rows as the input.

use std::path::Path;
use std::time::Instant;

use streambatch::{Context, Error, NodeConfig, Result};

use crate::BenchResult;

/// S1 from `input` into `output` (replaced), on an embedded node of
/// `base`'s settings; the sort job's timeline written to `timeline` when
/// given (`base` must then record it).
pub fn s1(
    input: &Path,
    output: &Path,
    base: &NodeConfig,
    timeline: Option<&Path>,
) -> Result<BenchResult> {
    if !input.join("part-39.parquet").exists() {
        return Err(Error::Invalid(format!(
            "no S1 input in {}: make it with `.venv-bench/bin/python tools/bench/s1.py make {}`",
            input.display(),
            input.parent().unwrap_or(input).display()
        )));
    }
    let ctx = Context::with_config(base.clone())?;
    let source = ctx.read_parquet(&input.display().to_string())?;
    let rows_in = source.count()?;
    let started = Instant::now();
    let sorted = source.sort(&["key"], false);
    let files = sorted.write_parquet(output)?;
    let wall = started.elapsed();
    if let Some(path) = timeline {
        sorted.write_timeline(path)?;
    }
    let written = ctx.read_parquet(&output.display().to_string())?.count()?;
    let mut result = BenchResult::new(
        "s1",
        format!("{rows_in} rows of 100 bytes"),
        wall,
        written as u64,
        &sorted.stats().unwrap_or_default(),
        &ctx.store_stats(),
        written == rows_in && !files.is_empty(),
    );
    result.extra = vec![("files".into(), serde_json::json!(files.len()))];
    Ok(result)
}
