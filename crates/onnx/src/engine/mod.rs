//! The engines that run a model: ONNX Runtime where its library is found
//! (`ort`, its library loaded at run time), else rten, the pure-Rust
//! engine that is always built in. A [`Session`] is one loaded model, owned by one worker
//! and kept warm for every batch it is given.

use std::path::Path;
use std::sync::Arc;

use crate::error::Result;
use crate::info::ModelInfo;
use crate::tensor::Tensor;

pub(crate) mod ort;
pub(crate) mod rten;

/// Which engine runs a model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// ONNX Runtime where its library is found, else rten.
    #[default]
    Auto,
    /// ONNX Runtime (an error where its library is not found).
    #[serde(rename = "onnxruntime")]
    OnnxRuntime,
    /// rten, the pure-Rust engine.
    Rten,
}

impl Engine {
    /// The engine `self` resolves to on this machine: `Auto` is ONNX
    /// Runtime where its library is found (`ORT_DYLIB_PATH`, or
    /// `tools/setup-onnxruntime.sh`'s link), else rten.
    pub fn resolve(self) -> Engine {
        match self {
            Engine::Auto if ort::library().is_some() => Engine::OnnxRuntime,
            Engine::Auto => Engine::Rten,
            engine => engine,
        }
    }

    /// The name of the engine `self` resolves to, as the stats show it.
    pub fn name(self) -> &'static str {
        match self.resolve() {
            Engine::OnnxRuntime => "onnxruntime",
            _ => "rten",
        }
    }
}

/// One loaded model.
pub trait Session: Send {
    /// Runs the model on `inputs` (one tensor per declared input, in the
    /// order of [`ModelInfo::inputs`]); returns one tensor per declared
    /// output, in the order of [`ModelInfo::outputs`].
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, String>;
}

/// Where a session computes: on `threads` CPU threads, and on a GPU where
/// `gpu` (its stage holds a GPU slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Threads of the CPU work (all of it, or what a GPU provider leaves).
    pub threads: usize,
    /// Whether the stage holds a GPU slot.
    pub gpu: bool,
}

/// Loads the model at `path` (declaring `info`) in `engine`, placed as
/// `placement` says.
pub fn open(
    engine: Engine,
    path: &Path,
    bytes: Arc<[u8]>,
    info: &ModelInfo,
    placement: Placement,
) -> Result<Box<dyn Session>> {
    match engine.resolve() {
        Engine::OnnxRuntime => Ok(Box::new(ort::OrtRunner::load(
            path, bytes, info, placement,
        )?)),
        // rten computes on the CPU only: a stage holding a GPU slot would
        // hold it for nothing.
        _ if placement.gpu => Err(crate::error::OnnxError::Load {
            path: path.to_path_buf(),
            engine: "rten",
            reason: "rten computes on the CPU only, and this stage asks for GPU slots: give it \
                     CPU slots, or run it on the onnxruntime engine with a GPU provider's library \
                     (onnxruntime-gpu's, by ORT_DYLIB_PATH)"
                .into(),
        }),
        _ => Ok(Box::new(rten::RtenSession::load(
            path,
            bytes,
            info,
            placement.threads,
        )?)),
    }
}
