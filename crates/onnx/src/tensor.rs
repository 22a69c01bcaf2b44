//! Arrow columns to tensors and back.
//!
//! A column of `n` rows becomes a tensor whose first dimension is `n`: a
//! primitive column a tensor `[n]` (or `[n, 1]` where the model says so),
//! a `FixedSizeList` column of width `w` (lists nested in lists flattened)
//! a tensor `[n, d1, ...]` with `d1 * ... = w`, as the model declares the
//! dimensions; one dynamic dimension besides the batch (a sequence) is
//! whatever `w` leaves. The values are Arrow's own buffers, not copies.
//! Outputs come back the same way: `[n]` as a primitive column, `[n, d1,
//! ...]` as a `FixedSizeList` of width `d1 * ...`.

use std::sync::Arc;

use arrow_array::types::{Float16Type, Float32Type, Int32Type, Int64Type, UInt8Type};
use arrow_array::{Array, ArrayRef, FixedSizeListArray, PrimitiveArray};
use arrow_buffer::ScalarBuffer;
use arrow_schema::{DataType, Field};
use half::f16;

use crate::info::{Dim, ElemType, TensorInfo};

/// A tensor's values, of one of the [`ElemType`]s.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// `f32` values.
    F32(ScalarBuffer<f32>),
    /// `f16` values.
    F16(ScalarBuffer<f16>),
    /// `i64` values.
    I64(ScalarBuffer<i64>),
    /// `i32` values.
    I32(ScalarBuffer<i32>),
    /// `u8` values.
    U8(ScalarBuffer<u8>),
}

impl Data {
    /// The element type.
    pub fn elem(&self) -> ElemType {
        match self {
            Self::F32(_) => ElemType::F32,
            Self::F16(_) => ElemType::F16,
            Self::I64(_) => ElemType::I64,
            Self::I32(_) => ElemType::I32,
            Self::U8(_) => ElemType::U8,
        }
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::F16(v) => v.len(),
            Self::I64(v) => v.len(),
            Self::I32(v) => v.len(),
            Self::U8(v) => v.len(),
        }
    }

    /// True when there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as `to`, where an engine computes in another type than
    /// the model declares (rten: `i64` as `i32`, `f16` as `f32`); `None`
    /// when a value does not fit `to`.
    pub fn cast(self, to: ElemType) -> Option<Self> {
        if self.elem() == to {
            return Some(self);
        }
        Some(match (self, to) {
            (Self::I32(v), ElemType::I64) => Self::I64(v.iter().map(|&x| x as i64).collect()),
            (Self::I64(v), ElemType::I32) => Self::I32(
                v.iter()
                    .map(|&x| i32::try_from(x).ok())
                    .collect::<Option<Vec<_>>>()?
                    .into(),
            ),
            (Self::F32(v), ElemType::F16) => {
                Self::F16(v.iter().map(|&x| f16::from_f32(x)).collect())
            }
            (Self::F16(v), ElemType::F32) => Self::F32(v.iter().map(|x| x.to_f32()).collect()),
            _ => return None,
        })
    }
}

/// A tensor: a shape and its values in row-major order.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Its dimensions, the batch's first.
    pub shape: Vec<usize>,
    /// Its values.
    pub data: Data,
}

impl Tensor {
    /// A tensor of `shape` over `data`; `None` when their sizes differ.
    pub fn new(shape: Vec<usize>, data: Data) -> Option<Self> {
        (shape.iter().product::<usize>() == data.len()).then_some(Self { shape, data })
    }
}

/// The tensor for model input `input` made of `column` (named `name`);
/// the error says what the model expected and what the column holds.
pub fn from_column(name: &str, column: &ArrayRef, input: &TensorInfo) -> Result<Tensor, String> {
    let rows = column.len();
    let (values, width) = flatten(name, column)?;
    let want = input.elem.arrow();
    if values.data_type() != &want {
        return Err(format!(
            "column `{name}` holds {} values; model input `{}` takes {} ({want})",
            values.data_type(),
            input.name,
            input.elem,
        ));
    }
    if values.null_count() > 0 {
        return Err(format!(
            "column `{name}` has null values; model input `{}` takes none",
            input.name
        ));
    }
    let shape = shape_for(name, rows, width, input)?;
    let data = match input.elem {
        ElemType::F32 => Data::F32(values_of::<Float32Type>(&values)),
        ElemType::F16 => Data::F16(values_of::<Float16Type>(&values)),
        ElemType::I64 => Data::I64(values_of::<Int64Type>(&values)),
        ElemType::I32 => Data::I32(values_of::<Int32Type>(&values)),
        ElemType::U8 => Data::U8(values_of::<UInt8Type>(&values)),
    };
    Ok(Tensor::new(shape, data).expect("the shape is the column's size"))
}

