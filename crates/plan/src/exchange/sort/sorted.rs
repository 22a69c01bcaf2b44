//! A sort reducer's output: its input batches ordered by key and emitted a
//! chunk at a time, never concatenated whole. The order is computed once
//! (`arrow-row` keys of every batch, sorted by their first eight bytes as a
//! number, ties by the whole key and then by arrival, so the sort is
//! stable), and each chunk is gathered from the inputs by
//! `arrow-select`'s `interleave`. A reducer then holds its input, the
//! keys and one chunk, not also a sorted copy of everything.

use arrow_array::RecordBatch;
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{SchemaRef, SortOptions};

use crate::error::{Error, Result};
use crate::exchange::cut::column_indices;

/// Rows per emitted batch.
pub(crate) const CHUNK_ROWS: usize = 64 * 1024;

/// `batches` sorted by `keys` in `order`, emitted in chunks (one empty
/// batch of `schema` when there are no rows).
pub struct Sorted {
    batches: Vec<RecordBatch>,
    /// (batch, row) of each output row, in order.
    order: Vec<(usize, usize)>,
    next: usize,
    /// Rows per emitted batch.
    chunk_rows: usize,
    /// The empty batch still to emit, when there are no rows.
    empty: Option<RecordBatch>,
}

impl Sorted {
    /// Sorts `batches` (of `schema`) by columns `keys`.
    pub fn new(
        schema: &SchemaRef,
        batches: Vec<RecordBatch>,
        keys: &[String],
        order: SortOptions,
    ) -> Result<Self> {
        let batches: Vec<RecordBatch> = batches.into_iter().filter(|b| b.num_rows() > 0).collect();
        let Some(first) = batches.first() else {
            return Ok(Self {
                batches,
                order: Vec::new(),
                next: 0,
                chunk_rows: CHUNK_ROWS,
                empty: Some(RecordBatch::new_empty(schema.clone())),
            });
        };
        let at = column_indices(first, keys)?;
        let rows = key_rows(&batches, &at, order)?;
        let mut starts = Vec::with_capacity(batches.len());
        let mut total = 0;
        for batch in &batches {
            starts.push(total);
            total += batch.num_rows();
        }
        let sorted = sorted_positions(&rows);
        drop(rows);
        // Global positions to (batch, row): positions ascend within a batch.
        let order = sorted
            .into_iter()
            .map(|p| {
                let p = p as usize;
                let batch = starts.partition_point(|&s| s <= p) - 1;
                (batch, p - starts[batch])
            })
            .collect();
        Ok(Self {
            batches,
            order,
            next: 0,
            chunk_rows: CHUNK_ROWS,
            empty: None,
        })
    }

    /// Emits batches of at most `rows` rows (a run written to be merged
    /// with many others, whose merge holds a batch of each).
    pub(crate) fn with_chunk_rows(mut self, rows: usize) -> Self {
        self.chunk_rows = rows.max(1);
        self
    }
}

impl Iterator for Sorted {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(empty) = self.empty.take() {
            return Some(Ok(empty));
        }
        if self.next >= self.order.len() {
            // Done: let go of the input before the iterator is dropped.
            self.batches = Vec::new();
            return None;
        }
        let end = (self.next + self.chunk_rows).min(self.order.len());
        let chunk = &self.order[self.next..end];
        self.next = end;
        let inputs: Vec<&RecordBatch> = self.batches.iter().collect();
        Some(
            crate::exchange::gather::interleave_batches(&inputs, chunk)
                .map_err(|e| Error::arrow("sort", e)),
        )
    }
}

/// The `arrow-row` keys of columns `at` of every batch, as one list.
fn key_rows(batches: &[RecordBatch], at: &[usize], order: SortOptions) -> Result<Rows> {
    let fields = at
        .iter()
        .map(|&k| SortField::new_with_options(batches[0].column(k).data_type().clone(), order))
        .collect();
    let converter = RowConverter::new(fields).map_err(|e| Error::arrow("sort", e))?;
    let total = batches.iter().map(|b| b.num_rows()).sum();
    let mut rows = converter.empty_rows(total, 0);
    for batch in batches {
        let columns: Vec<_> = at.iter().map(|&k| batch.column(k).clone()).collect();
        converter
            .append(&mut rows, &columns)
            .map_err(|e| Error::arrow("sort", e))?;
    }
    Ok(rows)
}

