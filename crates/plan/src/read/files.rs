//! The readers of local files in the simpler formats (CSV, JSON, Arrow
//! IPC, text, binary files), their schemas, and the expansion of a path or
//! glob into the files it names.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{ArrayBuilder, StringBuilder};
use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result, bad_file};
use crate::object::files::ObjectFile;
pub use crate::read::parquet::parquet_schema;
use crate::read::{READ_BATCH_ROWS, describe_schema, open_file};
use crate::udf::BatchIter;

/// Integers `start..end` in a column `id`, in batches.
pub(crate) fn open_range(start: i64, end: i64) -> BatchIter {
    let step = READ_BATCH_ROWS as i64;
    Box::new((start..end).step_by(READ_BATCH_ROWS).map(move |lo| {
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(lo..(lo + step).min(end)));
        Ok(RecordBatch::try_from_iter([("id", ids)]).expect("one non-null column"))
    }))
}

/// A CSV file with a header row, read as `schema`.
pub(crate) fn open_csv(path: &Path, schema: &SchemaRef) -> Result<BatchIter> {
    let file = open_file(path)?;
    let reader = arrow_csv::ReaderBuilder::new(schema.clone())
        .with_header(true)
        .with_batch_size(READ_BATCH_ROWS)
        .build(BufReader::new(file))
        .map_err(|e| bad_file(path, e))?;
    Ok(naming(path, reader))
}

/// A newline-delimited JSON file, read as `schema`.
pub(crate) fn open_json(path: &Path, schema: &SchemaRef) -> Result<BatchIter> {
    let file = open_file(path)?;
    // A field inferred as a string from numbers and strings reads its
    // numbers as strings.
    let reader = arrow_json::ReaderBuilder::new(schema.clone())
        .with_batch_size(READ_BATCH_ROWS)
        .with_coerce_primitive(true)
        .build(BufReader::new(file))
        .map_err(|e| bad_file(path, e))?;
    Ok(naming(path, reader))
}

/// An Arrow IPC file.
pub(crate) fn open_ipc(path: &Path) -> Result<BatchIter> {
    let file = open_file(path)?;
    let reader = arrow_ipc::reader::FileReader::try_new_buffered(file, None)
        .map_err(|e| bad_file(path, e))?;
    Ok(naming(path, reader))
}

/// Binary files, a row each.
pub(crate) fn open_binary_files(paths: Arc<Vec<PathBuf>>) -> BatchIter {
    Box::new((0..paths.len()).map(move |i| read_binary_file(&paths[i])))
}

/// `reader`'s batches, an error naming `path`.
fn naming(
    path: &Path,
    reader: impl Iterator<Item = std::result::Result<RecordBatch, arrow_schema::ArrowError>>
    + Send
    + 'static,
) -> BatchIter {
    let path = path.to_path_buf();
    Box::new(reader.map(move |b| b.map_err(|e| bad_file(&path, e))))
}

/// The schema of Arrow IPC files, read from each file's footer; files whose
/// schemas disagree are an error naming both.
pub fn ipc_schema(files: &[PathBuf]) -> Result<SchemaRef> {
    let mut first: Option<(SchemaRef, &PathBuf)> = None;
    for path in files {
        let file = open_file(path)?;
        let reader = arrow_ipc::reader::FileReader::try_new_buffered(file, None)
            .map_err(|e| bad_file(path, e))?;
        let schema = reader.schema();
        match &first {
            None => first = Some((schema, path)),
            Some((expected, first_path)) if expected.fields() != schema.fields() => {
                return Err(Error::SchemaMismatch {
                    path: path.clone(),
                    first: (*first_path).clone(),
                    expected: describe_schema(expected),
                    found: describe_schema(&schema),
                });
            }
            Some(_) => {}
        }
    }
    first
        .map(|(schema, _)| schema)
        .ok_or_else(|| Error::Invalid("read_ipc: no files".into()))
}

/// The schema of newline-delimited JSON files, inferred from the first
/// 1,000 objects of each file taken together (so that a field holding
/// integers in one file and floats in another is a float, as it would be
/// within one file). A file that is not JSON is an error naming it.
pub fn json_schema(files: &[PathBuf]) -> Result<SchemaRef> {
    let mut objects = Vec::new();
    for path in files {
        let file = open_file(path)?;
        for object in arrow_json::reader::ValueIter::new(BufReader::new(file), Some(1000)) {
            objects.push(object.map_err(|e| bad_file(path, e))?);
        }
    }
    let objects = objects.into_iter().map(Ok::<_, arrow_schema::ArrowError>);
    let schema = arrow_json::reader::infer_json_schema_from_iterator(objects).map_err(|e| {
        let files = files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>();
        Error::Invalid(format!(
            "cannot infer one schema for {}: {e}",
            files.join(", ")
        ))
    })?;
    Ok(Arc::new(schema))
}

