//! A node's transport: its QUIC endpoint, the ractor_cluster `NodeServer`
//! that speaks the cluster's actor protocol over it, and the partitions it
//! serves to peers.
//!
//! Each connection between two nodes carries one [`StreamKind::Cluster`]
//! stream, opened by the node that dialled and handed to both sides'
//! NodeServers (`client_connect_external` on the dialling side,
//! `ConnectionOpenedExternal` on the other), and any number of
//! [`StreamKind::Fetch`] and [`StreamKind::FetchMany`] streams, opened by
//! either side.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use quinn::{RecvStream, SendStream};
use ractor::{Actor, ActorRef};
use ractor_cluster::node::NodeServerSessionInformation;
use ractor_cluster::{
    BoxRead, BoxWrite, ClusterBidiStream, IncomingEncryptionMode, NodeServer, NodeServerMessage,
};

use crate::NetError;
use crate::endpoint::{Endpoint, Peer, StreamKind, handshake};
use crate::fetch::{self, Fetched, Locality, PartitionServer};
use crate::frame::MAX_CONTROL_FRAME;
use crate::membership::Sessions;

/// A quinn stream pair as ractor_cluster's byte stream.
struct QuicBidi {
    send: SendStream,
    recv: RecvStream,
    peer: String,
}

impl ClusterBidiStream for QuicBidi {
    fn split(self: Box<Self>) -> (BoxRead, BoxWrite) {
        (Box::new(self.recv), Box::new(self.send))
    }

    fn peer_label(&self) -> Option<String> {
        Some(self.peer.clone())
    }
}

/// Told a peer's name when its last actor session ends.
type LossListener = Arc<dyn Fn(&str) + Send + Sync>;

