//! The driver's side of a cluster job: the nodes it runs on, each reached
//! through its agent.

use ractor::ActorRef;
use streambatch_core::Resources;
use streambatch_net::{RowRange, Want, frame};

use crate::exec::partition::Slice;
use crate::wire::msg::AgentMsg;
use crate::wire::{JobKey, JobOrder, NodeInfo, Order, PartSpec};

/// A cluster node as a job's executor sees it.
pub(crate) struct RemoteNode {
    /// Its name.
    pub(crate) name: String,
    /// Where it listens.
    pub(crate) addr: String,
    /// Its agent.
    pub(crate) agent: ActorRef<AgentMsg>,
    /// Its slots.
    pub(crate) slots: Resources,
    /// Its store's capacity.
    pub(crate) capacity: u64,
}

impl RemoteNode {
    /// The member `info` of the cluster, reached through `agent`.
    pub(crate) fn new(info: NodeInfo, agent: ActorRef<AgentMsg>) -> Self {
        Self {
            slots: info.slots(),
            capacity: info.store_capacity,
            name: info.name,
            addr: info.addr,
            agent,
        }
    }

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

/// Where `slice`, held by a node of a cluster job, lies, for the node that
/// reads it: its rows, or its destination for the holder to find.
pub(super) fn part_spec(slice: &Slice) -> PartSpec {
    let part = slice
        .remote_part()
        .expect("a cluster job's partitions are on its nodes");
    let (offset, len) = (slice.offset as u64, slice.len as u64);
    let want = match slice.destination() {
        Some(d) => Want::Group(d),
        None => Want::Rows(RowRange { offset, len }),
    };
    PartSpec {
        holder: part.holder.clone(),
        id: part.id,
        want,
    }
}
