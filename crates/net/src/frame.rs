//! Frames: a little-endian `u32` length, then an rkyv archive of that
//! length. Every archive is validated (bytecheck) before anything reads it,
//! and a length over the frame's limit is refused before a byte of the body
//! is buffered, so a peer cannot make a node allocate what it likes.

use rkyv::api::high::{HighDeserializer, HighSerializer, HighValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::rancor;
use rkyv::ser::allocator::ArenaHandle;
use rkyv::util::AlignedVec;
use rkyv::{Archive, Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::FrameError;

/// The limit for control frames (requests, replies, actor payloads).
pub const MAX_CONTROL_FRAME: u32 = 1 << 20;

/// Archives `value` (the frame's body, without its length).
pub fn encode<T>(value: &T) -> AlignedVec
where
    T: for<'a> Serialize<HighSerializer<AlignedVec, ArenaHandle<'a>, rancor::Error>>,
{
    // Serializing into memory fails only on allocation failure.
    rkyv::to_bytes::<rancor::Error>(value).expect("archiving into memory")
}

/// Validates and reads a frame's body. Any bytes at all may come in: they
/// give a value or an error, never a panic.
pub fn decode<T>(bytes: &[u8]) -> Result<T, FrameError>
where
    T: Archive,
    T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
        + Deserialize<T, HighDeserializer<rancor::Error>>,
{
    // Archives need their alignment; bytes off the wire have none.
    let mut aligned = AlignedVec::<16>::with_capacity(bytes.len());
    aligned.extend_from_slice(bytes);
    rkyv::from_bytes::<T, rancor::Error>(&aligned).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Writes one frame.
pub async fn write_frame<T, W>(out: &mut W, value: &T) -> std::io::Result<()>
where
    T: for<'a> Serialize<HighSerializer<AlignedVec, ArenaHandle<'a>, rancor::Error>>,
    W: AsyncWrite + Unpin,
{
    let body = encode(value);
    let len = u32::try_from(body.len()).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    out.write_all(&len.to_le_bytes()).await?;
    out.write_all(&body).await
}

/// Writes `bytes` that follow a frame announcing their length, a MiB at a
/// time: QUIC's flow control holds the writes back while the reader is
/// slow.
pub async fn write_bytes<W: AsyncWrite + Unpin>(out: &mut W, bytes: &[u8]) -> std::io::Result<()> {
    for chunk in bytes.chunks(1 << 20) {
        out.write_all(chunk).await?;
    }
    Ok(())
}

/// Reads one frame of at most `max` bytes. `Ok(None)` when the stream ended
/// cleanly before a frame began.
pub async fn read_frame<T, R>(input: &mut R, max: u32) -> Result<Option<T>, FrameError>
where
    T: Archive,
    T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
        + Deserialize<T, HighDeserializer<rancor::Error>>,
    R: AsyncRead + Unpin,
{
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match input.read(&mut len[got..]).await? {
            0 if got == 0 => return Ok(None),
            0 => {
                return Err(FrameError::Truncated {
                    got: got as u64,
                    expected: 4,
                });
            }
            n => got += n,
        }
    }
    let len = u32::from_le_bytes(len);
    if len > max {
        return Err(FrameError::Oversized {
            len: len.into(),
            max: max.into(),
        });
    }
    let mut body = vec![0u8; len as usize];
    let mut got = 0;
    while got < body.len() {
        match input.read(&mut body[got..]).await? {
            0 => {
                return Err(FrameError::Truncated {
                    got: got as u64,
                    expected: len.into(),
                });
            }
            n => got += n,
        }
    }
    decode(&body).map(Some)
}
