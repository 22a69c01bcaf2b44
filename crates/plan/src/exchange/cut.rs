//! Rows cut by destination, as the map side of an exchange (issue 26:
//! sort, shuffle, group and join) cuts each of its outputs: one batch with
//! its rows grouped by destination and where each group starts, so that a
//! map task stores one partition, not one per destination, and a reducer
//! reads its group as a slice of it (metadata growing with maps plus
//! destinations, not their product).
//!
//! Keys of one or more columns are compared as `arrow-row` encodes them:
//! equal keys (nulls included) encode to equal bytes, and the bytes order
//! as the keys do, so a hash of the bytes picks a destination for a hash
//! exchange and a binary search among boundary keys for a range exchange.

use arrow_array::{ArrayRef, RecordBatch, UInt32Array};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::SortOptions;

use crate::error::{Error, Result};

/// A batch's rows grouped by destination: destination `d`'s rows are
/// `batch.slice(starts[d], starts[d + 1] - starts[d])`, in their order in
/// the input.
#[derive(Debug, Clone)]
pub struct Partitioned {
    /// The rows, grouped.
    pub batch: RecordBatch,
    /// Where each destination's rows start, and the end: `n + 1` offsets
    /// (for a sort's map output, where each chunk of keys starts).
    pub starts: Vec<usize>,
    /// A sort's map output's keys, from which the exchange cuts its
    /// ranges; `None` for other cuts.
    pub sample: Option<crate::exchange::sort::sample::KeySample>,
}

impl Partitioned {
    /// Destination `d`'s rows.
    pub fn rows_for(&self, d: usize) -> RecordBatch {
        self.batch
            .slice(self.starts[d], self.starts[d + 1] - self.starts[d])
    }
}

/// The key columns `keys` of `batch` encoded as comparable rows, each
/// column ordered as `order` says (ascending, nulls first, where `order` is
/// shorter).
pub fn key_rows(batch: &RecordBatch, keys: &[usize], order: &[SortOptions]) -> Result<Rows> {
    key_rows_of(std::slice::from_ref(batch), keys, order)
}

/// [`key_rows`] of batches of one schema, one after another: row `i` of
/// the result is the `i`-th row counting through `parts` in order.
pub fn key_rows_of(parts: &[RecordBatch], keys: &[usize], order: &[SortOptions]) -> Result<Rows> {
    let columns_of = |batch: &RecordBatch| -> Result<Vec<ArrayRef>> {
        keys.iter()
            .map(|&k| {
                batch.columns().get(k).cloned().ok_or_else(|| {
                    Error::Invalid(format!(
                        "key column {k} of a batch of {} columns",
                        batch.num_columns()
                    ))
                })
            })
            .collect()
    };
    let Some(first) = parts.first() else {
        return Err(Error::Invalid("key rows of no batch".into()));
    };
    let fields = columns_of(first)?
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let options = order.get(i).copied().unwrap_or_default();
            SortField::new_with_options(c.data_type().clone(), options)
        })
        .collect();
    let converter = RowConverter::new(fields).map_err(arrow_error)?;
    let total = parts.iter().map(RecordBatch::num_rows).sum();
    let mut rows = converter.empty_rows(total, 0);
    for part in parts {
        converter
            .append(&mut rows, &columns_of(part)?)
            .map_err(arrow_error)?;
    }
    Ok(rows)
}

/// The rows of `parts` (counted through them in order) at `order`, as one
/// batch: a `take` of a single part, else one `interleave` of them all,
/// so that batches gathered for a partition are cut with one copy, not
/// joined first.
pub(crate) fn gather(parts: &[RecordBatch], order: Vec<u32>) -> Result<RecordBatch> {
    if let [batch] = parts {
        return arrow_select::take::take_record_batch(batch, &UInt32Array::from(order))
            .map_err(arrow_error);
    }
    let mut starts = Vec::with_capacity(parts.len() + 1);
    starts.push(0usize);
    for part in parts {
        starts.push(starts.last().expect("pushed") + part.num_rows());
    }
    let at: Vec<(usize, usize)> = order
        .iter()
        .map(|&row| {
            let row = row as usize;
            let part = starts.partition_point(|&s| s <= row) - 1;
            (part, row - starts[part])
        })
        .collect();
    let parts: Vec<&RecordBatch> = parts.iter().collect();
    crate::exchange::gather::interleave_batches(&parts, &at).map_err(arrow_error)
}

/// The positions of columns `names` in `batch`, or an error naming the one
/// missing.
pub(crate) fn column_indices(batch: &RecordBatch, names: &[String]) -> Result<Vec<usize>> {
    names
        .iter()
        .map(|name| {
            batch.schema().index_of(name).map_err(|_| {
                Error::Invalid(format!(
                    "no key column `{name}` among {:?}",
                    batch
                        .schema()
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                ))
            })
        })
        .collect()
}

