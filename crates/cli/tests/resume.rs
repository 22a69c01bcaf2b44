//! `streambatch run --resume`: a write of W4's input shape (images in 20
//! Parquet files -> preprocess -> `write_parquet`) SIGKILLed at seeded
//! points (after a wave, at a seeded time, as its commit begins) and
//! started again with `--resume`: the output holds an uninterrupted run's
//! rows, and a run that found a journal read fewer splits than the whole.
//! A changed input is refused, naming the file. Tasks are slowed by
//! `SB_FAILPOINTS=worker.sleep` so that the kills land mid-job.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use streambatch::{Context, NodeConfig};

/// The rows of the Parquet files in `out`, one batch of one row each,
/// in id order (two writes compare equal whatever their files).
fn rows(out: &Path) -> Vec<RecordBatch> {
    let ctx = Context::with_config(NodeConfig {
        cpus: 2.0,
        gpus: Some(0.0),
        ..Default::default()
    })
    .unwrap();
    let batches = ctx
        .read_parquet(out.to_str().unwrap())
        .unwrap()
        .collect()
        .unwrap();
    let mut rows: Vec<(i64, RecordBatch)> = batches
        .iter()
        .flat_map(|b| {
            let ids = b
                .column_by_name("id")
                .unwrap()
                .as_primitive::<Int64Type>()
                .clone();
            (0..b.num_rows()).map(move |i| (ids.value(i), b.slice(i, 1)))
        })
        .collect();
    rows.sort_by_key(|(id, _)| *id);
    rows.into_iter().map(|(_, row)| row).collect()
}

/// `streambatch run [--resume] file`: its exit and its standard output.
fn run(dir: &Path, file: &str, resume: bool) -> (bool, String) {
    let mut args = vec!["run", file];
    if resume {
        args.insert(1, "--resume");
    }
    let out = Command::new(common::BIN)
        .current_dir(dir)
        .env("SB_FAILPOINTS", "worker.sleep=60")
        .args(&args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() || !resume, "{stderr}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Where a run is killed.
#[derive(Clone, Copy, Debug)]
enum Kill {
    /// Once the journal records `n` waves, after `ms` more.
    AfterWaves(usize, u64),
    /// `ms` after the start.
    At(u64),
    /// As soon as the commit begins.
    AtCommit,
}

/// Starts a resumable run of `file` and SIGKILLs it at `kill`; whether it
/// was still running then.
fn run_killed(dir: &Path, file: &str, out: &Path, kill: Kill) -> bool {
    let mut child = Command::new(common::BIN)
        .current_dir(dir)
        .env("SB_FAILPOINTS", "worker.sleep=60")
        .args(["run", "--resume", file])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let journal = out.join(".streambatch-resume");
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120);
    let waves = || {
        std::fs::read_dir(&journal).map_or(0, |d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".done"))
                .count()
        })
    };
    loop {
        assert!(Instant::now() < deadline, "the run never reached {kill:?}");
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        let now = match kill {
            Kill::AfterWaves(n, ms) if waves() >= n => {
                std::thread::sleep(Duration::from_millis(ms));
                true
            }
            Kill::At(ms) => started.elapsed() >= Duration::from_millis(ms),
            Kill::AtCommit => journal.join("committing").exists(),
            _ => false,
        };
        if now {
            let running = child.try_wait().unwrap().is_none();
            child.kill().unwrap();
            child.wait().unwrap();
            return running;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `(run, of)` from a resumed run's summary: the splits it read, of all.
fn splits_run(stdout: &str) -> (usize, usize) {
    let line = stdout
        .lines()
        .find(|l| l.contains("source splits"))
        .unwrap_or_else(|| panic!("no count of splits run: {stdout}"));
    let numbers: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    let at = numbers.len() - 2;
    (numbers[at], numbers[at + 1])
}

#[test]
fn a_killed_write_resumes_with_the_rows_of_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    streambatch_bench::make_images(&dir.path().join("images"), 20, 10, 4).unwrap();
    let clean = common::preprocess_pipeline(dir.path(), "clean");
    assert!(run(dir.path(), &clean, false).0);
    let expected = rows(&dir.path().join("clean"));
    assert_eq!(expected.len(), 200);
    let kills = [
        Kill::AfterWaves(1, 0),
        Kill::AfterWaves(3, 37),
        Kill::At(900),
        Kill::AtCommit,
    ];
    let mut resumed_part_way = 0;
    for (i, kill) in kills.into_iter().enumerate() {
        let name = format!("out{i}");
        let file = common::preprocess_pipeline(dir.path(), &name);
        let out = dir.path().join(&name);
        let cut_short = run_killed(dir.path(), &file, &out, kill);
        let journal = out.join(".streambatch-resume").exists();
        let (ok, stdout) = run(dir.path(), &file, true);
        assert!(ok, "{kill:?}: {stdout}");
        let (ran, of) = splits_run(&stdout);
        assert_eq!(of, 20, "{stdout}");
        if cut_short && journal {
            assert!(
                ran < of,
                "{kill:?}: the resumed run read {ran} of {of} splits"
            );
            resumed_part_way += 1;
        }
        assert!(
            rows(&out) == expected,
            "{kill:?}: the rows differ from an uninterrupted run's"
        );
        let hidden: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(hidden.is_empty(), "{kill:?}: left {hidden:?}");
    }
    assert!(resumed_part_way >= 2, "no kill landed mid-job");

    // A changed input: refused, naming the file; the journal kept.
    let file = common::preprocess_pipeline(dir.path(), "changed");
    let out = dir.path().join("changed");
    assert!(run_killed(dir.path(), &file, &out, Kill::AfterWaves(1, 0)));
    let images = dir.path().join("images");
    streambatch_bench::make_images(&dir.path().join("other"), 20, 11, 9).unwrap();
    std::fs::copy(
        dir.path().join("other/images-013.parquet"),
        images.join("images-013.parquet"),
    )
    .unwrap();
    let refused = Command::new(common::BIN)
        .current_dir(dir.path())
        .args(["run", "--resume", &file])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("cannot resume") && stderr.contains("images-013.parquet"),
        "{stderr}"
    );
    assert!(out.join(".streambatch-resume").exists());
}
