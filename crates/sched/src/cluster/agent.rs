//! The NodeAgent: one per node, the node's face to the rest of the cluster.
//! It is a remote actor (ractor_cluster): other nodes find it in the
//! process group `streambatch.node.<name>`, and the head's agent also in
//! `streambatch.head`. On the head it keeps the cluster's members: each
//! node says hello with its slots, and a node whose connection is lost is
//! removed (ractor_cluster's membership events).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use streambatch_core::JobId;
use streambatch_net::{Transport, frame};
use streambatch_plan::Registry;
use streambatch_store::{ObjectStore, SharedStore};

use crate::cluster::pull;
use crate::cluster::relay::{JobRelay, RelayArgs, RelayMsg};
use crate::cluster::serve::StoreServer;
use crate::exec::metrics::NodeMetrics;
use crate::exec::msg::NodeMsg;
use crate::wire::groups::{head_group, node_group, remote_member};
use crate::wire::msg::{AgentMsg, PortMsg};
use crate::wire::{
    Happened, JobKey, JobStart, Members, NodeEvent, NodeInfo, Order, Pulled, StoreView,
};

/// The reason a drained node's agent stops with: the node then stops
/// cleanly (not as a failure).
pub(crate) const DRAINED: &str = "drained";

/// The NodeAgent actor.
pub(crate) struct NodeAgent;

/// What an agent is started with.
pub(crate) struct AgentArgs {
    /// This node.
    pub(crate) info: NodeInfo,
    /// Whether this node is the head.
    pub(crate) head: bool,
    /// On a worker, the head's address: when the head is lost the worker
    /// keeps its slots and store and joins again once a head answers there.
    pub(crate) rejoin: Option<std::net::SocketAddr>,
    /// What the node runs jobs with.
    pub(crate) runs: JobResources,
}

/// What a node runs jobs' tasks with.
#[derive(Clone)]
pub(crate) struct JobResources {
    pub(crate) registry: Registry,
    pub(crate) store: SharedStore,
    pub(crate) server: Arc<StoreServer>,
    pub(crate) transport: Transport,
    /// The cluster's id (see `Identity::cluster_id`).
    pub(crate) cluster: String,
    pub(crate) manager: ActorRef<NodeMsg>,
    /// The node's metrics, which count each job's share here.
    pub(crate) metrics: Arc<NodeMetrics>,
}

/// An agent's state.
pub(crate) struct AgentState {
    info: NodeInfo,
    /// On the head: the nodes that said hello, by name.
    members: BTreeMap<String, NodeInfo>,
    runs: JobResources,
    /// The relays of the jobs running here.
    jobs: HashMap<JobKey, ActorRef<RelayMsg>>,
    next_job: u64,
    rejoin: Option<std::net::SocketAddr>,
    /// Draining: the node stops once its last relay has.
    draining: bool,
    /// The rejoining loop, while the head is away.
    rejoining: Option<tokio::task::JoinHandle<()>>,
}

