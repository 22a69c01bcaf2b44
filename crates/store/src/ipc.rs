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
use arrow_ipc::reader::FileDecoder;
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

/// Decodes the IPC stream in `bytes` (a schema message, then one batch),
/// whose owner keeps them alive: the batch's buffers are slices of `bytes`,
/// and nothing reads the data (arrow-ipc 60's `StreamDecoder` ignores its
/// skip-validation flag, so the batch message goes to `FileDecoder`, which
/// honours it).
///
/// # Safety
/// `bytes` must hold a stream encoded by [`encode`] from a valid batch
/// (checked against its CRC when read from disk): its contents are trusted.
pub unsafe fn decode_trusted(bytes: &Buffer) -> Result<RecordBatch, ArrowError> {
    let (schema_meta, schema_message) = message_at(bytes, 0)?;
    let schema = schema_message
        .header_as_schema()
        .ok_or_else(|| ArrowError::IpcError("the partition does not start with a schema".into()))?;
    let schema = Arc::new(arrow_ipc::convert::try_fb_to_schema(schema)?);
    let batch_at = schema_meta + schema_message.bodyLength() as usize;
    let (batch_meta, batch_message) = message_at(bytes, batch_at)?;
    let block = arrow_ipc::Block::new(0, batch_meta as i32, batch_message.bodyLength());
    let decoder = FileDecoder::new(schema, MetadataVersion::V5).with_require_alignment(true);
    // SAFETY: the caller vouches for the bytes (see above).
    let decoder = unsafe { decoder.with_skip_validation(true) };
    decoder
        .read_record_batch(&block, &bytes.slice(batch_at))?
        .ok_or_else(|| ArrowError::IpcError("no batch in partition".into()))
}

/// The message at `at`: its framed length (continuation, size, flatbuffer)
/// and the parsed message.
fn message_at(bytes: &[u8], at: usize) -> Result<(usize, arrow_ipc::Message<'_>), ArrowError> {
    let short = || ArrowError::IpcError(format!("partition truncated at byte {at}"));
    let prefix = bytes.get(at..at + 8).ok_or_else(short)?;
    let len = i32::from_le_bytes(prefix[4..8].try_into().expect("4 bytes")) as usize;
    let meta = bytes.get(at + 8..at + 8 + len).ok_or_else(short)?;
    let message = arrow_ipc::root_as_message(meta)
        .map_err(|e| ArrowError::IpcError(format!("bad message header: {e}")))?;
    Ok((8 + len, message))
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
