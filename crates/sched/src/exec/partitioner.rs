//! Output partitions: slices of stored partitions, and the partitioner that
//! cuts a task's output into partitions of at most `target` bytes.

use std::sync::Arc;

use arrow_array::RecordBatch;
use streambatch_plan::{Error, KeySample, Result};
use streambatch_store::{PartitionRef, batch_bytes};

use crate::exec::budget::Reservation;
use crate::job::piece::Part;

/// A stored output partition and the budget it holds. Fields drop in order:
/// the store frees the bytes before the budget reports them free.
pub struct Output {
    part: PartitionRef,
    /// Arrow bytes of the batch (the store's IPC framing aside).
    bytes: u64,
    _reservation: Option<Reservation>,
}

impl Output {
    /// Wraps a stored partition of `bytes` Arrow bytes and its reservation.
    pub fn new(part: PartitionRef, bytes: u64, reservation: Option<Reservation>) -> Arc<Self> {
        Arc::new(Self {
            part,
            bytes,
            _reservation: reservation,
        })
    }
}

impl Output {
    /// The stored partition.
    pub fn part(&self) -> &PartitionRef {
        &self.part
    }
}

/// Where a partition held by another node comes from and goes back to: the
/// driver's connection to the cluster.
pub trait RemoteSource: Send + Sync {
    /// Reads partition `id` from node `holder`. A batch mapped from the
    /// holder's memory holds `keep` (the part, whose drop releases it) as
    /// long as any of its buffers lives.
    fn fetch(&self, holder: &str, id: u64, keep: Arc<RemotePart>) -> Result<RecordBatch>;
    /// Tells `holder` that the job is done with partition `id`.
    fn release(&self, holder: &str, id: u64);
    /// Where node `holder` listens, and where its store is: for a process
    /// that fetches its partitions itself (a trainer). `None` where unknown.
    fn place(&self, holder: &str) -> Option<(String, streambatch_net::Locality)> {
        let _ = holder;
        None
    }
}

/// A partition stored on another node, as the driver's executor holds it.
/// When the last slice of it is dropped, its holder is told to free it.
pub struct RemotePart {
    /// The holder's index among the job's nodes.
    pub node: usize,
    /// The holder's name.
    pub holder: String,
    /// Its id in the holder's store.
    pub id: u64,
    /// Rows.
    pub rows: usize,
    /// Arrow bytes.
    pub bytes: u64,
    /// How to read and release it.
    pub source: Arc<dyn RemoteSource>,
    /// Its share of the holder's budget, as the driver accounts it;
    /// returned when the part is dropped.
    _shadow: Option<Reservation>,
}

impl RemotePart {
    /// Partition `id` of `holder` (the job's `node`-th node), holding
    /// `shadow` of the driver's account of that node's budget.
    pub fn new(
        (node, holder): (usize, String),
        (id, rows, bytes): (u64, usize, u64),
        source: Arc<dyn RemoteSource>,
        shadow: Option<Reservation>,
    ) -> Self {
        Self {
            node,
            holder,
            id,
            rows,
            bytes,
            source,
            _shadow: shadow,
        }
    }
}

impl Drop for RemotePart {
    fn drop(&mut self) {
        self.source.release(&self.holder, self.id);
    }
}

/// What a slice's rows are in.
#[derive(Clone)]
enum Data {
    /// A partition of this process's store.
    Stored(Arc<Output>),
    /// A partition another node holds.
    Remote(Arc<RemotePart>),
    /// A partition read from another node, held by the task that reads it.
    Fetched(RecordBatch),
}

/// Rows `offset..offset + len` of an output partition. The unit the executor
/// queues: limit and repartition cut partitions by slicing references, not
/// data.
#[derive(Clone)]
pub struct Slice {
    data: Data,
    /// First row.
    pub offset: usize,
    /// Rows.
    pub len: usize,
    /// The whole output of an exchange's map side: where each
    /// destination's rows start, and the end (a hash exchange's only until
    /// the job sums it, `Part::forget_cut`).
    groups: Option<Arc<[u32]>>,
    /// The whole output of a sort's map side: its keys' sample.
    sample: Option<Arc<KeySample>>,
    /// A hash exchange's map output whose cut its holder alone keeps
    /// (`Part::forget_cut`).
    cut_at_holder: bool,
    /// Destination `d`'s rows of such an output, which its holder finds
    /// (`offset` and `len` are then not known here).
    destination: Option<u32>,
}

impl Slice {
    /// All `len` rows of `data`.
    fn all(data: Data, len: usize) -> Self {
        Self {
            data,
            offset: 0,
            len,
            groups: None,
            sample: None,
            cut_at_holder: false,
            destination: None,
        }
    }

