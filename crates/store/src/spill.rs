//! Spill files: a partition's IPC streams on disk (one, or one per group
//! of rows that is read alone: an exchange's destination), each followed
//! by padding to 64 bytes, then an index of the streams (where each lies
//! and its CRC-32) and a trailer (the count, the index's CRC-32, magic).
//! A group is read back alone, checked against its CRC and validated. Knows
//! the file format and a store's spill directory; which partition spills
//! when is the store's business.
//!
//! Files are written and read by direct I/O where the file system allows
//! it (see `streambatch_core::DirectWriter`): a spill file is written once
//! and read once or a few times, so the page cache would cost a copy each
//! way and evict the job's input files' pages for nothing.
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

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use streambatch_core::{AlignedBlock, BLOCK, DirectWriter, PartitionId};

use crate::error::{SpillError, StoreError};
use crate::ipc;

/// A store's spill directory inside the node's (checked) spill directory,
/// made 0700 on first use (or refused if someone made it otherwise) and
/// removed (with every file in it) when dropped. Each file is 0600,
/// whatever the umask.
pub struct SpillDir {
    dir: PathBuf,
    made: AtomicBool,
    remover: Mutex<Option<Remover>>,
}

/// A thread that removes the files it is given, in turn. Freeing a spill
/// file's blocks takes milliseconds where the file system discards them as
/// it frees them (mount option `discard`: about 5 ms for 30 MiB on this
/// project's machines), and a store frees a partition under its lock: an
/// exchange's hundred map outputs freed at a job's end held the job's
/// commit up by 0.7 s.
struct Remover {
    queue: mpsc::Sender<Removal>,
    thread: std::thread::JoinHandle<()>,
}

/// What the remover is asked.
enum Removal {
    File(PathBuf),
    /// Say so once every file asked before is removed.
    Settle(mpsc::Sender<()>),
}

impl Remover {
    fn start() -> std::io::Result<Self> {
        let (queue, asked) = mpsc::channel::<Removal>();
        let thread = std::thread::Builder::new()
            .name("spill-remover".into())
            .spawn(move || {
                for removal in asked {
                    match removal {
                        Removal::File(path) => {
                            let _ = std::fs::remove_file(path);
                        }
                        Removal::Settle(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })?;
        Ok(Self { queue, thread })
    }
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
            remover: Mutex::new(None),
        })
    }

    /// Removes the spill file at `path`, one this store no longer uses, on
    /// the directory's remover thread (at once where it cannot start).
    /// Every file given is gone when the directory drops.
    pub fn remove(&self, path: PathBuf) {
        let mut remover = self.remover.lock().unwrap_or_else(|p| p.into_inner());
        if remover.is_none() {
            *remover = Remover::start().ok();
        }
        match remover.as_ref() {
            // Sent unless the thread is gone: the directory's removal then
            // takes the file.
            Some(r) => drop(r.queue.send(Removal::File(path))),
            None => drop(std::fs::remove_file(path)),
        }
    }

