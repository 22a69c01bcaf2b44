//! Parquet sources: a file's footer read (its row count taken from its
//! row groups'), the row groups a filter may match and the columns asked
//! for read, from a local file or, by ranges, from an object store
//! (`object_files.rs`); a file that fails to decode is named with the
//! column that fails.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use parquet::file::metadata::{FileMetaData, ParquetMetaData, ParquetMetaDataBuilder};
use parquet::file::reader::ChunkReader;

use crate::error::{Error, Result, bad_file};
use crate::object::files::ObjectReader;
use crate::object::read_ahead::{ReadAhead, ReadAheadOwner};
use crate::read::prune::RowGroupStats;
use crate::read::{READ_BATCH_ROWS, describe_schema, project};
use crate::udf::BatchIter;
use crate::udf::expr::Expr;

/// Reads every file's footer and checks that all schemas agree; returns the
/// (projected) schema.
pub fn parquet_schema(files: &[PathBuf], columns: Option<&[String]>) -> Result<SchemaRef> {
    let schemas = file_schemas(files)?;
    let mut first: Option<(SchemaRef, &PathBuf)> = None;
    for (path, schema) in files.iter().zip(schemas) {
        match &first {
            None => first = Some((schema, path)),
            Some((expected, first_path)) => {
                if expected.fields() != schema.fields() {
                    return Err(Error::SchemaMismatch {
                        path: path.clone(),
                        first: (*first_path).clone(),
                        expected: describe_schema(expected),
                        found: describe_schema(&schema),
                    });
                }
            }
        }
    }
    let (schema, path) = first.ok_or_else(|| Error::Invalid("no Parquet files".into()))?;
    project(&schema, columns).map_err(|m| bad_file(path, m))
}

/// The schema of each Parquet file of `files`. Objects' footers are
/// fetched several at once: each is a request's round trip.
fn file_schemas(files: &[PathBuf]) -> Result<Vec<SchemaRef>> {
    let schema_of = |path: &PathBuf| -> Result<SchemaRef> {
        Ok(match crate::object::files::url_of(path) {
            Some(url) => {
                let reader = ObjectReader::open(url)?;
                parquet_metadata(path, &reader)?.schema().clone()
            }
            None => {
                let file = File::open(path).map_err(|e| Error::io("opening", path, e))?;
                parquet_metadata(path, &file)?.schema().clone()
            }
        })
    };
    if !files
        .iter()
        .any(|f| crate::object::files::url_of(f).is_some())
    {
        return files.iter().map(schema_of).collect();
    }
    let per_thread = files.len().div_ceil(FOOTERS_IN_FLIGHT).max(1);
    std::thread::scope(|s| {
        let threads: Vec<_> = files
            .chunks(per_thread)
            .map(|chunk| s.spawn(move || chunk.iter().map(schema_of).collect::<Vec<_>>()))
            .collect();
        let mut schemas = Vec::with_capacity(files.len());
        for thread in threads {
            schemas.extend(thread.join().expect("reading a footer does not panic"));
        }
        schemas.into_iter().collect()
    })
}

/// Objects whose footers are fetched at once when a dataset is made.
const FOOTERS_IN_FLIGHT: usize = 16;

/// The batches of Parquet file `path`, a local path or an object store
/// URL: the columns asked for, of the row groups `prune` may match.
pub(crate) fn open_parquet(
    path: &Path,
    columns: Option<&Vec<String>>,
    prune: Option<&Expr>,
) -> Result<BatchIter> {
    if let Some(url) = crate::object::files::url_of(path) {
        return open_object_parquet(path, ObjectReader::open(url)?, columns, prune);
    }
    let file = File::open(path).map_err(|e| Error::io("opening", path, e))?;
    let meta = parquet_metadata(path, &file)?;
    let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta);
    let (groups, roots) = selection(path, &builder, columns, prune)?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
    let reader = builder
        .with_row_groups(groups.clone())
        .with_projection(mask)
        .with_batch_size(READ_BATCH_ROWS)
        .build()
        .map_err(|e| decode_error(path, &groups, &roots, e))?;
    let path = path.to_path_buf();
    let columns = columns.cloned();
    Ok(Box::new(reader.map(move |b| {
        let batch = b.map_err(|e| decode_error(&path, &groups, &roots, e))?;
        in_order(&path, batch, columns.as_deref())
    })))
}

