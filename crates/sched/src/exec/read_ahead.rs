//! A reducer's input slices read ahead of it, several at once.
//!
//! A reducer reads a slice of every map output: from a spill file, by
//! direct I/O, or from a peer. Read one after another on the task's own
//! thread, each read's wait was the task's (S1's reducers spent about as
//! long blocked in `pread` as computing). Here the process's [`READERS`]
//! reader threads read a task's slices in order into a window of at most
//! `window` bytes ahead of it, which takes them in their order as before:
//! the same batches, errors included, at the same places.
//!
//! The readers are a few threads kept for the process, not threads per
//! task: glibc gives each new thread an arena, and arenas keep what was
//! freed in them (see `keep_freed_memory`), so readers made per task grew
//! S1's peak RSS by about 100 MiB.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use arrow_array::RecordBatch;
use streambatch_core::Workers;
use streambatch_plan::{Error, Result};

use crate::exec::partitioner::Slice;
use crate::job::piece::Part;

/// Threads reading slices ahead of the process's reducers, and the most
/// slices of one task being read at once. A direct read of a slice (a few
/// hundred KiB) waits mostly on the disk, and a disk serves more such
/// reads at once the more it is given: with four, each of S1's reducers
/// waited 36 ms for its 32 MiB; with sixteen, 23 ms (about 1.4 GB/s).
pub const READERS: usize = 16;

/// The batches of `slices`, each [`Slice::read_alone`], in order, read by
/// up to [`READERS`] reader threads ahead of the caller while the slices
/// read and not yet taken hold at most `window` bytes (the next slice is
/// always read, however large). Reading stops once the iterator is dropped.
///
/// Only slices of this node's store are read ahead: a peer's are read by
/// the task itself, as before, so that a peer slow to answer holds up its
/// own reducers, not every reducer's reads.
pub fn read_ahead(
    slices: Vec<Slice>,
    window: u64,
) -> Box<dyn Iterator<Item = Result<RecordBatch>> + Send> {
    if slices.len() < 2 || slices.iter().any(|s| s.stored().is_none()) {
        return Box::new(slices.into_iter().map(|s| s.read_alone()));
    }
    read_all_ahead(slices, window)
}

fn read_all_ahead(
    slices: Vec<Slice>,
    window: u64,
) -> Box<dyn Iterator<Item = Result<RecordBatch>> + Send> {
    let bytes: Vec<u64> = slices.iter().map(Part::sliced_bytes).collect();
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            slices: slices.into_iter().map(Some).collect(),
            bytes,
            next_read: 0,
            next_taken: 0,
            ahead_bytes: 0,
            read: BTreeMap::new(),
            readers: 0,
            stopped: false,
        }),
        changed: Condvar::new(),
        window,
    });
    shared.call_readers(&mut shared.state());
    Box::new(Ahead { shared })
}

/// The process's readers: each takes a task's turn, reads one slice of it
/// and hands the turn on.
fn readers() -> &'static Workers<Arc<Shared>> {
    static READERS_QUEUE: OnceLock<Workers<Arc<Shared>>> = OnceLock::new();
    READERS_QUEUE.get_or_init(|| Workers::start("slice-reader", READERS, Shared::read_one))
}

struct Shared {
    state: Mutex<State>,
    /// A slice read, or the reducer stopped.
    changed: Condvar,
    window: u64,
}

struct State {
    slices: Vec<Option<Slice>>,
    bytes: Vec<u64>,
    /// The next slice a reader takes up.
    next_read: usize,
    /// The next slice the reducer takes.
    next_taken: usize,
    /// Bytes of the slices being read or read and not yet taken.
    ahead_bytes: u64,
    read: BTreeMap<usize, Result<RecordBatch>>,
    /// Turns of this task queued or being read.
    readers: usize,
    stopped: bool,
}

impl State {
    /// Whether a reader may take up the next slice now.
    fn may_read(&self, window: u64) -> bool {
        let i = self.next_read;
        !self.stopped
            && i < self.slices.len()
            && (i == self.next_taken || self.ahead_bytes + self.bytes[i] <= window)
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Updates under the lock cannot panic halfway.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues turns while there is a slice to read and fewer than
    /// [`READERS`] are queued.
    fn call_readers(self: &Arc<Self>, state: &mut State) {
        while state.readers < READERS && state.readers < state.slices.len() - state.next_read {
            if !state.may_read(self.window) {
                return;
            }
            state.readers += 1;
            readers().send(self.clone());
        }
    }

    /// One turn: reads the next slice, if the window allows, and queues
    /// the turn again.
    fn read_one(self: Arc<Self>) {
        let mut state = self.state();
        if !state.may_read(self.window) {
            state.readers -= 1;
            return;
        }
        let i = state.next_read;
        state.next_read += 1;
        state.ahead_bytes += state.bytes[i];
        let slice = state.slices[i].take().expect("each slice is read once");
        drop(state);
        // A panic (in the read, or in the slice's drop) is the reducer's
        // error at this slice, not a hang.
        let batch = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let batch = slice.read_alone();
            drop(slice);
            batch
        }))
        .unwrap_or_else(|_| Err(Error::Invalid("reading an input slice panicked".into())));
        let mut state = self.state();
        state.read.insert(i, batch);
        self.changed.notify_all();
        state.readers -= 1;
        self.call_readers(&mut state);
    }
}

