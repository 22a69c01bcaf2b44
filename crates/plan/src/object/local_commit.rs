//! A local write's commit in progress. Before its staged parts move into
//! the output directory, the writer records in its staging directory what
//! moves where (`committing`, synced); its renames and then its removals of
//! the earlier parts follow. A commit cut short between them (the writer
//! killed) is finished by whoever finds it next, a writer or a reader of
//! the directory, so the directory shows one write whole, never a mix.
//! Staging directories are named `.streambatch-staging-PID-STAMPnNS`, NS
//! the writer's pid namespace: only a process of that namespace can tell
//! whether the writer is dead.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The record of a commit in progress, in its staging directory.
const MARKER: &str = "committing";

/// What names a staging directory.
pub(crate) const STAGING_PREFIX: &str = ".streambatch-staging-";

/// A new staging directory's name for this process.
pub(crate) fn staging_name() -> String {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{STAGING_PREFIX}{}-{stamp:x}n{:x}",
        std::process::id(),
        streambatch_core::pid_namespace()
    )
}

/// A staging directory name's writer: its pid and its pid namespace (a
/// name of an older build, without one, is of this one).
fn writer_of(name: &str) -> Option<(u32, u64)> {
    let rest = name.strip_prefix(STAGING_PREFIX)?;
    let (pid, stamp) = rest.split_once('-')?;
    let namespace = match stamp.split_once('n') {
        Some((_, ns)) => u64::from_str_radix(ns, 16).ok()?,
        None => streambatch_core::pid_namespace(),
    };
    Some((pid.parse().ok()?, namespace))
}

/// The writer lock of `dir`: an exclusive `flock` on the directory itself,
/// held while the returned handle is open. A second writer into the
/// directory, in this process or another, is refused while the first
/// runs; the kernel lets the lock go with its process, so a killed writer
/// leaves none, and no lock file is left among the output.
pub(crate) fn lock_for_writing(dir: &Path) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let handle = std::fs::File::open(dir).map_err(|e| Error::io("opening", dir, e))?;
    // SAFETY: flock on a descriptor this function owns, open above.
    let locked = unsafe { libc::flock(handle.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if locked != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Err(Error::Invalid(format!(
                "{}: another write into it is running; one write into a directory at a time",
                dir.display()
            )));
        }
        return Err(Error::io("locking", dir, e));
    }
    Ok(handle)
}

/// Whether the staging directory `staging` holds a commit's record.
pub(crate) fn is_recorded(staging: &Path) -> bool {
    staging.join(MARKER).is_file()
}

/// Whether the staging directory `name`'s writer is dead (as far as this
/// process can tell: never one of another pid namespace, nor this one).
pub(crate) fn writer_is_dead(name: &str) -> bool {
    writer_of(name).is_some_and(|(pid, namespace)| {
        pid != std::process::id() && !streambatch_core::may_be_alive(pid, namespace)
    })
}

/// Records, synced, that `moves` (staged file, its name in `dir`) are about
/// to go into `dir`, and that then `dir`'s other `part-*.<extension>`
/// files go.
pub(crate) fn begin(staging: &Path, extension: &str, moves: &[(PathBuf, String)]) -> Result<()> {
    let marker = staging.join(MARKER);
    let mut text = format!("{extension}\n");
    for (from, name) in moves {
        let from = from.file_name().unwrap_or_default().to_string_lossy();
        text.push_str(&format!("{from}\t{name}\n"));
    }
    // Whole or absent: written beside, synced, then renamed in.
    let partial = staging.join(".committing.partial");
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&partial)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&partial, &marker)?;
        std::fs::File::open(staging)?.sync_all()
    };
    write().map_err(|e| Error::io("writing", &marker, e))
}

/// Finishes in `dir` the commits that dead writers left cut short, and
/// removes their staging; whether it finished any. A live writer's commit
/// in progress is an error when `reading` (the directory is about to be
/// read: read again once it has ended), and left alone otherwise.
pub(crate) fn settle(dir: &Path, reading: bool) -> Result<bool> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(false);
    };
    let mut finished = false;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let staging = entry.path();
        if !name.starts_with(STAGING_PREFIX) || !staging.join(MARKER).is_file() {
            continue;
        }
        if writer_is_dead(&name) {
            finish(dir, &staging)?;
            finished = true;
        } else if reading {
            return Err(Error::Invalid(format!(
                "{}: a write is committing into it (staging {name}); read it again once that write has ended",
                dir.display()
            )));
        }
    }
    Ok(finished)
}

/// Does what `staging`'s marker says is left to do, each step again if it
/// was done (another process may be finishing it too).
fn finish(dir: &Path, staging: &Path) -> Result<()> {
    let marker = staging.join(MARKER);
    let text = std::fs::read_to_string(&marker).map_err(|e| Error::io("reading", &marker, e))?;
    let bad = || Error::Invalid(format!("{}: not a commit record", marker.display()));
    let mut lines = text.lines();
    let extension = lines.next().ok_or_else(bad)?;
    let plain = |name: &str| !name.is_empty() && !name.contains('/') && name != "..";
    let mut kept = Vec::new();
    for line in lines {
        let (from, to) = line.split_once('\t').ok_or_else(bad)?;
        if !plain(from) || !plain(to) || !to.starts_with("part-") {
            return Err(bad());
        }
        let staged = staging.join(from);
        match std::fs::rename(&staged, dir.join(to)) {
            Ok(()) => {}
            // Moved before the kill (or by another finisher).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("renaming into", dir.join(to), e)),
        }
        kept.push(to.to_string());
    }
    sync(dir)?;
    let suffix = format!(".{extension}");
    for entry in std::fs::read_dir(dir)
        .map_err(|e| Error::io("listing", dir, e))?
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("part-") && name.ends_with(&suffix) && !kept.contains(&name) {
            match std::fs::remove_file(entry.path()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io("removing", entry.path(), e));
                }
                _ => {}
            }
        }
    }
    sync(dir)?;
    tracing::warn!(dir = %dir.display(), "finished a write's commit that its writer left cut short");
    match std::fs::remove_dir_all(staging) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::io("removing", staging, e))
        }
        _ => Ok(()),
    }
}

fn sync(dir: &Path) -> Result<()> {
    match std::fs::File::open(dir).and_then(|d| d.sync_all()) {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
        result => result.map_err(|e| Error::io("syncing", dir, e)),
    }
}
