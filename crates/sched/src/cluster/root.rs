//! A cluster node's root supervisor. It starts, linked under itself, the
//! node's NodeManager (which supervises the workers), its transport's
//! NodeServer (ractor_cluster) and its NodeAgent (which supervises the jobs'
//! relays). A child that fails is not started again in place: it stops the
//! node with the child named. Those children are the node's membership and
//! its tasks' home, and a driver re-makes what a lost node held from lineage
//! once it sees the node leave, which a restart in place could not tell it
//! to do. A process supervisor (systemd's `Restart=on-failure`) brings the
//! node back, and it joins the head again as a new member.

use std::sync::{Arc, Mutex};

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use streambatch_core::NodeId;
use streambatch_net::{Endpoint, Transport};
use streambatch_plan::Registry;
use streambatch_store::SharedStore;

use crate::cluster::agent::{AgentArgs, JobResources, NodeAgent};
use crate::cluster::serve::StoreServer;
use crate::exec::metrics::NodeMetrics;
use crate::exec::msg::NodeMsg;
use crate::exec::node::{NodeArgs, NodeManager};
use crate::exec::worker::WorkerThreads;
use crate::wire::NodeInfo;
use crate::wire::msg::AgentMsg;

/// The root actor.
pub(crate) struct NodeRoot;

/// What the root starts its children with.
pub(crate) struct RootArgs {
    pub(crate) info: NodeInfo,
    pub(crate) head: bool,
    /// On a worker, the head's address (see `AgentArgs::rejoin`).
    pub(crate) rejoin: Option<std::net::SocketAddr>,
    pub(crate) endpoint: Endpoint,
    pub(crate) store: SharedStore,
    pub(crate) registry: Registry,
    /// The cluster's id.
    pub(crate) cluster: String,
    pub(crate) threads: WorkerThreads,
    /// Set to why the node stopped, when a child failed.
    pub(crate) stopped: Arc<Mutex<Option<String>>>,
    pub(crate) metrics: Arc<NodeMetrics>,
}

/// The children, as the node's handle sees them.
#[derive(Clone)]
pub(crate) struct Children {
    pub(crate) manager: ActorRef<NodeMsg>,
    pub(crate) agent: ActorRef<AgentMsg>,
    pub(crate) transport: Transport,
}

/// The root's state.
pub(crate) struct RootState {
    children: Children,
    stopped: Arc<Mutex<Option<String>>>,
}

/// Messages of the root.
pub(crate) enum RootMsg {
    /// Its children.
    Children(ractor::RpcReplyPort<Children>),
}

impl ractor::Message for RootMsg {}

impl Actor for NodeRoot {
    type Msg = RootMsg;
    type State = RootState;
    type Arguments = RootArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<RootMsg>,
        args: RootArgs,
    ) -> Result<RootState, ActorProcessingErr> {
        let cell = myself.get_cell();
        let node_args = NodeArgs {
            id: NodeId(0),
            threads: args.threads,
            capacity: args.info.slots(),
            busy: args.metrics.busy_slots(),
        };
        let (manager, _) = Actor::spawn_linked(None, NodeManager, node_args, cell.clone()).await?;
        let server = Arc::new(StoreServer::new(args.store.clone()));
        let transport = Transport::start(
            &args.info.name,
            args.endpoint,
            server.clone(),
            args.info.locality.clone(),
            Some(cell.clone()),
        )
        .await?;
        let agent_args = AgentArgs {
            info: args.info,
            head: args.head,
            rejoin: args.rejoin,
            runs: JobResources {
                registry: args.registry,
                store: args.store,
                server,
                transport: transport.clone(),
                cluster: args.cluster,
                manager: manager.clone(),
                metrics: args.metrics,
            },
        };
        let (agent, _) = Actor::spawn_linked(None, NodeAgent, agent_args, cell).await?;
        Ok(RootState {
            children: Children {
                manager,
                agent,
                transport,
            },
            stopped: args.stopped,
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<RootMsg>,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        state.children.transport.stop();
        state.children.manager.stop(None);
        state.children.agent.stop(None);
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<RootMsg>,
        msg: RootMsg,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RootMsg::Children(reply) => {
                let _ = reply.send(state.children.clone());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<RootMsg>,
        event: SupervisionEvent,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, reason) = match event {
            SupervisionEvent::ActorFailed(cell, err) => (cell, err.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.unwrap_or_else(|| "stopped".into()))
            }
            _ => return Ok(()),
        };
        let children = &state.children;
        let child = if cell.get_id() == children.manager.get_id() {
            "node manager"
        } else if cell.get_id() == children.agent.get_id() {
            "node agent"
        } else if cell.get_id() == children.transport.node_server().get_id() {
            "transport (NodeServer)"
        } else {
            return Ok(());
        };
        if cell.get_id() == children.agent.get_id() && reason == crate::cluster::agent::DRAINED {
            tracing::info!("drained: stopping the node");
            myself.stop(None);
            return Ok(());
        }
        let why = format!("its {child} stopped: {reason}");
        tracing::error!(%why, "stopping the node");
        *state.stopped.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        myself.stop(None);
        Ok(())
    }
}
