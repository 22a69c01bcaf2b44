//! The store's spill writer: a thread that writes an exchange's map
//! outputs (grouped partitions) that found no room in memory to their
//! spill files, while the tasks that put them go on computing.
//!
//! Written by the task itself, each such put held its task for the whole
//! direct write: S1's map tasks spent a third of their time blocked there,
//! their CPUs idle. Here a put queues the partition and returns; until its
//! file is written, the partition is read from its batch (still in memory,
//! outside the store's capacity), so that no reader waits for the disk.
//! The queue holds none beside the one being written: a put finding the
//! writer busy waits for it, so at most one partition is held this way
//! (with one more, S1's peak RSS rose by about 60 MiB, for no clear gain).

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex, Weak};

use arrow_array::RecordBatch;
use streambatch_core::PartitionId;

/// A grouped partition on its way to its spill file.
pub(crate) struct Writing {
    /// Its rows, read from until the file is written.
    pub(crate) batch: RecordBatch,
    /// Where each group starts, and the end.
    pub(crate) groups: Arc<[u32]>,
    /// Its spill file.
    pub(crate) path: PathBuf,
}

/// What the writer tells the store when a file is written (or not).
pub(crate) trait Written: Send + Sync + 'static {
    /// Partition `id`'s file is written (`Ok`) or failed; `writing` is
    /// the write, so that a partition freed meanwhile is told apart.
    fn written(&self, id: PartitionId, writing: &Arc<Writing>, outcome: Result<(), String>);
}

/// A write queued: the partition and its rows.
type Queued = (PartitionId, Arc<Writing>);

/// The writer thread and its queue (behind a lock, which also makes the
/// store unwind-safe to share: a put waiting for room holds it).
pub(crate) struct SpillWriter {
    queue: Mutex<Option<SyncSender<Queued>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl SpillWriter {
    /// Starts the thread, which tells `store` (while it lives) of each
    /// file written.
    pub(crate) fn start<S: Written>(store: Weak<S>) -> std::io::Result<Self> {
        let (queue, todo) = sync_channel(0);
        let thread = std::thread::Builder::new()
            .name("spill-writer".into())
            .spawn(move || write_each(todo, store))?;
        Ok(Self {
            queue: Mutex::new(Some(queue)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Hands partition `id`'s write to the thread, waiting until it takes
    /// it (it writes one at a time). Gives the write back when the thread
    /// is gone.
    pub(crate) fn queue(&self, id: PartitionId, writing: Arc<Writing>) -> Result<(), Arc<Writing>> {
        let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        match queue.as_ref() {
            Some(queue) => queue.send((id, writing)).map_err(|e| e.0.1),
            None => Err(writing),
        }
    }
}

fn write_each<S: Written>(todo: Receiver<Queued>, store: Weak<S>) {
    for (id, writing) in todo {
        // A panic is this write's failure: a partition left `Writing`
        // would keep its pins and `settle_disk` waiting for ever.
        let write = || crate::spill::write_groups(&writing.path, &writing.batch, &writing.groups);
        let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(write)) {
            Ok(written) => written.map_err(|e| e.to_string()),
            Err(_) => Err("the spill writer panicked".to_string()),
        };
        match store.upgrade() {
            Some(store) => store.written(id, &writing, outcome),
            // The store is closing: its directory goes with it.
            None => drop(std::fs::remove_file(&writing.path)),
        }
    }
}

impl Drop for SpillWriter {
    /// Lets the thread write what is queued and waits for it: no file is
    /// written after the store's directory is removed.
    fn drop(&mut self) {
        drop(
            self.queue
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        if let Some(thread) = self
            .thread
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            // The store's last reference may be the thread's own, as it
            // tells the store of a write: it then ends by itself.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}
