//! A split read from Python over Arrow Flight (`pyarrow.flight`), with the
//! cluster's client certificate: every row of each epoch once across the
//! ranks; a client of another cluster refused. Needs a Python with pyarrow
//! (`SB_PYTHON`, else `python3`; `.ci/run` installs one).

mod common;

use std::process::Command;

use common::ctx;
use streambatch::{SplitOptions, TlsFiles, init_cluster};
use streambatch_bench::skip_test;
use streambatch_split::SplitService;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/flight/read_split.py");

fn python() -> Option<String> {
    let python = std::env::var("SB_PYTHON").unwrap_or_else(|_| "python3".into());
    let found = Command::new(&python)
        .args(["-c", "import pyarrow.flight"])
        .output()
        .is_ok_and(|o| o.status.success());
    found.then_some(python)
}

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
