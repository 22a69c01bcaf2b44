//! The shared store's side of spilling: moving a partition from its segment
//! to a spill file and back, and a grouped partition that goes to disk as
//! it is put (written behind on the spill writer). The files themselves
//! (their format, writing and reading groups back) are `crate::spill`'s;
//! which partition spills when stays the store's choice; this is how it
//! goes and comes back.

use std::path::PathBuf;
use std::sync::{Arc, MutexGuard};

use streambatch_core::PartitionId;

use super::{Inner, Place, SharedStore, State};
use crate::ipc;
use crate::spill::{self, IndexCache, SpillFile};
use crate::spill_writer::{SpillWriter, Writing, Written};
use crate::{PartitionRef, PutError, StoreError};

impl SharedStore {
    /// Waits until the spill writer has written (or failed) every
    /// partition it was given.
    pub(super) fn writes_settled(&self) {
        let mut state = self.inner.state();
        while state.writes > 0 {
            state = self
                .inner
                .written
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Lists partition `id`, spilled at `place` as it was put.
    pub(super) fn listed(
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
    pub(super) fn write_behind(
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
}

impl Inner {
    pub(super) fn spill_file(&self, id: PartitionId) -> Result<PathBuf, StoreError> {
        self.spill.file(id)
    }

    /// Moves a partition from memory to a spill file.
    pub(super) fn spill(&self, state: &mut State, id: PartitionId) -> Result<(), StoreError> {
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
    pub(super) fn restore<'a>(
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
                let batch = file
                    .read_groups(&groups, 0..groups.len() - 1)
                    .map_err(spilled)?;
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

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::Ordering;

    use arrow_array::{ArrayRef, BinaryArray, RecordBatch};

    use super::*;
    use crate::shared::tests::{GROUPS, open, spill_first, strings};
    use crate::{ObjectStore, StoreError};

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
}
