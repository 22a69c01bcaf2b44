//! Cutting large binary values (files read by `read_binary_files`) into
//! pieces without copying them: each piece is a slice of the input's value
//! buffer.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BinaryArray, Int64Array, RecordBatch, UInt32Array};
use arrow_buffer::{OffsetBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};

/// Bytes of pieces one output batch holds at most (one piece at least).
const BATCH_BYTES: usize = 4 << 20;

/// An operator for [`Dataset::flat_map_batches`](crate::Dataset::flat_map_batches)
/// that cuts each value of the binary column `column` into pieces of at
/// most `piece_bytes` bytes, in order, without copying them. Each output
/// row is one piece: the input row's other columns, `offset` (the piece's
/// first byte in its value, Int64), and `column` holding the piece. Each
/// output batch holds pieces of one value, about 4 MiB of them at most, so
/// a large file streams out as it is cut. A null or empty value has no
/// pieces. A column that is missing or not binary, or an input that
/// already has a column `offset`, is an error naming it.
///
/// ```
/// use std::sync::Arc;
/// use streambatch::arrow::array::{ArrayRef, BinaryArray, RecordBatch};
/// use streambatch::ops::chunk_binary;
/// use streambatch::prelude::*;
///
/// let data: ArrayRef = Arc::new(BinaryArray::from_vec(vec![&[7u8; 10][..]]));
/// let batch = RecordBatch::try_from_iter([("bytes", data)]).unwrap();
/// let ctx = Context::local().unwrap();
/// let pieces = ctx
///     .from_batches(vec![batch])
///     .flat_map_batches(chunk_binary("bytes", 4), Resources::cpu(1.0))
///     .count()
///     .unwrap();
/// assert_eq!(pieces, 3); // 4 + 4 + 2 bytes
/// ```
pub fn chunk_binary(
    column: &str,
    piece_bytes: usize,
) -> impl Fn(RecordBatch) -> BinaryPieces + Send + Sync + 'static {
    let column = column.to_string();
    let piece = piece_bytes.max(1);
    move |batch| BinaryPieces::new(batch, &column, piece, BATCH_BYTES)
}

/// The pieces of one batch's binary values (see [`chunk_binary`]).
pub struct BinaryPieces {
    batch: RecordBatch,
    schema: SchemaRef,
    /// The binary column's place in the input; `Err` when it has none.
    column: Result<usize, String>,
    piece: usize,
    /// Pieces in one output batch at most.
    per_batch: usize,
    row: usize,
    /// Where in the row's value the next piece starts.
    offset: usize,
}

impl BinaryPieces {
    fn new(batch: RecordBatch, name: &str, piece: usize, batch_bytes: usize) -> Self {
        let input = batch.schema();
        let column = match input.index_of(name) {
            _ if input.index_of("offset").is_ok() => Err(
                "chunk_binary: the input has a column `offset` already, which its output adds"
                    .to_string(),
            ),
            Ok(i) if input.field(i).data_type() == &DataType::Binary => Ok(i),
            Ok(i) => Err(format!(
                "chunk_binary: column `{name}` is {}, not Binary",
                input.field(i).data_type()
            )),
            Err(_) => Err(format!("chunk_binary: no column `{name}`")),
        };
        let mut fields: Vec<Field> = input
            .fields()
            .iter()
            .filter(|f| f.name() != name)
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new("offset", DataType::Int64, false));
        fields.push(Field::new(name, DataType::Binary, false));
        Self {
            batch,
            schema: Arc::new(Schema::new(fields)),
            column,
            piece,
            per_batch: (batch_bytes / piece).max(1),
            row: 0,
            offset: 0,
        }
    }

    /// The next batch of pieces of row `self.row`, from `self.offset`.
    fn cut(&mut self, column: usize) -> Result<RecordBatch, ArrowError> {
        let values = self.batch.column(column).as_binary::<i32>();
        let (start, len) = (
            values.value_offsets()[self.row] as usize,
            values.value_length(self.row) as usize,
        );
        let per_batch = self.per_batch;
        let mut offsets = vec![0i32];
        let mut firsts = Vec::new();
        let from = self.offset;
        while self.offset < len && firsts.len() < per_batch {
            let size = self.piece.min(len - self.offset);
            firsts.push(self.offset as i64);
            offsets.push(offsets[offsets.len() - 1] + size as i32);
            self.offset += size;
        }
        let bytes = self.offset - from;
        let pieces = BinaryArray::new(
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            values.values().slice_with_length(start + from, bytes),
            None,
        );
        let rows = UInt32Array::from(vec![self.row as u32; firsts.len()]);
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        for (i, other) in self.batch.columns().iter().enumerate() {
            if i != column {
                columns.push(arrow_select::take::take(other, &rows, None)?);
            }
        }
        columns.push(Arc::new(Int64Array::from(firsts)) as ArrayRef);
        columns.push(Arc::new(pieces) as ArrayRef);
        RecordBatch::try_new(self.schema.clone(), columns)
    }
}

