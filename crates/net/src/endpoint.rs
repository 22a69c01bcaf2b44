//! A node's QUIC endpoint: it listens and connects on one UDP socket, with
//! mutual TLS. A connection to a peer carries several bidirectional streams,
//! each opened with one byte that says what it carries: the cluster's
//! control protocol (ractor_cluster) or one partition fetch.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::{RecvStream, SendStream, VarInt};

use crate::tls::{self, Identity};
use crate::{FrameError, NetError};

/// What a stream carries, written as its first byte by the side opening it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    /// ractor_cluster's node protocol: one stream per connection.
    Cluster,
    /// One partition fetch: a request frame, a reply frame, then its bytes.
    Fetch,
    /// Several partitions of one holder: a request frame, then a reply
    /// frame (and its bytes) for each, in the order asked.
    FetchMany,
    /// One rank's epoch of a streaming split served to another process
    /// (the `split` module).
    Split,
}

impl StreamKind {
    fn byte(self) -> u8 {
        match self {
            Self::Cluster => b'C',
            Self::Fetch => b'F',
            Self::FetchMany => b'M',
            Self::Split => b'S',
        }
    }

    fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            b'C' => Some(Self::Cluster),
            b'F' => Some(Self::Fetch),
            b'M' => Some(Self::FetchMany),
            b'S' => Some(Self::Split),
            _ => None,
        }
    }
}

/// Application error codes a node closes a connection with.
pub mod close_code {
    /// The endpoint is shutting down.
    pub const SHUTDOWN: u32 = 0;
    /// The peer broke the protocol (a bad frame or stream kind).
    pub const PROTOCOL: u32 = 1;
}

/// The idle timeout [`Endpoint::bind`] uses: a peer silent this long is lost.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(5);

/// Transport settings for every connection: keep-alives so that an idle
/// link stays up, an idle timeout (`peer_timeout`) so that a dead peer is
/// noticed within it, and windows large enough for a loopback link to run
/// at full speed.
pub fn transport(peer_timeout: Duration) -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    let millis = peer_timeout.as_millis().clamp(1, u32::MAX as u128) as u32;
    t.keep_alive_interval(Some((peer_timeout / 10).min(Duration::from_millis(500))));
    t.max_idle_timeout(Some(VarInt::from_u32(millis).into()));
    t.stream_receive_window(VarInt::from_u32(16 << 20));
    t.receive_window(VarInt::from_u32(64 << 20));
    t.send_window(64 << 20);
    t.max_concurrent_bidi_streams(VarInt::from_u32(1024));
    Arc::new(t)
}

/// A node's QUIC endpoint.
#[derive(Clone)]
pub struct Endpoint {
    quic: quinn::Endpoint,
    identity: Identity,
    peer_timeout: Duration,
}

impl Endpoint {
    /// Listens on `addr` (port 0 picks a free one) with `identity`. Must be
    /// called inside a tokio runtime.
    pub fn bind(addr: SocketAddr, identity: &Identity) -> Result<Self, NetError> {
        Self::bind_with_timeout(addr, identity, DEFAULT_PEER_TIMEOUT)
    }

