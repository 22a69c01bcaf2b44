//! [`SharedStore`]: partitions as Arrow IPC streams in a few large,
//! pre-faulted shared-memory segments, read zero-copy, spilled to disk (least
//! recently used first, never a pinned or in-use one) when memory runs out;
//! and [`open_shared`], which reads another process's partition by name.
//!
//! This module holds the store's types and its API (put, read, pin, free);
//! where a partition's bytes go is in `placement`, opening another
//! process's partitions in `open`, removing dead processes' leftovers in
//! `stale`, and moving partitions to disk and back in `spill` (the spill
//! files themselves are `crate::spill`'s).

mod open;
mod placement;
mod spill;
mod stale;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use arrow_array::RecordBatch;
use streambatch_core::PartitionId;

pub use self::open::{SharedPartition, open_shared, open_shared_keeping, open_shared_unchecked};
use self::placement::{Reserved, Slot, fit_to_shm};
use self::stale::{process_mark, remove_stale};
use crate::alloc::aligned;
use crate::ipc;
use crate::output::OutputBuffer;
use crate::spill::{IndexCache, SpillDir, SpillFile, groups_holding, write_partition};
use crate::spill_writer::{SpillWriter, Writing};
use crate::{ObjectStore, PartitionRef, PinGuard, PutError, Release, StoreError, StoreStats};

/// Settings of a [`SharedStore`].
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Bytes of shared memory the store may map and fill.
    pub capacity: u64,
    /// Where spill files go (in a subdirectory per store).
    pub spill_dir: PathBuf,
    /// Names this node's segments; a store removes the leftovers of dead
    /// processes of the same namespace when it opens.
    pub namespace: String,
    /// What to do when `capacity` is more than /dev/shm has free: cut the
    /// capacity to fit, with a warning (false, the default, for a capacity
    /// that was not asked for), or refuse to open (true, for one the user
    /// set).
    pub strict_capacity: bool,
}

impl StoreConfig {
    /// A store of `capacity` bytes spilling to `spill_dir`, namespace `local`.
    pub fn new(capacity: u64, spill_dir: impl Into<PathBuf>) -> Self {
        Self {
            capacity,
            spill_dir: spill_dir.into(),
            namespace: "local".into(),
            strict_capacity: false,
        }
    }
}

/// The shared-memory object store.
///
/// ```
/// use std::sync::Arc;
/// use arrow_array::{Int64Array, RecordBatch};
/// use streambatch_store::{ObjectStore, SharedStore, StoreConfig};
///
/// let dir = tempfile::tempdir().unwrap();
/// let store = SharedStore::open(StoreConfig::new(64 << 20, dir.path())).unwrap();
/// let batch = RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from(vec![1, 2, 3])) as _)]).unwrap();
/// let part = store.try_put(batch.clone()).unwrap();
/// assert_eq!(part.get().unwrap(), batch); // zero-copy: its buffers are in shared memory
/// drop(part); // freed
/// assert_eq!(store.stats().used_bytes, 0);
/// ```
#[derive(Clone)]
pub struct SharedStore {
    inner: Arc<Inner>,
}

struct Inner {
    capacity: u64,
    segment_size: usize,
    prefix: String,
    /// Started by the first grouped put to find no room; dropped (its
    /// queue written) before `spill`, the directory.
    writer: OnceLock<SpillWriter>,
    spill: SpillDir,
    next_id: AtomicU64,
    /// Reserved regions alive: a put skips looking for one when there are none.
    reservations: AtomicU64,
    state: Mutex<State>,
    /// Signalled under `state`'s lock when the spill writer ends a write.
    written: Condvar,
}

#[derive(Default)]
struct State {
    segments: HashMap<usize, Slot>,
    next_segment: usize,
    /// Bytes of all segments mapped (or being made).
    mapped: u64,
    /// Bytes of the regular (shared) segments.
    regular_mapped: u64,
    used: u64,
    peak: u64,
    spilled: u64,
    restored: u64,
    frees: u64,
    /// Reserved regions by their buffer's address.
    reserved: HashMap<usize, Reserved>,
    /// Background pre-faults still running; each holds its segment.
    prefaulting: Vec<std::thread::JoinHandle<()>>,
    entries: HashMap<PartitionId, Entry>,
    clock: u64,
    /// Partitions queued on the spill writer or being written, freed or not.
    writes: usize,
}

