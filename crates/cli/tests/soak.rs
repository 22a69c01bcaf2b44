//! The soak run: W1-shaped jobs in a loop on four worker nodes, whose
//! workers panic on a seeded tenth of tasks (`SB_FAILPOINTS`) and which a
//! seeded schedule kills (SIGKILL) in the middle of jobs and starts again
//! between them. Every job must deliver each of its rows exactly once:
//! half read their rows in the driver, half write Parquet files that are
//! read back. It prints jobs run, faults injected, rows checked, lost and
//! duplicated.
//!
//! `STREAMBATCH_SOAK_MINUTES=10 cargo test --release -p streambatch-cli --test soak -- --nocapture`
//! runs jobs for ten minutes; without it, four jobs (the suite's run).
//! `SB_SOAK_SEED=S` picks another schedule (the default is 1).

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{Cluster, NodeSpec};
use streambatch::Context;
use streambatch_bench::{Shape, registry, w1_pipeline};

/// The soak's own variable: not a node config key, though it looks like one.
const MINUTES: &str = "STREAMBATCH_SOAK_MINUTES";

const WORKERS: [&str; 4] = ["worker-1", "worker-2", "worker-3", "worker-4"];

/// A W1 shape of about two seconds on four nodes.
fn shape() -> Shape {
    Shape {
        rows: 96,
        partitions: 24,
        row_bytes: 16 << 10,
        millis: (40, 5, 60),
    }
}

/// What the soak did and saw.
#[derive(Default, Debug)]
struct Tally {
    jobs: u64,
    /// Worker panics, as the nodes' logs record them.
    panics: u64,
    kills: u64,
    /// Nodes the jobs' stats report lost.
    nodes_lost: u64,
    retries: u64,
    remade_partitions: u64,
    rows_checked: u64,
    rows_lost: u64,
    rows_duplicated: u64,
}

/// SplitMix64: the seeded schedule.
struct Schedule(u64);

