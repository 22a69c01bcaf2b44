//! A driver's connection to a cluster: it joins the head as a peer with its
//! own certificate (but no slots) and asks the head's agent what it needs.

use std::path::Path;
use std::time::{Duration, Instant};

use ractor::ActorRef;
use streambatch_core::NodeConfig;
use streambatch_net::{Endpoint, Locality, NetError, PartitionServer, Served, Transport, frame};

use crate::ClusterError;
use crate::agent::{AgentMsg, HEAD_GROUP};
use crate::cluster::{load_identity, remote_member};
use crate::wire::Members;

/// How long a driver waits for the head.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

/// A driver connected to a cluster's head.
pub struct ClusterClient {
    runtime: tokio::runtime::Runtime,
    transport: Transport,
    head: ActorRef<AgentMsg>,
}

/// A driver holds no partitions of its own.
struct NoPartitions;

impl PartitionServer for NoPartitions {
    fn serve(&self, partition: u64, _: bool) -> Result<Served, String> {
        Err(format!("partition {partition}: a driver holds none"))
    }
}

impl ClusterClient {
    /// Connects to the head named by `config` (`head`, and the TLS keys);
    /// `file` is where the config came from, for errors.
    pub fn connect(config: &NodeConfig, file: Option<&Path>) -> Result<Self, ClusterError> {
        let origin = |key| NodeConfig::origin_of(key, file);
        let head = config.head.ok_or_else(|| ClusterError::Missing {
            key: "head",
            origin: origin("head"),
            hint: "a driver needs the head's address, as \"127.0.0.1:7400\"",
        })?;
        let identity = load_identity(config, file)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("streambatch-driver")
            .enable_all()
            .build()
            .map_err(|e| ClusterError::Start {
                what: "the runtime",
                source: e.into(),
            })?;
        let unreachable = |source| ClusterError::HeadUnreachable {
            addr: head,
            origin: origin("head"),
            waited_s: CONNECT_WITHIN.as_secs(),
            source,
        };
        let (transport, head) = runtime.block_on(async {
            let endpoint = Endpoint::bind(config.listen, &identity).map_err(|source| {
                ClusterError::Listen {
                    origin: origin("listen"),
                    source,
                }
            })?;
            let here = Locality::here(&config.spill_dir);
            let transport = Transport::start(
                &config.name,
                endpoint,
                std::sync::Arc::new(NoPartitions),
                here,
                None,
            )
            .await
            .map_err(|source| ClusterError::Start {
                what: "the transport",
                source: source.into(),
            })?;
            let started = Instant::now();
            match tokio::time::timeout(CONNECT_WITHIN, transport.join(head)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(unreachable(e)),
                Err(_) => return Err(unreachable(NetError::Config("no answer".into()))),
            }
            loop {
                if let Some(agent) = remote_member(HEAD_GROUP) {
                    return Ok((transport, agent));
                }
                if started.elapsed() >= CONNECT_WITHIN {
                    let why = "the QUIC connection opened but the actor session did not";
                    return Err(unreachable(NetError::Config(why.into())));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })?;
        Ok(Self {
            runtime,
            transport,
            head,
        })
    }

    /// The cluster's members, as the head knows them now.
    pub fn members(&self) -> Result<Members, ClusterError> {
        let head = self.head.clone();
        let bytes = self
            .runtime
            .block_on(async move { ractor::call_t!(head, AgentMsg::GetMembers, 5_000) })
            .map_err(|e| ClusterError::Stopped(format!("the head did not answer: {e}")))?;
        frame::decode(&bytes)
            .map_err(|e| ClusterError::Stopped(format!("the head's member list: {e}")))
    }
}

impl Drop for ClusterClient {
    fn drop(&mut self) {
        self.transport.stop();
    }
}
