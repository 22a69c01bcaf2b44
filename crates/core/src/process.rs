//! Telling whether the process that left a file behind is still alive:
//! names of stores and staging directories carry their writer's pid and
//! pid namespace, and a name is judged only by a process of the same
//! namespace (a container sharing /dev/shm or a disk with the host has
//! pids that mean nothing here).

/// The inode of this process's pid namespace (`/proc/self/ns/pid` reads
/// `pid:[4026531836]`); 0 where it cannot be read.
///
/// ```
/// let ns = streambatch_core::pid_namespace();
/// assert_eq!(ns, streambatch_core::pid_namespace());
/// ```
pub fn pid_namespace() -> u64 {
    static NS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NS.get_or_init(|| {
        std::fs::read_link("/proc/self/ns/pid")
            .ok()
            .and_then(|link| {
                let link = link.to_string_lossy().into_owned();
                link.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
            })
            .unwrap_or(0)
    })
}

/// Whether process `pid` of pid namespace `namespace` may be alive, as far
/// as this process can tell: yes unless it is of this namespace and gone
/// from `/proc` (a process of another namespace is never taken for dead).
///
/// ```
/// use streambatch_core::{pid_namespace, may_be_alive};
/// assert!(may_be_alive(std::process::id(), pid_namespace()));
/// assert!(may_be_alive(u32::MAX - 1, pid_namespace() + 1));
/// assert!(!may_be_alive(u32::MAX - 1, pid_namespace()));
/// ```
pub fn may_be_alive(pid: u32, namespace: u64) -> bool {
    namespace != pid_namespace() || std::path::Path::new(&format!("/proc/{pid}")).exists()
}
