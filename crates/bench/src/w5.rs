//! W5, scale-out: N CPU-only nodes (8 logical CPU slots, 300 MiB store
//! each) feeding one node with 4N logical GPU slots (no CPU slots, 300 MiB
//! store), every node a process of this binary on 127.0.0.1, started from
//! TOML with certificates of a fresh cluster CA; W1's pipeline over 800N
//! rows in 160N partitions, so every row crosses from a CPU node to the GPU
//! node. The nodes share one store directory, as nodes on one host do, so
//! partitions cross by shared memory. Ideal: 15 s at every N.

use std::path::Path;
use std::time::{Duration, Instant};

use streambatch::{Context, Error, Result};

use crate::nodes::{NodeProcess, failed, node_config, remove_segments, start_node};
use crate::{BenchResult, ProgressLines, Shape, registry, w1_pipeline};

/// Runs W5 with `n` CPU nodes; `dir` holds the cluster's files.
pub fn w5(n: usize, dir: &Path, progress: &mut ProgressLines) -> Result<BenchResult> {
    Ok(run(n, dir, progress, None, None)?.0)
}

/// W5 at `n` CPU nodes twice in one run: clean, then with the last CPU node
/// killed (SIGKILL) half-way through the clean run's wall time, every node
/// with `node_timeout_ms` = `timeout_ms` (when given). The second
/// run must be correct and take at most the clean run's time plus the time
/// to redo what the lost node ran and held (its re-run and retried CPU
/// tasks at the mean CPU task time, over the slots left), plus 20%.
pub fn w5_kill_one(
    n: usize,
    dir: &Path,
    progress: &mut ProgressLines,
    timeout_ms: Option<u32>,
) -> Result<serde_json::Value> {
    if n < 2 {
        return Err(failed("--kill-one needs at least 2 CPU nodes".into()));
    }
    let (clean, _) = run(n, dir, progress, None, timeout_ms)?;
    *progress = ProgressLines::new(false);
    let half = clean.wall / 2;
    let (killed, stats) = run(n, dir, progress, Some(half), timeout_ms)?;
    let cpu = &stats.operators[0];
    let redone = stats.recovery.rerun_tasks + cpu.retries;
    let mean_task = cpu.busy.as_secs_f64() / cpu.tasks.max(1) as f64;
    let redo_s = redone as f64 * mean_task / (8 * (n - 1)) as f64;
    let clean_s = clean.wall.as_secs_f64();
    let bound_s = (clean_s + redo_s) * 1.2;
    let kill_s = killed.wall.as_secs_f64();
    Ok(serde_json::json!({
        "workload": "w5",
        "config": format!("kill_one nodes={n}"),
        "node_timeout_ms": timeout_ms.unwrap_or(5_000),
        "clean_s": clean_s,
        "killed_s": kill_s,
        "killed_at_s": half.as_secs_f64(),
        "correct": clean.correct && killed.correct,
        "nodes_lost": stats.recovery.nodes_lost,
        "lost_partitions": stats.recovery.lost_partitions,
        "remade_partitions": stats.recovery.remade_partitions,
        "rerun_tasks": stats.recovery.rerun_tasks,
        "cpu_retries": cpu.retries,
        "redo_s": redo_s,
        "bound_s": bound_s,
        "within_bound": kill_s <= bound_s,
    }))
}

