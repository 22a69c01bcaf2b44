//! Output buffers written in place in the object store, as a plasma client
//! creates an object, writes it and seals it: an operator that makes a
//! large buffer for its output asks for an [`OutputBuffer`], and when the
//! batch holding it is stored, the store adopts those bytes instead of
//! copying them.
//!
//! The task running the operator names its store for the thread
//! ([`with_output_store`]); outside a task, or when the store has no room,
//! the buffer is an ordinary heap allocation and storing it copies it once,
//! as any other batch.

use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_buffer::Buffer;
use arrow_buffer::alloc::Allocation;

use crate::ObjectStore;

thread_local! {
    static OUTPUT_STORE: RefCell<Option<Arc<dyn ObjectStore>>> = const { RefCell::new(None) };
}

/// Runs `f` with `store` as the store that [`OutputBuffer`]s made on this
/// thread are placed in (the store the running task puts its outputs in).
pub fn with_output_store<T>(store: Arc<dyn ObjectStore>, f: impl FnOnce() -> T) -> T {
    let previous = OUTPUT_STORE.with(|s| s.replace(Some(store)));
    // Restored even if `f` panics (a worker catches a UDF's panic and goes on).
    struct Restore(Option<Arc<dyn ObjectStore>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            OUTPUT_STORE.with(|s| *s.borrow_mut() = previous);
        }
    }
    let _restore = Restore(previous);
    f()
}

/// A byte buffer for an operator's output, placed in the running task's
/// object store when it has room, so that storing the output takes no copy.
///
/// ```
/// use arrow_array::{Array, BinaryArray};
/// use arrow_buffer::OffsetBuffer;
/// use streambatch_store::OutputBuffer;
///
/// let mut bytes = OutputBuffer::filled(4, 0);
/// bytes.as_mut_slice()[3] = 7;
/// let offsets = OffsetBuffer::from_lengths([4]);
/// let array = BinaryArray::new(offsets, bytes.into_buffer(), None);
/// assert_eq!(array.value(0), &[0, 0, 0, 7]);
/// ```
pub struct OutputBuffer {
    place: Place,
}

enum Place {
    Heap(Vec<u8>),
    Store {
        ptr: NonNull<u8>,
        len: usize,
        owner: Arc<dyn Allocation>,
    },
}

// SAFETY: the buffer owns its bytes alone until `into_buffer`; the owner is
// `Send + Sync` (an `Allocation`).
unsafe impl Send for OutputBuffer {}

impl OutputBuffer {
    /// `len` bytes, each `byte`: in the thread's output store if it has room,
    /// on the heap otherwise.
    pub fn filled(len: usize, byte: u8) -> Self {
        let placed = OUTPUT_STORE.with(|s| s.borrow().as_ref().and_then(|s| s.reserve(len)));
        match placed {
            Some(mut buffer) => {
                buffer.as_mut_slice().fill(byte);
                buffer
            }
            None => Self {
                place: Place::Heap(vec![byte; len]),
            },
        }
    }

    /// A buffer of `len` bytes at `ptr`, held by `owner`: for stores
    /// implementing [`ObjectStore::reserve`].
    ///
    /// # Safety
    /// `ptr..ptr + len` must be valid for reads and writes, used by nobody
    /// else, and stay so while `owner` (or any buffer made from it) lives.
    pub unsafe fn in_store(ptr: NonNull<u8>, len: usize, owner: Arc<dyn Allocation>) -> Self {
        Self {
            place: Place::Store { ptr, len, owner },
        }
    }

    /// True when the bytes are in a store (storing them takes no copy).
    pub fn is_in_store(&self) -> bool {
        matches!(self.place, Place::Store { .. })
    }

    /// The bytes, for writing.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.place {
            Place::Heap(v) => v,
            // SAFETY: `in_store`'s contract: valid and ours alone.
            Place::Store { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), *len)
            },
        }
    }

    /// The bytes as an Arrow buffer, for building the output's arrays.
    pub fn into_buffer(self) -> Buffer {
        match self.place {
            Place::Heap(v) => Buffer::from_vec(v),
            // SAFETY: `in_store`'s contract; the owner keeps the bytes.
            Place::Store { ptr, len, owner } => unsafe {
                Buffer::from_custom_allocation(ptr, len, owner)
            },
        }
    }
}
