//! A recorded W1-shaped timeline, read back as Perfetto would read it: every
//! task appears once, no slot runs two tasks at once (nor a node more
//! tasks than it has slots), and every pause names its cause.
//! `SB_KEEP_TRACE=trace.json` keeps the trace, to open in Perfetto.

use std::collections::{BTreeMap, BTreeSet};

use streambatch::{Context, NodeConfig};
use streambatch_bench::{Shape, registry, w1_pipeline};

#[test]
fn a_w1_timeline_shows_every_task_once_on_its_own_slot_and_attributes_pauses() {
    // A store small enough that outputs wait for memory.
    let ctx = Context::with_config(NodeConfig {
        cpus: 8.0,
        gpus: Some(4.0),
        store_capacity: 3 << 20,
        ..NodeConfig::default()
    })
    .unwrap();
    let shape = Shape {
        rows: 80,
        partitions: 16,
        row_bytes: 128 << 10,
        millis: (20, 5, 5),
    };
    let ds = w1_pipeline(ctx.range(shape.rows, shape.partitions), &registry(), shape).unwrap();
    assert_eq!(ds.count().unwrap(), 80);
    let dir = tempfile::tempdir().unwrap();
    let path = std::env::var_os("SB_KEEP_TRACE")
        .map_or_else(|| dir.path().join("trace.json"), std::path::PathBuf::from);
    ds.write_timeline(&path).unwrap();
    let stats = ds.stats().unwrap();

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
