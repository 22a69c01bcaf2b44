//! What nodes tell each other inside actor messages: rkyv archives carried
//! as bytes and validated (bytecheck) by the receiver before use. A payload
//! that fails validation is dropped with a warning naming its sender.

use rkyv::{Archive, Deserialize, Serialize};
use streambatch_net::Locality;

/// A node introducing itself to the head: its slots, its store, and the
/// operators its binary registered.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct NodeInfo {
    /// Its name (its certificate's common name).
    pub name: String,
    /// Logical CPU slots.
    pub cpus: f64,
    /// Logical GPU slots.
    pub gpus: f64,
    /// Its store's capacity in bytes.
    pub store_capacity: u64,
    /// Where its store lives (for shared-memory hand-over).
    pub locality: Locality,
    /// The address it listens on.
    pub addr: String,
}

/// The members of a cluster, as the head knows them.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Members {
    /// Every node that said hello and has not gone, the head first.
    pub nodes: Vec<NodeInfo>,
}
