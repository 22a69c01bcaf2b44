//! W4 (batch inference on Parquet files) on the CPU, scaled down: every
//! embedding written is checked against the direct f64 computation, and
//! `rows` in the JSON line is the rows written and checked.

use streambatch::NodeConfig;
use streambatch_bench::{self as bench, Device};

#[test]
fn w4_on_the_cpu_writes_and_checks_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("images");
    // 200 images in 4 files: 64-row batches and a remainder of 8.
    bench::make_images(&input, 4, 50, 42).unwrap();
    let base = NodeConfig {
        cpus: 2.0,
        gpus: Some(0.0),
        store_capacity: 256 << 20,
        spill_dir: dir.path().join("spill"),
        ..NodeConfig::default()
    };
    let output = dir.path().join("out");
    let result = bench::w4_on(Device::Cpu, &input, &output, &base).unwrap();
    assert!(result.correct, "{}", result.to_json());
    assert_eq!(result.rows, 200);
    let line: serde_json::Value = serde_json::from_str(&result.to_json()).unwrap();
    assert_eq!(line["rows"], 200);
    assert_eq!(line["rows_matching"], 200);
    assert_eq!(line["images"], 200);
    assert!(line["store_peak_bytes"].as_u64().unwrap() > 0);

    // Every row is checked: one wrong embedding is found.
    let ctx = streambatch::Context::with_config(base).unwrap();
    let check = bench::check_embeddings(&ctx, &input, &output, 42).unwrap();
    assert!(check.all_match());
    let other_seed = bench::check_embeddings(&ctx, &input, &output, 7).unwrap();
    assert_eq!(other_seed.matching, 0);
    assert!(!other_seed.all_match());
}
