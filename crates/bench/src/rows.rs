//! The W1-shaped rows (`id`, `data`) that W1 and the shaped workloads make
//! and check: each row filled with its id's byte, checked by [`checksum`],
//! and [`taking`], which pads a task out to its stage's time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, BinaryArray, RecordBatch};
use arrow_buffer::{Buffer, OffsetBuffer};
use streambatch::{OutputBuffer, UdfError};

use crate::{checksum, checksum_filled};

/// Bytes of one W1 row.
pub(crate) const W1_ROW_BYTES: usize = 10 << 20;

/// The byte W1's row `id` is filled with (never 0, so that filling it
/// writes every page, as a real producer's output would).
pub(crate) fn w1_byte(id: i64) -> u8 {
    (id % 255 + 1) as u8
}

/// Checks that each row of a W1-shaped batch (`id`, `data`) holds its id's
/// bytes, all of them: `row_bytes` long, and the [`checksum`] of a row
/// filled with [`w1_byte`] of its id. About a millisecond per 10 MiB row.
pub(crate) fn check_rows(b: &RecordBatch, row_bytes: usize) -> std::result::Result<(), UdfError> {
    let ids = b
        .column(0)
        .as_primitive_opt::<Int64Type>()
        .ok_or("`id` is not Int64")?;
    let data = b.column_by_name("data").ok_or("no column `data`")?;
    let data = data.as_binary_opt::<i32>().ok_or("`data` is not Binary")?;
    if data.len() != ids.len() {
        return Err("`id` and `data` differ in length".into());
    }
    for (id, row) in ids.values().iter().zip(data.iter()) {
        let row = row.ok_or("null row")?;
        let want = checksum_filled(w1_byte(*id), row_bytes);
        if row.len() != row_bytes || checksum(row) != want {
            return Err(format!("row {id} does not hold its bytes").into());
        }
    }
    Ok(())
}

/// One row of `row_bytes` per id, in a buffer allocated for this batch and
/// filled row by row with [`w1_byte`] of the row's id, as a producer's
/// output would be (a one-row batch is one row in a buffer of its own). The
/// buffer is freed with the batch's last reference.
pub(crate) fn filled_rows(
    ids: &ArrayRef,
    row_bytes: usize,
    place: Rows,
) -> std::result::Result<RecordBatch, UdfError> {
    let ids_i64 = ids
        .as_primitive_opt::<Int64Type>()
        .ok_or("`id` is not Int64")?;
    let rows = ids_i64.len();
    let bytes = match place {
        Rows::Output => {
            let first = ids_i64.values().first().map_or(0, |&id| w1_byte(id));
            let mut buffer = OutputBuffer::filled(rows * row_bytes, first);
            let chunks = buffer.as_mut_slice().chunks_mut(row_bytes.max(1));
            for (row, &id) in chunks.zip(ids_i64.values()).skip(1) {
                row.fill(w1_byte(id));
            }
            buffer.into_buffer()
        }
        Rows::Heap => {
            let mut bytes = Vec::with_capacity(rows * row_bytes);
            for &id in ids_i64.values() {
                bytes.resize(bytes.len() + row_bytes, w1_byte(id));
            }
            Buffer::from_vec(bytes)
        }
    };
    let offsets = OffsetBuffer::from_lengths(std::iter::repeat_n(row_bytes, rows));
    let data: ArrayRef = Arc::new(BinaryArray::new(offsets, bytes, None));
    Ok(RecordBatch::try_from_iter([
        ("id", ids.clone()),
        ("data", data),
    ])?)
}

/// Where [`filled_rows`] makes its bytes.
#[derive(Clone, Copy)]
pub(crate) enum Rows {
    /// On the heap: rows that the next operator of the task consumes.
    Heap,
    /// In the task's store ([`OutputBuffer`]): a stage's output, stored
    /// without a copy.
    Output,
}

/// Runs `make`, then sleeps what is left of `total`: a task that takes
/// `total` in all, its real work included, as the workloads' ideals assume
/// (the sleep stands for the rest of the stage's work).
pub(crate) fn taking<T>(total: Duration, make: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = make();
    if let Some(rest) = total.checked_sub(started.elapsed()) {
        std::thread::sleep(rest);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Int64Array;

    #[test]
    fn a_w1_row_with_one_wrong_byte_anywhere_fails_the_check() {
        let row_bytes = 4096 + 3;
        let ids: ArrayRef = Arc::new(Int64Array::from(vec![7, 300]));
        let batch = filled_rows(&ids, row_bytes, Rows::Heap).unwrap();
        check_rows(&batch, row_bytes).unwrap();
        let data = batch.column(1).as_binary::<i32>();
        for at in [0, 1, 2048, row_bytes - 1, row_bytes, 2 * row_bytes - 2] {
            let mut bytes = data.value_data().to_vec();
            bytes[at] = bytes[at].wrapping_add(1);
            let offsets = OffsetBuffer::from_lengths([row_bytes, row_bytes]);
            let wrong: ArrayRef =
                Arc::new(BinaryArray::new(offsets, Buffer::from_vec(bytes), None));
            let wrong = RecordBatch::try_from_iter([("id", ids.clone()), ("data", wrong)]).unwrap();
            let err = check_rows(&wrong, row_bytes).unwrap_err().to_string();
            assert!(err.contains("does not hold its bytes"), "byte {at}: {err}");
        }
        // A row of another id's bytes, and a row of the wrong length.
        let other: ArrayRef = Arc::new(Int64Array::from(vec![8, 300]));
        let data = batch.column(1).clone();
        let swapped = RecordBatch::try_from_iter([("id", other), ("data", data)]).unwrap();
        assert!(check_rows(&swapped, row_bytes).is_err());
        assert!(check_rows(&batch, row_bytes - 1).is_err());
    }
}
