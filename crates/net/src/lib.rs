//! streambatch between nodes.
//!
//! - [`tls`]: a cluster's CA and node certificates ([`init_cluster`]) and
//!   mutual TLS 1.3: a peer without a certificate of the cluster is refused
//!   in the QUIC handshake, before any message is read.
//! - [`Endpoint`] and [`Peer`]: quinn connections whose bidirectional
//!   streams each say what they carry ([`StreamKind`]).
//! - [`Transport`]: ractor_cluster's node protocol over those streams
//!   (remote actors, process groups, membership events), and partition
//!   fetches on streams of their own ([`fetch`]).
//! - [`split`]: a rank of a streaming split read by another process.
//! - [`frame`]: length-prefixed rkyv archives, validated before use, with a
//!   size limit checked before anything is buffered.
//!
//! ```no_run
//! # async fn demo() -> Result<(), streambatch_net::NetError> {
//! use streambatch_net::{Endpoint, Identity, TlsFiles};
//! let identity = Identity::load(&TlsFiles::in_dir("tls".as_ref(), "worker-1"))?;
//! let endpoint = Endpoint::bind("127.0.0.1:0".parse().unwrap(), &identity)?;
//! let head = endpoint.connect("127.0.0.1:7400".parse().unwrap()).await?;
//! assert_eq!(head.name(), "head");
//! # Ok(()) }
//! ```

mod endpoint;
mod error;
pub mod fetch;
pub mod frame;
mod membership;
pub mod split;
pub mod tls;
mod transport;

use std::sync::Arc;

pub use endpoint::{
    DEFAULT_PEER_TIMEOUT, Endpoint, Peer, StreamKind, close_code, handshake, transport,
};
pub use error::{FrameError, NetError};
pub use fetch::{
    Fetched, FetchedPart, Locality, MappedLease, PartRows, PartitionServer, RowRange, Served, Want,
};
pub use membership::Sessions;
pub use tls::{Identity, TlsFiles, init_cluster};
pub use transport::Transport;

/// The crypto provider of every TLS session: ring.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes ring rustls's process-wide default. ractor_cluster's TLS pulls in a
/// second provider (aws-lc-rs), and rustls panics when code that asks for
/// the default finds two and none chosen. Idempotent.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
