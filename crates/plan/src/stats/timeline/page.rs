//! A job's timeline as a self-contained HTML page, drawn from its Chrome
//! trace (what [`super::write`] wrote): slots busy per operator over time,
//! the store's bytes against its capacity, tasks paused for memory by
//! cause, and a lane per node and slot with the tasks it ran, like Figure 3
//! of the streaming batch paper. The charts are inline SVG, so the page
//! needs no network and no script to view.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;
use streambatch_core::format_bytes;

use crate::error::{Error, Result};

/// Columns the time axis is cut into for the area charts.
const BINS: usize = 400;
/// Drawing width of every chart, in pixels.
const WIDTH: f64 = 1100.0;
/// Left margin for the y axis labels.
const LEFT: f64 = 80.0;
/// Height of one slot lane.
const LANE: f64 = 9.0;
/// Lanes drawn at most; beyond them the page says how many it left out.
const MAX_LANES: usize = 160;
/// One colour per stage, in plan order (wrapping).
const COLOURS: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];
const PAUSE_COLOURS: [(&str, &str); 2] = [("output budget", "#f1a340"), ("store full", "#d7301f")];
/// The store's bytes in memory, and the bytes it spilled so far.
/// (Neither is a stage's colour.)
const STORE_COLOUR: &str = "#2f4b7c";
const SPILLED_COLOUR: &str = "#a05195";
/// Stage waits: for a slot, then the pause causes.
const WAIT_COLOURS: [(&str, &str); 3] = [
    ("no slot", "#8c8c8c"),
    ("output budget", "#f1a340"),
    ("store full", "#d7301f"),
];

/// Reads the Chrome trace at `trace` and writes its page to `out`: whole
/// or not at all (it is written beside it, then renamed).
pub fn write_page(trace: &Path, out: &Path) -> Result<()> {
    let text = std::fs::read_to_string(trace).map_err(|e| Error::io("reading", trace, e))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| Error::Invalid(format!("{} is not a JSON trace: {e}", trace.display())))?;
    let title = trace.file_name().unwrap_or_default().to_string_lossy();
    let html =
        page(&value, &title).map_err(|e| Error::Invalid(format!("{}: {e}", trace.display())))?;
    super::write_whole(out, html.as_bytes())
}

