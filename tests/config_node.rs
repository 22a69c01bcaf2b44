//! Node settings from TOML and `STREAMBATCH_*` variables; bad values name the
//! key and the file.

use std::io::Write;

use streambatch::{Context, NodeConfig};

fn toml_file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

// One test: it sets environment variables, which the other checks must not see.
#[test]
fn node_config_from_toml_and_environment() {
    // The shipped file loads, and a file sets every key.
    let shipped = NodeConfig::load(Some(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/configs/local.toml"
    ))))
    .unwrap();
    assert_eq!(shipped.gpus, None, "auto: one slot per adapter");
    assert_eq!(shipped.target_partition_bytes, 64 << 20);
    let f = toml_file(
        "cpus = 3\ngpus = 1\nstore_capacity = \"300MiB\"\ntarget_partition_bytes = 1048576\nspill_dir = \"/tmp/sb\"\nmax_task_retries = 5\n",
    );
    let c = NodeConfig::load(Some(f.path())).unwrap();
    assert_eq!(
        (c.cpus, c.gpus, c.store_capacity, c.target_partition_bytes),
        (3.0, Some(1.0), 300 << 20, 1 << 20)
    );
    assert_eq!(
        (c.spill_dir.to_str().unwrap(), c.max_task_retries),
        ("/tmp/sb", 5)
    );

    // A bad value names the key and the file.
    let f = toml_file("store_capacity = \"lots\"\n");
    let err = NodeConfig::load(Some(f.path())).unwrap_err().to_string();
    assert!(
        err.contains("store_capacity")
            && err.contains(f.path().file_name().unwrap().to_str().unwrap()),
        "{err}"
    );
    let f = toml_file("cpus = -2\n");
    let err = NodeConfig::load(Some(f.path())).unwrap_err().to_string();
    assert!(err.contains("`cpus`"), "{err}");
    let f = toml_file("cpu = 2\n");
    let err = NodeConfig::load(Some(f.path())).unwrap_err().to_string();
    assert!(
        err.contains("unknown key `cpu`")
            && err.contains(f.path().file_name().unwrap().to_str().unwrap()),
        "{err}"
    );
    let err = Context::from_config_file("/nonexistent/node.toml")
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("/nonexistent/node.toml"), "{err}");

    // Environment variables override the file.
    let f = toml_file("cpus = 3\n");
    // SAFETY: no other test in this binary reads or writes the environment.
    unsafe { std::env::set_var("STREAMBATCH_CPUS", "6") };
    let c = NodeConfig::load(Some(f.path())).unwrap();
    assert_eq!(c.cpus, 6.0);
    unsafe { std::env::set_var("STREAMBATCH_GPUS", "many") };
    let err = NodeConfig::load(None).unwrap_err().to_string();
    assert!(err.contains("gpus"), "{err}");
    unsafe {
        std::env::remove_var("STREAMBATCH_CPUS");
        std::env::remove_var("STREAMBATCH_GPUS");
    }
    // With no file, Context::local() uses the defaults.
    let ctx = Context::local().unwrap();
    let defaults = NodeConfig::default();
    assert_eq!(
        (ctx.config().cpus, ctx.config().store_capacity),
        (defaults.cpus, defaults.store_capacity)
    );
    // gpus "auto": one slot per hardware adapter found; a software one
    // (lavapipe) only when asked for.
    assert_eq!(
        ctx.config().gpus,
        Some(streambatch::GpuPool::global().auto_slots(false) as f64)
    );
}

#[test]
fn failure_keys_are_read_and_checked() {
    let c = NodeConfig::from_toml_str(
        "retry_user_errors = true\nmax_errored_partitions = 5",
        "inline",
    )
    .unwrap();
    assert!(c.retry_user_errors);
    assert_eq!(c.max_errored_partitions, 5);
    let d = NodeConfig::default();
    assert!(!d.retry_user_errors);
    assert_eq!(d.max_errored_partitions, 0);
    assert_eq!(d.node_timeout_ms, 5_000);
    let t = NodeConfig::from_toml_str("node_timeout_ms = 1500", "inline").unwrap();
    assert_eq!(t.node_timeout_ms, 1_500);
    let err = NodeConfig::from_toml_str("node_timeout_ms = 50", "inline")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("node_timeout_ms") && err.contains("200"),
        "{err}"
    );
    let err = NodeConfig::from_toml_str("retry_user_errors = 3", "inline.toml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("retry_user_errors") && err.contains("true or false"),
        "{err}"
    );
}

#[test]
fn observability_keys_are_read_and_checked() {
    let shipped = NodeConfig::default();
    assert!(shipped.record_timeline && shipped.metrics_addr.is_none());
    let c = NodeConfig::from_toml_str(
        "record_timeline = false\nmetrics_addr = \"127.0.0.1:9464\"\n",
        "obs.toml",
    )
    .unwrap();
    assert!(!c.record_timeline);
    assert_eq!(c.metrics_addr, Some("127.0.0.1:9464".parse().unwrap()));
    let err = NodeConfig::from_toml_str("metrics_addr = \"nowhere\"\n", "obs.toml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("metrics_addr") && err.contains("obs.toml"),
        "{err}"
    );
}

/// A store capacity the user set that /dev/shm cannot back stops the node
/// at start, naming /dev/shm (a default one is cut to fit instead: see the
/// store's tests); one that fits starts.
#[test]
fn a_store_capacity_set_beyond_dev_shm_is_refused_at_start() {
    let spill = tempfile::tempdir().unwrap();
    let config = |store_capacity| NodeConfig {
        cpus: 1.0,
        gpus: Some(0.0),
        store_capacity,
        spill_dir: spill.path().to_path_buf(),
        ..NodeConfig::default()
    };
    let err = Context::with_config(config(1 << 50))
        .err()
        .expect("1 PiB of /dev/shm");
    let message = format!("{err:#}");
    assert!(message.contains("/dev/shm"), "{message}");
    assert!(Context::with_config(config(64 << 20)).is_ok());
}
