//! Jobs on real node processes (127.0.0.1): a W1-shaped job on 1, 2 and 4
//! worker nodes gives the output of the single-node run; tasks run on every
//! node; partitions made on one node are consumed on another, by shared
//! memory between nodes that share a store directory and over QUIC between
//! nodes that do not.

mod common;

use common::{Cluster, NodeSpec};
use streambatch::{Context, Dataset, Resources};
use streambatch_bench::{Shape, registry, w1_pipeline};

/// A small W1: 40 rows of 64 KiB, quick sleeps.
fn shape() -> Shape {
    Shape {
        rows: 40,
        partitions: 8,
        row_bytes: 64 << 10,
        millis: (20, 5, 5),
    }
}

/// Rows out and the sum of their ids.
fn run(ctx: &Context) -> (streambatch::JobStats, u64, i64) {
    let ds = w1_pipeline(
        ctx.range(shape().rows, shape().partitions),
        &registry(),
        shape(),
    )
    .unwrap();
    let mut rows = 0;
    let mut sum = 0;
    for batch in ds.iter_batches().unwrap() {
        let batch = batch.unwrap();
        rows += batch.num_rows() as u64;
        let ids = batch
            .column(0)
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .unwrap();
        sum += ids.values().iter().sum::<i64>();
    }
    (ds.stats().unwrap(), rows, sum)
}

#[test]
fn a_w1_shaped_job_gives_the_single_node_output_on_1_2_and_4_nodes() {
    let local = Context::with_config(streambatch::NodeConfig {
        cpus: 4.0,
        gpus: Some(2.0),
        store_capacity: 256 << 20,
        ..Default::default()
    })
    .unwrap();
    let (_, rows, sum) = run(&local);
    assert_eq!((rows, sum), (40, (0..40).sum::<i64>()));

    for workers in [1, 2, 4] {
        // N CPU nodes feeding one GPU node, as in W5; the GPU node shares
        // its store directory with worker-1 only.
        let mut specs: Vec<NodeSpec> = (1..=workers)
            .map(|i| NodeSpec::cpu(&format!("worker-{i}"), 2))
            .collect();
        specs.push(NodeSpec::gpu("gpu", 2).sharing_store_with("worker-1"));
        let cluster = Cluster::start(&specs);
        let ctx = Context::connect(cluster.driver_config()).unwrap();
        let (stats, got_rows, got_sum) = run(&ctx);
        assert_eq!((got_rows, got_sum), (rows, sum), "{workers} workers");
        assert_eq!(stats.nodes.len(), workers + 1, "{stats}");
        for node in &stats.nodes {
            assert!(node.tasks > 0, "no task ran on {}: {stats}", node.name);
        }
        let gpu = stats.nodes.iter().find(|n| n.name == "gpu").unwrap();
        // The GPU stage ran on the GPU node only, the CPU stage elsewhere.
        assert_eq!(gpu.tasks, stats.operators[1].tasks, "{stats}");
        assert!(gpu.inputs_shared > 0, "none by shared memory: {stats}");
        if workers > 1 {
            assert!(
                gpu.inputs_quic > 0 && gpu.quic_bytes > 0,
                "none over QUIC: {stats}"
            );
        }
    }
}

#[test]
fn a_w4_shaped_job_writes_the_single_node_output_on_1_2_and_4_nodes() {
    for workers in [1, 2, 4] {
        let specs: Vec<NodeSpec> = (1..=workers)
            .map(|i| NodeSpec::cpu(&format!("worker-{i}"), 2))
            .collect();
        w4_shaped_on(&Cluster::start(&specs), 2 * workers);
    }
}

