//! A recorded W1-shaped timeline, read back as Perfetto would read it: every
//! task appears once, no slot runs two tasks at once (nor a node more
//! tasks than it has slots), and every pause names its cause. Its HTML page
//! (`streambatch timeline`) rendered by headless Chromium is not blank.
//! `SB_KEEP_TRACE=DIR` keeps the trace, page and screenshot in DIR.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use streambatch::{Context, Dataset, JobStats, NodeConfig};

/// Runs a W1-shaped job on a store small enough that outputs wait for
/// memory, and writes its trace into `dir`.
fn record_w1(dir: &Path) -> (PathBuf, JobStats) {
    let ds = run_w1(true);
    let path = dir.join("trace.json");
    ds.write_timeline(&path).unwrap();
    (path, ds.stats().unwrap())
}

fn run_w1(record_timeline: bool) -> Dataset {
    let ctx = Context::with_config(NodeConfig {
        record_timeline,
        ..common::small_w1_node()
    })
    .unwrap();
    let ds = common::small_w1(&ctx);
    assert_eq!(ds.count().unwrap(), 80);
    ds
}

/// Where the test writes: `SB_KEEP_TRACE`, or a directory removed after.
fn out_dir() -> (Option<tempfile::TempDir>, PathBuf) {
    match std::env::var_os("SB_KEEP_TRACE") {
        Some(dir) => {
            std::fs::create_dir_all(&dir).unwrap();
            (None, PathBuf::from(dir))
        }
        None => {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().to_path_buf();
            (Some(dir), path)
        }
    }
}

#[test]
fn a_w1_timeline_shows_every_task_once_on_its_own_slot_and_attributes_pauses() {
    let (_keep, dir) = out_dir();
    let (path, stats) = record_w1(&dir);

    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let slices = |cat: &str| {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] == cat)
            .collect::<Vec<_>>()
    };

    // Every task appears once as finished, on a named track.
    let tasks = slices("task");
    let finished: Vec<u64> = tasks
        .iter()
        .filter(|e| e["args"]["end"] == "finished")
        .map(|e| e["args"]["task"].as_u64().unwrap())
        .collect();
    let distinct: BTreeSet<u64> = finished.iter().copied().collect();
    let want: u64 = stats.operators.iter().map(|o| o.tasks).sum();
    assert_eq!(finished.len() as u64, want, "{stats}");
    assert_eq!(distinct.len(), finished.len(), "a task finished twice");
    let named: BTreeSet<(u64, u64)> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
        .collect();

    // No slot runs two tasks at once; the node never runs more than its
    // 12 slots.
    let mut tracks: BTreeMap<(u64, u64), Vec<(f64, f64)>> = BTreeMap::new();
    for e in &tasks {
        let at = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
        assert!(named.contains(&at), "track {at:?} has no name");
        let ts = e["ts"].as_f64().unwrap();
        tracks
            .entry(at)
            .or_default()
            .push((ts, ts + e["dur"].as_f64().unwrap()));
    }
    for (track, runs) in &mut tracks {
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        for pair in runs.windows(2) {
            assert!(
                pair[0].1 <= pair[1].0,
                "{track:?} runs two tasks at once: {pair:?}"
            );
        }
    }
    assert!(
        tracks.len() <= 12,
        "{} slot tracks on 12 slots",
        tracks.len()
    );

    // Tasks paused for memory, each with its cause.
    let pauses = slices("pause");
    assert!(
        !pauses.is_empty(),
        "nothing paused at a 3 MiB store\n{stats}"
    );
    for p in &pauses {
        let cause = p["args"]["cause"].as_str().unwrap();
        assert!(
            ["output budget", "store full"].contains(&cause),
            "a pause without its cause: {p}"
        );
    }

    // Stages that waited: for a slot (16 source splits on 8 CPU slots), or
    // for memory.
    let waits = slices("wait");
    let causes: BTreeSet<&str> = waits
        .iter()
        .map(|w| w["args"]["cause"].as_str().unwrap())
        .collect();
    assert!(causes.contains("no slot"), "{causes:?}");
    assert!(
        causes.is_subset(&["no slot", "output budget", "store full"].into()),
        "{causes:?}"
    );

    // The stats' pause time by cause is the trace's pauses summed.
    let (budget, full) = stats.pause_time();
    let summed = |cause: &str| -> f64 {
        pauses
            .iter()
            .filter(|p| p["args"]["cause"] == cause)
            .map(|p| p["dur"].as_f64().unwrap() / 1e6)
            .sum()
    };
    assert!((summed("output budget") - budget.as_secs_f64()).abs() < 1e-3);
    assert!((summed("store full") - full.as_secs_f64()).abs() < 1e-3);
    assert!(stats.to_string().contains("paused for memory"), "{stats}");

    // Partitions with their sizes, and the store's bytes under its cap.
    let sizes: Vec<u64> = events
        .iter()
        .filter(|e| e["cat"] == "partition")
        .map(|e| e["args"]["bytes"].as_u64().unwrap())
        .collect();
    assert!(!sizes.is_empty() && sizes.iter().all(|b| *b > 0));
    let store: Vec<u64> = events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "store bytes")
        .map(|e| e["args"]["bytes"].as_u64().unwrap())
        .collect();
    assert!(!store.is_empty());
}

