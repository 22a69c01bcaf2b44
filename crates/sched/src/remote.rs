//! The driver's side of a cluster job: the nodes it runs on, each reached
//! through its agent, and the port where they report.

use std::sync::{Arc, OnceLock};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use ractor_cluster::RactorClusterMessage;
use streambatch_core::Resources;
use streambatch_net::frame;

use crate::agent::AgentMsg;
use crate::msg::ExecutorMsg;
use crate::wire::{JobKey, JobOrder, NodeEvent, Order};

/// A cluster node as a job's executor sees it.
pub(crate) struct RemoteNode {
    /// Its name.
    pub(crate) name: String,
    /// Its agent.
    pub(crate) agent: ActorRef<AgentMsg>,
    /// Its slots.
    pub(crate) slots: Resources,
    /// Its store's capacity.
    pub(crate) capacity: u64,
}

impl RemoteNode {
    /// Sends the node an order of job `key`; an error when its agent is gone.
    pub(crate) fn order(&self, key: &JobKey, order: JobOrder) -> Result<(), ()> {
        let order = Order {
            key: key.clone(),
            order,
        };
        self.agent
            .cast(AgentMsg::Order(frame::encode(&order).to_vec()))
            .map_err(|_| ())
    }
}

/// Messages of a job's port.
#[derive(RactorClusterMessage)]
pub enum PortMsg {
    /// A node's event (a [`NodeEvent`]).
    Event(Vec<u8>),
}

/// A job's port on its driver: a remote actor, in the process group
/// `JobKey::port_group`, through which nodes report to the executor. It
/// exists before the job starts on the nodes (they look for it then), and
/// the executor after (it dispatches at once): the executor's reference is
/// set once it exists; no event comes before the first task.
pub(crate) struct JobPort;

/// The executor a port forwards to, once it exists.
pub(crate) type ExecutorCell = Arc<OnceLock<ActorRef<ExecutorMsg>>>;

impl Actor for JobPort {
    type Msg = PortMsg;
    type State = ExecutorCell;
    type Arguments = (JobKey, ExecutorCell);

    async fn pre_start(
        &self,
        myself: ActorRef<PortMsg>,
        (key, executor): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        ractor::pg::join(key.port_group(), vec![myself.get_cell()]);
        Ok(executor)
    }

    async fn handle(
        &self,
        myself: ActorRef<PortMsg>,
        PortMsg::Event(bytes): PortMsg,
        executor: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match frame::decode::<NodeEvent>(&bytes) {
            Ok(event) => {
                let Some(executor) = executor.get() else {
                    tracing::warn!(node = %event.node, "an event before the job started was dropped");
                    return Ok(());
                };
                if executor.cast(ExecutorMsg::Node(event)).is_err() {
                    myself.stop(None);
                }
            }
            Err(error) => tracing::warn!(%error, "a node event that is not valid was dropped"),
        }
        Ok(())
    }
}
