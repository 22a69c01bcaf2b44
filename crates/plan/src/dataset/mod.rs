//! The lazy [`Dataset`]: transforms build a plan; consuming calls hand it to a
//! [`Runner`] (the executor) and read the results as they stream out.
//!
//! Beside the builder: what a job's output stream yields (`held`), the
//! all-to-all calls (`all_to_all`: shuffle, distinct, sort, group-by),
//! `join`, `union`, `train_test_split` and the writes (`write`). It may
//! import every floor but `train`, which consumes datasets.

pub(crate) mod all_to_all;
pub(crate) mod held;
pub(crate) mod join;
pub(crate) mod train_test_split;
pub(crate) mod union;
pub(crate) mod write;

pub use all_to_all::Grouped;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use streambatch_core::{NodeConfig, StageOptions};

use crate::dataset::held::Pulled;
use crate::error::{Error, Result};
use crate::logical::ops::{OpKind, OpSpec};
use crate::logical::plan::{ExecPlan, LogicalOp, LogicalPlan};
use crate::logical::source::SourceSplit;
use crate::read::files::{
    binary_files_schema, csv_schema, expand_paths, ipc_schema, json_schema, parquet_schema,
    text_schema,
};
use crate::read::images::{ImageSize, images_schema, is_image};
use crate::stats::JobStats;
use crate::udf::expr::Expr;
use crate::udf::row::{Row, batch_to_rows};
use crate::udf::{BatchUdf, Predicate, UdfError};

/// The stream of a running job's output batches.
pub trait JobStream: Iterator<Item = Result<RecordBatch>> + Send {
    /// Live counters, updated while the job runs and final once it ended.
    fn live_stats(&self) -> Arc<Mutex<JobStats>>;

    /// The next output's number of rows, like `next` but without reading
    /// the rows where the runner knows how many an output holds (what
    /// [`Dataset::count`] asks).
    fn next_rows(&mut self) -> Option<Result<usize>> {
        self.next().map(|batch| batch.map(|b| b.num_rows()))
    }

    /// The next output without reading it where a cluster node holds it
    /// ([`Pulled::Held`]: the job ends only once every such output is read
    /// or dropped), and [`Pulled::Drained`] once every output was handed
    /// over. By default, as `next` reads them.
    fn next_pulled(&mut self) -> Option<Result<Pulled>> {
        self.next().map(|batch| batch.map(Pulled::Batch))
    }

    /// The next output held by a node, if the job has handed it over
    /// already: what [`next_pulled`](JobStream::next_pulled) would give
    /// next without waiting, or `None` (never the end, an error or an
    /// output that must be read first). By default, `None`.
    fn next_held_ready(&mut self) -> Option<crate::dataset::held::HeldRows> {
        None
    }
}

/// Runs physical plans: implemented by the executor (`streambatch-sched`).
pub trait Runner: Send + Sync + 'static {
    /// Starts the job; its output streams out of the returned iterator.
    /// Dropping the iterator cancels the job.
    fn run(&self, plan: ExecPlan) -> Result<Box<dyn JobStream>>;
    /// The settings of the node that runs the job.
    fn config(&self) -> &NodeConfig;
    /// Shows a streaming split's ranks in this runner's metrics, for as
    /// long as `ranks` gives them (`None` once the split is gone, its last
    /// figures kept). Runners without metrics ignore it.
    fn watch_split(&self, ranks: SplitWatch) {
        let _ = ranks;
    }
}

/// A split's per-rank figures, read when the metrics are (see
/// [`Runner::watch_split`]).
pub type SplitWatch = Arc<dyn Fn() -> Option<Vec<crate::stats::RankStats>> + Send + Sync>;

/// A lazy, distributed collection of rows, held as Arrow partitions.
///
/// Transforms return a new `Dataset` and compute nothing; consuming calls
/// (`iter_batches`, `count`, `write_parquet`, ...) run the plan.
#[derive(Clone)]
pub struct Dataset {
    runner: Arc<dyn Runner>,
    pub(crate) plan: Arc<LogicalPlan>,
    last_stats: Arc<Mutex<Option<JobStats>>>,
}

/// Files per split of a source that groups many files into a task: about
/// four tasks per CPU slot, so that every slot stays busy to the end.
fn files_per_split(runner: &dyn Runner, files: usize) -> usize {
    files
        .div_ceil((runner.config().cpus.ceil() as usize).max(1) * 4)
        .max(1)
}

