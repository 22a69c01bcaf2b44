//! The NodeAgent: one per node, the node's face to the rest of the cluster.
//! It is a remote actor (ractor_cluster): other nodes find it in the
//! process group `streambatch.node.<name>`, and the head's agent also in
//! `streambatch.head`. On the head it keeps the cluster's members: each
//! node says hello with its slots, and a node whose connection is lost is
//! removed (ractor_cluster's membership events).

use std::collections::BTreeMap;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use ractor_cluster::RactorClusterMessage;
use streambatch_net::frame;

use crate::wire::{Members, NodeInfo};

/// The process group of the head's agent.
pub(crate) const HEAD_GROUP: &str = "streambatch.head";

/// The process group of node `name`'s agent.
pub(crate) fn node_group(name: &str) -> String {
    format!("streambatch.node.{name}")
}

/// Messages of the NodeAgent. Payloads are rkyv archives (see `wire`).
#[derive(RactorClusterMessage)]
pub enum AgentMsg {
    /// A node introduces itself (a [`NodeInfo`]).
    Hello(Vec<u8>),
    /// The connection to the node of this name was lost.
    NodeDown(String),
    /// The cluster's members (a [`Members`]).
    #[rpc]
    GetMembers(RpcReplyPort<Vec<u8>>),
}

/// The NodeAgent actor.
pub(crate) struct NodeAgent;

/// What an agent is started with.
pub(crate) struct AgentArgs {
    /// This node.
    pub(crate) info: NodeInfo,
    /// Whether this node is the head.
    pub(crate) head: bool,
}

/// An agent's state.
pub(crate) struct AgentState {
    info: NodeInfo,
    /// On the head: the nodes that said hello, by name.
    members: BTreeMap<String, NodeInfo>,
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
        ractor::pg::join(node_group(&args.info.name), vec![myself.get_cell()]);
        if args.head {
            ractor::pg::join(HEAD_GROUP.into(), vec![myself.get_cell()]);
        }
        let mut members = BTreeMap::new();
        if args.head {
            members.insert(args.info.name.clone(), args.info.clone());
        }
        Ok(AgentState {
            info: args.info,
            members,
        })
    }

    async fn handle(
        &self,
        _: ActorRef<AgentMsg>,
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
            }
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
