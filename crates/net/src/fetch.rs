//! Partition fetches: the node that needs a partition pulls it from the node
//! that holds it, on a stream of its own (never inside an actor message).
//!
//! The puller opens a [`StreamKind::Fetch`] stream and sends a
//! [`FetchRequest`] naming the partition and where the puller runs. The
//! holder answers with one [`FetchReply`]: the partition's shared-memory
//! name when both run on the same host over the same store directory (the
//! puller maps it; no byte is copied), else its length followed by the
//! bytes. A puller that needs only some rows (a reducer's slice of a map
//! output) names them, and a holder that can serves those rows alone
//! rather than the whole partition. A puller that needs several
//! partitions of one holder (a reducer's rows of the map outputs the
//! holder has) asks for them all on one [`StreamKind::FetchMany`] stream,
//! and the holder answers each in turn, as above, on that stream. There
//! it may also ask for a group of a partition stored cut into groups (a
//! reducer's destination of an exchange's map output, [`Want::Group`]):
//! the holder finds its rows by the cut it keeps and names them first
//! ([`FetchReply::Group`]), so that no one else need keep the cut; or for
//! a whole such partition with its cut ([`Want::WithCut`], a map output
//! moving off a draining node): the cut comes first ([`FetchReply::Cut`]).
//! QUIC's stream flow control is the credit: the holder writes only
//! as far as the puller has read plus the stream window (16 MiB), so a slow
//! reader slows the sender and nothing piles up in between.

use std::sync::Arc;

use quinn::{RecvStream, SendStream};
use rkyv::{Archive, Deserialize, Serialize};

use crate::endpoint::{Peer, StreamKind};
use crate::frame::{
    MAX_CONTROL_FRAME, body_within, read_body, read_frame, write_bytes, write_frame,
};
use crate::{FrameError, NetError};

/// Where a node runs, as far as sharing memory goes: two nodes share
/// partitions by shared memory when both fields are equal.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Locality {
    /// The host's identity (its boot id): equal only on the same kernel.
    pub host: String,
    /// The store's directory on that host.
    pub store_dir: String,
}

impl Locality {
    /// This host, with a store in `store_dir`.
    pub fn here(store_dir: &std::path::Path) -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| format!("pid-{}", std::process::id()));
        Self {
            host,
            store_dir: store_dir.display().to_string(),
        }
    }
}

/// A puller's request.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct FetchRequest {
    /// The partition's id on the holder.
    pub partition: u64,
    /// Where the puller runs.
    pub from: Locality,
    /// The rows the puller needs, when not all of them.
    pub rows: Option<RowRange>,
}

/// Rows `offset..offset + len` of a partition.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowRange {
    /// The first row.
    pub offset: u64,
    /// How many.
    pub len: u64,
}

pub use reply::FetchReply;
pub use want::Want;

// rkyv's derive makes an enum of resolvers with undocumented fields.
#[allow(missing_docs)]
mod want {
    use rkyv::{Archive, Deserialize, Serialize};

    /// Which rows of a partition a puller needs.
    #[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Want {
        /// All of them.
        Whole,
        /// These.
        Rows(super::RowRange),
        /// Group `g` of a partition stored cut into groups (a reducer's
        /// destination of an exchange's map output): the holder finds its
        /// rows by the cut it keeps, and names them in its answer.
        Group(u32),
        /// All of a partition stored cut into groups, and its cut (a map
        /// output moving off a draining node, whose cut goes with it).
        WithCut,
    }

    impl From<Option<super::RowRange>> for Want {
        fn from(rows: Option<super::RowRange>) -> Self {
            rows.map_or(Want::Whole, Want::Rows)
        }
    }
}

// rkyv's derive makes an enum of resolvers with undocumented fields.
#[allow(missing_docs)]
mod reply {
    use rkyv::{Archive, Deserialize, Serialize};

