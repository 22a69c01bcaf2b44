//! Rows for the row-wise API (`map`, `flat_map`, closure filters,
//! `iter_rows`). Rows are converted from and to Arrow batches at the edges of
//! a row operator; batch operators never see them.

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Float64Builder, Int64Builder, StringBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, BinaryArray, RecordBatch};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Schema};

/// One value of a row.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// No value.
    Null,
    /// A boolean.
    Bool(bool),
    /// Any integer column, widened.
    Int(i64),
    /// Any float column, widened.
    Float(f64),
    /// A string.
    Str(String),
    /// Bytes.
    Bytes(Vec<u8>),
}

impl Value {
    fn data_type(&self) -> Option<DataType> {
        Some(match self {
            Value::Null => return None,
            Value::Bool(_) => DataType::Boolean,
            Value::Int(_) => DataType::Int64,
            Value::Float(_) => DataType::Float64,
            Value::Str(_) => DataType::Utf8,
            Value::Bytes(_) => DataType::Binary,
        })
    }
}

macro_rules! value_from {
    ($($t:ty => $v:ident as $w:ty),*) => {$(
        impl From<$t> for Value {
            fn from(x: $t) -> Self { Value::$v(x as $w) }
        }
    )*};
}
value_from!(i64 => Int as i64, i32 => Int as i64, u32 => Int as i64, u8 => Int as i64, usize => Int as i64,
            f64 => Float as f64, f32 => Float as f64);

impl From<bool> for Value {
    fn from(x: bool) -> Self {
        Value::Bool(x)
    }
}
impl From<&str> for Value {
    fn from(x: &str) -> Self {
        Value::Str(x.to_string())
    }
}
impl From<String> for Value {
    fn from(x: String) -> Self {
        Value::Str(x)
    }
}
impl From<Vec<u8>> for Value {
    fn from(x: Vec<u8>) -> Self {
        Value::Bytes(x)
    }
}

/// A row: named values in column order.
///
/// ```
/// use streambatch_plan::{Row, Value};
/// let row = Row::new().with("id", 7i64).with("name", "seven");
/// assert_eq!(row.get("id"), Some(&Value::Int(7)));
/// assert_eq!(row.int("id"), Some(7));
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    names: Vec<Arc<str>>,
    values: Vec<Value>,
}

impl Row {
    /// An empty row.
    pub fn new() -> Self {
        Self::default()
    }

    /// This row with `name` set to `value` (replaced if present).
    pub fn with(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.set(name, value);
        self
    }

    /// Sets `name` to `value`, appending the column if it is new.
    pub fn set(&mut self, name: &str, value: impl Into<Value>) {
        let value = value.into();
        match self.names.iter().position(|n| &**n == name) {
            Some(i) => self.values[i] = value,
            None => {
                self.names.push(name.into());
                self.values.push(value);
            }
        }
    }

    /// The value of column `name`.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.names
            .iter()
            .position(|n| &**n == name)
            .map(|i| &self.values[i])
    }

    /// The value of an integer column.
    pub fn int(&self, name: &str) -> Option<i64> {
        match self.get(name)? {
            Value::Int(v) => Some(*v),
            _ => None,
        }
    }

    /// The value of a float (or integer) column, as f64.
    pub fn float(&self, name: &str) -> Option<f64> {
        match self.get(name)? {
            Value::Float(v) => Some(*v),
            Value::Int(v) => Some(*v as f64),
            _ => None,
        }
    }

    /// The value of a string column.
    pub fn str(&self, name: &str) -> Option<&str> {
        match self.get(name)? {
            Value::Str(v) => Some(v),
            _ => None,
        }
    }

    /// The value of a binary column.
    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        match self.get(name)? {
            Value::Bytes(v) => Some(v),
            _ => None,
        }
    }

    /// Column names in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(|n| &**n)
    }

    /// Values in column order.
    pub fn values(&self) -> &[Value] {
        &self.values
    }
}