struct Entry {
    place: Place,
    len: usize,
    /// Explicit pins plus batches being read: while above zero the
    /// partition stays in memory.
    pins: u32,
    last_use: u64,
    /// The last reference is gone; freed when the last pin goes.
    released: bool,
    /// The reserved region its bytes lie in (by its buffer's address), when
    /// the put adopted an [`OutputBuffer`] instead of copying.
    reserved: Option<usize>,
    /// Where each group of rows read alone starts, and the end (see
    /// [`ObjectStore::put_grouped`]): spilled, each is a stream of its own.
    groups: Option<Arc<[u32]>>,
}

#[derive(Clone)]
enum Place {
    Memory {
        segment: usize,
        offset: usize,
    },
    /// Its spill file, and the file's index once read.
    Disk(PathBuf, IndexCache),
    /// On its way to its spill file (see `spill_writer`), read from its
    /// batch meanwhile.
    Writing(Arc<Writing>),
    /// Its spill file could not be written: the error, for its readers.
    Lost(PathBuf, Arc<str>),
}

static STORES: AtomicU64 = AtomicU64::new(0);

impl SharedStore {
    /// Opens a store, first removing the segments and spill files that dead
    /// processes of the same namespace left behind.
    pub fn open(config: StoreConfig) -> Result<Self, StoreError> {
        let namespace: String = config
            .namespace
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let pid = std::process::id();
        let prefix = format!(
            "sb-{namespace}-{pid}-{}-{}",
            process_mark(),
            STORES.fetch_add(1, Ordering::Relaxed)
        );
        // Checked first: a directory another user controls is never
        // listed or cleaned.
        let spill = SpillDir::open(&config.spill_dir, &prefix)?;
        remove_stale(
            &namespace,
            spill.path().parent().unwrap_or(&config.spill_dir),
        );
        let capacity = fit_to_shm(config.capacity, config.strict_capacity)?;
        // A few large segments: an eighth of the capacity, 8..256 MiB.
        let segment_size = aligned((capacity / 8).clamp(8 << 20, 256 << 20).min(capacity) as usize);
        Ok(Self {
            inner: Arc::new(Inner {
                capacity,
                segment_size,
                spill,
                prefix,
                next_id: AtomicU64::new(1),
                reservations: AtomicU64::new(0),
                state: Mutex::new(State::default()),
                writer: OnceLock::new(),
                written: Condvar::new(),
            }),
        })
    }

    /// The name under which another process on this host can open the
    /// partition with [`open_shared`](crate::open_shared), while it is in memory.
    pub fn shared_name(&self, part: &PartitionRef) -> Option<String> {
        let state = self.inner.state();
        let entry = state.entries.get(&part.id())?;
        match entry.place {
            Place::Memory { segment, offset } => {
                let name = state.segments[&segment].segment.name().to_string();
                Some(format!("{name}@{offset}+{}", entry.len))
            }
            _ => None,
        }
    }

    /// The spill file of a partition that is on disk.
    pub fn spill_path(&self, id: PartitionId) -> Option<PathBuf> {
        match &self.inner.state().entries.get(&id)?.place {
            Place::Disk(path, _) => Some(path.clone()),
            _ => None,
        }
    }

    /// Waits until the store's spill files are as its partitions are: a
    /// partition's file that is being written (see `spill_writer`) is
    /// written, and a freed partition's file is removed. Both happen on
    /// threads of the store's, not in the call that put or freed it.
    pub fn settle_disk(&self) {
        self.writes_settled();
        self.inner.spill.settle();
    }

    /// The address range of the segment holding a partition in memory.
    pub fn segment_range(&self, id: PartitionId) -> Option<std::ops::Range<usize>> {
        let state = self.inner.state();
        match state.entries.get(&id)?.place {
            Place::Memory { segment, .. } => {
                let seg = &state.segments[&segment].segment;
                let base = seg.base().as_ptr() as usize;
                Some(base..base + seg.len())
            }
            _ => None,
        }
    }

    /// Names of the segments this store has mapped.
    pub fn segment_names(&self) -> Vec<String> {
        self.inner
            .state()
            .segments
            .values()
            .map(|s| s.segment.name().to_string())
            .collect()
    }

