//! Short string keys packed into one integer per row, for grouping: a
//! hash map keyed by an integer hashes and compares it in a few
//! instructions, where string or `arrow-row` keys are hashed byte by byte
//! and compared with `memcmp` (the H2O groupby's keys, `id001` or
//! `id0000000001`, alone or in pairs, are such keys).

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};

/// The most bytes a row's packed keys take: each key's bytes after a byte
/// giving its length.
const PACKED_BYTES: usize = 16;

/// A null key's length byte: no length of a packed key is this large.
const NULL: u8 = 0xFF;

/// Each row's keys (columns `keys` of `batch`) packed into a `u128`, equal
/// for two rows exactly when their keys are: `None` unless every key is a
/// string column and the longest values of the keys, a byte added to each
/// for its length, fit in 16 bytes.
pub(crate) fn packed_keys(batch: &RecordBatch, keys: &[usize]) -> Option<Vec<u128>> {
    let columns = keys
        .iter()
        .map(|&k| batch.column(k).as_string_opt::<i32>())
        .collect::<Option<Vec<_>>>()?;
    let mut width = 0;
    for column in &columns {
        let offsets = column.value_offsets();
        let longest = offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        width += 1 + usize::try_from(longest).ok()?;
        if width > PACKED_BYTES {
            return None;
        }
    }
    if let [column] = columns[..] {
        // One key: no shifting, and no null to look for where it has none.
        let (offsets, values) = (column.value_offsets(), column.value_data());
        let no_nulls = column.null_count() == 0;
        let packed = (0..batch.num_rows()).map(|row| match no_nulls || column.is_valid(row) {
            true => field(offsets, values, row).0,
            false => u128::from(NULL),
        });
        return Some(packed.collect());
    }
    let packed = (0..batch.num_rows()).map(|row| {
        let (mut key, mut shift) = (0u128, 0);
        for column in &columns {
            let (bits, bytes) = match column.is_null(row) {
                true => (u128::from(NULL), 1),
                false => field(column.value_offsets(), column.value_data(), row),
            };
            key |= bits << shift;
            shift += 8 * bytes;
        }
        key
    });
    Some(packed.collect())
}

/// Row `row`'s value (`offsets` into `values`) after a byte of its
/// length, and the bytes that takes.
fn field(offsets: &[i32], values: &[u8], row: usize) -> (u128, usize) {
    let (start, end) = (offsets[row] as usize, offsets[row + 1] as usize);
    let bits = (value_bits(values, start, end) << 8) | (end - start) as u128;
    (bits, 1 + end - start)
}

