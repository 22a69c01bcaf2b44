//! `streambatch run --resume`: a write of W4's input shape (images in 20
//! Parquet files -> preprocess -> `write_parquet`) SIGKILLed at seeded
//! points (after a wave, at a seeded time, as its commit begins) and
//! started again with `--resume`: the output holds an uninterrupted run's
//! rows, and a run that found a journal read fewer splits than the whole.
//! A changed input is refused, naming the file. The same into an S3
//! folder (moto's server), its journal in the bucket. Tasks are slowed by
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

/// Variables for a run (an S3 server's endpoint and keys).
type Env = [(String, String)];

/// `streambatch run [--resume] file`: its exit and its standard output.
fn run(dir: &Path, file: &str, resume: bool, env: &Env) -> (bool, String) {
    let mut args = vec!["run", file];
    if resume {
        args.insert(1, "--resume");
    }
    let out = Command::new(common::BIN)
        .current_dir(dir)
        .env("SB_FAILPOINTS", "worker.sleep=60")
        .envs(env.iter().cloned())
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

/// What a journal shows: the names in it (`wave-0000.done`, `committing`).
trait Journal {
    fn names(&self) -> Vec<String>;
}

/// A local output's journal, at this path.
impl Journal for std::path::PathBuf {
    fn names(&self) -> Vec<String> {
        std::fs::read_dir(self).map_or(Vec::new(), |d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
    }
}

/// Starts a resumable run of `file` and SIGKILLs it at `kill`, watching
/// `journal`; whether it was still running then.
fn run_killed(dir: &Path, file: &str, journal: &dyn Journal, kill: Kill, env: &Env) -> bool {
    let mut child = Command::new(common::BIN)
        .current_dir(dir)
        .env("SB_FAILPOINTS", "worker.sleep=60")
        .envs(env.iter().cloned())
        .args(["run", "--resume", file])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120);
    let waves = || {
        journal
            .names()
            .iter()
            .filter(|n| n.ends_with(".done"))
            .count()
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
            Kill::AtCommit => journal.names().iter().any(|n| n == "committing"),
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
    assert!(run(dir.path(), &clean, false, &[]).0);
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
        let journal = out.join(".streambatch-resume");
        let cut_short = run_killed(dir.path(), &file, &journal, kill, &[]);
        let journal = journal.exists();
        let (ok, stdout) = run(dir.path(), &file, true, &[]);
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
    let journal = out.join(".streambatch-resume");
    assert!(run_killed(
        dir.path(),
        &file,
        &journal,
        Kill::AfterWaves(1, 0),
        &[]
    ));
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

/// An S3 folder's journal: its keys under `prefix` in `bucket`.
struct BucketJournal<'a> {
    s3: &'a streambatch_bench::S3Server,
    bucket: &'static str,
    prefix: String,
}

impl Journal for BucketJournal<'_> {
    fn names(&self) -> Vec<String> {
        let keys = self.s3.keys(self.bucket, &self.prefix);
        keys.iter()
            .filter_map(|k| k.strip_prefix(&self.prefix))
            .filter(|n| !n.contains('/'))
            .map(str::to_string)
            .collect()
    }
}

/// The same into an S3 folder (moto's server, its journal kept in the
/// bucket): killed after waves and as its commit begins, resumed, it holds
/// an uninterrupted run's rows (copied to a local folder to compare) and
/// nothing else.
#[test]
fn a_killed_write_into_a_bucket_resumes_with_the_rows_of_an_uninterrupted_run() {
    let test = "a_killed_write_into_a_bucket_resumes_with_the_rows_of_an_uninterrupted_run";
    let Some(s3) = streambatch_bench::S3Server::start() else {
        streambatch_bench::skip_test(test, "no Python with moto's server (set SB_PYTHON)");
        return;
    };
    // The children get the server's variables; this process's are left as
    // they are (the other test runs beside this one).
    let env = s3.env();
    s3.make_bucket("out");
    let dir = tempfile::tempdir().unwrap();
    streambatch_bench::make_images(&dir.path().join("images"), 20, 10, 4).unwrap();
    let clean = common::preprocess_pipeline(dir.path(), "clean");
    assert!(run(dir.path(), &clean, false, &[]).0);
    let expected = rows(&dir.path().join("clean"));
    for (i, kill) in [Kill::AfterWaves(2, 0), Kill::AtCommit]
        .into_iter()
        .enumerate()
    {
        let url = format!("s3://out/run{i}");
        let file = format!("run{i}.toml");
        let local = common::preprocess_pipeline(dir.path(), "local");
        let text = std::fs::read_to_string(dir.path().join(local)).unwrap();
        let text = text.replace(
            "write_parquet = \"local\"",
            &format!("write_parquet = \"{url}\""),
        );
        assert!(text.contains(&url));
        std::fs::write(dir.path().join(&file), text).unwrap();
        let journal = BucketJournal {
            s3: &s3,
            bucket: "out",
            prefix: format!("run{i}/.streambatch-resume/"),
        };
        assert!(
            run_killed(dir.path(), &file, &journal, kill, &env),
            "{kill:?}"
        );
        assert!(!journal.names().is_empty(), "{kill:?}: no journal left");
        let (ok, stdout) = run(dir.path(), &file, true, &env);
        assert!(ok, "{kill:?}: {stdout}");
        let (ran, of) = splits_run(&stdout);
        assert!(
            ran < of,
            "{kill:?}: the resumed run read {ran} of {of} splits"
        );
        // Only the parts and the folder's manifest: no journal left.
        let keys = s3.keys("out", &format!("run{i}/"));
        let (parts, manifest) = (
            format!("run{i}/part-0"),
            format!("run{i}/_streambatch-manifest.parquet.json"),
        );
        assert!(
            keys.iter().all(|k| k.starts_with(&parts) || *k == manifest),
            "{kill:?}: left {keys:?}"
        );
        // A copy of the bucket's output, through a run with its variables.
        let copy = format!("copy{i}.toml");
        let text = format!(
            "[node]\ncpus = 2\ngpus = 0\n\n[source]\nread_parquet = \"{url}/\"\n\n[sink]\nwrite_parquet = \"copy{i}\"\n"
        );
        std::fs::write(dir.path().join(&copy), text).unwrap();
        assert!(run(dir.path(), &copy, false, &env).0);
        assert!(
            rows(&dir.path().join(format!("copy{i}"))) == expected,
            "{kill:?}: the rows differ from an uninterrupted run's"
        );
    }
}
