//! Spill files: a partition's IPC stream bytes on disk, followed by a
//! trailer (length, CRC-32, magic), and read back by mapping the file and
//! verifying the trailer and checksum. Knows the file format and a store's
//! spill directory; which partition spills when is the store's business.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use streambatch_core::PartitionId;

use crate::error::SpillError;
use crate::ipc;

const MAGIC: &[u8; 8] = b"SBSPILL1";
const TRAILER: usize = 8 + 4 + 8;

/// A store's spill directory, made on first use and removed (with every
/// file in it) when dropped. On a shared host a node's partitions are its
/// own: the directory is made 0700 and each file 0600, whatever the umask.
pub struct SpillDir {
    dir: PathBuf,
}

impl SpillDir {
    /// The directory `dir` (not made yet).
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The spill file of partition `id`, making the directory if needed.
    pub fn file(&self, id: PartitionId) -> std::io::Result<PathBuf> {
        if !self.dir.is_dir() {
            if let Some(parent) = self.dir.parent() {
                std::fs::create_dir_all(parent)?;
            }
            match std::fs::DirBuilder::new().mode(0o700).create(&self.dir) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        Ok(self.dir.join(format!("{id}.arrows")))
    }
}

impl Drop for SpillDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes stream bytes (given in pieces) and the trailer to `path`.
pub fn write<'a>(path: &Path, pieces: impl IntoIterator<Item = &'a [u8]>) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
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
    let io = |source| SpillError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: spill files are written once, before they are mapped, and
    // removed (never changed) when the partition is freed.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
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

/// Reads a spilled partition zero-copy from its file's mapping.
pub fn read(path: &Path) -> Result<RecordBatch, SpillError> {
    let bytes = map(path)?;
    // SAFETY: encoded by the store from a valid batch, and the CRC matched.
    unsafe { ipc::decode_trusted(&bytes) }.map_err(|source| SpillError::Decode {
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
        let spill = SpillDir::new(dir.path().join("shared").join("store-1"));
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
