//! `streambatch bench net`: what moving a partition between two nodes
//! costs. Two transports (each a node's: its own certificate, endpoint and
//! store) in this process, on 127.0.0.1:
//!
//! - over QUIC: a 256 MiB partition pulled by a fetch (request, reply,
//!   bytes on a stream of their own, mutual TLS), against a bare quinn
//!   stream carrying the same bytes with the same TLS and transport
//!   settings, measured in the same run;
//! - by shared memory: two nodes over the same store directory hand over
//!   the segment's name, and the puller maps it: the time for 1 MiB and for
//!   1 GiB, which should be about the same (no byte is copied).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BinaryArray, RecordBatch};
use arrow_buffer::{Buffer, OffsetBuffer};
use streambatch::{Error, Result};
use streambatch_net::{
    Endpoint, Fetched, Identity, Locality, PartitionServer, Served, TlsFiles, Transport,
    init_cluster,
};
use streambatch_store::{ObjectStore, PartitionRef, SharedStore, StoreConfig};

use crate::checksum;

/// The partition moved over QUIC.
const QUIC_BYTES: usize = 256 << 20;

/// Serves the partitions of a store, as a node serves its own.
struct StoreParts {
    store: SharedStore,
    parts: Mutex<HashMap<u64, PartitionRef>>,
}

impl PartitionServer for StoreParts {
    fn serve(&self, id: u64, shares_memory: bool) -> std::result::Result<Served, String> {
        let parts = self.parts.lock().map_err(|e| e.to_string())?;
        let part = parts.get(&id).ok_or("no such partition")?;
        if shares_memory {
            let pin = self.store.pin(part.id()).map_err(|e| e.to_string())?;
            if let Some(name) = self.store.shared_name(part) {
                return Ok(Served::Shared(name, Box::new(pin)));
            }
        }
        let bytes = self.store.encoded_bytes(part).map_err(|e| e.to_string())?;
        Ok(Served::Bytes(Box::new(BufferBytes(bytes))))
    }
}

struct BufferBytes(Buffer);

impl AsRef<[u8]> for BufferBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// `len` bytes that differ from word to word, so that a checksum sees
/// bytes lost, changed or moved (a constant fill would hide a move).
fn pattern(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    for (i, word) in bytes.chunks_mut(8).enumerate() {
        let value = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        word.copy_from_slice(&value.to_le_bytes()[..word.len()]);
    }
    bytes
}

/// What was sent: its length and [`checksum`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sent {
    len: usize,
    checksum: u64,
}

impl Sent {
    fn of(bytes: &[u8]) -> Self {
        Self {
            len: bytes.len(),
            checksum: checksum(bytes),
        }
    }

    /// Whether `got` holds exactly the bytes sent.
    fn came(&self, got: &[u8]) -> bool {
        *self == Self::of(got)
    }
}

/// A one-row partition of [`pattern`] bytes, and what it holds.
fn bytes_batch(len: usize) -> (RecordBatch, Sent) {
    let bytes = pattern(len);
    let sent = Sent::of(&bytes);
    let offsets = OffsetBuffer::from_lengths([len]);
    let data: ArrayRef = Arc::new(BinaryArray::new(offsets, Buffer::from_vec(bytes), None));
    let batch = RecordBatch::try_from_iter([("data", data)]).expect("one column");
    (batch, sent)
}

/// The bytes of a one-row partition's `data` column (empty if it has none).
fn data_of(batch: &RecordBatch) -> &[u8] {
    batch
        .column_by_name("data")
        .and_then(|c| c.as_binary_opt::<i32>())
        .filter(|c| c.len() == 1)
        .map_or(&[], |c| c.value(0))
}

fn failed(what: &str) -> impl Fn(Box<dyn std::error::Error + Send + Sync>) -> Error + '_ {
    move |e| Error::Start {
        what: "the network benchmark",
        source: format!("{what}: {e}").into(),
    }
}

