//! Partitions as Arrow IPC streams: encoded with one copy of each buffer into
//! the destination, decoded zero-copy (the batch's buffers point into the
//! bytes given), and spill files with a CRC-32 trailer.

use std::io::Write;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::MetadataVersion;
use arrow_ipc::reader::StreamDecoder;
use arrow_ipc::writer::{IpcWriteOptions, StreamEncoder};
use arrow_schema::ArrowError;

use crate::alloc::ALIGN;

/// A batch encoded as IPC stream pieces: headers, padding and the batch's own
/// buffers (not copied yet).
pub struct Encoded {
    pieces: Vec<Buffer>,
    /// Total bytes.
    pub len: usize,
}

/// Encodes `batch` as an IPC stream (schema, batch, end), buffers aligned to 64.
pub fn encode(batch: &RecordBatch) -> Result<Encoded, ArrowError> {
    let options = IpcWriteOptions::try_new(ALIGN, false, MetadataVersion::V5)?;
    let mut encoder = StreamEncoder::try_new_with_options(&batch.schema(), options)?;
    let mut pieces = encoder.encode(batch)?;
    pieces.extend(encoder.finish()?);
    let len = pieces.iter().map(|p| p.len()).sum();
    Ok(Encoded { pieces, len })
}

impl Encoded {
    /// Copies the stream into `dst` (exactly `len` bytes).
    pub fn write_to(&self, dst: &mut [u8]) {
        let mut at = 0;
        for piece in &self.pieces {
            dst[at..at + piece.len()].copy_from_slice(piece.as_slice());
            at += piece.len();
        }
    }

    /// Writes the stream to a spill file.
    pub fn write_file(&self, path: &Path) -> std::io::Result<()> {
        let pieces: Vec<&[u8]> = self.pieces.iter().map(|p| p.as_slice()).collect();
        write_spill_file(path, &pieces)
    }
}

/// Writes stream bytes and a trailer (length, CRC-32, magic) to `path`.
pub fn write_spill_file(path: &Path, pieces: &[&[u8]]) -> std::io::Result<()> {
    let mut file = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
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

const MAGIC: &[u8; 8] = b"SBSPILL1";
const TRAILER: usize = 8 + 4 + 8;

fn trailer(len: usize, crc: u32) -> Vec<u8> {
    let mut t = Vec::with_capacity(TRAILER);
    t.extend_from_slice(&(len as u64).to_le_bytes());
    t.extend_from_slice(&crc.to_le_bytes());
    t.extend_from_slice(MAGIC);
    t
}

/// Decodes the IPC stream in `bytes`, whose owner keeps them alive: the
/// batch's buffers are slices of `bytes`. Validation is skipped: the bytes
/// were written by this store from a valid batch (and, from disk, checked
/// against their CRC).
pub fn decode(bytes: Buffer) -> Result<RecordBatch, ArrowError> {
    // SAFETY: see above; the data were valid Arrow when encoded.
    let mut decoder = unsafe {
        StreamDecoder::new()
            .with_require_alignment(true)
            .with_skip_validation(true)
    };
    let mut bytes = bytes;
    let batch = decoder
        .decode(&mut bytes)?
        .ok_or_else(|| ArrowError::IpcError("no batch in partition".into()))?;
    Ok(batch)
}

/// A read-only view of `len` bytes at `ptr`, kept alive by `owner`.
///
/// # Safety
/// `ptr..ptr + len` must stay valid and unchanged while `owner` lives.
pub unsafe fn view(
    ptr: NonNull<u8>,
    len: usize,
    owner: Arc<dyn arrow_buffer::alloc::Allocation>,
) -> Buffer {
    // SAFETY: guaranteed by the caller.
    unsafe { Buffer::from_custom_allocation(ptr, len, owner) }
}

/// Maps a spill file and checks its trailer and CRC; returns the stream bytes.
pub fn map_spill_file(path: &Path) -> Result<Buffer, String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("spill file {}: {e}", path.display()))?;
    // SAFETY: spill files are written once, before they are mapped, and
    // removed (never changed) when the partition is freed.
    let map = unsafe { memmap2::Mmap::map(&file) }
        .map_err(|e| format!("mapping spill file {}: {e}", path.display()))?;
    if map.len() < TRAILER || &map[map.len() - 8..] != MAGIC {
        return Err(format!(
            "spill file {} is truncated or not a spill file",
            path.display()
        ));
    }
    let body = map.len() - TRAILER;
    let len = u64::from_le_bytes(map[body..body + 8].try_into().expect("8 bytes")) as usize;
    let crc = u32::from_le_bytes(map[body + 8..body + 12].try_into().expect("4 bytes"));
    if len != body || crc32fast::hash(&map[..body]) != crc {
        return Err(format!(
            "spill file {} is corrupt (checksum mismatch)",
            path.display()
        ));
    }
    let map = Arc::new(map);
    let ptr = NonNull::new(map.as_ptr() as *mut u8).expect("a mapping is never at address 0");
    // SAFETY: the mapping lives as long as the buffer holds `map`.
    Ok(unsafe { view(ptr, body, map) })
}
