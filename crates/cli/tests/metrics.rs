//! A node with `metrics_addr` serves Prometheus metrics over HTTP: scraped
//! while a W1-shaped job runs and after it, parsed with a Prometheus text
//! parser, they show what `stats()` shows; on a cluster, each node counts
//! its share of the job.

mod common;

use std::net::SocketAddr;

use common::{Cluster, NodeSpec};
use streambatch::{Context, NodeConfig};
use streambatch_bench::{Shape, registry, w1_pipeline};

/// The samples of one scrape of `addr`.
fn scrape(addr: SocketAddr) -> Vec<prometheus_parse::Sample> {
    let body = ureq::get(format!("http://{addr}/metrics"))
        .call()
        .unwrap()
        .into_body()
        .read_to_string()
        .unwrap();
    let lines = body.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines).unwrap().samples
}

/// The value of the sample named `metric` with `labels`; panics when absent.
fn value(samples: &[prometheus_parse::Sample], metric: &str, labels: &[(&str, &str)]) -> f64 {
    let sample = samples
        .iter()
        .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .unwrap_or_else(|| panic!("no {metric}{labels:?} among {} samples", samples.len()));
    match sample.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => v,
        ref other => panic!("{metric} is not a number: {other:?}"),
    }
}

#[test]
fn a_scraped_node_reports_what_the_jobs_stats_report() {
    let ctx = Context::with_config(NodeConfig {
        metrics_addr: Some("127.0.0.1:0".parse().unwrap()),
        ..common::small_w1_node()
    })
    .unwrap();
    let addr = ctx.metrics_addr().expect("the endpoint listens");
    let ds = common::small_w1(&ctx);

    // While it runs: one job, no more tasks than slots.
    let mut batches = ds.iter_batches().unwrap();
    let mut rows = batches.next().unwrap().unwrap().num_rows();
    let running = scrape(addr);
    assert_eq!(
        value(&running, "streambatch_jobs", &[("state", "running")]),
        1.0
    );
    let busy = value(&running, "streambatch_slots_busy", &[]);
    assert!(busy <= 12.0, "{busy} tasks on 12 slots");
    assert_eq!(
        value(&running, "streambatch_slots", &[("kind", "gpu")]),
        4.0
    );
    for batch in batches {
        rows += batch.unwrap().num_rows();
        // A slow consumer: the outputs fill their budget and the producers
        // pause, whatever this machine's speed, so the pause counts below
        // are compared on something.
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(rows, 80);
    let stats = ds.stats().unwrap();

    let after = scrape(addr);
    for op in &stats.operators {
        let stage = ("stage", op.name.as_str());
        let finished = [stage, ("state", "finished")];
        assert_eq!(
            value(&after, "streambatch_tasks_total", &finished),
            op.tasks as f64
        );
        let retried = [stage, ("state", "retried")];
        assert_eq!(
            value(&after, "streambatch_tasks_total", &retried),
            op.retries as f64
        );
        assert_eq!(
            value(&after, "streambatch_stage_rows_total", &[stage]),
            op.rows as f64
        );
        assert_eq!(
            value(&after, "streambatch_stage_bytes_total", &[stage]),
            op.bytes as f64
        );
        assert_eq!(value(&after, "streambatch_tasks_running", &[stage]), 0.0);
    }
    let p = &stats.pauses;
    assert!(p.store_full_count + p.output_budget_count > 0, "{stats}");
    let cause = |c| [("cause", c)];
    let budget = value(&after, "streambatch_pauses_total", &cause("output budget"));
    let full = value(&after, "streambatch_pauses_total", &cause("store full"));
    assert_eq!(
        (budget, full),
        (p.output_budget_count as f64, p.store_full_count as f64)
    );
    let seconds = value(
        &after,
        "streambatch_paused_seconds_total",
        &cause("store full"),
    );
    assert!((seconds - p.store_full.as_secs_f64()).abs() < 1e-6);
    let capacity = value(&after, "streambatch_store_capacity_bytes", &[]);
    assert_eq!(capacity, (3 << 20) as f64);
    assert_eq!(
        value(&after, "streambatch_jobs", &[("state", "ended")]),
        1.0
    );
    assert_eq!(value(&after, "streambatch_lost_partitions_total", &[]), 0.0);

    // The same figures as JSON.
    let json = stats.to_json();
    for (i, op) in stats.operators.iter().enumerate() {
        assert_eq!(json["operators"][i]["name"], op.name.as_str());
        assert_eq!(json["operators"][i]["tasks"], op.tasks);
        assert_eq!(json["operators"][i]["rows"], op.rows);
    }
    assert_eq!(json["pauses"]["store_full"]["count"], p.store_full_count);
    assert_eq!(
        json["pauses"]["output_budget"]["count"],
        p.output_budget_count
    );
    assert_eq!(json["store"]["capacity_bytes"], 3u64 << 20);

    // Anything but GET /metrics is not found.
    let missing = ureq::get(format!("http://{addr}/other")).call();
    assert!(
        matches!(missing, Err(ureq::Error::StatusCode(404))),
        "{missing:?}"
    );
}

#[test]
fn a_metrics_address_in_use_fails_the_start_naming_the_key() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let err = Context::with_config(NodeConfig {
        metrics_addr: Some(taken.local_addr().unwrap()),
        ..NodeConfig::default()
    })
    .err()
    .expect("the address is taken")
    .to_string();
    assert!(err.contains("metrics_addr"), "{err}");
}

