//! The errors of streambatch-net. Each names what the user can act on: the
//! file, the address, the peer.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Why a network operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A TLS file is missing, unreadable, malformed or too open.
    #[error("TLS file {file}: {message}")]
    Tls {
        /// The file.
        file: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// Reading or writing a file failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The endpoint could not be set up (bad TLS settings, socket in use).
    #[error("setting up the QUIC endpoint: {0}")]
    Config(String),
    /// Binding the UDP socket failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// Connecting to a peer failed, including a refused handshake.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The peer's address.
        addr: SocketAddr,
        /// The cause.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A connection or stream broke.
    #[error("connection to {peer}: {source}")]
    Connection {
        /// The peer, by its node name or address.
        peer: String,
        /// The cause.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A frame from a peer was refused.
    #[error("from {peer}: {source}")]
    Frame {
        /// The peer.
        peer: String,
        /// What was wrong.
        source: FrameError,
    },
    /// The peer answered a fetch with an error.
    #[error("{peer} cannot serve partition {partition}: {message}")]
    Fetch {
        /// The peer.
        peer: String,
        /// The partition.
        partition: u64,
        /// The peer's reason.
        message: String,
    },
    /// The driver serving a split ended the trainer's epoch with an error.
    #[error("the split served by {peer}: {message}")]
    Split {
        /// The driver.
        peer: String,
        /// Its reason.
        message: String,
    },
}

/// Why bytes from the network were refused as a frame.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The length prefix exceeds the limit for this kind of frame.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    Oversized {
        /// The announced length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame ({got} of {expected} bytes)")]
    Truncated {
        /// Bytes read.
        got: u64,
        /// Bytes announced.
        expected: u64,
    },
    /// The peer kept its connection but did not send an announced body
    /// within its deadline.
    #[error("{got} of {expected} announced bytes arrived before their deadline")]
    Stalled {
        /// Bytes read.
        got: u64,
        /// Bytes announced.
        expected: u64,
    },
    /// The bytes are not a valid archive of the expected type.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// Reading the stream failed.
    #[error("reading a frame: {0}")]
    Io(#[from] std::io::Error),
}
