//! A cluster node process: its tokio runtime, store, QUIC endpoint with the
//! cluster's TLS identity, and the supervision tree under [`NodeRoot`]. A
//! node whose config names a `head` joins it; one without is the head.
//!
//! [`ClusterNode::start`] checks everything a node needs before it serves:
//! each failure names the config key and the file it came from.

pub(crate) mod agent;
mod pull;
pub(crate) mod relay;
pub(crate) mod root;
pub(crate) mod serve;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ractor::{Actor, ActorRef};
use streambatch_core::NodeConfig;
use streambatch_net::{Endpoint, Locality, NetError, frame};
use streambatch_plan::Registry;
use streambatch_store::{ObjectStore, SharedStore, StoreConfig};

use crate::cluster::root::{Children, NodeRoot, RootArgs, RootMsg};
use crate::error::ClusterError;
use crate::exec::metrics::{MetricsServer, NodeMetrics};
use crate::exec::worker::WorkerThreads;
use crate::wire::NodeInfo;
use crate::wire::groups::{head_group, remote_member};
use crate::wire::join::{load_identity, peer_timeout, runtime};
use crate::wire::msg::AgentMsg;

/// How long a node keeps trying to reach its head before it gives up.
const JOIN_WITHIN: Duration = Duration::from_secs(10);

/// A running cluster node.
pub struct ClusterNode {
    /// Declared first: it stops before the runtime it runs on.
    metrics_server: Option<MetricsServer>,
    runtime: tokio::runtime::Runtime,
    root: ActorRef<RootMsg>,
    children: Children,
    stopped: Arc<Mutex<Option<String>>>,
    done: tokio::sync::watch::Receiver<bool>,
}

impl ClusterNode {
    /// Starts the node `config` describes; `file` is where the config came
    /// from (named in errors). Returns once the node listens and, for a
    /// worker, has reached its head and said hello.
    pub fn start(
        config: &NodeConfig,
        file: Option<&Path>,
        registry: Registry,
    ) -> Result<Self, ClusterError> {
        let origin = |key| NodeConfig::origin_of(key, file);
        let identity = load_identity(config, file)?;
        let runtime = runtime("streambatch-node")?;
        let store_config = StoreConfig {
            namespace: config.name.clone(),
            strict_capacity: config.store_capacity_was_set(),
            ..StoreConfig::new(config.store_capacity, &config.spill_dir)
        };
        let store = SharedStore::open(store_config).map_err(|e| ClusterError::Start {
            what: "the store",
            source: e.into(),
        })?;
        let endpoint = runtime
            .block_on(async {
                Endpoint::bind_with_timeout(config.listen, &identity, peer_timeout(config))
            })
            .map_err(|source| ClusterError::Listen {
                origin: origin("listen"),
                source,
            })?;
        let info = NodeInfo {
            name: config.name.clone(),
            cpus: config.cpus,
            gpus: config.gpus.unwrap_or(0.0),
            store_capacity: config.store_capacity,
            locality: Locality::here(&config.spill_dir),
            addr: endpoint.local_addr().to_string(),
        };
        let stopped = Arc::new(Mutex::new(None));
        let shared: Arc<dyn ObjectStore> = Arc::new(store.clone());
        let metrics = NodeMetrics::new(shared, info.cpus, info.gpus);
        let metrics_server = match config.metrics_addr {
            Some(addr) => Some(
                MetricsServer::start(metrics.clone(), addr, runtime.handle()).map_err(|e| {
                    ClusterError::Start {
                        what: "the metrics endpoint",
                        source: format!("metrics_addr {addr} ({}): {e}", origin("metrics_addr"))
                            .into(),
                    }
                })?,
            ),
            None => None,
        };
        let args = RootArgs {
            info: info.clone(),
            head: config.head.is_none(),
            rejoin: config.head,
            endpoint,
            store,
            registry,
            cluster: identity.cluster_id().to_string(),
            threads: WorkerThreads::default(),
            stopped: stopped.clone(),
            metrics,
        };
        let (root, children, done) = runtime
            .block_on(async {
                let (root, handle) = Actor::spawn(None, NodeRoot, args).await?;
                let children = ractor::call!(root, RootMsg::Children)?;
                let (tx, done) = tokio::sync::watch::channel(false);
                tokio::spawn(async move {
                    let _ = handle.await;
                    let _ = tx.send(true);
                });
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>((root, children, done))
            })
            .map_err(|source| ClusterError::Start {
                what: "the node's actors",
                source,
            })?;
        let node = Self {
            metrics_server,
            runtime,
            root,
            children,
            stopped,
            done,
        };
        node.watch_members();
        if let Some(head) = config.head {
            node.join(head, &info, &origin("head"), identity.cluster_id())?;
        }
        Ok(node)
    }

