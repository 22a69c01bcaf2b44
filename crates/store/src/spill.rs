//! Spill files: a partition's IPC stream bytes on disk, followed by a
//! trailer (length, CRC-32, magic), and read back by mapping the file,
//! verifying the trailer and checksum, and validating the stream. Knows the
//! file format and a store's spill directory; which partition spills when
//! is the store's business.
//!
//! A store's directory is refused unless it is the node user's own and
//! 0700, and the node's spill directory holding it unless no other user
//! may write there: no other user can read a partition or plant a file.
//! Files are made anew, never through a link or over an existing file.
//! What is read back gets Arrow's full validation, not only the CRC (which
//! catches accidents, not edits): whatever is in the file, a read gives an
//! error or a valid batch. That is simpler than a keyed MAC (no key to
//! make or keep) and as sound for memory safety; the directories' owner
//! and mode keep other users from changing the data.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use streambatch_core::PartitionId;

use crate::error::{SpillError, StoreError};
use crate::ipc;

const MAGIC: &[u8; 8] = b"SBSPILL1";
const TRAILER: usize = 8 + 4 + 8;

/// A store's spill directory inside the node's (checked) spill directory,
/// made 0700 on first use (or refused if someone made it otherwise) and
/// removed (with every file in it) when dropped. Each file is 0600,
/// whatever the umask.
pub struct SpillDir {
    dir: PathBuf,
    made: AtomicBool,
}

