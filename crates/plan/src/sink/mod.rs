//! The file sink (Parquet, CSV, JSON, Arrow IPC; see [`FileFormat`]). Each
//! task writes its rows to one file in a staging directory under a
//! temporary name and renames it when complete; a retried task writes the
//! same name again, so a partition lands once. When the job succeeds the
//! staged files move into the output directory (replacing the `part-*`
//! files of an earlier write in that format); when it fails the staging
//! directory is removed. The output never holds a partial file, nor, after
//! a power loss, lacks both writes' files: files are synced before they
//! are renamed, and the directory after the renames and the removals (see
//! `durable`). A write
//! whose rows were all filtered away still leaves one file, with the schema
//! and no rows, as Spark and pyarrow do.

use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::basic::Compression;
use parquet::file::properties::{DEFAULT_MAX_ROW_GROUP_ROW_COUNT, WriterProperties};
use streambatch_core::TaskId;

use crate::error::{Error, Result};
use crate::object::files::url_of;
use crate::object::local_commit;
use crate::udf::BatchIter;

mod dictionary;
mod durable;
mod format;
mod object_commit;
mod place;
mod resume;

pub use format::FileFormat;
pub(crate) use format::FormatWriter;
pub(crate) use resume::{Journal, Opened, WriteIdentity, open_journal};

/// How a Parquet write compresses and groups its rows.
///
/// ```
/// use parquet::basic::{Compression, ZstdLevel};
/// use streambatch_plan::sink::ParquetWriteOptions;
///
/// let options = ParquetWriteOptions {
///     compression: Compression::ZSTD(ZstdLevel::try_new(9).unwrap()),
///     max_row_group_rows: 10_000,
///     ..Default::default()
/// };
/// assert_eq!(options.codec_name(), "zstd(9)");
/// assert_eq!(ParquetWriteOptions::default().with_codec("zstd(9)").unwrap().compression, options.compression);
/// assert!(ParquetWriteOptions::default().with_codec("zip").is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParquetWriteOptions {
    /// The codec, with its level for gzip, brotli and zstd: Snappy unless
    /// set (what Spark and pyarrow write by default).
    pub compression: Compression,
    /// Rows in a row group at most (the `parquet` crate's default,
    /// 1,048,576): smaller groups let readers skip more by statistics.
    pub max_row_group_rows: usize,
    /// A write killed part way, started again with the same plan, input
    /// and output, runs only what it had not done (see
    /// `Dataset::write_parquet_with`).
    pub resume: bool,
}

impl Default for ParquetWriteOptions {
    fn default() -> Self {
        Self {
            compression: Compression::SNAPPY,
            max_row_group_rows: DEFAULT_MAX_ROW_GROUP_ROW_COUNT,
            resume: false,
        }
    }
}

impl ParquetWriteOptions {
    /// The codec as [`ParquetWriteOptions::with_codec`] reads it:
    /// `snappy`, `zstd(3)`, `gzip(6)`, `brotli(4)`, `lz4`, `uncompressed`.
    pub fn codec_name(&self) -> String {
        match self.compression {
            Compression::UNCOMPRESSED => "uncompressed".into(),
            Compression::SNAPPY => "snappy".into(),
            Compression::GZIP(level) => format!("gzip({})", level.compression_level()),
            Compression::LZO => "lzo".into(),
            Compression::BROTLI(level) => format!("brotli({})", level.compression_level()),
            Compression::LZ4 => "lz4".into(),
            Compression::ZSTD(level) => format!("zstd({})", level.compression_level()),
            Compression::LZ4_RAW => "lz4_raw".into(),
        }
    }

    /// These options with the codec `name` (as [`Self::codec_name`] writes
    /// it; gzip, brotli and zstd need a level).
    pub fn with_codec(self, name: &str) -> Result<Self> {
        let refuse = |why: &dyn std::fmt::Display| {
            Error::Invalid(format!(
                "Parquet compression `{name}`: {why} (one of uncompressed, snappy, lz4, \
                 lz4_raw, gzip(0-9), brotli(0-11), zstd(up to 22))"
            ))
        };
        // The parser reads a level up to the last byte, whatever it is.
        if name.contains('(') && !name.ends_with(')') {
            return Err(refuse(&"a level is written `codec(level)`"));
        }
        let compression = name.parse().map_err(|e| refuse(&e))?;
        if compression == Compression::LZO {
            return Err(refuse(&"the parquet crate cannot write LZO"));
        }
        Ok(Self {
            compression,
            ..self
        })
    }

