//! Splits read by trainer processes (this test binary started again as a
//! trainer): every row once per epoch across the processes, by shared
//! memory and over QUIC; equal shares; a trainer SIGKILLed mid-epoch under
//! each policy; a trainer that never asks for the next epoch; a trainer of
//! another cluster refused. Each child runs under a deadline: a hang fails
//! the test instead of stalling the suite.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use common::ctx;
use streambatch::prelude::*;
use streambatch::{LostRank, SplitOptions, TlsFiles, init_cluster};
use streambatch_split::{RemoteSplit, SplitHandle, SplitService};

const ROLE: &str = "SB_TEST_TRAINER";
/// How long any trainer process may take.
const DEADLINE: Duration = Duration::from_secs(90);

/// Runs the trainer's body when this binary was started as one (by the
/// test it was started for): the test then returns.
fn as_trainer() -> bool {
    match std::env::var(ROLE) {
        Ok(role) => {
            trainer_body(&role);
            true
        }
        Err(_) => false,
    }
}

/// A trainer: `role` is `TLS_DIR|NAME|HANDLE|MODE`, and it prints `piece
/// EPOCH ID,ID,..`, `error EPOCH MESSAGE` and `done EPOCH` lines; in mode
/// `batches:N` it reads epoch 0 in batches of N rows (each a `piece`
/// line) and prints `batches 0 COUNT`.
fn trainer_body(role: &str) {
    let [dir, name, handle, mode]: [&str; 4] = role
        .split('|')
        .collect::<Vec<_>>()
        .try_into()
        .expect("a trainer role");
    let handle: SplitHandle = handle.parse().unwrap();
    let mut split = RemoteSplit::open(&TlsFiles::in_dir(dir.as_ref(), name), &handle).unwrap();
    let mut words = mode.split(':');
    let (what, arg) = (words.next().unwrap(), words.next().unwrap_or("0"));
    if words.next() == Some("bytes") {
        split = split.without_shared_memory();
    }
    let mut out = std::io::stdout().lock();
    // The test harness has begun a line of its own.
    writeln!(out).unwrap();
    let epochs = if what == "epochs" {
        arg.parse().unwrap()
    } else {
        1
    };
    if what == "batches" {
        let options = BatchOptions::rows(arg.parse().unwrap()).prefetch(1);
        let mut count = 0;
        for batch in split.iter_batches(0, options).unwrap() {
            let batch = batch.unwrap();
            let ids = batch.column(0).as_primitive::<Int64Type>().values();
            let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
            writeln!(out, "piece 0 {}", ids.join(",")).unwrap();
            count += 1;
        }
        writeln!(out, "batches 0 {count}\ndone 0").unwrap();
        return;
    }
    for epoch in 0..epochs {
        let mut stream = split.epoch(epoch).unwrap();
        let mut pieces = 0;
        loop {
            match stream.next() {
                None => break,
                Some(Ok(batch))
                    if what == "die-after" && pieces == arg.parse::<usize>().unwrap() =>
                {
                    // Received and never confirmed: it goes back to the others.
                    drop(batch);
                    out.flush().unwrap();
                    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                }
                Some(Ok(batch)) => {
                    let ids = batch.column(0).as_primitive::<Int64Type>().values();
                    let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
                    writeln!(out, "piece {epoch} {}", ids.join(",")).unwrap();
                    out.flush().unwrap();
                    pieces += 1;
                }
                Some(Err(e)) => {
                    writeln!(out, "error {epoch} {e}").unwrap();
                    return;
                }
            }
        }
        writeln!(out, "done {epoch}").unwrap();
    }
}

/// A cluster's TLS files for the driver and two trainers.
fn cluster() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    init_cluster(dir.path(), &["driver", "trainer-0", "trainer-1"]).unwrap();
    dir
}

fn serve(dir: &tempfile::TempDir, ds: &Dataset, options: SplitOptions) -> SplitService {
    let splits = ds.streaming_split_with(2, options).unwrap();
    let tls = TlsFiles::in_dir(dir.path(), "driver");
    SplitService::start(splits, &tls, "127.0.0.1:0".parse().unwrap()).unwrap()
}

