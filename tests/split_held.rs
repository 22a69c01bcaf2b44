//! A split of a job whose outputs nodes hold, as a cluster driver's are:
//! handed on unread, each output told (once every piece of it is gone)
//! whether its rows were read or some were lost and must come again. A
//! rank takes first what nodes of its host hold; rows a lost node held come
//! again and reach one rank; equal shares let the remainder go, so that
//! the job can end. Each test runs under a watchdog: a hang fails it.

use std::collections::{HashSet, VecDeque};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch};
use streambatch::{
    Dataset, Error, HeldAt, HeldRows, JobStats, NodeConfig, Piece, Pulled, Result, Split,
};
use streambatch_plan::{ExecPlan, HeldSource, JobStream, Runner};

/// An output: its number, the host of the node holding it, its rows.
type Output = (usize, &'static str, RecordBatch);

/// What the job heard of its outputs, as each was let go: its number and
/// the rows lost (empty: all read or dropped).
type Heard = Arc<Mutex<Vec<(usize, Vec<(usize, usize)>)>>>;

/// Rows lost of an output, to be made again: the output, its host, and
/// each lost run of rows with its first row in the output.
type Remake = (usize, &'static str, Vec<(RecordBatch, usize)>);

/// Runs every plan as one fake cluster job over `outputs`, whose first
/// read of each output in `failing` fails (its node is lost).
struct FakeCluster {
    outputs: Vec<Output>,
    failing: Arc<Mutex<HashSet<usize>>>,
    heard: Heard,
    config: NodeConfig,
}

impl Runner for FakeCluster {
    fn run(&self, _: ExecPlan) -> Result<Box<dyn JobStream>> {
        let (told, reports) = channel();
        Ok(Box::new(FakeJob {
            queue: (self.outputs.iter().cloned())
                .map(|(i, host, batch)| (i, host, batch, 0))
                .collect(),
            told,
            reports,
            unresolved: 0,
            said_drained: false,
            failing: self.failing.clone(),
            heard: self.heard.clone(),
            live: Default::default(),
        }))
    }

    fn config(&self) -> &NodeConfig {
        &self.config
    }
}

/// The job's stream: outputs then `Drained`; rows reported lost come
/// again (only those); the end once every output was let go.
struct FakeJob {
    /// Outputs to hand on: number, host, rows, their first row in the output.
    queue: VecDeque<(usize, &'static str, RecordBatch, usize)>,
    told: Sender<Remake>,
    reports: Receiver<Remake>,
    unresolved: usize,
    said_drained: bool,
    failing: Arc<Mutex<HashSet<usize>>>,
    heard: Heard,
    live: Arc<Mutex<JobStats>>,
}

impl FakeJob {
    fn hand_on(&mut self) -> Option<HeldRows> {
        let (output, host, batch, first) = self.queue.pop_front()?;
        self.unresolved += 1;
        self.said_drained = false;
        let at = HeldAt {
            node: format!("node-{host}"),
            addr: "127.0.0.1:1".into(),
            host: host.into(),
            store_dir: "/nowhere".into(),
            partition: output as u64,
            partition_rows: batch.num_rows(),
            first,
        };
        let source = FakeOutput {
            output,
            host,
            first,
            batch: batch.clone(),
            lost: Mutex::default(),
            failing: self.failing.clone(),
            heard: self.heard.clone(),
            told: self.told.clone(),
        };
        Some(HeldRows::new(at, batch.num_rows(), Box::new(source)))
    }
}

impl Iterator for FakeJob {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Result<RecordBatch>> {
        loop {
            return match self.next_pulled()? {
                Ok(Pulled::Held(held)) => Some(held.read()),
                Ok(Pulled::Batch(batch)) => Some(Ok(batch)),
                Ok(Pulled::Drained) => continue,
                Err(e) => Some(Err(e)),
            };
        }
    }
}

impl JobStream for FakeJob {
    fn live_stats(&self) -> Arc<Mutex<JobStats>> {
        self.live.clone()
    }

    fn next_pulled(&mut self) -> Option<Result<Pulled>> {
        loop {
            if let Some(held) = self.hand_on() {
                return Some(Ok(Pulled::Held(held)));
            }
            if self.unresolved == 0 {
                return None;
            }
            // As an executor does, it hears of what was let go before it
            // says it is drained.
            let report = match self.reports.try_recv() {
                Ok(report) => report,
                Err(_) if !self.said_drained => {
                    self.said_drained = true;
                    return Some(Ok(Pulled::Drained));
                }
                Err(_) => self.reports.recv().ok()?,
            };
            let (output, host, lost) = report;
            self.unresolved -= 1;
            for (rows, first) in lost {
                self.queue.push_back((output, host, rows, first));
            }
        }
    }

    fn next_held_ready(&mut self) -> Option<HeldRows> {
        self.hand_on()
    }
}

/// An output (or rows of one made again) a fake node holds.
struct FakeOutput {
    output: usize,
    host: &'static str,
    /// Its first row in the output.
    first: usize,
    batch: RecordBatch,
    lost: Mutex<Vec<(usize, usize)>>,
    failing: Arc<Mutex<HashSet<usize>>>,
    heard: Heard,
    told: Sender<Remake>,
}

impl HeldSource for FakeOutput {
    fn read(&self, offset: usize, len: usize) -> Result<RecordBatch> {
        if self.failing.lock().unwrap().remove(&self.output) {
            return Err(Error::NodeLost {
                node: format!("node-{}", self.host),
            });
        }
        Ok(self.batch.slice(offset, len))
    }

    fn lost(&self, offset: usize, len: usize) {
        self.lost.lock().unwrap().push((offset, len));
    }

    fn any_lost(&self) -> bool {
        !self.lost.lock().unwrap().is_empty()
    }
}

impl Drop for FakeOutput {
    fn drop(&mut self) {
        let lost = std::mem::take(&mut *self.lost.lock().unwrap());
        let in_output = lost.iter().map(|&(o, l)| (self.first + o, l)).collect();
        self.heard.lock().unwrap().push((self.output, in_output));
        let rows = lost
            .into_iter()
            .map(|(o, l)| (self.batch.slice(o, l), self.first + o))
            .collect();
        let _ = self.told.send((self.output, self.host, rows));
    }
}

/// Rows per output.
const ROWS: usize = 10;

/// Output `i`'s `rows` rows: ids `i * ROWS ..`.
fn output_rows(i: usize, rows: usize) -> RecordBatch {
    let first = (i * ROWS) as i64;
    RecordBatch::try_from_iter([(
        "id",
        Arc::new(Int64Array::from_iter_values(first..first + rows as i64)) as _,
    )])
    .unwrap()
}

/// `n` outputs of `ROWS` rows (the last `last` rows), held on hosts `a`
/// and `b` in turn; the first read of each of `failing` fails.
fn cluster(n: usize, last: usize, failing: &[usize]) -> (Dataset, Heard) {
    let outputs = (0..n)
        .map(|i| {
            let rows = if i + 1 == n { last } else { ROWS };
            (i, ["a", "b"][i % 2], output_rows(i, rows))
        })
        .collect();
    let heard = Heard::default();
    let runner = FakeCluster {
        outputs,
        failing: Arc::new(Mutex::new(failing.iter().copied().collect())),
        heard: heard.clone(),
        config: NodeConfig::default(),
    };
    (Dataset::range(Arc::new(runner), 1, 1), heard)
}

fn ids(batch: &RecordBatch) -> Vec<i64> {
    batch
        .column(0)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec()
}

/// Runs `body` on a thread of its own; a hang past `within` fails.
fn watchdog<T: Send + 'static>(within: Duration, body: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, result) = channel();
    std::thread::spawn(move || {
        let _ = done.send(body());
    });
    result
        .recv_timeout(within)
        .expect("the split hung (or its thread panicked)")
}

/// Each rank's ids of epoch 0, read in this process on a thread each, and
/// the splits.
fn consume(splits: Vec<Split>) -> (Vec<Vec<i64>>, Vec<Split>) {
    let ranks: Vec<_> = splits
        .into_iter()
        .map(|split| {
            std::thread::spawn(move || {
                let got: Vec<i64> = split.epoch(0).flat_map(|b| ids(&b.unwrap())).collect();
                (got, split)
            })
        })
        .collect();
    ranks.into_iter().map(|r| r.join().unwrap()).unzip()
}

#[test]
fn a_rank_takes_first_what_nodes_of_its_host_hold() {
    let (ds, heard) = cluster(20, ROWS, &[]);
    let got = watchdog(Duration::from_secs(60), move || {
        let splits = ds.streaming_split(2, false).unwrap();
        // Ranks served to trainers on hosts `a` and `b`.
        let mut streams: Vec<_> = splits.iter().map(|s| s.forwarded_epoch(0)).collect();
        streams[0].prefer_host("a");
        streams[1].prefer_host("b");
        let mut got: Vec<Vec<(String, Vec<i64>)>> = vec![vec![], vec![]];
        let mut open = [true, true];
        while open.contains(&true) {
            for rank in 0..2 {
                if !open[rank] {
                    continue;
                }
                match streams[rank].next_piece() {
                    Some(Ok(Piece::Held(held))) => {
                        let host = held.at().host.clone();
                        got[rank].push((host, ids(&held.read().unwrap())));
                        streams[rank].confirm(); // the trainer got it
                    }
                    Some(other) => panic!("rows not held by a node: {other:?}"),
                    None => open[rank] = false,
                }
            }
        }
        got
    });
    for (rank, host) in [(0, "a"), (1, "b")] {
        assert_eq!(got[rank].len(), 10, "rank {rank}: {:?}", got[rank]);
        for (held_on, _) in &got[rank] {
            assert_eq!(held_on, host, "rank {rank} took another host's piece");
        }
    }
    let mut all: Vec<i64> = got
        .iter()
        .flatten()
        .flat_map(|(_, ids)| ids.clone())
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..200).collect::<Vec<_>>());
    let heard = heard.lock().unwrap();
    assert_eq!(heard.len(), 20, "every output heard of: {heard:?}");
    assert!(heard.iter().all(|(_, lost)| lost.is_empty()), "{heard:?}");
}