/// One file as a row: its path, and its bytes read straight into the
/// buffer that becomes the Arrow array (no copy after the read).
fn read_binary_file(path: &Path) -> Result<RecordBatch> {
    // Sized before the read, so that a large file is never copied as the
    // buffer grows.
    let bytes = match crate::object::files::url_of(path) {
        Some(url) => {
            let mut object = ObjectFile::open(url)?;
            let mut bytes = Vec::new();
            // A size the store claims is not trusted to allocate.
            let size = usize::try_from(object.size()).unwrap_or(usize::MAX);
            bytes
                .try_reserve_exact(size)
                .map_err(|e| bad_file(path, format!("{} bytes: {e}", object.size())))?;
            std::io::Read::read_to_end(&mut object, &mut bytes)
                .map_err(|e| Error::io("reading", path, e))?;
            bytes
        }
        None => std::fs::read(path).map_err(|e| Error::io("reading", path, e))?,
    };
    let end = i32::try_from(bytes.len()).map_err(|_| {
        let len = bytes.len();
        bad_file(
            path,
            format!("{len} bytes: a binary file is one row of at most 2 GiB"),
        )
    })?;
    let offsets = OffsetBuffer::new(ScalarBuffer::from(vec![0, end]));
    let data: ArrayRef = Arc::new(BinaryArray::new(offsets, Buffer::from_vec(bytes), None));
    let paths: ArrayRef = Arc::new(StringArray::from(vec![path.display().to_string()]));
    Ok(RecordBatch::try_new(binary_files_schema(), vec![paths, data]).expect("matches the schema"))
}

/// The lines of the text file `path`, in batches of [`READ_BATCH_ROWS`]:
/// each without its line ending (`\n` or `\r\n`). A line that is not
/// UTF-8 is an error naming the file and the line.
pub(crate) fn open_text(path: &Path) -> Result<BatchIter> {
    let file = open_file(path)?;
    let mut lines = BufReader::new(file).split(b'\n');
    let path = path.to_path_buf();
    let (mut line_number, mut done) = (0usize, false);
    Ok(Box::new(std::iter::from_fn(move || {
        let mut text = StringBuilder::new();
        while !done && text.len() < READ_BATCH_ROWS {
            let mut line = match lines.next() {
                None => {
                    done = true;
                    break;
                }
                Some(Err(e)) => {
                    done = true;
                    return Some(Err(Error::io("reading", &path, e)));
                }
                Some(Ok(line)) => line,
            };
            line_number += 1;
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            match std::str::from_utf8(&line) {
                Ok(line) => text.append_value(line),
                Err(e) => {
                    done = true;
                    let why = format!("line {line_number} is not UTF-8 ({e})");
                    return Some(Err(bad_file(&path, why)));
                }
            }
        }
        if text.is_empty() {
            return None;
        }
        let text: ArrayRef = Arc::new(text.finish());
        Some(Ok(
            RecordBatch::try_new(text_schema(), vec![text]).expect("matches the schema")
        ))
    })))
}

/// The schema of `read_text`: `text` (utf8), one row per line.
pub fn text_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("text", DataType::Utf8, false)]))
}

/// The schema of `read_binary_files`: `path` (utf8) and `bytes` (binary).
pub fn binary_files_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("path", DataType::Utf8, false),
        Field::new("bytes", DataType::Binary, false),
    ]))
}