/// The rows of `parts` (batches of one schema, one after another) cut
/// into `n` destinations by a hash of their key columns `keys` (seeded by
/// `seed`): rows with equal keys, nulls included, go to the same
/// destination.
pub fn by_hash(parts: &[RecordBatch], keys: &[usize], n: usize, seed: u64) -> Result<Partitioned> {
    if keys.is_empty() {
        // No key: one group, at destination 0.
        return group(parts, n.max(1), |_| 0);
    }
    let rows = key_rows_of(parts, keys, &[])?;
    let n = n.max(1) as u64;
    let destination = |row: usize| {
        let hash = streambatch_core::fnv1a(rows.row(row).as_ref());
        (streambatch_core::mix64(hash ^ seed) % n) as usize
    };
    group(parts, n as usize, destination)
}

/// The rows of `parts` grouped by `destination` (below `n`; of a row's
/// place counting through `parts`), each group in the input's order: a
/// counting sort, then one [`gather`].
pub(crate) fn group(
    parts: &[RecordBatch],
    n: usize,
    destination: impl Fn(usize) -> usize,
) -> Result<Partitioned> {
    let total = parts.iter().map(RecordBatch::num_rows).sum();
    let of: Vec<usize> = (0..total).map(destination).collect();
    let mut starts = vec![0usize; n + 1];
    for &d in &of {
        starts[d + 1] += 1;
    }
    for d in 0..n {
        starts[d + 1] += starts[d];
    }
    let mut next = starts.clone();
    let mut order = vec![0u32; of.len()];
    for (row, &d) in of.iter().enumerate() {
        order[next[d]] = row as u32;
        next[d] += 1;
    }
    Ok(Partitioned {
        batch: gather(parts, order)?,
        starts,
        sample: None,
    })
}

fn arrow_error(e: arrow_schema::ArrowError) -> Error {
    Error::Invalid(format!("cutting rows by destination: {e}"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{Int64Array, StringArray};

    use super::*;

    /// `x` (nulls where None) and `name`, and a row number `n`.
    fn batch(x: &[Option<i64>], name: &[&str]) -> RecordBatch {
        let n: ArrayRef = Arc::new(Int64Array::from_iter_values(0..x.len() as i64));
        RecordBatch::try_from_iter([
            ("x", Arc::new(Int64Array::from(x.to_vec())) as ArrayRef),
            (
                "name",
                Arc::new(StringArray::from(name.to_vec())) as ArrayRef,
            ),
            ("n", n),
        ])
        .unwrap()
    }

    fn numbers(b: &RecordBatch) -> Vec<i64> {
        b.column(2).as_primitive::<Int64Type>().values().to_vec()
    }

    #[test]
    fn equal_keys_nulls_included_go_to_one_destination_each_row_once() {
        let x = [
            Some(1),
            None,
            Some(2),
            Some(1),
            None,
            Some(3),
            Some(2),
            Some(1),
        ];
        let name = ["a", "b", "a", "a", "b", "c", "a", "z"];
        let input = batch(&x, &name);
        let cut = by_hash(std::slice::from_ref(&input), &[0, 1], 4, 7).unwrap();
        assert_eq!(cut.starts.len(), 5);
        assert_eq!(cut.starts[4], x.len());
        let mut seen = vec![];
        let mut home = std::collections::HashMap::new();
        for d in 0..4 {
            let rows = numbers(&cut.rows_for(d));
            // Within a destination, in the input's order.
            assert!(rows.windows(2).all(|w| w[0] < w[1]), "{rows:?}");
            for n in rows {
                let key = (x[n as usize], name[n as usize]);
                assert_eq!(*home.entry(key).or_insert(d), d, "{key:?} in two places");
                seen.push(n);
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..x.len() as i64).collect::<Vec<_>>());
        // The same seed, the same cut.
        assert_eq!(
            numbers(
                &by_hash(std::slice::from_ref(&input), &[0, 1], 4, 7)
                    .unwrap()
                    .batch
            ),
            numbers(&cut.batch)
        );
    }

    #[test]
    fn an_empty_batch_cuts_into_empty_groups_and_a_missing_key_is_named() {
        let empty = batch(&[], &[]);
        let cut = by_hash(std::slice::from_ref(&empty), &[0], 3, 1).unwrap();
        assert_eq!(cut.starts, [0, 0, 0, 0]);
        let err = by_hash(std::slice::from_ref(&empty), &[5], 3, 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("key column 5"), "{err}");
    }
}
