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

    /// Sends the node an order of job `key`.
    pub(crate) fn order(&self, key: &JobKey, order: JobOrder) -> Result<(), OrderError> {
        let order = encode_order(key, order)?;
        let sent = self.agent.cast(AgentMsg::Order(order));
        sent.map_err(|_| OrderError::Gone)
    }
}

/// Room in a cluster frame for ractor_cluster's envelope around a payload.
pub(super) const ENVELOPE_BYTES: usize = 64 << 10;

/// The most bytes a payload of a cluster message may take: one over it
/// would close the session, and the node would look lost.
pub(super) const MAX_PAYLOAD_BYTES: usize = frame::MAX_CONTROL_FRAME as usize - ENVELOPE_BYTES;

/// Why an order did not go.
#[derive(Debug, PartialEq)]
pub(crate) enum OrderError {
    /// The node's agent is gone.
    Gone,
    /// It takes this many bytes, over [`MAX_PAYLOAD_BYTES`].
    TooLarge(usize),
}

impl OrderError {
    /// Why an order to node `node` did not go, as the job's error.
    pub(crate) fn why(&self, node: &str) -> streambatch_plan::Error {
        let message = match self {
            Self::Gone => format!("node {node} is gone"),
            // A task's input listing too many partitions (a reducer of an
            // exchange of as many map outputs): the job cannot go on.
            Self::TooLarge(bytes) => format!(
                "an order to node {node} takes {bytes} bytes, over the {MAX_PAYLOAD_BYTES} a \
                 cluster message carries: its task reads too many partitions (an exchange \
                 of this many map outputs; a larger target_partition_bytes makes fewer)"
            ),
        };
        streambatch_plan::Error::Invalid(message)
    }
}

/// Order `order` of job `key` as a cluster message carries it.
fn encode_order(key: &JobKey, order: JobOrder) -> Result<Vec<u8>, OrderError> {
    let order = Order {
        key: key.clone(),
        order,
    };
    let bytes = frame::encode(&order).to_vec();
    match bytes.len() {
        len if len > MAX_PAYLOAD_BYTES => Err(OrderError::TooLarge(len)),
        _ => Ok(bytes),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::InputSpec;

    /// A reducer's order naming `outputs` map outputs' destinations.
    fn reducer_order(outputs: u64) -> JobOrder {
        let part = |id| PartSpec {
            holder: "worker-1".into(),
            id,
            want: Want::Group(7),
        };
        JobOrder::Run {
            task: 1,
            stage: 2,
            input: InputSpec::Parts((0..outputs).map(part).collect()),
            keep_from: 0,
            keep_again: Vec::new(),
            may_spill: false,
            range: None,
            rows: Some(outputs),
        }
    }

    /// An order a cluster message cannot carry is refused with its size,
    /// not sent to close the session (the node would look lost).
    #[test]
    fn an_order_over_a_cluster_message_is_refused_with_its_size() {
        let key = JobKey {
            cluster: "c".into(),
            driver: "driver".into(),
            job: 1,
        };
        let fits = encode_order(&key, reducer_order(1_000)).unwrap();
        let per_output = fits.len() / 1_000;
        assert!(
            (24..=64).contains(&per_output),
            "{per_output} bytes an output"
        );
        match encode_order(&key, reducer_order(40_000)) {
            Err(too_large @ OrderError::TooLarge(len)) => {
                assert!(len > MAX_PAYLOAD_BYTES);
                let why = too_large.why("worker-1").to_string();
                assert!(
                    why.contains("worker-1") && why.contains(&len.to_string()),
                    "{why}"
                );
            }
            other => panic!("{:?}", other.map(|b| b.len())),
        }
    }
}
