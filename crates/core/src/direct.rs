//! Files written with direct I/O (`O_DIRECT`): what a job writes once and
//! does not read back soon (spilled partitions, output files) goes to disk
//! without a copy into the page cache. That copy is not free: on a virtual
//! machine it cost 2 to 7 CPU-seconds per gigabyte written, against a
//! tenth of one direct, and it evicts the pages of the job's input files.
//!
//! Direct I/O needs block-aligned buffers, offsets and lengths: a
//! [`DirectWriter`] gathers bytes in an aligned buffer and writes it in
//! whole blocks, padding the last and cutting the file to its length when
//! it finishes. On a file system without direct I/O (tmpfs, some overlays)
//! the same writer writes through the page cache.
//!
//! ```
//! use std::io::Write;
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("out.bin");
//! let mut out = streambatch_core::DirectWriter::create_new(&path, 0o644).unwrap();
//! out.write_all(b"hello, ").unwrap();
//! out.write_all(b"disk").unwrap();
//! out.finish().unwrap();
//! assert_eq!(std::fs::read(&path).unwrap(), b"hello, disk");
//! ```

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, OnceLock};

use crate::Workers;

/// Alignment of direct I/O: of offsets, lengths and buffers.
pub const BLOCK: usize = 4096;
/// Bytes a [`DirectWriter`] gathers before each write.
const CHUNK: usize = 4 << 20;

/// A writer of a new file by direct I/O where the file system allows it.
/// Call [`DirectWriter::finish`] at the end: dropped without it, the file
/// may lack its last bytes (as with a `BufWriter` whose flush failed).
///
/// Whole chunks are written behind the caller, by the process's writer
/// threads, while the caller fills the next chunk: a direct write blocks
/// for as long as the disk takes, and a task that encodes its output as it
/// writes it would otherwise wait for each chunk in turn. A failed write
/// behind is the error of a later `write`, `flush` or `finish`, and every
/// call after an error fails.
pub struct DirectWriter {
    file: Arc<File>,
    buf: AlignedBlock,
    /// Bytes in `buf`, which starts at file offset `written`.
    filled: usize,
    /// Bytes at the start of `buf` already written, in whole blocks (by a
    /// flush).
    flushed: usize,
    /// Bytes written or handed to the writers behind, in whole chunks,
    /// before `buf`.
    written: u64,
    /// Chunks handed to the writers behind, and not yet back.
    behind: usize,
    /// Where the writers hand back this file's chunks, once written.
    emptied: (Sender<Written>, Receiver<Written>),
    /// A write failed: bytes already taken may be missing.
    failed: bool,
}

/// A chunk written behind, its block to fill again.
type Written = io::Result<AlignedBlock>;

/// A chunk for the writers behind: the file, the block and its offset,
/// and where to hand the block back.
type Chunk = (Arc<File>, AlignedBlock, u64, Sender<Written>);

/// Chunks a writer may have written behind it at once.
const CHUNKS_BEHIND: usize = 2;
/// The process's writer threads: enough for every core's task to have its
/// chunks out at once, at least four.
fn writers() -> &'static Workers<Chunk> {
    static WRITERS: OnceLock<Workers<Chunk>> = OnceLock::new();
    WRITERS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = (CHUNKS_BEHIND * cores).max(4);
        Workers::start(
            "streambatch-writer",
            threads,
            |(file, block, at, done): Chunk| {
                // Every chunk taken is answered, a panic included: its writer
                // waits for the answer.
                let write = || file.write_all_at(block.as_slice(), at);
                let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(write))
                    .unwrap_or_else(|_| Err(io::Error::other("a chunk's write panicked")))
                    .map(|()| block);
                // Let go of the file before answering: once its chunks are
                // back, its writer holds it alone.
                drop(file);
                let _ = done.send(written);
            },
        )
    })
}