    /// The whole partition.
    pub fn whole(output: Arc<Output>) -> Self {
        let len = output.part.rows();
        Self::all(Data::Stored(output), len)
    }

    /// The whole of a partition another node holds.
    pub fn remote(part: RemotePart) -> Self {
        let len = part.rows;
        Self::all(Data::Remote(Arc::new(part)), len)
    }

    /// Rows read from another node.
    pub fn fetched(batch: RecordBatch) -> Self {
        let len = batch.num_rows();
        Self::all(Data::Fetched(batch), len)
    }

    /// This slice, a whole output cut by destination at `groups` (see
    /// [`Slice::groups`]).
    pub fn with_groups(mut self, groups: Arc<[u32]>) -> Self {
        self.groups = Some(groups);
        self
    }

    /// This slice, a whole output of a sort's map side, with its keys'
    /// `sample` (see [`streambatch_plan::key_range`]).
    pub fn with_sample(mut self, sample: Arc<KeySample>) -> Self {
        self.sample = Some(sample);
        self
    }

    /// [`Slice::sub`] for a range from elsewhere (a peer's order): `None`
    /// when it does not lie within this slice.
    pub fn sub_within(&self, offset: u64, len: u64) -> Option<Self> {
        let end = offset.checked_add(len)?;
        (end <= self.len as u64).then(|| self.sub(offset as usize, len as usize))
    }

    /// Rows `offset..offset + len` of this slice. A part of a whole cut by
    /// destination no longer has the whole's groups.
    pub fn sub(&self, offset: usize, len: usize) -> Self {
        debug_assert!(self.destination.is_none(), "rows of rows not known here");
        let whole = offset == 0 && len == self.len;
        Self {
            data: self.data.clone(),
            offset: self.offset + offset,
            len,
            groups: self.groups.clone().filter(|_| whole),
            sample: self.sample.clone().filter(|_| whole),
            cut_at_holder: self.cut_at_holder && whole,
            destination: None,
        }
    }

    /// Its rows are known here, not a destination its holder is to find
    /// (asked for by a node's order, `Want::Group`), or that no cut of this
    /// process's store could find.
    fn resolved(&self) -> Result<()> {
        match self.destination {
            None => Ok(()),
            Some(d) => Err(Error::Invalid(format!(
                "destination {d}'s rows of a partition of {} bytes are not known here: \
                 its holder finds them",
                self.partition_bytes()
            ))),
        }
    }

    /// The destination whose rows of its map output this slice names,
    /// when its holder is to find them (see `Part::group`).
    pub fn destination(&self) -> Option<u32> {
        self.destination
    }

    /// The stored partition behind this slice, when it is in this process.
    pub fn stored(&self) -> Option<&Arc<Output>> {
        match &self.data {
            Data::Stored(output) => Some(output),
            _ => None,
        }
    }

    /// The remote partition behind this slice, when another node holds it.
    pub fn remote_part(&self) -> Option<&RemotePart> {
        match &self.data {
            Data::Remote(part) => Some(part),
            _ => None,
        }
    }

    /// Arrow bytes of the partition behind this slice.
    pub fn partition_bytes(&self) -> u64 {
        match &self.data {
            Data::Stored(output) => output.bytes,
            Data::Remote(part) => part.bytes,
            Data::Fetched(batch) => batch_bytes(batch),
        }
    }

    /// Reads the rows, not holding the rest of their partition when they
    /// are a small part of it (a reducer's slice of each map output): a
    /// reducer holding its slices would otherwise hold every map output
    /// whole while it ran. A spilled map output reads only this slice's
    /// rows (see `PartitionRef::get_rows`).
    pub fn read_alone(&self) -> Result<RecordBatch> {
        self.resolved()?;
        let whole = match &self.data {
            Data::Stored(output) => {
                return output
                    .part
                    .get_rows(self.offset..self.offset + self.len, true)
                    .map_err(|e| Error::store("reading a stored partition", e));
            }
            Data::Remote(part) => part.rows,
            Data::Fetched(whole) => whole.num_rows(),
        };
        let batch = self.read()?;
        if self.len * 2 > whole {
            return Ok(batch);
        }
        let rows = arrow_array::UInt32Array::from_iter_values(0..batch.num_rows() as u32);
        arrow_select::take::take_record_batch(&batch, &rows)
            .map_err(|e| Error::arrow("copying a slice of a partition", e))
    }

