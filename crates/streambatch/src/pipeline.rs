//! Pipelines written as TOML: a source, built-in operators and WGSL kernels,
//! a sink. `streambatch run pipeline.toml` runs one with no Rust to compile.
//! `examples/pipelines/embed.toml` documents every key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{
    Context, Dataset, Error, GpuKernel, JobStats, NodeConfig, Resources, Result, StageOptions, ops,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PipelineFile {
    #[serde(default)]
    node: toml::Table,
    source: Source,
    #[serde(default)]
    ops: Vec<Op>,
    sink: Sink,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
enum Source {
    ReadParquet(String),
    ReadCsv(String),
    ReadBinaryFiles(String),
    Range { n: u64, partitions: usize },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case", tag = "op")]
enum Op {
    /// 64x64x3 image bytes to normalised f32 pixels.
    PreprocessImages,
    Select {
        columns: Vec<String>,
    },
    Limit {
        n: usize,
    },
    Repartition {
        n: usize,
    },
    RandomShuffle {
        seed: u64,
    },
    Distinct,
    Unique {
        column: String,
    },
    Sort {
        keys: Vec<String>,
        #[serde(default)]
        descending: bool,
    },
    /// `aggs` as `Agg::parse` reads them: `["count()", "sum(x)"]`.
    Groupby {
        keys: Vec<String>,
        aggs: Vec<String>,
    },
    /// The rows so far joined with `with`'s on `on` (the right's keys
    /// `right_on` where named otherwise); `how` as `JoinHow::parse` reads
    /// it, inner by default.
    Join {
        with: Source,
        on: Vec<String>,
        #[serde(default)]
        right_on: Option<Vec<String>>,
        #[serde(default = "inner")]
        how: String,
    },
    /// The rows so far and those of each of `with`.
    Union {
        with: Vec<Source>,
    },
    Wgsl(Kernel),
    /// An ONNX model (see `streambatch_onnx::OnnxModel`).
    Onnx(OnnxStep),
}

/// An `op = "onnx"` step: the model file (relative to the pipeline file),
/// its inputs and outputs mapped to columns where their names differ,
/// the engine, and each task's slots and rows a call; `send` has the
/// driver send its file to each node of a cluster.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OnnxStep {
    model: PathBuf,
    #[serde(default)]
    send: bool,
    #[serde(default)]
    inputs: BTreeMap<String, String>,
    #[serde(default)]
    outputs: BTreeMap<String, String>,
    #[serde(default)]
    engine: streambatch_onnx::Engine,
    #[serde(default)]
    cpus: Option<f64>,
    #[serde(default)]
    gpus: Option<f64>,
    #[serde(default)]
    batch_rows: Option<usize>,
    /// Workers of its pool: at most this many sessions at once.
    #[serde(default)]
    workers: Option<usize>,
}

fn inner() -> String {
    "inner".into()
}

#[derive(Deserialize, Serialize, Clone)]
#[serde(deny_unknown_fields)]
struct Kernel {
    name: String,
    file: PathBuf,
    #[serde(default)]
    gpus: Option<f64>,
    #[serde(default)]
    batch_rows: Option<usize>,
    #[serde(default)]
    outputs: BTreeMap<String, usize>,
    #[serde(default)]
    params_u32: Vec<u32>,
    #[serde(default)]
    dispatch: Option<[String; 3]>,
    #[serde(default)]
    constants: BTreeMap<String, Constant>,
}

#[derive(Deserialize, Serialize, Clone)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
enum Constant {
    /// `len` floats uniform in `low..high` from `seed`.
    SeededUniform {
        seed: u64,
        len: usize,
        low: f32,
        high: f32,
    },
    /// The given values.
    Values(Vec<f32>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
enum Sink {
    WriteParquet(String),
    Count(bool),
}

/// What a pipeline run did.
pub struct PipelineRun {
    /// Files written (for a `write_parquet` sink) or rows counted.
    pub summary: String,
    /// The job's stats.
    pub stats: Option<JobStats>,
}

/// Runs the pipeline in `file` on the embedded node its `[node]` section
/// describes; relative paths in it are relative to the file.
pub fn run_pipeline(file: &Path) -> Result<PipelineRun> {
    run_pipeline_on(file, None)
}

/// Runs the pipeline in `file`, on the cluster whose head `cluster` names
/// (a driver's config, as `configs/cluster.toml`) when given, else on the
/// embedded node. Its operators are built-ins and WGSL kernels, which travel
/// to the nodes inside the plan (the kernel's source with it).
pub fn run_pipeline_on(file: &Path, cluster: Option<&Path>) -> Result<PipelineRun> {
    Pipeline::load(file, cluster)?.run()
}

/// A pipeline file loaded: its dataset built on its context (the embedded
/// node it describes, or a cluster), not run yet. What
/// [`run_pipeline_on`] does in two steps, so that a caller can say what
/// will run first (`streambatch run` names the adapter a kernel runs on).
pub struct Pipeline {
    ds: Dataset,
    sink: Sink,
    kernels: Vec<String>,
}

impl Pipeline {
    /// Reads `file` and builds its dataset, on the cluster `cluster` names
    /// or on the embedded node (the GPU adapters it uses chosen, as its
    /// `[node]` section says).
    pub fn load(file: &Path, cluster: Option<&Path>) -> Result<Self> {
        let (ds, sink, kernels) = build(file, cluster)?;
        Ok(Self { ds, sink, kernels })
    }

    /// The names of the WGSL kernels it runs, in order (empty when none).
    pub fn kernels(&self) -> &[String] {
        &self.kernels
    }

    /// Runs it to its sink.
    pub fn run(self) -> Result<PipelineRun> {
        run_built(self.ds, self.sink, false)
    }

    /// Runs it to its sink, resuming a `write_parquet` sink's write that
    /// was killed part way (see `ParquetWriteOptions::resume`): only what
    /// it had not done runs.
    pub fn run_resuming(self) -> Result<PipelineRun> {
        run_built(self.ds, self.sink, true)
    }
}

fn run_built(ds: Dataset, sink: Sink, resume: bool) -> Result<PipelineRun> {
    let summary = match sink {
        Sink::WriteParquet(dir) if resume => {
            let format = streambatch_plan::sink::FileFormat::Parquet(Default::default());
            let written = ds.write_resumable(dir.as_ref(), format)?;
            format!(
                "wrote {} files to {dir}; this run read {} of the {} source splits",
                written.files.len(),
                written.splits_run,
                written.splits
            )
        }
        Sink::WriteParquet(dir) => {
            let files = ds.write_parquet(&dir)?;
            format!("wrote {} files to {dir}", files.len())
        }
        Sink::Count(true) => format!("{} rows", ds.count()?),
        Sink::Count(false) => {
            ds.count()?;
            "done".into()
        }
    };
    Ok(PipelineRun {
        summary,
        stats: ds.stats(),
    })
}

/// What running the pipeline in `file` would run, on the cluster `cluster`
/// names or the embedded node (see [`Dataset::explain`]), and its sink.
pub fn explain_pipeline(file: &Path, cluster: Option<&Path>) -> Result<String> {
    let (ds, sink, _) = build(file, cluster)?;
    let sink = match sink {
        Sink::WriteParquet(dir) => format!("write_parquet {dir}"),
        Sink::Count(_) => "count".into(),
    };
    Ok(format!(
        "{}
sink: {sink}",
        ds.explain()?
    ))
}

/// The pipeline's dataset on its context, its sink (paths resolved) and
/// its kernels' names.
fn build(file: &Path, cluster: Option<&Path>) -> Result<(Dataset, Sink, Vec<String>)> {
    let text = std::fs::read_to_string(file).map_err(|e| Error::io("reading", file, e))?;
    let spec: PipelineFile = toml::from_str(&text).map_err(|e| Error::BadFile {
        path: file.to_path_buf(),
        message: e.to_string(),
    })?;
    let base = file.parent().unwrap_or(Path::new("."));
    // An object store URL names the same object from anywhere.
    let resolve = |p: &str| -> String {
        let path = Path::new(p);
        if path.is_absolute() || crate::object_url(path).is_some() {
            p.to_string()
        } else {
            base.join(path).display().to_string()
        }
    };
    let mut node = NodeConfig::from_toml_str(
        &toml::to_string(&spec.node).unwrap_or_default(),
        &format!("{} [node]", file.display()),
    )?;
    // A WGSL kernel has no CPU path: where only a software adapter exists,
    // "auto" gives it the slot rather than none (`streambatch run` says
    // which adapter runs the kernel, and warns when it is a software one).
    let kernels: Vec<String> = spec
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::Wgsl(k) => Some(k.name.clone()),
            _ => None,
        })
        .collect();
    if !kernels.is_empty() && !spec.node.contains_key("gpu_software") {
        node.gpu_software = true;
    }
    let ctx = match cluster {
        Some(cluster) => Context::connect(cluster)?.with_progress(),
        None => Context::with_config(node)?.with_progress(),
    };
    let registry = crate::registry();
    let read = |source: &Source| -> Result<Dataset> {
        Ok(match source {
            Source::ReadParquet(p) => ctx.read_parquet(&resolve(p))?,
            Source::ReadCsv(p) => ctx.read_csv(&resolve(p))?,
            Source::ReadBinaryFiles(p) => ctx.read_binary_files(&resolve(p))?,
            Source::Range { n, partitions } => ctx.range(*n, *partitions),
        })
    };
    let bad_file = |e: Error| Error::BadFile {
        path: file.to_path_buf(),
        message: e.to_string(),
    };
    let mut ds = read(&spec.source)?;
    for op in &spec.ops {
        ds = match op {
            Op::PreprocessImages => ds
                .map_batches(registry.udf("preprocess", b"")?, Resources::cpu(1.0))
                .named("preprocess_images"),
            Op::Select { columns } => ds.select(columns.iter().map(|c| crate::col(c))),
            Op::Limit { n } => ds.limit(*n),
            Op::Repartition { n } => ds.repartition(*n),
            Op::RandomShuffle { seed } => ds.random_shuffle(*seed),
            Op::Distinct => ds.distinct(),
            Op::Unique { column } => ds.unique(column),
            Op::Sort { keys, descending } => {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                ds.sort(&keys, *descending)
            }
            Op::Groupby { keys, aggs } => {
                let aggs = aggs
                    .iter()
                    .map(|a| crate::Agg::parse(a))
                    .collect::<Result<Vec<_>>>()
                    .map_err(|e| Error::BadFile {
                        path: file.to_path_buf(),
                        message: e.to_string(),
                    })?;
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                ds.groupby(&keys).aggregate(&aggs)
            }
            Op::Join {
                with,
                on,
                right_on,
                how,
            } => {
                let how = crate::JoinHow::parse(how).map_err(bad_file)?;
                let left: Vec<&str> = on.iter().map(String::as_str).collect();
                let right: Vec<&str> = match right_on {
                    Some(keys) => keys.iter().map(String::as_str).collect(),
                    None => left.clone(),
                };
                ds.join_on(&read(with)?, &left, &right, how)
                    .map_err(bad_file)?
            }
            Op::Union { with } => {
                let others = with.iter().map(&read).collect::<Result<Vec<_>>>()?;
                let others: Vec<&Dataset> = others.iter().collect();
                ds.union(&others).map_err(bad_file)?
            }
            Op::Wgsl(k) => {
                let path = base.join(&k.file);
                let source = std::fs::read_to_string(&path)
                    .map_err(|e| Error::io("reading kernel", &path, e))?;
                // Built here first, so that a bad kernel fails naming the file.
                build_kernel(k, &source).map_err(|message| Error::BadFile {
                    path: file.to_path_buf(),
                    message: format!("kernel `{}`: {message} ({})", k.name, path.display()),
                })?;
                let recipe = WgslRecipe {
                    kernel: k.clone(),
                    source,
                };
                let params = toml::to_string(&recipe)
                    .map_err(|e| Error::Invalid(format!("kernel `{}`: {e}", k.name)))?;
                let op = registry.udf("wgsl", params.as_bytes())?;
                ds.map_batches(op, kernel_options(k)).named(&k.name)
            }
            Op::Onnx(step) => {
                let spec = streambatch_onnx::OnnxSpec {
                    model: PathBuf::from(resolve(&step.model.display().to_string())),
                    send: step.send,
                    sha256: None,
                    inputs: step.inputs.clone(),
                    outputs: step.outputs.clone(),
                    engine: step.engine,
                };
                let model =
                    streambatch_onnx::OnnxModel::from_spec(spec).map_err(|e| Error::BadFile {
                        path: file.to_path_buf(),
                        message: e.to_string(),
                    })?;
                ds.map_batches(model, onnx_options(step))
            }
        };
    }
    let sink = match spec.sink {
        Sink::WriteParquet(p) => Sink::WriteParquet(resolve(&p)),
        count => count,
    };
    Ok((ds, sink, kernels))
}

/// A WGSL kernel as it travels: its settings from the pipeline file and
/// its source (the `wgsl` operator of [`registry`](crate::registry)).
#[derive(Serialize, Deserialize)]
struct WgslRecipe {
    kernel: Kernel,
    source: String,
}

/// Makes the `wgsl` operator from its recipe (TOML text).
pub(crate) fn wgsl_from_recipe(params: &[u8]) -> std::result::Result<GpuKernel, crate::UdfError> {
    let text = std::str::from_utf8(params)?;
    let recipe: WgslRecipe = toml::from_str(text)?;
    build_kernel(&recipe.kernel, &recipe.source).map_err(Into::into)
}

fn build_kernel(k: &Kernel, source: &str) -> std::result::Result<GpuKernel, String> {
    let mut kernel = GpuKernel::from_wgsl(&k.name, source).map_err(|e| e.to_string())?;
    for (name, width) in &k.outputs {
        kernel = kernel.output(name, *width);
    }
    for (name, constant) in &k.constants {
        let values = match constant {
            Constant::SeededUniform {
                seed,
                len,
                low,
                high,
            } => ops::seeded_uniform(*seed, *len, *low, *high),
            Constant::Values(v) => v.clone(),
        };
        kernel = kernel.constant(name, &values);
    }
    if !k.params_u32.is_empty() {
        let bytes: Vec<u8> = k.params_u32.iter().flat_map(|v| v.to_le_bytes()).collect();
        kernel = kernel.params(&bytes);
    }
    if let Some(dims) = &k.dispatch {
        let dims = dims
            .iter()
            .map(|d| parse_dim(d))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        kernel = kernel
            .dispatch(move |rows| [dims[0].eval(rows), dims[1].eval(rows), dims[2].eval(rows)]);
    }
    Ok(kernel)
}

fn kernel_options(k: &Kernel) -> StageOptions {
    let mut options: StageOptions = Resources::gpu(k.gpus.unwrap_or(1.0)).into();
    if let Some(rows) = k.batch_rows {
        options = options.batch_rows(rows);
    }
    options
}

fn onnx_options(step: &OnnxStep) -> StageOptions {
    let resources = Resources {
        cpus: step.cpus.unwrap_or(1.0),
        gpus: step.gpus.unwrap_or(0.0),
        ..Resources::cpu(1.0)
    };
    let mut options: StageOptions = resources.into();
    if let Some(rows) = step.batch_rows {
        options = options.batch_rows(rows);
    }
    if let Some(workers) = step.workers {
        options = options.pool(1, workers.max(1));
    }
    options
}

/// One dispatch dimension: a number, `rows`, or `rows/N` (rounded up).
enum Dim {
    Fixed(u32),
    Rows(u32),
}

impl Dim {
    fn eval(&self, rows: usize) -> u32 {
        match self {
            Dim::Fixed(n) => *n,
            Dim::Rows(div) => (rows as u32).div_ceil(*div),
        }
    }
}

fn parse_dim(text: &str) -> std::result::Result<Dim, String> {
    let t = text.replace(' ', "");
    if let Ok(n) = t.parse() {
        return Ok(Dim::Fixed(n));
    }
    match t.strip_prefix("rows") {
        Some("") => Ok(Dim::Rows(1)),
        Some(rest) => rest
            .strip_prefix('/')
            .and_then(|d| d.parse().ok())
            .filter(|d| *d > 0)
            .map(Dim::Rows)
            .ok_or_else(|| format!("dispatch `{text}` is not a number, `rows` or `rows/N`")),
        None => Err(format!(
            "dispatch `{text}` is not a number, `rows` or `rows/N`"
        )),
    }
}
