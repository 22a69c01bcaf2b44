//! The trainer's side: [`RemoteSplit`] connects to the driver serving a
//! [`SplitHandle`] with the trainer's own certificate, and each
//! [`RemoteEpoch`] reads one epoch of the rank, piece by piece, from the
//! driver or from the cluster node holding it (by shared memory on the
//! same host, else as Arrow IPC bytes, validated either way).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow_array::RecordBatch;
use streambatch_net::split::{BatchReporter, Piece, SplitReader, StreamWriter, open_split};
use streambatch_net::{Endpoint, Identity, Locality, Peer, TlsFiles};
use streambatch_plan::{BatchIter, BatchOptions, Error, Result};
use streambatch_store::{ipc, open_shared_keeping};

use crate::holders::{Came, Holders};
use crate::{SplitHandle, locality, runtime};

/// One rank of a split served by another process, read here: see
/// [`SplitContext::open_split`](crate::SplitContext::open_split). Its epochs are read
/// as those of an in-process [`Split`](streambatch::Split) are.
pub struct RemoteSplit {
    handle: SplitHandle,
    peer: Peer,
    here: Locality,
    endpoint: Endpoint,
    /// The nodes this trainer fetches pieces from, as `here`'s host.
    holders: Arc<Holders>,
    sources: Arc<Sources>,
    runtime: Arc<tokio::runtime::Runtime>,
    /// The epochs' stream writers: those whose streams are no longer in
    /// use are waited for (briefly) when dropped, so that the last batch
    /// counts reach the driver.
    writers: std::sync::Mutex<Vec<StreamWriter>>,
}

/// How long a dropped [`RemoteSplit`] waits for its streams' last frames.
const FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Drop for RemoteSplit {
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            return; // no blocking inside a runtime: the counts may go
        }
        let writers = std::mem::take(&mut *self.writers.lock().unwrap_or_else(|p| p.into_inner()));
        // A stream whose epoch or batches are still held is not finishing:
        // waiting for it would only stall this drop.
        let finishing = writers.into_iter().filter(StreamWriter::is_finishing);
        let all = futures::future::join_all(finishing.map(StreamWriter::finished));
        let _ = self
            .runtime
            .block_on(async { tokio::time::timeout(FLUSH_WAIT, all).await });
    }
}

