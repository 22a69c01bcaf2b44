//! ONNX models as streambatch operators.
//!
//! A user brings the model they trained as an ONNX file; [`OnnxModel`]
//! reads it (its declared inputs, outputs and opset: [`ModelInfo`],
//! readable before a job runs) and is a stateful `map_batches` operator:
//! each worker of its pool loads one session and keeps it warm, computing
//! on as many threads as its stage holds CPU slots. Arrow columns become
//! tensors and tensors columns by name ([`tensor`]).
//!
//! The engine ([`Engine`]) is ONNX Runtime where its library is found
//! (loaded at run time), else rten, the pure-Rust one built in, so that a
//! model runs with nothing beyond cargo; the stage's metrics say which ran.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{ArrayRef, FixedSizeListArray, Float32Array, RecordBatch};
//! use arrow_schema::{DataType, Field};
//! use streambatch_onnx::{Dim, ElemType, ModelBuilder, OnnxModel};
//!
//! // y = x W for a 2 x 3 matrix W of ones.
//! let mut m = ModelBuilder::new(17);
//! m.input("x", ElemType::F32, &[Dim::Dynamic(None), Dim::Fixed(2)]);
//! let w = m.weight("w", &[2, 3], vec![1.0; 6]);
//! m.node("MatMul", &["x", &w], &["y"], vec![]);
//! m.output("y", ElemType::F32, &[Dim::Dynamic(None), Dim::Fixed(3)]);
//! let dir = tempfile::tempdir().unwrap();
//! let file = dir.path().join("sum.onnx");
//! std::fs::write(&file, m.to_bytes()).unwrap();
//!
//! let item = Arc::new(Field::new("item", DataType::Float32, false));
//! let x = FixedSizeListArray::try_new(item, 2, Arc::new(Float32Array::from(vec![1.0, 2.0])), None).unwrap();
//! let batch = RecordBatch::try_from_iter([("x", Arc::new(x) as ArrayRef)]).unwrap();
//! let mut session = OnnxModel::open(&file).unwrap().session(1).unwrap();
//! let out = session.run(&batch).unwrap();
//! assert_eq!(out.schema().field(0).name(), "y");
//! ```

mod engine;
mod error;
mod info;
mod make;
mod op;
mod proto;
mod resnet;
pub mod tensor;

pub use engine::{Engine, Placement};
pub use error::{OnnxError, Result};
pub use info::{Dim, ElemType, ModelInfo, TensorInfo, sha256_hex};
pub use make::{Attr, CONVNET_DIM, ModelBuilder, convnet};
pub use op::{OnnxFn, OnnxModel, OnnxSpec, RECIPE};
pub use resnet::{RESNET_CLASSES, RESNET_SIDE, resnet50};
