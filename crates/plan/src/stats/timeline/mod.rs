//! A job's timeline in the Chrome trace format, which Perfetto and
//! chrome://tracing open: a process per node with a track per slot (the
//! tasks it ran, each partition they yielded with its size) and tracks of
//! paused tasks with their cause, a track per stage with the times it
//! waited for a slot or memory, a track per trainer rank of a streaming
//! split with the times it waited for data, the job's store bytes against
//! the store's capacity, with the bytes it spilled to disk so far, and
//! each exchange's hand-over to its reducers with the bytes exchanged so
//! far.
//!
//! Slots are laid out from the events: a task takes the lowest track of its
//! node free when it starts or resumes, and gives it back when it pauses,
//! finishes, is retried or skipped; a run its node timed (`Event::ran`) is
//! placed where its worker computed. A node never shows more tracks than
//! tasks it ran at once.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::stats::{Event, EventKind, JobStats, PauseCause};

mod page;

pub use page::{page, write_page};

/// Track ids of the paused-task tracks start here, after any slot's.
const PAUSE_TRACKS: usize = 10_000;
/// Track ids of the stages' wait tracks (in the job's process) start here.
const WAIT_TRACKS: usize = 20_000;
/// Track ids of a streaming split's ranks (in the job's process) start here.
const RANK_TRACKS: usize = 30_000;

/// Writes the Chrome trace of `stats` to `path`: whole or not at all (it is
/// written beside it, then renamed).
pub fn write(stats: &JobStats, path: &Path) -> Result<()> {
    write_whole(path, chrome_trace(stats).to_string().as_bytes())
}

/// Writes `bytes` beside `path`, then renames them into it: a reader sees
/// the whole file or none.
fn write_whole(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::sink::write_whole(path, |tmp| {
        std::fs::write(tmp, bytes).map_err(|e| Error::io("writing", tmp, e))
    })
}

/// The Chrome trace of `stats` (a JSON object with `traceEvents`).
pub fn chrome_trace(stats: &JobStats) -> Value {
    let mut trace = Trace::new(stats);
    for (when, e) in in_run_order(&stats.events) {
        // `when` places runs where their node ran them; pauses keep the
        // executor's times, as the stats count them.
        let (task, at, node) = (e.task.0, e.at, e.node);
        match e.kind {
            EventKind::TaskStarted | EventKind::TaskResumed => {
                trace.end_pause(task, at);
                trace.start_run(task, e.stage.0, node, when);
            }
            EventKind::PartitionYielded => trace.output(task, when, e.bytes),
            EventKind::TaskSuspended => {
                trace.end_run(task, when, "paused");
                let cause = e.cause.unwrap_or(PauseCause::OutputBudget);
                trace.start_pause(task, e.stage.0, node, at, cause, e.bytes);
            }
            EventKind::TaskFinished => trace.end_run(task, when, "finished"),
            EventKind::TaskRetried => {
                trace.end_run(task, when, "retried");
                trace.end_pause(task, at);
            }
            EventKind::TaskSkipped => trace.end_run(task, when, "skipped"),
        }
    }
    trace.waits();
    trace.rank_waits();
    trace.finish(stats.wall)
}

/// The events in the order things happened on the nodes, each with when
/// it did: a run its node timed (`Event::ran`, told with its end or pause)
/// starts and ends where its worker computed, and the partitions it
/// yielded fall within it; other events happened when the executor heard
/// of them. A node queues tasks beyond its slots, so a run may begin well
/// after its start event; timed on the worker, a slot's track shows what
/// it ran.
fn in_run_order(events: &[Event]) -> Vec<(Duration, Event)> {
    let mut out: Vec<(Duration, Event)> = events.iter().map(|e| (e.at, *e)).collect();
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut yielded: HashMap<u64, Vec<usize>> = HashMap::new();
    for i in 0..out.len() {
        let e = out[i].1;
        match e.kind {
            EventKind::TaskStarted | EventKind::TaskResumed => {
                open.insert(e.task.0, i);
                yielded.remove(&e.task.0);
            }
            EventKind::PartitionYielded => yielded.entry(e.task.0).or_default().push(i),
            _ => {
                let start = open.remove(&e.task.0);
                let parts = yielded.remove(&e.task.0).unwrap_or_default();
                if let (Some(start), Some((from, to))) = (start, e.ran) {
                    out[start].0 = from;
                    out[i].0 = to;
                    for p in parts {
                        out[p].0 = out[p].0.clamp(from, to);
                    }
                }
            }
        }
    }
    // Stable: events at the same moment keep the order they were seen in.
    out.sort_by_key(|(when, _)| *when);
    out
}

