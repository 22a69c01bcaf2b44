//! Removing the segments and spill directories that dead processes of a
//! namespace left behind, which a store does as it opens: a process that
//! crashed never unlinked them, and /dev/shm and the spill disk would fill.

use std::path::Path;

use crate::segment::{self, Segment};

/// This process's mark in its stores' names, beside its pid: its start
/// time, then `n` and its pid namespace. A dead process that had the same
/// pid (a reused pid, a container's pid 1) may have left segments and spill
/// directories under names this process would otherwise make again, and is
/// told apart by its start time; a process of another pid namespace (a
/// container sharing /dev/shm or the spill disk) by its namespace, and its
/// names are never judged from here: its pid means nothing in this one.
pub(super) fn process_mark() -> &'static str {
    static MARK: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    MARK.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{:x}n{:x}", nanos as u64, streambatch_core::pid_namespace())
    })
}

/// Whether a store name's mark says it was made in this pid namespace (a
/// mark without a namespace is of an older build, made here).
fn same_pid_namespace(mark: &str) -> bool {
    let here = process_mark().split_once('n').map(|(_, ns)| ns);
    match mark.split_once('n') {
        Some((_, ns)) => Some(ns) == here,
        None => true,
    }
}

/// Removes segments and spill directories of `namespace` whose process is dead.
pub(super) fn remove_stale(namespace: &str, spill_dir: &Path) {
    let prefix = format!("sb-{namespace}-");
    let dead = |name: &str| {
        let pid = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        let mark = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.split('-').nth(1));
        if !mark.is_some_and(same_pid_namespace) {
            return false;
        }
        pid.is_some_and(|pid| match pid == std::process::id() {
            // This pid, another mark: a dead process that had this pid.
            true => mark != Some(process_mark()),
            false => !Path::new(&format!("/proc/{pid}")).exists(),
        })
    };
    for name in segment::list(&prefix) {
        if dead(&name) {
            Segment::remove(&name);
        }
    }
    if let Ok(entries) = std::fs::read_dir(spill_dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) && dead(&name) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}