    /// Reads the rows.
    pub fn read(&self) -> Result<RecordBatch> {
        self.resolved()?;
        let batch = match &self.data {
            Data::Stored(output) => output
                .part
                .get()
                .map_err(|e| Error::store("reading a stored partition", e))?,
            Data::Remote(part) => {
                let batch = part.source.fetch(&part.holder, part.id, part.clone())?;
                // The holder reported the row count the driver sliced by:
                // a batch that disagrees is the peer's fault, not a panic.
                if batch.num_rows() != part.rows {
                    return Err(Error::OnNode {
                        node: part.holder.clone(),
                        message: format!(
                            "partition {} holds {} rows, but the node reported {}",
                            part.id,
                            batch.num_rows(),
                            part.rows
                        ),
                    });
                }
                batch
            }
            Data::Fetched(batch) => batch.clone(),
        };
        if self.offset == 0 && self.len == batch.num_rows() {
            return Ok(batch);
        }
        Ok(batch.slice(self.offset, self.len))
    }
}

impl Part for Slice {
    fn rows(&self) -> usize {
        self.len
    }

    fn bytes(&self) -> u64 {
        self.partition_bytes()
    }

    fn sub(&self, offset: usize, len: usize) -> Self {
        Slice::sub(self, offset, len)
    }

    fn node(&self) -> usize {
        match &self.data {
            Data::Remote(part) => part.node,
            _ => 0,
        }
    }

    fn groups(&self) -> Option<&Arc<[u32]>> {
        self.groups.as_ref()
    }

    fn sample(&self) -> Option<&Arc<KeySample>> {
        self.sample.as_ref()
    }

    fn sliced_bytes(&self) -> u64 {
        let whole = match &self.data {
            Data::Stored(output) => output.part.rows(),
            Data::Remote(part) => part.rows,
            Data::Fetched(batch) => batch.num_rows(),
        };
        let bytes = u128::from(self.partition_bytes()) * self.len as u128;
        (bytes / whole.max(1) as u128) as u64
    }

    fn keep_groups(&mut self, old: &Self) {
        if self.groups.is_none() && old.len == self.len {
            self.groups = old.groups.clone();
            self.sample = old.sample.clone();
            self.cut_at_holder = old.cut_at_holder;
        }
    }

    fn forget_cut(&mut self) {
        self.cut_at_holder = self.groups.take().is_some();
    }

    fn cut_at_holder(&self) -> bool {
        self.cut_at_holder
    }

    /// In this process's store, found now by the cut the store keeps;
    /// elsewhere, named for the holder to find.
    fn group(&self, d: usize) -> Self {
        let rows = self.stored().and_then(|output| output.part.group_rows(d));
        if let Some(rows) = rows.filter(|rows| self.offset == 0 && rows.end <= self.len) {
            return self.sub(rows.start, rows.len());
        }
        Self {
            destination: Some(d as u32),
            ..Self::all(self.data.clone(), 0)
        }
    }
}

/// Gathers a task's output batches and cuts them into partitions of at most
/// `target` bytes; a single row larger than that becomes a partition alone.
///
/// A partition comes as the batches gathered for it, not yet joined: an
/// exchange's map side cuts them by destination in one copy (a join first
/// would be a second, of every byte exchanged), other tasks join them
/// ([`joined`]). Joining copies into fresh memory, which costs page faults
/// (several µs per 4 KiB page here); so only small batches are gathered,
/// and a batch of at least [`Partitioner::alone_bytes`] becomes a partition
/// by itself, with no copy.
pub struct Partitioner {
    target: u64,
    buffer: Vec<RecordBatch>,
    buffered: u64,
}

impl Partitioner {
    /// A partitioner cutting at `target` bytes.
    pub fn new(target: u64) -> Self {
        Self {
            target: target.max(1),
            buffer: Vec::new(),
            buffered: 0,
        }
    }

    /// Adds a batch; returns the partitions it completed.
    pub fn push(&mut self, mut batch: RecordBatch) -> Vec<Vec<RecordBatch>> {
        let mut ready = Vec::new();
        while batch.num_rows() > 0 {
            let room = self.target - self.buffered;
            let bytes = batch_bytes(&batch);
            if bytes >= self.alone_bytes() && bytes <= self.target {
                ready.extend(self.flush());
                ready.push(vec![batch]);
                break;
            }
            if bytes <= room {
                self.buffered += bytes;
                self.buffer.push(batch);
                if self.buffered == self.target {
                    ready.extend(self.flush());
                }
                break;
            }
            let rows = rows_within(&batch, room);
            if rows == 0 && !self.buffer.is_empty() {
                ready.extend(self.flush());
                continue;
            }
            let rows = rows.max(1);
            self.buffer.push(batch.slice(0, rows));
            ready.extend(self.flush());
            batch = batch.slice(rows, batch.num_rows() - rows);
        }
        ready
    }

