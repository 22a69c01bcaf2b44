//! The Parquet sink commits each output partition once: retried tasks
//! leave the same files as a clean run, and a job killed half-way leaves no
//! output file (its staging directory goes with the next write there).
//! Faults come from `SB_FAILPOINTS` (the `failpoints` feature of test builds).

mod common;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

fn run(dir: &Path, file: &str, faults: &str) -> Child {
    common::run_pipeline(dir, file, faults, &[])
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

/// A write that replaces an earlier one, SIGKILLed in its commit after it
/// renamed its parts in and before it removed the earlier parts it did
/// not replace: the directory is never read as a mix of the two. The next
/// reader finishes the commit from its record (so does the next writer),
/// and reads the new write whole, byte for byte as a clean run wrote it.
/// Before the record, the reader got the new write's 4 files and 8 of the
/// earlier write's.
#[test]
fn a_write_killed_mid_commit_is_finished_never_mixed() {
    let dir = tempfile::tempdir().unwrap();
    streambatch_bench::make_images(&dir.path().join("images"), 12, 10, 5).unwrap();
    let earlier = common::preprocess_pipeline(dir.path(), "out");
    assert!(run(dir.path(), &earlier, "").wait().unwrap().success());
    assert_eq!(files(&dir.path().join("out")).0.len(), 12);
    // The next write: 4 other files, so 4 parts where there were 12.
    streambatch_bench::make_images(&dir.path().join("few"), 4, 10, 9).unwrap();
    let few = |out: &str| {
        let text = std::fs::read_to_string(
            dir.path()
                .join(common::preprocess_pipeline(dir.path(), out)),
        )
        .unwrap()
        .replace("read_parquet = \"images\"", "read_parquet = \"few\"");
        let file = format!("{out}-few.toml");
        std::fs::write(dir.path().join(&file), text).unwrap();
        file
    };
    let clean = few("clean");
    assert!(run(dir.path(), &clean, "").wait().unwrap().success());
    let out = dir.path().join("out");
    let mut job = run(dir.path(), &few("out"), "commit.pause=20000");
    common::kill_between_renames_and_removals(&mut job, &out, 4);

    let ctx = streambatch::Context::with_config(streambatch::NodeConfig {
        cpus: 2.0,
        gpus: Some(0.0),
        ..Default::default()
    })
    .unwrap();
    let read = ctx.read_parquet(out.to_str().unwrap()).unwrap();
    assert_eq!(read.count().unwrap(), 40, "the new write's rows alone");
    let (expected, _) = files(&dir.path().join("clean"));
    let (got, hidden) = files(&out);
    assert!(got == expected, "not the new write's files");
    assert!(hidden.is_empty(), "{hidden:?}");
}
