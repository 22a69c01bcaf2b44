//! Threads kept for the process that take work from one queue: the slice
//! readers and the direct writers. Threads of the process, not of each
//! task or file: glibc gives each new thread an arena, arenas keep what
//! was freed in them, and a thread made per file costs a mapping of its
//! stack.

use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};

/// `threads` threads named `name-N`, each running `work` on the items
/// sent, one at a time, in the order sent. A panic in `work` ends that
/// item, not the thread.
///
/// ```
/// use std::sync::mpsc::channel;
/// let (done, results) = channel();
/// let workers = streambatch_core::Workers::start("doubler", 2, move |n: u32| {
///     done.send(n * 2).unwrap();
/// });
/// workers.send(21);
/// assert_eq!(results.recv().unwrap(), 42);
/// ```
pub struct Workers<T> {
    queue: Mutex<Sender<T>>,
}

impl<T: Send + 'static> Workers<T> {
    /// Starts the threads.
    pub fn start(name: &str, threads: usize, work: impl Fn(T) + Send + Sync + 'static) -> Self {
        let (queue, items) = channel::<T>();
        let (items, work) = (Arc::new(Mutex::new(items)), Arc::new(work));
        for n in 0..threads.max(1) {
            let (items, work) = (items.clone(), work.clone());
            std::thread::Builder::new()
                .name(format!("{name}-{n}"))
                .spawn(move || {
                    loop {
                        let next = items.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        let Ok(item) = next else { return };
                        let one = std::panic::AssertUnwindSafe(|| work(item));
                        let _ = std::panic::catch_unwind(one);
                    }
                })
                .expect("a worker thread starts");
        }
        Self {
            queue: Mutex::new(queue),
        }
    }

    /// Queues `item` for the next free thread.
    pub fn send(&self, item: T) {
        // The threads never end while `self` holds the queue's sender.
        let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        queue
            .send(item)
            .expect("the workers run while their queue lives");
    }
}