/// A task running on a slot track, or paused on a pause track.
struct Open {
    stage: usize,
    node: u32,
    track: usize,
    since: Duration,
    cause: Option<PauseCause>,
    bytes: u64,
}

struct Trace<'a> {
    stats: &'a JobStats,
    events: Vec<Value>,
    running: HashMap<u64, Open>,
    paused: HashMap<u64, Open>,
    /// Per node: which slot tracks are taken, and which pause tracks.
    slots: HashMap<u32, Vec<bool>>,
    pauses: HashMap<u32, Vec<bool>>,
}

impl<'a> Trace<'a> {
    fn new(stats: &'a JobStats) -> Self {
        let mut events = vec![json!({
            "ph": "M", "name": "process_name", "pid": 0, "args": {"name": "job"}
        })];
        let capacity = stats.store_capacity;
        events.push(counter("store capacity", Duration::ZERO, capacity));
        // Each exchange's hand-over, and the bytes exchanged so far.
        let mut exchanged = 0;
        for x in &stats.exchanges {
            exchanged += x.bytes;
            let name = stats
                .operators
                .get(x.stage)
                .map_or("exchange", |o| o.name.as_str());
            events.push(json!({
                "ph": "i", "s": "p", "cat": "exchange", "name": name,
                "pid": 0, "tid": 0, "ts": micros(x.at),
                "args": {"stage": x.stage, "rows": x.rows, "bytes": x.bytes},
            }));
            events.push(counter("exchanged bytes", x.at, exchanged));
        }
        let mut spilled = 0;
        for s in &stats.store_samples {
            events.push(counter("store bytes", s.at, s.used));
            if s.spilled != spilled {
                spilled = s.spilled;
                events.push(counter("spilled bytes", s.at, spilled));
            }
        }
        Self {
            stats,
            events,
            running: HashMap::new(),
            paused: HashMap::new(),
            slots: HashMap::new(),
            pauses: HashMap::new(),
        }
    }

    fn start_run(&mut self, task: u64, stage: usize, node: u32, at: Duration) {
        let track = take_track(self.slots.entry(node).or_default());
        let open = Open {
            stage,
            node,
            track,
            since: at,
            cause: None,
            bytes: 0,
        };
        self.running.insert(task, open);
    }

    fn end_run(&mut self, task: u64, at: Duration, how: &str) {
        let Some(run) = self.running.remove(&task) else {
            return;
        };
        self.slots.entry(run.node).or_default()[run.track] = false;
        let name = self.stage_name(run.stage);
        self.events.push(json!({
            "ph": "X", "cat": "task", "name": name,
            "pid": run.node + 1, "tid": run.track + 1,
            "ts": micros(run.since), "dur": micros(at.saturating_sub(run.since)),
            "args": {"task": task, "stage": run.stage, "end": how},
        }));
    }

    fn output(&mut self, task: u64, at: Duration, bytes: u64) {
        if let Some(run) = self.running.get(&task) {
            self.events.push(json!({
                "ph": "i", "s": "t", "cat": "partition", "name": "partition",
                "pid": run.node + 1, "tid": run.track + 1, "ts": micros(at),
                "args": {"task": task, "bytes": bytes},
            }));
        }
    }

    fn start_pause(
        &mut self,
        task: u64,
        stage: usize,
        node: u32,
        at: Duration,
        cause: PauseCause,
        bytes: u64,
    ) {
        let track = take_track(self.pauses.entry(node).or_default());
        let open = Open {
            stage,
            node,
            track,
            since: at,
            cause: Some(cause),
            bytes,
        };
        self.paused.insert(task, open);
    }

    fn end_pause(&mut self, task: u64, at: Duration) {
        let Some(pause) = self.paused.remove(&task) else {
            return;
        };
        self.pauses.entry(pause.node).or_default()[pause.track] = false;
        let cause = pause.cause.map_or("", PauseCause::name);
        self.events.push(json!({
            "ph": "X", "cat": "pause", "name": format!("paused: {cause}"),
            "pid": pause.node + 1, "tid": PAUSE_TRACKS + pause.track + 1,
            "ts": micros(pause.since), "dur": micros(at.saturating_sub(pause.since)),
            "args": {
                "task": task, "stage": self.stage_name(pause.stage),
                "cause": cause, "pending_bytes": pause.bytes,
            },
        }));
    }