    /// A partition's bytes as the store holds them (an Arrow IPC stream),
    /// for sending to another node: a view of its shared memory, which keeps
    /// it pinned while the buffer lives, or its spill file mapped.
    pub fn encoded_bytes(&self, part: &PartitionRef) -> Result<arrow_buffer::Buffer, StoreError> {
        let id = part.id();
        match self.inner.encoded(id)? {
            Encoded::Memory(bytes) => Ok(bytes),
            Encoded::Disk(file, None) => {
                let bytes = file
                    .single_stream()
                    .map_err(|source| StoreError::Spill { id, source })?;
                self.inner.state().restored += file.take_bytes_read();
                Ok(bytes)
            }
            Encoded::Disk(file, Some(groups)) => {
                let batch = file
                    .read_groups(&groups, 0..groups.len() - 1)
                    .map_err(|source| StoreError::Spill { id, source })?;
                self.inner.state().restored += file.take_bytes_read();
                ipc::encode_to_buffer(&batch).map_err(StoreError::Encode)
            }
            Encoded::Batch(batch) => ipc::encode_to_buffer(&batch).map_err(StoreError::Encode),
        }
    }

    /// Its spill directory.
    pub fn spill_dir(&self) -> &Path {
        self.inner.spill.path()
    }

    fn store(
        &self,
        batch: RecordBatch,
        groups: Option<&[u32]>,
        may_spill: bool,
    ) -> Result<PartitionRef, PutError> {
        let rows = batch.num_rows();
        // Groups that do not cut these rows in order are not kept.
        let groups: Option<Arc<[u32]>> = groups
            .filter(|g| crate::cuts_in_order(g, rows))
            .map(Arc::from);
        let encoded = ipc::encode(&batch).map_err(|e| PutError::Store(StoreError::Encode(e)))?;
        if let Some(part) = self.adopt(&encoded, rows, &groups) {
            return Ok(part);
        }
        let len = encoded.len;
        let capacity = self.inner.capacity;
        if len as u64 > capacity && !may_spill {
            return Err(PutError::TooLarge {
                batch,
                needed: len as u64,
                capacity,
            });
        }
        let id = PartitionId(self.inner.next_id.fetch_add(1, Ordering::Relaxed));
        let mut state = self.inner.state();
        let place = loop {
            let (guard, place) = self.inner.allocate(state, len);
            state = guard;
            if let Some(place) = place.map_err(PutError::Store)? {
                break place;
            }
            if !may_spill {
                let used = state.used;
                return Err(PutError::Full {
                    batch,
                    needed: len as u64,
                    used,
                    capacity,
                });
            }
            // An exchange's map output (a grouped partition) that finds no
            // room goes to disk itself rather than push others out: they
            // are all read only once every one is in, so none is hotter,
            // and its own write skips the copy into memory and the
            // decode and re-encode a spill of another takes. It is written
            // with the lock let go, so other tasks' puts and reads go on.
            let victim = match groups {
                None => state.lru_victim(),
                Some(_) => None,
            };
            match victim {
                Some(victim) => self
                    .inner
                    .spill(&mut state, victim)
                    .map_err(PutError::Store)?,
                None => {
                    // This partition goes straight to disk (nothing else
                    // can, or it is grouped).
                    drop(state);
                    let path = self.inner.spill_file(id).map_err(PutError::Store)?;
                    if let Some(groups) = &groups {
                        let writing = Arc::new(Writing {
                            batch,
                            groups: groups.clone(),
                            path,
                        });
                        return self.write_behind(id, rows, len, writing);
                    }
                    write_partition(&path, &batch, &encoded, groups.as_deref())
                        .map_err(PutError::Store)?;
                    let place = Place::Disk(path, IndexCache::default());
                    return Ok(self.listed(id, rows, len, place, groups));
                }
            }
        };
        let Place::Memory { segment, offset } = place else {
            unreachable!("allocate returns memory")
        };
        let target = state.segments[&segment].segment.clone();
        drop(state);
        // SAFETY: the allocator gave this region to this partition alone.
        encoded.write_to(unsafe { target.region_mut(offset, len) });
        self.inner.state().list(id, place, len, groups);
        Ok(PartitionRef::new(id, rows, len as u64, self.inner.clone()))
    }
}

impl ObjectStore for SharedStore {
    /// The store's own spill directory, removed with it (and as stale
    /// after a crash, as its spill files are).
    fn scratch_dir(&self) -> Result<Option<&Path>, StoreError> {
        self.inner.spill.made().map(Some)
    }

    fn count_scratch(&self, bytes: u64) {
        self.inner.state().spilled += bytes;
    }

    fn reserve(&self, len: usize) -> Option<OutputBuffer> {
        self.reserve_region(len)
    }

