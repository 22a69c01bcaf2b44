use std::path::PathBuf;

use arrow_schema::ArrowError;
use streambatch_core::ConfigError;

/// Everything that can end a streambatch job. Each variant names what a user
/// can act on: the file, the operator, the key.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A node's configuration is bad.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A path, glob or directory that matched no file.
    #[error("no input files: {pattern} matches nothing")]
    NoFiles {
        /// The path or pattern given.
        pattern: String,
    },
    /// A file could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done ("reading", "writing", ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file's contents could not be decoded (corrupt Parquet, bad CSV).
    #[error("cannot read {path}: {message}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What the decoder said.
        message: String,
    },
    /// Input files whose schemas disagree.
    #[error("schema of {path} differs from {first}: expected {expected}, found {found}")]
    SchemaMismatch {
        /// The file that disagrees.
        path: PathBuf,
        /// The first file, whose schema the others must match.
        first: PathBuf,
        /// The first file's schema.
        expected: String,
        /// This file's schema.
        found: String,
    },
    /// A user function returned an error.
    #[error("operator `{operator}` failed: {message}")]
    Udf {
        /// The operator's name.
        operator: String,
        /// The function's error.
        message: String,
    },
    /// A user function panicked on every attempt.
    #[error("operator `{operator}` panicked {attempts} time(s), giving up: {message}")]
    Panicked {
        /// The operator's name.
        operator: String,
        /// How often the task was tried.
        attempts: u32,
        /// The panic message.
        message: String,
    },
    /// An Arrow computation (an expression, a concatenation) failed.
    #[error("operator `{operator}`: {source}")]
    Arrow {
        /// The operator's name.
        operator: String,
        /// The cause.
        source: ArrowError,
    },
    /// A call the plan cannot carry out (a missing column, a bad argument).
    #[error("invalid plan: {0}")]
    Invalid(String),
    /// The executor could not run the job (a memory limit, a lost actor).
    #[error("execution failed: {0}")]
    Execution(String),
}

/// The result type of streambatch's planning and execution.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an Arrow error raised while running `operator`.
    pub fn arrow(operator: &str, source: ArrowError) -> Self {
        Self::Arrow {
            operator: operator.to_string(),
            source,
        }
    }

    /// An I/O error on `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
