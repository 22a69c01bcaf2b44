//! An ONNX model as a stateful `map_batches` operator: one session per
//! worker of its pool, loaded once and kept warm, computing on as many
//! threads as its stage holds CPU slots.
//!
//! Columns feed the model's inputs by name (a model input reads the
//! column of its own name unless mapped to another); each output becomes
//! a column (of its own name unless mapped). The batch's other columns
//! pass through, before the outputs; the columns fed to the model do not.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{Field, Schema};
use streambatch_core::Resources;
use streambatch_plan::{BatchFn, BatchUdf, Recipe, UdfError};

use crate::engine::{self, Engine, Placement, Session};
use crate::error::{OnnxError, Result};
use crate::info::ModelInfo;
use crate::tensor;

/// The recipe name an ONNX operator is registered under.
pub const RECIPE: &str = "onnx";

/// How an ONNX model runs as an operator: what a node needs to rebuild it
/// (its recipe, as TOML) and what a TOML pipeline's `op = "onnx"` step
/// says.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnnxSpec {
    /// The model file: a path every node can read, an object store URL,
    /// or (with `send`) a file of the driver's.
    pub model: PathBuf,
    /// Whether the driver sends its copy of the file to each node (once a
    /// job, over the cluster's own connections, checked by its hash)
    /// rather than each node reading `model` itself.
    #[serde(default)]
    pub send: bool,
    /// Its SHA-256 as the driver read it: a node whose copy differs
    /// refuses to run it. Unset in a TOML step (filled in when the
    /// operator is made).
    #[serde(default)]
    pub sha256: Option<String>,
    /// Model input -> the column that feeds it, where not the input's own
    /// name.
    #[serde(default)]
    pub inputs: BTreeMap<String, String>,
    /// Model output -> the column it becomes, where not the output's own
    /// name.
    #[serde(default)]
    pub outputs: BTreeMap<String, String>,
    /// Which engine runs it.
    #[serde(default)]
    pub engine: Engine,
}

/// An ONNX model, read and checked, ready to be an operator.
///
/// ```
/// use streambatch_onnx::{OnnxModel, convnet};
/// use streambatch_plan::BatchUdf;
///
/// let dir = tempfile::tempdir().unwrap();
/// let file = dir.path().join("convnet.onnx");
/// std::fs::write(&file, convnet(7)).unwrap();
/// let model = OnnxModel::open(&file).unwrap().output("embedding", "vector");
/// assert_eq!(model.info().inputs[0].to_string(), "pixels: f32[N, 64, 64, 3]");
/// assert!(model.is_stateful());
/// ```
#[derive(Clone)]
pub struct OnnxModel {
    spec: OnnxSpec,
    info: Arc<ModelInfo>,
    bytes: Arc<[u8]>,
    /// The file as a blob the driver serves, where it sends it.
    blob: Option<streambatch_plan::Blob>,
}