    /// [`Endpoint::bind`], counting a peer lost once it was silent for
    /// `peer_timeout`.
    pub fn bind_with_timeout(
        addr: SocketAddr,
        identity: &Identity,
        peer_timeout: Duration,
    ) -> Result<Self, NetError> {
        crate::install_crypto();
        let mut server = identity.server_config()?;
        server.transport_config(transport(peer_timeout));
        let mut quic = quinn::Endpoint::server(server, addr)
            .map_err(|source| NetError::Bind { addr, source })?;
        quic.set_default_client_config(client_settings(identity.client_config()?, peer_timeout));
        Ok(Self {
            quic,
            identity: identity.clone(),
            peer_timeout,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.quic
            .local_addr()
            .expect("a bound endpoint has an address")
    }

    /// Its identity.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Connects to the node at `addr`; the handshake checks both sides'
    /// certificates.
    pub async fn connect(&self, addr: SocketAddr) -> Result<Peer, NetError> {
        let config = client_settings(self.identity.client_config()?, self.peer_timeout);
        self.connect_with(addr, config).await
    }

    /// Connects with other client settings (tests use it to try peers the
    /// cluster must refuse).
    #[doc(hidden)]
    pub async fn connect_with(
        &self,
        addr: SocketAddr,
        config: quinn::ClientConfig,
    ) -> Result<Peer, NetError> {
        let failed =
            |source: Box<dyn std::error::Error + Send + Sync>| NetError::Connect { addr, source };
        let connection = self
            .quic
            .connect_with(config, addr, tls::SERVER_NAME)
            .map_err(|e| failed(e.into()))?
            .await
            .map_err(|e| failed(e.into()))?;
        Peer::new(connection).ok_or_else(|| failed("the peer showed no node certificate".into()))
    }

    /// The next peer that connected and passed the handshake; `None` once
    /// the endpoint is closed. Failed handshakes (strangers) are logged and
    /// skipped: they never reach the caller.
    pub async fn accept(&self) -> Option<Peer> {
        loop {
            if let Some(peer) = handshake(self.incoming().await?).await {
                return Some(peer);
            }
        }
    }

    /// The next connection attempt, before its handshake; `None` once the
    /// endpoint is closed. A server finishes each with [`handshake`] on a
    /// task of its own, so that a slow or silent stranger holds up nobody.
    pub async fn incoming(&self) -> Option<quinn::Incoming> {
        self.quic.accept().await
    }

    /// Closes every connection and stops listening.
    pub fn close(&self) {
        self.quic
            .close(VarInt::from_u32(close_code::SHUTDOWN), b"node stopping");
    }
}

/// Completes a connection attempt: the peer, if it passed the handshake
/// with a node certificate of this cluster. Refusals are logged.
pub async fn handshake(incoming: quinn::Incoming) -> Option<Peer> {
    let remote = incoming.remote_address();
    match incoming.await {
        Ok(connection) => {
            let peer = Peer::new(connection);
            if peer.is_none() {
                tracing::warn!(%remote, "peer without a node certificate refused");
            }
            peer
        }
        Err(e) => {
            tracing::warn!(%remote, error = %e, "handshake refused");
            None
        }
    }
}

fn client_settings(mut config: quinn::ClientConfig, peer_timeout: Duration) -> quinn::ClientConfig {
    config.transport_config(transport(peer_timeout));
    config
}

/// How long a peer may take to send a new stream's kind byte: it is
/// written with the stream's opening, so only a broken peer takes longer.
pub const KIND_BYTE_WAIT: Duration = Duration::from_secs(10);

/// A connection to another node that passed the handshake, named by the
/// common name of its certificate.
#[derive(Clone, Debug)]
pub struct Peer {
    connection: quinn::Connection,
    name: String,
}

impl Peer {
    fn new(connection: quinn::Connection) -> Option<Self> {
        let name = tls::peer_name(&connection)?;
        Some(Self { connection, name })
    }

    /// The peer's node name (its certificate's common name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The peer's address.
    pub fn addr(&self) -> SocketAddr {
        self.connection.remote_address()
    }

    /// The QUIC connection.
    pub fn connection(&self) -> &quinn::Connection {
        &self.connection
    }

    /// Opens a stream of `kind`.
    pub async fn open(&self, kind: StreamKind) -> Result<(SendStream, RecvStream), NetError> {
        let (mut send, recv) = self
            .connection
            .open_bi()
            .await
            .map_err(|e| self.broken(e))?;
        send.write_all(&[kind.byte()])
            .await
            .map_err(|e| self.broken(e))?;
        Ok((send, recv))
    }

    /// The next stream the peer opens, with its kind; `None` once the
    /// connection is closed. A stream that ends before its kind byte, sends
    /// none within [`KIND_BYTE_WAIT`], or names an unknown kind closes the
    /// connection (the peer is broken or hostile): a peer must never be
    /// left with a connection no one serves.
    pub async fn accept(&self) -> Option<(StreamKind, SendStream, RecvStream)> {
        let (send, mut recv) = self.connection.accept_bi().await.ok()?;
        let mut byte = [0u8];
        let read = tokio::time::timeout(KIND_BYTE_WAIT, recv.read_exact(&mut byte)).await;
        let problem = match read {
            Ok(Ok(())) => match StreamKind::from_byte(byte[0]) {
                Some(kind) => return Some((kind, send, recv)),
                None => format!("unknown stream kind {:#04x}", byte[0]),
            },
            Ok(Err(e)) => format!("a stream without its kind byte: {e}"),
            Err(_) => format!("no stream kind byte within {KIND_BYTE_WAIT:?}"),
        };
        self.refuse(&FrameError::Malformed(problem));
        None
    }

    /// Closes this connection, and only this one, for a protocol violation.
    pub fn refuse(&self, error: &FrameError) {
        tracing::warn!(peer = %self.name, addr = %self.addr(), %error, "closing a connection that broke the protocol");
        let reason = error.to_string();
        self.connection.close(
            VarInt::from_u32(close_code::PROTOCOL),
            &reason.as_bytes()[..reason.len().min(200)],
        );
    }

    pub(crate) fn broken(&self, e: impl std::error::Error + Send + Sync + 'static) -> NetError {
        NetError::Connection {
            peer: self.name.clone(),
            source: Box::new(e),
        }
    }
}
