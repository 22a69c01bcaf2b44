//! A node's partitions as its peers see them: the [`PartitionServer`] the
//! transport answers fetches with. Only partitions the node has offered
//! (outputs its jobs still need) can be fetched; a peer on the same host
//! with the same store directory gets the shared-memory name, others the
//! bytes.

use std::collections::HashMap;
use std::sync::Mutex;

use streambatch_net::{PartitionServer, Served};
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
}

impl PartitionServer for StoreServer {
    fn serve(&self, partition: u64, shares_memory: bool) -> Result<Served, String> {
        let missing = || format!("partition {partition} is not offered by this node");
        let part = self
            .offered()
            .get(&partition)
            .cloned()
            .ok_or_else(missing)?;
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
}

/// An Arrow buffer as the bytes a fetch sends.
struct BufferBytes(arrow_buffer::Buffer);

impl AsRef<[u8]> for BufferBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}