/// Runs W4's shape on one node and on `cluster` (whose stateful embedder may
/// have `pool` workers at once) and compares what they wrote.
fn w4_shaped_on(cluster: &Cluster, pool: usize) {
    let dir = cluster.dir.path();
    let images = dir.join("images");
    streambatch_bench::make_images(&images, 8, 25, 7).unwrap();
    let local = Context::with_config(streambatch::NodeConfig {
        cpus: 2.0,
        gpus: Some(0.0),
        store_capacity: 256 << 20,
        ..Default::default()
    })
    .unwrap();
    let remote = Context::connect(cluster.driver_config()).unwrap();
    let embed = |ctx: &Context, out: &std::path::Path, pool: usize| {
        let registry = streambatch::registry();
        let ds = ctx
            .read_parquet(images.to_str().unwrap())
            .unwrap()
            .map_batches(
                registry.udf("preprocess", b"").unwrap(),
                Resources::cpu(1.0),
            )
            .map_batches(
                registry.udf("cpu_embedder", &7u64.to_le_bytes()).unwrap(),
                Resources::cpu(1.0).batch_rows(16).pool(1, pool),
            );
        ds.write_parquet(out).unwrap();
        ds.stats().unwrap()
    };
    embed(&local, &dir.join("out-local"), 2);
    let stats = embed(&remote, &dir.join("out-cluster"), pool);
    for node in &stats.nodes {
        assert!(node.tasks > 0, "no task ran on {}: {stats}", node.name);
    }
    let read = |out: &str| {
        let mut rows: Vec<(i64, Vec<f32>)> = Vec::new();
        for b in local
            .read_parquet(dir.join(out).to_str().unwrap())
            .unwrap()
            .collect()
            .unwrap()
        {
            let ids = b
                .column(0)
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>()
                .unwrap();
            let emb = b
                .column(1)
                .as_any()
                .downcast_ref::<arrow_array::FixedSizeListArray>()
                .unwrap();
            for i in 0..b.num_rows() {
                let v = emb.value(i);
                let v = v
                    .as_any()
                    .downcast_ref::<arrow_array::Float32Array>()
                    .unwrap();
                rows.push((ids.value(i), v.values().to_vec()));
            }
        }
        rows.sort_by_key(|(id, _)| *id);
        rows
    };
    let (a, b) = (read("out-local"), read("out-cluster"));
    assert_eq!(a.len(), 200);
    assert_eq!(
        a, b,
        "the cluster wrote other embeddings than the single node"
    );
    let check =
        streambatch_bench::check_embeddings(&local, &images, &dir.join("out-cluster"), 7).unwrap();
    assert!(check.all_match(), "{check:?}");
}

#[test]
fn an_operator_a_node_lacks_is_refused_at_submission() {
    let cluster = Cluster::start(&[NodeSpec::cpu("worker-1", 2)]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let mut mine = streambatch::registry();
    mine.register("only_in_the_driver", |_| {
        Ok(|b: arrow_array::RecordBatch| Ok::<_, streambatch::UdfError>(b))
    });
    let op = mine.udf("only_in_the_driver", b"").unwrap();
    let err = ctx
        .range(10, 2)
        .map_batches(op, Resources::cpu(1.0))
        .count()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("worker-1") && err.contains("only_in_the_driver"),
        "{err}"
    );
    // A closure cannot travel at all: refused before any node is asked.
    let err = ctx
        .range(10, 2)
        .map_batches(
            |b: arrow_array::RecordBatch| Ok::<_, streambatch::UdfError>(b),
            Resources::cpu(1.0),
        )
        .count()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("map_batches") && err.contains("closure"),
        "{err}"
    );
    // A plan too large for one cluster message is refused before it is
    // sent (sent, it would close the session), and the cluster goes on.
    let heavy = mine.udf("only_in_the_driver", &vec![7u8; 2 << 20]).unwrap();
    let err = ctx
        .range(10, 2)
        .map_batches(heavy, Resources::cpu(1.0))
        .count()
        .unwrap_err()
        .to_string();
    assert!(err.contains("bytes on the wire"), "{err}");
    assert_eq!(ctx.range(10, 2).count().unwrap(), 10);
}