    fn try_put(&self, batch: RecordBatch) -> Result<PartitionRef, PutError> {
        self.store(batch, None, false)
    }

    fn put(&self, batch: RecordBatch) -> Result<PartitionRef, StoreError> {
        self.put_grouped(batch, &[])
    }

    fn try_put_grouped(
        &self,
        batch: RecordBatch,
        groups: &[u32],
    ) -> Result<PartitionRef, PutError> {
        self.store(batch, Some(groups), false)
    }

    fn put_grouped(&self, batch: RecordBatch, groups: &[u32]) -> Result<PartitionRef, StoreError> {
        self.store(batch, Some(groups), true).map_err(|e| match e {
            PutError::Store(e) => e,
            PutError::Full { .. } | PutError::TooLarge { .. } => {
                unreachable!("a put that may spill is never full: {e}")
            }
        })
    }

    fn get(&self, id: PartitionId) -> Result<RecordBatch, StoreError> {
        self.inner.read_range(id, None, false)
    }

    fn pin(&self, id: PartitionId) -> Result<PinGuard, StoreError> {
        let mut state = self.inner.state();
        // A partition being written is pinned from its file, once written.
        while matches!(
            state.entries.get(&id).map(|e| &e.place),
            Some(Place::Writing(_))
        ) {
            state = self
                .inner
                .written
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
        if let Some(Place::Lost(path, message)) = state.entries.get(&id).map(|e| &e.place) {
            return Err(StoreError::SpillWrite {
                id,
                path: path.clone(),
                message: message.to_string(),
            });
        }
        if matches!(
            state.entries.get(&id).ok_or(StoreError::Missing(id))?.place,
            Place::Disk(..)
        ) {
            state = self.inner.restore(state, id)?;
        }
        let entry = state.entries.get_mut(&id).ok_or(StoreError::Missing(id))?;
        entry.pins += 1;
        Ok(PinGuard::new(Arc::new(Pinned {
            inner: self.inner.clone(),
            id,
        })))
    }

    fn stats(&self) -> StoreStats {
        let state = self.inner.state();
        StoreStats {
            capacity_bytes: self.inner.capacity,
            used_bytes: state.used,
            peak_bytes: state.peak,
            partitions: state.entries.len(),
            spilled_bytes: state.spilled,
            restored_bytes: state.restored,
            frees: state.frees,
        }
    }
}

/// Keeps a partition in memory: an explicit pin, or a batch being read.
struct Pinned {
    inner: Arc<Inner>,
    id: PartitionId,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let mut state = self.inner.state();
        let Some(entry) = state.entries.get_mut(&self.id) else {
            return;
        };
        entry.pins -= 1;
        if entry.pins == 0 && entry.released {
            self.inner.free(&mut state, self.id);
        }
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every update under the lock is a handful of field writes that
        // cannot panic halfway, so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rows `rows` of partition `id` (all of them when `None`). From
    /// memory, a view that pins the partition while it lives; from a spill
    /// file, only the groups that hold them are read. With `alone`, rows
    /// that are a small part of what was read are copied out of it, so as
    /// not to hold the rest (see [`PartitionRef::get_rows`]).
    fn read_range(
        self: &Arc<Self>,
        id: PartitionId,
        rows: Option<std::ops::Range<usize>>,
        alone: bool,
    ) -> Result<RecordBatch, StoreError> {
        let (read, first) = match self.encoded(id)? {
            // SAFETY: this store encoded these bytes from a valid batch.
            Encoded::Memory(bytes) => (
                unsafe { ipc::decode_trusted(&bytes) }
                    .map_err(|source| StoreError::Decode { id, source })?,
                0,
            ),
            Encoded::Batch(batch) => (batch, 0),
            Encoded::Disk(file, groups) => {
                #[cfg(test)]
                tests::after_lookup();
                let (groups, first, count) = match (groups, &rows) {
                    (Some(groups), Some(rows)) => {
                        let (first, count) = groups_holding(&groups, rows);
                        (groups, first, count)
                    }
                    (Some(groups), None) => {
                        let count = groups.len() - 1;
                        (groups, 0, count)
                    }
                    (None, _) => (Arc::from([0, u32::MAX].as_slice()), 0, 1),
                };
                let read = file
                    .read_groups(&groups, first..first + count)
                    .map_err(|source| StoreError::Spill { id, source })?;
                self.state().restored += file.take_bytes_read();
                (read, groups[first] as usize)
            }
        };
        let Some(rows) = rows else {
            return Ok(read);
        };
        let Some(at) = rows
            .start
            .checked_sub(first)
            .filter(|at| rows.start <= rows.end && at + rows.len() <= read.num_rows())
        else {
            return Err(StoreError::RowsOutOfRange {
                id,
                rows,
                held: read.num_rows(),
            });
        };
        let slice = read.slice(at, rows.len());
        if !alone || rows.len() * 2 > read.num_rows() {
            return Ok(slice);
        }
        let indices = arrow_array::UInt32Array::from_iter_values(0..rows.len() as u32);
        arrow_select::take::take_record_batch(&slice, &indices).map_err(StoreError::Encode)
    }

