//! Which columns of a Parquet file are written without a dictionary.
//!
//! The `parquet` crate tries a dictionary for every column: it hashes each
//! value into it until the dictionary page is full (1 MiB), then writes the
//! rest plain. For a column of nearly unique values (random keys, ids,
//! payloads) that is all cost: the dictionary never shrinks the file, and
//! hashing and interning every value took a seventh of S1's Parquet writes.
//! So a file's first batch decides (DuckDB's writer, too, writes a
//! dictionary only where it pays, judged per row group): a column whose
//! sampled values are nearly all distinct is written plain.
//!
//! The price of judging by the first batch: a column unique there but
//! repeating later in the file (a file sorted by day, then product) is
//! written plain, which makes the file larger, never wrong.

use std::collections::HashSet;

use arrow_array::{RecordBatch, UInt32Array};
use arrow_row::{RowConverter, SortField};
use arrow_schema::DataType;
use parquet::schema::types::ColumnPath;

/// Rows sampled from the first batch, evenly spaced.
const SAMPLE: usize = 4096;

/// The most bytes a column's sample may copy.
const MAX_SAMPLE_BYTES: usize = 4 << 20;

/// Sampled values that must repeat for a column to keep its dictionary: a
/// random sample of 4,096 with fewer than 40 repeats comes from a column of
/// some 200,000 distinct values or more (by the birthday bound), whose
/// dictionary of values of 5 bytes or more outgrows its page anyway.
const REPEATS_FOR_A_DICTIONARY: usize = SAMPLE / 100;

/// The top-level columns of `first` (a file's first batch) whose values are
/// so nearly all distinct that a dictionary could not pay. A batch under
/// [`SAMPLE`] rows says too little: none. Nested columns, and columns of
/// values over a KiB on average, keep the writer's default.
pub(crate) fn plain_columns(first: &RecordBatch) -> Vec<ColumnPath> {
    let rows = first.num_rows();
    if rows < SAMPLE {
        return Vec::new();
    }
    let at = UInt32Array::from_iter_values((0..SAMPLE).map(|i| (i * rows / SAMPLE) as u32));
    let schema = first.schema();
    schema
        .fields()
        .iter()
        .zip(first.columns())
        .filter(|(field, _)| !field.data_type().is_nested() && !is_dictionary(field.data_type()))
        // Copying a sample of long values (images, documents) would cost
        // more than it saves: those keep the default.
        .filter(|(_, column)| {
            // The slice's own bytes: a slice of a larger batch shares its
            // buffers.
            let bytes = column
                .to_data()
                .get_slice_memory_size()
                .unwrap_or(usize::MAX);
            bytes / rows * SAMPLE <= MAX_SAMPLE_BYTES
        })
        .filter(|(_, column)| {
            let Ok(sample) = arrow_select::take::take(column.as_ref(), &at, None) else {
                return false;
            };
            distinct(&sample).is_some_and(|d| SAMPLE - d < REPEATS_FOR_A_DICTIONARY)
        })
        .map(|(field, _)| ColumnPath::from(field.name().as_str()))
        .collect()
}

fn is_dictionary(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Dictionary(..))
}

/// Distinct values of `column` (nulls one value), by their `arrow-row` bytes.
fn distinct(column: &arrow_array::ArrayRef) -> Option<usize> {
    let converter = RowConverter::new(vec![SortField::new(column.data_type().clone())]).ok()?;
    let rows = converter
        .convert_columns(std::slice::from_ref(column))
        .ok()?;
    Some(rows.iter().map(|r| r.data()).collect::<HashSet<_>>().len())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, FixedSizeBinaryArray, Int64Array, StringArray};

    use super::*;

    fn names(columns: Vec<ColumnPath>) -> Vec<String> {
        columns.iter().map(|c| c.string()).collect()
    }

    #[test]
    fn nearly_unique_columns_go_plain_and_repeating_ones_keep_a_dictionary() {
        let n = 10_000i64;
        let unique: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n));
        let few: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..n).map(|i| format!("city-{}", i % 50)),
        ));
        let keys: ArrayRef = Arc::new(
            FixedSizeBinaryArray::try_from_iter((0..n).map(|i| (i * 7919).to_le_bytes())).unwrap(),
        );
        // 2 % of the sampled values repeat: over the threshold.
        let some_repeats: ArrayRef = Arc::new(Int64Array::from_iter_values(
            (0..n).map(|i| if i % 50 == 0 { 0 } else { i }),
        ));
        let batch = RecordBatch::try_from_iter([
            ("id", unique),
            ("city", few),
            ("key", keys),
            ("some_repeats", some_repeats),
        ])
        .unwrap();
        assert_eq!(names(plain_columns(&batch)), ["id", "key"]);
    }

    #[test]
    fn a_slice_of_a_larger_batch_is_judged_by_its_own_rows() {
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..2_000_000));
        let batch = RecordBatch::try_from_iter([("id", ids)]).unwrap();
        assert_eq!(names(plain_columns(&batch.slice(0, 10_000))), ["id"]);
    }

    #[test]
    fn long_values_are_not_sampled() {
        let long: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..5_000).map(|i| format!("{i:02048}")),
        ));
        let batch = RecordBatch::try_from_iter([("document", long)]).unwrap();
        assert!(plain_columns(&batch).is_empty());
    }

    #[test]
    fn a_small_first_batch_decides_nothing() {
        let unique: ArrayRef = Arc::new(Int64Array::from_iter_values(0..100));
        let batch = RecordBatch::try_from_iter([("id", unique)]).unwrap();
        assert!(plain_columns(&batch).is_empty());
    }
}