/// One W5 run; with `kill_after`, the last CPU node is killed that long
/// after the job starts.
fn run(
    n: usize,
    dir: &Path,
    progress: &mut ProgressLines,
    kill_after: Option<Duration>,
    timeout_ms: Option<u32>,
) -> Result<(BenchResult, streambatch::JobStats)> {
    let dir = dir.join(format!("w5-{n}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
    let exe = std::env::current_exe().map_err(|e| Error::io("finding", "this program", e))?;
    let cpu_names: Vec<String> = (1..=n).map(|i| format!("cpu-{i}")).collect();
    let mut names = vec!["head".to_string(), "gpu".to_string(), "driver".to_string()];
    names.extend(cpu_names.iter().cloned());
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    streambatch::init_cluster(&dir.join("tls"), &names)
        .map_err(|e| failed(format!("certificates: {e}")))?;

    let head = start_node(
        &exe,
        &dir,
        &node_config(&dir, "head", None, (0, 0), timeout_ms),
        "head",
    )?;
    let mut nodes = vec![];
    for name in &cpu_names {
        let config = node_config(&dir, name, Some(&head.addr), (8, 0), timeout_ms);
        nodes.push(start_node(&exe, &dir, &config, name)?);
    }
    let gpu_config = node_config(&dir, "gpu", Some(&head.addr), (0, 4 * n as u32), timeout_ms);
    nodes.push(start_node(&exe, &dir, &gpu_config, "gpu")?);
    node_config(&dir, "driver", Some(&head.addr), (0, 0), timeout_ms);
    let ctx = Context::connect(dir.join("driver.toml"))?;

    let rows = 800 * n as u64;
    let shape = Shape {
        partitions: 160 * n,
        ..Shape::w1(rows)
    };
    let started = Instant::now();
    let victim = nodes[n - 1].child.id();
    let killer = kill_after.map(|after| {
        std::thread::spawn(move || {
            std::thread::sleep(after);
            // SAFETY: kill(2) on the pid of a child not yet reaped (it is
            // reaped when its NodeProcess drops, after this thread joins).
            unsafe { libc::kill(victim as i32, libc::SIGKILL) };
        })
    });
    let ds = w1_pipeline(ctx.range(rows, shape.partitions), &registry(), shape)?;
    let ids = crate::check_ids(&ds, progress, rows);
    if let Some(killer) = killer {
        let _ = killer.join();
        remove_segments(&format!("sb-cpu-{n}-{victim}-"));
    }
    let ids = ids?;
    let wall = started.elapsed();
    let stats = ds.stats().unwrap_or_default();
    if std::env::var_os("W5_PRINT_STATS").is_some() {
        print_task_times(&stats);
    }
    let out_rows = progress.rows();
    let correct = ids.each_once();
    if !correct {
        eprintln!("w5: {out_rows} rows, {} of the {rows} ids", ids.distinct());
    }
    let rss: f64 = nodes
        .iter()
        .chain([&head])
        .map(NodeProcess::peak_rss_mib)
        .sum::<f64>()
        + crate::peak_rss_mib().unwrap_or(0.0);
    let mut result = BenchResult {
        ideal: Some(Duration::from_secs(15)),
        ..BenchResult::new(
            "w5",
            format!("nodes={n}"),
            wall,
            out_rows,
            &stats,
            &Default::default(),
            correct,
        )
    };
    result.store_peak_bytes = stats.peak_store_bytes;
    result.extra = vec![
        ("nodes".into(), n.into()),
        (
            "peak_rss_mib".into(),
            ((rss * 1000.0).round() / 1000.0).into(),
        ),
        (
            "inputs_by_shared_memory".into(),
            stats
                .nodes
                .iter()
                .map(|s| s.inputs_shared)
                .sum::<u64>()
                .into(),
        ),
        (
            "inputs_over_quic".into(),
            stats
                .nodes
                .iter()
                .map(|s| s.inputs_quic)
                .sum::<u64>()
                .into(),
        ),
    ];
    Ok((result, stats))
}

/// With `W5_PRINT_STATS` set: the job's stats, its pauses for memory and how
/// long its tasks took from dispatch to finish, per stage (where a run
/// loses time against the ideal).
fn print_task_times(stats: &streambatch::JobStats) {
    use streambatch::EventKind;
    eprintln!("{stats}");
    let paused = stats
        .events
        .iter()
        .filter(|e| e.kind == EventKind::TaskSuspended)
        .count();
    eprintln!("pauses for memory: {paused}");
    let mut started = std::collections::HashMap::new();
    let mut spans = vec![Vec::new(); stats.operators.len()];
    for e in &stats.events {
        match e.kind {
            EventKind::TaskStarted => {
                started.insert(e.task, e.at);
            }
            EventKind::TaskFinished => {
                if let Some(s) = started.get(&e.task) {
                    spans[e.stage.0].push((e.at - *s).as_secs_f64());
                }
            }
            _ => {}
        }
    }
    for (stage, s) in spans.iter().enumerate() {
        let mean = s.iter().sum::<f64>() / s.len().max(1) as f64;
        let max = s.iter().copied().fold(0.0, f64::max);
        eprintln!(
            "stage {stage}: {} tasks, mean {mean:.3} s, max {max:.3} s",
            s.len()
        );
    }
}