    /// The partition's IPC stream bytes where they lie: in memory (a view
    /// that pins the partition while it lives) or in its spill file, opened
    /// under the lock: a free or a restore may remove the file's name as
    /// soon as the lock goes, but not the open file (its pin, in effect).
    fn encoded(self: &Arc<Self>, id: PartitionId) -> Result<Encoded, StoreError> {
        let mut state = self.state();
        let tick = state.tick();
        let entry = state.entries.get_mut(&id).ok_or(StoreError::Missing(id))?;
        entry.last_use = tick;
        let (len, place) = (entry.len, entry.place.clone());
        match place {
            Place::Memory { segment, offset } => {
                entry.pins += 1;
                let seg = state.segments[&segment].segment.clone();
                drop(state);
                let pin = Pinned {
                    inner: self.clone(),
                    id,
                };
                // SAFETY: offset..offset + len is this partition's region;
                // the pin keeps it allocated (and unspilled) while the
                // buffer lives, and nothing writes to it after the put.
                let ptr =
                    unsafe { std::ptr::NonNull::new_unchecked(seg.base().as_ptr().add(offset)) };
                Ok(Encoded::Memory(unsafe {
                    ipc::view(ptr, len, Arc::new((pin, seg)))
                }))
            }
            Place::Disk(path, index) => {
                let file = SpillFile::open_cached(&path, &index)
                    .map_err(|source| StoreError::Spill { id, source })?;
                Ok(Encoded::Disk(file, entry.groups.clone()))
            }
            Place::Writing(writing) => Ok(Encoded::Batch(writing.batch.clone())),
            Place::Lost(path, message) => Err(StoreError::SpillWrite {
                id,
                path,
                message: message.to_string(),
            }),
        }
    }
}

/// Where a partition's encoded bytes are.
enum Encoded {
    Memory(arrow_buffer::Buffer),
    /// A partition being written: its batch.
    Batch(RecordBatch),
    /// Its spill file, open, and its groups.
    Disk(SpillFile, Option<Arc<[u32]>>),
}

impl State {
    /// Lists new partition `id` at `place`.
    fn list(&mut self, id: PartitionId, place: Place, len: usize, groups: Option<Arc<[u32]>>) {
        let entry = Entry {
            place,
            len,
            pins: 0,
            last_use: self.tick(),
            released: false,
            reserved: None,
            groups,
        };
        self.entries.insert(id, entry);
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn lru_victim(&self) -> Option<PartitionId> {
        self.entries
            .iter()
            .filter(|(_, e)| e.pins == 0 && matches!(e.place, Place::Memory { .. }))
            .min_by_key(|(_, e)| e.last_use)
            .map(|(id, _)| *id)
    }

    fn lru_victim_except(&self, keep: PartitionId) -> Option<PartitionId> {
        self.entries
            .iter()
            .filter(|(id, e)| {
                **id != keep && e.pins == 0 && matches!(e.place, Place::Memory { .. })
            })
            .min_by_key(|(_, e)| e.last_use)
            .map(|(id, _)| *id)
    }
}

impl Release for Inner {
    fn release(&self, id: PartitionId, _bytes: u64) {
        let mut state = self.state();
        let Some(entry) = state.entries.get_mut(&id) else {
            return;
        };
        entry.released = true;
        if entry.pins == 0 {
            self.free(&mut state, id);
        }
    }

    fn read(self: Arc<Self>, id: PartitionId) -> Result<RecordBatch, StoreError> {
        self.read_range(id, None, false)
    }

    fn groups(&self, id: PartitionId) -> Option<Arc<[u32]>> {
        self.state().entries.get(&id)?.groups.clone()
    }