impl Dataset {
    fn from_source(
        runner: Arc<dyn Runner>,
        name: &str,
        splits: Vec<SourceSplit>,
        schema: Option<SchemaRef>,
    ) -> Self {
        let op = LogicalOp::Source {
            name: name.to_string(),
            splits,
            schema,
        };
        Self {
            runner,
            plan: Arc::new(LogicalPlan { input: None, op }),
            last_stats: Default::default(),
        }
    }

    /// Integers `0..n` in a column `id`, in `partitions` partitions.
    pub fn range(runner: Arc<dyn Runner>, n: u64, partitions: usize) -> Self {
        let partitions = partitions.max(1) as u64;
        let splits = (0..partitions)
            .map(|i| SourceSplit::Range {
                start: (i * n / partitions) as i64,
                end: ((i + 1) * n / partitions) as i64,
            })
            .collect();
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        Self::from_source(runner, "range", splits, Some(schema))
    }

    /// The given batches, one partition each.
    pub fn from_batches(runner: Arc<dyn Runner>, batches: Vec<RecordBatch>) -> Self {
        let schema = batches.first().map(|b| b.schema());
        Self::from_source(
            runner,
            "from_batches",
            batches.into_iter().map(SourceSplit::Batch).collect(),
            schema,
        )
    }

    /// Parquet files (a file, a directory or a glob), reading only `columns`
    /// when given. Every file's footer is read now: a missing path, a corrupt
    /// file or schemas that disagree are errors naming the file.
    pub fn read_parquet(
        runner: Arc<dyn Runner>,
        path: &str,
        columns: Option<&[&str]>,
    ) -> Result<Self> {
        let files = expand_paths(path)?;
        let columns: Option<Vec<String>> =
            columns.map(|c| c.iter().map(|s| s.to_string()).collect());
        let schema = parquet_schema(&files, columns.as_deref())?;
        let columns = columns.map(Arc::new);
        let splits = files
            .into_iter()
            .map(|path| SourceSplit::Parquet {
                path,
                columns: columns.clone(),
                prune: None,
            })
            .collect();
        Ok(Self::from_source(
            runner,
            "read_parquet",
            splits,
            Some(schema),
        ))
    }

    /// CSV files with a header row; the schema is inferred from the first file.
    pub fn read_csv(runner: Arc<dyn Runner>, path: &str) -> Result<Self> {
        Self::per_file(runner, "read_csv", path, csv_schema, |path, schema| {
            SourceSplit::Csv { path, schema }
        })
    }

    /// Newline-delimited JSON files (a file, a directory or a glob): one
    /// row per object, with the schema inferred from the first 1,000
    /// objects of each file (a field first seen later is left out; a value
    /// of a number and a string in one field reads as a string); a task
    /// per file.
    pub fn read_json(runner: Arc<dyn Runner>, path: &str) -> Result<Self> {
        Self::per_file(runner, "read_json", path, json_schema, |path, schema| {
            SourceSplit::Json { path, schema }
        })
    }

    /// Arrow IPC files (a file, a directory or a glob), a task per file;
    /// every file's schema is read now, and must agree.
    pub fn read_ipc(runner: Arc<dyn Runner>, path: &str) -> Result<Self> {
        Self::per_file(runner, "read_ipc", path, ipc_schema, |path, _| {
            SourceSplit::Ipc(path)
        })
    }

    /// A source named `name` with a split per file of `path` (a file, a
    /// directory or a glob), made by `split` with the files' schema as
    /// `schema_of` finds it.
    fn per_file(
        runner: Arc<dyn Runner>,
        name: &str,
        path: &str,
        schema_of: impl FnOnce(&[PathBuf]) -> Result<SchemaRef>,
        split: impl Fn(PathBuf, SchemaRef) -> SourceSplit,
    ) -> Result<Self> {
        let files = expand_paths(path)?;
        let schema = schema_of(&files)?;
        let splits = files
            .into_iter()
            .map(|file| split(file, schema.clone()))
            .collect();
        Ok(Self::from_source(runner, name, splits, Some(schema)))
    }

