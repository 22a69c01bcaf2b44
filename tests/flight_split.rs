//! A split read from Python over Arrow Flight (`pyarrow.flight`), with the
//! cluster's client certificate: every row of each epoch once across the
//! ranks; a client of another cluster refused. Needs a Python with pyarrow
//! (`SB_PYTHON`, else `python3`; `.ci/run` installs one).

mod common;

use std::process::Command;

use common::ctx;
use streambatch::{SplitOptions, TlsFiles, init_cluster};
use streambatch_bench::flight_trainer::{self, Report, pyarrow_python as python};
use streambatch_bench::skip_test;
use streambatch_split::SplitService;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/flight/read_split.py");

/// Reads every rank's `epoch` from Python as `name` of `tls`: the JSON it
/// printed.
fn read(
    python: &str,
    service: &SplitService,
    tls: &std::path::Path,
    name: &str,
    epoch: usize,
) -> serde_json::Value {
    let tickets = service
        .handles()
        .iter()
        .map(|h| String::from_utf8(h.flight_ticket(epoch)).unwrap());
    let out = Command::new(python)
        .arg(SCRIPT)
        .arg(service.flight_addr().to_string())
        .arg(tls)
        .arg(name)
        .arg(epoch.to_string())
        .args(tickets)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn ids(value: &serde_json::Value) -> Vec<i64> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect()
}

#[test]
fn python_reads_every_row_of_each_epoch_once_over_flight() {
    let Some(python) = python() else {
        return skip_test(
            "python_reads_every_row_of_each_epoch_once_over_flight",
            "no Python with pyarrow (set SB_PYTHON, or pip install pyarrow)",
        );
    };
    let dir = tempfile::tempdir().unwrap();
    init_cluster(dir.path(), &["driver", "trainer"]).unwrap();
    // Equal shares: which rank asks first cannot leave the other empty.
    let options = SplitOptions {
        equal: true,
        block_order_seed: Some(3),
        ..SplitOptions::default()
    };
    let splits = ctx()
        .range(20_000, 20)
        .streaming_split_with(2, options)
        .unwrap();
    let tls = TlsFiles::in_dir(dir.path(), "driver");
    let service = SplitService::start(splits, &tls, "127.0.0.1:0".parse().unwrap()).unwrap();
    for epoch in 0..2 {
        let got = read(&python, &service, dir.path(), "trainer", epoch);
        assert_eq!(got["errors"], serde_json::json!({}), "{got}");
        let (a, b) = (ids(&got["ids"]["0"]), ids(&got["ids"]["1"]));
        assert_eq!((a.len(), b.len()), (10_000, 10_000), "equal shares");
        let mut all = [a, b].concat();
        all.sort_unstable();
        assert_eq!(all, (0..20_000).collect::<Vec<_>>(), "every row once");
    }
    // Each piece a Flight message: a batch to the client, counted (as
    // the server hands it over, which may follow the client's read).
    let counted = || service.stats().iter().all(|r| r.batches == r.pieces);
    let start = std::time::Instant::now();
    while !counted() && start.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for rank in service.stats() {
        assert!(rank.pieces > 0 && rank.batches == rank.pieces, "{rank:?}");
    }

    // A client whose certificate another cluster signed gets nothing.
    let other = tempfile::tempdir().unwrap();
    init_cluster(other.path(), &["trainer"]).unwrap();
    let refused = read(&python, &service, other.path(), "trainer", 2);
    let errors = refused["errors"].as_object().unwrap();
    assert_eq!(errors.len(), 2, "{refused}");
    assert_eq!(refused["ids"], serde_json::json!({}));
}

#[test]
fn a_rank_that_gets_no_rows_reads_an_empty_table() {
    let Some(python) = python() else {
        return skip_test(
            "a_rank_that_gets_no_rows_reads_an_empty_table",
            "no Python with pyarrow (set SB_PYTHON, or pip install pyarrow)",
        );
    };
    let dir = tempfile::tempdir().unwrap();
    init_cluster(dir.path(), &["driver", "trainer"]).unwrap();
    // One partition for two ranks, not equal: one rank gets every row.
    let splits = ctx().range(100, 1).streaming_split(2, false).unwrap();
    let tls = TlsFiles::in_dir(dir.path(), "driver");
    let service = SplitService::start(splits, &tls, "127.0.0.1:0".parse().unwrap()).unwrap();
    let got = read(&python, &service, dir.path(), "trainer", 0);
    assert_eq!(got["errors"], serde_json::json!({}), "{got}");
    let mut lengths = [ids(&got["ids"]["0"]).len(), ids(&got["ids"]["1"]).len()];
    lengths.sort_unstable();
    assert_eq!(lengths, [0, 100], "{got}");
}