    /// Batches this large are partitions by themselves: 1 MiB, or an eighth
    /// of the target when that is smaller.
    pub fn alone_bytes(&self) -> u64 {
        (self.target / 8).clamp(1, 1 << 20)
    }

    /// The rows gathered but not yet cut, as a last partition.
    pub fn flush(&mut self) -> Option<Vec<RecordBatch>> {
        self.buffered = 0;
        Some(std::mem::take(&mut self.buffer)).filter(|parts| !parts.is_empty())
    }
}

/// A partition's gathered batches as one batch (`parts` is not empty).
pub fn joined(mut parts: Vec<RecordBatch>) -> Result<RecordBatch> {
    if parts.len() == 1 {
        return Ok(parts.pop().expect("one"));
    }
    arrow_select::concat::concat_batches(&parts[0].schema(), &parts)
        .map_err(|e| Error::arrow("joining output batches", e))
}

/// The most leading rows of `batch` whose bytes fit in `room`.
fn rows_within(batch: &RecordBatch, room: u64) -> usize {
    let (mut lo, mut hi) = (0, batch.num_rows());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if batch_bytes(&batch.slice(0, mid)) <= room {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Int64Array;

    fn ints(n: i64) -> RecordBatch {
        RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from_iter_values(0..n)) as _)])
            .unwrap()
    }

    fn values(parts: &[RecordBatch]) -> Vec<i64> {
        parts
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect()
    }

    /// A holder whose partitions hold `rows` rows, whatever it reported.
    struct Holder {
        rows: i64,
    }

    impl RemoteSource for Holder {
        fn fetch(&self, _: &str, _: u64, _: Arc<RemotePart>) -> Result<RecordBatch> {
            Ok(ints(self.rows))
        }
        fn release(&self, _: &str, _: u64) {}
    }

    #[test]
    fn a_remote_partition_whose_rows_differ_from_its_report_is_an_error() {
        for held in [3, 10] {
            let source = Arc::new(Holder { rows: held });
            let part = RemotePart::new((1, "worker-1".into()), (7, 5, 40), source, None);
            let slice = Slice::remote(part);
            for read in [slice.clone(), slice.sub(2, 3)] {
                let err = read.read().unwrap_err().to_string();
                assert!(
                    err.contains("worker-1") && err.contains(&format!("{held} rows")),
                    "{err}"
                );
            }
        }
        let part = RemotePart::new(
            (1, "worker-1".into()),
            (7, 5, 40),
            Arc::new(Holder { rows: 5 }),
            None,
        );
        assert_eq!(
            values(&[Slice::remote(part).sub(2, 3).read().unwrap()]),
            [2, 3, 4]
        );
    }

    #[test]
    fn joins_small_batches_up_to_target_keeping_rows_in_order() {
        let mut p = Partitioner::new(800); // 100 rows of i64; alone from 100 bytes
        let mut parts = Vec::new();
        for _ in 0..45 {
            parts.extend(p.push(ints(5)));
            parts.extend(p.push(ints(10).slice(0, 0)));
        }
        parts.extend(p.flush());
        let parts: Vec<RecordBatch> = parts.into_iter().map(|p| joined(p).unwrap()).collect();
        assert_eq!(
            parts.iter().map(batch_bytes).collect::<Vec<_>>(),
            vec![800, 800, 200]
        );
        assert_eq!(
            values(&parts),
            (0..45).flat_map(|_| 0..5).collect::<Vec<i64>>()
        );
    }

    #[test]
    fn large_batches_pass_alone_without_copy() {
        let mut p = Partitioner::new(800);
        let mut parts = p.push(ints(5));
        let big = ints(45);
        parts.extend(p.push(big.clone()));
        parts.extend(p.flush());
        let parts: Vec<RecordBatch> = parts.into_iter().map(|p| joined(p).unwrap()).collect();
        assert_eq!(
            parts.iter().map(|b| b.num_rows()).collect::<Vec<_>>(),
            vec![5, 45]
        );
        assert_eq!(
            parts[1].column(0).to_data().buffers()[0].as_ptr(),
            big.column(0).to_data().buffers()[0].as_ptr()
        );
    }

    #[test]
    fn a_row_larger_than_target_is_a_partition_alone() {
        let mut p = Partitioner::new(4);
        let parts = p.push(ints(3));
        assert_eq!(
            parts
                .iter()
                .map(|p| joined(p.clone()).unwrap().num_rows())
                .collect::<Vec<_>>(),
            vec![1, 1, 1]
        );
    }
}