impl DirectWriter {
    /// Creates the file at `path` with `mode` (before the umask): never
    /// over an existing file, never through a link at `path`.
    pub fn create_new(path: &Path, mode: u32) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(mode)
            .open(path)?;
        set_direct(&file);
        Ok(Self {
            file: Arc::new(file),
            buf: AlignedBlock::zeroed(CHUNK)?,
            filled: 0,
            flushed: 0,
            written: 0,
            behind: 0,
            emptied: std::sync::mpsc::channel(),
            failed: false,
        })
    }

    /// Bytes written so far.
    pub fn position(&self) -> u64 {
        self.written + self.filled as u64
    }

    /// Writes what is buffered (the last block padded, then the file cut to
    /// its length) and returns the file.
    pub fn finish(mut self) -> io::Result<File> {
        self.flush()?;
        self.file.set_len(self.position())?;
        let file = self.file.clone();
        drop(self);
        Ok(Arc::into_inner(file).expect("no chunk of the file is left behind"))
    }

    /// Fails when an earlier call did.
    fn check(&self) -> io::Result<()> {
        match self.failed {
            true => Err(io::Error::other("an earlier write of this file failed")),
            false => Ok(()),
        }
    }

    /// Notes that `result` failed, when it did.
    fn note<T>(&mut self, result: io::Result<T>) -> io::Result<T> {
        self.failed |= result.is_err();
        result
    }

    /// The next chunk written behind, its block back.
    fn next_written(&mut self) -> Written {
        self.behind -= 1;
        // Each chunk handed over comes back: a writer thread answers every
        // chunk it takes, and the sender lives in `self`.
        self.emptied.1.recv().expect("a writer answers")
    }

    /// Waits for every chunk written behind; the first error among them.
    fn settle(&mut self) -> io::Result<()> {
        let mut result = Ok(());
        while self.behind > 0 {
            if let Err(e) = self.next_written() {
                result = result.and(Err(e));
            }
        }
        result
    }

    /// Hands the full buffer to the writers behind and takes an empty one:
    /// a block they have written, once [`CHUNKS_BEHIND`] are out.
    fn write_behind(&mut self) -> io::Result<()> {
        let empty = match self.behind < CHUNKS_BEHIND {
            true => AlignedBlock::zeroed(CHUNK)?,
            false => self.next_written()?,
        };
        let full = std::mem::replace(&mut self.buf, empty);
        writers().send((
            self.file.clone(),
            full,
            self.written,
            self.emptied.0.clone(),
        ));
        self.behind += 1;
        Ok(())
    }

    /// Writes the buffer's bytes not yet written whole, the last block
    /// padded with zeros; they stay in the buffer.
    fn write_buffer(&mut self) -> io::Result<()> {
        let padded = self.filled.next_multiple_of(BLOCK);
        self.buf.as_mut_slice()[self.filled..padded].fill(0);
        let from = self.flushed;
        self.file.write_all_at(
            &self.buf.as_slice()[from..padded],
            self.written + from as u64,
        )?;
        self.flushed = self.filled - self.filled % BLOCK;
        Ok(())
    }
}

impl Drop for DirectWriter {
    /// Chunks still behind are waited for: their writes hold the file.
    fn drop(&mut self) {
        let _ = self.settle();
    }
}

impl Write for DirectWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.check()?;
        let n = (CHUNK - self.filled).min(bytes.len());
        self.buf.as_mut_slice()[self.filled..self.filled + n].copy_from_slice(&bytes[..n]);
        self.filled += n;
        if self.filled == CHUNK {
            // The bytes already flushed are written again: a chunk is
            // written whole.
            let handed = self.write_behind();
            self.note(handed)?;
            self.written += CHUNK as u64;
            self.filled = 0;
            self.flushed = 0;
        }
        Ok(n)
    }

    /// Waits for the chunks written behind, then writes the buffered bytes
    /// (the last block padded with zeros, which the next flush or `finish`
    /// writes again); they stay buffered, so that later writes keep to
    /// whole blocks.
    fn flush(&mut self) -> io::Result<()> {
        self.check()?;
        let settled = self.settle();
        self.note(settled)?;
        if self.filled > 0 {
            let written = self.write_buffer();
            self.note(written)?;
        }
        Ok(())
    }
}

