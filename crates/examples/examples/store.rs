//! cargo run --release -p streambatch-examples --example store
//!
//! The object store on its own: put a partition into shared memory, read it
//! from a second process by name (zero-copy), then fill the store so that it
//! spills the least recently used partition to disk, and read that back.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch};
use streambatch_store::{ObjectStore, SharedStore, StoreConfig, open_shared};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, mode, name] = args.as_slice()
        && mode == "read"
    {
        // The second process: open the partition by name, without copying.
        let shared = open_shared(name)?;
        let sum: i64 = shared
            .batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .iter()
            .sum();
        let start = shared.batch.column(0).to_data().buffers()[0].as_ptr() as usize;
        println!(
            "reader (pid {}): {} rows, sum {sum}, buffers inside the mapped segment: {}",
            std::process::id(),
            shared.batch.num_rows(),
            shared.mapping.contains(&start)
        );
        return Ok(());
    }

    let spill = std::env::temp_dir().join("streambatch-store-example");
    let store = SharedStore::open(StoreConfig::new(32 << 20, &spill))?;
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..1_000_000));
    let part = store.put(RecordBatch::try_from_iter([("id", ids)])?)?;
    let _pin = store.pin(part.id())?; // keep it in memory while the reader runs
    let name = store.shared_name(&part).expect("in memory");
    println!(
        "writer (pid {}): put {} rows as {name}",
        std::process::id(),
        part.rows()
    );

    let status = std::process::Command::new(std::env::current_exe()?)
        .args(["read", &name])
        .status()?;
    assert!(status.success(), "the reader failed");

    // Fill the store: the oldest unpinned partitions spill to disk.
    let blobs: Vec<_> = (0..8u8)
        .map(|i| {
            let data: ArrayRef = Arc::new(BinaryArray::from_vec(vec![vec![i; 6 << 20].as_slice()]));
            store.put(RecordBatch::try_from_iter([("data", data)]).expect("one column"))
        })
        .collect::<Result<_, _>>()?;
    let spilled = blobs
        .iter()
        .filter(|b| store.spill_path(b.id()).is_some())
        .count();
    println!(
        "after 8 puts of 6 MiB into 32 MiB: {spilled} spilled; {:?}",
        store.stats()
    );
    let first = blobs[0].get()?;
    let ok = first
        .column(0)
        .as_binary::<i32>()
        .value(0)
        .iter()
        .all(|&x| x == 0);
    println!(
        "restored the first from {}: bytes intact: {ok}",
        store
            .spill_path(blobs[0].id())
            .map_or("memory".into(), |p| p.display().to_string())
    );
    println!("stats: {:?}", store.stats());
    Ok(())
}