    /// The holder's answer.
    #[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
    pub enum FetchReply {
        /// `len` bytes follow on the stream: the whole partition.
        Bytes {
            /// The partition's length.
            len: u64,
        },
        /// `len` bytes follow on the stream: the rows asked for, alone.
        Rows {
            /// Their length.
            len: u64,
        },
        /// Map it from shared memory under this name.
        Shared {
            /// The store's shared name of the partition.
            name: String,
        },
        /// The holder cannot serve it.
        Missing {
            /// Why.
            message: String,
        },
        /// The rows of the group asked for: the answer that follows (after
        /// this frame) holds them alone, or the partition they lie in.
        Group {
            /// The first row.
            offset: u64,
            /// How many.
            len: u64,
        },
        /// The cut of the partition asked for with it: where each group
        /// starts, and the end; the whole partition follows.
        Cut {
            /// The starts and the end.
            starts: Vec<u32>,
        },
    }
}

/// How a holder serves one partition.
pub enum Served {
    /// By its shared-memory name, with what keeps the bytes in place (a
    /// pin): held until the reader closes the fetch stream, which it does
    /// once it has unmapped them.
    Shared(String, Box<dyn std::any::Any + Send>),
    /// By its bytes; the value keeps them alive (pinned) while they are sent.
    Bytes(Box<dyn AsRef<[u8]> + Send>),
    /// By the bytes of the rows asked for alone (an IPC stream of them).
    Rows(Box<dyn AsRef<[u8]> + Send>),
}

/// What a node that holds partitions implements to serve them.
pub trait PartitionServer: Send + Sync + 'static {
    /// Serves `partition` to a puller, by shared name when `shares_memory`
    /// (and the partition is in memory), else by bytes.
    fn serve(&self, partition: u64, shares_memory: bool) -> Result<Served, String>;
    /// Serves rows `rows` of `partition`: by default the whole of it, as
    /// [`PartitionServer::serve`] does; a server that can cut rows out
    /// answers [`Served::Rows`].
    fn serve_rows(
        &self,
        partition: u64,
        rows: RowRange,
        shares_memory: bool,
    ) -> Result<Served, String> {
        let _ = rows;
        self.serve(partition, shares_memory)
    }
    /// Where group `group` of `partition` lies, when the partition is kept
    /// cut into groups; by default none is.
    fn group_rows(&self, partition: u64, group: u32) -> Result<RowRange, String> {
        let _ = group;
        Err(format!("partition {partition} is not kept cut into groups"))
    }
    /// The cut `partition` is kept with (where each group starts, and the
    /// end); by default none is.
    fn cut(&self, partition: u64) -> Result<Vec<u32>, String> {
        Err(format!("partition {partition} is not kept cut into groups"))
    }
}

/// What a fetch brought.
#[derive(Debug)]
pub enum Fetched {
    /// The shared-memory name to map, and the open fetch stream: the holder
    /// keeps the bytes in place until it is dropped, so keep it as long as
    /// anything maps them.
    Shared(String, MappedLease),
    /// The bytes of the whole partition.
    Bytes(Vec<u8>),
    /// The bytes of the rows asked for alone.
    Rows(Vec<u8>),
}

/// The reader's side of a partition mapped from another node's memory:
/// dropping it lets the holder let the bytes go. It closes the fetch
/// stream or, for one of the partitions of a [`fetch_many`], tells the
/// holder which one (the stream closes once all are dropped).
#[derive(Debug)]
pub struct MappedLease(Lease);

#[derive(Debug)]
enum Lease {
    Stream {
        _send: SendStream,
        _recv: RecvStream,
    },
    /// The `index`-th partition asked for, released through `released`.
    Part {
        index: u32,
        released: tokio::sync::mpsc::UnboundedSender<u32>,
    },
}

impl MappedLease {
    fn new(send: SendStream, recv: RecvStream) -> Self {
        Self(Lease::Stream {
            _send: send,
            _recv: recv,
        })
    }
}