/// A zeroed, block-aligned allocation: what direct I/O reads into and
/// writes from.
pub struct AlignedBlock {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the allocation is owned, and reached only through `&self` (to
// read) or `&mut self` (to write).
unsafe impl Send for AlignedBlock {}
// SAFETY: as above.
unsafe impl Sync for AlignedBlock {}
impl std::panic::RefUnwindSafe for AlignedBlock {}

impl AlignedBlock {
    fn layout(len: usize) -> io::Result<std::alloc::Layout> {
        std::alloc::Layout::from_size_align(len.max(BLOCK), BLOCK)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    }

    /// `len` zeroed bytes, aligned to [`BLOCK`].
    pub fn zeroed(len: usize) -> io::Result<Self> {
        let layout = Self::layout(len)?;
        // SAFETY: the layout's size is not zero.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(Self { ptr, len })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, to write into.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` initialised bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Fills it from `file` at `at` (a multiple of [`BLOCK`]), in whole
    /// blocks; returns the bytes read, fewer than its length only at the
    /// end of the file.
    pub fn read_from(&mut self, file: &File, at: u64) -> io::Result<usize> {
        let mut filled = 0;
        while filled < self.len {
            match file.read_at(&mut self.as_mut_slice()[filled..], at + filled as u64) {
                Ok(0) => break,
                Ok(n) => {
                    filled += n;
                    // A read short of a whole block ends at the end of the
                    // file; another would start unaligned.
                    if n % BLOCK != 0 {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(filled)
    }
}

impl Drop for AlignedBlock {
    fn drop(&mut self) {
        let layout = Self::layout(self.len).expect("made with this layout");
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

/// Opens `path` to read, by direct I/O where the file system allows it
/// (read with [`AlignedBlock::read_from`]), never through a link.
pub fn open_direct(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    set_direct(&file);
    Ok(file)
}

/// Turns direct I/O on for `file` where its file system allows it (else
/// the file goes through the page cache). Set after the open, not in it:
/// an `open` with `O_CREAT | O_DIRECT` makes the file before it refuses
/// the flag.
fn set_direct(file: &File) {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on an open descriptor this function borrows; it only
    // reads and sets the file's status flags.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_DIRECT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `len` bytes, each its place modulo a prime, so that a chunk written
    /// at the wrong place shows.
    fn numbered(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn writes_of_every_size_and_flushes_between_make_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = numbered(CHUNK * (CHUNKS_BEHIND + 3) + 12_345);
        for (n, piece) in [7, 4095, 4096, 100_000, CHUNK, CHUNK + 1]
            .into_iter()
            .enumerate()
        {
            let path = dir.path().join(format!("f{n}"));
            let mut out = DirectWriter::create_new(&path, 0o600).unwrap();
            for (i, chunk) in bytes.chunks(piece).enumerate() {
                out.write_all(chunk).unwrap();
                if i % 997 == 3 || (piece > BLOCK && i % 2 == 0) {
                    out.flush().unwrap();
                }
            }
            assert_eq!(out.position(), bytes.len() as u64);
            out.finish().unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "pieces of {piece}");
        }
    }

    #[test]
    fn chunks_written_behind_come_back_to_be_filled_again() {
        // No flush: more chunks than may be out at once, so blocks the
        // writers have written are filled again.
        let dir = tempfile::tempdir().unwrap();
        let bytes = numbered(CHUNK * (CHUNKS_BEHIND + 4) + 777);
        let path = dir.path().join("f");
        let mut out = DirectWriter::create_new(&path, 0o600).unwrap();
        for piece in bytes.chunks(65_536) {
            out.write_all(piece).unwrap();
        }
        out.finish().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
    }

    #[test]
    fn a_failed_write_behind_fails_every_later_call() {
        const CHILD: &str = "STREAMBATCH_DIRECT_WRITE_LIMIT_CHILD";
        let Some(dir) = std::env::var_os(CHILD) else {
            // The file size limit is the process's: the writes run in a
            // process of their own, this test alone.
            let dir = tempfile::tempdir().unwrap();
            let run = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "direct::tests::a_failed_write_behind_fails_every_later_call",
                ])
                .env(CHILD, dir.path())
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&run.stdout);
            assert!(run.status.success(), "{said}");
            assert!(said.contains("1 passed"), "the child ran the test: {said}");
            return;
        };
        // SAFETY: the signal is ignored and the limit lowered in this
        // process, which runs this test only.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let limit = libc::rlimit {
                rlim_cur: (CHUNK + CHUNK / 2) as libc::rlim_t,
                rlim_max: libc::RLIM_INFINITY,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0);
        }
        let path = Path::new(&dir).join("f");
        let mut out = DirectWriter::create_new(&path, 0o600).unwrap();
        let chunk = vec![1u8; CHUNK];
        // The second chunk is past the limit; its failure comes back once
        // its block is wanted again.
        let failed = (0..8).find(|_| out.write_all(&chunk).is_err());
        assert_eq!(failed, Some(CHUNKS_BEHIND + 1));
        assert!(out.write_all(b"x").is_err(), "a write after the error");
        assert!(out.flush().is_err(), "a flush after the error");
        assert!(out.finish().is_err(), "the finish");
    }

    #[test]
    fn an_existing_file_or_a_link_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        assert!(DirectWriter::create_new(&victim, 0o600).is_err());
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(DirectWriter::create_new(&link, 0o600).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }

    #[test]
    fn a_block_reads_a_file_back_to_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut out = DirectWriter::create_new(&path, 0o600).unwrap();
        out.write_all(&[7; 5000]).unwrap();
        out.finish().unwrap();
        let mut block = AlignedBlock::zeroed(3 * BLOCK).unwrap();
        let n = block.read_from(&open_direct(&path).unwrap(), 0).unwrap();
        assert_eq!(n, 5000);
        assert!(block.as_slice()[..5000].iter().all(|&b| b == 7));
    }
}