/// A trainer process of rank `rank`, reading epoch 0 as `how` says, with
/// a confirming ticket when `confirming`.
fn trainer(
    python: &str,
    service: &SplitService,
    tls: &std::path::Path,
    rank: usize,
    confirming: bool,
    how: &str,
) -> std::process::Child {
    let handle = &service.handles()[rank];
    let ticket = match confirming {
        true => handle.flight_ticket_confirming(0),
        false => handle.flight_ticket(0),
    };
    flight_trainer::start(python, service.flight_addr(), tls, ticket, how)
}

/// Two ranks of 20,000 rows, taken as each asks: rank 0 is read as `how`
/// says, rank 1 to the end. What each read. (Not in equal shares: there a
/// rank that leaves after another finished leaves its rows undelivered,
/// counted as dropped.)
fn one_rank_goes_wrong(how: &str, confirming: bool, stall: std::time::Duration) -> Outcome {
    let python = python().unwrap();
    let dir = tempfile::tempdir().unwrap();
    init_cluster(dir.path(), &["driver", "trainer"]).unwrap();
    let options = SplitOptions {
        stalled_trainer_timeout: stall,
        ..SplitOptions::default()
    };
    let splits = ctx()
        .range(20_000, 40)
        .streaming_split_with(2, options)
        .unwrap();
    let tls = TlsFiles::in_dir(dir.path(), "driver");
    let service = SplitService::start(splits, &tls, "127.0.0.1:0".parse().unwrap()).unwrap();
    let wrong = trainer(&python, &service, dir.path(), 0, confirming, how);
    let right = trainer(&python, &service, dir.path(), 1, false, "all");
    // The other rank first: a stalled trainer must stay alive (and
    // silent) until the other has finished without it.
    let within = std::time::Duration::from_secs(60);
    let Report { ids: right, .. } = flight_trainer::report(right, within);
    let Report { ids: wrong, .. } = flight_trainer::report(wrong, within);
    Outcome {
        wrong,
        right,
        lost_rows: service.stats()[0].lost_rows,
    }
}

struct Outcome {
    wrong: Vec<i64>,
    right: Vec<i64>,
    lost_rows: usize,
}

impl Outcome {
    /// Every id once across both, and how many are missing.
    fn missing_without_duplicates(&self) -> usize {
        let mut all = [self.wrong.clone(), self.right.clone()].concat();
        all.sort_unstable();
        let before = all.len();
        all.dedup();
        assert_eq!(all.len(), before, "a row came twice");
        assert!(all.iter().all(|id| (0..20_000).contains(id)));
        20_000 - all.len()
    }
}

/// A confirming trainer killed (SIGKILL) mid-epoch: what it had not
/// confirmed goes to the other rank, which finishes the epoch: every row
/// once, none lost. Before, its last piece was neither confirmed nor given
/// back, and the other rank waited for it at the epoch's end for ever.
#[test]
fn a_confirming_trainer_killed_mid_epoch_loses_no_row() {
    if python().is_none() {
        return skip_test(
            "a_confirming_trainer_killed_mid_epoch_loses_no_row",
            "no Python with pyarrow (set SB_PYTHON, or pip install pyarrow)",
        );
    }
    let outcome = one_rank_goes_wrong("kill-after:1", true, std::time::Duration::from_secs(600));
    assert!(!outcome.wrong.is_empty(), "the trainer read before it died");
    assert_eq!(outcome.missing_without_duplicates(), 0);
    assert_eq!(outcome.lost_rows, 0);
}

/// A trainer that does not confirm, killed mid-epoch: no hang, no row
/// twice; what gRPC had taken for it counts as delivered.
#[test]
fn a_trainer_killed_mid_epoch_holds_up_no_one() {
    if python().is_none() {
        return skip_test(
            "a_trainer_killed_mid_epoch_holds_up_no_one",
            "no Python with pyarrow (set SB_PYTHON, or pip install pyarrow)",
        );
    }
    let outcome = one_rank_goes_wrong("kill-after:1", false, std::time::Duration::from_secs(600));
    assert!(!outcome.wrong.is_empty(), "the trainer read before it died");
    outcome.missing_without_duplicates();
}

/// A confirming trainer that stops reading (alive, stuck) with a batch it
/// has not confirmed is stalled at the split's limit: the other rank
/// finishes the epoch with every row the stalled one was not handed, and
/// what it held is counted lost (not given to another: it may yet read
/// it). Before, the other rank waited at the epoch's end for ever.
#[test]
fn a_stalled_trainer_is_left_behind_at_the_limit() {
    if python().is_none() {
        return skip_test(
            "a_stalled_trainer_is_left_behind_at_the_limit",
            "no Python with pyarrow (set SB_PYTHON, or pip install pyarrow)",
        );
    }
    let outcome = one_rank_goes_wrong("stall-after:1", true, std::time::Duration::from_secs(1));
    assert!(
        !outcome.wrong.is_empty(),
        "the trainer read before it stalled"
    );
    // What it read and what gRPC had taken for it are counted lost; no
    // row reached both ranks.
    outcome.missing_without_duplicates();
    assert_eq!(outcome.lost_rows, 20_000 - outcome.right.len());
    assert!(outcome.lost_rows >= outcome.wrong.len());
}
