//! The Parquet sink commits each output partition once: retried tasks
//! leave the same files as a clean run, and a job killed half-way leaves no
//! output file (its staging directory goes with the next write there).
//! Faults come from `SB_FAILPOINTS` (the `failpoints` feature of test builds).

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn run(dir: &Path, file: &str, faults: &str) -> Child {
    Command::new(common::BIN)
        .current_dir(dir)
        .env("SB_FAILPOINTS", faults)
        .args(["run", file])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// Each file of `dir` by name, with its bytes; hidden entries listed apart.
fn files(dir: &Path) -> (Vec<(String, Vec<u8>)>, Vec<String>) {
    let mut visible = Vec::new();
    let mut hidden = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            hidden.push(name);
        } else {
            visible.push((name, std::fs::read(entry.path()).unwrap()));
        }
    }
    visible.sort();
    (visible, hidden)
}

#[test]
fn retried_tasks_write_the_files_of_a_clean_run() {
    let dir = tempfile::tempdir().unwrap();
    streambatch_bench::make_images(&dir.path().join("images"), 12, 10, 5).unwrap();
    let clean = common::preprocess_pipeline(dir.path(), "clean");
    assert!(run(dir.path(), &clean, "").wait().unwrap().success());
    // About a third of the tasks panic once each.
    let faulty = common::preprocess_pipeline(dir.path(), "faulty");
    let faults = [("SB_FAILPOINTS", "worker.panic=3:30")];
    let out = common::streambatch(dir.path(), &["run", &faulty], &faults);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("failpoint worker.panic"),
        "no task panicked: {stderr}"
    );
    let (expected, _) = files(&dir.path().join("clean"));
    let (got, hidden) = files(&dir.path().join("faulty"));
    assert_eq!(expected.len(), 12, "one file per input file");
    let names = |f: &[(String, Vec<u8>)]| f.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&got), names(&expected));
    assert!(
        got == expected,
        "the files' bytes differ from the clean run's"
    );
    assert!(hidden.is_empty(), "{hidden:?}");
}

#[test]
fn a_job_killed_half_way_leaves_no_output_file() {
    let dir = tempfile::tempdir().unwrap();
    streambatch_bench::make_images(&dir.path().join("images"), 12, 10, 5).unwrap();
    let file = common::preprocess_pipeline(dir.path(), "out");
    let out = dir.path().join("out");
    // Slow tasks: kill the job once a file is staged, before the commit.
    let mut job = run(dir.path(), &file, "worker.sleep=300");
    let started = Instant::now();
    let staged = loop {
        let staged = std::fs::read_dir(&out).ok().and_then(|entries| {
            entries.flatten().find_map(|e| {
                let parts = std::fs::read_dir(e.path()).ok()?;
                let part = parts
                    .flatten()
                    .any(|p| p.file_name().to_string_lossy().starts_with("part-"));
                part.then(|| e.file_name().to_string_lossy().into_owned())
            })
        });
        if let Some(staged) = staged {
            break staged;
        }
        assert!(
            job.try_wait().unwrap().is_none(),
            "the job ended before it was killed"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "nothing staged in 60 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    job.kill().unwrap();
    job.wait().unwrap();
    let (visible, hidden) = files(&out);
    assert!(
        visible.is_empty(),
        "files left by a killed job: {visible:?}"
    );
    assert_eq!(hidden, vec![staged.clone()], "the staged parts stay hidden");

    // The next write there finishes, and clears what the killed one left.
    assert!(run(dir.path(), &file, "").wait().unwrap().success());
    let (visible, hidden) = files(&out);
    assert_eq!(visible.len(), 12);
    assert!(hidden.is_empty(), "{hidden:?}");
}
