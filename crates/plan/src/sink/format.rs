//! The formats a write's files can be in, and a writer for each: Parquet
//! (with its codec and row groups), CSV with a header row,
//! newline-delimited JSON, and Arrow IPC files.

use std::io::Write;
use std::path::Path;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use streambatch_core::DirectWriter;

use super::{ParquetWriteOptions, write_failed};
use crate::error::Result;
use crate::object::files::url_of;
use crate::object::writes::ObjectUpload;

/// The format of a write's files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileFormat {
    /// Parquet, with its codec and row groups.
    Parquet(ParquetWriteOptions),
    /// CSV with a header row (an empty result: the header alone).
    Csv,
    /// One JSON object per line (an empty result: an empty file).
    Json,
    /// An Arrow IPC file (an empty result: the schema alone).
    Ipc,
}

impl FileFormat {
    /// The files' extension: `parquet`, `csv`, `json`, `arrow`.
    pub fn extension(&self) -> &'static str {
        match self {
            Self::Parquet(_) => "parquet",
            Self::Csv => "csv",
            Self::Json => "json",
            Self::Ipc => "arrow",
        }
    }

    /// The format whose files end in `extension` (Parquet with `parquet`).
    pub fn of_extension(extension: &str, parquet: ParquetWriteOptions) -> Option<Self> {
        match extension {
            "parquet" => Some(Self::Parquet(parquet)),
            "csv" => Some(Self::Csv),
            "json" => Some(Self::Json),
            "arrow" => Some(Self::Ipc),
            _ => None,
        }
    }
}

/// The most bytes a Parquet row group holds in memory before it is written
/// (it ends sooner at its row limit): two tasks writing wide rows would
/// otherwise each hold up to a million of them. Small enough that a file
/// has several, so that one is written (behind the task, see
/// `DirectWriter`) while the task encodes the next.
const ROW_GROUP_BYTES: usize = 8 << 20;

/// Where a written file's bytes go: a local file, written by direct I/O
/// where the file system allows it (a job's output is written once and not
/// read back by the job, so a copy into the page cache would only cost; see
/// `streambatch_core::DirectWriter`, which also buffers), or an object,
/// uploaded as it is written.
pub(crate) enum Output {
    File(DirectWriter),
    Object(Box<ObjectUpload>),
}

impl Output {
    /// A new file at `path`, or a new object when `path` is a URL; an error
    /// names `target`, what it becomes.
    fn create(path: &Path, target: &Path) -> Result<Self> {
        if let Some(url) = url_of(path) {
            return Ok(Self::Object(Box::new(ObjectUpload::create(url)?)));
        }
        // A file left by an attempt that failed is replaced (the name is
        // the task's own, in the job's staging directory).
        let _ = std::fs::remove_file(path);
        let file = DirectWriter::create_new(path, 0o666).map_err(|e| write_failed(target, e))?;
        Ok(Self::File(file))
    }

    fn finish(self, target: &Path) -> Result<()> {
        match self {
            Self::File(file) => file.finish().map(drop).map_err(|e| write_failed(target, e)),
            Self::Object(upload) => upload.finish(),
        }
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::File(file) => file.write(buf),
            Self::Object(upload) => upload.write(buf),
        }
    }

    /// Parquet flushes its sink at the end of every column chunk. A file's
    /// bytes reach the disk in whole chunks and at `finish`: a flush here
    /// would only force a short write the task waits for.
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::File(_) => Ok(()),
            Self::Object(upload) => upload.flush(),
        }
    }
}

/// A file being written in one of the formats.
pub(crate) enum FormatWriter {
    Parquet(ArrowWriter<Output>),
    Csv(arrow_csv::Writer<Output>),
    Json(arrow_json::LineDelimitedWriter<Output>),
    Ipc(arrow_ipc::writer::FileWriter<Output>),
}

impl FormatWriter {
    /// A writer of `schema` into a new file at `tmp` (an object when it is
    /// a URL), its errors naming `path`, the file it becomes.
    pub(crate) fn create(
        tmp: &Path,
        path: &Path,
        schema: SchemaRef,
        format: &FileFormat,
    ) -> Result<Self> {
        Self::new(tmp, path, schema, None, format)
    }

    /// A writer into a new file at `tmp` whose first batch is `first` (not
    /// yet written: the caller writes it), which shows how its columns are
    /// best encoded.
    pub(crate) fn open(
        tmp: &Path,
        path: &Path,
        first: &RecordBatch,
        format: &FileFormat,
    ) -> Result<Self> {
        Self::new(tmp, path, first.schema(), Some(first), format)
    }

    fn new(
        tmp: &Path,
        path: &Path,
        schema: SchemaRef,
        first: Option<&RecordBatch>,
        format: &FileFormat,
    ) -> Result<Self> {
        let file = Output::create(tmp, path)?;
        let failed = |e: arrow_schema::ArrowError| write_failed(path, e);
        Ok(match format {
            FileFormat::Parquet(options) => {
                let properties = Some(options.properties(first));
                let writer = ArrowWriter::try_new(file, schema, properties);
                Self::Parquet(writer.map_err(|e| write_failed(path, e))?)
            }
            FileFormat::Csv => {
                let mut writer = arrow_csv::Writer::new(file);
                // The header, so that a file without rows still has it.
                writer
                    .write(&RecordBatch::new_empty(schema))
                    .map_err(failed)?;
                Self::Csv(writer)
            }
            FileFormat::Json => Self::Json(arrow_json::LineDelimitedWriter::new(file)),
            FileFormat::Ipc => {
                let writer =
                    arrow_ipc::writer::FileWriter::try_new(file, &schema).map_err(failed)?;
                Self::Ipc(writer)
            }
        })
    }

    /// Appends `batch`; an error names `path`.
    pub(crate) fn write(&mut self, batch: &RecordBatch, path: &Path) -> Result<()> {
        match self {
            Self::Parquet(w) => {
                w.write(batch).map_err(|e| write_failed(path, e))?;
                // A row group is held encoded in memory until it is written.
                if w.in_progress_size() >= ROW_GROUP_BYTES {
                    w.flush().map_err(|e| write_failed(path, e))?;
                }
                Ok(())
            }
            Self::Csv(w) => w.write(batch).map_err(|e| write_failed(path, e)),
            Self::Json(w) => w.write(batch).map_err(|e| write_failed(path, e)),
            Self::Ipc(w) => w.write(batch).map_err(|e| write_failed(path, e)),
        }
    }

    /// Finishes the file (footer, flush) and closes it.
    pub(crate) fn close(self, path: &Path) -> Result<()> {
        let failed = |e: &dyn std::fmt::Display| write_failed(path, e);
        let file = match self {
            Self::Parquet(w) => w.into_inner().map_err(|e| failed(&e))?,
            Self::Csv(w) => w.into_inner(),
            Self::Json(mut w) => {
                w.finish().map_err(|e| failed(&e))?;
                w.into_inner()
            }
            Self::Ipc(mut w) => {
                w.finish().map_err(|e| failed(&e))?;
                w.into_inner().map_err(|e| failed(&e))?
            }
        };
        file.finish(path)
    }
}
