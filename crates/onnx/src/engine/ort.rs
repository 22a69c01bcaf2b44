//! ONNX Runtime, through `ort`, its library loaded at run time (never
//! linked or downloaded at build time): the file `ORT_DYLIB_PATH` names,
//! else the one `tools/setup-onnxruntime.sh` links into
//! `~/.cache/streambatch-onnxruntime/`. Loaded once per process; each
//! session computes on the threads its stage's CPU slots allow.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use ort::environment::Environment;
use ort::session::{Session as OrtSession, SessionInputValue};
use ort::value::TensorRef;

use crate::error::{OnnxError, Result};
use crate::info::ModelInfo;
use crate::tensor::{Data, Tensor};

/// Where `tools/setup-onnxruntime.sh` links the library, under `$HOME`.
const SETUP_LINK: &str = ".cache/streambatch-onnxruntime/libonnxruntime.so";

/// The library file to load, if one is there.
pub(crate) fn library() -> Option<PathBuf> {
    let named = std::env::var_os("ORT_DYLIB_PATH")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    let linked = std::env::var_os("HOME").map(|home| Path::new(&home).join(SETUP_LINK));
    named.or(linked).filter(|p| p.is_file())
}

/// The process's environment, made on first use: the library loaded and
/// its API version checked.
fn environment() -> Result<&'static Environment, String> {
    static ENV: OnceLock<Result<Environment, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        let path = library().ok_or_else(|| {
            "no ONNX Runtime library: set ORT_DYLIB_PATH to a libonnxruntime, or run tools/setup-onnxruntime.sh".to_string()
        })?;
        let builder = ort::init_from(&path).map_err(|e| format!("loading {}: {e}", path.display()))?;
        builder
            .with_name("streambatch")
            .build()
            .map_err(|e| format!("starting ONNX Runtime from {}: {e}", path.display()))
    })
    .as_ref()
    .map_err(Clone::clone)
}

pub(crate) struct OrtRunner {
    session: OrtSession,
    inputs: Vec<String>,
    outputs: Vec<String>,
}

impl OrtRunner {
    pub(crate) fn load(
        path: &Path,
        bytes: Arc<[u8]>,
        info: &ModelInfo,
        placement: super::Placement,
    ) -> Result<Self> {
        let load_error = |reason: String| OnnxError::Load {
            path: path.to_path_buf(),
            engine: "onnxruntime",
            reason,
        };
        let env = environment().map_err(&load_error)?;
        let mut builder = OrtSession::builder(env)
            .and_then(|b| Ok(b.with_intra_threads(placement.threads.max(1))?))
            .map_err(|e| load_error(e.to_string()))?;
        if placement.gpu {
            // CUDA's provider, from the library's own folder (the
            // onnxruntime-gpu wheel's); a failure is an error, never a
            // silent fall back to the CPU while the stage holds a GPU slot.
            let cuda = ort::ep::CUDA::default()
                .with_device_id(0)
                .build()
                .error_on_failure();
            builder = builder
                .with_execution_providers([cuda])
                .map_err(|e| {
                    load_error(format!(
                        "this stage asks for GPU slots, and ONNX Runtime's CUDA provider did not load \
                         (use the library of the onnxruntime-gpu wheel, by ORT_DYLIB_PATH, on an NVIDIA GPU): {e}"
                    ))
                })?;
        }
        let session = Ok::<_, ort::Error>(builder)
            .and_then(|b| Ok(b.with_inter_threads(1)?))
            .and_then(|mut b| b.commit_from_memory(&bytes))
            .map_err(|e| load_error(e.to_string()))?;
        Ok(Self {
            session,
            inputs: info.inputs.iter().map(|i| i.name.clone()).collect(),
            outputs: info.outputs.iter().map(|o| o.name.clone()).collect(),
        })
    }
}

impl super::Session for OrtRunner {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, String> {
        let mut values: Vec<(String, SessionInputValue<'_>)> = Vec::with_capacity(inputs.len());
        for (name, tensor) in self.inputs.iter().zip(inputs) {
            let shape = tensor.shape.clone();
            let value: SessionInputValue<'_> = match &tensor.data {
                Data::F32(v) => TensorRef::from_array_view((shape, &v[..])).map(Into::into),
                Data::F16(v) => TensorRef::from_array_view((shape, &v[..])).map(Into::into),
                Data::I64(v) => TensorRef::from_array_view((shape, &v[..])).map(Into::into),
                Data::I32(v) => TensorRef::from_array_view((shape, &v[..])).map(Into::into),
                Data::U8(v) => TensorRef::from_array_view((shape, &v[..])).map(Into::into),
            }
            .map_err(|e| format!("input `{name}`: {e}"))?;
            values.push((name.clone(), value));
        }
        let outputs = self.session.run(values).map_err(|e| e.to_string())?;
        self.outputs
            .iter()
            .map(|name| {
                let value = outputs
                    .get(name)
                    .ok_or_else(|| format!("no output `{name}` came back"))?;
                tensor_of(value).map_err(|e| format!("output `{name}`: {e}"))
            })
            .collect()
    }
}

fn tensor_of(value: &ort::value::DynValue) -> Result<Tensor, String> {
    use ort::value::TensorElementType as T;
    let ort::value::ValueType::Tensor { ty, .. } = value.dtype() else {
        return Err("not a tensor".into());
    };
    fn take<E: ort::value::PrimitiveTensorElementType + Clone>(
        value: &ort::value::DynValue,
    ) -> Result<(Vec<usize>, Vec<E>), String> {
        let (shape, data) = value.try_extract_tensor::<E>().map_err(|e| e.to_string())?;
        Ok((shape.iter().map(|&d| d as usize).collect(), data.to_vec()))
    }
    let (shape, data) = match ty {
        T::Float32 => take::<f32>(value).map(|(s, d)| (s, Data::F32(d.into())))?,
        T::Float16 => take::<half::f16>(value).map(|(s, d)| (s, Data::F16(d.into())))?,
        T::Int64 => take::<i64>(value).map(|(s, d)| (s, Data::I64(d.into())))?,
        T::Int32 => take::<i32>(value).map(|(s, d)| (s, Data::I32(d.into())))?,
        T::Uint8 => take::<u8>(value).map(|(s, d)| (s, Data::U8(d.into())))?,
        other => {
            return Err(format!(
                "{other:?} values: supported are f32, f16, i64, i32 and u8"
            ));
        }
    };
    Tensor::new(shape, data).ok_or_else(|| "a shape that is not its data's".into())
}