    /// Waits until every file given to [`SpillDir::remove`] so far is
    /// removed.
    pub(crate) fn settle(&self) {
        let (done, settled) = mpsc::channel();
        let sent = {
            let remover = self.remover.lock().unwrap_or_else(|p| p.into_inner());
            remover
                .as_ref()
                .is_some_and(|r| r.queue.send(Removal::Settle(done)).is_ok())
        };
        if sent {
            let _ = settled.recv();
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The spill file of partition `id`, making the directory if needed.
    pub fn file(&self, id: PartitionId) -> Result<PathBuf, StoreError> {
        Ok(self.made()?.join(format!("{id}.arrows")))
    }

    /// Its path, the directory made (0700) if it is not yet.
    pub fn made(&self) -> Result<&Path, StoreError> {
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
        Ok(&self.dir)
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
        let remover = self.remover.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(Remover { queue, thread }) = remover.take() {
            drop(queue);
            let _ = thread.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The trailer's magic.
const MAGIC: &[u8; 8] = b"SBSPILL2";
/// The trailer: the count of streams (u64), the index's CRC-32 (u32), magic.
const TRAILER: usize = 8 + 4 + 8;
/// An index entry: a stream's offset (u64), length (u64) and CRC-32 (u32),
/// and 4 bytes of padding.
const ENTRY: usize = 24;

/// Writes `streams` (each an IPC stream given in pieces) to a new file at
/// `path`, with their index and the trailer: never through a link, never
/// over an existing file (either is an error), and a file left
/// half-written is removed.
pub fn write<'a, S>(path: &Path, streams: impl IntoIterator<Item = S>) -> std::io::Result<()>
where
    S: IntoIterator<Item = &'a [u8]>,
{
    use std::io::Write;
    const ZEROS: [u8; 64] = [0; 64];
    let mut out = DirectWriter::create_new(path, 0o600)?;
    let written = (|| {
        let mut index = Vec::new();
        for stream in streams {
            let at = out.position();
            let mut crc = crc32fast::Hasher::new();
            for piece in stream {
                crc.update(piece);
                out.write_all(piece)?;
            }
            let len = out.position() - at;
            // The next stream starts aligned, as its buffers were in memory.
            let pad = len.next_multiple_of(crate::alloc::ALIGN as u64) - len;
            out.write_all(&ZEROS[..pad as usize])?;
            index.extend_from_slice(&at.to_le_bytes());
            index.extend_from_slice(&len.to_le_bytes());
            index.extend_from_slice(&crc.finalize().to_le_bytes());
            index.extend_from_slice(&[0; 4]);
        }
        out.write_all(&index)?;
        out.write_all(&((index.len() / ENTRY) as u64).to_le_bytes())?;
        out.write_all(&crc32fast::hash(&index).to_le_bytes())?;
        out.write_all(MAGIC)?;
        out.finish().map(drop)
    })();
    if written.is_err() {
        // Made by this call (create_new), so ours to remove.
        let _ = std::fs::remove_file(path);
    }
    written
}

/// Writes `batch` cut at `groups` as one stream per group to a new spill
/// file at `path`.
pub(crate) fn write_groups(
    path: &Path,
    batch: &RecordBatch,
    groups: &[u32],
) -> Result<(), StoreError> {
    let streams = groups
        .windows(2)
        .map(|w| ipc::encode(&batch.slice(w[0] as usize, (w[1] - w[0]) as usize)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(StoreError::Encode)?;
    write(path, streams.iter().map(|s| s.pieces())).map_err(|e| StoreError::io(path, e))
}

/// Writes partition `batch` (`encoded`) to a new spill file at `path`: one
/// stream per group where it has groups.
pub(crate) fn write_partition(
    path: &Path,
    batch: &RecordBatch,
    encoded: &ipc::Encoded,
    groups: Option<&[u32]>,
) -> Result<(), StoreError> {
    match groups {
        None => write(path, [encoded.pieces()]).map_err(|e| StoreError::io(path, e)),
        Some(groups) => write_groups(path, batch, groups),
    }
}

/// The groups (first, count) of `groups` (starts and the end) that hold
/// `rows`: at least one, so that even no rows read with their schema.
pub(crate) fn groups_holding(groups: &[u32], rows: &std::ops::Range<usize>) -> (usize, usize) {
    let n = groups.len() - 1;
    // No rows where a group starts (an empty destination's own): only
    // that group's stream is read, its header (a hash exchange's reducer
    // asks every map output for its destination, rows or not).
    let first = groups.partition_point(|&s| (s as usize) < rows.start);
    if rows.is_empty() && first < n && groups[first] as usize == rows.start {
        return (first, 1);
    }
    let first = groups
        .partition_point(|&s| s as usize <= rows.start)
        .saturating_sub(1)
        .min(n - 1);
    let end = groups.partition_point(|&s| (s as usize) < rows.end).min(n);
    (first, end.saturating_sub(first).max(1))
}

/// An open spill file, read a stream at a time.
pub struct SpillFile {
    file: std::fs::File,
    path: PathBuf,
    /// Stream bytes read and not yet taken.
    read: std::sync::atomic::AtomicU64,
    index: IndexCache,
}

/// A spill file's index once read and checked, kept with its partition so
/// that each later read of the file skips it: an exchange's reducers each
/// read a group of every map output, and the index's own read was a disk
/// read (direct I/O) for every one of them. The file is written once and
/// never changed, and every stream read is still checked against its CRC
/// and validated.
pub type IndexCache = Arc<OnceLock<Vec<Stream>>>;

/// Where a stream lies in its file, and its CRC-32.
#[derive(Clone, Copy, Debug)]
pub struct Stream {
    at: u64,
    len: u64,
    crc: u32,
}

impl SpillFile {
    /// Opens a spill file to read (never through a link; direct where the
    /// file system allows it). The open file keeps its bytes readable even
    /// once the partition is freed or restored and its name removed: a
    /// read that opened it under the store's lock finishes whatever
    /// happens to the partition meanwhile.
    #[cfg(test)]
    pub fn open(path: &Path) -> Result<Self, SpillError> {
        Self::open_cached(path, &IndexCache::default())
    }

    /// [`SpillFile::open`], its index taken from `index` once read (by
    /// this file or an earlier one of the same path), else read into it.
    pub fn open_cached(path: &Path, index: &IndexCache) -> Result<Self, SpillError> {
        let file = streambatch_core::open_direct(path).map_err(|source| SpillError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            read: Default::default(),
            index: index.clone(),
        })
    }

    /// Stream bytes read since the last call.
    pub fn take_bytes_read(&self) -> u64 {
        self.read.swap(0, Ordering::Relaxed)
    }

    /// Reads streams `first..first + count` of the file, which holds
    /// `streams` in all: each checked against its CRC-32 and decoded with
    /// Arrow's full validation, since a file is outside the process and
    /// its bytes are not trusted.
    pub fn read(
        &self,
        streams: usize,
        first: usize,
        count: usize,
    ) -> Result<Vec<RecordBatch>, SpillError> {
        let index = self.index(streams)?;
        let wanted = &index[first..first + count];
        let (Some(head), Some(tail)) = (wanted.first(), wanted.last()) else {
            return Ok(Vec::new());
        };
        // Streams lie in order, each after the one before: read at once
        // (an exchange's reducer reads many small groups of one file).
        let in_order = wanted.windows(2).all(|w| w[0].at + w[0].len <= w[1].at);
        if !in_order {
            return Err(self.corrupt());
        }
        let span = usize::try_from(tail.at + tail.len - head.at).map_err(|_| self.corrupt())?;
        let bytes = self.read_at(head.at, span)?;
        wanted
            .iter()
            .map(|s| {
                let at = (s.at - head.at) as usize;
                let stream = bytes.slice_with_length(at, s.len as usize);
                self.decode(&self.checked(stream, s)?)
            })
            .collect()
    }

    /// Groups `range` of a file cut at `groups` (starts and the end, as
    /// [`write_groups`] wrote them), as one batch.
    pub(crate) fn read_groups(
        &self,
        groups: &[u32],
        range: std::ops::Range<usize>,
    ) -> Result<RecordBatch, SpillError> {
        let mut batches = self.read(groups.len() - 1, range.start, range.len())?;
        // A file whose groups hold other row counts than the store wrote is
        // not this partition's.
        let counts = groups[range.start..=range.end].windows(2);
        if groups[range.end] != u32::MAX
            && counts
                .zip(&batches)
                .any(|(w, b)| b.num_rows() != (w[1] - w[0]) as usize)
        {
            return Err(self.corrupt());
        }
        if batches.len() == 1 {
            return Ok(batches.pop().expect("one"));
        }
        arrow_select::concat::concat_batches(&batches[0].schema(), &batches).map_err(|source| {
            SpillError::Decode {
                path: self.path.clone(),
                source,
            }
        })
    }

    /// The bytes of the file's one stream (of `streams` = 1), checked
    /// against its CRC-32 and validated: an IPC stream to send elsewhere.
    pub fn single_stream(&self) -> Result<Buffer, SpillError> {
        let index = self.index(1)?;
        let bytes = self.stream_bytes(&index[0])?;
        self.decode(&bytes)?;
        Ok(bytes)
    }

    fn decode(&self, bytes: &Buffer) -> Result<RecordBatch, SpillError> {
        ipc::decode(bytes).map_err(|source| SpillError::Decode {
            path: self.path.clone(),
            source,
        })
    }

    /// The index, checked: `streams` entries, each inside the file.
    fn index(&self, streams: usize) -> Result<&[Stream], SpillError> {
        let index = match self.index.get() {
            Some(index) => index,
            None => {
                let index = self.read_index(streams)?;
                self.index.get_or_init(|| index)
            }
        };
        match index.len() == streams {
            true => Ok(index),
            false => Err(SpillError::Truncated {
                path: self.path.clone(),
            }),
        }
    }

    fn read_index(&self, streams: usize) -> Result<Vec<Stream>, SpillError> {
        let truncated = || SpillError::Truncated {
            path: self.path.clone(),
        };
        let size = self.file.metadata().map_err(|e| self.io(e))?.len();
        let tail = (streams * ENTRY + TRAILER) as u64;
        let Some(at) = size.checked_sub(tail) else {
            return Err(truncated());
        };
        let bytes = self.read_at(at, tail as usize)?;
        let (index, trailer) = bytes.as_slice().split_at(streams * ENTRY);
        let count = u64::from_le_bytes(trailer[..8].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(trailer[8..12].try_into().expect("4 bytes"));
        if &trailer[12..] != MAGIC || count != streams as u64 {
            return Err(truncated());
        }
        if crc32fast::hash(index) != crc {
            return Err(self.corrupt());
        }
        index
            .chunks_exact(ENTRY)
            .map(|e| {
                let word = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().expect("8 bytes"));
                let stream = Stream {
                    at: word(0),
                    len: word(8),
                    crc: u32::from_le_bytes(e[16..20].try_into().expect("4 bytes")),
                };
                let inside = stream
                    .at
                    .checked_add(stream.len)
                    .is_some_and(|end| end <= at);
                if inside && stream.at.is_multiple_of(crate::alloc::ALIGN as u64) {
                    Ok(stream)
                } else {
                    Err(self.corrupt())
                }
            })
            .collect()
    }

    /// A stream's bytes, checked against its CRC-32.
    fn stream_bytes(&self, stream: &Stream) -> Result<Buffer, SpillError> {
        let len = usize::try_from(stream.len).map_err(|_| self.corrupt())?;
        let bytes = self.read_at(stream.at, len)?;
        self.checked(bytes, stream)
    }

    /// `bytes`, read as `stream`, checked against its CRC-32.
    fn checked(&self, bytes: Buffer, stream: &Stream) -> Result<Buffer, SpillError> {
        if crc32fast::hash(bytes.as_slice()) != stream.crc {
            return Err(self.corrupt());
        }
        self.read.fetch_add(stream.len, Ordering::Relaxed);
        Ok(bytes)
    }

    /// `len` bytes at `at`, read in whole blocks into an aligned buffer (as
    /// direct I/O requires) and viewed from there: a stream at a 64-byte
    /// offset of the file lies at a 64-byte offset of the buffer.
    fn read_at(&self, at: u64, len: usize) -> Result<Buffer, SpillError> {
        let start = at - at % BLOCK as u64;
        let skip = (at - start) as usize;
        let mut block =
            AlignedBlock::zeroed((skip + len).next_multiple_of(BLOCK)).map_err(|e| self.io(e))?;
        if block.read_from(&self.file, start).map_err(|e| self.io(e))? < skip + len {
            return Err(SpillError::Truncated {
                path: self.path.clone(),
            });
        }
        let ptr = NonNull::from(&block.as_slice()[skip..]).cast::<u8>();
        // SAFETY: `skip..skip + len` lies inside the block, which the
        // buffer owns (its heap bytes do not move with it) and nothing
        // changes any more.
        Ok(unsafe { ipc::view(ptr, len, Arc::new(block)) })
    }

    fn io(&self, source: std::io::Error) -> SpillError {
        SpillError::Io {
            path: self.path.clone(),
            source,
        }
    }

    fn corrupt(&self) -> SpillError {
        SpillError::Corrupt {
            path: self.path.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, Int64Array};

    fn ints(range: std::ops::Range<i64>) -> RecordBatch {
        let column: ArrayRef = Arc::new(Int64Array::from_iter_values(range));
        RecordBatch::try_from_iter([("x", column)]).unwrap()
    }

    fn stream(batch: &RecordBatch) -> Vec<u8> {
        let encoded = ipc::encode(batch).unwrap();
        encoded.pieces().flatten().copied().collect()
    }

    #[test]
    fn spill_files_are_private_to_their_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let spill = SpillDir::open(&dir.path().join("shared"), "store-1").unwrap();
        let path = spill.file(PartitionId(1)).unwrap();
        write(&path, [[stream(&ints(0..3)).as_slice()]]).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(spill.path()), 0o700);
        assert_eq!(mode(&path), 0o600);
    }

    #[test]
    fn removed_files_go_on_the_remover_and_all_are_gone_when_the_directory_drops() {
        let dir = tempfile::tempdir().unwrap();
        let spill = SpillDir::open(dir.path(), "store-1").unwrap();
        let files: Vec<PathBuf> = (0..20)
            .map(|n| {
                let path = spill.file(PartitionId(n)).unwrap();
                write(&path, [[stream(&ints(0..3)).as_slice()]]).unwrap();
                path
            })
            .collect();
        spill.remove(files[0].clone());
        spill.settle();
        assert!(!files[0].exists());
        assert!(files[1].exists(), "only what was given");
        for path in &files[1..] {
            spill.remove(path.clone());
        }
        let store_dir = spill.path().to_path_buf();
        drop(spill);
        assert!(files.iter().all(|f| !f.exists()));
        assert!(!store_dir.exists());
    }

    #[test]
    fn each_stream_reads_back_alone_and_a_flipped_byte_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.arrows");
        // Larger than a write's chunk, so that several writes make the file.
        let batches = [ints(0..3), ints(3..700_000), ints(0..0), ints(-5..5)];
        let streams: Vec<Vec<u8>> = batches.iter().map(stream).collect();
        write(&path, streams.iter().map(|s| [s.as_slice()])).unwrap();
        let file = SpillFile::open(&path).unwrap();
        for (i, batch) in batches.iter().enumerate() {
            assert_eq!(&file.read(4, i, 1).unwrap()[0], batch);
        }
        assert_eq!(file.read(4, 1, 3).unwrap(), batches[1..]);
        assert!(matches!(
            file.read(3, 0, 1),
            Err(SpillError::Truncated { .. })
        ));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[3] ^= 1;
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        let file = SpillFile::open(&path).unwrap();
        assert!(matches!(
            file.read(4, 0, 1),
            Err(SpillError::Corrupt { .. })
        ));
        assert_eq!(
            file.read(4, 3, 1).unwrap()[0],
            batches[3],
            "others are whole"
        );
        std::fs::write(&path, b"short").unwrap();
        let file = SpillFile::open(&path).unwrap();
        assert!(matches!(
            file.read(1, 0, 1),
            Err(SpillError::Truncated { .. })
        ));
        std::fs::remove_file(&path).unwrap();
        let err = SpillFile::open(&path).err().unwrap();
        assert!(matches!(err, SpillError::Io { .. }));
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn an_index_is_read_once_per_cache_and_each_stream_still_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.arrows");
        let batches = [ints(0..3), ints(3..10)];
        let streams: Vec<Vec<u8>> = batches.iter().map(stream).collect();
        write(&path, streams.iter().map(|s| [s.as_slice()])).unwrap();
        let cache = IndexCache::default();
        let file = SpillFile::open_cached(&path, &cache).unwrap();
        assert_eq!(file.read(2, 1, 1).unwrap()[0], batches[1]);
        assert_eq!(file.take_bytes_read(), streams[1].len() as u64);
        assert_eq!(file.take_bytes_read(), 0);
        // The trailer broken: a file opened with the cache reads on, with
        // its streams' CRCs checked; one opened without it reads the trailer.
        let mut bytes = std::fs::read(&path).unwrap();
        let end = bytes.len();
        bytes[end - 1] ^= 1;
        bytes[3] ^= 1;
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        let cached = SpillFile::open_cached(&path, &cache).unwrap();
        assert_eq!(cached.read(2, 1, 1).unwrap()[0], batches[1]);
        assert!(matches!(
            cached.read(2, 0, 1),
            Err(SpillError::Corrupt { .. })
        ));
        assert!(matches!(
            cached.read(3, 0, 1),
            Err(SpillError::Truncated { .. })
        ));
        let fresh = SpillFile::open(&path).unwrap();
        assert!(matches!(
            fresh.read(2, 1, 1),
            Err(SpillError::Truncated { .. })
        ));
    }

    #[test]
    fn an_index_pointing_outside_the_file_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.arrows");
        write(&path, [[stream(&ints(0..10)).as_slice()]]).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let index = bytes.len() - TRAILER - ENTRY;
        bytes[index + 8..index + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        let crc = crc32fast::hash(&bytes[index..index + ENTRY]);
        let at = bytes.len() - TRAILER + 8;
        bytes[at..at + 4].copy_from_slice(&crc.to_le_bytes());
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        let file = SpillFile::open(&path).unwrap();
        assert!(matches!(
            file.read(1, 0, 1),
            Err(SpillError::Corrupt { .. })
        ));
    }
}
