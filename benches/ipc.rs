//! cargo bench --bench ipc
//!
//! Arrow IPC encode and decode as the store does them: encode hands back the
//! batch's own buffers between headers (the copy is the store's); the
//! store's trusted decode neither copies nor reads the data, beside
//! arrow-ipc's validating `StreamDecoder` over the same bytes.

use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_buffer::Buffer;
use arrow_ipc::reader::StreamDecoder;
use arrow_ipc::writer::{IpcWriteOptions, StreamEncoder};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn batch(rows: usize) -> RecordBatch {
    RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..rows as i64)) as ArrayRef,
        ),
        (
            "x",
            Arc::new(Float64Array::from_iter_values(
                (0..rows).map(|i| i as f64 * 0.5),
            )) as ArrayRef,
        ),
        (
            "s",
            Arc::new(StringArray::from_iter_values(
                (0..rows).map(|i| format!("row-{i}")),
            )) as ArrayRef,
        ),
    ])
    .expect("equal columns")
}

fn encode(batch: &RecordBatch) -> Vec<Buffer> {
    let options =
        IpcWriteOptions::try_new(64, false, arrow_ipc::MetadataVersion::V5).expect("valid options");
    let mut encoder =
        StreamEncoder::try_new_with_options(&batch.schema(), options).expect("an encoder");
    let mut pieces = encoder.encode(batch).expect("encodes");
    pieces.extend(encoder.finish().expect("ends"));
    pieces
}

fn decode_validated(bytes: &Buffer) -> RecordBatch {
    let mut decoder = StreamDecoder::new().with_require_alignment(true);
    let mut bytes = bytes.clone();
    decoder
        .decode(&mut bytes)
        .expect("decodes")
        .expect("a batch")
}

fn ipc(c: &mut Criterion) {
    let batch = batch(1 << 20);
    let pieces = encode(&batch);
    let mut joined =
        arrow_buffer::MutableBuffer::with_capacity(pieces.iter().map(|p| p.len()).sum());
    for p in &pieces {
        joined.extend_from_slice(p.as_slice());
    }
    let joined: Buffer = joined.into();
    let mut group = c.benchmark_group("ipc");
    group.throughput(Throughput::Bytes(joined.len() as u64));
    group.bench_function("encode", |b| {
        b.iter(|| encode(std::hint::black_box(&batch)))
    });
    // SAFETY: `joined` was encoded above from a valid batch.
    group.bench_function("decode trusted (the store's)", |b| {
        b.iter(|| unsafe { streambatch_store::ipc::decode_trusted(&joined) }.expect("decodes"))
    });
    group.bench_function("decode validated", |b| b.iter(|| decode_validated(&joined)));
    group.finish();
}

criterion_group!(benches, ipc);
criterion_main!(benches);
