//! Writing a dataset's rows to files: part files per task in a directory
//! or an object store folder (all or nothing, see `sink`), one file, or a
//! resumable write that a kill does not send back to the start.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::SchemaRef;
use streambatch_core::StageOptions;

use crate::dataset::{Dataset, static_schema};
use crate::error::{Error, Result};
use crate::logical::ops::{OpKind, OpSpec};
use crate::logical::plan::{LogicalOp, LogicalPlan};
use crate::logical::source::SourceSplit;
use crate::sink::{
    FileFormat, FileSink, FormatWriter, Journal, Opened, ParquetWriteOptions, Staging,
    WriteIdentity, abort_staging, commit_staging, create_staging, open_journal, write_whole,
};

/// Waves a resumable write's source splits run in (at most): a kill costs
/// at most the wave it cut short.
const RESUME_WAVES: usize = 8;

/// What a resumable write did ([`Dataset::write_resumable`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumedWrite {
    /// The files written, sorted.
    pub files: Vec<PathBuf>,
    /// The source splits this run read (the rest were done before).
    pub splits_run: usize,
    /// The source's splits in all.
    pub splits: usize,
}

impl Dataset {
    /// Writes the rows as Snappy Parquet files `part-*.parquet` in `dir`,
    /// one per task, replacing an earlier write's part files (see
    /// [`Dataset::write_parquet_with`] for the codec and row groups).
    pub fn write_parquet(&self, dir: impl AsRef<Path>) -> Result<Vec<PathBuf>> {
        self.write_parquet_with(dir, &ParquetWriteOptions::default())
    }

    /// Writes the rows as Parquet files `part-*.parquet` in `dir`, one per
    /// task, with `options`' codec and row groups, replacing an earlier
    /// write's part files. All or nothing: files appear only when the whole
    /// job has succeeded, and a failed write leaves `dir` as it was (it is
    /// removed if the write made it). A result with no rows is one file
    /// with the schema.
    ///
    /// With `options.resume`, the write can be killed and started again:
    /// see [`Dataset::write_resumable`](Self::write_resumable).
    pub fn write_parquet_with(
        &self,
        dir: impl AsRef<Path>,
        options: &ParquetWriteOptions,
    ) -> Result<Vec<PathBuf>> {
        let format = FileFormat::Parquet(*options);
        match options.resume {
            true => Ok(self.write_resumable(dir.as_ref(), format)?.files),
            false => self.write_files(dir.as_ref(), format, "write_parquet"),
        }
    }

    /// Writes the rows as CSV files with a header row, `part-*.csv` in
    /// `dir`, one per task, as [`Dataset::write_parquet_with`] writes
    /// Parquet (all or nothing; a result with no rows is a file with the
    /// header).
    pub fn write_csv(&self, dir: impl AsRef<Path>) -> Result<Vec<PathBuf>> {
        self.write_files(dir.as_ref(), FileFormat::Csv, "write_csv")
    }

    /// Writes the rows as newline-delimited JSON, `part-*.json` in `dir`,
    /// one object per row and a file per task, as
    /// [`Dataset::write_parquet_with`] writes Parquet.
    pub fn write_json(&self, dir: impl AsRef<Path>) -> Result<Vec<PathBuf>> {
        self.write_files(dir.as_ref(), FileFormat::Json, "write_json")
    }

    /// Writes the rows as Arrow IPC files, `part-*.arrow` in `dir`, a file
    /// per task, as [`Dataset::write_parquet_with`] writes Parquet.
    pub fn write_ipc(&self, dir: impl AsRef<Path>) -> Result<Vec<PathBuf>> {
        self.write_files(dir.as_ref(), FileFormat::Ipc, "write_ipc")
    }

    fn write_files(&self, dir: &Path, format: FileFormat, name: &str) -> Result<Vec<PathBuf>> {
        let staging = create_staging(dir)?;
        let op = write_op(&staging.path, format, name);
        let plan = Arc::new(LogicalPlan {
            input: Some(self.plan.clone()),
            op,
        });
        // The names of the files the tasks report (the commit takes those
        // alone, and fails if one is not staged); each output is dropped as
        // it is read: held, it would keep its share of a node's memory.
        let mut reported = Vec::new();
        let staged = self
            .start(plan)
            .and_then(|mut stream| {
                stream.try_for_each(|output| {
                    reported.extend(reported_parts(&output?)?);
                    Ok(())
                })
            })
            .and_then(|_| self.stage_schema_if_empty(&staging, &format));
        match staged {
            Ok(()) => commit_staging(staging, &format, &reported),
            Err(e) => {
                abort_staging(staging);
                Err(e)
            }
        }
    }

