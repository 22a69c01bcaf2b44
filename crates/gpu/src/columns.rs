//! Arrow columns to and from the bytes of GPU storage arrays.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, FixedSizeListArray, Float32Array, Int32Array, UInt32Array};
use arrow_buffer::ScalarBuffer;
use arrow_schema::{DataType, Field};

use crate::spec::Element;

/// The bytes of a kernel input column: its values, no copy.
pub(crate) fn column_bytes(column: &ArrayRef, element: Element) -> Result<&[u8], String> {
    let values: &ArrayRef = match column.data_type() {
        DataType::FixedSizeList(_, _) => column.as_fixed_size_list().values(),
        _ => column,
    };
    let offset_items = match column.data_type() {
        DataType::FixedSizeList(_, width) => column.offset() * *width as usize,
        _ => 0,
    };
    let items = match column.data_type() {
        DataType::FixedSizeList(_, width) => column.len() * *width as usize,
        _ => column.len(),
    };
    let bytes: &[u8] = match (values.data_type(), element) {
        (DataType::Float32, Element::F32) => bytemuck::cast_slice(
            values
                .as_primitive::<arrow_array::types::Float32Type>()
                .values(),
        ),
        (DataType::Int32, Element::I32) => bytemuck::cast_slice(
            values
                .as_primitive::<arrow_array::types::Int32Type>()
                .values(),
        ),
        (DataType::UInt32, Element::U32) => bytemuck::cast_slice(
            values
                .as_primitive::<arrow_array::types::UInt32Type>()
                .values(),
        ),
        (found, _) => return Err(format!("has type {found}, the kernel reads {element:?}")),
    };
    Ok(&bytes[offset_items * 4..(offset_items + items) * 4])
}

/// An output column from the bytes the device wrote: a primitive array, or
/// a fixed-size list when `width` is over 1.
pub(crate) fn output_array(bytes: &[u8], element: Element, width: usize) -> ArrayRef {
    let values: ArrayRef = match element {
        Element::F32 => Arc::new(Float32Array::new(
            ScalarBuffer::from(bytemuck::pod_collect_to_vec::<u8, f32>(bytes)),
            None,
        )),
        Element::I32 => Arc::new(Int32Array::new(
            ScalarBuffer::from(bytemuck::pod_collect_to_vec::<u8, i32>(bytes)),
            None,
        )),
        Element::U32 => Arc::new(UInt32Array::new(
            ScalarBuffer::from(bytemuck::pod_collect_to_vec::<u8, u32>(bytes)),
            None,
        )),
    };
    if width == 1 {
        return values;
    }
    let field = Arc::new(Field::new("item", values.data_type().clone(), false));
    Arc::new(FixedSizeListArray::new(field, width as i32, values, None))
}