/// The rows of local Parquet file `path`, from its footer (its row
/// groups' counts).
pub(crate) fn parquet_rows(path: &Path) -> Result<usize> {
    let file = File::open(path).map_err(|e| Error::io("opening", path, e))?;
    let rows = parquet_metadata(path, &file)?
        .metadata()
        .file_metadata()
        .num_rows();
    usize::try_from(rows).map_err(|e| bad_file(path, e))
}

/// A Parquet file in an object store, read a row group at a time: the
/// byte ranges of the columns read of each row group are fetched together
/// before it decodes (`ObjectReader::prefetch`), so a read fetches only
/// what it reads, and holds one row group's columns.
fn open_object_parquet(
    path: &Path,
    reader: ObjectReader,
    columns: Option<&Vec<String>>,
    prune: Option<&Expr>,
) -> Result<BatchIter> {
    let (meta, groups, mask) = object_selection(path, &reader, columns, prune)?;
    let (path, columns) = (path.to_path_buf(), columns.cloned());
    let row_group = move |g: usize| -> Result<BatchIter> {
        reader.prefetch(column_ranges(&meta, g, &mask))?;
        let batches =
            ParquetRecordBatchReaderBuilder::new_with_metadata(reader.clone(), meta.clone())
                .with_row_groups(vec![g])
                .with_projection(mask.clone())
                .with_batch_size(READ_BATCH_ROWS)
                .build()
                .map_err(|e| bad_file(&path, e))?;
        let (path, columns) = (path.clone(), columns.clone());
        Ok(Box::new(batches.map(move |b| {
            let batch = b.map_err(|e| bad_file(&path, e))?;
            in_order(&path, batch, columns.as_deref())
        })))
    };
    Ok(Box::new(groups.into_iter().flat_map(move |g| {
        row_group(g).unwrap_or_else(|e| Box::new(std::iter::once(Err(e))))
    })))
}

/// What a read of the object at `path` takes: its footer, the row groups
/// `prune` may match, and the mask of the columns asked for.
fn object_selection(
    path: &Path,
    reader: &ObjectReader,
    columns: Option<&Vec<String>>,
    prune: Option<&Expr>,
) -> Result<(ArrowReaderMetadata, Vec<usize>, ProjectionMask)> {
    let meta = parquet_metadata(path, reader)?;
    let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(reader.clone(), meta.clone());
    let (groups, roots) = selection(path, &builder, columns, prune)?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    Ok((meta, groups, mask))
}

/// The byte ranges of row group `g`'s columns that `mask` reads.
fn column_ranges(meta: &ArrowReaderMetadata, g: usize, mask: &ProjectionMask) -> Vec<Range<u64>> {
    let group = meta.metadata().row_group(g);
    (0..group.num_columns())
        .filter(|&leaf| mask.leaf_included(leaf))
        .map(|leaf| {
            let (start, len) = group.column(leaf).byte_range();
            start..start + len
        })
        .collect()
}

/// Starts fetching what a task reading `path` as [`open_parquet`] reads
/// first, its first row group's columns ([`ReadAhead`]), when `path` is
/// an object whose footer this process holds (planning read it): no
/// request but that one, and nothing for a local file.
pub(crate) fn read_ahead(
    job: ReadAheadOwner,
    path: &Path,
    columns: Option<Arc<Vec<String>>>,
    prune: Option<Arc<Expr>>,
) {
    let Some(url) = crate::object::files::url_of(path) else {
        return;
    };
    let path = path.to_path_buf();
    ReadAhead::global().start(job, url, move || {
        let reader = ObjectReader::kept(crate::object::files::url_of(&path)?)?;
        // (A footer larger than the tail is fetched here, as the task would.)
        let (meta, groups, mask) =
            object_selection(&path, &reader, columns.as_deref(), prune.as_deref()).ok()?;
        let ranges = column_ranges(&meta, *groups.first()?, &mask);
        let e_tag = reader.e_tag().map(str::to_string);
        Some((ranges.clone(), e_tag, reader.fetch_all(ranges)))
    });
}

