//! The embedded node's supervision: a failed executor ends its job with
//! an error naming it; a node manager whose workers fail past their limit
//! ends the jobs on it and starts again, and the next job runs on it.
//! (docs/architecture.md, "Supervision trees".) The faults come from
//! failpoints (`SB_FAILPOINTS`, set here before the node starts).

use streambatch::{Context, NodeConfig};

#[test]
fn failed_executors_and_managers_end_their_jobs_and_the_node_goes_on() {
    // Job 1's executor panics; every task of every job panics once.
    // SAFETY: this binary's only test, before it starts any thread.
    unsafe { std::env::set_var("SB_FAILPOINTS", "executor.panic=1;worker.panic=5:100") };
    let ctx = Context::with_config(NodeConfig {
        cpus: 2.0,
        gpus: Some(0.0),
        store_capacity: 64 << 20,
        ..Default::default()
    })
    .unwrap();

    let err = ctx.range(20, 4).count().unwrap_err().to_string();
    assert!(
        err.contains("the job's executor failed") && err.contains("failpoint executor.panic"),
        "{err}"
    );

    // 150 tasks whose workers each panic once: more than the 100 worker
    // restarts a manager may make in 10 s.
    let err = ctx.range(300, 150).count().unwrap_err().to_string();
    assert!(
        err.contains("the node manager failed") && err.contains("failed too often"),
        "{err}"
    );

    // The manager was started again: a job of 10 tasks runs, each retried once.
    let ds = ctx.range(20, 10);
    assert_eq!(ds.count().unwrap(), 20);
    let stats = ds.stats().unwrap();
    assert_eq!(stats.operators[0].retries, 10, "{stats}");
}