    /// The address the node listens on.
    pub fn addr(&self) -> SocketAddr {
        self.children.transport.local_addr()
    }

    /// Where the node serves its metrics (with `metrics_addr` only).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_server.as_ref().map(MetricsServer::addr)
    }

    /// Waits until the node stops: a child failed, [`ClusterNode::stop`],
    /// or SIGTERM or SIGINT, on which it stops cleanly (its store removes
    /// its shared-memory segments and spill files). SIGUSR1 drains it: it
    /// takes no new work, finishes its tasks, keeps its partitions until
    /// their jobs have read them, then stops.
    pub fn wait(&self) -> Result<(), ClusterError> {
        let mut done = self.done.clone();
        self.runtime.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int), Ok(mut drain)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
                signal(SignalKind::user_defined1()),
            ) else {
                let _ = done.wait_for(|d| *d).await;
                return;
            };
            loop {
                tokio::select! {
                    _ = done.wait_for(|d| *d) => break,
                    _ = term.recv() => break self.root.stop(None),
                    _ = int.recv() => break self.root.stop(None),
                    _ = drain.recv() => {
                        let _ = self.children.agent.cast(AgentMsg::Drain);
                    }
                }
            }
        });
        match self
            .stopped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            Some(why) => Err(ClusterError::Stopped(why)),
            None => Ok(()),
        }
    }

    /// Stops the node.
    pub fn stop(&self) {
        self.root.stop(None);
    }

    /// Tells the agent when a peer's connection is lost (on the head: a
    /// member; on any node: a driver whose jobs end).
    fn watch_members(&self) {
        let agent = self.children.agent.clone();
        self.children.transport.on_peer_lost(move |peer: &str| {
            let _ = agent.cast(AgentMsg::NodeDown(peer.to_string()));
        });
    }

    /// Reaches the head (retrying while it starts) and says hello.
    fn join(
        &self,
        head: SocketAddr,
        info: &NodeInfo,
        origin: &str,
        cluster: &str,
    ) -> Result<(), ClusterError> {
        let transport = self.children.transport.clone();
        let started = Instant::now();
        let unreachable = |source| ClusterError::HeadUnreachable {
            addr: head,
            origin: origin.to_string(),
            waited_s: JOIN_WITHIN.as_secs(),
            source,
        };
        self.runtime.block_on(async {
            let mut last;
            loop {
                match tokio::time::timeout(JOIN_WITHIN, transport.join(head)).await {
                    Ok(Ok(_)) => break,
                    Ok(Err(e)) => last = e,
                    Err(_) => last = NetError::Config("no answer".into()),
                }
                if started.elapsed() >= JOIN_WITHIN {
                    return Err(unreachable(last));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            // The head's agent shows up once the actor session is ready.
            let agent = loop {
                if let Some(agent) = remote_member::<AgentMsg>(&head_group(cluster)) {
                    break agent;
                }
                if started.elapsed() >= JOIN_WITHIN {
                    let why = "the QUIC connection opened but the actor session did not";
                    return Err(unreachable(NetError::Config(why.into())));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            agent
                .cast(AgentMsg::Hello(frame::encode(info).to_vec()))
                .map_err(|e| unreachable(NetError::Config(e.to_string())))
        })
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        self.root.stop(None);
        let mut done = self.done.clone();
        let _ = self.runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(2), done.wait_for(|d| *d)).await
        });
    }
}