/// The HTML page of a Chrome trace written by [`super::chrome_trace`].
/// Fails, saying why, when `trace` has no `traceEvents` array.
pub fn page(trace: &Value, title: &str) -> std::result::Result<String, String> {
    let job = Job::read(trace)?;
    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title} — streambatch timeline</title>\n\
         <style>body{{font:13px sans-serif;margin:16px;color:#222;background:#fff}}\
         h1{{font-size:18px}}h2{{font-size:15px;margin:18px 0 4px}}p.note{{color:#555;margin:2px 0 6px}}\
         table{{border-collapse:collapse}}td,th{{padding:2px 10px;text-align:right}}\
         td:first-child,th:first-child{{text-align:left}}.swatch{{display:inline-block;width:11px;height:11px;margin-right:5px}}\
         svg text{{font:11px sans-serif;fill:#333}}</style></head><body>\n\
         <h1>{title}: {:.2} s, {} tasks on {} node(s)</h1>\n",
        job.end,
        job.task_count,
        job.nodes.len().max(1),
        title = escape(title),
    );
    job.legend(&mut html);
    job.slots_chart(&mut html);
    job.store_chart(&mut html);
    job.pause_chart(&mut html);
    job.wait_lanes(&mut html);
    job.lanes(&mut html);
    html.push_str("</body></html>\n");
    Ok(html)
}

/// A slice of a track: a task's run, or a paused task.
struct Slice {
    /// The stage (runs) or the cause's place in [`PAUSE_COLOURS`] (pauses).
    kind: usize,
    node: u64,
    track: u64,
    start: f64,
    end: f64,
}

/// What the page draws, in seconds.
struct Job {
    stages: BTreeMap<usize, String>,
    tasks: Vec<Slice>,
    pauses: Vec<Slice>,
    /// Stages waiting: `kind` is the cause's place in [`WAIT_COLOURS`],
    /// `track` the stage.
    waits: Vec<Slice>,
    /// Stage names by stage, from the wait tracks too.
    wait_names: BTreeMap<u64, String>,
    store: Vec<(f64, u64)>,
    /// Bytes spilled to disk so far, when they grew.
    spilled: Vec<(f64, u64)>,
    capacity: u64,
    nodes: BTreeMap<u64, String>,
    /// Distinct tasks (a paused task runs in several slices).
    task_count: usize,
    end: f64,
}

impl Job {
    fn read(trace: &Value) -> std::result::Result<Self, String> {
        let events = trace["traceEvents"]
            .as_array()
            .ok_or("no `traceEvents` array: not a Chrome trace")?;
        let mut job = Job {
            stages: BTreeMap::new(),
            tasks: Vec::new(),
            pauses: Vec::new(),
            waits: Vec::new(),
            wait_names: BTreeMap::new(),
            store: Vec::new(),
            spilled: Vec::new(),
            capacity: 0,
            nodes: BTreeMap::new(),
            task_count: 0,
            end: 0.0,
        };
        let mut task_ids = std::collections::BTreeSet::new();
        for e in events {
            let seconds = |key: &str| e[key].as_f64().unwrap_or(0.0) / 1e6;
            let (start, dur) = (seconds("ts"), seconds("dur"));
            let (node, track) = (
                e["pid"].as_u64().unwrap_or(0),
                e["tid"].as_u64().unwrap_or(0),
            );
            match (e["ph"].as_str(), e["cat"].as_str()) {
                (Some("X"), Some("task")) => {
                    let stage = e["args"]["stage"].as_u64().unwrap_or(0) as usize;
                    let name = e["name"].as_str().unwrap_or("?").to_string();
                    job.stages.entry(stage).or_insert(name);
                    task_ids.insert(e["args"]["task"].as_u64().unwrap_or(0));
                    let end = start + dur;
                    job.tasks.push(Slice {
                        kind: stage,
                        node,
                        track,
                        start,
                        end,
                    });
                }
                (Some("X"), Some("pause")) => {
                    let cause = e["args"]["cause"].as_str().unwrap_or("");
                    let kind = PAUSE_COLOURS
                        .iter()
                        .position(|(name, _)| *name == cause)
                        .unwrap_or(0);
                    let end = start + dur;
                    job.pauses.push(Slice {
                        kind,
                        node,
                        track,
                        start,
                        end,
                    });
                }
                (Some("X"), Some("wait")) => {
                    let cause = e["args"]["cause"].as_str().unwrap_or("");
                    let kind = WAIT_COLOURS
                        .iter()
                        .position(|(name, _)| *name == cause)
                        .unwrap_or(0);
                    let stage = e["args"]["stage"].as_str().unwrap_or("?").to_string();
                    job.wait_names.insert(track, stage);
                    let end = start + dur;
                    job.waits.push(Slice {
                        kind,
                        node,
                        track,
                        start,
                        end,
                    });
                }
                (Some("C"), _) => {
                    let bytes = e["args"]["bytes"].as_u64().unwrap_or(0);
                    match e["name"].as_str() {
                        Some("store bytes") => job.store.push((start, bytes)),
                        Some("spilled bytes") => job.spilled.push((start, bytes)),
                        Some("store capacity") => job.capacity = bytes,
                        _ => {}
                    }
                }
                (Some("M"), _) if e["name"] == "process_name" && node > 0 => {
                    let name = e["args"]["name"].as_str().unwrap_or("node");
                    job.nodes.insert(node, name.to_string());
                }
                _ => {}
            }
            job.end = job.end.max(start + dur);
        }
        job.task_count = task_ids.len();
        job.store.sort_by(|a, b| a.0.total_cmp(&b.0));
        job.spilled.sort_by(|a, b| a.0.total_cmp(&b.0));
        job.tasks.sort_by_key(|t| (t.node, t.track));
        Ok(job)
    }

    fn colour(&self, stage: usize) -> &'static str {
        let place = self.stages.keys().position(|s| *s == stage).unwrap_or(0);
        COLOURS[place % COLOURS.len()]
    }

    fn legend(&self, html: &mut String) {
        let busy = |stage: usize| -> (usize, f64) {
            let runs = self.tasks.iter().filter(|t| t.kind == stage);
            runs.fold((0, 0.0), |(n, s), t| (n + 1, s + t.end - t.start))
        };
        html.push_str(
            "<table><tr><th>stage</th><th>task runs</th><th>slot-seconds</th><th>share</th></tr>\n",
        );
        let total: f64 = self.tasks.iter().map(|t| t.end - t.start).sum();
        for (stage, name) in &self.stages {
            let (runs, seconds) = busy(*stage);
            let _ = writeln!(
                html,
                "<tr><td><span class=\"swatch\" style=\"background:{}\"></span>{}</td>\
                 <td>{runs}</td><td>{seconds:.2}</td><td>{:.0}%</td></tr>",
                self.colour(*stage),
                escape(name),
                100.0 * seconds / total.max(f64::MIN_POSITIVE)
            );
        }
        html.push_str("</table>\n");
    }

    /// Slots busy per stage, stacked, over time.
    fn slots_chart(&self, html: &mut String) {
        let series: Vec<(&str, Vec<f64>)> = self
            .stages
            .keys()
            .map(|stage| {
                let runs = self.tasks.iter().filter(|t| t.kind == *stage);
                (self.colour(*stage), occupancy(runs, self.end))
            })
            .collect();
        let slots = self.lane_count(&self.tasks);
        html.push_str("<h2>Slots busy, by operator</h2>\n<p class=\"note\">How many of the job's slots each stage held, averaged over short windows; the top is the most tasks the job ran at once.</p>\n");
        stacked(html, &series, slots as f64, self.end, count);
    }

    /// The store's bytes (a step line) under its capacity (dashed), and
    /// the bytes it spilled so far (a second step line, when it spilled).
    fn store_chart(&self, html: &mut String) {
        let peak = self.store.iter().chain(&self.spilled).map(|s| s.1).max();
        let top = self.capacity.max(peak.unwrap_or(0)).max(1) as f64;
        let height = 160.0;
        html.push_str("<h2>Store memory</h2>\n<p class=\"note\">");
        let _ = write!(
            html,
            "<span class=\"swatch\" style=\"background:{STORE_COLOUR}\"></span>bytes the object store held in memory (all nodes of the job), against its capacity (dashed)"
        );
        if !self.spilled.is_empty() {
            let _ = write!(
                html,
                "; <span class=\"swatch\" style=\"background:{SPILLED_COLOUR}\"></span>bytes it spilled to disk so far"
            );
        }
        html.push_str(".</p>\n");
        let mut svg = Chart::new(height, self.end, top, |v| format_bytes(v as u64));
        for (series, colour) in [(&self.store, STORE_COLOUR), (&self.spilled, SPILLED_COLOUR)] {
            step_line(&mut svg, series, self.end, colour);
        }
        if self.capacity > 0 {
            let y = svg.y(self.capacity as f64);
            let _ = write!(
                svg.body,
                "<line x1=\"{LEFT}\" x2=\"{WIDTH}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#e15759\" stroke-dasharray=\"6 4\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">capacity {}</text>",
                WIDTH - 4.0,
                y + 13.0,
                format_bytes(self.capacity)
            );
        }
        svg.finish(html);
    }

    /// Tasks paused for memory, stacked by cause.
    fn pause_chart(&self, html: &mut String) {
        let series: Vec<(&str, Vec<f64>)> = PAUSE_COLOURS
            .iter()
            .enumerate()
            .map(|(kind, (_, colour))| {
                let paused = self.pauses.iter().filter(|p| p.kind == kind);
                (*colour, occupancy(paused, self.end))
            })
            .collect();
        let top = series
            .iter()
            .map(|(_, s)| s.iter().copied().fold(0.0, f64::max))
            .sum::<f64>()
            .max(1.0);
        html.push_str("<h2>Tasks paused for memory</h2>\n<p class=\"note\">");
        for (name, colour) in PAUSE_COLOURS {
            let _ = write!(
                html,
                "<span class=\"swatch\" style=\"background:{colour}\"></span>{name} &nbsp; "
            );
        }
        // From 0.0: an empty f64 sum is -0.0, which prints as "-0.00".
        let seconds = self.pauses.iter().fold(0.0, |s, p| s + (p.end - p.start));
        let _ = writeln!(
            html,
            "({} pauses, {seconds:.2} task-seconds). A task pauses when its output does not fit its stage's budget or the store; it resumes when memory frees.</p>",
            self.pauses.len()
        );
        stacked(html, &series, top.ceil(), self.end, count);
    }

    /// A lane per stage that waited, with when and why.
    fn wait_lanes(&self, html: &mut String) {
        html.push_str("<h2>Stages waiting for a slot or memory</h2>\n<p class=\"note\">");
        for (name, colour) in WAIT_COLOURS {
            let _ = write!(
                html,
                "<span class=\"swatch\" style=\"background:{colour}\"></span>{name} &nbsp; "
            );
        }
        html.push_str("A stage waits when it has inputs but no free slot fits it, or when its outputs would not fit in memory.</p>\n");
        let lane = 2.0 * LANE;
        let height = self.wait_names.len().max(1) as f64 * lane;
        let mut svg = Chart::new(height, self.end, 0.0, |_| String::new());
        for (row, (track, name)) in self.wait_names.iter().enumerate() {
            let y = svg.top + row as f64 * lane;
            let _ = write!(
                svg.body,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                LEFT - 6.0,
                y + lane - 5.0,
                escape(&name.chars().take(12).collect::<String>())
            );
            for w in self.waits.iter().filter(|w| w.track == *track) {
                let (x0, x1) = (svg.x(w.start), svg.x(w.end));
                let _ = write!(
                    svg.body,
                    "<rect x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"/>",
                    y + 2.0,
                    (x1 - x0).max(0.5),
                    lane - 4.0,
                    WAIT_COLOURS[w.kind].1
                );
            }
        }
        svg.finish(html);
    }

    /// A lane per node and slot with the tasks it ran.
    fn lanes(&self, html: &mut String) {
        let mut lanes: Vec<(u64, u64)> = self.tasks.iter().map(|t| (t.node, t.track)).collect();
        lanes.dedup();
        let shown = lanes.len().min(MAX_LANES);
        let _ = writeln!(
            html,
            "<h2>Tasks by node and slot</h2>\n<p class=\"note\">One lane per slot, coloured by stage.{}</p>",
            if lanes.len() > shown {
                format!(" The first {shown} of {} lanes.", lanes.len())
            } else {
                String::new()
            }
        );
        let height = shown as f64 * LANE;
        let mut svg = Chart::new(height, self.end, 0.0, |_| String::new());
        let mut previous_node = None;
        for (row, (node, track)) in lanes.iter().take(shown).enumerate() {
            let y = svg.top + row as f64 * LANE;
            if previous_node != Some(*node) {
                let name = self.nodes.get(node).map_or("node", String::as_str);
                let _ = write!(
                    svg.body,
                    "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                    LEFT - 6.0,
                    y + LANE,
                    escape(name)
                );
                previous_node = Some(*node);
            }
            for t in self
                .tasks
                .iter()
                .filter(|t| (t.node, t.track) == (*node, *track))
            {
                let (x0, x1) = (svg.x(t.start), svg.x(t.end));
                let _ = write!(
                    svg.body,
                    "<rect x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"/>",
                    y + 1.0,
                    (x1 - x0).max(0.5),
                    LANE - 2.0,
                    self.colour(t.kind)
                );
            }
        }
        svg.finish(html);
    }

    /// The most lanes of `slices` in use on all nodes together.
    fn lane_count(&self, slices: &[Slice]) -> usize {
        let mut lanes: Vec<(u64, u64)> = slices.iter().map(|t| (t.node, t.track)).collect();
        lanes.sort_unstable();
        lanes.dedup();
        lanes.len().max(1)
    }
}

/// A count on an axis: whole, or to a tenth (half of an axis up to 1).
fn count(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// `series` (time, bytes) as a step line on `svg` up to `end`.
fn step_line(svg: &mut Chart, series: &[(f64, u64)], end: f64, colour: &str) {
    if series.is_empty() {
        return;
    }
    let mut points = String::new();
    let mut last = svg.y(0.0);
    for (at, bytes) in series {
        let (x, y) = (svg.x(*at), svg.y(*bytes as f64));
        let _ = write!(points, "{x:.1},{last:.1} {x:.1},{y:.1} ");
        last = y;
    }
    let _ = write!(points, "{:.1},{last:.1}", svg.x(end));
    let _ = write!(
        svg.body,
        "<polyline points=\"{points}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\"/>"
    );
}

/// How many of `slices` were open, on average, in each of [`BINS`] windows
/// of `[0, end]`.
fn occupancy<'a>(slices: impl Iterator<Item = &'a Slice>, end: f64) -> Vec<f64> {
    let mut bins = vec![0.0; BINS];
    if end <= 0.0 {
        return bins;
    }
    let width = end / BINS as f64;
    for s in slices {
        let first = ((s.start / width) as usize).min(BINS - 1);
        let last = ((s.end / width) as usize).min(BINS - 1);
        for (bin, value) in bins.iter_mut().enumerate().take(last + 1).skip(first) {
            let (lo, hi) = (bin as f64 * width, (bin + 1) as f64 * width);
            *value += (s.end.min(hi) - s.start.max(lo)).max(0.0) / width;
        }
    }
    bins
}

/// A stacked area chart of `series` (colour, values per bin), bottom first.
fn stacked(
    html: &mut String,
    series: &[(&str, Vec<f64>)],
    top: f64,
    end: f64,
    label: impl Fn(f64) -> String,
) {
    let mut svg = Chart::new(160.0, end, top.max(1.0), label);
    let mut below = vec![0.0; BINS];
    let step = end / BINS as f64;
    for (colour, values) in series {
        let above: Vec<f64> = below.iter().zip(values).map(|(b, v)| b + v).collect();
        let mut points = String::new();
        for (bin, v) in above.iter().enumerate() {
            let (x0, x1) = (svg.x(bin as f64 * step), svg.x((bin + 1) as f64 * step));
            let y = svg.y(*v);
            let _ = write!(points, "{x0:.1},{y:.1} {x1:.1},{y:.1} ");
        }
        for (bin, v) in below.iter().enumerate().rev() {
            let (x0, x1) = (svg.x(bin as f64 * step), svg.x((bin + 1) as f64 * step));
            let y = svg.y(*v);
            let _ = write!(points, "{x1:.1},{y:.1} {x0:.1},{y:.1} ");
        }
        let _ = write!(
            svg.body,
            "<polygon points=\"{points}\" fill=\"{colour}\" stroke=\"none\"/>"
        );
        below = above;
    }
    svg.finish(html);
}

/// An SVG chart with a time axis in seconds and a value axis.
struct Chart {
    body: String,
    height: f64,
    top: f64,
    end: f64,
    max: f64,
}

impl Chart {
    fn new(height: f64, end: f64, max: f64, label: impl Fn(f64) -> String) -> Self {
        let mut chart = Chart {
            body: String::new(),
            height,
            top: 8.0,
            end: end.max(1e-6),
            max,
        };
        let bottom = chart.top + height;
        let _ = write!(
            chart.body,
            "<rect x=\"{LEFT}\" y=\"{}\" width=\"{}\" height=\"{height}\" fill=\"#f7f7f7\"/>",
            chart.top,
            WIDTH - LEFT
        );
        for tick in ticks(chart.end) {
            let x = chart.x(tick);
            let _ = write!(
                chart.body,
                "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{}\" y2=\"{bottom}\" stroke=\"#ddd\"/>\
                 <text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{tick} s</text>",
                chart.top,
                bottom + 14.0
            );
        }
        if max > 0.0 {
            for v in [0.0, max / 2.0, max] {
                let y = chart.y(v);
                let _ = write!(
                    chart.body,
                    "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                    LEFT - 6.0,
                    y + 4.0,
                    label(v)
                );
            }
        }
        chart
    }

    fn x(&self, seconds: f64) -> f64 {
        LEFT + (WIDTH - LEFT) * (seconds / self.end).clamp(0.0, 1.0)
    }

    fn y(&self, value: f64) -> f64 {
        self.top + self.height * (1.0 - (value / self.max).clamp(0.0, 1.0))
    }

    fn finish(self, html: &mut String) {
        let _ = writeln!(
            html,
            "<svg width=\"{WIDTH}\" height=\"{:.0}\" xmlns=\"http://www.w3.org/2000/svg\">{}</svg>",
            self.top + self.height + 22.0,
            self.body
        );
    }
}

/// Round tick marks for a time axis from 0 to `end` seconds.
fn ticks(end: f64) -> Vec<f64> {
    let raw = end / 8.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    (0..=8)
        .map(|i| i as f64 * step)
        .filter(|t| *t <= end + 1e-9)
        .map(|t| (t / step).round() * step)
        .map(|t| (t * 1e6).round() / 1e6)
        .collect()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use streambatch_core::{StageId, TaskId};

    use super::*;
    use crate::stats::{Event, EventKind, JobStats, OperatorStats, StoreSample, Wait, WaitSpan};

    #[test]
    fn a_page_draws_each_stage_the_store_and_the_lanes() {
        let event = |task, stage, kind, ms| Event {
            stage: StageId(stage),
            task: TaskId(task),
            kind,
            at: Duration::from_millis(ms),
            node: 0,
            bytes: 0,
            cause: None,
            ran: None,
        };
        let stats = JobStats {
            operators: vec![
                OperatorStats {
                    name: "read<&>".into(),
                    ..Default::default()
                },
                OperatorStats {
                    name: "map".into(),
                    ..Default::default()
                },
            ],
            events: vec![
                event(1, 0, EventKind::TaskStarted, 0),
                event(1, 0, EventKind::TaskFinished, 400),
                event(2, 1, EventKind::TaskStarted, 400),
                event(2, 1, EventKind::TaskFinished, 1000),
            ],
            store_samples: vec![
                StoreSample {
                    at: Duration::from_millis(400),
                    used: 1 << 20,
                    spilled: 0,
                },
                StoreSample {
                    at: Duration::from_millis(600),
                    used: 4 << 20,
                    spilled: 2 << 20,
                },
            ],
            store_capacity: 4 << 20,
            wall: Duration::from_secs(1),
            waits: vec![WaitSpan {
                stage: StageId(1),
                wait: Wait::NoSlot,
                from: Duration::from_millis(100),
                to: Duration::from_millis(400),
            }],
            ..Default::default()
        };
        let html = page(&super::super::chrome_trace(&stats), "t.json").unwrap();
        assert!(html.contains("read&lt;&amp;&gt;"), "names are escaped");
        assert!(html.contains("capacity 4.0 MiB"), "{html}");
        assert_eq!(
            html.matches("<polygon").count(),
            2 + 2,
            "two stages, two causes"
        );
        assert_eq!(
            html.matches("<rect x").count(),
            5 + 2 + 1,
            "5 backgrounds, 2 tasks, 1 wait"
        );
        assert!(html.contains("2 tasks on 1 node(s)"));
        assert!(html.contains("(0 pauses, 0.00 task-seconds)"), "{html}");
        for colour in [STORE_COLOUR, SPILLED_COLOUR] {
            let line = format!("stroke=\"{colour}\"");
            assert_eq!(html.matches(&line).count(), 1, "store and spilled lines");
        }
        assert!(
            html.contains(&format!("fill=\"{}\"", WAIT_COLOURS[0].1)),
            "no slot drawn"
        );
        assert!(
            !html.contains("<script") && !html.contains("src="),
            "fetches nothing"
        );
        assert!(page(&serde_json::json!({"a": 1}), "x").is_err());
    }

    #[test]
    fn ticks_are_round_and_within_the_job() {
        assert_eq!(ticks(1.0), vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
        assert_eq!(
            ticks(35.0),
            vec![0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0]
        );
    }
}