impl RemoteSplit {
    /// Connects to the driver serving `handle`, as the holder of `tls`'s
    /// certificate (of the same cluster).
    pub fn open(tls: &TlsFiles, handle: &SplitHandle) -> Result<Self> {
        keep_freed_memory_in_one_heap();
        let failed = |message: String| Error::RemoteSplit {
            handle: handle.to_string(),
            message,
        };
        let identity = Identity::load(tls).map_err(|e| failed(e.to_string()))?;
        let runtime = Arc::new(runtime("a split's connection")?);
        let any_port = match handle.addr {
            std::net::SocketAddr::V4(_) => "0.0.0.0:0",
            std::net::SocketAddr::V6(_) => "[::]:0",
        };
        let (endpoint, peer) = runtime
            .block_on(async {
                let endpoint = Endpoint::bind(any_port.parse().expect("an address"), &identity)?;
                let peer = endpoint.connect(handle.addr).await?;
                Ok::<_, streambatch_net::NetError>((endpoint, peer))
            })
            .map_err(|e| failed(e.to_string()))?;
        if peer.name() != handle.server {
            return Err(failed(format!(
                "the peer at {} is `{}`, not the driver `{}`",
                handle.addr,
                peer.name(),
                handle.server
            )));
        }
        Ok(Self {
            handle: handle.clone(),
            peer,
            here: locality(),
            holders: Arc::new(Holders::new(endpoint.clone(), locality().host)),
            endpoint,
            sources: Arc::default(),
            runtime,
            writers: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Asks for every piece as bytes over the network, even on the
    /// driver's or a node's host (a trainer in a container with a
    /// `/dev/shm` of its own, on the same kernel, cannot map theirs).
    pub fn without_shared_memory(mut self) -> Self {
        self.here.host = format!("{}-apart-{}", self.here.host, std::process::id());
        self.holders = Arc::new(Holders::new(self.endpoint.clone(), self.here.host.clone()));
        self
    }

    /// This split's rank.
    pub fn rank(&self) -> usize {
        self.handle.rank
    }

    /// Where the pieces this trainer got so far came from: the driver, or
    /// the nodes holding them (fetched by this trainer itself).
    pub fn piece_sources(&self) -> PieceSources {
        let read = |count: &AtomicUsize| count.load(Ordering::Relaxed);
        PieceSources {
            driver: read(&self.sources.driver),
            node_memory: read(&self.sources.node_memory),
            node_bytes: read(&self.sources.node_bytes),
            unfetched: read(&self.sources.unfetched),
        }
    }

    /// This rank's partitions of epoch `epoch`: asking for it counts at
    /// the driver's epoch barrier now. Each partition counts as a batch
    /// in the driver's stats.
    pub fn epoch(&self, epoch: usize) -> Result<RemoteEpoch> {
        let mut stream = self.open_epoch(epoch)?;
        stream.counting = stream.reader.as_ref().map(SplitReader::batch_reporter);
        Ok(stream)
    }

    fn open_epoch(&self, epoch: usize) -> Result<RemoteEpoch> {
        let mut reader = self
            .runtime
            .block_on(open_split(
                &self.peer,
                self.handle.service,
                self.handle.rank as u32,
                epoch as u64,
                &self.here,
            ))
            .map_err(|e| self.error(e.to_string()))?;
        if let Some(writer) = reader.take_writer() {
            let mut writers = self.writers.lock().unwrap_or_else(|p| p.into_inner());
            writers.retain(|w| !w.is_finished());
            writers.push(writer);
        }
        Ok(RemoteEpoch {
            handle: self.handle.to_string(),
            reader: Some(reader),
            holders: self.holders.clone(),
            sources: self.sources.clone(),
            runtime: self.runtime.clone(),
            counting: None,
        })
    }

    /// This rank's batches of epoch `epoch`, cut as `options` says. The
    /// driver's stats count them ([`RankStats::batches`](streambatch_plan::RankStats::batches)).
    pub fn iter_batches(&self, epoch: usize, options: BatchOptions) -> Result<BatchIter> {
        let epoch = self.open_epoch(epoch)?;
        let mut reporter = epoch.reader.as_ref().map(SplitReader::batch_reporter);
        Ok(streambatch_plan::counted(options.cut(epoch)?, move || {
            if let Some(reporter) = &mut reporter {
                reporter.batch();
            }
        }))
    }

    fn error(&self, message: String) -> Error {
        Error::RemoteSplit {
            handle: self.handle.to_string(),
            message,
        }
    }
}

/// One rank's partitions of one epoch, from the driver. Dropped before its
/// end, the rank leaves the epoch.
pub struct RemoteEpoch {
    handle: String,
    /// `None` once ended.
    reader: Option<SplitReader>,
    holders: Arc<Holders>,
    sources: Arc<Sources>,
    runtime: Arc<tokio::runtime::Runtime>,
    /// Where its consumer takes pieces as batches, what reports them.
    counting: Option<BatchReporter>,
}

impl Iterator for RemoteEpoch {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Result<RecordBatch>> {
        let reader = self.reader.as_mut()?;
        // Arrow's decoder wants its buffers aligned: bytes land in one.
        let aligned = arrow_buffer::MutableBuffer::from_len_zeroed;
        let (holders, sources) = (&self.holders, &self.sources);
        let batch = self.runtime.block_on(async {
            let mut piece = reader.next(aligned).await;
            loop {
                let count = |counter: &AtomicUsize| counter.fetch_add(1, Ordering::Relaxed);
                return match piece {
                    Ok(None) => None,
                    Ok(Some(Piece::Shared { name, release })) => {
                        count(&sources.driver);
                        Some(
                            open_shared_keeping(&name, Arc::new(release))
                                .map(|shared| shared.batch)
                                .map_err(|e| e.to_string()),
                        )
                    }
                    Ok(Some(Piece::Bytes(bytes))) => {
                        count(&sources.driver);
                        Some(ipc::decode(&bytes.into()).map_err(|e| e.to_string()))
                    }
                    Ok(Some(Piece::Fetch {
                        piece: number,
                        from,
                    })) => {
                        match holders.fetch(&from).await {
                            Ok((batch, came)) => {
                                reader.fetched(number);
                                count(match came {
                                    Came::ByMemory => &sources.node_memory,
                                    Came::AsBytes => &sources.node_bytes,
                                });
                                Some(Ok(batch))
                            }
                            Err(reason) => {
                                // The driver sends them, or the next piece.
                                count(&sources.unfetched);
                                piece = reader.unfetched(number, reason, aligned).await;
                                continue;
                            }
                        }
                    }
                    Err(e) => Some(Err(e.to_string())),
                };
            }
        });
        let Some(batch) = batch else {
            self.reader = None;
            return None;
        };
        match &batch {
            Err(_) => self.reader = None,
            Ok(_) => {
                if let Some(reporter) = &mut self.counting {
                    reporter.batch();
                }
            }
        }
        Some(batch.map_err(|message| Error::RemoteSplit {
            handle: self.handle.clone(),
            message,
        }))
    }
}

/// Where a trainer's pieces came from (see [`RemoteSplit::piece_sources`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PieceSources {
    /// Sent by the driver (read there, or rows a trainer could not fetch).
    pub driver: usize,
    /// Mapped from the shared memory of the node holding them.
    pub node_memory: usize,
    /// Fetched as bytes from the node holding them.
    pub node_bytes: usize,
    /// Fetches from a node that failed (the driver then sent the rows, or
    /// the job made them again).
    pub unfetched: usize,
}

/// The counts behind [`PieceSources`].
#[derive(Default)]
struct Sources {
    driver: AtomicUsize,
    node_memory: AtomicUsize,
    node_bytes: AtomicUsize,
    unfetched: AtomicUsize,
}

/// [`streambatch::keep_freed_memory`], for a process whose few threads
/// hand large buffers to each other (a trainer: its prefetch thread makes
/// the batches its training loop frees): one glibc arena, so that a freed
/// batch is the next one's memory, where an arena per thread kept each
/// thread's freed batches apart (W6a's trainers held 270-360 MiB, 220-255
/// with one arena, no slower). Not for nodes, whose worker threads all
/// allocate at once and would contend for the one arena's lock.
fn keep_freed_memory_in_one_heap() {
    streambatch::keep_freed_memory();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator settings; any value is valid.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}
