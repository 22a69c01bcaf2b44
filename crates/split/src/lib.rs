//! A [`streaming_split`](streambatch::Dataset::streaming_split)'s ranks
//! read by trainers in other processes: the driver serves them
//! ([`SplitService`]), and a trainer process opens its rank from a
//! [`SplitHandle`] with its own cluster certificate ([`RemoteSplit`]).
//! Pieces reach it by shared memory on the same host, else as Arrow IPC
//! bytes over QUIC, both validated before use; a peer without a
//! certificate of the cluster is refused in the handshake. The service also
//! serves each rank over Arrow Flight (gRPC), for trainers in any language
//! ([`SplitService::flight_addr`], [`SplitHandle::flight_ticket`]).
//!
//! A crate of its own so that programs embedding `streambatch` build no
//! gRPC. [`SplitContext`] adds `serve_splits` and `open_split` to
//! [`streambatch::Context`]: bring it into scope and call them on a
//! context.
//!
//! ```no_run
//! # fn demo() -> streambatch::Result<()> {
//! use streambatch::{BatchOptions, Context};
//! use streambatch_split::{SplitContext, SplitHandle};
//!
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

mod context;
mod flight;
mod handle;
mod holders;
mod open;
mod ranks;
mod serve;

pub use context::SplitContext;
pub use handle::SplitHandle;
pub use open::{PieceSources, RemoteEpoch, RemoteSplit};
pub use serve::SplitService;

use streambatch_net::Locality;
use streambatch_plan::{Error, Result};

// The README's examples compile as doc tests here, where every crate they
// use (the facade, and this one for a trainer's split) is at hand.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// Where a split's pieces are shared from: both sides on the same host
/// (boot id) with the same `/dev/shm` share them by name.
fn locality() -> Locality {
    Locality::here(std::path::Path::new("/dev/shm"))
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