#[test]
fn rows_a_lost_node_held_come_again_and_reach_one_rank() {
    let (ds, heard) = cluster(12, ROWS, &[3, 8]);
    let ranks = watchdog(Duration::from_secs(60), move || {
        consume(ds.streaming_split(2, false).unwrap()).0
    });
    let mut all = ranks.concat();
    all.sort_unstable();
    assert_eq!(all, (0..120).collect::<Vec<_>>(), "every row once");
    let heard = heard.lock().unwrap();
    let mut lost: Vec<usize> = (heard.iter())
        .filter(|(_, lost)| !lost.is_empty())
        .map(|(output, _)| *output)
        .collect();
    lost.sort_unstable(); // the ranks race: either may be heard of first
    assert_eq!(lost, [3, 8], "outputs 3 and 8 found lost once: {heard:?}");
    // The 12 outputs, and each run of rows made again, let go.
    let remade: usize = heard.iter().map(|(_, lost)| lost.len()).sum();
    assert_eq!(heard.len(), 12 + remade, "{heard:?}");
}

#[test]
fn equal_shares_of_held_rows_let_the_remainder_go_and_the_job_ends() {
    let (ds, heard) = cluster(11, 1, &[5]);
    let (ranks, dropped) = watchdog(Duration::from_secs(60), move || {
        let (ranks, splits) = consume(ds.streaming_split(2, true).unwrap());
        (ranks, splits[0].dropped_rows())
    });
    assert_eq!(ranks[0].len(), 50, "equal shares");
    assert_eq!(ranks[1].len(), 50, "equal shares");
    let mut all = ranks.concat();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 100, "no row twice");
    assert_eq!(dropped, 1, "one row left over");
    // Every output, and each run of output 5's rows made again, let go:
    // the job could end.
    let heard = heard.lock().unwrap();
    let remade: usize = heard.iter().map(|(_, lost)| lost.len()).sum();
    assert!(remade > 0, "output 5 found lost: {heard:?}");
    assert_eq!(heard.len(), 11 + remade, "{heard:?}");
}
