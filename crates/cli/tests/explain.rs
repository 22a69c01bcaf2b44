//! `streambatch run --explain` prints what the pipeline would run, without
//! running it: the logical plan, the fused stages with their resources and
//! pools, and the store memory reserved for each stage's outputs.

use std::process::{Command, Output};

/// Runs `streambatch run p.toml FLAGS` on `pipeline` (TOML) in a directory
/// of its own, with `env` set.
fn run(pipeline: &str, flags: &[&str], env: &[(&str, &str)]) -> (tempfile::TempDir, Output) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    std::fs::write(&file, pipeline).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_streambatch"))
        .current_dir(dir.path())
        .arg("run")
        .arg(&file)
        .args(flags)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    (dir, out)
}

#[test]
fn run_explain_prints_the_plan_its_stages_and_their_memory_and_runs_nothing() {
    let (dir, out) = run(
        r#"
[node]
store_capacity = "64MiB"
target_partition_bytes = "16MiB"

[source]
range = { n = 1000, partitions = 10 }

[[ops]]
op = "select"
columns = ["id"]

[[ops]]
op = "repartition"
n = 4

[[ops]]
op = "limit"
n = 100

[sink]
write_parquet = "out"
"#,
        &["--explain"],
        &[],
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for line in [
        "logical plan: range (10 splits) -> select -> repartition 4 -> limit 100",
        "0. range->select [source] 1 cpu, outputs reserved 16.0 MiB",
        "1. repartition(4) [repartition] no slot",
        "memory: store 64.0 MiB, partitions up to 16.0 MiB, shared pool 48.0 MiB",
        "sink: write_parquet",
    ] {
        assert!(text.contains(line), "no `{line}` in:\n{text}");
    }
    assert!(!dir.path().join("out").exists(), "--explain ran the job");
}

#[test]
fn debug_logs_show_each_scheduling_decision_with_its_reason() {
    let (_dir, out) = run(
        r#"
[node]
cpus = 2
[source]
range = { n = 1000, partitions = 10 }
[sink]
count = true
"#,
        &[],
        &[("RUST_LOG", "streambatch=debug"), ("NO_COLOR", "1")],
    );
    let log = String::from_utf8_lossy(&out.stderr);
    // Once the first tasks end, short ones may also be queued on the node.
    let starts: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("start a task") || l.contains("queue a task"))
        .collect();
    assert_eq!(starts.len(), 10, "one per split:\n{log}");
    for line in starts {
        assert!(
            line.contains("stage=range") && line.contains("reason=an input waits"),
            "{line}"
        );
    }
}
