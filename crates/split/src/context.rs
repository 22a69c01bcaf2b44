//! [`SplitContext`]: a [`Context`]'s methods for splits read by other
//! processes, serving and opening them with the TLS files of its config.

use streambatch::Context;
use streambatch_core::NodeConfig;
use streambatch_net::TlsFiles;
use streambatch_plan::{Error, Result, Split};

use crate::{RemoteSplit, SplitHandle, SplitService};

/// A [`Context`] serving splits to trainer processes and opening those
/// another process serves. Bring it into scope and call its methods on a
/// context as on any of its own:
///
/// ```no_run
/// # fn demo() -> streambatch::Result<()> {
/// use streambatch::Context;
/// use streambatch_split::SplitContext;
///
/// let ctx = Context::from_config_file("configs/train.toml")?;
/// let service = ctx.serve_splits(ctx.range(1_000, 8).streaming_split(2, false)?)?;
/// println!("{}", service.handles()[0]);
/// # Ok(()) }
/// ```
///
/// Implemented for [`Context`] only (sealed): [`SplitService::start`] and
/// [`RemoteSplit::open`] take the TLS files themselves.
pub trait SplitContext: sealed::Sealed {
    /// Serves the ranks of one
    /// [`streaming_split`](streambatch::Dataset::streaming_split) (all of
    /// them, in rank order) to trainer processes, which open them by
    /// handle ([`SplitContext::open_split`]). The service presents this
    /// context's certificate (`tls_cert` of its config) and listens on its
    /// `listen` address, on a port of its own; only holders of a
    /// certificate of the same cluster reach it.
    fn serve_splits(&self, splits: Vec<Split>) -> Result<SplitService>;

    /// Opens the rank of a split that `handle` names (served by a driver
    /// with [`SplitContext::serve_splits`]), with this context's
    /// certificate.
    fn open_split(&self, handle: &SplitHandle) -> Result<RemoteSplit>;
}

impl SplitContext for Context {
    fn serve_splits(&self, splits: Vec<Split>) -> Result<SplitService> {
        let tls = tls_files(self.config(), "serving splits")?;
        let listen = std::net::SocketAddr::new(self.config().listen.ip(), 0);
        SplitService::start(splits, &tls, listen)
    }

    fn open_split(&self, handle: &SplitHandle) -> Result<RemoteSplit> {
        let tls = tls_files(self.config(), "opening a split")?;
        RemoteSplit::open(&tls, handle)
    }
}

mod sealed {
    /// Keeps [`SplitContext`](super::SplitContext) to [`Context`](streambatch::Context).
    pub trait Sealed {}
    impl Sealed for streambatch::Context {}
}

/// The TLS files a config names, or an error saying which key is missing.
fn tls_files(config: &NodeConfig, what: &str) -> Result<TlsFiles> {
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