    /// When no task staged a file (there was no input at all), stages one
    /// with the plan's schema, or fails when that is known only from rows:
    /// a write always leaves a file with the schema.
    fn stage_schema_if_empty(&self, staging: &Staging, format: &FileFormat) -> Result<()> {
        if !staging.is_empty()? {
            return Ok(());
        }
        let schema = self.schema_without_rows(staging.dir())?;
        staging.stage_empty(schema, format)
    }

    /// The schema of a write with no rows, for its schema-only file: known
    /// from the plan, or an error naming `target`.
    fn schema_without_rows(&self, target: &Path) -> Result<SchemaRef> {
        static_schema(&self.plan)?.ok_or_else(|| {
            Error::Invalid(format!(
                "cannot write {}: the dataset has no rows, and its schema is known only from rows",
                target.display()
            ))
        })
    }

    /// Writes the rows to the one Snappy Parquet file `path` (see
    /// [`Dataset::write_parquet_file_with`]).
    pub fn write_parquet_file(&self, path: impl AsRef<Path>) -> Result<PathBuf> {
        self.write_parquet_file_with(path, &ParquetWriteOptions::default())
    }

    /// Writes the rows to the one Parquet file `path`, in the order the job
    /// yields them, with `options`' codec and row groups: the batches
    /// stream to this process, which writes them as they come. The file
    /// appears whole or not at all (it is written beside `path`, then
    /// renamed), replacing an earlier one. A result with no rows is a file
    /// with the schema.
    pub fn write_parquet_file_with(
        &self,
        path: impl AsRef<Path>,
        options: &ParquetWriteOptions,
    ) -> Result<PathBuf> {
        let path = path.as_ref();
        let format = FileFormat::Parquet(*options);
        write_whole(path, |tmp| {
            let (mut writer, mut schema) = (None, None);
            for batch in self.iter_batches()? {
                let batch = batch?;
                // The file opens on its first rows, which pick its encodings.
                if batch.num_rows() == 0 {
                    schema.get_or_insert_with(|| batch.schema());
                    continue;
                }
                if writer.is_none() {
                    writer = Some(FormatWriter::open(tmp, path, &batch, &format)?);
                }
                writer.as_mut().expect("opened above").write(&batch, path)?;
            }
            match writer {
                Some(w) => w.close(path),
                None => {
                    let schema = match schema {
                        Some(schema) => schema,
                        None => self.schema_without_rows(path)?,
                    };
                    FormatWriter::create(tmp, path, schema, &format)?.close(path)
                }
            }
        })?;
        Ok(path.to_path_buf())
    }

