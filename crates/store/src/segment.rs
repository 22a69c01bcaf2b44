//! Named shared-memory segments: the one module that knows the
//! `shared_memory` crate, so that the backing can be swapped.
//!
//! A segment is named `sb-<namespace>-<pid>-<store>-<n>`; the pid lets a
//! restarted node find the segments of a dead one and remove them.

use std::ptr::NonNull;

use shared_memory::{Shmem, ShmemConf};

use crate::StoreError;

/// A mapped shared-memory segment. Its creator removes it from the system
/// when dropped; a process that only opened it just unmaps it.
pub struct Segment {
    shm: Shmem,
}

// SAFETY: a segment is plain shared memory. The store hands out disjoint
// regions of it (its allocator never gives the same bytes twice while they
// are in use) and only reads a region after its writer has finished, under
// the store's lock, so no two threads race on the same bytes.
unsafe impl Send for Segment {}
// SAFETY: as above; `&Segment` only exposes the base pointer and length.
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates segment `name` of `len` bytes. Call [`Segment::prefault`]
    /// (on any thread) so that writes run at memory speed instead of
    /// faulting page by page.
    pub fn create(name: &str, len: usize) -> Result<Self, StoreError> {
        let shm = ShmemConf::new()
            .os_id(name)
            .size(len)
            .create()
            .map_err(|e| failed("create", name, e))?;
        Ok(Self { shm })
    }

    /// Maps every page of the segment writable ahead of use, without
    /// touching its contents, so it may run while the segment is in use
    /// (`MADV_POPULATE_WRITE`). Where the kernel lacks it, pages fault in
    /// on first write instead.
    pub fn prefault(&self) {
        // SAFETY: the range is exactly this mapping; the advice changes page
        // tables only, never the bytes.
        unsafe {
            libc::madvise(
                self.shm.as_ptr().cast(),
                self.shm.len(),
                libc::MADV_POPULATE_WRITE,
            );
        }
    }

    /// Opens an existing segment (made by another process) for reading.
    pub fn open(name: &str) -> Result<Self, StoreError> {
        let shm = ShmemConf::new()
            .os_id(name)
            .open()
            .map_err(|e| failed("open", name, e))?;
        Ok(Self { shm })
    }

    /// Removes a segment left behind by a dead process.
    pub fn remove(name: &str) {
        if let Ok(mut shm) = ShmemConf::new().os_id(name).open() {
            shm.set_owner(true);
        }
    }

    /// The segment's name.
    pub fn name(&self) -> &str {
        self.shm.get_os_id().trim_start_matches('/')
    }

    /// Its first byte.
    pub fn base(&self) -> NonNull<u8> {
        NonNull::new(self.shm.as_ptr()).expect("a mapping is never at address 0")
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.shm.len()
    }

    /// The bytes `offset..offset + len`, for writing a freshly allocated region.
    ///
    /// # Safety
    /// The region must be inside the segment and owned by the caller alone.
    // Shared memory is written through a shared handle; exclusivity is the
    // allocator's promise, stated in the safety contract above.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn region_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        debug_assert!(offset + len <= self.len());
        // SAFETY: the caller guarantees bounds and exclusive use.
        unsafe { std::slice::from_raw_parts_mut(self.shm.as_ptr().add(offset), len) }
    }
}

fn failed(action: &'static str, name: &str, source: shared_memory::ShmemError) -> StoreError {
    StoreError::Segment {
        action,
        name: name.to_string(),
        source: Box::new(source),
    }
}

/// Where the system keeps shared-memory segments, as files.
pub const DIR: &str = "/dev/shm";

/// Bytes free in [`DIR`] for an unprivileged user, when it can be asked.
pub fn available() -> Option<u64> {
    let path = std::ffi::CString::new(DIR).expect("no NUL in the name");
    // SAFETY: all zeroes is a valid statvfs, which the call fills in.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a valid struct to write to.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    Some((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

/// Names of segments in the system's shared-memory directory that start with
/// `prefix`.
pub fn list(prefix: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(DIR) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect()
}