    /// A track per stage that waited, in the job's process, with the times
    /// it waited for a slot or memory.
    fn waits(&mut self) {
        let mut named = std::collections::BTreeSet::new();
        for w in &self.stats.waits {
            let stage = w.stage.0;
            let tid = WAIT_TRACKS + stage;
            if named.insert(stage) {
                let name = format!("{} waits", self.stage_name(stage));
                self.events.push(json!({
                    "ph": "M", "name": "thread_name", "pid": 0, "tid": tid, "args": {"name": name}
                }));
            }
            self.events.push(json!({
                "ph": "X", "cat": "wait", "name": format!("waiting: {}", w.wait.name()),
                "pid": 0, "tid": tid,
                "ts": micros(w.from), "dur": micros(w.to.saturating_sub(w.from)),
                "args": {"stage": self.stage_name(stage), "cause": w.wait.name()},
            }));
        }
    }

    /// A track per trainer rank of a streaming split, in the job's
    /// process, named with what the rank got (rows, batches) and showing
    /// the times it waited for data.
    fn rank_waits(&mut self) {
        let mut named = std::collections::BTreeSet::new();
        let ranks = self.stats.rank_totals.len();
        let waited = self.stats.rank_waits.iter().map(|w| w.rank);
        for rank in (0..ranks).chain(waited) {
            if named.insert(rank) {
                let name = match self.stats.rank_totals.get(rank) {
                    Some(got) => format!(
                        "rank {rank} (trainer): {} rows, {} batches",
                        got.rows, got.batches
                    ),
                    None => format!("rank {rank} (trainer)"),
                };
                self.events.push(json!({
                    "ph": "M", "name": "thread_name", "pid": 0, "tid": RANK_TRACKS + rank, "args": {"name": name}
                }));
            }
        }
        for w in &self.stats.rank_waits {
            let tid = RANK_TRACKS + w.rank;
            self.events.push(json!({
                "ph": "X", "cat": "rank", "name": "waiting for data",
                "pid": 0, "tid": tid,
                "ts": micros(w.from), "dur": micros(w.to.saturating_sub(w.from)),
                "args": {"rank": w.rank},
            }));
        }
    }

    fn stage_name(&self, stage: usize) -> String {
        self.stats
            .operators
            .get(stage)
            .map_or_else(|| format!("stage {stage}"), |o| o.name.clone())
    }

    /// Ends what is still open at the job's end and names the tracks.
    fn finish(mut self, wall: Duration) -> Value {
        let running: Vec<u64> = self.running.keys().copied().collect();
        for task in running {
            self.end_run(task, wall, "cut off");
        }
        let paused: Vec<u64> = self.paused.keys().copied().collect();
        for task in paused {
            self.end_pause(task, wall);
        }
        let nodes = self.slots.keys().chain(self.pauses.keys()).copied();
        let mut nodes: Vec<u32> = nodes.collect();
        nodes.sort_unstable();
        nodes.dedup();
        for node in nodes {
            let name = self
                .stats
                .nodes
                .get(node as usize)
                .map_or_else(|| "node".to_string(), |n| format!("node {}", n.name));
            self.events.push(json!({
                "ph": "M", "name": "process_name", "pid": node + 1, "args": {"name": name}
            }));
            let slots = self.slots.get(&node).map_or(0, Vec::len);
            for track in 0..slots {
                self.events
                    .push(thread_name(node, track + 1, format!("slot {track}")));
            }
            let pauses = self.pauses.get(&node).map_or(0, Vec::len);
            for track in 0..pauses {
                let tid = PAUSE_TRACKS + track + 1;
                self.events
                    .push(thread_name(node, tid, format!("paused {track}")));
            }
        }
        json!({ "traceEvents": self.events, "displayTimeUnit": "ms" })
    }
}

/// The lowest free track, taken.
fn take_track(tracks: &mut Vec<bool>) -> usize {
    match tracks.iter().position(|taken| !taken) {
        Some(track) => {
            tracks[track] = true;
            track
        }
        None => {
            tracks.push(true);
            tracks.len() - 1
        }
    }
}

