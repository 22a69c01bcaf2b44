//! The messages that cross the wire between a cluster's processes: to a
//! node's agent (from its peers and drivers) and to a job's port (from the
//! job's nodes). Payloads are rkyv archives (see the parent module),
//! validated where they arrive.

use ractor::RpcReplyPort;
use ractor_cluster::RactorClusterMessage;

/// Messages of the NodeAgent. Payloads are rkyv archives (see the parent module).
#[derive(RactorClusterMessage)]
pub enum AgentMsg {
    /// A node introduces itself (a [`NodeInfo`](super::NodeInfo)).
    Hello(Vec<u8>),
    /// The connection to the node of this name was lost.
    NodeDown(String),
    /// The cluster's members (a [`Members`](super::Members)).
    #[rpc]
    GetMembers(RpcReplyPort<Vec<u8>>),
    /// A job starts on this node (a `JobStart`); the reply is empty when
    /// the node is ready, else why it refuses.
    #[rpc]
    StartJob(Vec<u8>, RpcReplyPort<String>),
    /// An order of a running job (an `Order`).
    Order(Vec<u8>),
    /// This node drains: no new jobs; each job's relay tells its driver and
    /// ends once nothing of the job is left here; then the node stops.
    Drain,
}

/// Messages of a job's port.
#[derive(RactorClusterMessage)]
pub enum PortMsg {
    /// A node's event (a [`NodeEvent`](super::NodeEvent)).
    Event(Vec<u8>),
}
