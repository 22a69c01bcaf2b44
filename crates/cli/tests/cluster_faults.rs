//! Jobs on real node processes (127.0.0.1) that lose, gain or drain nodes:
//! injected panics and failed puts and fetches are retried, a killed worker,
//! a failed relay or a lost limit's outputs cost only what the node held, a
//! lost head ends running jobs, and joining and drained nodes take and hand
//! over work, each job still giving a clean run's output.

mod common;

use common::{Cluster, NodeSpec, ids_of, w1_ids};
use streambatch::{Context, Dataset};
use streambatch_bench::{Shape, registry, w1_pipeline};

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