/// Runs the benchmark; `dir` holds its certificates and store directories.
pub fn net_bench(dir: &Path) -> Result<serde_json::Value> {
    let tls = dir.join("bench-net-tls");
    let _ = std::fs::remove_dir_all(&tls);
    init_cluster(&tls, &["holder", "puller", "sharer"])
        .map_err(|e| failed("certificates")(e.into()))?;
    let identity = |name: &str| {
        Identity::load(&TlsFiles::in_dir(&tls, name)).map_err(|e| failed("certificates")(e.into()))
    };
    let (holder_id, puller_id, sharer_id) = (
        identity("holder")?,
        identity("puller")?,
        identity("sharer")?,
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| failed("runtime")(e.into()))?;

    let holder_dir = dir.join("bench-net-holder");
    let store = SharedStore::open(StoreConfig::new(
        (1 << 30) + (QUIC_BYTES as u64) + (64 << 20),
        &holder_dir,
    ))
    .map_err(|e| failed("store")(e.into()))?;
    let mut sent = Vec::new();
    let mut put = |len: usize| {
        let (batch, what) = bytes_batch(len);
        sent.push(what);
        store.put(batch).map_err(|e| failed("store")(e.into()))
    };
    let (quic_part, small, large) = (put(QUIC_BYTES)?, put(1 << 20)?, put(1 << 30)?);
    let ids = [quic_part.id().0, small.id().0, large.id().0];
    let sent = [sent[0], sent[1], sent[2]];
    let parts = ids
        .iter()
        .zip([quic_part, small, large])
        .map(|(id, p)| (*id, p))
        .collect();
    let server = Arc::new(StoreParts {
        store: store.clone(),
        parts: Mutex::new(parts),
    });

    let result = runtime.block_on(async {
        let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("an address");
        let start =
            |name: &str, id: &Identity, store_dir: &Path, server: Arc<dyn PartitionServer>| {
                let endpoint = Endpoint::bind(any, id);
                let name = name.to_string();
                let here = Locality::here(store_dir);
                async move {
                    let endpoint = endpoint.map_err(|e| failed("endpoint")(e.into()))?;
                    Transport::start(&name, endpoint, server, here, None)
                        .await
                        .map_err(|e| failed("transport")(e.into()))
                }
            };
        let holder = start("holder", &holder_id, &holder_dir, server.clone()).await?;
        let none: Arc<dyn PartitionServer> = Arc::new(StoreParts {
            store: store.clone(),
            parts: Mutex::new(HashMap::new()),
        });
        let puller = start(
            "puller",
            &puller_id,
            &dir.join("bench-net-puller"),
            none.clone(),
        )
        .await?;
        let sharer = start("sharer", &sharer_id, &holder_dir, none).await?;
        for node in [&puller, &sharer] {
            node.join(holder.local_addr())
                .await
                .map_err(|e| failed("connecting")(e.into()))?;
        }

        // Bare quinn: the same bytes on one stream of a connection with the
        // same TLS and transport settings; no request frame, no reply frame.
        // Every transfer's bytes are checked after it is timed.
        let bare = BareQuinn::start(&holder_id, &puller_id, QUIC_BYTES).await?;
        let mut bare_best = Duration::MAX;
        let mut quic_best = Duration::MAX;
        let (mut bare_checked, mut quic_checked) = (Checked::default(), Checked::default());
        for _ in 0..3 {
            let (time, bytes) = bare.pull().await?;
            bare_best = bare_best.min(time);
            bare_checked.add(bare.sent.came(&bytes));
            let t = Instant::now();
            let bytes = match puller.fetch("holder", ids[0]).await {
                Ok(Fetched::Bytes(bytes)) => bytes,
                Ok(other) => {
                    let why = format!("unexpected reply: {}", kind(&other));
                    return Err(failed("fetch")(why.into()));
                }
                Err(e) => return Err(failed("fetch")(e.into())),
            };
            quic_best = quic_best.min(t.elapsed());
            // The partition's encoding: decoded (into an aligned buffer, as
            // a node does: Arrow needs its buffers aligned, bytes off the
            // wire are not), its row must be the bytes put.
            let mut aligned = arrow_buffer::MutableBuffer::with_capacity(bytes.len());
            aligned.extend_from_slice(&bytes);
            drop(bytes);
            let batch = streambatch_store::ipc::decode(&aligned.into());
            quic_checked.add(batch.is_ok_and(|b| sent[0].came(data_of(&b))));
        }
        bare.close();

        // Shared memory: the name travels; the puller maps the segment.
        let shared = |id: u64, sent: Sent| {
            let sharer = sharer.clone();
            async move {
                let mut best = Duration::MAX;
                let mut checked = Checked::default();
                for _ in 0..5 {
                    let t = Instant::now();
                    let (name, lease) = match sharer.fetch("holder", id).await {
                        Ok(Fetched::Shared(name, lease)) => (name, lease),
                        Ok(other) => {
                            let why = format!("unexpected reply: {}", kind(&other));
                            return Err(failed("shared fetch")(why.into()));
                        }
                        Err(e) => return Err(failed("shared fetch")(e.into())),
                    };
                    let part = streambatch_store::open_shared(&name)
                        .map_err(|e| failed("mapping")(e.into()))?;
                    std::hint::black_box(part.batch.num_rows());
                    best = best.min(t.elapsed());
                    checked.add(sent.came(data_of(&part.batch)));
                    drop((part, lease));
                }
                Ok::<_, Error>((best, checked))
            }
        };
        let (shm_small, small_checked) = shared(ids[1], sent[1]).await?;
        let (shm_large, large_checked) = shared(ids[2], sent[2]).await?;
        let mut shm_checked = small_checked;
        shm_checked.join(large_checked);
        let checked = [bare_checked, quic_checked, shm_checked];
        for node in [&holder, &puller, &sharer] {
            node.stop();
        }
        Ok::<_, Error>((bare_best, quic_best, shm_small, shm_large, checked))
    })?;
    let (bare, quic, shm_small, shm_large, [bare_checked, quic_checked, shm_checked]) = result;
    let mut checked = bare_checked;
    checked.join(quic_checked);
    checked.join(shm_checked);
    let gbps = |d: Duration| QUIC_BYTES as f64 / d.as_secs_f64() / 1e9;
    let quic_gbps = gbps(quic);
    let bare_gbps = gbps(bare);
    Ok(serde_json::json!({
        "workload": "net",
        "system": "streambatch",
        "config": "256MiB over QUIC; 1MiB and 1GiB by shared memory; best of 3 and 5",
        "quic_gbps": quic_gbps,
        "bare_quinn_gbps": bare_gbps,
        "quic_vs_bare": quic_gbps / bare_gbps,
        "shm_1mib_s": shm_small.as_secs_f64(),
        "shm_1gib_s": shm_large.as_secs_f64(),
        "shm_1gib_vs_1mib": shm_large.as_secs_f64() / shm_small.as_secs_f64(),
        "transfers_checked": checked.transfers,
        "transfers_intact": checked.intact,
        "intact_of_checked": {
            "quic": [quic_checked.intact, quic_checked.transfers],
            "bare_quinn": [bare_checked.intact, bare_checked.transfers],
            "shared_memory": [shm_checked.intact, shm_checked.transfers],
        },
        "correct": checked.all_intact(),
    }))
}