impl OnnxModel {
    /// Reads the model at `path` and its declarations. `path` is a file,
    /// or an object store URL (`s3://bucket/model.onnx`, `gs://`, `az://`,
    /// `http(s)://`) read with the environment's credentials, as
    /// `read_parquet` reads one.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_spec(OnnxSpec {
            model: path.as_ref().to_path_buf(),
            send: false,
            sha256: None,
            inputs: BTreeMap::new(),
            outputs: BTreeMap::new(),
            engine: Engine::Auto,
        })
    }

    /// The model `spec` describes, its file read (or, where the driver
    /// sends it, the copy that arrived), checked against the hash it names
    /// (if any) and its mapping against the model's declarations.
    pub fn from_spec(mut spec: OnnxSpec) -> Result<Self> {
        let path = &spec.model;
        let sent = match (&spec.sha256, spec.send) {
            (Some(sha256), true) => streambatch_plan::Blob::find(sha256),
            _ => None,
        };
        let bytes: Arc<[u8]> = match (&sent, streambatch_plan::object_url(path)) {
            (Some(blob), _) => blob.bytes().clone(),
            // A node holds the driver's copy once it pulled it; a recipe
            // rebuilt without it is a node that should not run it.
            (None, _) if spec.send && spec.sha256.is_some() => {
                return Err(OnnxError::NotSent {
                    path: path.clone(),
                    sha256: spec.sha256.clone().unwrap_or_default(),
                });
            }
            // The same object for every node, each reading its own copy
            // with its own credentials (and checking it by its hash).
            (None, Some(url)) => streambatch_plan::read_object(url)
                .map_err(|e| OnnxError::Fetch {
                    url: url.to_string(),
                    reason: e.to_string(),
                })?
                .to_vec()
                .into(),
            (None, None) => std::fs::read(path)
                .map_err(|source| OnnxError::Io {
                    path: path.clone(),
                    source,
                })?
                .into(),
        };
        let info = ModelInfo::parse(&bytes).map_err(|reason| OnnxError::NotOnnx {
            path: path.clone(),
            reason,
        })?;
        match &spec.sha256 {
            Some(expected) if *expected != info.sha256 => {
                return Err(OnnxError::Differs {
                    path: path.clone(),
                    expected: expected.clone(),
                    found: info.sha256,
                });
            }
            _ => spec.sha256 = Some(info.sha256.clone()),
        }
        // Known to this process by its hash, so that a driver serves it
        // (a node keeps the copy it pulled, hashed once already).
        let blob = match sent {
            Some(blob) => Some(blob),
            None => spec
                .send
                .then(|| streambatch_plan::Blob::new(bytes.clone())),
        };
        let model = Self {
            spec,
            info: Arc::new(info),
            bytes,
            blob,
        };
        model.check_mapping()?;
        Ok(model)
    }

    /// The operator a node rebuilds from `params` (its recipe's TOML).
    pub fn from_recipe(params: &[u8]) -> Result<Self> {
        let text = std::str::from_utf8(params)
            .map_err(|e| OnnxError::Recipe(format!("not UTF-8: {e}")))?;
        let spec: OnnxSpec = toml::from_str(text).map_err(|e| OnnxError::Recipe(e.to_string()))?;
        Self::from_spec(spec)
    }

    /// Feeds model input `input` from column `column`.
    pub fn input(mut self, input: &str, column: &str) -> Self {
        self.spec.inputs.insert(input.into(), column.into());
        self
    }

    /// Makes model output `output` the column `column`.
    pub fn output(mut self, output: &str, column: &str) -> Self {
        self.spec.outputs.insert(output.into(), column.into());
        self
    }

    /// Has the driver send its copy of the model file to each node of a
    /// cluster (once a job, checked there by its hash), so that the file
    /// need be on the driver's machine alone.
    pub fn send_to_nodes(mut self) -> Self {
        if !self.spec.send {
            self.spec.send = true;
            self.blob = Some(streambatch_plan::Blob::new(self.bytes.clone()));
        }
        self
    }

    /// Runs the model in `engine`.
    pub fn engine(mut self, engine: Engine) -> Self {
        self.spec.engine = engine;
        self
    }

    /// The model's declarations.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// What a node needs to rebuild this operator.
    pub fn spec(&self) -> &OnnxSpec {
        &self.spec
    }

    /// Checks that the mapping names only the model's inputs and outputs.
    fn check_mapping(&self) -> Result<()> {
        let wrong = |reason: String| OnnxError::Mapping {
            path: self.spec.model.clone(),
            reason,
        };
        let names = |ts: &[crate::info::TensorInfo]| {
            ts.iter()
                .map(|t| format!("`{}`", t.name))
                .collect::<Vec<_>>()
                .join(", ")
        };
        for input in self.spec.inputs.keys() {
            if self.info.input(input).is_none() {
                return Err(wrong(format!(
                    "a column is mapped to input `{input}`, which the model lacks: its inputs are {}",
                    names(&self.info.inputs)
                )));
            }
        }
        for output in self.spec.outputs.keys() {
            if self.info.output(output).is_none() {
                return Err(wrong(format!(
                    "output `{output}` is mapped to a column, and the model lacks it: its outputs are {}",
                    names(&self.info.outputs)
                )));
            }
        }
        Ok(())
    }

    /// This model with its mapping checked (an error names what does not
    /// fit): for a model built up with [`OnnxModel::input`] and
    /// [`OnnxModel::output`].
    pub fn checked(self) -> Result<Self> {
        self.check_mapping()?;
        Ok(self)
    }

    /// A session of this model computing on `threads` threads, as one
    /// worker's instance.
    pub fn session(&self, threads: usize) -> Result<OnnxFn> {
        self.session_placed(Placement {
            threads,
            gpu: false,
        })
    }

    /// A session of this model placed as `placement` says (on a GPU where
    /// its stage holds a GPU slot).
    pub fn session_placed(&self, placement: Placement) -> Result<OnnxFn> {
        self.check_mapping()?;
        let session = engine::open(
            self.spec.engine,
            &self.spec.model,
            self.bytes.clone(),
            &self.info,
            placement,
        )?;
        let column = |name: &str, map: &BTreeMap<String, String>| {
            map.get(name).cloned().unwrap_or_else(|| name.to_string())
        };
        Ok(OnnxFn {
            path: self.spec.model.clone(),
            info: self.info.clone(),
            input_columns: self
                .info
                .inputs
                .iter()
                .map(|i| column(&i.name, &self.spec.inputs))
                .collect(),
            output_columns: self
                .info
                .outputs
                .iter()
                .map(|o| column(&o.name, &self.spec.outputs))
                .collect(),
            session,
        })
    }
}