/// Splits a batch into rows. Fails on column types the row API cannot hold.
pub fn batch_to_rows(batch: &RecordBatch) -> Result<Vec<Row>, String> {
    let schema = batch.schema();
    let names: Vec<Arc<str>> = schema
        .fields()
        .iter()
        .map(|f| Arc::from(f.name().as_str()))
        .collect();
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| column_values(c, f))
        .collect::<Result<Vec<_>, _>>()?;
    // Each value moves into its row: no value is copied twice.
    let mut columns: Vec<_> = columns.into_iter().map(Vec::into_iter).collect();
    Ok((0..batch.num_rows())
        .map(|_| Row {
            names: names.clone(),
            values: columns
                .iter_mut()
                .map(|c| c.next().expect("a value per row"))
                .collect(),
        })
        .collect())
}

/// Splits a batch it owns into rows, like [`batch_to_rows`]; a batch of
/// one row (a file `read_binary_files` read whole) gives its binary values
/// their buffers without a copy, when nothing else holds them.
pub fn batch_into_rows(batch: RecordBatch) -> Result<Vec<Row>, String> {
    if batch.num_rows() != 1 {
        return batch_to_rows(&batch);
    }
    let schema = batch.schema();
    let columns = batch.columns().to_vec();
    drop(batch);
    let mut row = Row::default();
    for (column, field) in columns.into_iter().zip(schema.fields()) {
        let value = match column.data_type() {
            DataType::Binary if column.null_count() == 0 => Value::Bytes(only_bytes(column)),
            _ => column_values(&column, field)?
                .pop()
                .expect("a value per row"),
        };
        row.names.push(Arc::from(field.name().as_str()));
        row.values.push(value);
    }
    Ok(vec![row])
}

/// The one value of a binary array of one row: its buffer itself when the
/// value is the whole buffer and nothing else holds it, else a copy.
fn only_bytes(column: ArrayRef) -> Vec<u8> {
    let data = column.to_data();
    drop(column);
    let (offsets, values, _) = BinaryArray::from(data).into_parts();
    let (start, end) = (offsets[0] as usize, offsets[1] as usize);
    drop(offsets);
    if start == 0 && end == values.len() {
        match values.into_vec::<u8>() {
            Ok(bytes) => bytes,
            Err(values) => values.as_slice().to_vec(),
        }
    } else {
        values.as_slice()[start..end].to_vec()
    }
}

fn column_values(array: &ArrayRef, field: &Field) -> Result<Vec<Value>, String> {
    macro_rules! prim {
        ($t:ty, $v:ident, $w:ty) => {
            array
                .as_primitive::<$t>()
                .iter()
                .map(|x| x.map_or(Value::Null, |x| Value::$v(x as $w)))
                .collect()
        };
    }
    Ok(match array.data_type() {
        DataType::Boolean => array
            .as_boolean()
            .iter()
            .map(|x| x.map_or(Value::Null, Value::Bool))
            .collect(),
        DataType::Int8 => prim!(Int8Type, Int, i64),
        DataType::Int16 => prim!(Int16Type, Int, i64),
        DataType::Int32 => prim!(Int32Type, Int, i64),
        DataType::Int64 => prim!(Int64Type, Int, i64),
        DataType::UInt8 => prim!(UInt8Type, Int, i64),
        DataType::UInt16 => prim!(UInt16Type, Int, i64),
        DataType::UInt32 => prim!(UInt32Type, Int, i64),
        DataType::UInt64 => prim!(UInt64Type, Int, i64),
        DataType::Float32 => prim!(Float32Type, Float, f64),
        DataType::Float64 => prim!(Float64Type, Float, f64),
        DataType::Utf8 => array
            .as_string::<i32>()
            .iter()
            .map(|x| x.map_or(Value::Null, |s| Value::Str(s.into())))
            .collect(),
        DataType::LargeUtf8 => array
            .as_string::<i64>()
            .iter()
            .map(|x| x.map_or(Value::Null, |s| Value::Str(s.into())))
            .collect(),
        DataType::Binary => array
            .as_binary::<i32>()
            .iter()
            .map(|x| x.map_or(Value::Null, |b| Value::Bytes(b.to_vec())))
            .collect(),
        DataType::LargeBinary => array
            .as_binary::<i64>()
            .iter()
            .map(|x| x.map_or(Value::Null, |b| Value::Bytes(b.to_vec())))
            .collect(),
        other => {
            return Err(format!(
                "column `{}` of type {other} is not supported by the row API; use map_batches",
                field.name()
            ));
        }
    })
}

