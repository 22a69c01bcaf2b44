//! Partitions as Arrow IPC streams (schema, the dictionaries of any
//! dictionary-encoded columns, one batch): encoded with one copy of each
//! buffer into the destination, decoded zero-copy (the batch's buffers point into the
//! bytes given), either validated ([`decode`], for bytes from elsewhere) or
//! trusted ([`decode_trusted`], for bytes this process wrote).

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

/// Encodes `batch` as an IPC stream (schema, dictionaries, batch, end),
/// buffers aligned to 64.
pub fn encode(batch: &RecordBatch) -> Result<Encoded, ArrowError> {
    let options = IpcWriteOptions::try_new(ALIGN, false, MetadataVersion::V5)?;
    let mut encoder = StreamEncoder::try_new_with_options(&batch.schema(), options)?;
    let mut pieces = encoder.encode(batch)?;
    pieces.extend(encoder.finish()?);
    let len = pieces.iter().map(|p| p.len()).sum();
    Ok(Encoded { pieces, len })
}

/// `batch` as one IPC stream in a buffer of its own (what [`decode`]
/// reads back).
pub fn encode_to_buffer(batch: &RecordBatch) -> Result<Buffer, ArrowError> {
    let encoded = encode(batch)?;
    let mut bytes = arrow_buffer::MutableBuffer::from_len_zeroed(encoded.len);
    encoded.write_to(bytes.as_slice_mut());
    Ok(bytes.into())
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

    /// The stream's pieces, in order.
    pub fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        self.pieces.iter().map(|p| p.as_slice())
    }
}

/// Decodes the IPC stream in `bytes` (a schema message, the dictionaries of
/// its dictionary-encoded columns, then one batch) zero-copy, checking
/// everything: the framing, that every buffer lies inside its message's
/// body, and Arrow's full validation of the arrays (offsets, UTF-8,
/// dictionary keys...). For bytes another process wrote. Corrupt bytes give
/// an error, not a panic or an out-of-bounds read.
pub fn decode(bytes: &Buffer) -> Result<RecordBatch, ArrowError> {
    // arrow-data 60 still asserts on some malformed input instead of
    // returning an error (a typed buffer whose length is not a multiple of
    // its type's width): such a panic, raised before any read out of
    // bounds, becomes an error here. Nothing outlives the call but the
    // result, so no state is left half-updated.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read(bytes, false)))
        .map_err(|_| ArrowError::IpcError("arrow rejected the batch with a panic".into()))?
}

/// [`decode`] of bytes that may not be aligned as Arrow needs (read off
/// the wire): copied once into aligned memory first.
pub fn decode_unaligned(bytes: &[u8]) -> Result<RecordBatch, ArrowError> {
    let mut aligned = arrow_buffer::MutableBuffer::with_capacity(bytes.len());
    aligned.extend_from_slice(bytes);
    decode(&aligned.into())
}

/// Decodes the IPC stream in `bytes` as [`decode`] does, whose owner keeps
/// them alive: the batch's buffers are slices of `bytes`, and nothing reads
/// the data (arrow-ipc 60's `StreamDecoder` ignores its skip-validation
/// flag, so the messages go to `FileDecoder`, which honours it).
///
/// # Safety
/// `bytes` must hold a stream encoded by [`encode`] from a valid batch
/// (checked against its CRC when read from disk): its contents are trusted.
pub unsafe fn decode_trusted(bytes: &Buffer) -> Result<RecordBatch, ArrowError> {
    read(bytes, true)
}