impl Schedule {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut x = self.0;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The faults every worker process takes: panics on 10% of tasks.
fn failpoints(seed: u64) -> Vec<(String, String)> {
    vec![("SB_FAILPOINTS".into(), format!("worker.panic={seed}:10"))]
}

#[test]
fn jobs_in_a_loop_survive_panics_and_killed_nodes_with_every_row_once() {
    let minutes: Option<f64> = std::env::var(MINUTES).ok().map(|m| {
        m.parse()
            .unwrap_or_else(|_| panic!("{MINUTES}={m}: not a number"))
    });
    // SAFETY: this binary's only test, before it starts any thread: the
    // variable would otherwise reach the driver's and the nodes' config as
    // an unknown key.
    unsafe { std::env::remove_var(MINUTES) };
    let seed: u64 = std::env::var("SB_SOAK_SEED")
        .map(|s| s.parse().expect("SB_SOAK_SEED: a number"))
        .unwrap_or(1);
    let deadline = minutes.map(|m| Instant::now() + Duration::from_secs_f64(m * 60.0));
    let faults = failpoints(seed);

    // Each worker has CPU and GPU slots, so that a job outlives any one
    // of them; a lost node is noticed within 2 s. A chosen task panics once
    // on each node it runs on: up to four times, and once more if a kill
    // catches it in flight, so the jobs allow 8 retries.
    let specs: Vec<NodeSpec> = WORKERS
        .iter()
        .map(|name| NodeSpec {
            gpus: Some(1),
            env: faults.clone(),
            ..NodeSpec::cpu(name, 2)
        })
        .collect();
    let mut cluster = Cluster::start_configured(
        &specs,
        "128MiB",
        "node_timeout_ms = 2000\nmax_task_retries = 8\n",
    );
    let ctx = Context::connect(cluster.driver_config()).unwrap();
    // Reads the written files back, apart from the cluster.
    let local = Context::with_config(streambatch::NodeConfig {
        cpus: 1.0,
        gpus: Some(0.0),
        store_capacity: 64 << 20,
        ..Default::default()
    })
    .unwrap();
    let mut schedule = Schedule(seed);
    let mut tally = Tally::default();
    let started = Instant::now();
    loop {
        let job = tally.jobs;
        let done = match deadline {
            Some(at) => Instant::now() >= at,
            None => job == 4,
        };
        if done {
            break;
        }
        // Two jobs in three lose a node, 0.3 to 1.5 s in.
        let victim = (schedule.below(3) != 0).then(|| {
            let name = WORKERS[schedule.below(4) as usize];
            let after = Duration::from_millis(300 + schedule.below(1200));
            (name, after)
        });
        let killer = victim.map(|(name, after)| {
            let node = cluster.nodes.iter().find(|n| n.name == name).unwrap();
            let pid = node.child.id().to_string();
            std::thread::spawn(move || {
                std::thread::sleep(after);
                std::process::Command::new("kill")
                    .args(["-9", &pid])
                    .status()
                    .unwrap();
            })
        });
        let writes = job % 2 == 1;
        let (ids, stats) = if writes {
            write_job(&ctx, &local, &cluster, job)
        } else {
            read_job(&ctx)
        };
        check_rows(&ids, &mut tally);
        tally.jobs += 1;
        tally.retries += stats.operators.iter().map(|o| o.retries).sum::<u64>();
        tally.nodes_lost += stats.recovery.nodes_lost.len() as u64;
        tally.remade_partitions += stats.recovery.remade_partitions;
        if let (Some(killer), Some((name, _))) = (killer, victim) {
            killer.join().unwrap();
            let node = cluster.nodes.iter_mut().find(|n| n.name == name).unwrap();
            node.kill_hard(); // reaps it, frees its shared memory
            tally.kills += 1;
            restart(&mut cluster, name, &faults);
        }
        eprintln!(
            "job {job} ({}): {} rows, {:.1} s, lost nodes {:?}, retries {}",
            if writes {
                "write_parquet"
            } else {
                "iter_batches"
            },
            ids.len(),
            stats.wall.as_secs_f64(),
            stats.recovery.nodes_lost,
            stats.operators.iter().map(|o| o.retries).sum::<u64>(),
        );
    }
    tally.panics = WORKERS
        .iter()
        .map(|name| {
            let log = cluster.dir.path().join(format!("{name}.log"));
            let log = std::fs::read_to_string(log).unwrap_or_default();
            log.matches("failpoint worker.panic").count() as u64
        })
        .sum();
    println!(
        "soak (seed {seed}, {:.1} min): {} jobs run; faults injected: {} worker panics, \
         {} node kills ({} seen lost by a job); {} task retries, {} partitions made again; \
         rows checked {}, rows lost {}, rows duplicated {}",
        started.elapsed().as_secs_f64() / 60.0,
        tally.jobs,
        tally.panics,
        tally.kills,
        tally.nodes_lost,
        tally.retries,
        tally.remade_partitions,
        tally.rows_checked,
        tally.rows_lost,
        tally.rows_duplicated,
    );
    assert_eq!(
        (tally.rows_lost, tally.rows_duplicated),
        (0, 0),
        "{tally:?}"
    );
    assert_eq!(tally.rows_checked, tally.jobs * shape().rows, "{tally:?}");
    // The faults happened, and every panic was retried.
    assert!(tally.panics > 0 && tally.kills > 0, "{tally:?}");
    assert!(tally.retries >= tally.panics, "{tally:?}");
}

/// Counts each id 0..rows: missing ones are lost, extra ones duplicated.
fn check_rows(ids: &[i64], tally: &mut Tally) {
    let rows = shape().rows as i64;
    let mut seen: HashMap<i64, u64> = HashMap::new();
    for &id in ids {
        *seen.entry(id).or_default() += 1;
    }
    tally.rows_checked += rows as u64;
    tally.rows_lost += (0..rows).filter(|id| !seen.contains_key(id)).count() as u64;
    tally.rows_duplicated += seen
        .iter()
        .map(|(id, &n)| if (0..rows).contains(id) { n - 1 } else { n })
        .sum::<u64>();
}

/// A W1-shaped job whose rows the driver reads.
fn read_job(ctx: &Context) -> (Vec<i64>, streambatch::JobStats) {
    let shape = shape();
    let ds = w1_pipeline(ctx.range(shape.rows, shape.partitions), &registry(), shape).unwrap();
    let mut ids = Vec::new();
    for batch in ds.iter_batches().unwrap() {
        ids.extend_from_slice(ids_of(&batch.unwrap()));
    }
    (ids, ds.stats().unwrap())
}

/// A W1-shaped job writing Parquet files; its ids as `local` reads them back.
fn write_job(
    ctx: &Context,
    local: &Context,
    cluster: &Cluster,
    job: u64,
) -> (Vec<i64>, streambatch::JobStats) {
    let shape = shape();
    let out = cluster.dir.path().join(format!("out-{job}"));
    let ds = w1_pipeline(ctx.range(shape.rows, shape.partitions), &registry(), shape).unwrap();
    let files = ds.write_parquet(&out).unwrap();
    let stats = ds.stats().unwrap();
    // Exactly the files the job reports, and nothing beside them.
    let mut listed: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    listed.sort();
    let mut reported = files.clone();
    reported.sort();
    assert_eq!(listed, reported, "job {job} left other files in {out:?}");
    let mut ids = Vec::new();
    for batch in local
        .read_parquet(out.to_str().unwrap())
        .unwrap()
        .collect()
        .unwrap()
    {
        ids.extend_from_slice(ids_of(&batch));
    }
    (ids, stats)
}

/// The ids (first column) of a W1-shaped job's output batch.
fn ids_of(batch: &arrow_array::RecordBatch) -> &[i64] {
    let column = batch.column(0).as_any();
    let ids = column.downcast_ref::<arrow_array::Int64Array>().unwrap();
    ids.values()
}

/// Starts a killed node again once the head has seen it leave (a node
/// that came back sooner could be dropped with its old session), and
/// waits until it is a member again.
fn restart(cluster: &mut Cluster, name: &str, env: &[(String, String)]) {
    let wait_until = |cluster: &Cluster, member: bool| {
        let since = Instant::now();
        while common::members(cluster).iter().any(|m| m == name) != member {
            assert!(
                since.elapsed() < Duration::from_secs(30),
                "{name} is {}a member after 30 s",
                if member { "not " } else { "still " }
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_until(cluster, false);
    cluster.restart(name, env);
    wait_until(cluster, true);
}