/// Builds a batch from rows. Every row must have the same columns; a column's
/// type is taken from its first non-null value (all-null columns become Int64).
pub fn rows_to_batch(rows: &[Row]) -> Result<RecordBatch, String> {
    let Some(first) = rows.first() else {
        return Ok(RecordBatch::new_empty(Arc::new(Schema::empty())));
    };
    let mut fields = Vec::with_capacity(first.names.len());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(first.names.len());
    for (i, name) in first.names.iter().enumerate() {
        let data_type = rows
            .iter()
            .find_map(|r| r.values.get(i).and_then(Value::data_type))
            .unwrap_or(DataType::Int64);
        let values = rows.iter().enumerate().map(|(n, r)| {
            if r.names.get(i) != Some(name) {
                return Err(format!("row {n} does not have column `{name}` at position {i}; every row of a batch needs the same columns"));
            }
            Ok(&r.values[i])
        });
        let bytes = value_bytes(rows, i);
        columns.push(build_column(name, &data_type, values, bytes)?);
        fields.push(Field::new(name.to_string(), data_type, true));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| e.to_string())
}

/// Builds a batch from rows it owns, like [`rows_to_batch`]; one row's
/// binary values become the batch's buffers without a copy.
pub fn rows_into_batch(mut rows: Vec<Row>) -> Result<RecordBatch, String> {
    if rows.len() != 1 {
        return rows_to_batch(&rows);
    }
    let Row { names, values } = rows.pop().expect("one row");
    let mut fields = Vec::with_capacity(names.len());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(names.len());
    for (name, value) in names.iter().zip(values) {
        let column: ArrayRef = match value {
            Value::Bytes(bytes) => {
                let end = i32::try_from(bytes.len())
                    .map_err(|_| format!("column `{name}`: a value of over 2 GiB"))?;
                let offsets = OffsetBuffer::new(ScalarBuffer::from(vec![0, end]));
                Arc::new(BinaryArray::new(offsets, Buffer::from_vec(bytes), None))
            }
            value => {
                let data_type = value.data_type().unwrap_or(DataType::Int64);
                build_column(name, &data_type, std::iter::once(Ok(&value)), 0)?
            }
        };
        fields.push(Field::new(
            name.to_string(),
            column.data_type().clone(),
            true,
        ));
        columns.push(column);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| e.to_string())
}

/// Bytes of the strings or bytes in column `i` of `rows`, to size a
/// builder once.
fn value_bytes(rows: &[Row], i: usize) -> usize {
    rows.iter()
        .map(|r| match r.values.get(i) {
            Some(Value::Str(s)) => s.len(),
            Some(Value::Bytes(b)) => b.len(),
            _ => 0,
        })
        .sum()
}

