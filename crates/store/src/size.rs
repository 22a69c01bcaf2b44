use arrow_array::{Array, RecordBatch};

/// Bytes of memory `batch` refers to, counting only the slice it covers (a
/// slice of a large batch counts its own rows, not the whole buffer).
///
/// ```
/// use std::sync::Arc;
/// use arrow_array::{Int64Array, RecordBatch};
/// let b = RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from(vec![0i64; 100])) as _)]).unwrap();
/// assert_eq!(streambatch_store::batch_bytes(&b), 800);
/// assert_eq!(streambatch_store::batch_bytes(&b.slice(0, 10)), 80);
/// ```
pub fn batch_bytes(batch: &RecordBatch) -> u64 {
    batch
        .columns()
        .iter()
        .map(|c| c.to_data().get_slice_memory_size().unwrap_or_else(|_| c.get_array_memory_size()) as u64)
        .sum()
}