/// Starts this binary as rank `rank`'s trainer, inside `test`.
fn trainer(
    test: &str,
    dir: &tempfile::TempDir,
    service: &SplitService,
    rank: usize,
    mode: &str,
) -> Child {
    let role = format!(
        "{}|trainer-{rank}|{}|{mode}",
        dir.path().display(),
        service.handles()[rank]
    );
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// What a trainer printed: ids per epoch, errors, and how it exited.
struct Report {
    ids: BTreeMap<usize, Vec<i64>>,
    /// Batches it counted, by epoch (mode `batches`).
    batches: BTreeMap<usize, usize>,
    errors: Vec<String>,
    done: Vec<usize>,
    signal: Option<i32>,
}

/// Waits for both trainers within the deadline, reading their output
/// meanwhile; past it, kills them and fails, showing what each printed.
fn finish(a: Child, b: Child) -> (Report, Report) {
    let pids = [a.id() as i32, b.id() as i32];
    let (done, waited) = std::sync::mpsc::channel();
    for (i, child) in [a, b].into_iter().enumerate() {
        let done = done.clone();
        std::thread::spawn(move || done.send((i, child.wait_with_output().unwrap())));
    }
    let deadline = Instant::now() + DEADLINE;
    let mut outs = [None, None];
    let mut hung = false;
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(Instant::now());
        let (i, out) = match waited.recv_timeout(left) {
            Ok(got) => got,
            Err(_) => {
                hung = true;
                for pid in pids {
                    // SAFETY: signals children of this process not yet reaped.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                waited.recv().unwrap()
            }
        };
        outs[i] = Some(out);
    }
    let [a, b] = outs.map(Option::unwrap);
    if hung {
        let said = |out: &std::process::Output| -> Vec<String> {
            let text = String::from_utf8_lossy(&out.stdout);
            text.lines().map(|l| l.chars().take(30).collect()).collect()
        };
        panic!(
            "a trainer hung past {DEADLINE:?}; they printed {:?} and {:?}",
            said(&a),
            said(&b)
        );
    }
    (report(a), report(b))
}

fn report(out: std::process::Output) -> Report {
    let text = String::from_utf8_lossy(&out.stdout);
    let mut report = Report {
        ids: BTreeMap::new(),
        batches: BTreeMap::new(),
        errors: Vec::new(),
        done: Vec::new(),
        signal: std::os::unix::process::ExitStatusExt::signal(&out.status),
    };
    for line in text.lines() {
        let mut words = line.splitn(3, ' ');
        let (kind, epoch, rest) = (words.next(), words.next(), words.next().unwrap_or(""));
        let Some(epoch) = epoch.and_then(|e| e.parse::<usize>().ok()) else {
            continue;
        };
        match kind {
            Some("piece") => report
                .ids
                .entry(epoch)
                .or_default()
                .extend(rest.split(',').map(|i| i.parse::<i64>().unwrap())),
            Some("batches") => {
                report.batches.insert(epoch, rest.parse().unwrap());
            }
            Some("error") => report.errors.push(rest.to_string()),
            Some("done") => report.done.push(epoch),
            _ => {}
        }
    }
    assert!(
        report.signal.is_some() || out.status.success(),
        "the trainer failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    report
}

/// `ds`, each partition made in no less than 20 ms.
fn paced(ds: &Dataset) -> Dataset {
    ds.map_batches(
        |batch: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
            std::thread::sleep(Duration::from_millis(20));
            Ok(batch)
        },
        Resources::cpu(1.0),
    )
}

fn each_once(mut ids: Vec<i64>, n: i64) {
    ids.sort_unstable();
    let distinct = {
        let mut d = ids.clone();
        d.dedup();
        d.len()
    };
    let (first, last) = (ids.first().copied(), ids.last().copied());
    assert!(
        ids.len() == n as usize
            && distinct == n as usize
            && first == Some(0)
            && last == Some(n - 1),
        "every row once across ranks: {} rows, {distinct} distinct, from {first:?} to {last:?}, of {n}",
        ids.len()
    );
}

/// Waits (up to 10 s) for the store counters to read zero.
fn store_empties(read: impl Fn() -> u64) -> u64 {
    let start = Instant::now();
    while read() != 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    read()
}

#[test]
fn trainer_processes_get_every_row_once_per_epoch_by_shared_memory_and_over_quic() {
    const NAME: &str =
        "trainer_processes_get_every_row_once_per_epoch_by_shared_memory_and_over_quic";
    if as_trainer() {
        return;
    }
    let (ctx, dir, n) = (ctx(), cluster(), 20_000);
    // Equal shares, so that both paths carry rows whichever rank asks
    // first (demand-driven, a fast rank could otherwise take them all).
    let options = SplitOptions {
        equal: true,
        block_order_seed: Some(7),
        ..SplitOptions::default()
    };
    let service = serve(&dir, &ctx.range(n as u64, 40), options);
    let shm = trainer(NAME, &dir, &service, 0, "epochs:2");
    let quic = trainer(NAME, &dir, &service, 1, "epochs:2:bytes");
    let (shm, quic) = finish(shm, quic);
    for epoch in 0..2 {
        let (a, b) = (&shm.ids[&epoch], &quic.ids[&epoch]);
        assert_eq!((a.len(), b.len()), (10_000, 10_000), "equal shares");
        each_once([a.clone(), b.clone()].concat(), n);
    }
    assert_ne!(shm.ids[&0], shm.ids[&1], "a new order in the next epoch");
    assert_eq!((shm.done.len(), quic.done.len()), (2, 2));
    let stats = service.stats();
    assert_eq!(stats[0].rows + stats[1].rows, 2 * n as usize);
    // Every piece mapped by the trainer on this host was let go.
    assert_eq!(store_empties(|| service.pieces_stats().used_bytes), 0);
    assert!(
        service.pieces_stats().peak_bytes > 0,
        "rank 0 read by shared memory"
    );
}

#[test]
fn equal_splits_across_processes_get_the_same_rows() {
    const NAME: &str = "equal_splits_across_processes_get_the_same_rows";
    if as_trainer() {
        return;
    }
    let (ctx, dir, n) = (ctx(), cluster(), 10_001);
    let options = SplitOptions {
        equal: true,
        ..SplitOptions::default()
    };
    let service = serve(&dir, &ctx.range(n as u64, 16), options);
    let a = trainer(NAME, &dir, &service, 0, "batches:7");
    let b = trainer(NAME, &dir, &service, 1, "epochs:1:bytes");
    let (a, b) = finish(a, b);
    assert_eq!(
        (a.ids[&0].len(), b.ids[&0].len()),
        (5_000, 5_000),
        "{:?} {:?} {:?}",
        service.stats(),
        a.errors,
        b.errors
    );
    assert_eq!(service.dropped_rows(), 1);
    // The batches each consumer got reach the driver's stats: rank 0's
    // cut by its process (5,000 rows in 7s: 715), rank 1's the pieces.
    assert_eq!(a.batches[&0], 715);
    let service = &service;
    let batches = |rank: usize| move || service.stats()[rank].batches;
    assert_eq!(settles(batches(0), 715), 715);
    let pieces = service.stats()[1].pieces;
    assert!(pieces > 0);
    assert_eq!(settles(batches(1), pieces), pieces);
}

/// What `read` gives once it gives `want`, or after 10 s (reports from a
/// trainer arrive as their frames do).
fn settles(read: impl Fn() -> usize, want: usize) -> usize {
    let start = Instant::now();
    while read() != want && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    read()
}

#[test]
fn a_rank_killed_mid_epoch_leaves_its_rows_to_the_other_exactly_once() {
    const NAME: &str = "a_rank_killed_mid_epoch_leaves_its_rows_to_the_other_exactly_once";
    if as_trainer() {
        return;
    }
    let (ctx, dir, n) = (ctx(), cluster(), 20_000);
    let slow = paced(&ctx.range(n as u64, 40));
    let service = serve(&dir, &slow, SplitOptions::default());
    let killed = trainer(NAME, &dir, &service, 1, "die-after:3");
    let survivor = trainer(NAME, &dir, &service, 0, "epochs:1");
    let (killed, survivor) = finish(killed, survivor);
    assert_eq!(killed.signal, Some(libc::SIGKILL));
    let got_by_killed = killed.ids.get(&0).cloned().unwrap_or_default();
    assert!(!got_by_killed.is_empty(), "the killed rank got rows first");
    each_once([got_by_killed, survivor.ids[&0].clone()].concat(), n);
    assert_eq!(survivor.errors, Vec::<String>::new());
}

#[test]
fn a_rank_killed_mid_epoch_fails_the_other_naming_it_under_the_fail_policy() {
    const NAME: &str = "a_rank_killed_mid_epoch_fails_the_other_naming_it_under_the_fail_policy";
    if as_trainer() {
        return;
    }
    let (ctx, dir) = (ctx(), cluster());
    let slow = paced(&ctx.range(20_000, 40));
    let options = SplitOptions {
        on_lost_rank: LostRank::Fail,
        ..SplitOptions::default()
    };
    let service = serve(&dir, &slow, options);
    let started = Instant::now();
    let killed = trainer(NAME, &dir, &service, 1, "die-after:2");
    let survivor = trainer(NAME, &dir, &service, 0, "epochs:1");
    let (killed, survivor) = finish(killed, survivor);
    assert_eq!(killed.signal, Some(libc::SIGKILL));
    assert_eq!(survivor.errors.len(), 1, "one error, then the stream ends");
    assert!(
        survivor.errors[0].contains("rank 1 was lost"),
        "{:?}",
        survivor.errors
    );
    // Within the connection's idle timeout (5 s) and some start-up.
    assert!(started.elapsed() < Duration::from_secs(45));
    // The epoch's job stopped and let its partitions go.
    assert_eq!(store_empties(|| ctx.store_stats().used_bytes), 0);
    assert_eq!(store_empties(|| service.pieces_stats().used_bytes), 0);
}

#[test]
fn a_rank_that_never_asks_for_the_next_epoch_is_named_and_nothing_is_left() {
    const NAME: &str = "a_rank_that_never_asks_for_the_next_epoch_is_named_and_nothing_is_left";
    if as_trainer() {
        return;
    }
    let (ctx, dir) = (ctx(), cluster());
    let options = SplitOptions {
        barrier_timeout: Duration::from_secs(2),
        ..SplitOptions::default()
    };
    let service = serve(&dir, &ctx.range(4_000, 8), options);
    let leaver = trainer(NAME, &dir, &service, 1, "epochs:1");
    let stayer = trainer(NAME, &dir, &service, 0, "epochs:2");
    let (leaver, stayer) = finish(leaver, stayer);
    assert_eq!(leaver.done, vec![0]);
    assert_eq!(stayer.done, vec![0]);
    assert_eq!(stayer.errors.len(), 1);
    assert!(
        stayer.errors[0].contains("epoch 1") && stayer.errors[0].contains("[1]"),
        "{:?}",
        stayer.errors
    );
    assert_eq!(store_empties(|| ctx.store_stats().used_bytes), 0);
    assert_eq!(store_empties(|| service.pieces_stats().used_bytes), 0);
}

#[test]
fn a_trainer_of_another_cluster_is_refused() {
    let (ctx, dir, other) = (ctx(), cluster(), cluster());
    let service = serve(&dir, &ctx.range(100, 2), SplitOptions::default());
    let handle = &service.handles()[0];
    let stranger = RemoteSplit::open(&TlsFiles::in_dir(other.path(), "trainer-0"), handle);
    let error = stranger.err().expect("refused").to_string();
    assert!(error.contains(&handle.to_string()), "{error}");
    // A handle naming no split of the driver: its reader is told so.
    let mut wrong = handle.clone();
    wrong.service ^= 1;
    let split = RemoteSplit::open(&TlsFiles::in_dir(dir.path(), "trainer-0"), &wrong).unwrap();
    let first = split.epoch(0).unwrap().next().expect("an answer");
    assert!(
        first.unwrap_err().to_string().contains("is served here"),
        "the driver names what is wrong"
    );
}
