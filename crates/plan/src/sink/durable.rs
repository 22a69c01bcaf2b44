//! The file-system steps of putting written files in place, one function
//! each, so that the order a commit takes them in (which decides what a
//! power loss can lose) is recorded in test builds and checked: a file is
//! synced before it is renamed into place, and a directory after the
//! renames into it and before (and after) the removals they allow.

use std::path::Path;

use crate::error::{Error, Result};

/// Notes a step in test builds (nothing otherwise).
macro_rules! record {
    ($op:expr) => {
        #[cfg(test)]
        log($op);
    };
}

/// Flushes the written file `path` to disk, so that no rename can put in
/// place a name whose bytes a power loss would lose.
pub(crate) fn sync_file(path: &Path) -> Result<()> {
    record!(Op::SyncFile(path.into()));
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io("syncing", path, e))
}

/// Flushes the directory `dir`'s entries (the renames and removals in it)
/// to disk.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    record!(Op::SyncDir(dir.into()));
    match std::fs::File::open(dir).and_then(|d| d.sync_all()) {
        // EINVAL: a file system that cannot sync a directory has no order
        // to keep.
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
        result => result.map_err(|e| Error::io("syncing", dir, e)),
    }
}

/// Renames `from` to `to`.
pub(crate) fn rename(from: &Path, to: &Path) -> Result<()> {
    record!(Op::Rename(from.into(), to.into()));
    std::fs::rename(from, to).map_err(|e| Error::io("renaming into", to, e))
}

/// Removes the file `path`.
pub(crate) fn remove_file(path: &Path) -> Result<()> {
    record!(Op::Remove(path.into()));
    std::fs::remove_file(path).map_err(|e| Error::io("removing", path, e))
}

/// A step, as a test sees it.
#[cfg(test)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    SyncFile(std::path::PathBuf),
    Rename(std::path::PathBuf, std::path::PathBuf),
    SyncDir(std::path::PathBuf),
    Remove(std::path::PathBuf),
}

#[cfg(test)]
thread_local! {
    static LOG: std::cell::RefCell<Option<Vec<Op>>> = const { std::cell::RefCell::new(None) };
}

#[cfg(test)]
fn log(op: Op) {
    LOG.with(|log| {
        if let Some(log) = log.borrow_mut().as_mut() {
            log.push(op);
        }
    });
}

/// Runs `f`, returning the steps it took on this thread.
#[cfg(test)]
pub(crate) fn recorded<T>(f: impl FnOnce() -> T) -> (T, Vec<Op>) {
    LOG.with(|log| *log.borrow_mut() = Some(Vec::new()));
    let out = f();
    let ops = LOG.with(|log| log.borrow_mut().take()).unwrap_or_default();
    (out, ops)
}