impl SpillDir {
    /// The directory `name` inside `parent`, the node's spill directory:
    /// `parent` is made (0700, with any missing parents) if missing, and
    /// refused if another user could rename or replace what is in it.
    pub fn open(parent: &Path, name: &str) -> Result<Self, StoreError> {
        if let Err(e) = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
        {
            return Err(StoreError::io(parent, e));
        }
        // Resolved once: a link along the way cannot be swapped later.
        let parent = parent
            .canonicalize()
            .map_err(|e| StoreError::io(parent, e))?;
        check_parent(&parent)?;
        Ok(Self {
            dir: parent.join(name),
            made: AtomicBool::new(false),
        })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The spill file of partition `id`, making the directory if needed.
    pub fn file(&self, id: PartitionId) -> Result<PathBuf, StoreError> {
        if !self.made.load(Ordering::Acquire) {
            match std::fs::DirBuilder::new().mode(0o700).create(&self.dir) {
                Ok(()) => {}
                // Its name is predictable: one already there is used only
                // if it is as private as one made now.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    check_private(&self.dir)?
                }
                Err(e) => return Err(StoreError::io(&self.dir, e)),
            }
            self.made.store(true, Ordering::Release);
        }
        Ok(self.dir.join(format!("{id}.arrows")))
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Refuses the node's spill directory `dir` when another user could
/// rename, remove or replace the store directories in it: it must belong
/// to this user (or root, as /tmp does) and be writable by nobody else,
/// unless sticky (as /tmp is: then only an entry's owner may move it).
fn check_parent(dir: &Path) -> Result<(), StoreError> {
    let meta = std::fs::metadata(dir).map_err(|e| StoreError::io(dir, e))?;
    let refuse = |problem: String| StoreError::SpillDir {
        path: dir.to_path_buf(),
        problem,
    };
    if !meta.is_dir() {
        return Err(refuse(
            "not a directory: set spill_dir to a directory of your own".into(),
        ));
    }
    let (owner, me) = (meta.uid(), euid());
    if owner != me && owner != 0 {
        return Err(refuse(format!(
            "owned by uid {owner}, not by this node's user (uid {me}): its owner could replace spilled partitions; set spill_dir to a directory of your own"
        )));
    }
    let mode = meta.mode();
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(refuse(format!(
            "mode {:04o}: other users could replace spilled partitions; `chmod 700 {}`, or set spill_dir to another directory",
            mode & 0o7777,
            dir.display()
        )));
    }
    Ok(())
}

/// Refuses a store's directory `dir` unless it is a directory (not a link)
/// that this user owns and only it may read, write or enter (mode 0700).
fn check_private(dir: &Path) -> Result<(), StoreError> {
    let refuse = |problem: String| StoreError::SpillDir {
        path: dir.to_path_buf(),
        problem,
    };
    let meta = std::fs::symlink_metadata(dir).map_err(|e| StoreError::io(dir, e))?;
    if !meta.is_dir() {
        return Err(refuse(
            "not a directory (a link or a file): remove it, or set spill_dir to a directory of your own".into(),
        ));
    }
    let (owner, me) = (meta.uid(), euid());
    if owner != me {
        return Err(refuse(format!(
            "owned by uid {owner}, not by this node's user (uid {me}): its owner could read or replace spilled partitions; remove it, or set spill_dir to a directory of your own"
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode != 0o700 {
        return Err(refuse(format!(
            "mode {mode:04o}, not 0700: other users could read or replace spilled partitions; `chmod 700 {}`, or set spill_dir to another directory",
            dir.display()
        )));
    }
    Ok(())
}

impl Drop for SpillDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes stream bytes (given in pieces) and the trailer to a new file at
/// `path`: never through a link, never over an existing file (either is an
/// error), and a file left half-written is removed.
pub fn write<'a>(path: &Path, pieces: impl IntoIterator<Item = &'a [u8]>) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(path)?;
    let written = (|| {
        let mut file = std::io::BufWriter::with_capacity(1 << 20, file);
        let mut crc = crc32fast::Hasher::new();
        let mut len = 0;
        for piece in pieces {
            file.write_all(piece)?;
            crc.update(piece);
            len += piece.len();
        }
        file.write_all(&trailer(len, crc.finalize()))?;
        file.flush()
    })();
    if written.is_err() {
        // Made by this call (create_new), so ours to remove.
        let _ = std::fs::remove_file(path);
    }
    written
}

fn trailer(len: usize, crc: u32) -> Vec<u8> {
    let mut t = Vec::with_capacity(TRAILER);
    t.extend_from_slice(&(len as u64).to_le_bytes());
    t.extend_from_slice(&crc.to_le_bytes());
    t.extend_from_slice(MAGIC);
    t
}

/// Maps a spill file and checks its trailer and CRC; returns the stream bytes.
pub fn map(path: &Path) -> Result<Buffer, SpillError> {
    map_file(&open(path)?, path)
}

/// Opens a spill file to read (never through a link). The open file keeps
/// its bytes readable even once the partition is freed or restored and
/// its name removed: a read that opened it under the store's lock
/// finishes whatever happens to the partition meanwhile.
pub fn open(path: &Path) -> Result<std::fs::File, SpillError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|source| SpillError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// [`map`] of the open spill file `file`, found at `path`.
pub fn map_file(file: &std::fs::File, path: &Path) -> Result<Buffer, SpillError> {
    let io = |source| SpillError::Io {
        path: path.to_path_buf(),
        source,
    };
    // SAFETY: spill files are written once, before they are mapped, and
    // removed (never changed) when the partition is freed.
    let map = unsafe { memmap2::Mmap::map(file) }.map_err(io)?;
    if map.len() < TRAILER || &map[map.len() - 8..] != MAGIC {
        return Err(SpillError::Truncated {
            path: path.to_path_buf(),
        });
    }
    let body = map.len() - TRAILER;
    let len = u64::from_le_bytes(map[body..body + 8].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(map[body + 8..body + 12].try_into().expect("4 bytes"));
    if len != body as u64 || crc32fast::hash(&map[..body]) != crc {
        return Err(SpillError::Corrupt {
            path: path.to_path_buf(),
        });
    }
    let map = Arc::new(map);
    let ptr = NonNull::new(map.as_ptr() as *mut u8).expect("a mapping is never at address 0");
    // SAFETY: the mapping lives, unchanged, as long as the buffer holds `map`.
    Ok(unsafe { ipc::view(ptr, body, map) })
}

/// Reads a spilled partition zero-copy from the mapping of its open file
/// (found at `path`), validated.
pub fn read(file: &std::fs::File, path: &Path) -> Result<RecordBatch, SpillError> {
    decode(&map_file(file, path)?, path)
}

/// Decodes a spill file's stream bytes with Arrow's full validation: a
/// file is outside the process, so its bytes are not trusted.
pub fn decode(bytes: &Buffer, path: &Path) -> Result<RecordBatch, SpillError> {
    ipc::decode(bytes).map_err(|source| SpillError::Decode {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spill_files_are_private_to_their_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let spill = SpillDir::open(&dir.path().join("shared"), "store-1").unwrap();
        let path = spill.file(PartitionId(1)).unwrap();
        write(&path, [b"bytes".as_slice()]).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(spill.path()), 0o700);
        assert_eq!(mode(&path), 0o600);
    }

    #[test]
    fn a_file_reads_back_and_a_flipped_byte_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.arrows");
        write(&path, [b"hello ".as_slice(), b"world".as_slice()]).unwrap();
        assert_eq!(map(&path).unwrap().as_slice(), b"hello world");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[3] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(map(&path), Err(SpillError::Corrupt { .. })));
        std::fs::write(&path, b"short").unwrap();
        assert!(matches!(map(&path), Err(SpillError::Truncated { .. })));
        std::fs::remove_file(&path).unwrap();
        let err = map(&path).unwrap_err();
        assert!(matches!(err, SpillError::Io { .. }));
        assert!(std::error::Error::source(&err).is_some());
    }
}
