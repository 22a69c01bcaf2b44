//! A trainer's fetches from the cluster nodes that hold its pieces (a
//! [`ToTrainer::Fetch`](streambatch_net::split::ToTrainer::Fetch)): one
//! connection per node, made with the trainer's own certificate and
//! checked to be that node; the rows mapped from the node's shared memory
//! on its host, else sent as bytes, validated either way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use streambatch_net::split::FetchFrom;
use streambatch_net::{Endpoint, Fetched, Locality, MappedLease, Peer, fetch};
use streambatch_store::{ipc, open_shared_keeping};

/// Pieces mapped from nodes' memory at once, at most: each holds a QUIC
/// stream to its node open (a connection carries 1,024), so past this a
/// piece's rows are copied and the mapping let go at once.
const MAX_MAPPED: usize = 256;

/// The nodes a trainer fetches from.
pub(crate) struct Holders {
    endpoint: Endpoint,
    /// This trainer's host (boot id, or a host of its own when it must not
    /// map another process's memory).
    host: String,
    peers: Mutex<HashMap<String, Peer>>,
    /// Nodes that could not be reached, and when: fetches from them fail
    /// at once for a while (a lost node would make each wait for the
    /// handshake's timeout).
    unreachable: Mutex<HashMap<String, Instant>>,
    mapped: Arc<AtomicUsize>,
}

/// How long a node that could not be reached is not tried again.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// How a piece came from its node.
pub(crate) enum Came {
    /// Mapped from the node's shared memory.
    ByMemory,
    /// As bytes over QUIC.
    AsBytes,
}

/// A mapped piece's hold on its node's memory, counted while it lives.
struct Mapped {
    _lease: MappedLease,
    count: Arc<AtomicUsize>,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Holders {
    pub(crate) fn new(endpoint: Endpoint, host: String) -> Self {
        Self {
            endpoint,
            host,
            peers: Mutex::default(),
            unreachable: Mutex::default(),
            mapped: Arc::default(),
        }
    }

    /// Fetches the rows `from` names from their node; the error says why
    /// not (the driver then sends them itself).
    pub(crate) async fn fetch(&self, from: &FetchFrom) -> Result<(RecordBatch, Came), String> {
        let rows = from.rows;
        if rows
            .offset
            .checked_add(rows.len)
            .is_none_or(|end| end > from.partition_rows)
        {
            return Err(format!(
                "rows {}+{} of partition {} on node {}, which holds {}",
                rows.offset, rows.len, from.partition, from.node, from.partition_rows
            ));
        }
        let peer = self.peer(from).await?;
        let fetched = self.fetch_from(&peer, from).await;
        if fetched.is_err() && peer.connection().close_reason().is_some() {
            self.unreachable(&from.node);
        }
        fetched
    }

    async fn fetch_from(
        &self,
        peer: &Peer,
        from: &FetchFrom,
    ) -> Result<(RecordBatch, Came), String> {
        let rows = from.rows;
        let whole = rows.offset == 0 && rows.len == from.partition_rows;
        // Only on the node's host does its store's locality match.
        let here = Locality {
            host: self.host.clone(),
            store_dir: from.locality.store_dir.clone(),
        };
        let asked = (!whole).then_some(rows);
        let fetched = fetch::fetch(peer, from.partition, asked, &here)
            .await
            .map_err(|e| e.to_string())?;
        let (batch, alone, came) = match fetched {
            Fetched::Shared(name, lease) => {
                self.mapped.fetch_add(1, Ordering::Relaxed);
                let keep = Mapped {
                    _lease: lease,
                    count: self.mapped.clone(),
                };
                let shared =
                    open_shared_keeping(&name, Arc::new(keep)).map_err(|e| e.to_string())?;
                (shared.batch, false, Came::ByMemory)
            }
            // The whole partition, or the rows asked for alone.
            Fetched::Bytes(bytes) => (decode(&bytes)?, false, Came::AsBytes),
            Fetched::Rows(bytes) => (decode(&bytes)?, true, Came::AsBytes),
        };
        let batch = if alone {
            check_rows(&batch, rows.len, from)?;
            batch
        } else {
            check_rows(&batch, from.partition_rows, from)?;
            batch.slice(rows.offset as usize, rows.len as usize)
        };
        // Rows that came as bytes are this trainer's own already.
        if matches!(came, Came::ByMemory) && self.mapped.load(Ordering::Relaxed) > MAX_MAPPED {
            return Ok((copied(&batch)?, came));
        }
        Ok((batch, came))
    }

    /// The connection to `from`'s node, made if there is none.
    async fn peer(&self, from: &FetchFrom) -> Result<Peer, String> {
        let known = self
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&from.node)
            .cloned();
        if let Some(peer) = known.filter(|p| p.connection().close_reason().is_none()) {
            return Ok(peer);
        }
        let failed_at = self
            .unreachable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&from.node)
            .copied();
        if failed_at.is_some_and(|at| at.elapsed() < RETRY_AFTER) {
            return Err(format!("node {} could not be reached lately", from.node));
        }
        let addr = from.addr.parse().map_err(|_| {
            format!(
                "node {} listens at `{}`, not an address",
                from.node, from.addr
            )
        })?;
        let peer = match self.endpoint.connect(addr).await {
            Ok(peer) => peer,
            Err(e) => {
                self.unreachable(&from.node);
                return Err(e.to_string());
            }
        };
        if peer.name() != from.node {
            return Err(format!(
                "{} is `{}`, not node `{}`",
                from.addr,
                peer.name(),
                from.node
            ));
        }
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        peers.insert(from.node.clone(), peer.clone());
        Ok(peer)
    }
}

impl Holders {
    fn unreachable(&self, node: &str) {
        let mut unreachable = self.unreachable.lock().unwrap_or_else(|p| p.into_inner());
        unreachable.insert(node.to_string(), Instant::now());
    }
}

/// Validates and decodes an Arrow IPC stream off the wire.
fn decode(bytes: &[u8]) -> Result<RecordBatch, String> {
    ipc::decode_unaligned(bytes).map_err(|e| e.to_string())
}

fn check_rows(batch: &RecordBatch, want: u64, from: &FetchFrom) -> Result<(), String> {
    if batch.num_rows() as u64 != want {
        return Err(format!(
            "partition {} of node {} gave {} rows where {want} were due",
            from.partition,
            from.node,
            batch.num_rows()
        ));
    }
    Ok(())
}

/// The rows copied into memory of their own.
fn copied(batch: &RecordBatch) -> Result<RecordBatch, String> {
    let rows = arrow_array::UInt32Array::from_iter_values(0..batch.num_rows() as u32);
    arrow_select::take::take_record_batch(batch, &rows).map_err(|e| e.to_string())
}
