//! A reducer's own scratch files: what a sort or a join reducer whose
//! input outgrows its budget writes to disk rather than hold (the sort's
//! runs in `sort_runs`, the join's buckets in `join_spill`).
//!
//! A scratch file is an Arrow IPC stream written by direct I/O (as spill
//! files are) in the store's spill directory, and unlinked as soon as it
//! is opened again for reading, or removed if it never is (a failed task):
//! none outlives its task. What is read back is validated by Arrow's
//! reader and its row count checked against what was written, as any
//! bytes read back from disk are.

use std::io::BufReader;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::RecordBatch;
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::SchemaRef;
use streambatch_core::DirectWriter;

use crate::error::{Error, Result};
use crate::exchange::reservation::{MemoryPool, MemoryReservation};
use crate::udf::BatchIter;

/// Where a reducer may write scratch files, and the pool its input's
/// reservation draws on: it writes them when the pool refuses more.
#[derive(Clone)]
pub struct Scratch {
    /// An existing directory (the store's spill directory).
    pub dir: PathBuf,
    /// Grants the bytes a reducer holds before it writes scratch files.
    pool: Arc<dyn MemoryPool>,
    /// Told the bytes of each file written (the store counts them as
    /// spilled).
    wrote: Arc<dyn Fn(u64) + Send + Sync>,
}

impl Scratch {
    /// Scratch files in `dir` once `pool` refuses a reducer more memory,
    /// each file's bytes told to `wrote`.
    pub fn new(
        dir: PathBuf,
        pool: Arc<dyn MemoryPool>,
        wrote: Arc<dyn Fn(u64) + Send + Sync>,
    ) -> Self {
        Self { dir, pool, wrote }
    }

    /// A new, empty reservation of the pool, for one reducer's input.
    pub(crate) fn reservation(&self) -> MemoryReservation {
        MemoryReservation::new(self.pool.clone())
    }

    /// Writes `batches` (of `schema`) to a new scratch file named for
    /// `what` (see [`ScratchFile::write`]), and counts its bytes.
    pub(crate) fn write(
        &self,
        what: &str,
        schema: &SchemaRef,
        batches: impl IntoIterator<Item = Result<RecordBatch>>,
    ) -> Result<ScratchFile> {
        let file = ScratchFile::write(&self.dir, what, schema, batches)?;
        (self.wrote)(file.bytes);
        Ok(file)
    }
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch").field("dir", &self.dir).finish()
    }
}

/// Batches of one schema on disk, until they are opened for reading.
pub(crate) struct ScratchFile {
    path: PathBuf,
    schema: SchemaRef,
    rows: usize,
    bytes: u64,
    /// Opened for reading (and so unlinked already).
    opened: bool,
}

/// A file's read buffer: a merge reads many at once.
const READ_BUFFER: usize = 256 << 10;

/// Names scratch files apart within a process (several reducers may write
/// at once into the same directory).
static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

impl ScratchFile {
    /// Writes `batches` (of `schema`) as an IPC stream in a new file of
    /// `dir`, named for `what` (a sort's `run`, a join's `bucket`).
    pub(crate) fn write(
        dir: &Path,
        what: &str,
        schema: &SchemaRef,
        batches: impl IntoIterator<Item = Result<RecordBatch>>,
    ) -> Result<Self> {
        let n = NEXT_FILE.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{what}-{}-{n}.arrows", std::process::id()));
        let file = DirectWriter::create_new(&path, 0o600)
            .map_err(|e| Error::io("writing a scratch file", &path, e))?;
        // From here on the file is removed on any failure (by `drop`).
        let mut scratch = Self {
            path,
            schema: schema.clone(),
            rows: 0,
            bytes: 0,
            opened: false,
        };
        // A failure here is the disk's (full, failing), not the user's: a
        // store error, so that the task may be retried elsewhere.
        let context = format!("writing the scratch file {}", scratch.path.display());
        let failed = |e| Error::store(context.clone(), e);
        let mut writer = StreamWriter::try_new(file, schema).map_err(failed)?;
        for batch in batches {
            let batch = batch?;
            scratch.rows += batch.num_rows();
            writer.write(&batch).map_err(failed)?;
        }
        writer.finish().map_err(failed)?;
        let file = writer.into_inner().map_err(failed)?;
        scratch.bytes = file.position();
        file.finish()
            .map_err(|e| Error::store(context.clone(), e))?;
        Ok(scratch)
    }