/// The column for model output `output` made of `tensor`, which must have
/// `rows` rows and the shape and type the model declares for it.
pub fn to_column(tensor: Tensor, rows: usize, output: &TensorInfo) -> Result<ArrayRef, String> {
    let shape_text = format!("{:?}", tensor.shape);
    let declared = output.to_string();
    let wrong = |why: &str| format!("model output {declared} came back as {shape_text}: {why}");
    if tensor.shape.len() != output.shape.len() {
        return Err(wrong("another rank"));
    }
    if tensor.shape[0] != rows {
        return Err(wrong(&format!("{rows} rows went in")));
    }
    for (got, want) in tensor.shape.iter().zip(&output.shape).skip(1) {
        if let Dim::Fixed(want) = want
            && got != want
        {
            return Err(wrong("a fixed dimension differs"));
        }
    }
    let got = tensor.data.elem();
    let data = tensor
        .data
        .cast(output.elem)
        .ok_or_else(|| wrong(&format!("its {got} values are not {}", output.elem)))?;
    let values: ArrayRef = match data {
        Data::F32(v) => Arc::new(PrimitiveArray::<Float32Type>::new(v, None)),
        Data::F16(v) => Arc::new(PrimitiveArray::<Float16Type>::new(v, None)),
        Data::I64(v) => Arc::new(PrimitiveArray::<Int64Type>::new(v, None)),
        Data::I32(v) => Arc::new(PrimitiveArray::<Int32Type>::new(v, None)),
        Data::U8(v) => Arc::new(PrimitiveArray::<UInt8Type>::new(v, None)),
    };
    if tensor.shape.len() == 1 {
        return Ok(values);
    }
    let width: usize = tensor.shape[1..].iter().product();
    let field = Arc::new(Field::new("item", output.elem.arrow(), false));
    let list = FixedSizeListArray::try_new(field, width as i32, values, None)
        .map_err(|e| wrong(&e.to_string()))?;
    Ok(Arc::new(list))
}

/// The Arrow type [`to_column`] gives output `output` (where its shape
/// is fixed past the batch; a dynamic width is known only at run time).
pub fn column_type(output: &TensorInfo) -> Option<DataType> {
    let mut width = 1usize;
    for d in &output.shape[1..] {
        match d {
            Dim::Fixed(n) => width *= n,
            Dim::Dynamic(_) => return None,
        }
    }
    Some(match output.shape.len() {
        1 => output.elem.arrow(),
        _ => DataType::FixedSizeList(
            Arc::new(Field::new("item", output.elem.arrow(), false)),
            width as i32,
        ),
    })
}

/// A column's values as one flat array and how many make a row.
fn flatten(name: &str, column: &ArrayRef) -> Result<(ArrayRef, usize), String> {
    if column.null_count() > 0 {
        return Err(format!("column `{name}` has null rows"));
    }
    match column.data_type() {
        DataType::FixedSizeList(_, _) => {
            let list = column
                .as_any()
                .downcast_ref::<FixedSizeListArray>()
                .expect("the type says so");
            let width = list.value_length() as usize;
            let start = list.value_offset_at(0);
            let values = match list.is_empty() {
                true => list.values().slice(0, 0),
                false => list.values().slice(start, list.len() * width),
            };
            let (inner, inner_width) = flatten(name, &values)?;
            Ok((inner, width * inner_width))
        }
        t if t.is_primitive() => Ok((column.clone(), 1)),
        t => Err(format!(
            "column `{name}` is {t}: a model takes primitive or fixed-size list columns"
        )),
    }
}

