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

/// S1 on a cluster of 3 node processes on 127.0.0.1 (2 CPU slots and a
/// 512 MiB store each), from `input` into `output`, twice: a clean run,
/// then one whose third node is SIGKILLed at 40% of the clean run's wall
/// time, mid-exchange. The second run's output is what
/// `tools/bench/s1.py run streambatch-cluster` checks (order and checksum,
/// as for every system): equal to the single-node run's. `dir` holds the
/// cluster's files.
pub fn s1_cluster(input: &Path, output: &Path, dir: &Path) -> Result<BenchResult> {
    let (clean, _) = s1_on_cluster(input, output, dir, None)?;
    let kill_at = clean.wall.mul_f64(0.4);
    let (mut killed, stats) = s1_on_cluster(input, output, dir, Some(kill_at))?;
    killed.correct = killed.correct && clean.correct && stats.recovery.nodes_lost == ["node-2"];
    killed.extra = vec![
        (
            "clean_s".into(),
            serde_json::json!(clean.wall.as_secs_f64()),
        ),
        (
            "killed_at_s".into(),
            serde_json::json!(kill_at.as_secs_f64()),
        ),
        (
            "nodes_lost".into(),
            serde_json::json!(stats.recovery.nodes_lost),
        ),
        (
            "remade_partitions".into(),
            serde_json::json!(stats.recovery.remade_partitions),
        ),
        (
            "rerun_tasks".into(),
            serde_json::json!(stats.recovery.rerun_tasks),
        ),
    ];
    Ok(killed)
}

/// One S1 run on a fresh 3-node cluster; with `kill_after`, the third
/// node is killed that long after the sort's job starts.
fn s1_on_cluster(
    input: &Path,
    output: &Path,
    dir: &Path,
    kill_after: Option<std::time::Duration>,
) -> Result<(BenchResult, streambatch::JobStats)> {
    use crate::nodes::{failed, node_config_with_store, remove_segments, start_node};
    let dir = dir.join("s1-cluster");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
    let exe = std::env::current_exe().map_err(|e| Error::io("finding", "this program", e))?;
    let names = ["head", "node-1", "node-2", "driver"];
    streambatch::init_cluster(&dir.join("tls"), &names)
        .map_err(|e| failed(format!("certificates: {e}")))?;
    let config = |name: &str, head: Option<&str>, cpus: u32| {
        node_config_with_store(&dir, name, head, (cpus, 0), None, "512MiB")
    };
    let head = start_node(&exe, &dir, &config("head", None, 2), "head")?;
    let one = start_node(&exe, &dir, &config("node-1", Some(&head.addr), 2), "node-1")?;
    let two = start_node(&exe, &dir, &config("node-2", Some(&head.addr), 2), "node-2")?;
    config("driver", Some(&head.addr), 0);
    let ctx = Context::connect(dir.join("driver.toml"))?;
    let source = ctx.read_parquet(&input.display().to_string())?;
    let rows_in = source.count()?;
    let sorted = source.sort(&["key"], false);
    let victim = two.child.id();
    let started = Instant::now();
    let killer = kill_after.map(|after| {
        std::thread::spawn(move || {
            std::thread::sleep(after);
            // SAFETY: kill(2) on the pid of a child not yet reaped (it is
            // reaped when its NodeProcess drops, after this thread joins).
            unsafe { libc::kill(victim as i32, libc::SIGKILL) };
        })
    });
    let files = sorted.write_parquet(output);
    let wall = started.elapsed();
    if let Some(killer) = killer {
        let _ = killer.join();
        remove_segments(&format!("sb-node-2-{victim}-"));
    }
    let files = files?;
    let stats = sorted.stats().unwrap_or_default();
    let written = Context::with_config(Default::default())?
        .read_parquet(&output.display().to_string())?
        .count()?;
    let result = BenchResult::new(
        "s1",
        format!("{rows_in} rows of 100 bytes, 3 nodes"),
        wall,
        written as u64,
        &stats,
        &Default::default(),
        written == rows_in && !files.is_empty(),
    );
    drop((one, two, head));
    Ok((result, stats))
}