/// Transfers whose bytes were checked against what was sent, and how many
/// came intact.
#[derive(Clone, Copy, Debug, Default)]
struct Checked {
    transfers: u64,
    intact: u64,
}

impl Checked {
    fn add(&mut self, intact: bool) {
        self.transfers += 1;
        self.intact += u64::from(intact);
    }

    fn join(&mut self, other: Checked) {
        self.transfers += other.transfers;
        self.intact += other.intact;
    }

    /// At least one transfer, and every one intact.
    fn all_intact(&self) -> bool {
        self.transfers > 0 && self.intact == self.transfers
    }
}

/// A bare quinn connection: the server sends `len` bytes on each stream
/// the client opens (after one byte of request), the client reads them into
/// a buffer, as a fetch does.
struct BareQuinn {
    server: quinn::Endpoint,
    client: quinn::Endpoint,
    connection: quinn::Connection,
    sent: Sent,
}

impl BareQuinn {
    async fn start(server_id: &Identity, client_id: &Identity, len: usize) -> Result<Self> {
        let e = |e: Box<dyn std::error::Error + Send + Sync>| failed("bare quinn")(e);
        let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("an address");
        let mut server_config = server_id.server_config().map_err(|x| e(x.into()))?;
        server_config.transport_config(streambatch_net::transport(
            streambatch_net::DEFAULT_PEER_TIMEOUT,
        ));
        let server = quinn::Endpoint::server(server_config, any).map_err(|x| e(x.into()))?;
        let addr = server.local_addr().map_err(|x| e(x.into()))?;
        let payload = Arc::new(pattern(len));
        let sent = Sent::of(&payload);
        let accepting = server.clone();
        tokio::spawn(async move {
            let Some(incoming) = accepting.accept().await else {
                return;
            };
            let Ok(connection) = incoming.await else {
                return;
            };
            while let Ok((mut send, mut recv)) = connection.accept_bi().await {
                let payload = payload.clone();
                tokio::spawn(async move {
                    let mut request = [0u8];
                    if recv.read_exact(&mut request).await.is_ok() {
                        let _ = send.write_all(&payload).await;
                        let _ = send.finish();
                    }
                });
            }
        });
        let mut client = quinn::Endpoint::client(any).map_err(|x| e(x.into()))?;
        let mut client_config = client_id.client_config().map_err(|x| e(x.into()))?;
        client_config.transport_config(streambatch_net::transport(
            streambatch_net::DEFAULT_PEER_TIMEOUT,
        ));
        client.set_default_client_config(client_config);
        let connection = client
            .connect(addr, streambatch_net::tls::SERVER_NAME)
            .map_err(|x| e(x.into()))?
            .await
            .map_err(|x| e(x.into()))?;
        Ok(Self {
            server,
            client,
            connection,
            sent,
        })
    }