fn build_column<'a>(
    name: &str,
    data_type: &DataType,
    values: impl Iterator<Item = Result<&'a Value, String>>,
    value_bytes: usize,
) -> Result<ArrayRef, String> {
    let rows = values.size_hint().0;
    let mismatch = |v: &Value| format!("column `{name}` mixes {data_type} with {v:?}");
    macro_rules! build {
        ($builder:expr, $($pat:pat => $val:expr),*) => {{
            let mut b = $builder;
            for v in values {
                match v? {
                    Value::Null => b.append_null(),
                    $($pat => b.append_value($val),)*
                    other => return Err(mismatch(other)),
                }
            }
            Arc::new(b.finish()) as ArrayRef
        }};
    }
    Ok(match data_type {
        DataType::Boolean => build!(BooleanBuilder::new(), Value::Bool(x) => *x),
        DataType::Int64 => build!(Int64Builder::new(), Value::Int(x) => *x),
        DataType::Float64 => {
            build!(Float64Builder::new(), Value::Float(x) => *x, Value::Int(x) => *x as f64)
        }
        DataType::Utf8 => build!(
            StringBuilder::with_capacity(rows, value_bytes),
            Value::Str(x) => x
        ),
        DataType::Binary => build!(
            BinaryBuilder::with_capacity(rows, value_bytes),
            Value::Bytes(x) => x
        ),
        _ => unreachable!("Value::data_type yields only the types above"),
    })
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::{Int64Array, StringArray};

    use super::*;

    fn file_batch(bytes: Vec<u8>) -> RecordBatch {
        let end = bytes.len() as i32;
        let offsets = OffsetBuffer::new(ScalarBuffer::from(vec![0, end]));
        let data: ArrayRef = Arc::new(BinaryArray::new(offsets, Buffer::from_vec(bytes), None));
        let paths: ArrayRef = Arc::new(StringArray::from(vec!["a.bin"]));
        RecordBatch::try_from_iter([("path", paths), ("bytes", data)]).unwrap()
    }

    #[test]
    fn a_file_row_moves_its_bytes_into_the_row_and_back_without_a_copy() {
        let bytes: Vec<u8> = (0..100_000).map(|i| (i % 251) as u8).collect();
        let (at, expected) = (bytes.as_ptr(), bytes.clone());
        let rows = batch_into_rows(file_batch(bytes)).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].str("path"), Some("a.bin"));
        let moved = rows[0].bytes("bytes").unwrap();
        assert_eq!(moved, &expected[..]);
        assert_eq!(moved.as_ptr(), at, "the file's buffer itself");

        let batch = rows_into_batch(rows).unwrap();
        let back = batch.column_by_name("bytes").unwrap().as_binary::<i32>();
        assert_eq!(back.value(0), &expected[..]);
        assert_eq!(back.value(0).as_ptr(), at, "the row's buffer itself");
        assert_eq!(
            batch
                .column_by_name("path")
                .unwrap()
                .as_string::<i32>()
                .value(0),
            "a.bin"
        );
    }

    #[test]
    fn a_shared_or_sliced_buffer_is_copied_not_taken() {
        let batch = file_batch(vec![1, 2, 3, 4]);
        let kept = batch.clone();
        let rows = batch_into_rows(batch).unwrap();
        assert_eq!(rows[0].bytes("bytes"), Some(&[1u8, 2, 3, 4][..]));
        let still = kept.column(1).as_binary::<i32>();
        assert_eq!(
            still.value(0),
            [1, 2, 3, 4],
            "the other holder's bytes stay"
        );

        let two = RecordBatch::try_from_iter([(
            "bytes",
            Arc::new(BinaryArray::from(vec![&[1u8, 2][..], &[3u8][..]])) as ArrayRef,
        )])
        .unwrap();
        let rows = batch_into_rows(two.slice(1, 1)).unwrap();
        assert_eq!(rows[0].bytes("bytes"), Some(&[3u8][..]));
    }

    #[test]
    fn rows_into_batch_keeps_the_types_of_rows_to_batch() {
        let row = Row::new()
            .with("n", 3i64)
            .with("x", 0.5)
            .with("s", "x")
            .with("b", vec![9u8])
            .with("none", Value::Null);
        let one = rows_into_batch(vec![row.clone()]).unwrap();
        assert_eq!(one, rows_to_batch(std::slice::from_ref(&row)).unwrap());
        assert_eq!(
            one.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .value(0),
            3
        );
        let many = rows_into_batch(vec![row.clone(), row]).unwrap();
        assert_eq!(many.num_rows(), 2);
    }
}