impl Iterator for BinaryPieces {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        let column = match &mut self.column {
            Ok(column) => *column,
            // The error is told once.
            Err(message) if message.is_empty() => return None,
            Err(message) => {
                let message = std::mem::take(message);
                return Some(Err(ArrowError::InvalidArgumentError(message)));
            }
        };
        while self.row < self.batch.num_rows() {
            let values = self.batch.column(column).as_binary::<i32>();
            if values.is_null(self.row) || self.offset >= values.value_length(self.row) as usize {
                (self.row, self.offset) = (self.row + 1, 0);
                continue;
            }
            return Some(self.cut(column));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::types::Int64Type;

    use super::*;

    #[test]
    fn pieces_are_slices_of_the_input_in_order() {
        let big: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let data = BinaryArray::from_vec(vec![&big[..], &[][..], &[1, 2, 3][..]]);
        let ids: ArrayRef = Arc::new(Int64Array::from(vec![10, 11, 12]));
        let input =
            RecordBatch::try_from_iter([("id", ids), ("bytes", Arc::new(data) as ArrayRef)])
                .unwrap();
        let buffer = input.column(1).as_binary::<i32>().values().clone();
        let range = buffer.as_ptr() as usize..buffer.as_ptr() as usize + buffer.len();

        // Two pieces a batch: the first value (three pieces) comes out in
        // two batches, the empty one in none, the last in one.
        let out: Vec<RecordBatch> = BinaryPieces::new(input, "bytes", 4096, 8192)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            out.iter().map(|b| b.num_rows()).collect::<Vec<_>>(),
            [2, 1, 1]
        );
        let mut joined: Vec<(i64, Vec<u8>)> = Vec::new();
        for batch in &out {
            assert_eq!(batch.schema().field(1).name(), "offset");
            let ids = batch.column(0).as_primitive::<Int64Type>();
            let offsets = batch.column(1).as_primitive::<Int64Type>();
            let pieces = batch.column(2).as_binary::<i32>();
            let at = pieces.values().as_ptr() as usize;
            assert!(range.contains(&at), "a piece was copied");
            for ((id, offset), piece) in ids.values().iter().zip(offsets.values()).zip(pieces) {
                let piece = piece.unwrap();
                assert!(piece.len() <= 4096);
                match joined.last_mut() {
                    Some((last, bytes)) if last == id => {
                        assert_eq!(*offset as usize, bytes.len(), "row {id}");
                        bytes.extend_from_slice(piece);
                    }
                    _ => {
                        assert_eq!(*offset, 0, "row {id}");
                        joined.push((*id, piece.to_vec()));
                    }
                }
            }
        }
        assert_eq!(joined, vec![(10, big), (12, vec![1, 2, 3])]);
    }

    #[test]
    fn a_missing_or_wrong_column_is_named() {
        let ids: ArrayRef = Arc::new(Int64Array::from(vec![1]));
        let input = RecordBatch::try_from_iter([("id", ids)]).unwrap();
        let first_error = |input: &RecordBatch, name: &str| {
            let mut pieces = BinaryPieces::new(input.clone(), name, 8, 64);
            let err = pieces.next().unwrap().unwrap_err().to_string();
            assert!(pieces.next().is_none(), "told once");
            err
        };
        assert!(first_error(&input, "bytes").contains("no column `bytes`"));
        assert!(first_error(&input, "id").contains("`id` is Int64"));
        let offset: ArrayRef = Arc::new(Int64Array::from(vec![0]));
        let data: ArrayRef = Arc::new(BinaryArray::from_vec(vec![&b"x"[..]]));
        let clash = RecordBatch::try_from_iter([("offset", offset), ("bytes", data)]).unwrap();
        assert!(first_error(&clash, "bytes").contains("column `offset` already"));
    }
}