impl BatchUdf for OnnxModel {
    fn name(&self) -> String {
        let file = self.spec.model.file_name().unwrap_or_default();
        format!("onnx({})", file.to_string_lossy())
    }

    fn is_stateful(&self) -> bool {
        true
    }

    fn instantiate(&self) -> std::result::Result<Box<dyn BatchFn>, UdfError> {
        self.instantiate_for(&Resources::cpu(1.0))
    }

    fn instantiate_for(
        &self,
        resources: &Resources,
    ) -> std::result::Result<Box<dyn BatchFn>, UdfError> {
        Ok(Box::new(self.session_placed(Placement {
            threads: resources.cpus.ceil().max(1.0) as usize,
            gpu: resources.gpus > 0.0,
        })?))
    }

    fn describe(&self) -> Vec<String> {
        vec![format!(
            "model {} ({}): {}",
            self.spec.model.display(),
            self.spec.engine.name(),
            self.info
        )]
    }

    fn metrics(&self) -> Vec<(String, String)> {
        vec![("engine".into(), self.spec.engine.name().into())]
    }

    fn recipe(&self) -> Option<Recipe> {
        let params = toml::to_string(&self.spec).expect("a spec is plain TOML");
        Some(Recipe {
            name: RECIPE.into(),
            params: params.into_bytes(),
            blobs: self.blob.iter().map(|b| b.sha256().to_string()).collect(),
        })
    }
}

/// One worker's session of a model: what the operator calls per batch.
pub struct OnnxFn {
    path: PathBuf,
    info: Arc<ModelInfo>,
    input_columns: Vec<String>,
    output_columns: Vec<String>,
    session: Box<dyn Session>,
}

impl OnnxFn {
    /// Runs the model over `batch` (see the module docs for the columns).
    pub fn run(&mut self, batch: &RecordBatch) -> Result<RecordBatch> {
        let wrong = |reason: String| OnnxError::Run {
            path: self.path.clone(),
            reason,
        };
        let rows = batch.num_rows();
        let mut inputs = Vec::with_capacity(self.info.inputs.len());
        for (input, column) in self.info.inputs.iter().zip(&self.input_columns) {
            let values = batch.column_by_name(column).ok_or_else(|| {
                let have: Vec<&str> = batch.schema_ref().fields().iter().map(|f| f.name().as_str()).collect();
                wrong(format!(
                    "model input `{}` reads column `{column}`, and the batch has none (its columns: {})",
                    input.name,
                    have.join(", ")
                ))
            })?;
            inputs.push(tensor::from_column(column, values, input).map_err(&wrong)?);
        }
        let outputs = self
            .session
            .run(&inputs)
            .map_err(|e| wrong(format!("the engine failed: {e}")))?;
        let schema = batch.schema();
        let mut fields: Vec<Arc<Field>> = Vec::new();
        let mut columns: Vec<ArrayRef> = Vec::new();
        for (field, column) in schema.fields().iter().zip(batch.columns()) {
            if !self.input_columns.contains(field.name())
                && !self.output_columns.contains(field.name())
            {
                fields.push(field.clone());
                columns.push(column.clone());
            }
        }
        for ((output, column), tensor) in self
            .info
            .outputs
            .iter()
            .zip(&self.output_columns)
            .zip(outputs)
        {
            let array = tensor::to_column(tensor, rows, output).map_err(&wrong)?;
            fields.push(Arc::new(Field::new(
                column,
                array.data_type().clone(),
                false,
            )));
            columns.push(array);
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
            .map_err(|e| wrong(format!("the output batch: {e}")))
    }
}

impl BatchFn for OnnxFn {
    fn call(&mut self, batch: RecordBatch) -> std::result::Result<RecordBatch, UdfError> {
        Ok(self.run(&batch)?)
    }
}
