//! What a process needs to take part in a cluster, as a node or as a
//! driver: its TLS identity from its config, its peers' timeout, its
//! runtime.

use std::path::Path;
use std::time::Duration;

use streambatch_core::NodeConfig;
use streambatch_net::{Identity, NetError, TlsFiles};

use crate::error::ClusterError;

/// The tokio runtime of a node or driver process, its threads named `name`.
pub(crate) fn runtime(name: &str) -> Result<tokio::runtime::Runtime, ClusterError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|e| ClusterError::Start {
            what: "the runtime",
            source: e.into(),
        })
}

/// Loads the node's TLS identity from the three keys, naming the key and
/// the file on any failure.
pub(crate) fn load_identity(
    config: &NodeConfig,
    file: Option<&Path>,
) -> Result<Identity, ClusterError> {
    const HINT: &str = "a cluster node needs `tls_ca`, `tls_cert` and `tls_key`; \
                        `streambatch cluster init DIR` writes them";
    let need = |key: &'static str, value: &Option<std::path::PathBuf>| {
        value.clone().ok_or_else(|| ClusterError::Missing {
            key,
            origin: NodeConfig::origin_of(key, file),
            hint: HINT,
        })
    };
    let files = TlsFiles {
        ca: need("tls_ca", &config.tls_ca)?,
        cert: need("tls_cert", &config.tls_cert)?,
        key: need("tls_key", &config.tls_key)?,
    };
    Identity::load(&files).map_err(|source| {
        let key = match &source {
            NetError::Tls { file: f, .. } if *f == files.ca => "tls_ca",
            NetError::Tls { file: f, .. } if *f == files.key => "tls_key",
            _ => "tls_cert",
        };
        ClusterError::Tls {
            key,
            origin: NodeConfig::origin_of(key, file),
            source,
        }
    })
}

/// How long a peer may be silent before it is lost (`node_timeout_ms`).
pub(crate) fn peer_timeout(config: &NodeConfig) -> Duration {
    Duration::from_millis(config.node_timeout_ms.into())
}