impl Drop for MappedLease {
    fn drop(&mut self) {
        if let Lease::Part { index, released } = &self.0 {
            // Gone only when the stream is (the holder lets all go then).
            let _ = released.send(*index);
        }
    }
}

impl PartialEq for Fetched {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Fetched::Shared(a, _), Fetched::Shared(b, _)) => a == b,
            (Fetched::Bytes(a), Fetched::Bytes(b)) | (Fetched::Rows(a), Fetched::Rows(b)) => a == b,
            _ => false,
        }
    }
}

/// How long a puller waits for the holder's answer (its bytes then have
/// [`body_within`] of their length).
const REPLY_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// The largest partition (or blob: a model sent to the nodes) a puller
/// accepts over the network; a longer announcement is refused before a
/// byte of it is read. Not the store's capacity: a partition larger than
/// the store is legal (it gets a segment of its own, or spills).
pub const MAX_PARTITION_BYTES: u64 = 64 << 30;

/// Pulls `partition` (only rows `rows` where the holder can cut them
/// out) from `peer`; `here` says where this node runs.
pub async fn fetch(
    peer: &Peer,
    partition: u64,
    rows: Option<RowRange>,
    here: &Locality,
) -> Result<Fetched, NetError> {
    let (mut send, mut recv) = peer.open(StreamKind::Fetch).await?;
    let request = FetchRequest {
        partition,
        from: here.clone(),
        rows,
    };
    write_frame(&mut send, &request)
        .await
        .map_err(|e| peer.broken(e))?;
    match read_answer(peer, &mut recv, partition, rows.into())
        .await?
        .0
    {
        Answer::Shared(name) => Ok(Fetched::Shared(name, MappedLease::new(send, recv))),
        Answer::Fetched(fetched) => {
            let _ = send.finish();
            Ok(fetched)
        }
    }
}

/// Rows of one partition, in a request for several.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartRows {
    /// The partition's id on the holder.
    pub partition: u64,
    /// The rows the puller needs.
    pub want: Want,
}

/// One partition a [`fetch_many`] brought.
#[derive(Debug, PartialEq)]
pub struct FetchedPart {
    /// What came.
    pub fetched: Fetched,
    /// The rows of the partition it is (rows alone) or holds (the whole
    /// partition, or its name): those asked for, or those the holder
    /// found for a group; `None` for all of them.
    pub rows: Option<RowRange>,
    /// The partition's cut, as its holder keeps it, when asked for
    /// ([`Want::WithCut`]); unchecked.
    pub cut: Option<Vec<u32>>,
}

/// A puller's request for several partitions of one holder (a reducer's
/// slices of every map output the holder has), answered on one stream.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct FetchManyRequest {
    /// What it needs, in the order the answers come.
    pub parts: Vec<PartRows>,
    /// Where the puller runs.
    pub from: Locality,
}

/// Pulls `parts` from `peer` on one stream: one request, the answers in
/// the order asked, as [`fetch`] gives each. Each partition to map from
/// shared memory has a lease of its own: dropping it tells the holder
/// (over the same stream) to unpin that partition alone, and the stream
/// closes once every lease is dropped.
pub async fn fetch_many(
    peer: &Peer,
    parts: &[PartRows],
    here: &Locality,
) -> Result<Vec<FetchedPart>, NetError> {
    let mut fetched = Vec::with_capacity(parts.len());
    for batch in parts.chunks(MANY_PER_STREAM) {
        fetched.extend(fetch_batch(peer, batch, here).await?);
    }
    Ok(fetched)
}

/// The most partitions asked for on one [`fetch_many`] stream: their
/// request stays well within a control frame (1 MiB).
const MANY_PER_STREAM: usize = 4096;

