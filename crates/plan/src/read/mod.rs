//! The readers a source task runs: Parquet (`parquet`, with row groups
//! pruned by their statistics, `prune`), images (`images`), the simpler
//! formats and the finding of files (`files`), and which rows of a split a
//! sample keeps (`row_sample`). This module holds what every reader
//! shares: the rows per batch, opening a file on a local disk or in an
//! object store, and a schema's projection and description for errors.
//!
//! It imports `udf` (expressions, for pruning) and `object` below it;
//! which reader a split needs is decided above, in `logical::source`.

pub(crate) mod files;
pub(crate) mod images;
pub(crate) mod parquet;
pub(crate) mod prune;
pub(crate) mod row_sample;

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow_schema::{Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::object::files::ObjectFile;

/// Rows per batch that readers produce; partitions are cut from these.
pub(crate) const READ_BATCH_ROWS: usize = 8192;

/// A file to read: on a local disk or in an object store.
pub(crate) enum Input {
    Local(File),
    Object(ObjectFile),
}

impl std::io::Read for Input {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Input::Local(file) => file.read(buf),
            Input::Object(object) => object.read(buf),
        }
    }
}

impl std::io::Seek for Input {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        match self {
            Input::Local(file) => file.seek(to),
            Input::Object(object) => object.seek(to),
        }
    }
}

/// Opens `path` (a local path or an object store URL) to read it, an
/// error naming it.
pub(crate) fn open_file(path: &Path) -> Result<Input> {
    match crate::object::files::url_of(path) {
        Some(url) => Ok(Input::Object(ObjectFile::open(url)?)),
        None => File::open(path)
            .map(Input::Local)
            .map_err(|e| Error::io("opening", path, e)),
    }
}

/// The size of the file or object at `path`.
pub(crate) fn file_size(path: &Path) -> Result<u64> {
    match crate::object::files::url_of(path) {
        Some(url) => Ok(ObjectFile::open(url)?.size()),
        None => std::fs::metadata(path)
            .map(|m| m.len())
            .map_err(|e| Error::io("reading the size of", path, e)),
    }
}

pub(crate) fn project(schema: &SchemaRef, columns: Option<&[String]>) -> Result<SchemaRef, String> {
    let Some(columns) = columns else {
        return Ok(schema.clone());
    };
    let fields = columns
        .iter()
        .map(|c| {
            schema
                .field_with_name(c)
                .cloned()
                .map_err(|_| format!("no column `{c}`"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(Schema::new(fields)))
}

pub(crate) fn describe_schema(schema: &Schema) -> String {
    let fields: Vec<_> = schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect();
    format!("[{}]", fields.join(", "))
}
