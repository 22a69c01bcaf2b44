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
use std::time::Duration;

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

/// The room made for a body before its bytes arrive: a partition of the
/// usual size (the default target) is read straight into its buffer; a
/// larger one grows as its bytes come, so an announced length alone cannot
/// make a node allocate more than this.
pub const ROOM_UP_FRONT: u64 = 64 << 20;

/// How long a whole body of `len` bytes may take to arrive: half a minute,
/// and a second more per 256 KiB (a floor far below a loopback's or a
/// datacenter link's share per stream, even with many reducers pulling
/// from one node). A peer that keeps its connection alive but trickles
/// fails the read rather than hang it; one that stops sending fails after
/// [`BODY_IDLE`].
pub fn body_within(len: u64) -> Duration {
    Duration::from_secs(30 + len / (256 << 10))
}

/// How long a body may go without a byte arriving.
pub const BODY_IDLE: Duration = Duration::from_secs(30);

/// Reads the `len` bytes a frame announced, within `within` in all and
/// with no gap longer than [`BODY_IDLE`]: room up to [`ROOM_UP_FRONT`] at
/// once, more only as bytes arrive.
pub async fn read_body<R: AsyncRead + Unpin>(
    input: &mut R,
    len: u64,
    within: Duration,
) -> Result<Vec<u8>, FrameError> {
    let mut body = Vec::with_capacity(len.min(ROOM_UP_FRONT) as usize);
    let idle = within.min(BODY_IDLE);
    let read = async {
        while (body.len() as u64) < len {
            let left = len - body.len() as u64;
            if body.capacity() == body.len() {
                body.reserve(left.min(body.len().max(1 << 20) as u64) as usize);
            }
            let room = (body.capacity() - body.len()).min(left as usize);
            let mut chunk = (&mut *input).take(room as u64);
            match tokio::time::timeout(idle, chunk.read_buf(&mut body)).await {
                Ok(Ok(0)) => {
                    return Err(FrameError::Truncated {
                        got: body.len() as u64,
                        expected: len,
                    });
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(FrameError::Io(e)),
                Err(_) => return Err(stalled(body.len(), len)),
            }
        }
        Ok(())
    };
    match tokio::time::timeout(within, read).await {
        Ok(read) => read.map(|()| body),
        Err(_) => Err(stalled(body.len(), len)),
    }
}

fn stalled(got: usize, expected: u64) -> FrameError {
    FrameError::Stalled {
        got: got as u64,
        expected,
    }
}

/// Fills `buf` with the body a frame announced, within `within` in all and
/// with no gap longer than [`BODY_IDLE`] (the caller made its room, at
/// most [`ROOM_UP_FRONT`]).
pub async fn read_body_into<R: AsyncRead + Unpin>(
    input: &mut R,
    buf: &mut [u8],
    within: Duration,
) -> Result<(), FrameError> {
    let expected = buf.len() as u64;
    let idle = within.min(BODY_IDLE);
    let mut got = 0;
    let read = async {
        while got < buf.len() {
            match tokio::time::timeout(idle, input.read(&mut buf[got..])).await {
                Ok(Ok(0)) => {
                    return Err(FrameError::Truncated {
                        got: got as u64,
                        expected,
                    });
                }
                Ok(Ok(n)) => got += n,
                Ok(Err(e)) => return Err(FrameError::Io(e)),
                Err(_) => return Err(stalled(got, expected)),
            }
        }
        Ok(())
    };
    match tokio::time::timeout(within, read).await {
        Ok(read) => read,
        Err(_) => Err(stalled(got, expected)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that announced a body, sent part of it and then went quiet
    /// with its stream open: the read ends at its deadline.
    #[tokio::test]
    async fn a_body_that_stops_coming_fails_at_its_deadline() {
        let (mut peer, mut us) = tokio::io::duplex(1 << 16);
        peer.write_all(&[7u8; 100]).await.unwrap();
        let within = Duration::from_millis(200);
        let err = read_body(&mut us, 1 << 40, within).await.unwrap_err();
        assert!(
            matches!(err, FrameError::Stalled { got: 100, expected, .. } if expected == 1 << 40),
            "{err}"
        );
        let mut buf = vec![0u8; 1000];
        peer.write_all(&[1u8; 10]).await.unwrap();
        let err = read_body_into(&mut us, &mut buf, within).await.unwrap_err();
        assert!(matches!(err, FrameError::Stalled { got: 10, .. }), "{err}");
        drop(peer);
    }

    /// An announced length makes no room beyond what arrives (past the
    /// first [`ROOM_UP_FRONT`]); a stream that ends early is torn, not
    /// padded.
    #[tokio::test]
    async fn room_grows_with_the_bytes_that_arrive() {
        let (mut peer, mut us) = tokio::io::duplex(1 << 20);
        let sent: Vec<u8> = (0..(3u32 << 20)).map(|i| i as u8).collect();
        let writer = {
            let sent = sent.clone();
            tokio::spawn(async move {
                peer.write_all(&sent).await.unwrap();
            })
        };
        let body = read_body(&mut us, sent.len() as u64, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(body, sent);
        writer.await.unwrap();
        // 3 MiB come of the 1 TiB announced: room for all of it up front
        // would abort the process here.
        let (mut peer, mut us) = tokio::io::duplex(1 << 20);
        let writer = tokio::spawn(async move {
            peer.write_all(&vec![0u8; 3 << 20]).await.unwrap();
        });
        let err = read_body(&mut us, 1 << 40, Duration::from_secs(10))
            .await
            .unwrap_err();
        writer.await.unwrap();
        assert!(
            matches!(err, FrameError::Truncated { got, .. } if got == 3 << 20),
            "{err}"
        );
    }
}