    fn read_rows(
        self: Arc<Self>,
        id: PartitionId,
        rows: std::ops::Range<usize>,
        alone: bool,
    ) -> Result<RecordBatch, StoreError> {
        self.read_range(id, Some(rows), alone)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Segments unlink themselves when their last holder drops: wait for
        // the pre-faults (each holds its segment), so that none outlives the
        // store if the process exits right after.
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for prefault in state.prefaulting.drain(..) {
            let _ = prefault.join();
        }
        // The spill directory goes when `spill` drops, right after.
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::RefCell;

    use arrow_array::{ArrayRef, BinaryArray, StringArray};

    use super::*;

    thread_local! {
        static AFTER_LOOKUP: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
    }

    /// Runs the hook a test set, once: between a read finding that its
    /// partition is on disk (and letting go of the lock) and reading it.
    pub(super) fn after_lookup() {
        if let Some(hook) = AFTER_LOOKUP.with(|h| h.borrow_mut().take()) {
            hook();
        }
    }

    fn when_read_has_looked_up(hook: impl FnOnce() + 'static) {
        AFTER_LOOKUP.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
    }

    pub(crate) fn strings() -> RecordBatch {
        let values: StringArray = (0..20_000).map(|i| Some(format!("value-{i}"))).collect();
        RecordBatch::try_from_iter([("s", Arc::new(values) as ArrayRef)]).unwrap()
    }

    pub(crate) fn open(capacity: u64, dir: &Path) -> SharedStore {
        let mut config = StoreConfig::new(capacity, dir);
        config.namespace = "pinread".into();
        SharedStore::open(config).unwrap()
    }

    /// A partition cut in 4 groups (one empty) of `strings()`' rows.
    pub(crate) const GROUPS: [u32; 5] = [0, 5_000, 5_000, 12_000, 20_000];

    /// Fills a store of 4 MiB with a partition that spills `part` (the
    /// first one put) and drops it.
    pub(crate) fn spill_first(store: &SharedStore) {
        let data: ArrayRef = Arc::new(BinaryArray::from_vec(vec![
            vec![1u8; (4 << 20) - (64 << 10)].as_slice(),
        ]));
        drop(store.put(RecordBatch::try_from_iter([("data", data)]).unwrap()));
    }

    #[test]
    fn groups_that_do_not_cut_the_rows_in_order_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(4 << 20, dir.path());
        for groups in [
            &[0, 30_000][..],
            &[0, 7_000, 5_000, 20_000],
            &[1, 20_000],
            &[0],
        ] {
            let part = store.put_grouped(strings(), groups).unwrap();
            assert!(part.groups().is_none(), "{groups:?} kept");
            spill_first(&store);
            assert_eq!(
                part.get_rows(100..200, true).unwrap(),
                strings().slice(100, 100)
            );
        }
    }

    #[test]
    fn a_read_of_a_spilled_partition_survives_its_restore_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(4 << 20, dir.path());
        let part = store.put(strings()).unwrap();
        let data: ArrayRef = Arc::new(BinaryArray::from_vec(vec![
            vec![1u8; (4 << 20) - (64 << 10)].as_slice(),
        ]));
        let big = store
            .put(RecordBatch::try_from_iter([("data", data)]).unwrap())
            .unwrap();
        assert!(store.spill_path(part.id()).is_some(), "spilled");
        drop(big);
        // It is pinned as the read starts: the restore moves it to memory
        // and removes its spill file.
        let (other, id) = (store.clone(), part.id());
        let pinned = Arc::new(Mutex::new(None));
        let keep = pinned.clone();
        when_read_has_looked_up(move || *keep.lock().unwrap() = Some(other.pin(id).unwrap()));
        assert_eq!(part.get().unwrap(), strings());
        assert!(pinned.lock().unwrap().is_some());
        assert!(store.spill_path(id).is_none(), "restored");
    }

    #[test]
    fn a_read_of_a_spilled_partition_survives_its_free_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(64 << 10, dir.path());
        let part = store.put(strings()).unwrap();
        let (id, path) = (part.id(), store.spill_path(part.id()).expect("on disk"));
        // The last reference goes as the read starts.
        when_read_has_looked_up(move || drop(part));
        let read = store.get(id);
        store.settle_disk();
        assert!(!path.exists(), "freed");
        match read {
            Ok(batch) => assert_eq!(batch, strings()),
            Err(StoreError::Missing(_)) => {}
            Err(e) => panic!("a read that raced a free failed with: {e}"),
        }
        assert_eq!(store.stats().partitions, 0);
    }
}
