//! Where nodes find each other's actors: ractor process groups, synced by
//! ractor_cluster to every connected node. Group names carry the cluster's
//! id (a hash of its CA), since a process's groups are global to it: one
//! process may drive jobs on two clusters.

use ractor::ActorRef;

/// The process group of the head's agent in cluster `cluster`.
pub(crate) fn head_group(cluster: &str) -> String {
    format!("streambatch.{cluster}.head")
}

/// The process group of node `name`'s agent in cluster `cluster`.
pub(crate) fn node_group(cluster: &str, name: &str) -> String {
    format!("streambatch.{cluster}.node.{name}")
}

/// A member of process group `group` on another node.
pub(crate) fn remote_member<M: ractor::Message>(group: &str) -> Option<ActorRef<M>> {
    ractor::pg::get_members(&group.to_string())
        .into_iter()
        .find(|cell| !cell.get_id().is_local())
        .map(ActorRef::from)
}
