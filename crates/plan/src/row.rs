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
use arrow_array::{Array, ArrayRef, RecordBatch};
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
        columns.push(build_column(name, &data_type, values)?);
        fields.push(Field::new(name.to_string(), data_type, true));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| e.to_string())
}

fn build_column<'a>(
    name: &str,
    data_type: &DataType,
    values: impl Iterator<Item = Result<&'a Value, String>>,
) -> Result<ArrayRef, String> {
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
        DataType::Utf8 => build!(StringBuilder::new(), Value::Str(x) => x),
        DataType::Binary => build!(BinaryBuilder::new(), Value::Bytes(x) => x),
        _ => unreachable!("Value::data_type yields only the types above"),
    })
}