/// Headless Chromium: `SB_CHROMIUM`, or the first of the Debian packages'
/// commands on the PATH.
fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SB_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    ["chromium-headless-shell", "chromium"]
        .iter()
        .find_map(|name| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
}

#[test]
fn a_w1_timeline_page_renders_in_headless_chromium_with_every_stage_drawn() {
    let Some(chromium) = chromium() else {
        streambatch_bench::skip_test(
            "a_w1_timeline_page_renders_in_headless_chromium_with_every_stage_drawn",
            "no headless Chromium: apt-get install chromium-headless-shell",
        );
        return;
    };
    let (_keep, dir) = out_dir();
    let (trace, stats) = record_w1(&dir);
    let page = dir.join("job.html");
    let drawn = Command::new(env!("CARGO_BIN_EXE_streambatch"))
        .arg("timeline")
        .arg(&trace)
        .arg("-o")
        .arg(&page)
        .output()
        .unwrap();
    assert!(drawn.status.success(), "{drawn:?}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("<script") && !html.contains(" src="),
        "the page fetches nothing"
    );

    let shot = dir.join("job.png");
    let _ = std::fs::remove_file(&shot);
    let mut browser = Command::new(&chromium)
        .args(["--no-sandbox", "--disable-gpu", "--hide-scrollbars"])
        .arg("--window-size=1200,1300")
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while browser.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = browser.kill();
            panic!(
                "{} did not finish its screenshot in 120 s",
                chromium.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let frame = reader.next_frame(&mut pixels).unwrap();
    let channels = frame.color_type.samples();
    let rgb: Vec<[u8; 3]> = pixels[..frame.buffer_size()]
        .chunks(channels)
        .map(|p| [p[0], p[1], p[2]])
        .collect();
    let drawn = rgb.iter().filter(|p| **p != [255, 255, 255]).count();
    assert!(
        drawn * 10 > rgb.len(),
        "the screenshot is blank: {drawn} of {} pixels drawn",
        rgb.len()
    );
    // Each stage's colour fills an area (the page's palette, in plan order).
    let palette = [[0x4e, 0x79, 0xa7], [0xf2, 0x8e, 0x2b], [0x59, 0xa1, 0x4f]];
    for (stage, colour) in palette.iter().enumerate().take(stats.operators.len()) {
        let area = rgb.iter().filter(|p| *p == colour).count();
        assert!(
            area > 500,
            "stage {} ({}) has {area} pixels of its colour",
            stage,
            stats.operators[stage].name
        );
    }
}

#[test]
fn without_recording_a_job_still_counts_its_pauses_but_has_no_timeline_to_write() {
    let ds = run_w1(false);
    let stats = ds.stats().unwrap();
    assert!(stats.events.is_empty() && stats.store_samples.is_empty());
    let (budget, full) = stats.pause_time();
    assert!(
        stats.pauses.output_budget_count + stats.pauses.store_full_count > 0
            && !(budget + full).is_zero(),
        "{stats}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let err = ds.write_timeline(&path).unwrap_err().to_string();
    assert!(err.contains("record_timeline = false"), "{err}");
    assert!(!path.exists());
}