/// The reducer's end.
struct Ahead {
    shared: Arc<Shared>,
}

impl Iterator for Ahead {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut state = self.shared.state();
        let i = state.next_taken;
        if i == state.slices.len() {
            return None;
        }
        loop {
            if let Some(batch) = state.read.remove(&i) {
                state.next_taken += 1;
                state.ahead_bytes -= state.bytes[i];
                self.shared.call_readers(&mut state);
                return Some(batch);
            }
            // Nothing read nor being read (every turn ended on a full
            // window, since emptied): call a reader.
            self.shared.call_readers(&mut state);
            state = (self.shared.changed.wait(state)).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Drop for Ahead {
    /// Stops the readers and lets go of the slices not read and the
    /// batches not taken now, not when this task's last turn comes round.
    fn drop(&mut self) {
        let mut state = self.shared.state();
        state.stopped = true;
        let unread: Vec<Option<Slice>> = state.slices.iter_mut().map(Option::take).collect();
        let untaken = std::mem::take(&mut state.read);
        drop(state);
        drop((unread, untaken));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use arrow_array::Int64Array;

    use super::*;
    use crate::exec::partitioner::{RemotePart, RemoteSource};

    fn ints(from: i64, n: i64) -> RecordBatch {
        let column = Arc::new(Int64Array::from_iter_values(from..from + n));
        RecordBatch::try_from_iter([("x", column as _)]).unwrap()
    }

    /// Partition `id` holds 10 rows counting from `id * 10`, read slowly;
    /// partition 13 holds 9 rows, not the 10 reported.
    struct Slow {
        reading: AtomicUsize,
        most: AtomicUsize,
    }

    impl RemoteSource for Slow {
        fn fetch(&self, _: &str, id: u64, _: Arc<RemotePart>) -> Result<RecordBatch> {
            let now = self.reading.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(5 + (id % 3)));
            self.reading.fetch_sub(1, Ordering::SeqCst);
            Ok(ints(id as i64 * 10, if id == 13 { 9 } else { 10 }))
        }
        fn release(&self, _: &str, _: u64) {}
    }

    fn slices(source: &Arc<Slow>, n: u64) -> Vec<Slice> {
        (0..n)
            .map(|id| {
                let source: Arc<dyn RemoteSource> = source.clone();
                let part = RemotePart::new((1, "worker-1".into()), (id, 10, 80), source, None);
                Slice::remote(part).sub(2, 6)
            })
            .collect()
    }

    #[test]
    fn slices_come_in_order_read_several_at_once_errors_in_place() {
        let source = Arc::new(Slow {
            reading: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        });
        let read: Vec<_> = read_all_ahead(slices(&source, 20), 1 << 20).collect();
        for (id, batch) in read.iter().enumerate() {
            match id {
                13 => assert!(batch.as_ref().unwrap_err().to_string().contains("9 rows")),
                _ => assert_eq!(batch.as_ref().unwrap(), &ints(id as i64 * 10 + 2, 6)),
            }
        }
        assert_eq!(read.len(), 20);
        // A peer's slices are read by the task itself.
        let mut by_task = read_ahead(slices(&source, 3), 1 << 20);
        assert_eq!(by_task.next().unwrap().unwrap(), ints(2, 6));
        let most = source.most.load(Ordering::SeqCst);
        assert!(most > 1 && most <= READERS, "{most} at once");
    }

    #[test]
    fn a_window_of_one_slice_reads_one_at_a_time_and_a_drop_stops_the_readers() {
        let source = Arc::new(Slow {
            reading: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        });
        // Each slice is 6 of 10 rows of 80 bytes: 48 bytes.
        let mut read = read_all_ahead(slices(&source, 12), 48);
        for id in 0..5 {
            assert_eq!(read.next().unwrap().unwrap(), ints(id * 10 + 2, 6));
        }
        drop(read);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(source.reading.load(Ordering::SeqCst), 0);
        assert_eq!(source.most.load(Ordering::SeqCst), 1);
    }
}