/// Reads the schema, then dictionaries until the batch. Every length read
/// from the bytes is checked, so that corrupt framing is an error (never an
/// overflow or a slice out of range); unless `trusted`, so is every buffer
/// and every array. Each message takes at least 8 bytes, so the loop ends.
fn read(bytes: &Buffer, trusted: bool) -> Result<RecordBatch, ArrowError> {
    let (schema_meta, schema_message) = message_at(bytes, 0)?;
    let schema = schema_message
        .header_as_schema()
        .ok_or_else(|| ArrowError::IpcError("the partition does not start with a schema".into()))?;
    let schema = Arc::new(arrow_ipc::convert::try_fb_to_schema(schema)?);
    let mut at = usize::try_from(schema_message.bodyLength())
        .ok()
        .and_then(|body| schema_meta.checked_add(body))
        .filter(|&at| at <= bytes.len())
        .ok_or_else(|| ArrowError::IpcError("the schema message overruns the partition".into()))?;
    let mut decoder = FileDecoder::new(schema, MetadataVersion::V5).with_require_alignment(true);
    if trusted {
        // SAFETY: the caller of `decode_trusted` vouches for the bytes.
        decoder = unsafe { decoder.with_skip_validation(true) };
    }
    loop {
        let (block, message) = block_at(bytes, at)?;
        let body = bytes.slice(at);
        if let Some(dictionary) = message.header_as_dictionary_batch() {
            // `encode` writes whole dictionaries; a delta would also let
            // crafted bytes make each dictionary cost more than the last.
            if dictionary.isDelta() {
                return Err(ArrowError::IpcError(format!(
                    "a delta dictionary at byte {at}: partitions hold whole dictionaries"
                )));
            }
            if !trusted {
                check_buffers(bytes, at, &block, dictionary.data())?;
            }
            decoder.read_dictionary(&block, &body)?;
        } else if let Some(batch) = message.header_as_record_batch() {
            if !trusted {
                check_buffers(bytes, at, &block, Some(batch))?;
            }
            return decoder
                .read_record_batch(&block, &body)?
                .ok_or_else(|| ArrowError::IpcError("no batch in partition".into()));
        } else {
            return Err(ArrowError::IpcError(format!(
                "a message at byte {at} is neither a dictionary nor a batch"
            )));
        }
        at += block.metaDataLength() as usize + block.bodyLength() as usize;
    }
}

/// The message at `at` and its block, checked to lie inside `bytes`.
fn block_at(
    bytes: &[u8],
    at: usize,
) -> Result<(arrow_ipc::Block, arrow_ipc::Message<'_>), ArrowError> {
    let (meta_len, message) = message_at(bytes, at)?;
    let meta = i32::try_from(meta_len)
        .map_err(|_| ArrowError::IpcError(format!("the header at byte {at} is too large")))?;
    let body = message.bodyLength();
    let fits = usize::try_from(body)
        .ok()
        .and_then(|body| at.checked_add(meta_len)?.checked_add(body))
        .is_some_and(|end| end <= bytes.len());
    if !fits {
        return Err(ArrowError::IpcError(format!(
            "the message at byte {at} overruns the partition"
        )));
    }
    Ok((arrow_ipc::Block::new(0, meta, body), message))
}

/// Checks that every buffer of the batch (or dictionary) message at `at`
/// lies inside its body (arrow-ipc slices them unchecked, and would panic).
fn check_buffers(
    bytes: &[u8],
    at: usize,
    block: &arrow_ipc::Block,
    batch: Option<arrow_ipc::RecordBatch<'_>>,
) -> Result<(), ArrowError> {
    let batch = batch
        .ok_or_else(|| ArrowError::IpcError(format!("no batch in the message at byte {at}")))?;
    let body = block.bodyLength();
    // `block_at` checked that the body lies inside `bytes`.
    let body_at = at + block.metaDataLength() as usize;
    if !(bytes.as_ptr() as usize + body_at).is_multiple_of(ALIGN) {
        return Err(ArrowError::IpcError(format!(
            "the body at byte {body_at} is not aligned to {ALIGN} bytes"
        )));
    }
    let align = ALIGN as i64;
    for buffer in batch.buffers().into_iter().flatten() {
        let (offset, len) = (buffer.offset(), buffer.length());
        // Offsets as `encode` writes them, aligned to ALIGN.
        let inside = offset >= 0
            && len >= 0
            && offset % align == 0
            && offset.checked_add(len).is_some_and(|end| end <= body);
        if !inside {
            return Err(ArrowError::IpcError(format!(
                "a buffer at offset {offset} of length {len} is misaligned or outside the body of {body} bytes"
            )));
        }
    }
    Ok(())
}

