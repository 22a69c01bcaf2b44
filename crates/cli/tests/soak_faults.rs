//! The fault soak of issue 51, in rounds. Each round: an epoch of a split
//! read over Arrow Flight by two pyarrow trainer processes, one of which a
//! seeded schedule SIGKILLs or stalls mid-epoch (with the confirming
//! ticket; the split's stall limit 1 s); and a write into a directory
//! holding an earlier one, SIGKILLed in its commit between its renames and
//! its removals (`SB_FAILPOINTS=commit.pause`), then read back. Every row
//! of every epoch must reach one trainer once, or be counted in the
//! stalled rank's `lost_rows`; every read must find the new write whole.
//! It prints rounds, faults and rows checked, lost and duplicated.
//!
//! `STREAMBATCH_SOAK_MINUTES=10 cargo test --release -p streambatch-cli --test soak_faults -- --nocapture`
//! runs rounds for ten minutes; without it, one round (the suite's run).
//! Needs a Python with pyarrow (`SB_PYTHON`; `.ci/run` makes one).

mod common;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use streambatch::{Context, NodeConfig, SplitOptions, TlsFiles, init_cluster};
use streambatch_bench::flight_trainer::{self, Report, pyarrow_python as python};
use streambatch_split::SplitService;

const MINUTES: &str = "STREAMBATCH_SOAK_MINUTES";
const ROWS: i64 = 20_000;

#[derive(Default, Debug)]
struct Tally {
    rounds: u64,
    trainers_killed: u64,
    trainers_stalled: u64,
    writers_killed: u64,
    rows_checked: u64,
    rows_counted_lost: u64,
    rows_lost: u64,
    rows_duplicated: u64,
}

fn trainer(python: &str, service: &SplitService, tls: &Path, rank: usize, how: &str) -> Child {
    let handle = &service.handles()[rank];
    let ticket = match how {
        "all" => handle.flight_ticket(0),
        _ => handle.flight_ticket_confirming(0),
    };
    flight_trainer::start(python, service.flight_addr(), tls, ticket, how)
}

/// One epoch with one trainer going wrong as `how` says.
fn trainer_round(python: &str, ctx: &Context, tls: &Path, how: &str, tally: &mut Tally) {
    let options = SplitOptions {
        stalled_trainer_timeout: Duration::from_secs(1),
        ..SplitOptions::default()
    };
    let splits = ctx
        .range(ROWS as u64, 40)
        .streaming_split_with(2, options)
        .unwrap();
    let files = TlsFiles::in_dir(tls, "driver");
    let service = SplitService::start(splits, &files, "127.0.0.1:0".parse().unwrap()).unwrap();
    let wrong = trainer(python, &service, tls, 0, how);
    let right = trainer(python, &service, tls, 1, "all");
    // The other first: a stalled trainer stays alive until it finished.
    // A trainer silent for a minute fails the soak (a hang).
    let within = Duration::from_secs(60);
    let right = flight_trainer::report(right, within).ids;
    let Report {
        ids: wrong,
        confirmed,
    } = flight_trainer::report(wrong, within);
    let lost_rows = service.stats()[0].lost_rows;
    let mut all = [wrong.clone(), right].concat();
    all.sort_unstable();
    let read = all.len();
    all.dedup();
    tally.rows_duplicated += (read - all.len()) as u64;
    let missing = ROWS as usize - all.len();
    tally.rows_checked += ROWS as u64;
    if how.starts_with("stall") {
        tally.trainers_stalled += 1;
        // Every row reached the other rank, or was confirmed by the
        // stalled one, or is counted in its lost_rows (what it held
        // unconfirmed, read or buffered for it).
        let other = all.len() - wrong.len();
        let uncounted = (ROWS as usize).saturating_sub(other + confirmed + lost_rows);
        if uncounted > 0 {
            eprintln!("{how}: {uncounted} rows neither delivered nor counted lost");
        }
        tally.rows_lost += uncounted as u64;
        tally.rows_counted_lost += lost_rows as u64;
    } else {
        tally.trainers_killed += 1;
        if missing > 0 {
            eprintln!("{how}: {missing} rows missing");
        }
        tally.rows_lost += missing as u64;
    }
}

/// A write SIGKILLed between its renames and its removals, then read.
fn writer_round(dir: &Path, local: &Context, tally: &mut Tally) {
    let run = |file: &str, faults: &str| common::run_pipeline(dir, file, faults, &[]);
    assert!(run("many.toml", "").wait().unwrap().success());
    let out = dir.join("out");
    let mut job = run("few.toml", "commit.pause=20000");
    common::kill_between_renames_and_removals(&mut job, &out, 4);
    tally.writers_killed += 1;
    let rows = local.read_parquet(out.to_str().unwrap()).unwrap();
    let rows = rows.count().unwrap();
    tally.rows_checked += 40;
    tally.rows_lost += 40usize.saturating_sub(rows) as u64;
    tally.rows_duplicated += rows.saturating_sub(40) as u64;
}

#[test]
fn trainers_and_writers_killed_and_stalled_lose_and_duplicate_nothing() {
    let minutes: Option<f64> = std::env::var(MINUTES).ok().map(|m| {
        m.parse()
            .unwrap_or_else(|_| panic!("{MINUTES}={m}: not a number"))
    });
    // SAFETY: this binary's only test, before it starts any thread: the
    // variable would otherwise reach a node config as an unknown key.
    unsafe { std::env::remove_var(MINUTES) };
    let Some(python) = python() else {
        return streambatch_bench::skip_test(
            "trainers_and_writers_killed_and_stalled_lose_and_duplicate_nothing",
            "no Python with pyarrow (set SB_PYTHON, or pip install pyarrow)",
        );
    };
    let deadline = minutes.map(|m| Instant::now() + Duration::from_secs_f64(m * 60.0));
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    init_cluster(&tls, &["driver", "trainer"]).unwrap();
    streambatch_bench::make_images(&dir.path().join("images"), 12, 10, 5).unwrap();
    streambatch_bench::make_images(&dir.path().join("few"), 4, 10, 9).unwrap();
    for (file, source) in [("many.toml", "images"), ("few.toml", "few")] {
        let text = format!(
            "[node]\ncpus = 2\ngpus = 0\n\n[source]\nread_parquet = \"{source}\"\n\n\
             [[ops]]\nop = \"preprocess_images\"\n\n[sink]\nwrite_parquet = \"out\"\n"
        );
        std::fs::write(dir.path().join(file), text).unwrap();
    }
    let ctx = Context::with_config(NodeConfig {
        cpus: 2.0,
        gpus: Some(0.0),
        ..Default::default()
    })
    .unwrap();
    let ways = [
        "kill-after:1",
        "stall-after:1",
        "kill-after:3",
        "stall-after:2",
    ];
    let mut tally = Tally::default();
    let started = Instant::now();
    loop {
        let done = match deadline {
            Some(at) => Instant::now() >= at,
            None => tally.rounds == 1,
        };
        if done {
            break;
        }
        let how = ways[tally.rounds as usize % ways.len()];
        trainer_round(&python, &ctx, &tls, how, &mut tally);
        writer_round(dir.path(), &ctx, &mut tally);
        tally.rounds += 1;
    }
    println!(
        "fault soak: {:.0} s, {tally:?}",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        (tally.rows_lost, tally.rows_duplicated),
        (0, 0),
        "{tally:?}"
    );
}