/// The bytes `start..end` (at most 15) of `values`, little endian: read 16
/// at once where the buffer has them, and masked.
fn value_bits(values: &[u8], start: usize, end: usize) -> u128 {
    let len = end - start;
    let raw = match values.get(start..start + PACKED_BYTES) {
        Some(sixteen) => u128::from_le_bytes(sixteen.try_into().expect("16 bytes")),
        None => {
            let mut bytes = [0u8; PACKED_BYTES];
            bytes[..len].copy_from_slice(&values[start..end]);
            u128::from_le_bytes(bytes)
        }
    };
    raw & ((1u128 << (8 * len)) - 1)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array, StringArray};

    use super::*;

    fn batch(columns: Vec<Vec<Option<&str>>>) -> RecordBatch {
        let arrays = columns
            .into_iter()
            .enumerate()
            .map(|(i, c)| (format!("k{i}"), Arc::new(StringArray::from(c)) as ArrayRef));
        RecordBatch::try_from_iter(arrays).unwrap()
    }

    #[test]
    fn rows_pack_equal_exactly_when_their_keys_are() {
        let b = batch(vec![
            vec![Some("a"), Some("ab"), Some("a"), None, Some(""), Some("a")],
            vec![Some("bc"), Some("c"), Some("bc"), Some(""), None, Some("b")],
        ]);
        let packed = packed_keys(&b, &[0, 1]).unwrap();
        // Rows 0 and 2 share their keys; no other two rows do ("a" + "bc"
        // is not "ab" + "c", a null is not an empty string).
        for i in 0..packed.len() {
            for j in 0..packed.len() {
                let same = (0..2).all(|c| {
                    let col = b.column(c).as_string::<i32>();
                    (col.is_null(i), col.value(i)) == (col.is_null(j), col.value(j))
                });
                assert_eq!(packed[i] == packed[j], same, "rows {i} and {j}");
            }
        }
    }

    #[test]
    fn keys_too_long_or_not_strings_are_not_packed() {
        let long = batch(vec![vec![Some("0123456789abcde")]]);
        assert!(packed_keys(&long, &[0]).is_some(), "15 bytes and a length");
        let longer = batch(vec![vec![Some("0123456789abcdef")]]);
        assert!(packed_keys(&longer, &[0]).is_none());
        let pair = batch(vec![vec![Some("0123456")], vec![Some("01234567")]]);
        assert!(packed_keys(&pair, &[0, 1]).is_none(), "17 bytes in all");
        let ints =
            RecordBatch::try_from_iter([("i", Arc::new(Int64Array::from(vec![1])) as ArrayRef)])
                .unwrap();
        assert!(packed_keys(&ints, &[0]).is_none());
    }

    #[test]
    fn a_sliced_column_is_judged_by_its_own_values() {
        let b = batch(vec![vec![Some("0123456789abcdefgh"), Some("x"), Some("y")]]).slice(1, 2);
        let packed = packed_keys(&b, &[0]).unwrap();
        let fresh = packed_keys(&batch(vec![vec![Some("x"), Some("y")]]), &[0]).unwrap();
        assert_eq!(packed, fresh);
    }

    #[test]
    fn bytes_after_a_short_value_do_not_count() {
        // Each short value is read 16 bytes at once, its neighbours' bytes
        // with it: equal keys followed by other bytes pack equal. The long
        // values are sliced off, so the keys are short.
        let long_b = "b".repeat(40);
        let long_c = "c".repeat(40);
        let column = vec![
            Some("a"),
            Some(long_b.as_str()),
            Some("a"),
            Some(long_c.as_str()),
            Some("a"),
        ];
        let values = StringArray::from(column);
        let alone = packed_keys(&batch(vec![vec![Some("a")]]), &[0]).unwrap()[0];
        // Rows 0 and 2 have 16 bytes behind their start, row 4 does not.
        for at in [0, 2, 4] {
            let one =
                RecordBatch::try_from_iter([("k", Arc::new(values.slice(at, 1)) as ArrayRef)])
                    .unwrap();
            assert_eq!(packed_keys(&one, &[0]).unwrap(), vec![alone], "row {at}");
        }
    }

    #[test]
    fn a_null_is_not_an_empty_string_in_one_key() {
        let b = batch(vec![vec![Some(""), None, Some(""), None]]);
        let packed = packed_keys(&b, &[0]).unwrap();
        assert_eq!(packed[0], packed[2]);
        assert_eq!(packed[1], packed[3]);
        assert_ne!(packed[0], packed[1]);
    }

    #[test]
    fn a_null_slot_with_bytes_behind_it_packs_as_null() {
        use arrow_buffer::{NullBuffer, OffsetBuffer};
        // Row 1 is null but its offsets span "zz".
        let offsets = OffsetBuffer::new(vec![0, 1, 3, 4].into());
        let values = arrow_buffer::Buffer::from(b"azza".as_slice());
        let nulls = NullBuffer::from(vec![true, false, true]);
        let column = StringArray::new(offsets, values, Some(nulls));
        let b = RecordBatch::try_from_iter([("k", Arc::new(column) as ArrayRef)]).unwrap();
        let with_null = batch(vec![vec![Some("a"), None, Some("a")]]);
        assert_eq!(
            packed_keys(&b, &[0]).unwrap(),
            packed_keys(&with_null, &[0]).unwrap()
        );
    }
}