/// A node's transport. Cloning shares it.
#[derive(Clone)]
pub struct Transport {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    endpoint: Endpoint,
    node_server: ActorRef<NodeServerMessage>,
    partitions: Arc<dyn PartitionServer>,
    here: Locality,
    peers: Mutex<HashMap<String, Peer>>,
    /// Peers whose last actor session ended, until one opens again.
    lost: Mutex<std::collections::HashSet<String>>,
    /// Told the name of each peer whose last actor session ends.
    on_lost: Mutex<Vec<LossListener>>,
    /// Where nodes listen, by name: a fetch from a node with no connection
    /// yet connects there.
    addresses: Mutex<HashMap<String, SocketAddr>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Transport {
    /// Starts node `name`'s transport on `endpoint`: spawns its NodeServer
    /// (linked to `supervisor` when given) and accepts peers. `here` says
    /// where its store lives; `partitions` serves its partitions to peers.
    pub async fn start(
        name: &str,
        endpoint: Endpoint,
        partitions: Arc<dyn PartitionServer>,
        here: Locality,
        supervisor: Option<ractor::ActorCell>,
    ) -> Result<Self, NetError> {
        // Mutual TLS authenticates peers on QUIC. ractor_cluster also
        // listens on loopback TCP (it cannot be turned off): that listener
        // demands the same certificates, so a local process without the
        // cluster's key material is refused in the TLS handshake, before
        // any session, cookie or election. The cookie, then, is no secret;
        // it keeps two clusters' sessions apart.
        let acceptor = endpoint.identity().tcp_acceptor()?;
        let cookie = format!("streambatch-{}", endpoint.identity().cluster_id());
        let server = NodeServer::new(
            0,
            cookie,
            name.to_string(),
            endpoint.local_addr().to_string(),
            Some(IncomingEncryptionMode::Tls(acceptor)),
            None,
        )
        .with_listen_addr(std::net::Ipv4Addr::LOCALHOST.into())
        .with_max_inbound_frame_size(MAX_CONTROL_FRAME.into());
        let spawned = match supervisor {
            Some(sup) => Actor::spawn_linked(None, server, (), sup).await,
            None => Actor::spawn(None, server, ()).await,
        };
        let (node_server, _) = spawned.map_err(|e| NetError::Config(format!("NodeServer: {e}")))?;
        let transport = Self {
            inner: Arc::new(Inner {
                name: name.to_string(),
                endpoint,
                node_server,
                partitions,
                here,
                peers: Mutex::new(HashMap::new()),
                lost: Mutex::default(),
                on_lost: Mutex::new(Vec::new()),
                addresses: Mutex::new(HashMap::new()),
                tasks: Mutex::new(Vec::new()),
            }),
        };
        // Subscribed before any peer is accepted, so that every session is
        // counted from its opening (see `on_peer_lost`).
        let check = SessionCheck {
            inner: Arc::downgrade(&transport.inner),
            sessions: Mutex::default(),
        };
        let subscribe = NodeServerMessage::SubscribeToEvents {
            id: "streambatch.session-check".into(),
            subscription: Box::new(check),
        };
        transport
            .inner
            .node_server
            .cast(subscribe)
            .map_err(|e| NetError::Config(format!("NodeServer: {e}")))?;
        let accepting = transport.clone();
        let task = tokio::spawn(async move {
            while let Some(incoming) = accepting.inner.endpoint.incoming().await {
                let attaching = accepting.clone();
                tokio::spawn(async move {
                    if let Some(peer) = handshake(incoming).await {
                        attaching.attach(peer);
                    }
                });
            }
        });
        transport.inner.tasks().push(task);
        Ok(transport)
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.endpoint.local_addr()
    }

    /// Calls `on_lost` with a peer's name each time its last actor session
    /// ends: a peer is lost then, not when a duplicate session or an
    /// election's loser is torn down. Sessions are counted from the
    /// transport's start, so a listener added late is told right about
    /// sessions opened before it. It runs inside the NodeServer: it must
    /// not block (send a message).
    pub fn on_peer_lost(&self, on_lost: impl Fn(&str) + Send + Sync + 'static) {
        let mut listeners = self.inner.on_lost.lock().unwrap_or_else(|p| p.into_inner());
        listeners.push(Arc::new(on_lost));
    }

    /// Whether node `name`'s last actor session ended (and none opened
    /// since): a fetch from it would only wait to fail.
    pub fn is_lost(&self, name: &str) -> bool {
        (self.inner.lost.lock().unwrap_or_else(|p| p.into_inner())).contains(name)
    }

    /// The NodeServer, for subscribing to membership events.
    pub fn node_server(&self) -> &ActorRef<NodeServerMessage> {
        &self.inner.node_server
    }

    /// Where this node runs.
    pub fn locality(&self) -> &Locality {
        &self.inner.here
    }

    /// Connects to the node at `addr` and joins its cluster session.
    /// Returns once the QUIC handshake passed; the actor session
    /// authenticates right after (watch the NodeServer's events).
    pub async fn join(&self, addr: SocketAddr) -> Result<Peer, NetError> {
        let peer = self.inner.endpoint.connect(addr).await?;
        // Known before its session authenticates (see `SessionCheck`).
        self.inner.remember(&peer);
        let (send, recv) = peer.open(StreamKind::Cluster).await?;
        let stream = QuicBidi {
            send,
            recv,
            peer: peer.name().to_string(),
        };
        ractor_cluster::client_connect_external(&self.inner.node_server, Box::new(stream))
            .await
            .map_err(|e| peer.broken(std::io::Error::other(format!("{e:?}"))))?;
        self.attach(peer.clone());
        Ok(peer)
    }

    /// The connected peer named `name`.
    pub fn peer(&self, name: &str) -> Option<Peer> {
        self.inner
            .peers()
            .get(name)
            .filter(|p| p.connection().close_reason().is_none())
            .cloned()
    }

    /// Notes where node `name` listens, for fetches from it.
    pub fn learn(&self, name: &str, addr: SocketAddr) {
        self.inner
            .addresses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), addr);
    }

    /// Pulls `partition` from node `holder`, connecting to it first (for
    /// data only, no actor session) when there is no connection yet.
    pub async fn fetch(&self, holder: &str, partition: u64) -> Result<Fetched, NetError> {
        self.fetch_rows(holder, partition, None).await
    }

    /// [`Transport::fetch`] of rows `rows` of `partition`: the holder may
    /// send those rows alone ([`Fetched::Rows`]) or the whole partition.
    pub async fn fetch_rows(
        &self,
        holder: &str,
        partition: u64,
        rows: Option<fetch::RowRange>,
    ) -> Result<Fetched, NetError> {
        let peer = match self.peer(holder) {
            Some(peer) => peer,
            None => self.connect_data(holder).await?,
        };
        fetch::fetch(&peer, partition, rows, &self.inner.here).await
    }

    /// Pulls `parts` of node `holder` on one stream (see
    /// [`fetch::fetch_many`]), connecting first as [`Transport::fetch`]
    /// does.
    pub async fn fetch_many(
        &self,
        holder: &str,
        parts: &[fetch::PartRows],
    ) -> Result<Vec<fetch::FetchedPart>, NetError> {
        let peer = match self.peer(holder) {
            Some(peer) => peer,
            None => self.connect_data(holder).await?,
        };
        fetch::fetch_many(&peer, parts, &self.inner.here).await
    }

    async fn connect_data(&self, name: &str) -> Result<Peer, NetError> {
        let unknown = || NetError::Connection {
            peer: name.to_string(),
            source: "no connection to this node, and its address is unknown".into(),
        };
        let addr = *self
            .inner
            .addresses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .ok_or_else(unknown)?;
        let peer = self.inner.endpoint.connect(addr).await?;
        if peer.name() != name {
            return Err(NetError::Connection {
                peer: name.to_string(),
                source: format!("{addr} is node {}, not {name}", peer.name()).into(),
            });
        }
        self.inner.remember(&peer);
        self.attach(peer.clone());
        Ok(peer)
    }

    /// Stops accepting, closes every connection and the NodeServer.
    pub fn stop(&self) {
        self.inner.endpoint.close();
        self.inner.node_server.stop(None);
        for task in self.inner.tasks().drain(..) {
            task.abort();
        }
    }

    /// Serves the streams `peer` opens, for as long as its connection lives.
    /// A peer that dialled this node is known by its name only once it
    /// opens an actor session: a process of the cluster that only fetches
    /// (a trainer) never stands in for a node of the same name.
    fn attach(&self, peer: Peer) {
        let inner = self.inner.clone();
        let task = tokio::spawn(async move {
            while let Some((kind, send, recv)) = peer.accept().await {
                match kind {
                    StreamKind::Cluster => {
                        inner.remember(&peer);
                        let stream = QuicBidi {
                            send,
                            recv,
                            peer: peer.name().to_string(),
                        };
                        let msg = NodeServerMessage::ConnectionOpenedExternal {
                            stream: Box::new(stream),
                            is_server: true,
                        };
                        if inner.node_server.cast(msg).is_err() {
                            return;
                        }
                    }
                    StreamKind::Fetch => {
                        let (peer, inner) = (peer.clone(), inner.clone());
                        tokio::spawn(async move {
                            let server = &inner.partitions;
                            fetch::serve_fetch(&peer, send, recv, server, &inner.here).await;
                        });
                    }
                    StreamKind::FetchMany => {
                        let (peer, inner) = (peer.clone(), inner.clone());
                        tokio::spawn(async move {
                            let server = &inner.partitions;
                            fetch::serve_fetch_many(&peer, send, recv, server, &inner.here).await;
                        });
                    }
                    // A node serves no split (a driver does): the stream
                    // ends, the connection stays.
                    StreamKind::Split => {
                        let (mut send, mut recv) = (send, recv);
                        let _ = recv.stop(quinn::VarInt::from_u32(0));
                        let _ = send.reset(quinn::VarInt::from_u32(0));
                    }
                }
            }
        });
        self.inner.tasks().push(task);
    }
}