/// Expands a path, a directory (its files, sorted) or a glob into files.
pub fn expand_paths(pattern: &str) -> Result<Vec<PathBuf>> {
    let path = Path::new(pattern);
    if let Some(url) = crate::object::files::url_of(path) {
        return crate::object::files::expand_url(url);
    }
    let mut files = if path.is_dir() {
        // A write's commit cut short is finished first: never half of it.
        crate::object::local_commit::settle(path, true)?;
        let entries = std::fs::read_dir(path).map_err(|e| Error::io("listing", path, e))?;
        entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && !is_hidden(p))
            .collect::<Vec<_>>()
    } else if path.is_file() {
        vec![path.to_path_buf()]
    } else {
        let paths =
            glob::glob(pattern).map_err(|e| Error::Invalid(format!("bad glob {pattern}: {e}")))?;
        let files: Vec<PathBuf> = paths
            .filter_map(|p| p.ok())
            .filter(|p| p.is_file())
            .collect();
        let folders: std::collections::BTreeSet<&Path> =
            files.iter().filter_map(|f| f.parent()).collect();
        let mut finished = false;
        for folder in &folders {
            finished |= crate::object::local_commit::settle(folder, true)?;
        }
        if finished {
            // Listed again: finishing a commit moved and removed parts.
            let paths = glob::glob(pattern)
                .map_err(|e| Error::Invalid(format!("bad glob {pattern}: {e}")))?;
            paths
                .filter_map(|p| p.ok())
                .filter(|p| p.is_file())
                .collect()
        } else {
            files
        }
    };
    if files.is_empty() {
        return Err(Error::NoFiles {
            pattern: pattern.to_string(),
        });
    }
    files.sort();
    Ok(files)
}

fn is_hidden(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with('.') || n.starts_with('_'))
}

/// Infers a CSV schema from the first file and checks every file's header.
pub fn csv_schema(files: &[PathBuf]) -> Result<SchemaRef> {
    let format = arrow_csv::reader::Format::default().with_header(true);
    let mut first: Option<(SchemaRef, &PathBuf)> = None;
    for path in files {
        let file = open_file(path)?;
        let (schema, _) = format
            .infer_schema(BufReader::new(file), Some(1000))
            .map_err(|e| bad_file(path, e))?;
        let schema = Arc::new(schema);
        match &first {
            None => first = Some((schema, path)),
            Some((expected, first_path)) => {
                let names = |s: &Schema| {
                    s.fields()
                        .iter()
                        .map(|f| f.name().clone())
                        .collect::<Vec<_>>()
                };
                if names(expected) != names(&schema) {
                    return Err(Error::SchemaMismatch {
                        path: path.clone(),
                        first: (*first_path).clone(),
                        expected: names(expected).join(", "),
                        found: names(&schema).join(", "),
                    });
                }
            }
        }
    }
    Ok(first.expect("expand_paths never returns no files").0)
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::ParquetMetaDataReader;

    use super::*;
    use crate::udf::expr::Expr;

    /// Writes at `path` a Parquet file of `rows` rows in row groups of 20,
    /// whose footer says the file holds no rows (as an old writer wrote it).
    fn footer_says_no_rows(path: &Path, rows: i64) {
        let x: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows));
        let batch = RecordBatch::try_from_iter([("x", x)]).unwrap();
        let properties = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(20))
            .build();
        let mut bytes = Vec::new();
        let mut writer =
            ArrowWriter::try_new(&mut bytes, batch.schema(), Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        // The footer (thrift compact): FileMetaData's field 3, `num_rows`,
        // an i64 (header 0x16) right after the schema list (whose elements
        // have no i64 field), zigzag-encoded in one byte below 64 rows.
        let len = bytes.len();
        let footer_len = u32::from_le_bytes(bytes[len - 8..len - 4].try_into().unwrap()) as usize;
        let footer = len - 8 - footer_len;
        let field = [0x16, (rows * 2) as u8];
        let at = footer
            + bytes[footer..len - 8]
                .windows(2)
                .position(|w| w == field)
                .expect("num_rows in the footer");
        bytes[at + 1] = 0;
        std::fs::write(path, bytes).unwrap();
        let meta = ParquetMetaDataReader::new()
            .parse_and_finish(&File::open(path).unwrap())
            .unwrap();
        assert_eq!(meta.file_metadata().num_rows(), 0);
        let held: i64 = meta.row_groups().iter().map(|g| g.num_rows()).sum();
        assert_eq!(held, rows);
    }

    fn read_rows(path: &Path, prune: Option<Arc<Expr>>) -> Result<usize> {
        crate::read::parquet::open_parquet(path, None, prune.as_deref())?
            .map(|b| b.map(|b| b.num_rows()))
            .sum()
    }

    #[test]
    fn a_file_whose_footer_counts_no_rows_reads_the_rows_of_its_row_groups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old-writer.parquet");
        footer_says_no_rows(&path, 50);
        assert_eq!(read_rows(&path, None).unwrap(), 50);
        let x = Arc::new(crate::udf::expr::col("x").gt_eq(crate::udf::expr::lit(0i64)));
        assert_eq!(read_rows(&path, Some(x)).unwrap(), 50);
    }
}
