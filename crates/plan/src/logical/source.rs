//! Sources: where a job's first partitions come from. A source is split
//! before the job runs (one split per file or row range); each split is read
//! by one task, which yields partitions as it reads. [`SourceSplit`] names
//! every format's reader in `read` and the wrappers the planner adds (a
//! union's or join's side, a sample's side).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::error::Result;
use crate::object::read_ahead::ReadAheadOwner;
use crate::read::files::{open_binary_files, open_csv, open_ipc, open_json, open_range, open_text};
use crate::read::images::{ImageSize, open_images};
use crate::read::parquet::{open_parquet, read_ahead};
use crate::read::row_sample::RowSample;
use crate::udf::BatchIter;
use crate::udf::expr::Expr;

/// One unit of source input, read by one task.
#[derive(Clone, Debug)]
pub enum SourceSplit {
    /// Integers `start..end` in a column `id`.
    Range {
        /// First value.
        start: i64,
        /// One past the last value.
        end: i64,
    },
    /// A batch given by the user.
    Batch(RecordBatch),
    /// One Parquet file, with the columns to read.
    Parquet {
        /// The file.
        path: PathBuf,
        /// Columns to read; `None` reads all.
        columns: Option<Arc<Vec<String>>>,
        /// The `filter` that follows the read, when there is one: row
        /// groups whose statistics show that no row satisfies it are not
        /// read (the filter still runs on the rows that are).
        prune: Option<Arc<Expr>>,
    },
    /// One CSV file with a header row.
    Csv {
        /// The file.
        path: PathBuf,
        /// The schema every CSV file of the source is read with.
        schema: SchemaRef,
    },
    /// Files read whole, one row each (`path`, `bytes`).
    BinaryFiles {
        /// The files, read in this order.
        paths: Arc<Vec<PathBuf>>,
        /// The largest file's size, as it was planned: what a task holds
        /// at most while it reads and its operators use one file.
        largest: u64,
    },
    /// PNG and JPEG files, decoded and resized, one row each (`path`,
    /// `image`).
    Images {
        /// The files, read in this order.
        paths: Arc<Vec<PathBuf>>,
        /// The size every image is resized to.
        size: ImageSize,
    },
    /// A text file, one row per line.
    Text(PathBuf),
    /// An Arrow IPC file.
    Ipc(PathBuf),
    /// A file of newline-delimited JSON, one row per object, read with the
    /// schema of all the source's files.
    Json {
        /// The file.
        path: PathBuf,
        /// The schema inferred from the files.
        schema: SchemaRef,
    },
    /// A split of one input of a union or a join, run with that input's
    /// operators (see [`Side`](crate::logical::side::Side)).
    Side {
        /// The split read.
        inner: Arc<SourceSplit>,
        /// The input's operators and tag.
        side: Arc<crate::logical::side::Side>,
    },
    /// One side of a `train_test_split` of a split's rows.
    Sampled {
        /// The split read.
        inner: Arc<SourceSplit>,
        /// Which of its rows this side keeps.
        sample: RowSample,
    },
}

impl SourceSplit {
    /// Starts fetching, in the background, what a task over this split
    /// reads first, when that is an object's row group whose footer this
    /// process holds (see `read_ahead.rs`): the embedded node asks it as a
    /// task over an earlier split starts, so that this split's task finds
    /// its input fetched. `job` owns what is fetched, dropped as it ends
    /// ([`forget_read_ahead`](crate::forget_read_ahead)).
    pub fn read_ahead(&self, job: ReadAheadOwner) {
        match self {
            SourceSplit::Sampled { inner, .. } | SourceSplit::Side { inner, .. } => {
                inner.read_ahead(job)
            }
            SourceSplit::Parquet {
                path,
                columns,
                prune,
            } => read_ahead(job, path, columns.clone(), prune.clone()),
            _ => {}
        }
    }

    /// Opens the split as a stream of batches.
    pub fn open(&self) -> Result<BatchIter> {
        match self {
            SourceSplit::Sampled { inner, sample } => Ok(sample.filter(inner.open()?)),
            // The side's operators need the task's environment: the stage
            // runs them (`Stage::open`).
            SourceSplit::Side { inner, .. } => inner.open(),
            SourceSplit::Range { start, end } => Ok(open_range(*start, *end)),
            SourceSplit::Batch(batch) => Ok(Box::new(std::iter::once(Ok(batch.clone())))),
            SourceSplit::Parquet {
                path,
                columns,
                prune,
            } => open_parquet(path, columns.as_deref(), prune.as_deref()),
            SourceSplit::Csv { path, schema } => open_csv(path, schema),
            SourceSplit::Json { path, schema } => open_json(path, schema),
            SourceSplit::BinaryFiles { paths, .. } => Ok(open_binary_files(paths.clone())),
            SourceSplit::Images { paths, size } => Ok(open_images(paths.clone(), *size)),
            SourceSplit::Text(path) => open_text(path),
            SourceSplit::Ipc(path) => open_ipc(path),
        }
    }

    /// The files the split reads (none for a range or a batch).
    pub fn files(&self) -> Vec<&Path> {
        match self {
            SourceSplit::Sampled { inner, .. } | SourceSplit::Side { inner, .. } => inner.files(),
            SourceSplit::Range { .. } | SourceSplit::Batch(_) => Vec::new(),
            SourceSplit::Parquet { path, .. }
            | SourceSplit::Csv { path, .. }
            | SourceSplit::Json { path, .. }
            | SourceSplit::Text(path)
            | SourceSplit::Ipc(path) => vec![path],
            SourceSplit::BinaryFiles { paths, .. } | SourceSplit::Images { paths, .. } => {
                paths.iter().map(PathBuf::as_path).collect()
            }
        }
    }

    /// This split without a pruning predicate: every row it holds is read
    /// (a row's position within the split then never depends on a filter).
    pub fn without_pruning(&self) -> Self {
        match self {
            SourceSplit::Parquet { path, columns, .. } => SourceSplit::Parquet {
                path: path.clone(),
                columns: columns.clone(),
                prune: None,
            },
            other => other.clone(),
        }
    }

    /// A short description for errors and stats.
    pub fn describe(&self) -> String {
        match self {
            SourceSplit::Sampled { inner, sample } => format!(
                "the {} side of {}",
                if sample.test { "test" } else { "train" },
                inner.describe()
            ),
            SourceSplit::Side { inner, .. } => inner.describe(),
            SourceSplit::Range { start, end } => format!("range {start}..{end}"),
            SourceSplit::Batch(b) => format!("batch of {} rows", b.num_rows()),
            SourceSplit::Parquet { path, .. }
            | SourceSplit::Csv { path, .. }
            | SourceSplit::Json { path, .. }
            | SourceSplit::Text(path)
            | SourceSplit::Ipc(path) => path.display().to_string(),
            SourceSplit::BinaryFiles { paths, .. } | SourceSplit::Images { paths, .. } => {
                format!("{} files from {}", paths.len(), paths[0].display())
            }
        }
    }

    /// Bytes a task reading this split holds in memory outside the store
    /// for as long as it runs: a binary file read whole (the largest of
    /// the split's); 0 for sources that stream in batches. The executor
    /// counts them against the job's memory budget, so that two tasks do
    /// not hold large files at once when the store cannot also take their
    /// outputs.
    pub fn held_bytes(&self) -> u64 {
        match self {
            SourceSplit::Sampled { inner, .. } | SourceSplit::Side { inner, .. } => {
                inner.held_bytes()
            }
            SourceSplit::BinaryFiles { largest, .. } => *largest,
            _ => 0,
        }
    }
}