/// [`fetch_many`] of at most [`MANY_PER_STREAM`] partitions.
async fn fetch_batch(
    peer: &Peer,
    parts: &[PartRows],
    here: &Locality,
) -> Result<Vec<FetchedPart>, NetError> {
    let (mut send, mut recv) = peer.open(StreamKind::FetchMany).await?;
    let request = FetchManyRequest {
        parts: parts.to_vec(),
        from: here.clone(),
    };
    write_frame(&mut send, &request)
        .await
        .map_err(|e| peer.broken(e))?;
    let mut answers = Vec::with_capacity(parts.len());
    for part in parts {
        answers.push(read_answer(peer, &mut recv, part.partition, part.want).await?);
    }
    if !answers.iter().any(|(a, ..)| matches!(a, Answer::Shared(_))) {
        let _ = send.finish();
        let fetched = answers.into_iter().map(|(answer, rows, cut)| FetchedPart {
            fetched: answer.fetched(),
            rows,
            cut,
        });
        return Ok(fetched.collect());
    }
    // The partitions let go, one index each, until every lease is dropped.
    let (released, mut to_send) = tokio::sync::mpsc::unbounded_channel::<u32>();
    tokio::spawn(async move {
        let _recv = recv;
        while let Some(index) = to_send.recv().await {
            if send.write_all(&index.to_le_bytes()).await.is_err() {
                return;
            }
        }
        let _ = send.finish();
    });
    let fetched = answers
        .into_iter()
        .enumerate()
        .map(|(at, (answer, rows, cut))| {
            let fetched = match answer {
                Answer::Shared(name) => {
                    let released = released.clone();
                    let lease = Lease::Part {
                        index: at as u32,
                        released,
                    };
                    Fetched::Shared(name, MappedLease(lease))
                }
                answer => answer.fetched(),
            };
            FetchedPart { fetched, rows, cut }
        });
    Ok(fetched.collect())
}

/// One answer of a [`fetch_many`].
enum Answer {
    Shared(String),
    Fetched(Fetched),
}

impl Answer {
    /// The bytes fetched (not a name, which needs its lease).
    fn fetched(self) -> Fetched {
        match self {
            Self::Fetched(fetched) => fetched,
            Self::Shared(_) => unreachable!("a name is given its lease"),
        }
    }
}

/// Reads the holder's answer for the rows `want` of `partition`, and its
/// bytes, with the rows it holds and its cut (see [`FetchedPart`]).
async fn read_answer(
    peer: &Peer,
    recv: &mut RecvStream,
    partition: u64,
    want: Want,
) -> Result<(Answer, Option<RowRange>, Option<Vec<u32>>), NetError> {
    let refused = |message: String| NetError::Fetch {
        peer: peer.name().to_string(),
        partition,
        message,
    };
    let (rows, cut) = match want {
        Want::Whole => (None, None),
        Want::Rows(rows) => (Some(rows), None),
        Want::Group(group) => match read_reply(peer, recv, partition).await? {
            FetchReply::Group { offset, len } => (Some(RowRange { offset, len }), None),
            FetchReply::Missing { message } => return Err(refused(message)),
            _ => {
                return Err(refused(format!(
                    "the holder did not say which rows group {group} holds"
                )));
            }
        },
        Want::WithCut => match read_reply(peer, recv, partition).await? {
            FetchReply::Cut { starts } => (None, Some(starts)),
            FetchReply::Missing { message } => return Err(refused(message)),
            _ => return Err(refused("the holder sent no cut".into())),
        },
    };
    let (len, alone) = match read_reply(peer, recv, partition).await? {
        FetchReply::Shared { name } => return Ok((Answer::Shared(name), rows, cut)),
        FetchReply::Missing { message } => return Err(refused(message)),
        FetchReply::Rows { .. } if rows.is_none() => {
            return Err(refused(
                "the holder sent rows that were not asked for".into(),
            ));
        }
        FetchReply::Group { .. } | FetchReply::Cut { .. } => {
            return Err(refused(
                "the holder named a group or cut that was not asked for".into(),
            ));
        }
        FetchReply::Bytes { len } => (len, false),
        FetchReply::Rows { len } => (len, true),
    };
    let frame_error = |source| NetError::Frame {
        peer: peer.name().to_string(),
        source,
    };
    if len > MAX_PARTITION_BYTES {
        return Err(frame_error(FrameError::Oversized {
            len,
            max: MAX_PARTITION_BYTES,
        }));
    }
    let bytes = read_body(recv, len, body_within(len))
        .await
        .map_err(frame_error)?;
    let fetched = match alone {
        true => Fetched::Rows(bytes),
        false => Fetched::Bytes(bytes),
    };
    Ok((Answer::Fetched(fetched), rows, cut))
}

