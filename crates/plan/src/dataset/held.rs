//! A job's output as a cluster driver can hand it on before reading it:
//! rows a node holds ([`HeldRows`]), which a trainer process may fetch
//! from that node itself rather than through the driver (see
//! [`Split`](crate::train::split::Split)), and the moment the job has handed over every
//! output ([`Pulled::Drained`]).

use std::sync::Arc;

use arrow_array::RecordBatch;

use crate::error::Result;

/// What a job's output stream gives when asked without reading
/// ([`JobStream::next_pulled`](crate::dataset::JobStream::next_pulled)).
pub enum Pulled {
    /// Rows read already (or made in this process).
    Batch(RecordBatch),
    /// Rows a cluster node holds, not read yet.
    Held(HeldRows),
    /// Every output was handed over; the job ends once each is read (or
    /// dropped), unless one is found lost and made again, which then
    /// comes next.
    Drained,
}

/// Where a job's output is held: the node, and the rows of its stored
/// partition that the output is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldAt {
    /// The node's name (its certificate's).
    pub node: String,
    /// Where it listens (QUIC).
    pub addr: String,
    /// Its host's identity (boot id): a process with the same one may map
    /// the rows from the node's shared memory.
    pub host: String,
    /// The node's store directory.
    pub store_dir: String,
    /// The partition's id in the node's store.
    pub partition: u64,
    /// The partition's rows.
    pub partition_rows: usize,
    /// The output's first row in the partition.
    pub first: usize,
}

/// How the driver reads a held output, and learns which of its rows were
/// lost. Dropping it (once no [`HeldRows`] of the output is left) tells the
/// job whether every row was read or dropped on purpose, or some must be
/// made again.
pub trait HeldSource: Send + Sync {
    /// Reads rows `offset..offset + len` of the output from its node.
    fn read(&self, offset: usize, len: usize) -> Result<RecordBatch>;
    /// Rows `offset..offset + len` of the output could not be read: the
    /// job makes the output again, and those rows alone come anew.
    fn lost(&self, offset: usize, len: usize);
    /// Whether some rows of the output were found lost (its node is).
    fn any_lost(&self) -> bool;
}

struct Output {
    at: HeldAt,
    source: Box<dyn HeldSource>,
}

/// Rows of a job's output held by a cluster node, not read yet. Slices
/// share the output; the node keeps it until the last slice is dropped.
#[derive(Clone)]
pub struct HeldRows {
    output: Arc<Output>,
    offset: usize,
    len: usize,
}

impl HeldRows {
    /// The `rows` rows of an output held at `at`, read through `source`.
    pub fn new(at: HeldAt, rows: usize, source: Box<dyn HeldSource>) -> Self {
        Self {
            output: Arc::new(Output { at, source }),
            offset: 0,
            len: rows,
        }
    }

    /// Where the output is held.
    pub fn at(&self) -> &HeldAt {
        &self.output.at
    }

    /// These rows' place in the node's partition: first row and count.
    pub fn partition_rows(&self) -> (usize, usize) {
        (self.output.at.first + self.offset, self.len)
    }

    /// How many rows.
    pub fn num_rows(&self) -> usize {
        self.len
    }

    /// Rows `offset..offset + len` of these.
    pub fn slice(&self, offset: usize, len: usize) -> Self {
        assert!(offset + len <= self.len, "a slice within the rows");
        Self {
            output: self.output.clone(),
            offset: self.offset + offset,
            len,
        }
    }

    /// Reads the rows in this process. Rows that cannot be read are
    /// reported lost: the job makes them again.
    pub fn read(&self) -> Result<RecordBatch> {
        let read = self.output.source.read(self.offset, self.len);
        if read.is_err() {
            self.lost();
        }
        read
    }

    /// These rows never reached anyone: the job makes them again.
    pub fn lost(&self) {
        self.output.source.lost(self.offset, self.len);
    }

    /// Whether rows of their output were found lost: these are on a lost
    /// node too.
    pub fn output_lost(&self) -> bool {
        self.output.source.any_lost()
    }

    /// Whether `other` are rows of the same output.
    pub fn same_output(&self, other: &HeldRows) -> bool {
        Arc::ptr_eq(&self.output, &other.output)
    }
}

impl std::fmt::Debug for HeldRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (first, len) = self.partition_rows();
        write!(
            f,
            "rows {first}+{len} of partition {} on {}",
            self.output.at.partition, self.output.at.node
        )
    }
}

/// Rows for a rank of a split: read already, or held by a node.
#[derive(Clone, Debug)]
pub enum Piece {
    /// Read rows.
    Batch(RecordBatch),
    /// Rows a node holds.
    Held(HeldRows),
}

impl Piece {
    /// How many rows.
    pub fn num_rows(&self) -> usize {
        match self {
            Piece::Batch(batch) => batch.num_rows(),
            Piece::Held(held) => held.num_rows(),
        }
    }

    /// Rows `offset..offset + len`.
    pub fn slice(&self, offset: usize, len: usize) -> Self {
        match self {
            Piece::Batch(batch) => Piece::Batch(batch.slice(offset, len)),
            Piece::Held(held) => Piece::Held(held.slice(offset, len)),
        }
    }

    /// The host of the node that holds the rows, when a node does.
    pub fn host(&self) -> Option<&str> {
        match self {
            Piece::Batch(_) => None,
            Piece::Held(held) => Some(&held.at().host),
        }
    }

    /// The rows, read in this process where a node holds them.
    pub fn read(&self) -> Result<RecordBatch> {
        match self {
            Piece::Batch(batch) => Ok(batch.clone()),
            Piece::Held(held) => held.read(),
        }
    }
}
