//! Where a partition's bytes go in the store's shared memory: segments made
//! while the capacity (fitted to what /dev/shm has free) allows, regions
//! carved from them and given back, and regions reserved for an output
//! buffer that a put adopts instead of copying. One place keeps the
//! accounting of mapped and used bytes that these moves change.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use streambatch_core::{PartitionId, format_bytes};

use super::{Entry, Inner, Place, SharedStore, State};
use crate::alloc::{ALIGN, Allocator, aligned};
use crate::ipc;
use crate::output::OutputBuffer;
use crate::segment::{self, Segment};
use crate::{PartitionRef, StoreError};

pub(super) struct Slot {
    pub(super) segment: Arc<Segment>,
    alloc: Allocator,
    /// Made for one large partition; unmapped when it is freed.
    dedicated: bool,
}

/// A region handed out as an [`OutputBuffer`]: room for the IPC framing
/// before and after the buffer, so that a put can adopt it in place.
#[derive(Clone, Copy)]
pub(super) struct Reserved {
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

/// The first segment's size; later ones double the total up to the largest.
const FIRST_SEGMENT: u64 = 4 << 20;

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
    pub(super) fn adopt(
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

    /// [`ObjectStore::reserve`](crate::ObjectStore::reserve): a region of
    /// a segment with room for the IPC framing around the buffer.
    pub(super) fn reserve_region(&self, len: usize) -> Option<OutputBuffer> {
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
}

impl Inner {
    /// Room for `len` bytes in memory: in a segment, a new segment while the
    /// capacity allows, or a dedicated segment for a partition larger than
    /// the largest segment. New segments grow geometrically (4 MiB, 4, 8, 16,
    /// ... up to the largest, each a whole multiple of the partition that
    /// asks for it), so a small job maps and pre-faults little; they are
    /// made with the lock released, since pre-faulting takes time. `None`:
    /// no room; an error: a segment could not be made.
    pub(super) fn allocate<'a>(
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

    pub(super) fn free(&self, state: &mut State, id: PartitionId) {
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
    pub(super) fn release_memory(
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

    pub(super) fn free_region(&self, state: &mut State, segment: usize, offset: usize, len: usize) {
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
}

impl State {
    fn unmap(&mut self, slot: &Slot) {
        self.mapped -= slot.segment.len() as u64;
        if !slot.dedicated {
            self.regular_mapped -= slot.segment.len() as u64;
        }
    }
}

/// The capacity a store opened with `capacity` gets: segments are files in
/// /dev/shm, and touching one that the file system cannot back kills the
/// process (SIGBUS), so a capacity over what /dev/shm has free is cut to
/// that, with a warning, or with `strict` refused. (Free space is read
/// once, here: other users of /dev/shm may still take it later.)
pub(super) fn fit_to_shm(capacity: u64, strict: bool) -> Result<u64, StoreError> {
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