/// The tensor shape of `rows` rows of `width` values for `input`.
fn shape_for(
    name: &str,
    rows: usize,
    width: usize,
    input: &TensorInfo,
) -> Result<Vec<usize>, String> {
    let wrong = |why: String| {
        format!("column `{name}` ({width} values a row) does not fit model input {input}: {why}")
    };
    if let Dim::Fixed(batch) = input.shape[0]
        && batch != rows
    {
        return Err(wrong(format!(
            "its batch dimension is fixed at {batch} and the batch has {rows} rows (set batch_rows to {batch})"
        )));
    }
    let rest = &input.shape[1..];
    let fixed: usize = rest
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => *n,
            Dim::Dynamic(_) => 1,
        })
        .product();
    let dynamic = rest.iter().filter(|d| matches!(d, Dim::Dynamic(_))).count();
    let filled = match dynamic {
        0 if width == fixed => 1,
        0 => return Err(wrong(format!("a row takes {fixed} values"))),
        1 if fixed > 0 && width.is_multiple_of(fixed) && width > 0 => width / fixed,
        1 => return Err(wrong(format!("a row takes a multiple of {fixed} values"))),
        _ => {
            return Err(wrong(
                "it has more than one dynamic dimension past the batch".into(),
            ));
        }
    };
    let mut shape = vec![rows];
    shape.extend(rest.iter().map(|d| match d {
        Dim::Fixed(n) => *n,
        Dim::Dynamic(_) => filled,
    }));
    Ok(shape)
}

fn values_of<T: arrow_array::ArrowPrimitiveType>(values: &ArrayRef) -> ScalarBuffer<T::Native> {
    values
        .as_any()
        .downcast_ref::<PrimitiveArray<T>>()
        .expect("the type was checked")
        .values()
        .clone()
}

#[cfg(test)]
mod tests {
    use arrow_array::{Float32Array, Int64Array};

    use super::*;

    fn info(elem: ElemType, shape: Vec<Dim>) -> TensorInfo {
        TensorInfo {
            name: "x".into(),
            elem,
            shape,
        }
    }

    fn list(values: Vec<f32>, width: i32) -> ArrayRef {
        let field = Arc::new(Field::new("item", DataType::Float32, false));
        Arc::new(
            FixedSizeListArray::try_new(field, width, Arc::new(Float32Array::from(values)), None)
                .unwrap(),
        )
    }

    #[test]
    fn a_list_column_fills_the_declared_dims_and_a_dynamic_one() {
        let column = list((0..12).map(|x| x as f32).collect(), 6);
        let fixed = info(
            ElemType::F32,
            vec![Dim::Dynamic(None), Dim::Fixed(2), Dim::Fixed(3)],
        );
        assert_eq!(
            from_column("c", &column, &fixed).unwrap().shape,
            vec![2, 2, 3]
        );
        let seq = info(
            ElemType::F32,
            vec![
                Dim::Dynamic(None),
                Dim::Dynamic(Some("seq".into())),
                Dim::Fixed(2),
            ],
        );
        assert_eq!(
            from_column("c", &column, &seq).unwrap().shape,
            vec![2, 3, 2]
        );
        let wrong = info(ElemType::F32, vec![Dim::Dynamic(None), Dim::Fixed(4)]);
        let e = from_column("c", &column, &wrong).unwrap_err();
        assert!(
            e.contains("column `c`") && e.contains("takes 4 values"),
            "{e}"
        );
    }

    #[test]
    fn a_sliced_column_gives_its_own_rows() {
        let column = list((0..12).map(|x| x as f32).collect(), 3).slice(2, 2);
        let t = from_column(
            "c",
            &column,
            &info(ElemType::F32, vec![Dim::Dynamic(None), Dim::Fixed(3)]),
        )
        .unwrap();
        assert_eq!(
            t.data,
            Data::F32(vec![6.0, 7.0, 8.0, 9.0, 10.0, 11.0].into())
        );
    }

    #[test]
    fn a_column_of_another_type_is_refused_by_name() {
        let column: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
        let e = from_column(
            "ids",
            &column,
            &info(ElemType::F32, vec![Dim::Dynamic(None)]),
        )
        .unwrap_err();
        assert!(
            e.contains("`ids` holds Int64") && e.contains("takes f32"),
            "{e}"
        );
    }

    #[test]
    fn an_output_comes_back_as_declared_or_is_refused() {
        let out = info(ElemType::I64, vec![Dim::Dynamic(None), Dim::Fixed(2)]);
        let t = Tensor::new(vec![2, 2], Data::I32(vec![1, 2, 3, 4].into())).unwrap();
        let column = to_column(t, 2, &out).unwrap();
        assert_eq!(column.data_type(), &column_type(&out).unwrap());
        let t = Tensor::new(vec![2, 3], Data::I64(vec![0; 6].into())).unwrap();
        let e = to_column(t, 2, &out).unwrap_err();
        assert!(e.contains("fixed dimension"), "{e}");
        let t = Tensor::new(vec![2, 2], Data::F32(vec![0.0; 4].into())).unwrap();
        assert!(to_column(t, 2, &out).unwrap_err().contains("not i64"));
    }
}