    /// One transfer, timed from opening the stream to the last byte read;
    /// the time and the bytes read.
    async fn pull(&self) -> Result<(Duration, Vec<u8>)> {
        let e = |e: Box<dyn std::error::Error + Send + Sync>| failed("bare quinn")(e);
        let t = Instant::now();
        let (mut send, mut recv) = self.connection.open_bi().await.map_err(|x| e(x.into()))?;
        send.write_all(&[1]).await.map_err(|x| e(x.into()))?;
        let mut bytes = vec![0u8; self.sent.len];
        recv.read_exact(&mut bytes).await.map_err(|x| e(x.into()))?;
        std::hint::black_box(&bytes);
        Ok((t.elapsed(), bytes))
    }

    fn close(&self) {
        self.connection.close(0u32.into(), b"done");
        self.client.close(0u32.into(), b"done");
        self.server.close(0u32.into(), b"done");
    }
}

fn kind(f: &Fetched) -> &'static str {
    match f {
        Fetched::Shared(..) => "shared",
        Fetched::Bytes(_) => "bytes",
        Fetched::Rows(_) => "rows",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transfer_with_a_wrong_missing_or_moved_byte_is_not_intact() {
        let bytes = pattern(1 << 16);
        let sent = Sent::of(&bytes);
        assert!(sent.came(&bytes));
        let mut wrong = bytes.clone();
        wrong[12_345] ^= 0x40;
        assert!(!sent.came(&wrong));
        assert!(!sent.came(&bytes[..bytes.len() - 1]));
        let mut moved = bytes.clone();
        moved[..16].rotate_left(8); // two words swapped
        assert!(!sent.came(&moved));

        let (batch, sent) = bytes_batch(1000);
        assert!(sent.came(data_of(&batch)));
        let (other, _) = bytes_batch(999);
        assert!(!sent.came(data_of(&other)));

        let mut checked = Checked::default();
        assert!(!checked.all_intact(), "nothing checked is not correct");
        checked.add(true);
        assert!(checked.all_intact());
        checked.add(false);
        assert!(!checked.all_intact());
    }
}
