//! Opening, by its shared name, a partition that another process on this
//! host keeps in its store's memory ([`open_shared`] and its variants).
//! The name is checked against the segment and the bytes validated (unless
//! the caller vouches for them), so that a bad name or corrupt bytes give
//! an error rather than an out-of-bounds read.

use std::sync::Arc;

use arrow_array::RecordBatch;

use crate::StoreError;
use crate::ipc;
use crate::segment::Segment;

/// A partition of another process's store, opened by its shared name.
pub struct SharedPartition {
    /// The rows; their buffers point into the mapped segment.
    pub batch: RecordBatch,
    /// The address range of this process's mapping of the segment.
    pub mapping: std::ops::Range<usize>,
}

/// Opens, zero-copy, a partition that another process on this host keeps
/// in memory (see
/// [`SharedStore::shared_name`](crate::SharedStore::shared_name)),
/// validating its bytes: the offset and length must lie inside the
/// segment, and the IPC stream must pass Arrow's full validation (framing,
/// buffer bounds, offsets, UTF-8...), so that bytes from elsewhere, corrupt
/// or not, give an error rather than an out-of-bounds read. The batch's
/// buffers point into the segment; the other process must keep the
/// partition (pinned) while it is read.
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
/// written there by a [`SharedStore`](crate::SharedStore) of this build
/// from a valid batch, and must stay unchanged (the partition pinned in its
/// store) while the batch or any buffer of it lives. Arbitrary or corrupt
/// bytes can make the batch's offsets point outside its buffers: reading
/// them is undefined behaviour.
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