/// Reads one of the holder's answer frames for `partition`.
async fn read_reply(
    peer: &Peer,
    recv: &mut RecvStream,
    partition: u64,
) -> Result<FetchReply, NetError> {
    let frame_error = |source| NetError::Frame {
        peer: peer.name().to_string(),
        source,
    };
    tokio::time::timeout(
        REPLY_WITHIN,
        read_frame::<FetchReply, _>(recv, MAX_CONTROL_FRAME),
    )
    .await
    .map_err(|_| NetError::Fetch {
        peer: peer.name().to_string(),
        partition,
        message: format!("no answer within {} s", REPLY_WITHIN.as_secs()),
    })?
    .map_err(frame_error)?
    .ok_or_else(|| {
        frame_error(FrameError::Truncated {
            got: 0,
            expected: 4,
        })
    })
}

/// Answers one fetch stream. A request that is not a valid frame closes the
/// peer's connection (only that one).
pub async fn serve_fetch(
    peer: &Peer,
    mut send: SendStream,
    mut recv: RecvStream,
    server: &Arc<dyn PartitionServer>,
    here: &Locality,
) {
    let request = match read_frame::<FetchRequest, _>(&mut recv, MAX_CONTROL_FRAME).await {
        Ok(Some(request)) => request,
        Ok(None) => return,
        Err(e) => return peer.refuse(&e),
    };
    let shares_memory = request.from == *here;
    let (partition, rows) = (request.partition, request.rows);
    let reply = off_runtime(server, move |server| match rows {
        Some(rows) => server.serve_rows(partition, rows, shares_memory),
        None => server.serve(partition, shares_memory),
    })
    .await;
    let result = async {
        if let Some(pin) = answer(&mut send, reply).await? {
            // The reader maps the bytes where they are: hold them until
            // it closes its side (or the connection goes).
            let _ = recv.read_to_end(1).await;
            drop(pin);
        }
        send.finish()?;
        std::io::Result::Ok(())
    }
    .await;
    // Logged once the peer let go (a mapped partition is held till then).
    let (peer, partition) = (peer.name(), request.partition);
    match result {
        Ok(()) => tracing::debug!(target: "streambatch::serve", peer, partition, "served"),
        Err(error) => {
            tracing::debug!(target: "streambatch::serve", peer, partition, %error, "fetch not completed")
        }
    }
}