impl Actor for NodeAgent {
    type Msg = AgentMsg;
    type State = AgentState;
    type Arguments = AgentArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<AgentMsg>,
        args: AgentArgs,
    ) -> Result<AgentState, ActorProcessingErr> {
        let cluster = args.runs.cluster.clone();
        ractor::pg::join(
            node_group(&cluster, &args.info.name),
            vec![myself.get_cell()],
        );
        if args.head {
            ractor::pg::join(head_group(&cluster), vec![myself.get_cell()]);
        }
        let mut members = BTreeMap::new();
        if args.head {
            members.insert(args.info.name.clone(), args.info.clone());
        }
        Ok(AgentState {
            info: args.info,
            members,
            runs: args.runs,
            jobs: HashMap::new(),
            next_job: 1,
            rejoin: args.rejoin,
            draining: false,
            rejoining: None,
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<AgentMsg>,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(task) = state.rejoining.take() {
            task.abort();
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<AgentMsg>,
        event: SupervisionEvent,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        // A relay that stopped (its job ended) or failed is forgotten. One
        // that failed is not started again (what it held is gone with it):
        // its driver hears that the job lost this node, and makes what the
        // node held again elsewhere, as for a node that died.
        let (cell, failure) = match event {
            SupervisionEvent::ActorTerminated(cell, ..) => (cell, None),
            SupervisionEvent::ActorFailed(cell, err) => (cell, Some(err.to_string())),
            _ => return Ok(()),
        };
        let key = state
            .jobs
            .iter()
            .find(|(_, relay)| relay.get_id() == cell.get_id())
            .map(|(key, _)| key.clone());
        if let Some(key) = key {
            state.jobs.remove(&key);
            if let Some(why) = failure {
                tracing::error!(job = key.job, %why, "a job's relay failed");
                state.report_relay_failed(&key, why);
            }
        }
        state.stop_if_drained(&myself);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<AgentMsg>,
        msg: AgentMsg,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AgentMsg::Hello(bytes) => match frame::decode::<NodeInfo>(&bytes) {
                Ok(info) => {
                    tracing::info!(node = %info.name, cpus = info.cpus, gpus = info.gpus, addr = %info.addr, "node joined");
                    state.members.insert(info.name.clone(), info);
                }
                Err(error) => {
                    tracing::warn!(%error, "a hello that is not a valid NodeInfo was dropped")
                }
            },
            AgentMsg::NodeDown(name) => {
                if state.members.remove(&name).is_some() {
                    tracing::warn!(node = %name, "node lost");
                }
                state.rejoin_if_headless();
                // The jobs of a driver that is gone end here too.
                for (_, relay) in state.jobs.iter().filter(|(k, _)| k.driver == name) {
                    relay.stop(None);
                }
            }
            AgentMsg::Drain => {
                tracing::info!(node = %state.info.name, jobs = state.jobs.len(), "draining");
                state.draining = true;
                // The head drops this node from its members at once, so
                // that no new job counts on it.
                if let Some(head) = remote_member::<AgentMsg>(&head_group(&state.runs.cluster)) {
                    let _ = head.cast(AgentMsg::NodeDown(state.info.name.clone()));
                }
                for relay in state.jobs.values() {
                    let _ = relay.cast(RelayMsg::Drain);
                }
                state.stop_if_drained(&myself);
            }
            AgentMsg::StartJob(bytes, reply) => {
                let answer = match state.start_job(&bytes, &myself).await {
                    Ok(()) => String::new(),
                    Err(why) => why,
                };
                let _ = reply.send(answer);
            }
            AgentMsg::Order(bytes) => match frame::decode::<Order>(&bytes) {
                Ok(Order { key, order }) => {
                    if let Some(relay) = state.jobs.get(&key) {
                        let _ = relay.cast(RelayMsg::Order(order));
                    }
                }
                Err(error) => tracing::warn!(%error, "an order that is not valid was dropped"),
            },
            AgentMsg::GetMembers(reply) => {
                // The head first, then the others by name.
                let head = state.members.get(&state.info.name).cloned();
                let nodes = head
                    .into_iter()
                    .chain(
                        state
                            .members
                            .values()
                            .filter(|n| n.name != state.info.name)
                            .cloned(),
                    )
                    .collect();
                let _ = reply.send(frame::encode(&Members { nodes }).to_vec());
            }
        }
        Ok(())
    }
}

impl AgentState {
    /// Tells job `key`'s driver that the job's relay here failed.
    fn report_relay_failed(&self, key: &JobKey, message: String) {
        let Some(port) = remote_member::<PortMsg>(&key.port_group()) else {
            return; // the driver is gone too
        };
        let event = NodeEvent {
            node: self.info.name.clone(),
            job: key.job,
            happened: Happened::RelayFailed { message },
            store: StoreView::default(),
            pulled: Pulled::default(),
        };
        let _ = port.cast(PortMsg::Event(frame::encode(&event).to_vec()));
    }

    /// A draining node with no job left stops (its root supervisor sees
    /// the agent stop and stops the node cleanly).
    fn stop_if_drained(&self, myself: &ActorRef<AgentMsg>) {
        if self.draining && self.jobs.is_empty() {
            tracing::info!(node = %self.info.name, "drained; stopping");
            myself.stop(Some(DRAINED.into()));
        }
    }

    /// On a worker whose head may be gone: unless a loop already runs,
    /// starts one that waits a second, and while the head's agent is not
    /// reachable joins the head's address again and says hello.
    fn rejoin_if_headless(&mut self) {
        let Some(head) = self.rejoin else {
            return;
        };
        if self.rejoining.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let transport = self.runs.transport.clone();
        let group = head_group(&self.runs.cluster);
        let hello = frame::encode(&self.info).to_vec();
        self.rejoining = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if remote_member::<AgentMsg>(&group).is_some() {
                    return;
                }
                let joined = tokio::time::timeout(Duration::from_secs(2), transport.join(head));
                if !matches!(joined.await, Ok(Ok(_))) {
                    continue;
                }
                for _ in 0..250 {
                    if let Some(agent) = remote_member::<AgentMsg>(&group) {
                        let _ = agent.cast(AgentMsg::Hello(hello));
                        tracing::info!(%head, "joined the head again");
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }

    /// Starts a job's relay here, or says why not (an operator this node's
    /// binary did not register, a payload that is not valid).
    async fn start_job(&mut self, bytes: &[u8], myself: &ActorRef<AgentMsg>) -> Result<(), String> {
        if self.draining {
            return Err(format!("node {} is draining", self.info.name));
        }
        let start = frame::decode::<JobStart>(bytes).map_err(|e| e.to_string())?;
        let registry = &self.runs.registry;
        let missing: Vec<String> = start
            .plan
            .recipe_names()
            .into_iter()
            .filter(|name| !registry.contains(name))
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "node {} has no operator named {} (its binary registered: {})",
                self.info.name,
                missing.join(", "),
                registry.names().join(", ")
            ));
        }
        // The blobs first (a model file the driver sends), held while the
        // operators that refer to them are rebuilt.
        let transport = &self.runs.transport;
        let blobs = pull::pull_blobs(transport, &start.key.driver, &start.plan.blobs())
            .await
            .map_err(|e| format!("node {}: {e}", self.info.name))?;
        let plan = start.plan.build(registry).map_err(|e| e.to_string())?;
        drop(blobs);
        if start.reserve.len() != plan.stages.len() {
            return Err(format!(
                "{} memory reserves for a plan of {} stages",
                start.reserve.len(),
                plan.stages.len()
            ));
        }
        for (name, addr) in &start.nodes {
            if let Ok(addr) = addr.parse() {
                self.runs.transport.learn(name, addr);
            }
        }
        let job = JobId(self.next_job);
        self.next_job += 1;
        let args = RelayArgs {
            key: start.key.clone(),
            job,
            plan: Arc::new(plan),
            target_bytes: start.target_bytes,
            reserve: start.reserve,
            node: self.info.name.clone(),
            store: Arc::new(self.runs.store.clone()) as Arc<dyn ObjectStore>,
            server: self.runs.server.clone(),
            transport: self.runs.transport.clone(),
            manager: self.runs.manager.clone(),
            metrics: self.runs.metrics.clone(),
        };
        let (relay, _) = Actor::spawn_linked(None, JobRelay, args, myself.get_cell())
            .await
            .map_err(|e| format!("starting the job on node {}: {e}", self.info.name))?;
        self.jobs.insert(start.key, relay);
        Ok(())
    }
}