/// A port free now on 127.0.0.1.
fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[test]
fn each_cluster_node_counts_its_share_of_a_job_and_the_shares_add_up_to_its_stats() {
    let names = ["worker-1", "worker-2", "gpu"];
    let addrs: Vec<SocketAddr> = names.iter().map(|_| free_port()).collect();
    let specs: Vec<NodeSpec> = names
        .iter()
        .zip(&addrs)
        .map(|(name, addr)| {
            let spec = if *name == "gpu" {
                NodeSpec::gpu(name, 2)
            } else {
                NodeSpec::cpu(name, 2)
            };
            let spec = spec.with_env("STREAMBATCH_METRICS_ADDR", &addr.to_string());
            // About one CPU task in ten panics once on each CPU node: a
            // task fails at most twice, within the driver's 3 retries.
            match *name {
                "gpu" => spec,
                _ => spec.with_env("SB_FAILPOINTS", "worker.panic=7:10"),
            }
        })
        .collect();
    let cluster = Cluster::start(&specs);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let shape = Shape {
        rows: 40,
        partitions: 8,
        row_bytes: 64 << 10,
        millis: (20, 5, 5),
    };
    let ds = w1_pipeline(ctx.range(shape.rows, shape.partitions), &registry(), shape).unwrap();
    assert_eq!(ds.count().unwrap(), 40);
    let stats = ds.stats().unwrap();

    let table = stats.to_string();
    assert!(
        table.contains("inputs shared") && table.contains("worker-2"),
        "{table}"
    );
    let scrapes: Vec<_> = addrs.iter().map(|a| scrape(*a)).collect();
    for op in &stats.operators {
        let finished = [("stage", op.name.as_str()), ("state", "finished")];
        let retried = [("stage", op.name.as_str()), ("state", "retried")];
        let rows = [("stage", op.name.as_str())];
        let (mut tasks, mut retries, mut out) = (0.0, 0.0, 0.0);
        for samples in &scrapes {
            let has = samples
                .iter()
                .any(|s| s.labels.get("stage") == Some(op.name.as_str()));
            if has {
                tasks += value(samples, "streambatch_tasks_total", &finished);
                retries += value(samples, "streambatch_tasks_total", &retried);
                out += value(samples, "streambatch_stage_rows_total", &rows);
            }
        }
        assert_eq!(tasks, op.tasks as f64, "{}: {stats}", op.name);
        assert_eq!(retries, op.retries as f64, "{}: {stats}", op.name);
        assert_eq!(out, op.rows as f64, "{}: {stats}", op.name);
    }
    let retries: u64 = stats.operators.iter().map(|o| o.retries).sum();
    assert!(retries > 0, "no worker panicked: {stats}");
    for (name, samples) in names.iter().zip(&scrapes) {
        let node = stats.nodes.iter().find(|n| n.name == *name).unwrap();
        let here: f64 = samples
            .iter()
            .filter(|s| {
                s.metric == "streambatch_tasks_total" && s.labels.get("state") == Some("finished")
            })
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum();
        assert_eq!(here, node.tasks as f64, "{name}: {stats}");
        let json = stats.to_json();
        let listed = json["nodes"].as_array().unwrap();
        let entry = listed.iter().find(|n| n["name"] == *name).unwrap();
        assert_eq!(entry["tasks"], node.tasks);
        assert_eq!(
            value(samples, "streambatch_store_capacity_bytes", &[]),
            (128 << 20) as f64
        );
    }
}

#[test]
fn a_streaming_splits_ranks_show_in_the_metrics_as_in_its_stats() {
    let ctx = Context::with_config(NodeConfig {
        metrics_addr: Some("127.0.0.1:0".parse().unwrap()),
        ..NodeConfig::default()
    })
    .unwrap();
    let addr = ctx.metrics_addr().expect("the endpoint listens");
    let splits = ctx.range(3_000, 12).streaming_split(2, false).unwrap();
    std::thread::scope(|s| {
        for split in &splits {
            s.spawn(move || {
                for batch in split.epoch(0) {
                    batch.unwrap();
                    // A training step: rows wait for the trainer meanwhile.
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            });
        }
    });
    let stats = splits[0].stats();
    let samples = scrape(addr);
    let mut rows = 0.0;
    for (rank, got) in stats.iter().enumerate() {
        let labels = [("split", "0"), ("rank", &*rank.to_string())];
        let rank_rows = value(&samples, "streambatch_split_rows_total", &labels);
        assert_eq!(rank_rows, got.rows as f64);
        assert_eq!(
            value(&samples, "streambatch_split_pieces_total", &labels),
            got.pieces as f64
        );
        assert_eq!(
            value(&samples, "streambatch_split_batches_total", &labels),
            got.batches as f64
        );
        assert!(got.batches > 0, "{got:?}");
        let waited = value(
            &samples,
            "streambatch_split_trainer_wait_seconds_total",
            &labels,
        );
        assert!((waited - got.waited_for_data.as_secs_f64()).abs() < 1e-9);
        let data = value(
            &samples,
            "streambatch_split_data_wait_seconds_total",
            &labels,
        );
        assert!((data - got.data_waited.as_secs_f64()).abs() < 1e-9);
        rows += rank_rows;
    }
    assert_eq!(rows, 3_000.0, "every row counted once across the ranks");
    // Gone, the split's last figures stay.
    drop(splits);
    let after = scrape(addr);
    assert_eq!(
        value(
            &after,
            "streambatch_split_rows_total",
            &[("split", "0"), ("rank", "0")]
        ),
        stats[0].rows as f64
    );
}
