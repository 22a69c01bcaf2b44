//! A store smaller than its first segment (4 MiB) maps smaller segments,
//! and stores and reads partitions as any other.

use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, RecordBatch};
use streambatch_store::{ObjectStore, SharedStore, StoreConfig};

#[test]
fn a_store_smaller_than_a_segment_stores_and_reads() {
    let dir = tempfile::tempdir().unwrap();
    let store = SharedStore::open(StoreConfig::new(3 << 20, dir.path())).unwrap();
    let row = vec![7u8; 128 << 10];
    let mut parts = Vec::new();
    for _ in 0..8 {
        let data = BinaryArray::from_vec(vec![row.as_slice()]);
        let batch = RecordBatch::try_from_iter([("data", Arc::new(data) as ArrayRef)]).unwrap();
        let part = store.try_put(batch.clone()).unwrap();
        assert_eq!(part.get().unwrap(), batch);
        parts.push(part);
    }
    assert!(store.stats().used_bytes >= 8 * (128 << 10));
    assert!(store.stats().used_bytes <= 3 << 20);
}