    /// Writes as [`Dataset::write_parquet_with`] does, resumably: the
    /// source's splits run in up to 8 waves, a job each, and the parts of
    /// each wave that succeeds are recorded in a journal in `dir`
    /// (`.streambatch-resume/`, hidden). Killed at any point and started
    /// again with the same plan, input and output, the write skips the
    /// splits of the recorded waves and runs the rest; the output holds
    /// the rows of an uninterrupted run, none missing or twice, with no id
    /// column. A plan or input that changed since (a step, a file's size
    /// or modification time, an object's version) is refused, naming what
    /// differs. The rows appear in `dir` when every wave is done, as a
    /// write's do; `dir` is a local directory or an object store folder
    /// (its journal kept in the bucket, so a write resumes from any
    /// machine).
    ///
    /// Only plans whose rows each come from one source split resume (no
    /// `limit`, `repartition` or all-to-all step).
    /// [`Dataset::stats`] is then the last wave's job's.
    ///
    /// ```
    /// # use streambatch_plan::sink::FileFormat;
    /// # fn example(ds: &streambatch_plan::Dataset) -> streambatch_plan::Result<()> {
    /// let written = ds.write_resumable("out/embeddings".as_ref(), FileFormat::Csv)?;
    /// println!("ran {} of {} source splits", written.splits_run, written.splits);
    /// # Ok(())
    /// # }
    /// ```
    pub fn write_resumable(&self, dir: &Path, format: FileFormat) -> Result<ResumedWrite> {
        let name = format!("write_{}", format.extension());
        let (splits, steps) = resumable_parts(&self.plan, dir)?;
        let identity = WriteIdentity {
            format: format_identity(&format),
            steps,
            splits: splits_identity(&splits)?,
        };
        let mut journal = match open_journal(dir, &identity, true)? {
            Opened::Committed(files) => {
                return Ok(ResumedWrite {
                    files,
                    splits_run: 0,
                    splits: splits.len(),
                });
            }
            Opened::Journal(journal) => journal,
        };
        let done = journal.done_splits();
        let rest: Vec<usize> = (0..splits.len()).filter(|s| !done.contains(s)).collect();
        let wave = splits.len().div_ceil(RESUME_WAVES).max(1);
        for chunk in rest.chunks(wave) {
            self.run_wave(&mut journal, &splits, chunk, &format, &name)?;
        }
        if !journal.has_parts() {
            // No split had a row, nor a schema: one with the plan's.
            let schema = self.schema_without_rows(dir)?;
            let (k, folder) = journal.next_wave()?;
            let part = format!("part-000000.{}", format.extension());
            crate::sink::write_empty(&folder.join(&part), schema, &format)?;
            journal.finish_wave(k, &[], &[part])?;
        }
        Ok(ResumedWrite {
            files: journal.commit(format.extension())?,
            splits_run: rest.len(),
            splits: splits.len(),
        })
    }

    /// Runs the source splits `chosen` (of `splits`) through the plan into
    /// the journal's next wave, and records it.
    fn run_wave(
        &self,
        journal: &mut Journal,
        splits: &[SourceSplit],
        chosen: &[usize],
        format: &FileFormat,
        name: &str,
    ) -> Result<()> {
        let (k, folder) = journal.next_wave()?;
        let mut ops = self.plan.chain();
        if let Some(LogicalOp::Source { splits: source, .. }) = ops.first_mut() {
            *source = chosen.iter().map(|&s| splits[s].clone()).collect();
        }
        ops.push(write_op(&folder, *format, name));
        let mut plan = None;
        for op in ops {
            plan = Some(Arc::new(LogicalPlan { input: plan, op }));
        }
        let mut stream = self.start(plan.expect("a chain starts at its source"))?;
        let mut reported = Vec::new();
        stream.try_for_each(|output| {
            reported.extend(reported_parts(&output?)?);
            Ok::<(), Error>(())
        })?;
        journal.finish_wave(k, chosen, &reported)
    }
}

/// The write step of a plan: `name`, into `dir`, in `format`.
fn write_op(dir: &Path, format: FileFormat, name: &str) -> LogicalOp {
    LogicalOp::Op(OpSpec {
        name: name.into(),
        kind: OpKind::WriteFiles(FileSink {
            dir: dir.to_path_buf(),
            format,
        }),
        options: StageOptions::default(),
    })
}