    /// The writer's properties for a file whose first batch is `first`
    /// (none for a file without rows): the codec and row groups, and no
    /// dictionary for the columns whose values `first` shows nearly unique
    /// (see `dictionary.rs`).
    pub(crate) fn properties(&self, first: Option<&RecordBatch>) -> WriterProperties {
        let plain = first.map(dictionary::plain_columns).unwrap_or_default();
        plain
            .into_iter()
            .fold(WriterProperties::builder(), |builder, column| {
                builder.set_column_dictionary_enabled(column, false)
            })
            .set_compression(self.compression)
            .set_max_row_group_row_count(Some(self.max_row_group_rows.max(1)))
            .build()
    }
}

/// Where a write's tasks put their files, and in what format.
#[derive(Clone, Debug, PartialEq)]
pub struct FileSink {
    /// The write's staging directory.
    pub dir: PathBuf,
    /// The files' format.
    pub format: FileFormat,
}

/// Writes all of `input` to `dir/part-<task>.<extension>`; returns the file
/// and its rows, or nothing when the input had no rows (then, when it had a
/// schema, a hidden file without rows is left for [`commit_staging`]).
pub fn write_part(
    sink: &FileSink,
    task: TaskId,
    input: BatchIter,
) -> Result<Vec<(PathBuf, usize)>> {
    let (dir, ext) = (&sink.dir, sink.format.extension());
    let path = dir.join(format!("part-{:06}.{ext}", task.0));
    // An object appears whole when its upload completes: no rename.
    let object = url_of(dir).is_some();
    let tmp = match object {
        true => path.clone(),
        false => dir.join(format!(".part-{:06}.{ext}.tmp", task.0)),
    };
    let mut writer: Option<FormatWriter> = None;
    let mut schema: Option<SchemaRef> = None;
    let mut rows = 0;
    let result = (|| -> Result<()> {
        for batch in input {
            let batch = batch?;
            if batch.num_rows() == 0 {
                schema.get_or_insert_with(|| batch.schema());
                continue;
            }
            if writer.is_none() {
                let w = FormatWriter::open(&tmp, &path, &batch, &sink.format)?;
                writer = Some(w);
            }
            rows += batch.num_rows();
            writer
                .as_mut()
                .expect("opened above")
                .write(&batch, &path)?;
        }
        Ok(())
    })();
    let Some(writer) = writer else {
        if !object {
            let _ = std::fs::remove_file(&tmp);
        }
        result?;
        if let Some(schema) = schema {
            let empty = dir.join(format!("{EMPTY_PREFIX}{:06}.{ext}", task.0));
            write_empty(&empty, schema, &sink.format)?;
        }
        return Ok(Vec::new());
    };
    // Dropped on an error, an object's upload is aborted.
    let finished = result.and_then(|()| {
        writer.close(&path)?;
        match object {
            true => Ok(()),
            false => durable::sync_file(&tmp).and_then(|()| durable::rename(&tmp, &path)),
        }
    });
    if let Err(e) = finished {
        if !object {
            let _ = std::fs::remove_file(&tmp);
        }
        return Err(e);
    }
    Ok(vec![(path, rows)])
}

/// Names of the files without rows that tasks without rows leave in staging.
pub(crate) const EMPTY_PREFIX: &str = ".empty-";

/// `path` could not be written, for `why`.
pub(crate) fn write_failed(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::WriteFailed {
        path: path.to_path_buf(),
        message: why.to_string(),
    }
}

/// Writes a file with `schema` and no rows at `path`, whole or not at all.
pub(crate) fn write_empty(path: &Path, schema: SchemaRef, format: &FileFormat) -> Result<()> {
    write_whole(path, |tmp| {
        FormatWriter::create(tmp, path, schema, format)?.close(path)
    })
}

