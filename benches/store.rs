//! cargo bench --bench store
//!
//! The object store's put and get beside memcpy of the same bytes, in one
//! run: put's throughput against memcpy's, and get of a small and a large
//! partition (zero-copy: about the same time).

use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, RecordBatch};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use streambatch::{ObjectStore, SharedStore, StoreConfig};

fn blob(bytes: usize) -> RecordBatch {
    let data: ArrayRef = Arc::new(BinaryArray::from_vec(vec![vec![7u8; bytes].as_slice()]));
    RecordBatch::try_from_iter([("data", data)]).expect("one column")
}

fn store_put_get(c: &mut Criterion) {
    let spill = tempfile::tempdir().expect("a temp dir");
    let store = SharedStore::open(StoreConfig::new(1 << 30, spill.path())).expect("a store");
    let mut group = c.benchmark_group("store");
    for bytes in [1 << 20, 64 << 20] {
        group.throughput(Throughput::Bytes(bytes as u64));
        let src = vec![1u8; bytes];
        let mut dst = vec![0u8; bytes];
        group.bench_function(BenchmarkId::new("memcpy", bytes), |b| {
            b.iter(|| dst.copy_from_slice(std::hint::black_box(&src)))
        });
        let batch = blob(bytes);
        group.bench_function(BenchmarkId::new("put", bytes), |b| {
            b.iter(|| store.try_put(batch.clone()).expect("fits"))
        });
        let part = store.try_put(batch.clone()).expect("fits");
        group.bench_function(BenchmarkId::new("get", bytes), |b| {
            b.iter(|| part.get().expect("live"))
        });
    }
    group.finish();
}

criterion_group!(benches, store_put_get);
criterion_main!(benches);
