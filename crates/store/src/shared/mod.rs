//! [`SharedStore`]: partitions as Arrow IPC streams in a few large,
//! pre-faulted shared-memory segments, read zero-copy, spilled to disk (least
//! recently used first, never a pinned or in-use one) when memory runs out;
//! and [`open_shared`], which reads another process's partition by name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use arrow_array::RecordBatch;
use streambatch_core::{PartitionId, format_bytes};

use crate::alloc::{ALIGN, Allocator, aligned};
use crate::ipc;
use crate::output::OutputBuffer;
use crate::segment::{self, Segment};
use crate::spill::{self, IndexCache, SpillDir, SpillFile};
use crate::spill_writer::{SpillWriter, Writing, Written};
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

struct Slot {
    segment: Arc<Segment>,
    alloc: Allocator,
    /// Made for one large partition; unmapped when it is freed.
    dedicated: bool,
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

/// A region handed out as an [`OutputBuffer`]: room for the IPC framing
/// before and after the buffer, so that a put can adopt it in place.
#[derive(Clone, Copy)]
struct Reserved {
    segment: usize,
    offset: usize,
    total: usize,
    len: usize,
    /// The buffer's owner and, once adopted, the partition.
    holders: u32,
    adopted: bool,
}

/// Holds a reserved region for the buffer made from it.
struct ReservedOwner {
    inner: Arc<Inner>,
    addr: usize,
    _segment: Arc<Segment>,
}

impl Drop for ReservedOwner {
    fn drop(&mut self) {
        let mut state = self.inner.state();
        self.inner.drop_holder(&mut state, self.addr);
    }
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

/// This process's mark in its stores' names, beside its pid: a dead
/// process that had the same pid (a reused pid, a container's pid 1) may
/// have left segments and spill directories under names this process would
/// otherwise make again, and is told apart by its start time.
fn process_mark() -> &'static str {
    static MARK: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    MARK.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{:x}", nanos as u64)
    })
}