/// Writes `path` through `write` (given where to write), beside it first,
/// then synced and renamed into place: whole or not at all, before and
/// after a power loss. An object (`path` a URL) is written in place: it
/// appears when its upload completes.
pub(crate) fn write_whole(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    if url_of(path).is_some() {
        return write(path);
    }
    let tmp = staging_name(path);
    let written = write(&tmp)
        .and_then(|()| durable::sync_file(&tmp))
        .and_then(|()| durable::rename(&tmp, path))
        .and_then(|()| durable::sync_dir(parent_dir(path)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The directory holding `path` (`.` for a bare name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// `.<name>.partial` beside `path`: where a file is written before it is
/// renamed into place.
fn staging_name(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.partial"))
}

/// One write's staging directory inside its output directory.
#[derive(Debug)]
pub struct Staging {
    /// Where the tasks write.
    pub path: PathBuf,
    /// The output directory.
    dir: PathBuf,
    /// The outermost directory the write made on the way to `dir`: a
    /// failed write removes it (and those inside it) when they are empty.
    made: Option<PathBuf>,
    /// The directory's writer lock, held (never read) for the whole
    /// write; local only.
    _lock: Option<std::fs::File>,
    /// In an object store folder, the versions of its manifests as the
    /// write began: its manifest is put only over the same one.
    manifests: std::collections::HashMap<String, crate::object::writes::Version>,
}

/// A fresh staging directory inside `dir` for one write. The staging
/// directories that writers killed before they finished left in `dir`
/// (their process is gone) are removed first.
pub fn create_staging(dir: &Path) -> Result<Staging> {
    if url_of(dir).is_some() {
        return object_commit::create(dir);
    }
    let made = (dir.ancestors())
        .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
        .last();
    let staging = Staging {
        path: PathBuf::new(),
        dir: dir.to_path_buf(),
        made: made.map(Path::to_path_buf),
        _lock: None,
        manifests: Default::default(),
    };
    if let Err(e) = std::fs::create_dir_all(dir) {
        let err = Error::io("creating", dir, e);
        abort_staging(staging);
        return Err(err);
    }
    // One writer at a time: the later of two is refused.
    let lock = match local_commit::lock_for_writing(dir) {
        Ok(lock) => lock,
        Err(e) => {
            abort_staging(staging);
            return Err(e);
        }
    };
    // A commit a killed writer left cut short is finished, not undone.
    if let Err(e) = local_commit::settle(dir, false).map(drop) {
        abort_staging(staging);
        return Err(e);
    }
    remove_abandoned(dir);
    let path = dir.join(local_commit::staging_name());
    let staging = Staging {
        path,
        _lock: Some(lock),
        ..staging
    };
    if let Err(e) = std::fs::create_dir(&staging.path) {
        let err = Error::io("creating", &staging.path, e);
        abort_staging(staging);
        return Err(err);
    }
    Ok(staging)
}

impl Staging {
    /// The output directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// True when no task staged a file, not even a schema-only one.
    pub fn is_empty(&self) -> Result<bool> {
        if url_of(&self.dir).is_some() {
            return object_commit::is_empty(self);
        }
        let mut entries =
            std::fs::read_dir(&self.path).map_err(|e| Error::io("listing", &self.path, e))?;
        Ok(entries.all(|e| {
            e.is_ok_and(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with('.') && !name.starts_with(EMPTY_PREFIX)
            })
        }))
    }

    /// Stages a file with `schema` and no rows, which the commit makes
    /// `part-000000.<extension>` (as a task's file without rows).
    pub fn stage_empty(&self, schema: SchemaRef, format: &FileFormat) -> Result<()> {
        let name = format!("{EMPTY_PREFIX}000000.{}", format.extension());
        write_empty(&self.path.join(name), schema, format)
    }
}

/// Removes `dir`'s staging directories whose writer process is dead.
fn remove_abandoned(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        // One with a commit's record is `settle`'s to finish, not to drop.
        let recorded = local_commit::is_recorded(&entry.path());
        if !recorded && local_commit::writer_is_dead(&entry.file_name().to_string_lossy()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Moves the staged files the tasks `reported` (their names) into the
/// output directory, replacing its earlier `part-*` files of `format`,
/// and removes the staging directory; a reported file not staged fails
/// the write, and a staged one no task reported is not committed. When no
/// task wrote rows, one task's file without rows becomes `part-000000`.
pub fn commit_staging(
    staging: Staging,
    format: &FileFormat,
    reported: &[String],
) -> Result<Vec<PathBuf>> {
    if url_of(&staging.dir).is_some() {
        let committed = object_commit::commit(&staging, format.extension(), reported);
        if committed.is_err() {
            object_commit::abort(&staging);
        }
        return committed;
    }
    let committed = move_staged(&staging, format.extension(), reported);
    // The staging directory goes, unless a commit failed after its record:
    // the next reader or writer finishes it from there.
    if committed.is_ok() || !local_commit::is_recorded(&staging.path) {
        let _ = std::fs::remove_dir_all(&staging.path);
    }
    committed
}

/// Fails when a file a task reported writing is not among `staged`.
pub(crate) fn check_reported<'a>(
    staging: &Path,
    reported: &[String],
    staged: impl Iterator<Item = &'a str>,
) -> Result<()> {
    let staged: std::collections::HashSet<&str> = staged.collect();
    match reported.iter().find(|name| !staged.contains(name.as_str())) {
        Some(missing) => Err(Error::WriteFailed {
            path: staging.join(missing),
            message: "its task reported it written, but it is not in the staging directory; nothing was committed".into(),
        }),
        None => Ok(()),
    }
}

/// Records what it will do (`local_commit::begin`), renames the staged
/// files in (replacing earlier parts of the same name), then removes the
/// earlier parts not replaced: a failure part way loses no file of either
/// write, and a kill part way leaves the record, from which the next
/// reader or writer of the directory finishes it. The staged files were synced when written;
/// the directory is synced after the renames, so that a power loss cannot
/// leave the old parts removed but the new names not yet on disk, and
/// after the removals, so that the write is on disk when it returns.
fn move_staged(staging: &Staging, extension: &str, reported: &[String]) -> Result<Vec<PathBuf>> {
    let (path, dir) = (&staging.path, &staging.dir);
    let mut staged = Vec::new();
    let mut empty = None;
    for entry in std::fs::read_dir(path)
        .map_err(|e| Error::io("listing", path, e))?
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(EMPTY_PREFIX) {
            empty.get_or_insert(entry.path());
        } else if !name.starts_with('.') && reported.contains(&name) {
            staged.push((entry.path(), name));
        }
    }
    check_reported(path, reported, staged.iter().map(|(_, name)| name.as_str()))?;
    if let (true, Some(empty)) = (staged.is_empty(), empty) {
        staged.push((empty, format!("part-000000.{extension}")));
    }
    // From here a kill leaves the commit to be finished by the next
    // reader or writer of the directory.
    local_commit::begin(path, extension, &staged)?;
    let mut committed = Vec::new();
    for (from, name) in &staged {
        let target = dir.join(name);
        durable::rename(from, &target)?;
        committed.push(target);
    }
    if !committed.is_empty() {
        durable::sync_dir(dir)?;
        sync_made_dirs(staging)?;
    }
    #[cfg(feature = "failpoints")]
    commit_pause();
    let mut removed = false;
    for old in std::fs::read_dir(dir)
        .map_err(|e| Error::io("listing", dir, e))?
        .flatten()
    {
        let name = old.file_name().to_string_lossy().into_owned();
        let replaced = staged.iter().any(|(_, n)| *n == name);
        let part = name.starts_with("part-") && name.ends_with(&format!(".{extension}"));
        if part && !replaced {
            durable::remove_file(&old.path())?;
            removed = true;
        }
    }
    if removed {
        durable::sync_dir(dir)?;
    }
    committed.sort();
    Ok(committed)
}

/// Sleeps as `SB_FAILPOINTS=commit.pause=MS` says, between a local
/// commit's renames and its removals (where a kill would mix two writes
/// but for the commit's record), and between an object-store commit's
/// copies and its manifest.
#[cfg(feature = "failpoints")]
pub(crate) fn commit_pause() {
    let spec = std::env::var("SB_FAILPOINTS").unwrap_or_default();
    let ms = spec
        .split(';')
        .find_map(|f| f.strip_prefix("commit.pause=")?.parse().ok());
    if let Some(ms) = ms {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Syncs the parents of the directories this write made on the way to its
/// output directory, from the nearest up: each new directory is an entry
/// of its parent, and a power loss must not lose the output's path with
/// its files on disk.
fn sync_made_dirs(staging: &Staging) -> Result<()> {
    let Some(made) = &staging.made else {
        return Ok(());
    };
    for new in staging.dir.ancestors() {
        let parent = match new.parent() {
            Some(p) if p.as_os_str().is_empty() => Path::new("."),
            Some(p) => p,
            None => break,
        };
        durable::sync_dir(parent)?;
        if new == made {
            break;
        }
    }
    Ok(())
}

/// Removes a failed write's staging directory, and the directories the
/// write made on the way to its output directory when nothing else is in
/// them.
pub fn abort_staging(staging: Staging) {
    if url_of(&staging.dir).is_some() {
        return object_commit::abort(&staging);
    }
    // A cancelled task may still be creating a file as the directory goes:
    // a second pass removes what the first one missed (once the directory
    // is gone, no file can be made in it).
    for _ in 0..3 {
        if staging.path.as_os_str().is_empty()
            || std::fs::remove_dir_all(&staging.path).is_ok()
            || !staging.path.exists()
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let Some(made) = &staging.made else {
        return;
    };
    for dir in staging.dir.ancestors() {
        // Fails, as it should, when something else is there now.
        if std::fs::remove_dir(dir).is_err() || dir == made {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array, RecordBatch};

    use super::durable::{Op, recorded};
    use super::*;

    fn rows() -> BatchIter {
        let x: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
        Box::new(std::iter::once(Ok(
            RecordBatch::try_from_iter([("x", x)]).unwrap()
        )))
    }

    #[test]
    fn a_parquet_part_keeps_a_dictionary_only_for_columns_whose_values_repeat() {
        use parquet::basic::Encoding;
        use parquet::file::reader::{FileReader, SerializedFileReader};

        let dir = tempfile::tempdir().unwrap();
        let sink = FileSink {
            dir: dir.path().to_path_buf(),
            format: FileFormat::Parquet(ParquetWriteOptions::default()),
        };
        let n = 20_000;
        let id: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n));
        let few: ArrayRef = Arc::new(Int64Array::from_iter_values((0..n).map(|i| i % 7)));
        let batch = RecordBatch::try_from_iter([("id", id), ("few", few)]).unwrap();
        let input: BatchIter = Box::new(std::iter::once(Ok(batch)));
        let written = write_part(&sink, TaskId(1), input).unwrap();
        let file = std::fs::File::open(&written[0].0).unwrap();
        let reader = SerializedFileReader::new(file).unwrap();
        let group = reader.metadata().row_group(0);
        let dictionary = |c: usize| {
            let column = group.column(c);
            column.dictionary_page_offset().is_some()
                && column.encodings().any(|e| e == Encoding::RLE_DICTIONARY)
        };
        assert!(!dictionary(0), "unique ids are written plain");
        assert!(dictionary(1), "seven values keep their dictionary");
        assert_eq!(reader.metadata().file_metadata().num_rows(), n);
    }

    #[test]
    fn a_commit_syncs_files_before_renaming_and_the_directory_before_removing() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("out");
        let format = FileFormat::Csv;
        // An earlier write's part that this one does not replace.
        std::fs::create_dir(&dir).unwrap();
        let old = dir.join("part-000009.csv");
        std::fs::write(&old, "x\n9\n").unwrap();
        let staging = create_staging(&dir).unwrap();
        let sink = FileSink {
            dir: staging.path.clone(),
            format,
        };
        let staged = staging.path.clone();
        let (committed, ops) = recorded(|| {
            write_part(&sink, TaskId(1), rows()).unwrap();
            commit_staging(staging, &format, &["part-000001.csv".into()]).unwrap()
        });
        let part = dir.join("part-000001.csv");
        assert_eq!(committed, vec![part.clone()]);
        let tmp = staged.join(".part-000001.csv.tmp");
        let expected = vec![
            // The task's file: its bytes on disk before its name.
            Op::SyncFile(tmp.clone()),
            Op::Rename(tmp, staged.join("part-000001.csv")),
            // The commit: the new names on disk before the old parts go,
            // and the removals on disk before the write returns.
            Op::Rename(staged.join("part-000001.csv"), part),
            Op::SyncDir(dir.clone()),
            Op::Remove(old),
            Op::SyncDir(dir),
        ];
        assert_eq!(ops, expected);
    }

    /// The commit takes what the tasks reported: a reported part missing
    /// from staging fails the write before anything moves (the earlier
    /// write stays whole), and a staged file no task reported (a stray, a
    /// dead attempt's) is never committed. Before, the commit moved
    /// whatever staging listed.
    #[test]
    fn a_commit_takes_what_the_tasks_reported_and_fails_on_a_missing_one() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("out");
        let format = FileFormat::Csv;
        std::fs::create_dir(&dir).unwrap();
        let old = dir.join("part-000009.csv");
        std::fs::write(&old, "x\n9\n").unwrap();
        let reported: Vec<String> = ["part-000001.csv", "part-000002.csv"]
            .map(String::from)
            .to_vec();
        let stage = |missing: bool| {
            let staging = create_staging(&dir).unwrap();
            let sink = FileSink {
                dir: staging.path.clone(),
                format,
            };
            write_part(&sink, TaskId(1), rows()).unwrap();
            write_part(&sink, TaskId(2), rows()).unwrap();
            write_part(&sink, TaskId(3), rows()).unwrap(); // reported by none
            if missing {
                std::fs::remove_file(staging.path.join("part-000002.csv")).unwrap();
            }
            staging
        };
        let err = commit_staging(stage(true), &format, &reported)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("part-000002.csv") && err.contains("not in the staging"),
            "{err}"
        );
        let names = || {
            let mut names: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        assert_eq!(
            names(),
            ["part-000009.csv"],
            "the earlier write is untouched"
        );
        let committed = commit_staging(stage(false), &format, &reported).unwrap();
        assert_eq!(
            committed,
            [dir.join("part-000001.csv"), dir.join("part-000002.csv")]
        );
        assert_eq!(names(), ["part-000001.csv", "part-000002.csv"]);
    }

    #[test]
    fn a_commit_into_new_directories_syncs_each_new_one_into_its_parent() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("a").join("b");
        let format = FileFormat::Csv;
        let staging = create_staging(&dir).unwrap();
        let sink = FileSink {
            dir: staging.path.clone(),
            format,
        };
        let (_, ops) = recorded(|| {
            write_part(&sink, TaskId(1), rows()).unwrap();
            commit_staging(staging, &format, &["part-000001.csv".into()]).unwrap()
        });
        let synced: Vec<&Op> = ops
            .iter()
            .filter(|op| matches!(op, Op::SyncDir(_)))
            .collect();
        let expected = [&dir, &out.path().join("a"), &out.path().to_path_buf()];
        let expected: Vec<Op> = expected.iter().map(|d| Op::SyncDir((*d).clone())).collect();
        assert_eq!(synced, expected.iter().collect::<Vec<_>>());
    }

    #[test]
    fn a_whole_file_is_synced_before_its_rename_and_its_directory_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace.json");
        let tmp = staging_name(&path);
        let (written, ops) = recorded(|| {
            write_whole(&path, |tmp| {
                std::fs::write(tmp, b"{}").map_err(|e| Error::io("writing", tmp, e))
            })
        });
        written.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        let expected = vec![
            Op::SyncFile(tmp.clone()),
            Op::Rename(tmp, path),
            Op::SyncDir(dir.path().to_path_buf()),
        ];
        assert_eq!(ops, expected);
    }
}
