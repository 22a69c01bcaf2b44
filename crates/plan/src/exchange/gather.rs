//! Rows picked from several batches into one: arrow's `interleave`, with
//! its own loop for fixed-size binary columns, which arrow 60 interleaves
//! through `MutableArrayData`, a call per row that cost S1 (a 10- and a
//! 90-byte column, gathered once on each side of its exchange) twice what
//! a plain copy of each value does.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, FixedSizeBinaryArray, RecordBatch, RecordBatchOptions};
use arrow_buffer::{BooleanBufferBuilder, NullBuffer};
use arrow_schema::{ArrowError, DataType};

/// The rows `at` (each a batch among `batches` and a row of it), in that
/// order, as one batch of `batches`' schema (all must share it).
pub fn interleave_batches(
    batches: &[&RecordBatch],
    at: &[(usize, usize)],
) -> Result<RecordBatch, ArrowError> {
    let Some(first) = batches.first() else {
        return Err(ArrowError::InvalidArgumentError(
            "interleaving rows of no batch".into(),
        ));
    };
    let columns = (0..first.num_columns())
        .map(|c| {
            let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(c).as_ref()).collect();
            interleave_column(&arrays, at)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(at.len()));
    RecordBatch::try_new_with_options(first.schema(), columns, &options)
}

fn interleave_column(arrays: &[&dyn Array], at: &[(usize, usize)]) -> Result<ArrayRef, ArrowError> {
    match arrays[0].data_type() {
        DataType::FixedSizeBinary(size) => {
            let arrays = arrays
                .iter()
                .map(|a| {
                    a.as_any()
                        .downcast_ref::<FixedSizeBinaryArray>()
                        .filter(|a| a.value_length() == *size)
                        .ok_or_else(|| {
                            ArrowError::InvalidArgumentError(
                                "interleaving columns of different types".into(),
                            )
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Arc::new(interleave_fixed(&arrays, *size, at)?))
        }
        _ => arrow_select::interleave::interleave(arrays, at),
    }
}

fn interleave_fixed(
    arrays: &[&FixedSizeBinaryArray],
    size: i32,
    at: &[(usize, usize)],
) -> Result<FixedSizeBinaryArray, ArrowError> {
    let width = size as usize;
    let values: Vec<&[u8]> = arrays.iter().map(|a| a.values().as_slice()).collect();
    let out_of_range =
        || ArrowError::InvalidArgumentError("an interleaved row out of range".into());
    let mut bytes = Vec::with_capacity(at.len() * width);
    for &(array, row) in at {
        let from = values.get(array).ok_or_else(out_of_range)?;
        let value = from
            .get(row * width..(row + 1) * width)
            .ok_or_else(out_of_range)?;
        bytes.extend_from_slice(value);
    }
    let nulls = match arrays.iter().any(|a| a.null_count() > 0) {
        false => None,
        true => {
            let mut valid = BooleanBufferBuilder::new(at.len());
            for &(array, row) in at {
                valid.append(arrays[array].is_valid(row));
            }
            Some(NullBuffer::new(valid.finish()))
        }
    };
    FixedSizeBinaryArray::try_new_with_len(size, bytes.into(), nulls, at.len())
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int64Array, StringArray};

    use super::*;

    fn batch(keys: Vec<Option<[u8; 3]>>, names: Vec<Option<&str>>) -> RecordBatch {
        let n = keys.len() as i64;
        let keys =
            FixedSizeBinaryArray::try_from_sparse_iter_with_size(keys.into_iter(), 3).unwrap();
        RecordBatch::try_from_iter([
            ("k", Arc::new(keys) as ArrayRef),
            ("name", Arc::new(StringArray::from(names)) as ArrayRef),
            (
                "n",
                Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef,
            ),
        ])
        .unwrap()
    }

    #[test]
    fn rows_come_as_arrow_interleaves_them_nulls_included() {
        let a = batch(
            vec![Some(*b"abc"), None, Some(*b"xyz")],
            vec![Some("p"), None, Some("q")],
        );
        let b = batch(vec![Some(*b"def"), Some(*b"ghi")], vec![None, Some("r")]);
        let at = [(1, 1), (0, 1), (0, 0), (1, 0), (0, 2), (0, 1)];
        let ours = interleave_batches(&[&a, &b], &at).unwrap();
        let arrows = arrow_select::interleave::interleave_record_batch(&[&a, &b], &at).unwrap();
        assert_eq!(ours, arrows);
        let none = interleave_batches(&[&a, &b], &[]).unwrap();
        assert_eq!(none.num_rows(), 0);
        // Without nulls, no null buffer.
        let c = batch(vec![Some(*b"aaa")], vec![Some("s")]);
        let plain = interleave_batches(&[&c, &c], &[(1, 0), (0, 0)]).unwrap();
        assert!(plain.column(0).nulls().is_none());
    }

    #[test]
    fn a_fixed_width_row_out_of_range_is_an_error() {
        let a = batch(vec![Some(*b"abc")], vec![Some("p")]);
        assert!(interleave_batches(&[&a], &[(0, 1)]).is_err());
        assert!(interleave_batches(&[&a], &[(1, 0)]).is_err());
        assert!(interleave_batches(&[], &[]).is_err());
    }
}
