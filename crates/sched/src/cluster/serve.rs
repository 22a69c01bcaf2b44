//! A node's partitions as its peers see them: the [`PartitionServer`] the
//! transport answers fetches with. Only partitions the node has offered
//! (outputs its jobs still need) can be fetched; a peer on the same host
//! with the same store directory gets the shared-memory name, others the
//! bytes (of the rows they need alone, where they name them).

use std::collections::HashMap;
use std::sync::Mutex;

use streambatch_net::{PartitionServer, RowRange, Served};
use streambatch_store::{ObjectStore, PartitionRef, SharedStore};

/// Serves a node's offered partitions from its store.
pub(crate) struct StoreServer {
    store: SharedStore,
    /// Each offered partition. A peer that maps one holds a pin on it for
    /// as long as its fetch stream is open (see `Served::Shared`).
    offered: Mutex<HashMap<u64, PartitionRef>>,
}

impl StoreServer {
    pub(crate) fn new(store: SharedStore) -> Self {
        Self {
            store,
            offered: Mutex::new(HashMap::new()),
        }
    }

    /// Lets peers fetch `part` until [`StoreServer::withdraw`].
    pub(crate) fn offer(&self, part: PartitionRef) {
        self.offered().insert(part.id().0, part);
    }

    /// Stops serving partition `id` and lets the store free it.
    pub(crate) fn withdraw(&self, id: u64) {
        self.offered().remove(&id);
    }

    fn offered(&self) -> std::sync::MutexGuard<'_, HashMap<u64, PartitionRef>> {
        self.offered.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Offered partition `partition`, or why a peer cannot have it.
    fn offered_part(&self, partition: u64) -> Result<PartitionRef, String> {
        self.offered()
            .get(&partition)
            .cloned()
            .ok_or_else(|| format!("partition {partition} is not offered by this node"))
    }
}

impl PartitionServer for StoreServer {
    fn serve(&self, partition: u64, shares_memory: bool) -> Result<Served, String> {
        let part = self.offered_part(partition)?;
        if shares_memory {
            // A peer maps the bytes where they are: the pin keeps the store
            // from spilling, moving or freeing them (even once withdrawn)
            // until the peer closes its fetch stream.
            let pin = self.store.pin(part.id()).map_err(|e| e.to_string())?;
            if let Some(name) = self.store.shared_name(&part) {
                return Ok(Served::Shared(name, Box::new(pin)));
            }
        }
        let bytes = self.store.encoded_bytes(&part).map_err(|e| e.to_string())?;
        Ok(Served::Bytes(Box::new(BufferBytes(bytes))))
    }

    /// Rows of a partition: by shared memory as [`StoreServer::serve`]
    /// does where the peer shares it and the partition is in memory (the
    /// peer slices it in place), else those rows' bytes alone. A reducer's
    /// slice of a spilled map output reads only its group from the spill
    /// file, rather than the whole output restored or sent.
    fn serve_rows(
        &self,
        partition: u64,
        rows: RowRange,
        shares_memory: bool,
    ) -> Result<Served, String> {
        let part = self.offered_part(partition)?;
        let whole = rows.offset == 0 && rows.len == part.rows() as u64;
        if whole || (shares_memory && self.store.spill_path(part.id()).is_none()) {
            return self.serve(partition, shares_memory);
        }
        let end = rows
            .offset
            .checked_add(rows.len)
            .and_then(|end| usize::try_from(end).ok())
            .ok_or_else(|| format!("rows {}+{} of partition {partition}", rows.offset, rows.len))?;
        let batch = part
            .get_rows(rows.offset as usize..end, true)
            .map_err(|e| e.to_string())?;
        let bytes = streambatch_store::ipc::encode_to_buffer(&batch).map_err(|e| e.to_string())?;
        Ok(Served::Rows(Box::new(BufferBytes(bytes))))
    }

    /// A reducer's destination of a map output, by the cut the store kept
    /// with it: no one else keeps it.
    fn group_rows(&self, partition: u64, group: u32) -> Result<RowRange, String> {
        let part = self.offered_part(partition)?;
        match (part.group_rows(group as usize), part.groups()) {
            (Some(rows), _) => Ok(RowRange {
                offset: rows.start as u64,
                len: rows.len() as u64,
            }),
            (None, Some(cut)) => Err(format!(
                "partition {partition} has no destination {group}: it is cut into {}",
                cut.len() - 1
            )),
            (None, None) => Err(format!("partition {partition} is not kept cut into groups")),
        }
    }

    /// A map output's cut, for the node it moves to off this one.
    fn cut(&self, partition: u64) -> Result<Vec<u32>, String> {
        let part = self.offered_part(partition)?;
        let cut = part.groups();
        cut.map(|cut| cut.to_vec())
            .ok_or_else(|| format!("partition {partition} is not kept cut into groups"))
    }
}

/// An Arrow buffer as the bytes a fetch sends.
struct BufferBytes(arrow_buffer::Buffer);

impl AsRef<[u8]> for BufferBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}