/// The file names a write task's output (`path`, `rows`) reports; an
/// output without them fails the write (its commit would move nothing).
fn reported_parts(output: &arrow_array::RecordBatch) -> Result<Vec<String>> {
    use arrow_array::cast::AsArray;
    let paths = output
        .column_by_name("path")
        .and_then(|paths| paths.as_string_opt::<i32>())
        .ok_or_else(|| Error::Invalid("a write task's output has no `path` column".into()))?;
    Ok(paths
        .iter()
        .flatten()
        .filter_map(|p| Path::new(p).file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .collect())
}

/// A step as a resumed write must find it again: its name and what it
/// was given (an expression, its columns, an operator's recipe: the
/// name it is registered under, a hash of its parameters, its blobs), so
/// that a changed predicate, projection or parameter is refused rather
/// than resumed. A closure has no parameters to compare: give it a
/// recipe, or a new name, when its code changes.
fn step_identity(op: &OpSpec) -> String {
    let given = match &op.kind {
        OpKind::Filter(crate::udf::Predicate::Expr(e)) => e.to_string(),
        OpKind::Select(columns) => {
            let columns: Vec<String> = columns.iter().map(ToString::to_string).collect();
            columns.join(", ")
        }
        OpKind::WithColumn(name, e) => format!("{name} = {e}"),
        OpKind::MapBatches(udf) => match udf.recipe() {
            Some(recipe) => format!(
                "recipe {} params {:016x} blobs [{}]",
                recipe.name,
                streambatch_core::fnv1a(&recipe.params),
                recipe.blobs.join(", ")
            ),
            None => "a closure".into(),
        },
        _ => "a closure".into(),
    };
    format!("{}({given})", op.name)
}

/// A resumable plan's source splits and its steps' identities; an error
/// when its rows may not each come from one split.
fn resumable_parts(plan: &Arc<LogicalPlan>, dir: &Path) -> Result<(Vec<SourceSplit>, Vec<String>)> {
    let refuse = |why: String| {
        Err(Error::Invalid(format!(
            "cannot write {} resumably: {why}",
            dir.display()
        )))
    };
    let mut ops = plan.chain().into_iter();
    let Some(LogicalOp::Source { splits, .. }) = ops.next() else {
        return refuse("the plan does not start at a source".into());
    };
    let mut steps = Vec::new();
    for op in ops {
        match op {
            LogicalOp::Op(op) if !matches!(op.kind, OpKind::Reduce(_) | OpKind::WriteFiles(_)) => {
                steps.push(step_identity(&op))
            }
            LogicalOp::Op(op) => {
                return refuse(format!(
                    "its step `{}` mixes rows of several splits",
                    op.name
                ));
            }
            LogicalOp::Limit(_) => return refuse("`limit` depends on which splits ran".into()),
            LogicalOp::Repartition(_) | LogicalOp::Exchange(_) => {
                return refuse(
                    "an all-to-all step (repartition, sort, group, join) mixes rows of every split"
                        .into(),
                );
            }
            LogicalOp::Source { .. } => return refuse("a second source".into()),
        }
    }
    if splits
        .iter()
        .any(|s| matches!(s, SourceSplit::Side { .. } | SourceSplit::Sampled { .. }))
    {
        return refuse("its source is made by another job".into());
    }
    Ok((splits, steps))
}

/// A format as a resumed write compares it: extension, then the codec and
/// row groups for Parquet.
fn format_identity(format: &FileFormat) -> String {
    match format {
        FileFormat::Parquet(o) => format!("parquet {} {}", o.codec_name(), o.max_row_group_rows),
        other => other.extension().to_string(),
    }
}

/// Each split as a resumed write compares it: what it reads, with each
/// file's size and modification time, or each object's size and version
/// tag (a batch given by the user: its rows and bytes).
fn splits_identity(splits: &[SourceSplit]) -> Result<Vec<String>> {
    let files: Vec<Vec<&Path>> = splits.iter().map(SourceSplit::files).collect();
    let urls: Vec<&str> = files
        .iter()
        .flatten()
        .filter_map(|f| crate::object::files::url_of(f))
        .collect();
    let versions = crate::object::files::versions(&urls)?;
    let file = |f: &&Path| match crate::object::files::url_of(f) {
        Some(url) => match versions.get(url) {
            Some((size, version)) => format!("{url} ({size} bytes, version {version})"),
            None => format!("{url} (absent)"),
        },
        None => file_identity(f),
    };
    Ok(splits
        .iter()
        .zip(&files)
        .map(|(split, files)| match (files.is_empty(), split) {
            (true, SourceSplit::Batch(batch)) => format!(
                "a batch of {} rows, {} bytes",
                batch.num_rows(),
                batch.get_array_memory_size()
            ),
            (true, other) => format!("{other:?}"),
            (false, _) => files.iter().map(file).collect::<Vec<_>>().join(", "),
        })
        .collect())
}

/// A local file as a resumed write compares it: its size and modification
/// time.
fn file_identity(f: &Path) -> String {
    match std::fs::metadata(f) {
        Ok(m) => {
            let modified = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
            format!(
                "{} ({} bytes, modified {:?})",
                f.display(),
                m.len(),
                modified.unwrap_or_default()
            )
        }
        Err(_) => format!("{} (absent)", f.display()),
    }
}