fn thread_name(node: u32, tid: usize, name: String) -> Value {
    json!({
        "ph": "M", "name": "thread_name", "pid": node + 1, "tid": tid, "args": {"name": name}
    })
}

fn counter(name: &str, at: Duration, bytes: u64) -> Value {
    json!({ "ph": "C", "name": name, "pid": 0, "ts": micros(at), "args": {"bytes": bytes} })
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[cfg(test)]
mod tests {
    use streambatch_core::{StageId, TaskId};

    use super::*;
    use crate::stats::Event;

    fn event(task: u64, kind: EventKind, ms: u64, cause: Option<PauseCause>) -> Event {
        Event {
            stage: StageId(0),
            task: TaskId(task),
            kind,
            at: Duration::from_millis(ms),
            node: 0,
            bytes: 10,
            cause,
            ran: None,
        }
    }

    #[test]
    fn tasks_take_the_lowest_free_slot_and_pauses_keep_their_cause() {
        use EventKind::*;
        let stats = JobStats {
            events: vec![
                event(1, TaskStarted, 0, None),
                event(2, TaskStarted, 1, None),
                event(1, TaskSuspended, 2, Some(PauseCause::StoreFull)),
                event(3, TaskStarted, 3, None),
                event(1, TaskResumed, 4, None),
                event(2, TaskFinished, 5, None),
                event(3, TaskFinished, 6, None),
                event(1, TaskFinished, 7, None),
            ],
            wall: Duration::from_millis(8),
            ..Default::default()
        };
        let trace = chrome_trace(&stats);
        let slices: Vec<(u64, u64, String)> = trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                let task = e["args"]["task"].as_u64().unwrap();
                (task, e["tid"].as_u64().unwrap(), e["name"].to_string())
            })
            .collect();
        // Task 1 runs on slot 0 until it pauses; task 3 takes slot 0 then,
        // so task 1 resumes on slot 2 (tid 3).
        assert!(slices.contains(&(1, 1, "\"stage 0\"".into())), "{slices:?}");
        assert!(slices.contains(&(2, 2, "\"stage 0\"".into())), "{slices:?}");
        assert!(slices.contains(&(3, 1, "\"stage 0\"".into())), "{slices:?}");
        assert!(slices.contains(&(1, 3, "\"stage 0\"".into())), "{slices:?}");
        let pause = (1, PAUSE_TRACKS as u64 + 1, "\"paused: store full\"".into());
        assert!(slices.contains(&pause), "{slices:?}");
        assert_eq!(slices.len(), 5);
    }

    #[test]
    fn a_queued_run_is_drawn_where_its_worker_ran_it_and_shares_the_slot() {
        use EventKind::*;
        let ran = |task, kind, ms, from: u64, to: u64| Event {
            ran: Some((Duration::from_millis(from), Duration::from_millis(to))),
            ..event(task, kind, ms, None)
        };
        // Both started at once on a node of one slot: task 2 waited in the
        // node's queue until task 1 ended, then ran from 5 to 9 ms.
        let stats = JobStats {
            events: vec![
                event(1, TaskStarted, 0, None),
                event(2, TaskStarted, 0, None),
                ran(1, TaskFinished, 6, 0, 4),
                event(2, PartitionYielded, 10, None),
                ran(2, TaskFinished, 10, 5, 9),
            ],
            wall: Duration::from_millis(11),
            ..Default::default()
        };
        let trace = chrome_trace(&stats);
        let of = |ph: &str| -> Vec<(u64, u64, f64, f64)> {
            trace["traceEvents"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["ph"] == ph && e["pid"] == 1)
                .map(|e| {
                    let task = e["args"]["task"].as_u64().unwrap();
                    let dur = e["dur"].as_f64().unwrap_or(0.0);
                    (
                        task,
                        e["tid"].as_u64().unwrap(),
                        e["ts"].as_f64().unwrap(),
                        dur,
                    )
                })
                .collect()
        };
        // One slot track, each run where it ran.
        assert_eq!(
            of("X"),
            vec![(1, 1, 0.0, 4000.0), (2, 1, 5000.0, 4000.0)],
            "{trace}"
        );
        // Its partition within its run.
        assert_eq!(of("i"), vec![(2, 1, 9000.0, 0.0)], "{trace}");
    }
}
