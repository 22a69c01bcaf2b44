//! Output buffers placed in the store: a put adopts them without a copy, and
//! the partition reads, spills, restores and frees like any other.

use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch};
use arrow_buffer::OffsetBuffer;
use streambatch_store::{
    ObjectStore, OutputBuffer, SharedStore, StoreConfig, open_shared, with_output_store,
};

const ROW: usize = 2 << 20;

fn row_batch(id: i64, bytes: OutputBuffer) -> RecordBatch {
    let data = BinaryArray::new(OffsetBuffer::from_lengths([ROW]), bytes.into_buffer(), None);
    RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(vec![id])) as ArrayRef),
        ("data", Arc::new(data) as ArrayRef),
    ])
    .unwrap()
}

fn store(capacity: u64, dir: &tempfile::TempDir) -> Arc<dyn ObjectStore> {
    Arc::new(SharedStore::open(StoreConfig::new(capacity, dir.path())).unwrap())
}

fn in_store(store: &Arc<dyn ObjectStore>, byte: u8) -> OutputBuffer {
    let buffer = with_output_store(store.clone(), || OutputBuffer::filled(ROW, byte));
    assert!(buffer.is_in_store());
    buffer
}

#[test]
fn a_put_adopts_the_buffer_without_more_memory() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(64 << 20, &dir);
    let batch = row_batch(1, in_store(&store, 7));
    let reserved = store.stats().used_bytes;
    assert!(reserved >= ROW as u64);
    let part = store.try_put(batch.clone()).unwrap();
    assert_eq!(store.stats().used_bytes, reserved, "adopted, not copied");
    assert_eq!(part.get().unwrap(), batch);
    drop(batch);
    assert_eq!(part.get().unwrap().column(1).len(), 1);
    drop(part);
    assert_eq!(store.stats().used_bytes, 0);
}

#[test]
fn an_adopted_partition_is_a_valid_stream_for_other_processes() {
    let dir = tempfile::tempdir().unwrap();
    let shared = SharedStore::open(StoreConfig::new(64 << 20, dir.path())).unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(shared.clone());
    let batch = row_batch(3, in_store(&store, 9));
    let part = store.try_put(batch.clone()).unwrap();
    let name = shared.shared_name(&part).unwrap();
    // Validated in full, as a peer on the host reads it.
    assert_eq!(open_shared(&name).unwrap().batch, batch);
}

#[test]
fn an_unused_buffer_gives_its_room_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(64 << 20, &dir);
    let buffer = in_store(&store, 1);
    assert!(store.stats().used_bytes > 0);
    drop(buffer);
    assert_eq!(store.stats().used_bytes, 0);
}

#[test]
fn a_buffer_stored_twice_is_copied_the_second_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(64 << 20, &dir);
    let batch = row_batch(2, in_store(&store, 5));
    let first = store.try_put(batch.clone()).unwrap();
    let reserved = store.stats().used_bytes;
    let second = store.try_put(batch.clone()).unwrap();
    assert!(store.stats().used_bytes > reserved, "the second put copies");
    drop(first);
    assert_eq!(second.get().unwrap(), batch);
    drop((batch, second));
    assert_eq!(store.stats().used_bytes, 0);
}

#[test]
fn the_batch_keeps_its_bytes_after_the_partition_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(64 << 20, &dir);
    let batch = row_batch(4, in_store(&store, 3));
    drop(store.try_put(batch.clone()).unwrap());
    assert!(
        store.stats().used_bytes > 0,
        "the batch still holds the region"
    );
    // Another reservation may not take the bytes the batch still reads.
    let other = in_store(&store, 0xEE);
    let column = batch
        .column(1)
        .as_any()
        .downcast_ref::<BinaryArray>()
        .unwrap();
    assert!(column.value(0).iter().all(|&b| b == 3));
    drop((batch, other));
    assert_eq!(store.stats().used_bytes, 0);
}

#[test]
fn an_adopted_partition_spills_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(8 << 20, &dir);
    let batch = row_batch(5, in_store(&store, 0x5A));
    let adopted = store.try_put(batch.clone()).unwrap();
    drop(batch);
    // Fill the store with copied rows until the adopted one spills.
    let mut others = Vec::new();
    for id in 0..4 {
        let heap = OutputBuffer::filled(ROW, id as u8);
        assert!(!heap.is_in_store(), "outside a task: on the heap");
        others.push(store.put(row_batch(10 + id, heap)).unwrap());
    }
    assert!(store.stats().spilled_bytes > 0);
    let read = adopted.get().unwrap();
    let column = read
        .column(1)
        .as_any()
        .downcast_ref::<BinaryArray>()
        .unwrap();
    assert!(column.value(0).iter().all(|&b| b == 0x5A));
    drop((read, adopted, others));
    assert_eq!(store.stats().used_bytes, 0);
}

#[test]
fn a_full_store_gives_a_heap_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(4 << 20, &dir);
    let first = in_store(&store, 1);
    let second = with_output_store(store.clone(), || OutputBuffer::filled(ROW, 2));
    assert!(!second.is_in_store());
    drop(first);
}

#[test]
fn a_buffer_stored_in_part_is_copied() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(64 << 20, &dir);
    // The array uses half the buffer: the stream's next bytes would land on
    // the other half, which the batch still holds.
    let offsets = OffsetBuffer::from_lengths([ROW / 2]);
    let data = BinaryArray::new(offsets, in_store(&store, 4).into_buffer(), None);
    let batch = RecordBatch::try_from_iter([("data", Arc::new(data) as ArrayRef)]).unwrap();
    let reserved = store.stats().used_bytes;
    let part = store.try_put(batch.clone()).unwrap();
    assert!(store.stats().used_bytes > reserved, "copied, not adopted");
    assert_eq!(part.get().unwrap(), batch);
}