    /// Text files (a file, a directory or a glob): one row per line, in a
    /// column `text`, without its line ending; a task per file.
    pub fn read_text(runner: Arc<dyn Runner>, path: &str) -> Result<Self> {
        let text = |_: &[PathBuf]| Ok(text_schema());
        Self::per_file(runner, "read_text", path, text, |path, _| {
            SourceSplit::Text(path)
        })
    }

    /// The files this dataset's source reads, in the order its tasks take
    /// them (none for `range` or `from_batches`).
    pub fn input_files(&self) -> Vec<PathBuf> {
        let mut plan = &self.plan;
        while let Some(input) = &plan.input {
            plan = input;
        }
        match &plan.op {
            LogicalOp::Source { splits, .. } => splits
                .iter()
                .flat_map(|s| s.files())
                .map(Path::to_path_buf)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Files read whole: one row per file with its `path` and `bytes`.
    pub fn read_binary_files(runner: Arc<dyn Runner>, path: &str) -> Result<Self> {
        let files = expand_paths(path)?;
        let per_split = files_per_split(runner.as_ref(), files.len());
        let sizes = files
            .iter()
            .map(|f| crate::read::file_size(f))
            .collect::<Result<Vec<u64>>>()?;
        let splits = files
            .chunks(per_split)
            .zip(sizes.chunks(per_split))
            .map(|(paths, sizes)| SourceSplit::BinaryFiles {
                paths: Arc::new(paths.to_vec()),
                largest: sizes.iter().copied().max().unwrap_or(0),
            })
            .collect();
        Ok(Self::from_source(
            runner,
            "read_binary_files",
            splits,
            Some(binary_files_schema()),
        ))
    }

    /// PNG and JPEG files (a file, a directory or a glob; by their
    /// extension), each decoded and resized to `size` on a CPU slot: one
    /// row per image, `path` and `image` (`height x width x 3` RGB bytes,
    /// row-major). A file that does not decode fails the job, naming it.
    pub fn read_images(runner: Arc<dyn Runner>, path: &str, size: ImageSize) -> Result<Self> {
        size.check()?;
        let files: Vec<PathBuf> = expand_paths(path)?
            .into_iter()
            .filter(|f| is_image(f))
            .collect();
        if files.is_empty() {
            return Err(Error::Invalid(format!(
                "read_images: no .png, .jpg or .jpeg files in {path}"
            )));
        }
        // No more images than decode to about one target partition: a
        // training pipeline streams them in small steps.
        let target = runner.config().target_partition_bytes as usize;
        let per_split = files_per_split(runner.as_ref(), files.len())
            .min((target / size.bytes().max(1)).max(1));
        let splits = files
            .chunks(per_split)
            .map(|paths| SourceSplit::Images {
                paths: Arc::new(paths.to_vec()),
                size,
            })
            .collect();
        Ok(Self::from_source(
            runner,
            "read_images",
            splits,
            Some(images_schema()),
        ))
    }

    pub(crate) fn then(&self, op: LogicalOp) -> Self {
        Self {
            runner: self.runner.clone(),
            plan: Arc::new(LogicalPlan {
                input: Some(self.plan.clone()),
                op,
            }),
            last_stats: Default::default(),
        }
    }

    fn op(&self, name: &str, kind: OpKind, options: StageOptions) -> Self {
        self.then(LogicalOp::Op(OpSpec {
            name: name.to_string(),
            kind,
            options,
        }))
    }

    /// Applies `f` to each row.
    pub fn map<F, E>(&self, f: F) -> Self
    where
        F: Fn(Row) -> std::result::Result<Row, E> + Send + Sync + 'static,
        E: Into<UdfError>,
    {
        self.op(
            "map",
            OpKind::Map(Arc::new(move |r| f(r).map_err(Into::into))),
            StageOptions::default(),
        )
    }

    /// Applies `f` to each row, keeping all the rows it returns.
    pub fn flat_map<F, E>(&self, f: F) -> Self
    where
        F: Fn(Row) -> std::result::Result<Vec<Row>, E> + Send + Sync + 'static,
        E: Into<UdfError>,
    {
        self.op(
            "flat_map",
            OpKind::FlatMap(Arc::new(move |r| f(r).map_err(Into::into))),
            StageOptions::default(),
        )
    }

    /// Applies a generator to each batch: `f` returns an iterator of
    /// batches, pulled one at a time (like a Python generator UDF in Ray
    /// Data), so that an expansion streams out partition by partition.
    pub fn flat_map_batches<F, I, E>(&self, f: F, options: impl Into<StageOptions>) -> Self
    where
        F: Fn(RecordBatch) -> I + Send + Sync + 'static,
        I: IntoIterator<Item = std::result::Result<RecordBatch, E>> + 'static,
        I::IntoIter: Send,
        E: Into<UdfError>,
    {
        let generator: crate::udf::BatchGeneratorFn =
            Arc::new(move |b| Box::new(f(b).into_iter().map(|r| r.map_err(Into::into))));
        self.op(
            "flat_map_batches",
            OpKind::FlatMapBatches(generator),
            options.into(),
        )
    }

    /// Applies a batch function: a closure, or a [`crate::udf::Stateful`]
    /// operator whose set-up runs once per worker.
    pub fn map_batches(&self, udf: impl BatchUdf, options: impl Into<StageOptions>) -> Self {
        let options = options.into();
        let options = if udf.is_stateful() && options.pool.is_none() {
            options.pool(1, 1)
        } else {
            options
        };
        self.op(&udf.name(), OpKind::MapBatches(Arc::new(udf)), options)
    }

    /// Keeps the rows where `predicate` holds: an expression such as
    /// `col("x").gt(lit(5))`, or a closure over rows.
    ///
    /// An expression right after `read_parquet` (or after other such
    /// filters) also skips the row groups whose statistics (min, max, null
    /// counts) show that none of their rows can satisfy it: comparisons of
    /// a column with a constant, `is_null`, and `and` / `or` of those; any
    /// other part keeps every row group.
    pub fn filter(&self, predicate: impl Into<Predicate>) -> Self {
        let predicate = predicate.into();
        let input = match &predicate {
            Predicate::Expr(e) => self.pruning_row_groups(e),
            Predicate::Rows(_) => None,
        };
        input.as_ref().unwrap_or(self).op(
            "filter",
            OpKind::Filter(predicate),
            StageOptions::default(),
        )
    }

    /// This dataset with `predicate` given to its Parquet source's splits
    /// to prune row groups by, when it is a `read_parquet` source or one
    /// under filter expressions only (then their predicates and this one,
    /// joined by `and`, replace what the splits had), and all of them hold
    /// for the columns read (else a filter's error, say a column not read,
    /// must not depend on what pruning left).
    fn pruning_row_groups(&self, predicate: &Expr) -> Option<Self> {
        let (name, splits, schema) = match &self.plan.op {
            LogicalOp::Source {
                name,
                splits,
                schema: Some(schema),
            } => (name, splits, schema),
            LogicalOp::Op(OpSpec {
                kind: OpKind::Filter(Predicate::Expr(earlier)),
                ..
            }) => {
                let input = Self {
                    runner: self.runner.clone(),
                    plan: self.plan.input.clone()?,
                    last_stats: Default::default(),
                };
                let both = earlier.clone().and(predicate.clone());
                return Some(input.pruning_row_groups(&both)?.then(self.plan.op.clone()));
            }
            _ => return None,
        };
        predicate
            .evaluate_predicate(&RecordBatch::new_empty(schema.clone()))
            .ok()?;
        let predicate = Arc::new(predicate.clone());
        let splits = splits
            .iter()
            .map(|split| match split {
                SourceSplit::Parquet { path, columns, .. } => Some(SourceSplit::Parquet {
                    path: path.clone(),
                    columns: columns.clone(),
                    prune: Some(predicate.clone()),
                }),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self::from_source(
            self.runner.clone(),
            name,
            splits,
            Some(schema.clone()),
        ))
    }

    /// Keeps only these columns (or expressions).
    pub fn select(&self, exprs: impl IntoIterator<Item = Expr>) -> Self {
        self.op(
            "select",
            OpKind::Select(exprs.into_iter().collect()),
            StageOptions::default(),
        )
    }

    /// Adds (or replaces) column `name` with the value of `expr`.
    pub fn with_column(&self, name: &str, expr: Expr) -> Self {
        self.op(
            "with_column",
            OpKind::WithColumn(name.to_string(), expr),
            StageOptions::default(),
        )
    }

    /// The first `n` rows. Upstream work stops once they are produced.
    pub fn limit(&self, n: usize) -> Self {
        self.then(LogicalOp::Limit(n))
    }

    /// The same rows with the source's splits (its files, row groups or
    /// ranges, one task each) in an order shuffled by `seed`: partitions
    /// come in another order, with no row moved or copied. The same seed
    /// gives the same order.
    pub fn randomize_block_order(&self, seed: u64) -> Self {
        let mut ops = self.plan.chain();
        if let Some(LogicalOp::Source { splits, .. }) = ops.first_mut() {
            splits.shuffle(&mut StdRng::seed_from_u64(seed));
        }
        let mut plan = None;
        for op in ops {
            plan = Some(Arc::new(LogicalPlan { input: plan, op }));
        }
        self.with_plan(plan.expect("a chain starts at its source"))
    }

    /// The runner this dataset's jobs run on.
    pub(crate) fn runner(&self) -> &Arc<dyn Runner> {
        &self.runner
    }

    /// A dataset of this one's runner reading `splits`.
    pub(crate) fn with_source(
        &self,
        name: &str,
        splits: Vec<SourceSplit>,
        schema: Option<SchemaRef>,
    ) -> Self {
        Self::from_source(self.runner.clone(), name, splits, schema)
    }

    /// This dataset's runner with another plan.
    pub(crate) fn with_plan(&self, plan: Arc<LogicalPlan>) -> Self {
        Self {
            runner: self.runner.clone(),
            plan,
            last_stats: Default::default(),
        }
    }

    /// Regroups the rows into `n` partitions of (nearly) equal rows.
    pub fn repartition(&self, n: usize) -> Self {
        self.then(LogicalOp::Repartition(n))
    }

    /// Sets the resources (and batch size, pool) of the last transform.
    pub fn options(&self, options: impl Into<StageOptions>) -> Self {
        self.edit_last_op(|op| op.options = options.into())
    }

    /// Names the last transform in stats and errors.
    pub fn named(&self, name: &str) -> Self {
        self.edit_last_op(|op| op.name = name.to_string())
    }

    fn edit_last_op(&self, edit: impl FnOnce(&mut OpSpec)) -> Self {
        match &self.plan.op {
            LogicalOp::Op(op) => {
                let mut op = op.clone();
                edit(&mut op);
                Self {
                    runner: self.runner.clone(),
                    plan: Arc::new(LogicalPlan {
                        input: self.plan.input.clone(),
                        op: LogicalOp::Op(op),
                    }),
                    last_stats: Default::default(),
                }
            }
            _ => self.clone(),
        }
    }

    pub(crate) fn start(&self, plan: Arc<LogicalPlan>) -> Result<BatchStream> {
        let plan = ExecPlan::from_ops(plan.chain())?;
        let job = self.runner.run(plan)?;
        Ok(BatchStream {
            job,
            last_stats: self.last_stats.clone(),
            done: false,
        })
    }

    /// Runs the plan and streams its output batches as they are produced.
    pub fn iter_batches(&self) -> Result<BatchStream> {
        self.start(self.plan.clone())
    }

    /// Runs the plan and streams its rows.
    pub fn iter_rows(&self) -> Result<impl Iterator<Item = Result<Row>>> {
        let batches = self.iter_batches()?;
        Ok(batches.flat_map(
            |b| match b.and_then(|b| batch_to_rows(&b).map_err(Error::Invalid)) {
                Ok(rows) => rows.into_iter().map(Ok).collect::<Vec<_>>(),
                Err(e) => vec![Err(e)],
            },
        ))
    }

    /// The first `n` rows.
    pub fn take(&self, n: usize) -> Result<Vec<Row>> {
        self.limit(n).iter_rows()?.collect()
    }

    /// All output batches, in the order they were produced.
    pub fn collect(&self) -> Result<Vec<RecordBatch>> {
        self.iter_batches()?.collect()
    }

    /// The number of rows. Of a Parquet source read as it is (local
    /// files, no operator after it), the files' footers are summed, as
    /// Ray Data and DataFusion count: no job runs, so a page the footers
    /// do not describe is not read, nor checked. Otherwise the job runs;
    /// its outputs are counted, not read (each output's row count is known
    /// where it is stored).
    pub fn count(&self) -> Result<usize> {
        if let Some(rows) = self.rows_in_footers()? {
            return Ok(rows);
        }
        let mut stream = self.iter_batches()?;
        let mut n = 0;
        while let Some(rows) = stream.next_rows() {
            n += rows?;
        }
        Ok(n)
    }

    /// The rows of a bare Parquet source of local files, from their
    /// footers; `None` for any other plan.
    fn rows_in_footers(&self) -> Result<Option<usize>> {
        let LogicalOp::Source { splits, .. } = &self.plan.op else {
            return Ok(None);
        };
        let files: Option<Vec<&Path>> = splits
            .iter()
            .map(|split| match split {
                SourceSplit::Parquet {
                    path, prune: None, ..
                } if crate::object::files::url_of(path).is_none() => Some(path.as_path()),
                _ => None,
            })
            .collect();
        let Some(files) = files else {
            return Ok(None);
        };
        let mut rows = 0;
        for path in files {
            rows += crate::read::parquet::parquet_rows(path)?;
        }
        Ok(Some(rows))
    }

    /// The schema of the rows. Known without running for sources and
    /// expression transforms; otherwise the first output batch is computed.
    pub fn schema(&self) -> Result<SchemaRef> {
        if let Some(schema) = static_schema(&self.plan)? {
            return Ok(schema);
        }
        match self.limit(1).iter_batches()?.next() {
            Some(batch) => Ok(batch?.schema()),
            None => Err(Error::Invalid(
                "the schema is unknown: the dataset produced no rows".into(),
            )),
        }
    }

    /// The schema of the rows where the plan knows it without running.
    pub(crate) fn known_schema(&self) -> Option<SchemaRef> {
        static_schema(&self.plan).ok().flatten()
    }

    /// Runs the plan and keeps its output in memory as a new dataset.
    pub fn materialize(&self) -> Result<Dataset> {
        let batches = self.collect()?;
        let ds = Dataset::from_batches(self.runner.clone(), batches);
        *ds.last_stats.lock().unwrap_or_else(|p| p.into_inner()) = self.stats();
        Ok(ds)
    }

    /// The stats of the last job this dataset ran (`None` before any).
    pub fn stats(&self) -> Option<JobStats> {
        self.last_stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Writes the last run's timeline to `path` in the Chrome trace format
    /// (open it in Perfetto or chrome://tracing): a track per node and
    /// slot with the tasks it ran and the partitions they yielded, paused
    /// tasks with their cause, and the store's bytes (see
    /// [`crate::stats::timeline`]). The file appears whole or not at all. Fails
    /// when the dataset has not run yet, or ran with `record_timeline =
    /// false`.
    pub fn write_timeline(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let path = path.as_ref();
        let stats = self.stats().ok_or_else(|| {
            Error::Invalid(format!(
                "no timeline to write to {}: the dataset has not run yet",
                path.display()
            ))
        })?;
        if stats.events.is_empty() && stats.operators.iter().any(|o| o.tasks > 0) {
            return Err(Error::Invalid(format!(
                "no timeline to write to {}: the job ran with `record_timeline = false`",
                path.display()
            )));
        }
        crate::stats::timeline::write(&stats, path)
    }

    /// What running this dataset would run, without running it: the
    /// logical plan, the stages it fuses into with their resources and
    /// pools, and the store memory each stage's outputs are reserved on
    /// this dataset's node. Print it, or read its fields.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use streambatch_plan::{Dataset, ExecPlan, JobStream, Runner, Result};
    /// # use streambatch_core::NodeConfig;
    /// # struct Nowhere(NodeConfig);
    /// # impl Runner for Nowhere {
    /// #     fn run(&self, _: ExecPlan) -> Result<Box<dyn JobStream>> { unreachable!() }
    /// #     fn config(&self) -> &NodeConfig { &self.0 }
    /// # }
    /// # let runner = Arc::new(Nowhere(NodeConfig::default()));
    /// let ds = Dataset::range(runner, 100, 4).limit(10);
    /// let plan = ds.explain().unwrap();
    /// assert_eq!(plan.stage_names(), ["range", "limit(10)"]);
    /// assert!(plan.to_string().contains("logical plan: range (4 splits) -> limit 10"));
    /// ```
    pub fn explain(&self) -> Result<crate::logical::explain::Explain> {
        let chain = self.plan.chain();
        let plan = ExecPlan::from_ops(chain.clone())?;
        let config = self.runner.config();
        Ok(crate::logical::explain::Explain::new(
            &chain,
            &plan,
            config.target_partition_bytes,
            config.store_capacity,
        ))
    }
}

pub(crate) fn static_schema(plan: &Arc<LogicalPlan>) -> Result<Option<SchemaRef>> {
    if let LogicalOp::Exchange(crate::exchange::Exchange {
        reduce: crate::exchange::Reduce::Join(join),
        ..
    }) = &plan.op
    {
        return Ok(Some(join.schema()));
    }
    let input = match &plan.input {
        Some(input) => match static_schema(input)? {
            Some(s) => s,
            None => return Ok(None),
        },
        None => {
            return Ok(match &plan.op {
                LogicalOp::Source { schema, .. } => schema.clone(),
                _ => None,
            });
        }
    };
    let probe = |kind: &OpKind| -> Result<Option<SchemaRef>> {
        let empty = RecordBatch::new_empty(input.clone());
        let evaluate = |e: &Expr| {
            e.evaluate(&empty)
                .map_err(|e| Error::Invalid(e.to_string()))
        };
        Ok(Some(match kind {
            OpKind::Filter(_) => input.clone(),
            OpKind::Select(exprs) => {
                let fields = exprs
                    .iter()
                    .map(|e| {
                        Ok(Field::new(
                            e.output_name(),
                            evaluate(e)?.data_type().clone(),
                            true,
                        ))
                    })
                    .collect::<Result<Vec<_>>>()?;
                Arc::new(Schema::new(fields))
            }
            OpKind::WithColumn(name, e) => {
                let mut fields: Vec<Field> =
                    input.fields().iter().map(|f| f.as_ref().clone()).collect();
                let field = Field::new(name, evaluate(e)?.data_type().clone(), true);
                match input.index_of(name) {
                    Ok(i) => fields[i] = field,
                    Err(_) => fields.push(field),
                }
                Arc::new(Schema::new(fields))
            }
            OpKind::BroadcastJoin(b) => b.join.schema(),
            _ => return Ok(None),
        }))
    };
    match &plan.op {
        LogicalOp::Limit(_) | LogicalOp::Repartition(_) => Ok(Some(input)),
        // A shuffle or distinct keeps the columns; an aggregate makes others.
        LogicalOp::Exchange(e) if e.partial.is_none() => Ok(Some(input)),
        LogicalOp::Exchange(_) => Ok(None),
        LogicalOp::Op(op) => probe(&op.kind),
        LogicalOp::Source { .. } => Ok(None),
    }
}

/// The output batches of a running job. Dropping it cancels the job.
pub struct BatchStream {
    job: Box<dyn JobStream>,
    last_stats: Arc<Mutex<Option<JobStats>>>,
    done: bool,
}

impl BatchStream {
    /// Live counters of the running job.
    pub fn live_stats(&self) -> Arc<Mutex<JobStats>> {
        self.job.live_stats()
    }

    /// The next output's number of rows, without reading its rows (see
    /// [`JobStream::next_rows`]).
    pub fn next_rows(&mut self) -> Option<Result<usize>> {
        if self.done {
            return None;
        }
        let next = self.job.next_rows();
        self.ended_unless(matches!(next, Some(Ok(_))));
        next
    }

    /// The next output, left where a node holds it (see
    /// [`JobStream::next_pulled`]).
    pub fn next_pulled(&mut self) -> Option<Result<Pulled>> {
        if self.done {
            return None;
        }
        let next = self.job.next_pulled();
        self.ended_unless(matches!(next, Some(Ok(_))));
        if let Some(Ok(Pulled::Drained)) = next {
            // Every output is out: the stats are the job's, but for the
            // reads still to come (its end may not be pulled).
            self.keep_stats();
        }
        next
    }

    /// The next held output, if handed over already (see
    /// [`JobStream::next_held_ready`]).
    pub fn next_held_ready(&mut self) -> Option<crate::dataset::held::HeldRows> {
        match self.done {
            true => None,
            false => self.job.next_held_ready(),
        }
    }

    /// Keeps the job's final stats once the stream has ended.
    fn ended_unless(&mut self, more: bool) {
        if more {
            return;
        }
        self.done = true;
        self.keep_stats();
    }

    /// Keeps the job's stats as they are now as its last.
    fn keep_stats(&self) {
        let stats = self
            .job
            .live_stats()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        *self.last_stats.lock().unwrap_or_else(|p| p.into_inner()) = Some(stats);
    }
}

impl Iterator for BatchStream {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = self.job.next();
        self.ended_unless(matches!(next, Some(Ok(_))));
        next
    }
}