/// The row groups `prune` may match and the root columns of `columns`
/// (all when `None`) of the file `builder` reads.
fn selection<T: ChunkReader>(
    path: &Path,
    builder: &ParquetRecordBatchReaderBuilder<T>,
    columns: Option<&Vec<String>>,
    prune: Option<&Expr>,
) -> Result<(Vec<usize>, Vec<usize>)> {
    let groups = match prune {
        Some(predicate) => RowGroupStats {
            arrow: builder.schema(),
            parquet: builder.parquet_schema(),
            groups: builder.metadata().row_groups(),
            orders: builder
                .metadata()
                .file_metadata()
                .column_orders()
                .map(Vec::as_slice),
        }
        .may_match(predicate),
        None => (0..builder.metadata().num_row_groups()).collect(),
    };
    let roots = match columns {
        Some(columns) => columns
            .iter()
            .map(|c| {
                builder
                    .schema()
                    .index_of(c)
                    .map_err(|_| bad_file(path, format!("no column `{c}`")))
            })
            .collect::<Result<Vec<_>>>()?,
        None => (0..builder.schema().fields().len()).collect(),
    };
    Ok((groups, roots))
}

/// `batch`'s columns in the order asked: a projection reads them in file
/// order.
fn in_order(path: &Path, batch: RecordBatch, columns: Option<&[String]>) -> Result<RecordBatch> {
    let Some(columns) = columns else {
        return Ok(batch);
    };
    let schema = batch.schema();
    let order = columns
        .iter()
        .map(|c| schema.index_of(c))
        .collect::<Result<Vec<_>, _>>();
    order
        .and_then(|o| batch.project(&o))
        .map_err(|e| bad_file(path, e))
}

/// A Parquet file's footer, its row count taken from its row groups' (the
/// rows it holds): an old writer left `num_rows` 0 in the footer of files
/// with rows, which pyarrow reads, and the `parquet` crate sizes its
/// batches by the footer's count, so such a file would read as empty.
fn parquet_metadata(path: &Path, file: &impl ChunkReader) -> Result<ArrowReaderMetadata> {
    let meta =
        ArrowReaderMetadata::load(file, Default::default()).map_err(|e| bad_file(path, e))?;
    let mut held: i64 = 0;
    for (i, group) in meta.metadata().row_groups().iter().enumerate() {
        let rows = group.num_rows();
        held = (rows >= 0)
            .then(|| held.checked_add(rows))
            .flatten()
            .ok_or_else(|| bad_file(path, format!("row group {i} counts {rows} rows")))?;
    }
    let footer = meta.metadata().file_metadata();
    if footer.num_rows() == held {
        return Ok(meta);
    }
    let counted = FileMetaData::new(
        footer.version(),
        held,
        footer.created_by().map(str::to_owned),
        footer.key_value_metadata().cloned(),
        footer.schema_descr_ptr(),
        footer.column_orders().cloned(),
    );
    let mut old = ParquetMetaData::clone(meta.metadata()).into_builder();
    let fixed = ParquetMetaDataBuilder::new(counted)
        .set_row_groups(old.take_row_groups())
        .set_page_index(old.take_page_index())
        .build();
    ArrowReaderMetadata::try_new(Arc::new(fixed), Default::default()).map_err(|e| bad_file(path, e))
}

/// A Parquet file that failed to decode: the error names the column whose
/// pages fail when each of the columns read is read again alone, with that
/// read's own error (only on this path, so a good file pays nothing).
fn decode_error(
    path: &Path,
    groups: &[usize],
    roots: &[usize],
    e: impl std::fmt::Display,
) -> Error {
    match failing_column(path, groups, roots) {
        Some((column, why)) => bad_file(path, format!("column `{column}`: {why}")),
        None => bad_file(path, e),
    }
}

/// The first of the columns `roots` whose row groups `groups` fail to
/// decode, read one column at a time, and why it fails.
fn failing_column(path: &Path, groups: &[usize], roots: &[usize]) -> Option<(String, String)> {
    let file = File::open(path).ok()?;
    let meta = parquet_metadata(path, &file).ok()?;
    for &root in roots {
        let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(
            file.try_clone().ok()?,
            meta.clone(),
        );
        let name = builder.schema().field(root).name().clone();
        let mask = ProjectionMask::roots(builder.parquet_schema(), [root]);
        let failure = match builder
            .with_row_groups(groups.to_vec())
            .with_projection(mask)
            .build()
        {
            Ok(reader) => reader.filter_map(|b| b.err()).next().map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = failure {
            return Some((name, why));
        }
    }
    None
}
