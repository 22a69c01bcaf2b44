//! Byte sizes: parsing them from settings (`300MiB`), formatting them for
//! people (`1.5 GiB`), and the memory a record batch's slice refers to.

use arrow_array::{Array, RecordBatch};

/// Parses a byte size such as `300MiB`, `4GiB`, `64 MB` or `1048576`.
///
/// ```
/// assert_eq!(streambatch_core::parse_size("300MiB"), Ok(300 << 20));
/// assert!(streambatch_core::parse_size("lots").is_err());
/// ```
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if let Ok(n) = text.parse::<u64>() {
        return Ok(n);
    }
    text.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("`{text}` is not a byte size (like 300MiB or 4GiB): {e}"))
}

/// Formats a byte count for people: `1.5 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    bytesize::ByteSize(bytes).display().iec().to_string()
}

/// Bytes of memory `batch` refers to, counting only the slice it covers (a
/// slice of a large batch counts its own rows, not the whole buffer).
///
/// ```
/// use std::sync::Arc;
/// use arrow_array::{Int64Array, RecordBatch};
/// let b = RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from(vec![0i64; 100])) as _)]).unwrap();
/// assert_eq!(streambatch_core::batch_bytes(&b), 800);
/// assert_eq!(streambatch_core::batch_bytes(&b.slice(0, 10)), 80);
/// ```
pub fn batch_bytes(batch: &RecordBatch) -> u64 {
    batch
        .columns()
        .iter()
        .map(|c| {
            c.to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| c.get_array_memory_size()) as u64
        })
        .sum()
}
