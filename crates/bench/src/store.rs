//! The store benchmark: the shared-memory store's put and get timed
//! against this machine's memcpy.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, BinaryArray, RecordBatch};
use arrow_buffer::{Buffer, OffsetBuffer};
use streambatch::{Error, Result};

use crate::round;

/// The store's put and get against this machine's memcpy, in one run: put
/// of a `put_bytes` partition as a ratio to memcpy bandwidth, and get of a
/// 1 MiB and of a `big_bytes` partition (zero-copy: about equal).
pub fn store_bench(
    put_bytes: usize,
    big_bytes: usize,
    spill_dir: &Path,
) -> Result<serde_json::Value> {
    use streambatch_store::{ObjectStore, SharedStore, StoreConfig};
    let bad = |e: streambatch_store::StoreError| Error::store("store benchmark", e);
    let capacity = (2 * put_bytes + big_bytes + (64 << 20)) as u64;
    let store = SharedStore::open(StoreConfig::new(capacity, spill_dir)).map_err(bad)?;
    let bytes_batch = |len: usize| {
        let mut values = Vec::with_capacity(len);
        values.resize(len, 7u8);
        let offsets = OffsetBuffer::from_lengths([len]);
        let data: ArrayRef = Arc::new(BinaryArray::new(offsets, Buffer::from_vec(values), None));
        RecordBatch::try_from_iter([("data", data)]).expect("one column")
    };
    let best = |runs: usize, mut f: Box<dyn FnMut() -> Duration + '_>| {
        (0..runs).map(|_| f()).min().expect("runs > 0")
    };

    // memcpy between two touched buffers of the same size.
    let src = vec![1u8; put_bytes];
    let mut dst = vec![0u8; put_bytes];
    let memcpy = best(
        10,
        Box::new(|| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&dst);
            t.elapsed()
        }),
    );
    // put: the partition is encoded and copied into the (pre-faulted) segment.
    let batch = bytes_batch(put_bytes);
    drop(
        store
            .try_put(batch.clone())
            .map_err(|e| Error::store("store benchmark", e))?,
    ); // maps the segments
    let put = best(
        10,
        Box::new(|| {
            let t = Instant::now();
            let part = store.try_put(batch.clone()).expect("fits");
            let elapsed = t.elapsed();
            drop(part);
            elapsed
        }),
    );
    // get: 1 MiB and a large partition.
    let small = store
        .try_put(bytes_batch(1 << 20))
        .map_err(|e| Error::store("store benchmark", e))?;
    let large = store
        .try_put(bytes_batch(big_bytes))
        .map_err(|e| Error::store("store benchmark", e))?;
    let get = |part: &streambatch_store::PartitionRef| {
        best(
            20,
            Box::new(|| {
                let t = Instant::now();
                let b = part.get().expect("live");
                let elapsed = t.elapsed();
                std::hint::black_box(b);
                elapsed
            }),
        )
    };
    let (get_small, get_large) = (get(&small), get(&large));
    let gbps = |bytes: usize, d: Duration| bytes as f64 / d.as_secs_f64() / 1e9;
    Ok(serde_json::json!({
        "workload": "store",
        "system": "streambatch",
        "memcpy_gb_per_s": round(gbps(put_bytes, memcpy)),
        "put_gb_per_s": round(gbps(put_bytes, put)),
        "put_to_memcpy": round(memcpy.as_secs_f64() / put.as_secs_f64()),
        "put_bytes": put_bytes,
        "get_1mib_us": round(get_small.as_secs_f64() * 1e6),
        "get_large_us": round(get_large.as_secs_f64() * 1e6),
        "large_bytes": big_bytes,
        "get_large_to_small": round(get_large.as_secs_f64() / get_small.as_secs_f64()),
    }))
}
