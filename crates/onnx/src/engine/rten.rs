//! rten: a model loaded from its bytes, run on a thread pool of its own
//! (the CPU slots its stage asked for, so that it never takes more).
//!
//! rten computes in `f32`, `i32`, `i8` and `u8`: an `i64` input goes in as
//! `i32` (refused where a value does not fit) and an `f16` one as `f32`;
//! outputs are cast back to what the model declares.

use std::path::Path;
use std::sync::Arc;

use rten::{Model, ModelOptions, NodeId, RunOptions, ThreadPool, Value, ValueOrView, ValueView};
use rten_tensor::prelude::*;

use crate::error::{OnnxError, Result};
use crate::info::{ElemType, ModelInfo};
use crate::tensor::{Data, Tensor};

pub(crate) struct RtenSession {
    model: Model,
    inputs: Vec<(NodeId, ElemType)>,
    outputs: Vec<NodeId>,
    pool: Arc<ThreadPool>,
}

impl RtenSession {
    pub(crate) fn load(
        path: &Path,
        bytes: Arc<[u8]>,
        info: &ModelInfo,
        threads: usize,
    ) -> Result<Self> {
        let load_error = |reason: String| OnnxError::Load {
            path: path.to_path_buf(),
            engine: "rten",
            reason,
        };
        let model = ModelOptions::with_all_ops()
            .load(bytes.to_vec())
            .map_err(|e| load_error(e.to_string()))?;
        let node = |name: &str| {
            model
                .node_id(name)
                .map_err(|e| load_error(format!("`{name}`: {e}")))
        };
        let inputs = info
            .inputs
            .iter()
            .map(|i| Ok((node(&i.name)?, i.elem)))
            .collect::<Result<_>>()?;
        let outputs = info
            .outputs
            .iter()
            .map(|o| node(&o.name))
            .collect::<Result<_>>()?;
        Ok(Self {
            model,
            inputs,
            outputs,
            pool: Arc::new(ThreadPool::with_num_threads(threads.max(1))),
        })
    }
}

impl super::Session for RtenSession {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, String> {
        // Values rten takes as they are are borrowed; the others converted.
        let mut converted = Vec::new();
        for (tensor, (_, elem)) in inputs.iter().zip(&self.inputs) {
            let as_rten = match tensor.data {
                Data::I64(_) => Some(ElemType::I32),
                Data::F16(_) => Some(ElemType::F32),
                _ => None,
            };
            if let Some(to) = as_rten {
                let data = tensor
                    .data
                    .clone()
                    .cast(to)
                    .ok_or_else(|| format!("an {elem} value does not fit rten's {to}"))?;
                converted.push(Tensor::new(tensor.shape.clone(), data).expect("same size"));
            }
        }
        let mut converted = converted.iter();
        let mut values: Vec<(NodeId, ValueOrView<'_>)> = Vec::with_capacity(inputs.len());
        for (tensor, (id, _)) in inputs.iter().zip(&self.inputs) {
            let tensor = match tensor.data {
                Data::I64(_) | Data::F16(_) => converted.next().expect("converted above"),
                _ => tensor,
            };
            values.push((*id, view(tensor)?.into()));
        }
        let options = RunOptions::default().with_thread_pool(Some(self.pool.clone()));
        let outputs = self
            .model
            .run(values, &self.outputs, Some(options))
            .map_err(|e| e.to_string())?;
        outputs.into_iter().map(tensor_of).collect()
    }
}

fn view(tensor: &Tensor) -> Result<ValueView<'_>, String> {
    let shape = &tensor.shape[..];
    match &tensor.data {
        Data::F32(v) => ValueView::from_shape(shape, &v[..]).map_err(|e| e.to_string()),
        Data::I32(v) => ValueView::from_shape(shape, &v[..]).map_err(|e| e.to_string()),
        Data::U8(v) => ValueView::from_shape(shape, &v[..]).map_err(|e| e.to_string()),
        Data::I64(_) | Data::F16(_) => unreachable!("converted before"),
    }
}

fn tensor_of(value: Value) -> Result<Tensor, String> {
    let (shape, data) = match value {
        Value::FloatTensor(t) => (t.shape().to_vec(), Data::F32(t.into_data().into())),
        Value::Int32Tensor(t) => (t.shape().to_vec(), Data::I32(t.into_data().into())),
        Value::UInt8Tensor(t) => (t.shape().to_vec(), Data::U8(t.into_data().into())),
        Value::Int8Tensor(_) => {
            return Err("an output of i8 values: supported are f32, f16, i64, i32 and u8".into());
        }
        _ => return Err("an output that is not a tensor (a sequence)".into()),
    };
    Ok(Tensor::new(shape, data).expect("rten's shape is its data's"))
}
