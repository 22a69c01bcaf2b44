//! Splits read by other processes: the driver serves the ranks of a
//! [`streaming_split`](crate::Dataset::streaming_split) ([`SplitService`]),
//! and a trainer process opens its rank from a [`SplitHandle`] with its own
//! cluster certificate ([`RemoteSplit`]). Pieces reach it by shared memory
//! on the same host, else as Arrow IPC bytes over QUIC, both validated
//! before use; a peer without a certificate of the cluster is refused in
//! the handshake.
//!
//! ```no_run
//! # fn demo() -> streambatch::Result<()> {
//! use streambatch::{BatchOptions, Context, SplitHandle};
//! // The driver (its config names the cluster's TLS files):
//! let ctx = Context::from_config_file("configs/train.toml")?;
//! let images = ctx.read_images("images/", 224, 224)?;
//! let served = ctx.serve_splits(images.streaming_split(2, true)?)?;
//! let handle = served.handles()[0].to_string(); // hand it to trainer 0
//! // A trainer process:
//! let handle: SplitHandle = handle.parse()?;
//! let split = Context::connect("configs/cluster.toml")?.open_split(&handle)?;
//! for batch in split.iter_batches(0, BatchOptions::rows(64))? {
//!     let _batch = batch?;
//! }
//! # Ok(()) }
//! ```

mod flight;
mod handle;
mod holders;
mod open;
mod ranks;
mod serve;

pub use handle::SplitHandle;
pub use open::{PieceSources, RemoteEpoch, RemoteSplit};
pub use serve::SplitService;

use streambatch_core::NodeConfig;
use streambatch_net::{Locality, TlsFiles};
use streambatch_plan::{Error, Result};

/// Where a split's pieces are shared from: both sides on the same host
/// (boot id) with the same `/dev/shm` share them by name.
fn locality() -> Locality {
    Locality::here(std::path::Path::new("/dev/shm"))
}

/// The TLS files a config names, or an error saying which key is missing.
pub(crate) fn tls_files(config: &NodeConfig, what: &str) -> Result<TlsFiles> {
    let need = |key: &str, value: &Option<std::path::PathBuf>| {
        value.clone().ok_or_else(|| {
            Error::Invalid(format!(
                "{what} needs the cluster's TLS files: `{key}` is not set \
                 (`streambatch cluster init DIR` writes them)"
            ))
        })
    };
    Ok(TlsFiles {
        ca: need("tls_ca", &config.tls_ca)?,
        cert: need("tls_cert", &config.tls_cert)?,
        key: need("tls_key", &config.tls_key)?,
    })
}

/// A runtime of one worker thread for a split's connections.
fn runtime(what: &'static str) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sb-split")
        .enable_all()
        .build()
        .map_err(|e| Error::Start {
            what,
            source: e.into(),
        })
}