/// Positions of `rows` in their order, equal rows in the order they came:
/// sorted by each row's first eight bytes as a number (zero-padded; the
/// rows compare byte by byte), then runs whose prefixes are equal by the
/// whole row.
pub(crate) fn sorted_positions(rows: &Rows) -> Vec<u32> {
    let mut keyed: Vec<(u64, u32)> = (0..rows.num_rows())
        .map(|i| {
            let row = rows.row(i);
            let bytes = row.as_ref();
            let mut prefix = [0u8; 8];
            let n = bytes.len().min(8);
            prefix[..n].copy_from_slice(&bytes[..n]);
            (u64::from_be_bytes(prefix), i as u32)
        })
        .collect();
    keyed.sort_unstable();
    let mut start = 0;
    while start < keyed.len() {
        let prefix = keyed[start].0;
        let end = start
            + keyed[start..]
                .iter()
                .position(|k| k.0 != prefix)
                .unwrap_or(keyed.len() - start);
        if end - start > 1 {
            keyed[start..end].sort_by(|a, b| {
                rows.row(a.1 as usize)
                    .cmp(&rows.row(b.1 as usize))
                    .then(a.1.cmp(&b.1))
            });
        }
        start = end;
    }
    keyed.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Array, ArrayRef, BinaryArray, Int64Array, StringArray};

    use super::*;

    fn batch(keys: Vec<Option<&str>>, tags: Vec<i64>) -> RecordBatch {
        let keys: ArrayRef = Arc::new(StringArray::from(keys));
        let tags: ArrayRef = Arc::new(Int64Array::from(tags));
        RecordBatch::try_from_iter([("k", keys), ("tag", tags)]).unwrap()
    }

    fn sorted(batches: Vec<RecordBatch>, order: SortOptions) -> Vec<(Option<String>, i64)> {
        let schema = batches[0].schema();
        let out: Vec<RecordBatch> = Sorted::new(&schema, batches, &["k".into()], order)
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        out.iter()
            .flat_map(|b| {
                let k = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
                let t = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
                (0..b.num_rows())
                    .map(|i| (k.is_valid(i).then(|| k.value(i).to_string()), t.value(i)))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Keys sharing their first eight bytes, keys shorter than eight bytes,
    /// duplicates and nulls, across batches: the same order as a stable
    /// sort of the whole, in both directions and both null placements.
    #[test]
    fn orders_as_a_stable_sort_of_the_whole() {
        let keys = [
            Some("prefix-same-b"),
            Some("a"),
            None,
            Some("prefix-same-a"),
            Some(""),
            Some("prefix-same-b"),
            Some("ab"),
            None,
            Some("a"),
            Some("prefix-same"),
        ];
        let all: Vec<(Option<String>, i64)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.map(String::from), i as i64))
            .collect();
        let batches = vec![
            batch(keys[..4].to_vec(), (0..4).collect()),
            batch(vec![], vec![]),
            batch(keys[4..].to_vec(), (4..10).collect()),
        ];
        for descending in [false, true] {
            for nulls_first in [false, true] {
                let order = SortOptions {
                    descending,
                    nulls_first,
                };
                let mut expected = all.clone();
                expected.sort_by(|a, b| match (&a.0, &b.0) {
                    (None, None) => std::cmp::Ordering::Equal,
                    (None, _) if nulls_first => std::cmp::Ordering::Less,
                    (None, _) => std::cmp::Ordering::Greater,
                    (_, None) if nulls_first => std::cmp::Ordering::Greater,
                    (_, None) => std::cmp::Ordering::Less,
                    (Some(x), Some(y)) if descending => y.cmp(x),
                    (Some(x), Some(y)) => x.cmp(y),
                });
                assert_eq!(sorted(batches.clone(), order), expected, "{order:?}");
            }
        }
    }

    #[test]
    fn emits_chunks_and_an_empty_input_as_one_empty_batch() {
        let n = CHUNK_ROWS * 2 + 5;
        let keys: ArrayRef = Arc::new(BinaryArray::from_iter_values(
            (0..n as u64).rev().map(|i| i.to_be_bytes()),
        ));
        let input = RecordBatch::try_from_iter([("k", keys)]).unwrap();
        let schema = input.schema();
        let out: Vec<RecordBatch> =
            Sorted::new(&schema, vec![input], &["k".into()], SortOptions::default())
                .unwrap()
                .collect::<Result<_>>()
                .unwrap();
        assert_eq!(
            out.iter().map(|b| b.num_rows()).collect::<Vec<_>>(),
            [CHUNK_ROWS, CHUNK_ROWS, 5]
        );
        let first = out[0]
            .column(0)
            .as_any()
            .downcast_ref::<BinaryArray>()
            .unwrap();
        assert_eq!(first.value(0), 0u64.to_be_bytes());
        let empty: Vec<RecordBatch> =
            Sorted::new(&schema, vec![], &["k".into()], SortOptions::default())
                .unwrap()
                .collect::<Result<_>>()
                .unwrap();
        assert_eq!(empty.len(), 1);
        assert_eq!((empty[0].num_rows(), empty[0].schema()), (0, schema));
    }
}
