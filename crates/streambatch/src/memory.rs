//! How a process moving large batches asks glibc to keep freed memory.

/// Keeps freed buffers of up to 64 MiB for reuse, and up to 512 MiB of
/// freed memory in the heap, instead of returning each buffer to the
/// kernel and faulting it in again on the next allocation: streambatch's
/// operators, stores and trainers allocate and free large row buffers all
/// the time (a batch of 64 images of 224 x 224 x 3 floats is 38 MiB),
/// and glibc by default maps each buffer over 32 MiB afresh, which cost a
/// quarter of a training-ingest pipeline's time (W6a) in page faults. As
/// Ray's processes keep theirs with jemalloc.
///
/// Also caps glibc's arenas at one per core (see `arenas`).
///
/// Called by nodes ([`run_node`](crate::run_node)), embedded nodes
/// ([`Context::local`](crate::Context::local) and its kin) and trainers
/// (`streambatch_split::RemoteSplit::open`, which also keeps to one
/// arena); a process's setting, harmless to call twice. Elsewhere than
/// glibc it does nothing.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator thresholds; any value is valid.
    unsafe {
        // An older glibc refuses a threshold over 32 MiB (and setting the
        // trim threshold alone would pin the mmap one at 128 KiB): then 32.
        if libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20) == 0 {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        }
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
        libc::mallopt(libc::M_ARENA_MAX, arenas());
    }
}

/// Arenas for a process keeping its freed memory: one per core. glibc's
/// default (up to eight per core) gives each new thread an arena of its
/// own, and a node's threads hand buffers to each other (a task's batch
/// freed by the spill writer, a reader's by a reducer): each arena then
/// keeps apart what was freed in it, while no more threads than cores
/// allocate at once. S1's peak RSS fell from 936-1,031 MiB to 899-946
/// with as many arenas as its two cores, no slower.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn arenas() -> libc::c_int {
    std::thread::available_parallelism().map_or(8, |n| n.get().min(1024) as libc::c_int)
}