#[test]
fn losing_the_only_gpu_node_fails_the_job_at_once_naming_it() {
    let mut cluster = Cluster::start(&[NodeSpec::cpu("worker-1", 2), NodeSpec::gpu("gpu", 2)]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    // About 20 s of work: the kill comes long before it could end.
    let shape = Shape {
        rows: 200,
        partitions: 40,
        row_bytes: 1 << 10,
        millis: (500, 50, 50),
    };
    let ds = w1_pipeline(ctx.range(shape.rows, shape.partitions), &registry(), shape).unwrap();
    let started = std::time::Instant::now();
    let mut stream = ds.iter_batches().unwrap();
    let first = stream.next().unwrap();
    assert!(first.is_ok());
    let gpu = cluster.nodes.iter_mut().find(|n| n.name == "gpu").unwrap();
    gpu.kill_hard();
    let killed = std::time::Instant::now();
    let err = stream
        .find_map(|b| b.err())
        .expect("the job must fail when a node it uses is lost");
    assert!(err.to_string().contains("gpu"), "{err}");
    assert!(
        killed.elapsed() < std::time::Duration::from_secs(15),
        "took {:?}",
        killed.elapsed()
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

#[test]
fn the_shipped_toml_pipeline_runs_on_a_cluster_as_on_one_node() {
    if streambatch::GpuPool::global().is_empty() {
        streambatch_bench::skip_test(
            "the_shipped_toml_pipeline_runs_on_a_cluster_as_on_one_node",
            "no GPU adapter: install mesa-vulkan-drivers (lavapipe)",
        );
        return;
    }
    for workers in [1, 2, 4] {
        // CPU workers for reading and preprocessing, and a node with the
        // GPU slots (one per adapter, lavapipe included) for the kernel.
        let mut specs: Vec<NodeSpec> = (1..=workers)
            .map(|i| NodeSpec::cpu(&format!("worker-{i}"), 1))
            .collect();
        let gpu = NodeSpec::auto_gpu("gpu", 0).with_env("STREAMBATCH_GPU_SOFTWARE", "true");
        specs.push(gpu);
        toml_pipeline_on(&Cluster::start(&specs));
    }
}

fn toml_pipeline_on(cluster: &Cluster) {
    let dir = cluster.dir.path();
    streambatch_bench::make_images(&dir.join("images"), 4, 10, 42).unwrap();
    // The shipped pipeline, reading and writing in this test's directory.
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/pipelines");
    std::fs::copy(format!("{shipped}/embed.wgsl"), dir.join("embed.wgsl")).unwrap();
    let shipped_text = std::fs::read_to_string(format!("{shipped}/embed.toml")).unwrap();
    // Its source reads this test's images: the `read_parquet = ...` line.
    let sources = shipped_text
        .lines()
        .filter(|l| l.starts_with("read_parquet = "))
        .count();
    assert_eq!(sources, 1, "{shipped_text}");
    let text = shipped_text
        .lines()
        .map(|l| match l.starts_with("read_parquet = ") {
            true => "read_parquet = \"images\"",
            false => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
        .replace("../../out/embeddings-pipeline", "OUT");
    for (name, out) in [("local", "out-local"), ("cluster", "out-cluster")] {
        std::fs::write(dir.join(format!("{name}.toml")), text.replace("OUT", out)).unwrap();
    }
    let run =
        |args: &[&str]| String::from_utf8(common::streambatch(dir, args, &[]).stdout).unwrap();
    // On one node, `run` first says which adapter runs the kernel, and warns
    // where it is a software one; the Mesa driver says nothing of a missing
    // runtime directory (empty is as invalid to it as unset).
    let local = common::streambatch(dir, &["run", "local.toml"], &[("XDG_RUNTIME_DIR", "")]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&local.stdout),
        String::from_utf8_lossy(&local.stderr),
    );
    let pool = streambatch::GpuPool::global();
    let adapter = &pool.labels()[0];
    assert!(
        stdout.starts_with(&format!("kernel embed runs on {adapter}")),
        "{stdout}"
    );
    assert_eq!(
        stderr.contains("is a software adapter"),
        !pool.has_hardware(),
        "{stderr}"
    );
    assert!(!stderr.contains("XDG_RUNTIME_DIR"), "{stderr}");
    let driver = cluster.driver_config();
    let stdout = run(&["run", "cluster.toml", "--cluster", driver.to_str().unwrap()]);
    // Every node ran tasks: the stats' node table has a row per node,
    // "NAME TASKS ...", between its "node tasks ..." header and the
    // closing "wall ..." line.
    let per_node: Vec<Vec<&str>> = stdout
        .lines()
        .skip_while(|l| !(l.starts_with("node ") && l.contains("tasks")))
        .skip(1)
        .take_while(|l| !l.starts_with("wall "))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .collect();
    assert_eq!(per_node.len(), cluster.nodes.len(), "{stdout}");
    for row in per_node {
        assert_ne!(row[1], "0", "{row:?} ran no task\n{stdout}");
    }
    let local = Context::with_config(streambatch::NodeConfig {
        gpus: Some(0.0),
        ..Default::default()
    })
    .unwrap();
    let check = |out: &str| {
        streambatch_bench::check_embeddings(&local, &dir.join("images"), &dir.join(out), 42)
            .unwrap()
    };
    let (a, b) = (check("out-local"), check("out-cluster"));
    assert!(a.all_match() && b.all_match(), "{a:?} {b:?}");
    assert_eq!((a.rows, b.rows), (40, 40));
}

#[test]
fn backpressure_holds_per_node() {
    // 128 MiB of rows through a CPU node and a GPU node of 24 MiB stores
    // each: only backpressure (no spilling) keeps each store under its cap.
    let cluster = Cluster::start_with_store(
        &[NodeSpec::cpu("worker-1", 2), NodeSpec::gpu("gpu", 1)],
        "24MiB",
    );
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let shape = Shape {
        rows: 128,
        partitions: 16,
        row_bytes: 1 << 20,
        millis: (5, 1, 2),
    };
    let ds = w1_pipeline(ctx.range(shape.rows, shape.partitions), &registry(), shape).unwrap();
    assert_eq!(ds.count().unwrap(), 128);
    let stats = ds.stats().unwrap();
    for node in &stats.nodes {
        assert!(node.peak_store_bytes <= 24 << 20, "{stats}");
        assert_eq!(node.spilled_bytes, 0, "{stats}");
    }
    let worker = stats.nodes.iter().find(|n| n.name == "worker-1").unwrap();
    assert!(worker.peak_store_bytes > 0, "{stats}");
}

/// The sorted ids a W1-shaped job outputs, and its stats.
fn w1_ids(ctx: &Context) -> (Vec<i64>, streambatch::JobStats) {
    let ds = w1_pipeline(
        ctx.range(shape().rows, shape().partitions),
        &registry(),
        shape(),
    )
    .unwrap();
    let mut ids = Vec::new();
    for batch in ds.iter_batches().unwrap() {
        ids.extend_from_slice(ids_of(&batch.unwrap()));
    }
    ids.sort_unstable();
    (ids, ds.stats().unwrap())
}

/// The ids (first column) of a W1-shaped job's output batch.
fn ids_of(batch: &arrow_array::RecordBatch) -> &[i64] {
    let column = batch.column(0).as_any();
    let ids = column.downcast_ref::<arrow_array::Int64Array>().unwrap();
    ids.values()
}

/// Runs the W1-shaped job on a CPU node and a GPU node whose processes
/// inject `faults` (`SB_FAILPOINTS`): the ids are a clean run's, and the
/// retries (more than none) match the retry events.
fn w1_with_faults(faults: &str) {
    let (expected, _) = w1_ids(
        &Context::with_config(streambatch::NodeConfig {
            cpus: 2.0,
            gpus: Some(2.0),
            store_capacity: 256 << 20,
            ..Default::default()
        })
        .unwrap(),
    );
    assert_eq!(expected, (0..40).collect::<Vec<i64>>());
    let cluster = Cluster::start(&[
        NodeSpec::cpu("worker-1", 2).with_env("SB_FAILPOINTS", faults),
        NodeSpec::gpu("gpu", 2).with_env("SB_FAILPOINTS", faults),
    ]);
    let (got, stats) = w1_ids(&Context::connect(cluster.driver_config()).unwrap());
    assert_eq!(got, expected, "{faults}");
    let retries: u64 = stats.operators.iter().map(|o| o.retries).sum();
    assert!(retries > 0, "no task was retried with {faults}: {stats}");
    let retried = stats
        .events
        .iter()
        .filter(|e| e.kind == streambatch::EventKind::TaskRetried)
        .count() as u64;
    assert_eq!(retried, retries, "{stats}");
}

#[test]
fn worker_panics_on_a_tenth_of_tasks_change_nothing_but_the_retry_count() {
    // Seeded: about one task in ten panics once on each node (48 tasks).
    w1_with_faults("worker.panic=7:10");
}

#[test]
fn failed_puts_and_fetches_are_retried_as_system_failures() {
    w1_with_faults("store.put=11:10;fetch=13:20");
}

#[test]
fn a_killed_worker_costs_only_what_it_held_and_ran() {
    // Two CPU nodes feed a slower GPU node, so CPU outputs queue up on
    // both; worker-2 is killed (SIGKILL) once about a third of the rows
    // are out.
    let rows = 96;
    let shape = Shape {
        rows,
        partitions: 24,
        row_bytes: 16 << 10,
        millis: (40, 5, 60),
    };
    let mut cluster = Cluster::start(&[
        NodeSpec::cpu("worker-1", 2),
        NodeSpec::cpu("worker-2", 2),
        NodeSpec::gpu("gpu", 2),
    ]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let ds = w1_pipeline(ctx.range(rows, shape.partitions), &registry(), shape).unwrap();
    let mut ids = Vec::new();
    let mut killed = false;
    for batch in ds.iter_batches().unwrap() {
        ids.extend_from_slice(ids_of(&batch.unwrap()));
        if !killed && ids.len() >= rows as usize / 3 {
            let node = cluster.nodes.iter_mut().find(|n| n.name == "worker-2");
            node.unwrap().kill_hard();
            killed = true;
        }
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..rows as i64).collect::<Vec<_>>());

    let stats = ds.stats().unwrap();
    let r = &stats.recovery;
    assert_eq!(r.nodes_lost, vec!["worker-2".to_string()], "{stats}");
    // The CPU stage reads source splits: making a lost output again re-runs
    // its task, and nothing upstream.
    assert_eq!(r.remade_partitions, r.lost_partitions, "{stats}");
    assert!(r.rerun_tasks <= r.lost_partitions, "{stats}");
    // Every run of a CPU task is a first run, a retry of one in flight on
    // the lost node (or reading from it), or a re-run for a lost output.
    let started = |stage: usize| {
        stats
            .events
            .iter()
            .filter(|e| e.stage.0 == stage && e.kind == streambatch::EventKind::TaskStarted)
            .count() as u64
    };
    let cpu = &stats.operators[0];
    assert_eq!(
        started(0),
        shape.partitions as u64 + cpu.retries + r.rerun_tasks,
        "{stats}"
    );
    assert!(
        r.lost_partitions + cpu.retries > 0,
        "worker-2 held nothing when killed: {stats}"
    );
    // The worker-2 tasks that finished before the kill are not redone
    // beyond the outputs the job still needed.
    let on_worker_2 = stats.nodes.iter().find(|n| n.name == "worker-2").unwrap();
    assert!(r.rerun_tasks <= on_worker_2.tasks, "{stats}");
}

#[test]
fn a_failed_relay_costs_its_node_to_that_job_only() {
    // worker-2's relay panics on the 3rd order the node gets: the job
    // counts worker-2 lost and makes what it held again elsewhere; the
    // node itself stays, and runs the next job.
    let cluster = Cluster::start(&[
        NodeSpec::cpu("worker-1", 2),
        NodeSpec::cpu("worker-2", 2).with_env("SB_FAILPOINTS", "relay.panic=3"),
        NodeSpec::gpu("gpu", 2),
    ]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let (ids, stats) = w1_ids(&ctx);
    assert_eq!(ids, (0..40).collect::<Vec<i64>>());
    assert_eq!(
        stats.recovery.nodes_lost,
        vec!["worker-2".to_string()],
        "{stats}"
    );
    let (ids, stats) = w1_ids(&ctx);
    assert_eq!(ids, (0..40).collect::<Vec<i64>>());
    assert!(stats.recovery.nodes_lost.is_empty(), "{stats}");
    let worker_2 = stats.nodes.iter().find(|n| n.name == "worker-2").unwrap();
    assert!(worker_2.tasks > 0, "{stats}");
}

#[test]
fn a_lost_head_ends_running_jobs_and_workers_join_a_new_one() {
    // Slow tasks: 60 of 300 ms on 2 slots outlast the 5 s it takes to see
    // that a killed node is gone.
    let mut cluster = Cluster::start(&[
        NodeSpec::cpu("worker-1", 2).with_env("SB_FAILPOINTS", "worker.sleep=300")
    ]);
    let dir = cluster.dir.path().to_path_buf();
    let head_pid = cluster.head.child.id().to_string();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(500));
        std::process::Command::new("kill")
            .args(["-9", &head_pid])
            .status()
            .unwrap();
    });
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let err = ctx.range(60, 60).count().unwrap_err().to_string();
    killer.join().unwrap();
    assert!(err.contains("head"), "{err}");
    let _ = cluster.head.child.wait();

    // A new head at the same address: the worker joins it by itself.
    let config = std::fs::read_to_string(dir.join("head.toml"))
        .unwrap()
        .replace("127.0.0.1:0", &cluster.head.addr);
    std::fs::write(dir.join("head-again.toml"), config).unwrap();
    cluster.head = common::start(&dir, &dir.join("head-again.toml"), "head");
    let started = std::time::Instant::now();
    while !common::members(&cluster).contains(&"worker-1".to_string()) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "the worker did not join the new head"
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    // And the cluster runs jobs again.
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    assert_eq!(ctx.range(10, 2).count().unwrap(), 10);
}

#[test]
fn a_node_that_joins_a_running_job_gets_tasks() {
    let slow = "worker.sleep=100";
    let mut cluster =
        Cluster::start(&[NodeSpec::cpu("worker-1", 1).with_env("SB_FAILPOINTS", slow)]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    // 60 tasks of 100 ms on one slot take 6 s; a node joins after the first.
    let ds = ctx.range(60, 60);
    let mut batches = ds.iter_batches().unwrap();
    let mut rows = batches.next().unwrap().unwrap().num_rows();
    cluster.add(NodeSpec::cpu("spare-1", 2).with_env("SB_FAILPOINTS", slow));
    for batch in batches {
        rows += batch.unwrap().num_rows();
    }
    assert_eq!(rows, 60);
    let stats = ds.stats().unwrap();
    let spare = stats.nodes.iter().find(|n| n.name == "spare-1");
    let spare = spare.unwrap_or_else(|| panic!("spare-1 never joined: {stats}"));
    assert!(spare.tasks > 0, "{stats}");
}

#[test]
fn a_drained_node_finishes_its_tasks_and_leaves_with_nothing_redone() {
    let slow = "worker.sleep=100";
    let cluster = Cluster::start(&[
        NodeSpec::cpu("worker-1", 2).with_env("SB_FAILPOINTS", slow),
        NodeSpec::cpu("worker-2", 2).with_env("SB_FAILPOINTS", slow),
    ]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    // 80 tasks of 100 ms on 4 slots: worker-2 drains after the first output.
    let ds = ctx.range(80, 80);
    let mut batches = ds.iter_batches().unwrap();
    let mut rows = batches.next().unwrap().unwrap().num_rows();
    let drained = cluster.nodes.iter().find(|n| n.name == "worker-2").unwrap();
    std::process::Command::new("kill")
        .args(["-USR1", &drained.child.id().to_string()])
        .status()
        .unwrap();
    for batch in batches {
        rows += batch.unwrap().num_rows();
    }
    assert_eq!(rows, 80);
    let stats = ds.stats().unwrap();
    assert!(stats.operators.iter().all(|o| o.retries == 0), "{stats}");
    let tasks = |name: &str| stats.nodes.iter().find(|n| n.name == name).unwrap().tasks;
    assert!(
        tasks("worker-2") > 0 && tasks("worker-1") > tasks("worker-2"),
        "{stats}"
    );
    // It leaves by itself, cleanly.
    let mut cluster = cluster;
    let node = cluster
        .nodes
        .iter_mut()
        .find(|n| n.name == "worker-2")
        .unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = node.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(15),
            "the drained node did not leave"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    // The head no longer lists it, and the cluster goes on without it.
    let started = std::time::Instant::now();
    while common::members(&cluster).contains(&"worker-2".to_string()) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the head still lists the drained node"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(ctx.range(10, 2).count().unwrap(), 10);
}

#[test]
fn a_drained_node_hands_its_partitions_over_and_leaves_before_the_job_ends() {
    drained_node_hands_over(|ds| ds.repartition(3));
}

/// A shuffle's map outputs, whose cuts only their holders keep, are
/// handed over with their cuts; a sort's, whose chunks the driver keeps,
/// as any partition.
#[test]
fn a_drained_node_hands_its_map_outputs_over_with_their_cuts() {
    drained_node_hands_over(|ds| ds.random_shuffle(5));
    drained_node_hands_over(|ds| ds.sort(&["id"], false));
}

/// 100 source tasks of 100 ms, then `after` (a repartition or an
/// exchange): its inputs wait where they were made until the last source
/// task ends (about 4 s once worker-2 drains), so worker-2 leaves before
/// that only if it hands them over.
fn drained_node_hands_over(after: fn(Dataset) -> Dataset) {
    let slow = "worker.sleep=100";
    let mut cluster = Cluster::start(&[
        NodeSpec::cpu("worker-1", 2).with_env("SB_FAILPOINTS", slow),
        NodeSpec::cpu("worker-2", 2).with_env("SB_FAILPOINTS", slow),
    ]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let ds = after(ctx.range(100, 100));
    let mut batches = ds.iter_batches().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(700));
    let node = cluster
        .nodes
        .iter_mut()
        .find(|n| n.name == "worker-2")
        .unwrap();
    std::process::Command::new("kill")
        .args(["-USR1", &node.child.id().to_string()])
        .status()
        .unwrap();
    let drained = std::time::Instant::now();
    let status = loop {
        if let Some(status) = node.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            drained.elapsed() < std::time::Duration::from_secs(10),
            "the drained node did not leave"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    let left = std::time::Instant::now();
    let first = batches.next().unwrap().unwrap();
    let first_at = std::time::Instant::now();
    let mut ids: Vec<i64> = ids_of(&first).to_vec();
    for batch in batches {
        ids.extend_from_slice(ids_of(&batch.unwrap()));
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..100).collect::<Vec<i64>>());
    let stats = ds.stats().unwrap();
    // Without the handover it leaves only as the concat tasks free its
    // partitions, moments before the first output.
    assert!(
        first_at.duration_since(left) > std::time::Duration::from_secs(2),
        "worker-2 left {:?} after it drained and only {:?} before the job's first output: \
         it waited for its partitions to be consumed\n{stats}",
        left - drained,
        first_at.duration_since(left)
    );
    assert!(stats.operators.iter().all(|o| o.retries == 0), "{stats}");
    let r = &stats.recovery;
    assert_eq!((r.lost_partitions, r.remade_partitions), (0, 0), "{stats}");
    let tasks = |name: &str| stats.nodes.iter().find(|n| n.name == name).unwrap().tasks;
    assert!(tasks("worker-2") > 0, "worker-2 ran nothing: {stats}");
}

#[test]
fn outputs_a_limit_let_through_are_made_again_when_their_node_is_lost() {
    // The limit stops the source once it has its rows; worker-2 is then
    // killed while the driver has not read all of them. Those it held are
    // made again by re-running their source tasks, though the limit had
    // stopped that stage.
    let mut cluster = Cluster::start_configured(
        &[NodeSpec::cpu("worker-1", 2), NodeSpec::cpu("worker-2", 2)],
        "128MiB",
        "node_timeout_ms = 2000\n",
    );
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let ds = ctx.range(400, 80).limit(100);
    let mut batches = ds.iter_batches().unwrap();
    let mut ids = ids_of(&batches.next().unwrap().unwrap()).to_vec();
    // By now every output is made and waits on its node for the driver.
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    let node = cluster.nodes.iter_mut().find(|n| n.name == "worker-2");
    node.unwrap().kill_hard();
    for batch in batches {
        ids.extend_from_slice(ids_of(&batch.unwrap()));
    }
    let stats = ds.stats().unwrap();
    let distinct: std::collections::BTreeSet<i64> = ids.iter().copied().collect();
    assert_eq!(
        (ids.len(), distinct.len()),
        (100, 100),
        "100 rows, each once\n{stats}"
    );
    assert!(ids.iter().all(|id| (0..400).contains(id)), "{stats}");
    let r = &stats.recovery;
    assert_eq!(r.nodes_lost, vec!["worker-2".to_string()], "{stats}");
    assert!(
        r.lost_partitions > 0 && r.remade_partitions == r.lost_partitions,
        "{stats}"
    );
    assert!(r.rerun_tasks > 0, "{stats}");
}

#[test]
fn text_files_read_on_a_cluster_write_parquet_with_its_options() {
    let cluster = Cluster::start(&[NodeSpec::cpu("worker-1", 2), NodeSpec::cpu("worker-2", 2)]);
    let dir = cluster.dir.path();
    let input = dir.join("text");
    std::fs::create_dir_all(&input).unwrap();
    for f in 0..6 {
        let lines: String = (0..500).map(|i| format!("file {f} line {i}\n")).collect();
        std::fs::write(input.join(format!("{f}.txt")), lines).unwrap();
    }
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    let options = streambatch::ParquetWriteOptions {
        max_row_group_rows: 100,
        ..streambatch::ParquetWriteOptions::default()
            .with_codec("zstd(5)")
            .unwrap()
    };
    let out = dir.join("out");
    let files = ctx
        .read_text(input.to_str().unwrap())
        .unwrap()
        .write_parquet_with(&out, &options)
        .unwrap();
    let source = ctx.read_text(input.to_str().unwrap()).unwrap();
    assert_eq!(source.input_files().len(), 6);

    // The nodes wrote zstd in row groups of at most 100 rows (500-row
    // files: several groups each).
    assert_eq!(files.len(), 6, "{files:?}");
    for file in &files {
        let reader = streambatch::parquet::file::reader::SerializedFileReader::new(
            std::fs::File::open(file).unwrap(),
        )
        .unwrap();
        let meta = streambatch::parquet::file::reader::FileReader::metadata(&reader);
        assert!(meta.num_row_groups() >= 5, "{}", file.display());
        for group in meta.row_groups() {
            assert!(group.num_rows() <= 100, "{}", file.display());
            let codec = group.column(0).compression();
            assert!(
                matches!(codec, streambatch::parquet::basic::Compression::ZSTD(_)),
                "{codec:?}"
            );
        }
    }
    let local = Context::local().unwrap();
    let mut lines: Vec<String> = local
        .read_parquet(out.to_str().unwrap())
        .unwrap()
        .iter_rows()
        .unwrap()
        .map(|r| r.unwrap().str("text").unwrap().to_string())
        .collect();
    lines.sort();
    let mut want: Vec<String> = (0..6)
        .flat_map(|f| (0..500).map(move |i| format!("file {f} line {i}")))
        .collect();
    want.sort();
    assert_eq!(lines, want);

    // The other formats travel too: Arrow IPC written by the nodes, read
    // back by them.
    let ipc = dir.join("ipc");
    let text = ctx.read_text(input.to_str().unwrap()).unwrap();
    assert_eq!(text.write_ipc(&ipc).unwrap().len(), 6);
    assert_eq!(
        ctx.read_ipc(ipc.to_str().unwrap())
            .unwrap()
            .count()
            .unwrap(),
        3000
    );

    // CSV and JSON written by the nodes, read back by them with the schema
    // the driver inferred (it travels with each split).
    let formats: [(&str, Write, Read); 2] = [
        ("csv", |d, p| d.write_csv(p), |c, p| c.read_csv(p)),
        ("json", |d, p| d.write_json(p), |c, p| c.read_json(p)),
    ];
    for (format, write, read) in formats {
        let at = dir.join(format);
        let text = ctx.read_text(input.to_str().unwrap()).unwrap();
        assert_eq!(write(&text, &at).unwrap().len(), 6, "{format}");
        let mut back: Vec<String> = read(&ctx, at.to_str().unwrap())
            .unwrap()
            .iter_rows()
            .unwrap()
            .map(|r| r.unwrap().str("text").unwrap().to_string())
            .collect();
        back.sort();
        assert_eq!(back, want, "{format}");
    }
}

type Write =
    fn(&streambatch::Dataset, &std::path::Path) -> streambatch::Result<Vec<std::path::PathBuf>>;
type Read = fn(&Context, &str) -> streambatch::Result<streambatch::Dataset>;

/// `gpus = "auto"` on a machine whose only adapter is a software one
/// (lavapipe): the node counts no GPU slot and says why on its log, so the
/// cluster's main job (which embeds on the GPU only where a node has GPU
/// slots, see `examples/batch_inference.rs`) takes its CPU path; a node
/// that asks for software adapters gets its slot.
#[test]
fn auto_counts_no_software_adapter_so_the_main_job_embeds_on_the_cpu() {
    let pool = streambatch::GpuPool::global();
    if pool.has_hardware() || pool.software_labels().is_empty() {
        streambatch_bench::skip_test(
            "auto_counts_no_software_adapter_so_the_main_job_embeds_on_the_cpu",
            "needs lavapipe (mesa-vulkan-drivers) and no hardware GPU",
        );
        return;
    }
    let cluster = Cluster::start(&[
        NodeSpec::auto_gpu("worker-1", 1),
        NodeSpec::auto_gpu("worker-2", 1).with_env("STREAMBATCH_GPU_SOFTWARE", "true"),
    ]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    assert_eq!(
        ctx.gpu_devices(),
        [format!("worker-2: {} GPU slots", pool.len())],
        "only the node that asked counts its software adapter"
    );
    let log = std::fs::read_to_string(cluster.dir.path().join("worker-1.log")).unwrap();
    assert!(
        log.contains("counts no software adapter") && log.contains("gpu_software = true"),
        "{log}"
    );
}

#[test]
fn a_train_test_split_gives_the_single_node_sides_on_two_nodes() {
    let ids = |ctx: &Context| -> (Vec<i64>, Vec<i64>) {
        let (train, test) = ctx.range(10_000, 8).train_test_split(0.25, 7).unwrap();
        let sorted = |ds: streambatch::Dataset| {
            let mut ids: Vec<i64> = ds
                .collect()
                .unwrap()
                .iter()
                .flat_map(|b| ids_of(b).to_vec())
                .collect();
            ids.sort_unstable();
            ids
        };
        (sorted(train), sorted(test))
    };
    let local = ids(&Context::local().unwrap());
    assert_eq!(local.0.len() + local.1.len(), 10_000);
    let cluster = Cluster::start(&[NodeSpec::cpu("worker-1", 2), NodeSpec::cpu("worker-2", 2)]);
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    assert_eq!(ids(&ctx), local, "each side's rows as on one node");
}