    /// The batches, read back and checked; the file is unlinked once open
    /// (its blocks go when the reader does).
    pub(crate) fn read(mut self) -> Result<BatchIter> {
        let io = |e| Error::io("reading a scratch file", &self.path, e);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)
            .map_err(io)?;
        std::fs::remove_file(&self.path).map_err(io)?;
        self.opened = true;
        // Bytes read back are not trusted: a failure is the disk's, not
        // the user's (a store error, so that the task may be retried).
        let context = format!("reading the scratch file {}", self.path.display());
        let reader = StreamReader::try_new(BufReader::with_capacity(READ_BUFFER, file), None)
            .map_err(|e| Error::store(context.clone(), e))?;
        if reader.schema().fields() != self.schema.fields() {
            return Err(Error::store(context, "its columns are not those written"));
        }
        let expected = self.rows;
        let (mut read, mut over) = (0, false);
        let mut batches = reader.into_iter();
        Ok(Box::new(std::iter::from_fn(move || {
            if over {
                return None;
            }
            let error = match batches.next() {
                Some(Ok(batch)) => {
                    read += batch.num_rows();
                    return Some(Ok(batch));
                }
                Some(Err(e)) => Error::store(context.clone(), e),
                None if read == expected => {
                    over = true;
                    return None;
                }
                // A file cut short (a full disk, a file changed under it)
                // is an error, not fewer rows.
                None => Error::store(
                    context.clone(),
                    format!("{read} rows where {expected} were written"),
                ),
            };
            over = true;
            Some(Err(error))
        })))
    }

    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchFile {
    /// A file never read (a failed task) is removed.
    fn drop(&mut self) {
        if !self.opened {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::fs::File;

    use arrow_array::{ArrayRef, Int64Array};

    use super::*;

    fn batches() -> Vec<RecordBatch> {
        (0..40)
            .map(|b| {
                let v: ArrayRef = Arc::new(Int64Array::from_iter_values(b * 1000..(b + 1) * 1000));
                RecordBatch::try_from_iter([("v", v)]).unwrap()
            })
            .collect()
    }

    fn write(dir: &Path) -> ScratchFile {
        let batches = batches();
        let schema = batches[0].schema();
        ScratchFile::write(dir, "test", &schema, batches.into_iter().map(Ok)).unwrap()
    }

    /// Read back whole, the file unlinked once open.
    #[test]
    fn reads_back_what_it_wrote_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(dir.path());
        let path = file.path().to_path_buf();
        let read: Vec<RecordBatch> = file.read().unwrap().collect::<Result<_>>().unwrap();
        assert!(!path.exists());
        assert_eq!(read, batches());
    }

    /// A file cut short reads as an error naming it, not as fewer rows; a
    /// file never read leaves nothing.
    #[test]
    fn a_file_cut_short_is_an_error_and_an_unread_file_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let cut = write(dir.path());
        let len = std::fs::metadata(cut.path()).unwrap().len();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(cut.path())
            .unwrap();
        file.set_len(len / 2).unwrap();
        let read: Result<Vec<RecordBatch>> = cut.read().and_then(|b| b.collect());
        let error = read.expect_err("a file cut short").to_string();
        assert!(error.contains("scratch file"), "{error}");

        let other = write(dir.path());
        let v: ArrayRef = Arc::new(arrow_array::StringArray::from(vec!["x"]));
        let batch = RecordBatch::try_from_iter([("v", v)]).unwrap();
        let mut writer =
            StreamWriter::try_new(File::create(other.path()).unwrap(), &batch.schema()).unwrap();
        writer.write(&batch).unwrap();
        writer.finish().unwrap();
        let error = other
            .read()
            .err()
            .expect("other columns refused")
            .to_string();
        assert!(error.contains("columns"), "{error}");

        let unread = write(dir.path());
        let path = unread.path().to_path_buf();
        assert!(path.exists());
        drop(unread);
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
