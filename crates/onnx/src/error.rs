//! The errors of loading and running a model: each names the model file,
//! and the input, output or operator at fault with what was expected.

use std::path::PathBuf;

/// This crate's result.
pub type Result<T, E = OnnxError> = std::result::Result<T, E>;

/// What went wrong with a model.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// The file could not be read.
    #[error("model {path}: {source}")]
    Io {
        /// The model file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The model could not be fetched from its object store.
    #[error("model {url}: {reason}")]
    Fetch {
        /// The model's URL.
        url: String,
        /// Why (the store's words).
        reason: String,
    },
    /// The file is not an ONNX model this crate can map (truncated, of
    /// another format, or with inputs of an unsupported type).
    #[error("model {path}: {reason}")]
    NotOnnx {
        /// The model file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// An engine could not load the model (an operator it lacks, an
    /// attribute it does not take).
    #[error("model {path}: {engine} cannot load it: {reason}")]
    Load {
        /// The model file.
        path: PathBuf,
        /// The engine.
        engine: &'static str,
        /// The engine's own words.
        reason: String,
    },
    /// The operator's settings do not fit the model (a column mapped to an
    /// input it lacks, an input left without a column).
    #[error("model {path}: {reason}")]
    Mapping {
        /// The model file.
        path: PathBuf,
        /// What does not fit.
        reason: String,
    },
    /// A batch could not go in or come out (a column of the wrong shape or
    /// type, an output that disagrees with its declaration), or the engine
    /// failed on it.
    #[error("model {path}: {reason}")]
    Run {
        /// The model file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A node's copy of the model is not the driver's.
    #[error(
        "model {path}: its SHA-256 is {found}, the job's model is {expected}: every node must run the same model"
    )]
    Differs {
        /// The node's copy.
        path: PathBuf,
        /// The hash the job was planned with.
        expected: String,
        /// The copy's hash.
        found: String,
    },
    /// The driver sends the model, and its copy is not here (a recipe
    /// rebuilt outside a job's start, which pulls it).
    #[error(
        "model {path}: the driver sends this model (SHA-256 {sha256}) and its copy did not arrive here"
    )]
    NotSent {
        /// The driver's file.
        path: PathBuf,
        /// The hash the job was planned with.
        sha256: String,
    },
    /// A node was sent an onnx recipe it cannot read.
    #[error("an onnx operator's recipe: {0}")]
    Recipe(String),
}