/// Stops an actor session whose peer is not who its certificate says. The
/// name a peer declares in ractor_cluster's handshake must be the name in
/// its certificate, on a QUIC connection of this transport. A session over
/// ractor_cluster's loopback TCP listener (which only a holder of a cluster
/// certificate can open) is not one this transport made, and is stopped as
/// soon as it authenticates.
struct SessionCheck {
    inner: std::sync::Weak<Inner>,
    /// Live sessions per peer, for `Transport::on_peer_lost`.
    sessions: Mutex<Sessions>,
}

impl SessionCheck {
    fn sessions(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ractor_cluster::NodeEventSubscription for SessionCheck {
    fn node_session_opened(&self, session: NodeServerSessionInformation) {
        self.sessions().opened(&session.peer_addr);
        if let Some(inner) = self.inner.upgrade() {
            let mut lost = inner.lost.lock().unwrap_or_else(|p| p.into_inner());
            lost.remove(&session.peer_addr);
        }
    }

    fn node_session_disconnected(&self, session: NodeServerSessionInformation) {
        if !self.sessions().closed(&session.peer_addr) {
            return;
        }
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        (inner.lost.lock().unwrap_or_else(|p| p.into_inner())).insert(session.peer_addr.clone());
        let listeners = inner
            .on_lost
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for on_lost in listeners {
            on_lost(&session.peer_addr);
        }
    }

    fn node_session_authenticated(&self, session: NodeServerSessionInformation) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        // A session's label is its certificate's name (see `QuicBidi`).
        let certified = &session.peer_addr;
        let known = inner.peers().contains_key(certified);
        // ractor_cluster declares `name@host`.
        let declared = session.peer_name.as_ref().map(|n| n.name.as_str());
        let name = declared.and_then(|d| d.split('@').next());
        if !known || name != Some(certified.as_str()) {
            tracing::warn!(
                declared = declared.unwrap_or("-"),
                certificate = %certified,
                "an actor session whose name is not its certificate's was stopped"
            );
            session
                .actor
                .stop(Some(format!("not node {certified} by its certificate")));
        }
    }
}

impl Inner {
    fn peers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Peer>> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn remember(&self, peer: &Peer) {
        self.peers().insert(peer.name().to_string(), peer.clone());
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, Vec<tokio::task::JoinHandle<()>>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }
}
