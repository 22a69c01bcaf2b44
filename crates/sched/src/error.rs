//! The errors of a cluster node's start and life. Each names the config key
//! and where its value came from, or the node concerned.

use std::net::SocketAddr;

use streambatch_net::NetError;

/// Why a cluster node (or a driver connecting to one) could not start or
/// stopped.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The configuration could not be loaded.
    #[error(transparent)]
    Config(#[from] streambatch_core::ConfigError),
    /// A key the cluster needs is not set.
    #[error("`{key}` is not set in {origin}: {hint}")]
    Missing {
        /// The key.
        key: &'static str,
        /// The file (or environment) that should set it.
        origin: String,
        /// What to do.
        hint: &'static str,
    },
    /// A TLS file named by a key cannot be used.
    #[error("`{key}` in {origin}: {source}")]
    Tls {
        /// The key naming the file.
        key: &'static str,
        /// The config file.
        origin: String,
        /// What is wrong with the file.
        source: NetError,
    },
    /// The node cannot listen on its address.
    #[error("`listen` in {origin}: {source}")]
    Listen {
        /// The config file.
        origin: String,
        /// The cause.
        source: NetError,
    },
    /// The head did not answer.
    #[error("cannot reach the head at {addr} (`head` in {origin}) within {waited_s} s: {source}")]
    HeadUnreachable {
        /// Its address.
        addr: SocketAddr,
        /// The config file.
        origin: String,
        /// How long this node tried.
        waited_s: u64,
        /// The last failure.
        source: NetError,
    },
    /// A part of the node could not start.
    #[error("cannot start {what}: {source}")]
    Start {
        /// What.
        what: &'static str,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A part of the running node stopped, which stops the node.
    #[error("the node stopped: {0}")]
    Stopped(String),
}
