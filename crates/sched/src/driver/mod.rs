//! A job's driver side: the `Executor` (one per job, a shell around the
//! job's state machine, running tasks on the local node or on cluster
//! nodes: `executor::local` and `executor::remote`), the `Supervisor` of a
//! driver's actors, the job's output, its `port` where cluster nodes
//! report, the embedded one-node cluster (`embedded`) and the connection to
//! a cluster (`client`).

pub(crate) mod client;
pub(crate) mod embedded;
pub(crate) mod executor;
pub(crate) mod msg;
pub(crate) mod output;
pub(crate) mod port;
pub(crate) mod supervise;