/// The first segment's size; later ones double the total up to the largest.
const FIRST_SEGMENT: u64 = 4 << 20;

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

    /// Waits until the spill writer has written (or failed) every
    /// partition it was given.
    fn writes_settled(&self) {
        let mut state = self.inner.state();
        while state.writes > 0 {
            state = self
                .inner
                .written
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
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
                let batch = read_groups(&file, &groups, 0..groups.len() - 1)
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

    /// Lists partition `id`, spilled at `place` as it was put.
    fn listed(
        &self,
        id: PartitionId,
        rows: usize,
        len: usize,
        place: Place,
        groups: Option<Arc<[u32]>>,
    ) -> PartitionRef {
        let mut state = self.inner.state();
        state.spilled += len as u64;
        state.writes += usize::from(matches!(place, Place::Writing(_)));
        state.list(id, place, len, groups);
        PartitionRef::new(id, rows, len as u64, self.inner.clone())
    }

    /// Lists grouped partition `id` as being written and queues its write
    /// on the spill writer (written here where the writer cannot start).
    fn write_behind(
        &self,
        id: PartitionId,
        rows: usize,
        len: usize,
        writing: Arc<Writing>,
    ) -> Result<PartitionRef, PutError> {
        let writer = match self.inner.writer.get() {
            Some(writer) => Some(writer),
            None => SpillWriter::start(Arc::downgrade(&self.inner))
                .ok()
                .map(|started| self.inner.writer.get_or_init(|| started)),
        };
        let groups = Some(writing.groups.clone());
        let place = Place::Writing(writing.clone());
        let part = self.listed(id, rows, len, place, groups);
        let unqueued = match writer {
            Some(writer) => writer.queue(id, writing).err(),
            None => Some(writing),
        };
        if let Some(writing) = unqueued {
            let outcome = spill::write_groups(&writing.path, &writing.batch, &writing.groups)
                .map_err(|e| e.to_string());
            self.inner.written(id, &writing, outcome);
        }
        Ok(part)
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
                    write_spill(&path, &batch, &encoded, groups.as_deref())
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

/// Room before a reserved buffer for the IPC framing and the batch's
/// smaller buffers that come before it, and after it for those that follow.
const RESERVE_HEAD: usize = 64 << 10;
const RESERVE_TAIL: usize = 4 << 10;
/// Below this a copy costs less than the room reserved around the buffer.
const RESERVE_MIN: usize = 1 << 20;

impl SharedStore {
    /// Stores `encoded` in place if one of its pieces is a reserved buffer
    /// not yet adopted and the rest of the stream fits around it: the
    /// pieces before it are written in the room before, those after it in
    /// the room after, and the partition's bytes are exactly the stream a
    /// copying put would write. `None`: it must be copied.
    fn adopt(
        &self,
        encoded: &ipc::Encoded,
        rows: usize,
        groups: &Option<Arc<[u32]>>,
    ) -> Option<PartitionRef> {
        if self.inner.reservations.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut state = self.inner.state();
        let pieces: Vec<&[u8]> = encoded.pieces().collect();
        let (at, addr, reserved) = pieces.iter().enumerate().find_map(|(at, p)| {
            let addr = p.as_ptr() as usize;
            let r = state.reserved.get(&addr)?;
            // The whole buffer: the pieces after it are written right behind
            // it, which must not be bytes of the buffer the batch still reads.
            (!r.adopted && p.len() == r.len).then_some((at, addr, *r))
        })?;
        let before: usize = pieces[..at].iter().map(|p| p.len()).sum();
        let after: usize = pieces[at + 1..].iter().map(|p| p.len()).sum();
        let data = reserved.offset + RESERVE_HEAD;
        let end = data + pieces[at].len() + after;
        if before > RESERVE_HEAD
            || !before.is_multiple_of(ALIGN)
            || end > reserved.offset + reserved.total
        {
            return None;
        }
        let segment = state.segments[&reserved.segment].segment.clone();
        let write = |mut offset: usize, pieces: &[&[u8]]| {
            for piece in pieces {
                // SAFETY: inside the reserved region, around the buffer (which
                // is not written), and nobody else writes there.
                unsafe { segment.region_mut(offset, piece.len()) }.copy_from_slice(piece);
                offset += piece.len();
            }
        };
        write(data - before, &pieces[..at]);
        write(data + pieces[at].len(), &pieces[at + 1..]);
        let r = state.reserved.get_mut(&addr).expect("found above");
        r.adopted = true;
        r.holders += 1;
        let id = PartitionId(self.inner.next_id.fetch_add(1, Ordering::Relaxed));
        let entry = Entry {
            place: Place::Memory {
                segment: reserved.segment,
                offset: data - before,
            },
            len: encoded.len,
            pins: 0,
            last_use: state.tick(),
            released: false,
            reserved: Some(addr),
            groups: groups.clone(),
        };
        state.entries.insert(id, entry);
        Some(PartitionRef::new(
            id,
            rows,
            encoded.len as u64,
            self.inner.clone(),
        ))
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
        if len < RESERVE_MIN {
            return None;
        }
        let total = RESERVE_HEAD + aligned(len) + RESERVE_TAIL;
        let (mut state, place) = self.inner.allocate(self.inner.state(), total);
        // Without room, or a segment, the buffer goes on the heap.
        let Ok(Some(Place::Memory { segment, offset })) = place else {
            return None;
        };
        let seg = state.segments[&segment].segment.clone();
        // SAFETY: inside the region just allocated.
        let ptr = unsafe {
            std::ptr::NonNull::new_unchecked(seg.base().as_ptr().add(offset + RESERVE_HEAD))
        };
        let addr = ptr.as_ptr() as usize;
        self.inner.reservations.fetch_add(1, Ordering::Relaxed);
        state.reserved.insert(
            addr,
            Reserved {
                segment,
                offset,
                total,
                len,
                holders: 1,
                adopted: false,
            },
        );
        drop(state);
        let owner = Arc::new(ReservedOwner {
            inner: self.inner.clone(),
            addr,
            _segment: seg,
        });
        // SAFETY: the region is this buffer's alone until the owner drops
        // (a partition adopting it holds it too, and only reads it).
        Some(unsafe { OutputBuffer::in_store(ptr, len, owner) })
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

    /// Room for `len` bytes in memory: in a segment, a new segment while the
    /// capacity allows, or a dedicated segment for a partition larger than
    /// the largest segment. New segments grow geometrically (4 MiB, 4, 8, 16,
    /// ... up to the largest, each a whole multiple of the partition that
    /// asks for it), so a small job maps and pre-faults little; they are
    /// made with the lock released, since pre-faulting takes time. `None`:
    /// no room; an error: a segment could not be made.
    fn allocate<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        len: usize,
    ) -> (MutexGuard<'a, State>, Result<Option<Place>, StoreError>) {
        let capacity = self.capacity;
        loop {
            if state.used + aligned(len) as u64 > capacity {
                return (state, Ok(None));
            }
            let found = state
                .segments
                .iter_mut()
                .filter(|(_, s)| !s.dedicated)
                .find_map(|(&n, s)| s.alloc.alloc(len).map(|offset| (n, offset)));
            if let Some((segment, offset)) = found {
                state.used += aligned(len) as u64;
                state.peak = state.peak.max(state.used);
                return (state, Ok(Some(Place::Memory { segment, offset })));
            }
            let dedicated = len > self.segment_size;
            let unit = aligned(len);
            let mut size = if dedicated {
                unit
            } else {
                // (A store smaller than the first segment has smaller segments.)
                let most = self.segment_size as u64;
                let target = state.regular_mapped.clamp(FIRST_SEGMENT.min(most), most) as usize;
                // Whole multiples of this partition: a run of equal-sized
                // partitions, the usual case, then fills it without a hole.
                (target / unit).max(1) * unit
            };
            if state.mapped + size as u64 > capacity {
                // Give back empty segments to make room for this one.
                let empty: Vec<usize> = state
                    .segments
                    .iter()
                    .filter(|(_, s)| s.alloc.is_empty())
                    .map(|(&n, _)| n)
                    .collect();
                for n in empty {
                    if state.mapped + size as u64 <= capacity {
                        break;
                    }
                    let slot = state.segments.remove(&n).expect("listed above");
                    state.unmap(&slot);
                }
                if state.mapped + size as u64 > capacity {
                    // The last segment: as many of this partition as still
                    // fit (a dedicated one, exactly one, never fits here).
                    let room = (capacity - state.mapped) as usize;
                    if room < unit {
                        return (state, Ok(None));
                    }
                    size = room / unit * unit;
                }
            }
            let n = state.next_segment;
            state.next_segment += 1;
            state.mapped += size as u64;
            drop(state);
            let created = Segment::create(&format!("{}-{n}", self.prefix), size);
            state = self.state();
            let segment = match created {
                Ok(segment) => segment,
                // Not "full": the store has room, the system refused it.
                Err(e) => {
                    state.mapped -= size as u64;
                    return (state, Err(e));
                }
            };
            let segment = Arc::new(segment);
            let background = segment.clone();
            let prefault = std::thread::spawn(move || background.prefault());
            state.prefaulting.retain(|t| !t.is_finished());
            state.prefaulting.push(prefault);
            let mut alloc = Allocator::new(size);
            if dedicated {
                let offset = alloc
                    .alloc(len)
                    .expect("a dedicated segment fits its partition");
                state.segments.insert(
                    n,
                    Slot {
                        segment: segment.clone(),
                        alloc,
                        dedicated,
                    },
                );
                state.used += aligned(len) as u64;
                state.peak = state.peak.max(state.used);
                return (state, Ok(Some(Place::Memory { segment: n, offset })));
            }
            state.regular_mapped += size as u64;
            state.segments.insert(
                n,
                Slot {
                    segment: segment.clone(),
                    alloc,
                    dedicated,
                },
            );
        }
    }

    fn free(&self, state: &mut State, id: PartitionId) {
        let Some(entry) = state.entries.remove(&id) else {
            return;
        };
        state.frees += 1;
        match entry.place {
            Place::Memory { segment, offset } => {
                self.release_memory(state, segment, offset, entry.len, entry.reserved)
            }
            Place::Disk(path, _) => self.spill.remove(path),
            // The writer removes the file it finds no partition for; a
            // failed write left none (a file at the name is not ours).
            Place::Writing(_) | Place::Lost(..) => {}
        }
    }

    /// Gives back a partition's memory: its region, or its hold on the
    /// reserved region it was adopted in.
    fn release_memory(
        &self,
        state: &mut State,
        segment: usize,
        offset: usize,
        len: usize,
        reserved: Option<usize>,
    ) {
        match reserved {
            Some(addr) => self.drop_holder(state, addr),
            None => self.free_region(state, segment, offset, len),
        }
    }

    /// One holder of a reserved region lets go; the last frees it.
    fn drop_holder(&self, state: &mut State, addr: usize) {
        let r = state
            .reserved
            .get_mut(&addr)
            .expect("a held region is listed");
        r.holders -= 1;
        if r.holders == 0 {
            let r = state.reserved.remove(&addr).expect("present");
            self.reservations.fetch_sub(1, Ordering::Relaxed);
            self.free_region(state, r.segment, r.offset, r.total);
        }
    }

    fn free_region(&self, state: &mut State, segment: usize, offset: usize, len: usize) {
        state.used -= aligned(len) as u64;
        let slot = state
            .segments
            .get_mut(&segment)
            .expect("a live partition's segment is mapped");
        slot.alloc.free(offset, len);
        if slot.dedicated {
            let slot = state.segments.remove(&segment).expect("present");
            state.unmap(&slot);
        }
    }

    fn spill_file(&self, id: PartitionId) -> Result<PathBuf, StoreError> {
        self.spill.file(id)
    }

    /// Moves a partition from memory to a spill file.
    fn spill(&self, state: &mut State, id: PartitionId) -> Result<(), StoreError> {
        let entry = &state.entries[&id];
        let (len, reserved, Place::Memory { segment, offset }) =
            (entry.len, entry.reserved, entry.place.clone())
        else {
            return Ok(());
        };
        let path = self.spill_file(id)?;
        let seg = state.segments[&segment].segment.clone();
        // SAFETY: the region belongs to this partition, which nobody reads
        // (no pins) or writes (written before it was listed).
        let bytes = unsafe { seg.region_mut(offset, len) };
        match &entry.groups {
            None => spill::write(&path, [[&*bytes]]).map_err(|e| StoreError::io(&path, e))?,
            Some(groups) => {
                let ptr = std::ptr::NonNull::new(bytes.as_mut_ptr()).expect("in a segment");
                // SAFETY: the region stays allocated and unchanged while the
                // lock is held, and the view is dropped before it is freed.
                let view = unsafe { ipc::view(ptr, len, seg.clone()) };
                // SAFETY: this store encoded these bytes from a valid batch.
                let batch = unsafe { ipc::decode_trusted(&view) }
                    .map_err(|source| StoreError::Decode { id, source })?;
                spill::write_groups(&path, &batch, groups)?;
            }
        }
        self.release_memory(state, segment, offset, len, reserved);
        state.spilled += len as u64;
        let entry = state.entries.get_mut(&id).expect("present");
        entry.place = Place::Disk(path, IndexCache::default());
        entry.reserved = None;
        Ok(())
    }

    /// Brings a spilled partition back into memory (spilling others if needed).
    fn restore<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        id: PartitionId,
    ) -> Result<MutexGuard<'a, State>, StoreError> {
        let entry = state.entries.get(&id).ok_or(StoreError::Missing(id))?;
        let (Place::Disk(path, index), groups) = (entry.place.clone(), entry.groups.clone()) else {
            return Ok(state);
        };
        // In memory the store trusts its partitions: what comes in from a
        // file is validated once, here.
        let spilled = |source| StoreError::Spill { id, source };
        let file = SpillFile::open_cached(&path, &index).map_err(spilled)?;
        let bytes = match groups {
            None => file.single_stream().map_err(spilled)?,
            // Back to one stream, as a put of the whole writes it.
            Some(groups) => {
                let batch = read_groups(&file, &groups, 0..groups.len() - 1).map_err(spilled)?;
                ipc::encode_to_buffer(&batch).map_err(StoreError::Encode)?
            }
        };
        // A group's streams joined may encode to other lengths than the
        // whole did (a validity buffer kept or not): the entry takes the new one.
        let len = bytes.len();
        let place = loop {
            let (guard, place) = self.allocate(state, len);
            state = guard;
            if let Some(place) = place? {
                break place;
            }
            match state.lru_victim_except(id) {
                Some(victim) => self.spill(&mut state, victim)?,
                None => {
                    return Err(StoreError::NoRoom {
                        id,
                        needed: len as u64,
                        capacity: self.capacity,
                    });
                }
            }
        };
        let Place::Memory { segment, offset } = place else {
            unreachable!("allocate returns memory")
        };
        // The lock was let go while segments grew: the partition may have been
        // freed or restored meanwhile.
        if !matches!(
            state.entries.get(&id).map(|e| &e.place),
            Some(Place::Disk(..))
        ) {
            self.free_region(&mut state, segment, offset, len);
            return Ok(state);
        }
        // SAFETY: a region just allocated for this partition.
        unsafe { state.segments[&segment].segment.region_mut(offset, len) }
            .copy_from_slice(bytes.as_slice());
        state.restored += len as u64;
        let entry = state.entries.get_mut(&id).expect("checked above");
        entry.place = place;
        entry.len = len;
        // Here, not on the remover: the partition may spill again at once,
        // to the same name.
        let _ = std::fs::remove_file(path);
        Ok(state)
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
                let read = read_groups(&file, &groups, first..first + count)
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

/// The groups (first, count) of `groups` (starts and the end) that hold
/// `rows`: at least one, so that even no rows read with their schema.
fn groups_holding(groups: &[u32], rows: &std::ops::Range<usize>) -> (usize, usize) {
    let n = groups.len() - 1;
    // No rows where a group starts (an empty destination's own): only
    // that group's stream is read, its header (a hash exchange's reducer
    // asks every map output for its destination, rows or not).
    let first = groups.partition_point(|&s| (s as usize) < rows.start);
    if rows.is_empty() && first < n && groups[first] as usize == rows.start {
        return (first, 1);
    }
    let first = groups
        .partition_point(|&s| s as usize <= rows.start)
        .saturating_sub(1)
        .min(n - 1);
    let end = groups.partition_point(|&s| (s as usize) < rows.end).min(n);
    (first, end.saturating_sub(first).max(1))
}

/// Groups `range` of a spill file cut at `groups`, as one batch.
fn read_groups(
    file: &SpillFile,
    groups: &[u32],
    range: std::ops::Range<usize>,
) -> Result<RecordBatch, crate::SpillError> {
    let mut batches = file.read(groups.len() - 1, range.start, range.len())?;
    // A file whose groups hold other row counts than the store wrote is
    // not this partition's.
    let counts = groups[range.start..=range.end].windows(2);
    if groups[range.end] != u32::MAX
        && counts
            .zip(&batches)
            .any(|(w, b)| b.num_rows() != (w[1] - w[0]) as usize)
    {
        return Err(crate::SpillError::Corrupt {
            path: file.path().to_path_buf(),
        });
    }
    if batches.len() == 1 {
        return Ok(batches.pop().expect("one"));
    }
    arrow_select::concat::concat_batches(&batches[0].schema(), &batches).map_err(|source| {
        crate::SpillError::Decode {
            path: file.path().to_path_buf(),
            source,
        }
    })
}

/// Writes partition `batch` (`encoded`) to a new spill file at `path`: one
/// stream per group where it has groups.
fn write_spill(
    path: &Path,
    batch: &RecordBatch,
    encoded: &ipc::Encoded,
    groups: Option<&[u32]>,
) -> Result<(), StoreError> {
    match groups {
        None => spill::write(path, [encoded.pieces()]).map_err(|e| StoreError::io(path, e)),
        Some(groups) => spill::write_groups(path, batch, groups),
    }
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

    fn unmap(&mut self, slot: &Slot) {
        self.mapped -= slot.segment.len() as u64;
        if !slot.dedicated {
            self.regular_mapped -= slot.segment.len() as u64;
        }
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

impl Written for Inner {
    fn written(&self, id: PartitionId, writing: &Arc<Writing>, outcome: Result<(), String>) {
        let mut state = self.state();
        state.writes -= 1;
        let entry = state
            .entries
            .get_mut(&id)
            .filter(|e| matches!(&e.place, Place::Writing(w) if Arc::ptr_eq(w, writing)));
        match (entry, outcome) {
            (Some(entry), Ok(())) => {
                entry.place = Place::Disk(writing.path.clone(), IndexCache::default())
            }
            (Some(entry), Err(message)) => {
                tracing::warn!(partition = %id, path = %writing.path.display(), "{message}");
                entry.place = Place::Lost(writing.path.clone(), message.into());
            }
            // Freed while it was written.
            (None, _) => self.spill.remove(writing.path.clone()),
        }
        drop(state);
        self.written.notify_all();
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

/// The capacity a store opened with `capacity` gets: segments are files in
/// /dev/shm, and touching one that the file system cannot back kills the
/// process (SIGBUS), so a capacity over what /dev/shm has free is cut to
/// that, with a warning, or with `strict` refused. (Free space is read
/// once, here: other users of /dev/shm may still take it later.)
fn fit_to_shm(capacity: u64, strict: bool) -> Result<u64, StoreError> {
    let Some(available) = segment::available() else {
        return Ok(capacity);
    };
    if capacity <= available {
        return Ok(capacity);
    }
    if strict {
        return Err(StoreError::ShmTooSmall {
            capacity,
            available,
            path: segment::DIR.into(),
        });
    }
    tracing::warn!(
        "object store capacity cut from {} to {}, what {} has free (enlarge it, or set a smaller store_capacity)",
        format_bytes(capacity),
        format_bytes(available),
        segment::DIR,
    );
    Ok(available)
}

/// Removes segments and spill directories of `namespace` whose process is dead.
fn remove_stale(namespace: &str, spill_dir: &Path) {
    let prefix = format!("sb-{namespace}-");
    let dead = |name: &str| {
        let pid = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        let mark = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.split('-').nth(1));
        pid.is_some_and(|pid| match pid == std::process::id() {
            // This pid, another mark: a dead process that had this pid.
            true => mark != Some(process_mark()),
            false => !Path::new(&format!("/proc/{pid}")).exists(),
        })
    };
    for name in segment::list(&prefix) {
        if dead(&name) {
            Segment::remove(&name);
        }
    }
    if let Ok(entries) = std::fs::read_dir(spill_dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) && dead(&name) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// A partition of another process's store, opened by its shared name.
pub struct SharedPartition {
    /// The rows; their buffers point into the mapped segment.
    pub batch: RecordBatch,
    /// The address range of this process's mapping of the segment.
    pub mapping: std::ops::Range<usize>,
}

/// Opens, zero-copy, a partition that another process on this host keeps
/// in memory (see [`SharedStore::shared_name`]), validating its bytes: the
/// offset and length must lie inside the segment, and the IPC stream must
/// pass Arrow's full validation (framing, buffer bounds, offsets, UTF-8...),
/// so that bytes from elsewhere, corrupt or not, give an error rather than
/// an out-of-bounds read. The batch's buffers point into the segment; the
/// other process must keep the partition (pinned) while it is read.
///
/// Validation reads the data once (a pass over string columns); a reader
/// that trusts the writer can skip it with [`open_shared_unchecked`].
pub fn open_shared(name: &str) -> Result<SharedPartition, StoreError> {
    open_shared_keeping(name, Arc::new(()))
}

/// [`open_shared`], with `keep` held as long as any buffer of the batch: a
/// reader that must tell the owner when it is done (so that the owner frees
/// the bytes) holds that notice in `keep`, and the owner hears of it only
/// once the last buffer is gone.
pub fn open_shared_keeping(
    name: &str,
    keep: Arc<dyn std::any::Any + Send + Sync>,
) -> Result<SharedPartition, StoreError> {
    let (bytes, mapping, place) = map_shared(name, keep)?;
    let batch = ipc::decode(&bytes).map_err(|source| place.invalid(source))?;
    Ok(SharedPartition { batch, mapping })
}

/// [`open_shared`] without validating the IPC stream: nothing reads the data,
/// as when the store reads its own partitions. The name is still checked
/// (offset and length inside the segment) and so is the framing of the IPC
/// messages.
///
/// # Safety
/// The region `offset..offset + len` of the segment must hold a partition
/// written there by a [`SharedStore`] of this build from a valid batch, and
/// must stay unchanged (the partition pinned in its store) while the batch
/// or any buffer of it lives. Arbitrary or corrupt bytes can make the
/// batch's offsets point outside its buffers: reading them is undefined
/// behaviour.
pub unsafe fn open_shared_unchecked(name: &str) -> Result<SharedPartition, StoreError> {
    let (bytes, mapping, place) = map_shared(name, Arc::new(()))?;
    // SAFETY: the caller vouches that a store wrote these bytes from a valid
    // batch and keeps them unchanged.
    let batch = unsafe { ipc::decode_trusted(&bytes) }.map_err(|source| place.invalid(source))?;
    Ok(SharedPartition { batch, mapping })
}

/// Where a shared partition lies, for errors.
struct SharedPlace {
    segment: String,
    offset: u64,
    len: u64,
}

impl SharedPlace {
    fn invalid(self, source: arrow_schema::ArrowError) -> StoreError {
        StoreError::Invalid {
            segment: self.segment,
            offset: self.offset,
            len: self.len,
            source,
        }
    }
}

/// Parses `segment@offset+len`, opens the segment and checks that the region
/// lies inside it (with checked arithmetic); returns a view of the region
/// (which holds the segment mapped) and the mapping's address range.
fn map_shared(
    name: &str,
    keep: Arc<dyn std::any::Any + Send + Sync>,
) -> Result<(arrow_buffer::Buffer, std::ops::Range<usize>, SharedPlace), StoreError> {
    let bad = || StoreError::BadName {
        name: name.to_string(),
    };
    let (segment_name, rest) = name.split_once('@').ok_or_else(bad)?;
    let (offset, len) = rest.split_once('+').ok_or_else(bad)?;
    let (offset, len): (u64, u64) = (
        offset.parse().map_err(|_| bad())?,
        len.parse().map_err(|_| bad())?,
    );
    let segment = Arc::new(Segment::open(segment_name)?);
    let segment_len = segment.len() as u64;
    let inside = offset
        .checked_add(len)
        .is_some_and(|end| end <= segment_len);
    if !inside {
        return Err(StoreError::OutOfBounds {
            segment: segment_name.to_string(),
            offset,
            len,
            segment_len,
        });
    }
    // Both fit in usize: they are at most the segment's length.
    let (start, size) = (offset as usize, len as usize);
    let base = segment.base().as_ptr() as usize;
    let mapping = base..base + segment.len();
    // SAFETY: start + size <= the segment's length (checked above).
    let ptr = unsafe { std::ptr::NonNull::new_unchecked(segment.base().as_ptr().add(start)) };
    // SAFETY: within the segment, which stays mapped while the buffer holds it.
    // `keep` is only held and dropped, never read, so a panic cannot see
    // it half-changed.
    let owner = Arc::new((segment, std::panic::AssertUnwindSafe(keep)));
    let bytes = unsafe { ipc::view(ptr, size, owner) };
    let place = SharedPlace {
        segment: segment_name.to_string(),
        offset,
        len,
    };
    Ok((bytes, mapping, place))
}

#[cfg(test)]
mod tests {
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

    fn strings() -> RecordBatch {
        let values: StringArray = (0..20_000).map(|i| Some(format!("value-{i}"))).collect();
        RecordBatch::try_from_iter([("s", Arc::new(values) as ArrayRef)]).unwrap()
    }

    fn open(capacity: u64, dir: &Path) -> SharedStore {
        let mut config = StoreConfig::new(capacity, dir);
        config.namespace = "pinread".into();
        SharedStore::open(config).unwrap()
    }

    /// A partition cut in 4 groups (one empty) of `strings()`' rows.
    const GROUPS: [u32; 5] = [0, 5_000, 5_000, 12_000, 20_000];

    /// Fills a store of 4 MiB with a partition that spills `part` (the
    /// first one put) and drops it.
    fn spill_first(store: &SharedStore) {
        let data: ArrayRef = Arc::new(BinaryArray::from_vec(vec![
            vec![1u8; (4 << 20) - (64 << 10)].as_slice(),
        ]));
        drop(store.put(RecordBatch::try_from_iter([("data", data)]).unwrap()));
    }

    #[test]
    fn a_spilled_grouped_partition_reads_each_group_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(4 << 20, dir.path());
        let part = store.put_grouped(strings(), &GROUPS).unwrap();
        spill_first(&store);
        assert!(store.spill_path(part.id()).is_some(), "spilled");
        assert_eq!(part.groups().as_deref(), Some(&GROUPS[..]), "kept spilled");
        let whole = strings();
        let spilled = store.stats().spilled_bytes;
        for w in GROUPS.windows(2) {
            let rows = w[0] as usize..w[1] as usize;
            let before = store.stats().restored_bytes;
            let read = part.get_rows(rows.clone(), true).unwrap();
            assert_eq!(read, whole.slice(rows.start, rows.len()));
            let restored = store.stats().restored_bytes - before;
            assert!(
                restored * 2 < spilled,
                "a group read {restored} of the {spilled} bytes spilled"
            );
            if rows.is_empty() {
                assert!(restored < 1024, "an empty group read {restored} bytes");
            }
        }
        // Across groups, within one, and the whole: the same rows as memory holds.
        for rows in [
            4_000..13_000,
            6_000..7_000,
            5_000..5_000,
            2_000..2_000,
            20_000..20_000,
            0..20_000,
        ] {
            let read = part.get_rows(rows.clone(), false).unwrap();
            assert_eq!(read, whole.slice(rows.start, rows.len()), "{rows:?}");
        }
        let (start, end) = (10, 5);
        for rows in [19_000..20_001, start..end] {
            assert!(matches!(
                part.get_rows(rows, false),
                Err(StoreError::RowsOutOfRange { .. })
            ));
        }
        assert_eq!(part.get().unwrap(), whole);
        let sent = store.encoded_bytes(&part).unwrap();
        assert_eq!(ipc::decode(&sent).unwrap(), whole);
        // Back in memory, whole and in groups still.
        drop(store.pin(part.id()).unwrap());
        assert!(store.spill_path(part.id()).is_none(), "restored");
        assert_eq!(part.get().unwrap(), whole);
        assert_eq!(
            part.get_rows(5_000..12_000, true).unwrap(),
            whole.slice(5_000, 7_000)
        );
        spill_first(&store);
        assert!(store.spill_path(part.id()).is_some(), "spilled again");
        assert_eq!(
            part.get_rows(12_000..20_000, true).unwrap(),
            whole.slice(12_000, 8_000)
        );
    }

    #[test]
    fn a_grouped_partition_finding_no_room_goes_to_disk_itself() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(4 << 20, dir.path());
        let data: ArrayRef = Arc::new(BinaryArray::from_vec(vec![
            vec![1u8; (4 << 20) - (64 << 10)].as_slice(),
        ]));
        let plain = store
            .put(RecordBatch::try_from_iter([("data", data)]).unwrap())
            .unwrap();
        let grouped = store.put_grouped(strings(), &GROUPS).unwrap();
        store.writes_settled();
        assert!(
            store.spill_path(grouped.id()).is_some(),
            "the newcomer spilled"
        );
        assert!(store.spill_path(plain.id()).is_none(), "the other stays");
        let whole = strings();
        assert_eq!(
            grouped.get_rows(5_000..12_000, true).unwrap(),
            whole.slice(5_000, 7_000)
        );
        assert!(store.stats().spilled_bytes > 0);
        // A plain partition still pushes the least recently used out.
        let again = store.put(strings()).unwrap();
        assert!(store.spill_path(plain.id()).is_some(), "pushed out");
        assert!(store.spill_path(again.id()).is_none());
    }

    /// A store of 4 MiB filled by one plain partition, which stays: a
    /// grouped put then finds no room.
    fn full_store(dir: &Path) -> (SharedStore, PartitionRef) {
        let store = open(4 << 20, dir);
        let data: ArrayRef = Arc::new(BinaryArray::from_vec(vec![
            vec![1u8; (4 << 20) - (64 << 10)].as_slice(),
        ]));
        let plain = store
            .put(RecordBatch::try_from_iter([("data", data)]).unwrap())
            .unwrap();
        (store, plain)
    }

    #[test]
    fn a_grouped_partition_is_read_while_its_file_is_written_and_pinned_once_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _plain) = full_store(dir.path());
        let whole = strings();
        let parts: Vec<PartitionRef> = (0..6)
            .map(|_| store.put_grouped(whole.clone(), &GROUPS).unwrap())
            .collect();
        // Read at once, whether written yet or not.
        for part in &parts {
            assert_eq!(
                part.get_rows(5_000..12_000, true).unwrap(),
                whole.slice(5_000, 7_000)
            );
        }
        // A pin waits for the file, then restores from it.
        let pinned = store.pin(parts[5].id()).unwrap();
        assert!(store.spill_path(parts[5].id()).is_none(), "restored");
        drop(pinned);
        store.writes_settled();
        for part in &parts[..5] {
            let path = store.spill_path(part.id()).expect("written");
            assert!(path.exists());
            assert_eq!(part.get().unwrap(), whole);
        }
    }

    #[test]
    fn a_grouped_partition_freed_while_written_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _plain) = full_store(dir.path());
        let ids: Vec<PartitionId> = (0..6)
            .map(|_| store.put_grouped(strings(), &GROUPS).unwrap().id())
            .collect();
        store.settle_disk();
        for id in ids {
            let path = store.inner.spill.file(id).unwrap();
            assert!(!path.exists(), "{} left", path.display());
        }
        assert_eq!(store.stats().partitions, 1);
    }

    #[test]
    fn a_spill_file_that_cannot_be_written_loses_its_partition_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _plain) = full_store(dir.path());
        // A file planted at the next partition's name: the write refuses it.
        let next = PartitionId(store.inner.next_id.load(Ordering::Relaxed));
        let planted = store.inner.spill.file(next).unwrap();
        std::fs::write(&planted, b"not ours").unwrap();
        let part = store.put_grouped(strings(), &GROUPS).unwrap();
        assert_eq!(part.id(), next);
        store.writes_settled();
        let read = part.get().unwrap_err().to_string();
        assert!(
            read.contains("is lost") && read.contains(&planted.display().to_string()),
            "{read}"
        );
        let pin = store
            .pin(next)
            .err()
            .expect("a lost partition is not pinned");
        assert!(pin.to_string().contains("is lost"), "{pin}");
        drop(part);
        assert_eq!(std::fs::read(&planted).unwrap(), b"not ours");
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