/// Answers one [`fetch_many`] stream: each partition in the order asked,
/// up to the first the holder cannot serve. A partition served by shared
/// name stays pinned until the reader sends back its index (a `u32`, little
/// endian) or closes the stream.
pub async fn serve_fetch_many(
    peer: &Peer,
    mut send: SendStream,
    mut recv: RecvStream,
    server: &Arc<dyn PartitionServer>,
    here: &Locality,
) {
    let request = match read_frame::<FetchManyRequest, _>(&mut recv, MAX_CONTROL_FRAME).await {
        Ok(Some(request)) => request,
        Ok(None) => return,
        Err(e) => return peer.refuse(&e),
    };
    let shares_memory = request.from == *here;
    let mut pins: Vec<Option<Box<dyn std::any::Any + Send>>> = Vec::new();
    let result = async {
        for part in &request.parts {
            let partition = part.partition;
            let serve = move |server: &dyn PartitionServer, rows: Option<RowRange>| match rows {
                Some(rows) => server.serve_rows(partition, rows, shares_memory),
                None => server.serve(partition, shares_memory),
            };
            let served = match part.want {
                Want::Whole => off_runtime(server, move |s| serve(s, None)).await,
                Want::Rows(rows) => off_runtime(server, move |s| serve(s, Some(rows))).await,
                Want::Group(group) => {
                    match off_runtime(server, move |s| s.group_rows(partition, group)).await {
                        Ok(rows) => {
                            let (offset, len) = (rows.offset, rows.len);
                            write_frame(&mut send, &FetchReply::Group { offset, len }).await?;
                            off_runtime(server, move |s| serve(s, Some(rows))).await
                        }
                        Err(message) => Err(message),
                    }
                }
                Want::WithCut => match off_runtime(server, move |s| s.cut(partition)).await {
                    Ok(starts) => {
                        write_frame(&mut send, &FetchReply::Cut { starts }).await?;
                        off_runtime(server, move |s| serve(s, None)).await
                    }
                    Err(message) => Err(message),
                },
            };
            let missing = served.is_err();
            pins.push(answer(&mut send, served).await?);
            if missing {
                break;
            }
        }
        send.finish()?;
        // The reader maps the bytes where they are: each stays pinned
        // until it says it is done with it, or closes its side (or the
        // connection goes). An index out of range is ignored.
        let (mut index, mut pinned) = ([0; 4], pins.iter().flatten().count());
        while pinned > 0 && recv.read_exact(&mut index).await.is_ok() {
            let pin = pins.get_mut(u32::from_le_bytes(index) as usize);
            if pin.and_then(Option::take).is_some() {
                pinned -= 1;
            }
        }
        std::io::Result::Ok(())
    }
    .await;
    drop(pins);
    let (peer, parts) = (peer.name(), request.parts.len());
    match result {
        Ok(()) => tracing::debug!(target: "streambatch::serve", peer, parts, "served"),
        Err(error) => {
            tracing::debug!(target: "streambatch::serve", peer, parts, %error, "fetch not completed")
        }
    }
}

/// Runs one call of the partition server on tokio's blocking pool: it may
/// restore a spilled partition from disk or encode one, which on the
/// node's async runtime would stall its actor sessions and keep-alives
/// (many reducers pulling spilled outputs would make the node look lost).
async fn off_runtime<T: Send + 'static>(
    server: &Arc<dyn PartitionServer>,
    call: impl FnOnce(&dyn PartitionServer) -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let server = server.clone();
    tokio::task::spawn_blocking(move || call(server.as_ref()))
        .await
        .unwrap_or_else(|e| Err(format!("serving it failed: {e}")))
}

/// Writes the answer for one partition, and its bytes. A partition served
/// by name comes back pinned: the caller holds the pin until the reader is
/// done with the bytes.
async fn answer(
    send: &mut SendStream,
    served: Result<Served, String>,
) -> std::io::Result<Option<Box<dyn std::any::Any + Send>>> {
    let (bytes, alone) = match served {
        Ok(Served::Shared(name, pin)) => {
            write_frame(send, &FetchReply::Shared { name }).await?;
            return Ok(Some(pin));
        }
        Err(message) => {
            write_frame(send, &FetchReply::Missing { message }).await?;
            return Ok(None);
        }
        Ok(Served::Bytes(bytes)) => (bytes, false),
        Ok(Served::Rows(bytes)) => (bytes, true),
    };
    let bytes = (*bytes).as_ref();
    let len = bytes.len() as u64;
    let reply = match alone {
        true => FetchReply::Rows { len },
        false => FetchReply::Bytes { len },
    };
    write_frame(send, &reply).await?;
    write_bytes(send, bytes).await?;
    Ok(None)
}
