//! A shuffle and a sort of more rows than the store holds: map outputs
//! spill, reducers read them back, and the process stays within the
//! store's cap plus 256 MiB (alone in its test binary, so that its peak
//! memory is its own).

use streambatch::{Context, NodeConfig, Resources};
use streambatch_bench::{peak_rss_mib, registry};

#[test]
fn a_shuffle_larger_than_the_store_spills_and_completes_within_cap_plus_256_mib() {
    const CAP: u64 = 128 << 20;
    let spill = tempfile::tempdir().unwrap();
    let ctx = Context::with_config(NodeConfig {
        cpus: 2.0,
        gpus: Some(0.0),
        store_capacity: CAP,
        target_partition_bytes: 4 << 20,
        spill_dir: spill.path().to_path_buf(),
        ..NodeConfig::default()
    })
    .unwrap();
    // 96,000 rows of 4 KiB: 375 MiB, three times the store.
    let rows = 96_000u64;
    let params = [0u64.to_le_bytes(), 4096u64.to_le_bytes()].concat();
    let made = || {
        ctx.range(rows, 48).map_batches(
            registry().udf("w1.produce", &params).unwrap(),
            Resources::cpu(1.0),
        )
    };
    for ds in [made().random_shuffle(3), made().sort(&["id"], true)] {
        let mut seen = vec![false; rows as usize];
        let mut last = i64::MAX;
        let sorted = ds
            .explain()
            .unwrap()
            .stage_names()
            .iter()
            .any(|s| s == "sort");
        for batch in ds.iter_batches().unwrap() {
            let batch = batch.unwrap();
            let ids = batch.column(0).as_any();
            let ids = ids.downcast_ref::<arrow_array::Int64Array>().unwrap();
            for &id in ids.values() {
                assert!(
                    !std::mem::replace(&mut seen[id as usize], true),
                    "row {id} twice"
                );
                if sorted {
                    assert!(id < last, "{id} after {last}");
                    last = id;
                }
            }
        }
        assert!(seen.iter().all(|s| *s), "a row is missing");
        let stats = ds.stats().unwrap();
        assert!(stats.spilled_bytes > 0, "nothing spilled: {stats}");
    }
    let peak = peak_rss_mib().unwrap();
    eprintln!("peak RSS {peak:.0} MiB");
    let bound = (CAP >> 20) as f64 + 256.0;
    assert!(peak <= bound, "peak RSS {peak:.0} MiB above {bound} MiB");
}