/// The message at `at`: its framed length (continuation, size, flatbuffer)
/// and the parsed message.
fn message_at(bytes: &[u8], at: usize) -> Result<(usize, arrow_ipc::Message<'_>), ArrowError> {
    let short = || ArrowError::IpcError(format!("partition truncated at byte {at}"));
    let start = at.checked_add(8).ok_or_else(short)?;
    let prefix = bytes.get(at..start).ok_or_else(short)?;
    // The continuation marker: without it arrow-ipc would read the message
    // from another place than the one checked here.
    if prefix[..4] != [0xff; 4] {
        return Err(ArrowError::IpcError(format!("no message at byte {at}")));
    }
    let len = i32::from_le_bytes(prefix[4..8].try_into().expect("4 bytes"));
    let len = usize::try_from(len)
        .map_err(|_| ArrowError::IpcError(format!("negative message length {len} at byte {at}")))?;
    let end = start.checked_add(len).ok_or_else(short)?;
    let meta = bytes.get(start..end).ok_or_else(short)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, Int64Array, StringArray};

    fn encoded(batch: &RecordBatch) -> Vec<u8> {
        let e = encode(batch).unwrap();
        let mut bytes = vec![0; e.len];
        e.write_to(&mut bytes);
        bytes
    }

    /// 64-byte aligned bytes, as in a segment.
    fn aligned(bytes: &[u8]) -> Buffer {
        let mut buf = arrow_buffer::MutableBuffer::with_capacity(bytes.len());
        buf.extend_from_slice(bytes);
        buf.into()
    }

    fn batch() -> RecordBatch {
        RecordBatch::try_from_iter([
            (
                "n",
                Arc::new(Int64Array::from(vec![Some(1), None, Some(3)])) as ArrayRef,
            ),
            (
                "s",
                Arc::new(StringArray::from(vec!["a", "bcd", "ef"])) as ArrayRef,
            ),
        ])
        .unwrap()
    }

    #[test]
    fn decode_reads_what_encode_wrote() {
        let batch = batch();
        assert_eq!(decode(&aligned(&encoded(&batch))).unwrap(), batch);
    }

    fn dictionary_batch() -> RecordBatch {
        let colours: arrow_array::DictionaryArray<arrow_array::types::Int32Type> =
            vec![Some("red"), None, Some("blue"), Some("red")]
                .into_iter()
                .collect();
        RecordBatch::try_from_iter([("colour", Arc::new(colours) as ArrayRef)]).unwrap()
    }

    #[test]
    fn dictionary_columns_decode_validated_and_trusted() {
        let batch = dictionary_batch();
        let bytes = aligned(&encoded(&batch));
        assert_eq!(decode(&bytes).unwrap(), batch);
        // SAFETY: `encode` wrote the bytes from a valid batch.
        assert_eq!(unsafe { decode_trusted(&bytes) }.unwrap(), batch);
    }

    #[test]
    fn decode_of_any_single_corrupt_byte_is_an_error_or_a_valid_batch() {
        // Every byte position, a few ways: never a panic, and whatever
        // decodes passed Arrow's validation.
        for bytes in [encoded(&batch()), encoded(&dictionary_batch())] {
            for at in 0..bytes.len() {
                for flip in [0x01, 0x80, 0xff] {
                    let mut corrupt = bytes.clone();
                    corrupt[at] ^= flip;
                    let result = std::panic::catch_unwind(|| decode(&aligned(&corrupt)));
                    let Ok(result) = result else {
                        panic!("decode panicked with byte {at} ^ {flip:#x}");
                    };
                    if let Ok(batch) = result {
                        for column in batch.columns() {
                            column.to_data().validate_full().unwrap();
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn decode_of_lengths_that_overflow_is_an_error() {
        let bytes = encoded(&batch());
        // The schema message's length, then the batch message's body length.
        let mut corrupt = bytes.clone();
        corrupt[4..8].copy_from_slice(&(-8i32).to_le_bytes());
        assert!(decode(&aligned(&corrupt)).is_err());
        let mut corrupt = bytes.clone();
        corrupt[4..8].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(decode(&aligned(&corrupt)).is_err());
        assert!(decode(&aligned(&bytes[..bytes.len() / 2])).is_err());
        assert!(decode(&aligned(&[])).is_err());
    }
}
