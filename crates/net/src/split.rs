//! A rank of a streaming split served to another process: one
//! [`StreamKind::Split`] stream per rank and epoch, between the driver that
//! runs the job and the trainer process that reads its share.
//!
//! The trainer opens the stream with a [`SplitOpen`] and then asks for one
//! piece at a time ([`ToServer::Next`]); each ask also confirms that every
//! piece sent before it arrived. The server answers with a piece (its
//! shared-memory name on the same host, else its bytes), the end of the
//! epoch, or a failure. A piece mapped by name stays pinned on the server
//! until the trainer releases it ([`ToServer::Release`], sent when the last
//! buffer of the batch is dropped) or the stream ends. If the stream or the
//! connection breaks before the end, the server learns it
//! ([`ServedEpoch::lost`]) with the pieces it sent but never saw confirmed,
//! so that no row is lost with the trainer. The trainer also reports how
//! many batches its consumer got ([`ToServer::Batches`]), for the rank's
//! stats: it cuts them, so only it knows.
//!
//! Rows a cluster node holds are not forwarded: the server names the node
//! and the rows ([`ToTrainer::Fetch`]), and the trainer fetches them from
//! it with its own certificate (by shared memory on the node's host). A
//! trainer that cannot says so ([`ToServer::Unfetched`]); the server then
//! reads the rows itself and sends them, or, where the node is lost too,
//! sends the next piece (the job makes the lost rows again). A trainer
//! that has the rows says so at once ([`ToServer::Fetched`]).

use std::collections::HashMap;

use quinn::{RecvStream, SendStream};
use rkyv::{Archive, Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::endpoint::{Peer, StreamKind};
use crate::fetch::{Locality, MAX_PARTITION_BYTES, Served};
use crate::frame::{
    MAX_CONTROL_FRAME, ROOM_UP_FRONT, body_within, read_body, read_body_into, read_frame,
    write_bytes, write_frame,
};
use crate::{FrameError, NetError};

/// A trainer's first frame: which rank of which split, for which epoch.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SplitOpen {
    /// The split's id on the server (from its handle).
    pub service: u64,
    /// The rank.
    pub rank: u32,
    /// The epoch.
    pub epoch: u64,
    /// Where the trainer runs (same host and store: pieces by name).
    pub from: Locality,
}

pub use frames::{ToServer, ToTrainer};

// rkyv's derive makes enums of resolvers with undocumented fields.
#[allow(missing_docs)]
mod frames {
    use rkyv::{Archive, Deserialize, Serialize};

    /// What a trainer sends after [`SplitOpen`](super::SplitOpen).
    #[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
    pub enum ToServer {
        /// Every piece sent so far arrived; send the next.
        Next,
        /// The trainer no longer reads piece `piece` mapped by name.
        Release { piece: u64 },
        /// The trainer leaves the epoch before its end.
        Leave,
        /// The trainer's consumer got `total` batches of the epoch so far.
        Batches { total: u64 },
        /// The trainer could not fetch piece `piece` (a `Fetch`) from its
        /// node, as `reason` says: send it, or else the next.
        Unfetched { piece: u64, reason: String },
        /// The trainer has the rows of piece `piece` (a `Fetch`): they
        /// are delivered, before its next ask (which may come a training
        /// step later).
        Fetched { piece: u64 },
    }

    /// What the server sends a trainer.
    #[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
    pub enum ToTrainer {
        /// Map piece `piece` from shared memory under `name`.
        Shared { piece: u64, name: String },
        /// Piece `piece`: `len` bytes (an Arrow IPC stream) follow.
        Bytes { piece: u64, len: u64 },
        /// Piece `piece` is rows a node holds: fetch them from it.
        Fetch { piece: u64, from: super::FetchFrom },
        /// The rank has all it gets of the epoch.
        End,
        /// The epoch failed for this rank.
        Failed { message: String },
    }
}

/// Rows a cluster node holds, for a trainer to fetch from it.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct FetchFrom {
    /// The node's name: its certificate must say it.
    pub node: String,
    /// Where it listens.
    pub addr: String,
    /// Where its store is: a trainer on its host maps the rows.
    pub locality: Locality,
    /// The partition's id in its store.
    pub partition: u64,
    /// The partition's rows.
    pub partition_rows: u64,
    /// The rows wanted: the first, and how many.
    pub rows: crate::fetch::RowRange,
}

/// What the server hands a trainer next.
pub enum SplitItem {
    /// A piece it sends itself.
    Served(Served),
    /// Rows for the trainer to fetch from the node holding them.
    Fetch(FetchFrom),
}

/// A driver that serves splits to other processes implements this.
pub trait SplitServer: Send + Sync + 'static {
    /// Opens rank `rank`'s stream of epoch `epoch` of split `service` for
    /// the peer named `peer`, which runs at `from`; an error is sent to the
    /// trainer.
    fn open(
        &self,
        service: u64,
        rank: u32,
        epoch: u64,
        peer: (&str, &Locality),
    ) -> Result<Box<dyn ServedEpoch>, String>;
}

/// One rank's epoch, on the server.
pub trait ServedEpoch: Send + 'static {
    /// Blocks for the rank's next piece, served by name when
    /// `shares_memory` allows it; `None` at the end of its epoch.
    fn next(&mut self, shares_memory: bool) -> Option<Result<SplitItem, String>>;
    /// The trainer could not fetch the last piece, a [`SplitItem::Fetch`],
    /// as `reason` says: the rows read here and served, or `None` where
    /// they cannot be (the job makes them again).
    fn unfetched(&mut self, shares_memory: bool, reason: &str) -> Option<Result<Served, String>>;
    /// Every piece sent so far reached the trainer.
    fn confirmed(&mut self);
    /// The trainer left before the end of the epoch, as `reason` says
    /// (pieces sent but not confirmed did not reach it).
    fn lost(self: Box<Self>, reason: String);
    /// How long the trainer may go without a frame while it holds what it
    /// was sent before it counts as stalled.
    fn stall_limit(&self) -> std::time::Duration;
    /// The trainer, alive, asked for nothing within [`stall_limit`](ServedEpoch::stall_limit),
    /// as `reason` says: it leaves the epoch, and what it was sent but did
    /// not confirm is not given to another (it may still read it).
    fn stalled(self: Box<Self>, reason: String);
    /// Counts batches the trainer's consumer got (`n` more), for as long
    /// as the stream lives: reports may come after the epoch's end.
    fn batch_counter(&self) -> Box<dyn Fn(u64) + Send>;
}

/// Serves one split stream a trainer opened.
pub async fn serve_split(
    peer: &Peer,
    mut send: SendStream,
    mut recv: RecvStream,
    server: &dyn SplitServer,
    here: &Locality,
) {
    let open = match read_frame::<SplitOpen, _>(&mut recv, MAX_CONTROL_FRAME).await {
        Ok(Some(open)) => open,
        Ok(None) => return,
        Err(e) => return peer.refuse(&e),
    };
    let shares_memory = open.from == *here;
    // The rank's epoch until it has ended (or was lost).
    let trainer = (peer.name(), &open.from);
    let mut serving = match server.open(open.service, open.rank, open.epoch, trainer) {
        Ok(epoch) => Some(epoch),
        Err(message) => {
            let _ = write_frame(&mut send, &ToTrainer::Failed { message }).await;
            let _ = send.finish();
            return;
        }
    };
    let count_batches = serving.as_ref().map(|epoch| epoch.batch_counter());
    let mut batches_reported = 0u64;
    let lose = |serving: &mut Option<Box<dyn ServedEpoch>>, reason: String| {
        if let Some(epoch) = serving.take() {
            epoch.lost(reason);
        }
    };
    // Pins of the pieces the trainer maps, until it releases them.
    let mut pinned: HashMap<u64, Box<dyn std::any::Any + Send>> = HashMap::new();
    let mut next_piece = 0u64;
    // The last piece sent, when it is one to fetch (the only one a trainer
    // may say it could not fetch).
    let mut last_fetch: Option<u64> = None;
    loop {
        // A trainer holding rows (its epoch not ended) must ask again
        // within the stall limit.
        let limit = serving.as_ref().map(|epoch| epoch.stall_limit());
        let read = read_frame::<ToServer, _>(&mut recv, MAX_CONTROL_FRAME);
        let read = match limit {
            Some(limit) => match tokio::time::timeout(limit, read).await {
                Ok(read) => read,
                Err(_) => {
                    let message = format!(
                        "rank {} stalled: it asked for nothing for {} s while it held rows",
                        open.rank,
                        limit.as_secs()
                    );
                    if let Some(epoch) = serving.take() {
                        epoch.stalled(message.clone());
                    }
                    let _ = write_frame(&mut send, &ToTrainer::Failed { message }).await;
                    break;
                }
            },
            None => read.await,
        };
        let frame = match read {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                lose(&mut serving, "it closed its stream before the end".into());
                break;
            }
            Err(FrameError::Io(e)) => {
                lose(&mut serving, format!("its connection was lost: {e}"));
                break;
            }
            Err(e) => {
                peer.refuse(&e);
                lose(&mut serving, format!("it broke the protocol: {e}"));
                break;
            }
        };
        let (epoch, unfetched) = match frame {
            ToServer::Release { piece } => {
                pinned.remove(&piece);
                continue;
            }
            ToServer::Leave => {
                lose(&mut serving, "it left before the end".into());
                continue;
            }
            ToServer::Batches { total } => {
                // A running total: a count that goes back adds nothing.
                if let Some(count) = &count_batches
                    && total > batches_reported
                {
                    count(total - batches_reported);
                    batches_reported = total;
                }
                continue;
            }
            ToServer::Next => match serving.take() {
                Some(mut epoch) => {
                    epoch.confirmed();
                    (epoch, None)
                }
                None => continue, // ended: nothing more to send
            },
            ToServer::Unfetched { piece, reason } if last_fetch == Some(piece) => {
                match serving.take() {
                    Some(epoch) => (epoch, Some(reason)),
                    None => continue,
                }
            }
            ToServer::Fetched { piece } if last_fetch == Some(piece) => {
                last_fetch = None;
                if let Some(epoch) = serving.as_mut() {
                    epoch.confirmed();
                }
                continue;
            }
            ToServer::Unfetched { piece, .. } | ToServer::Fetched { piece } => {
                let problem = format!("piece {piece} was not one to fetch");
                peer.refuse(&FrameError::Malformed(problem.clone()));
                lose(&mut serving, format!("it broke the protocol: {problem}"));
                break;
            }
        };
        last_fetch = None;
        let pulled = tokio::task::spawn_blocking(move || {
            let mut epoch = epoch;
            let served = (unfetched.as_deref())
                .and_then(|reason| epoch.unfetched(shares_memory, reason))
                .map(|served| served.map(SplitItem::Served));
            let item = served.or_else(|| epoch.next(shares_memory));
            (epoch, item)
        })
        .await;
        let (epoch, item) = match pulled {
            Ok(pulled) => pulled,
            Err(e) => {
                // The pull panicked: its stream went with it (leaving).
                let message = format!("the split's server failed: {e}");
                let _ = write_frame(&mut send, &ToTrainer::Failed { message }).await;
                break;
            }
        };
        let piece = next_piece;
        next_piece += 1;
        let ended = !matches!(item, Some(Ok(_)));
        let sent = match item {
            Some(Ok(SplitItem::Served(Served::Shared(name, pin)))) => {
                pinned.insert(piece, pin);
                write_frame(&mut send, &ToTrainer::Shared { piece, name }).await
            }
            Some(Ok(SplitItem::Served(Served::Bytes(bytes) | Served::Rows(bytes)))) => {
                send_bytes(&mut send, piece, bytes).await
            }
            Some(Ok(SplitItem::Fetch(from))) => {
                last_fetch = Some(piece);
                write_frame(&mut send, &ToTrainer::Fetch { piece, from }).await
            }
            Some(Err(message)) => {
                // The epoch's rows the server had taken for this piece go
                // back to the others (the stream's own error, or this
                // piece that could not be served).
                epoch.lost(format!("its piece could not be served: {message}"));
                let _ = write_frame(&mut send, &ToTrainer::Failed { message }).await;
                break;
            }
            None => write_frame(&mut send, &ToTrainer::End).await,
        };
        serving = (!ended).then_some(epoch);
        if let Err(e) = sent {
            lose(&mut serving, format!("its connection was lost: {e}"));
            break;
        }
    }
    let _ = send.finish();
    drop(pinned);
}

/// Sends piece `piece` by its bytes: QUIC's flow control holds the writes
/// back while the trainer is slow.
async fn send_bytes(
    send: &mut SendStream,
    piece: u64,
    bytes: Box<dyn AsRef<[u8]> + Send>,
) -> std::io::Result<()> {
    let bytes = (*bytes).as_ref();
    let len = bytes.len() as u64;
    write_frame(send, &ToTrainer::Bytes { piece, len }).await?;
    write_bytes(send, bytes).await
}

/// What a trainer received; bytes land in a `B` of the trainer's choice
/// (aligned as its decoder needs).
pub enum Piece<B> {
    /// Map it from shared memory under this name; drop `release` once no
    /// buffer of it is read any more.
    Shared {
        /// The shared name.
        name: String,
        /// Tells the server the piece may go, when dropped.
        release: Release,
    },
    /// Its bytes (an Arrow IPC stream, to be validated).
    Bytes(B),
    /// Rows to fetch from the node that holds them; if that fails, say so
    /// with [`SplitReader::unfetched`].
    Fetch {
        /// The piece's number.
        piece: u64,
        /// Where the rows are.
        from: FetchFrom,
    },
}

/// Tells the server, when dropped, that the trainer no longer maps a piece.
pub struct Release {
    piece: u64,
    to_server: mpsc::UnboundedSender<ToServer>,
}

impl Drop for Release {
    fn drop(&mut self) {
        let _ = self.to_server.send(ToServer::Release { piece: self.piece });
    }
}

/// Reports to the server how many batches the trainer's consumer got
/// this epoch (see [`SplitReader::batch_reporter`]).
pub struct BatchReporter {
    to_server: mpsc::UnboundedSender<ToServer>,
    total: u64,
}

impl BatchReporter {
    /// The consumer got one more batch: the running total goes out.
    pub fn batch(&mut self) {
        self.total += 1;
        let _ = self.to_server.send(ToServer::Batches { total: self.total });
    }
}

/// The trainer's side of one rank's epoch.
pub struct SplitReader {
    peer: Peer,
    recv: RecvStream,
    to_server: mpsc::UnboundedSender<ToServer>,
    ended: bool,
    writer: Option<StreamWriter>,
}

/// The task writing a split stream's frames (see
/// [`SplitReader::take_writer`]).
pub struct StreamWriter {
    task: tokio::task::JoinHandle<()>,
    senders: mpsc::WeakUnboundedSender<ToServer>,
}

impl StreamWriter {
    /// Whether nothing can send on the stream any more (the reader, every
    /// release and reporter gone): the writer is finishing it, and ends
    /// once the server has acknowledged the last frame.
    pub fn is_finishing(&self) -> bool {
        self.senders.strong_count() == 0
    }

    /// Whether the writer has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the writer to end.
    pub async fn finished(self) {
        let _ = self.task.await;
    }
}

/// Opens rank `rank`'s stream of epoch `epoch` of split `service` on
/// `peer`; `here` says where the trainer runs. The server's answers wait
/// for the data: the epoch's barrier timeout (on the server) bounds them.
pub async fn open_split(
    peer: &Peer,
    service: u64,
    rank: u32,
    epoch: u64,
    here: &Locality,
) -> Result<SplitReader, NetError> {
    let (mut send, recv) = peer.open(StreamKind::Split).await?;
    let open = SplitOpen {
        service,
        rank,
        epoch,
        from: here.clone(),
    };
    write_frame(&mut send, &open)
        .await
        .map_err(|e| peer.broken(e))?;
    // One writer owns the sending half: asks from the reader, releases
    // from wherever a batch is dropped, batch counts. It finishes the
    // stream once the reader, every release and every reporter are gone,
    // and ends when the server has all it wrote.
    let (to_server, mut frames) = mpsc::unbounded_channel::<ToServer>();
    let senders = to_server.downgrade();
    let task = tokio::spawn(async move {
        while let Some(frame) = frames.recv().await {
            if write_frame(&mut send, &frame).await.is_err() {
                return;
            }
        }
        if send.finish().is_ok() {
            let _ = send.stopped().await;
        }
    });
    Ok(SplitReader {
        peer: peer.clone(),
        recv,
        to_server,
        ended: false,
        writer: Some(StreamWriter { task, senders }),
    })
}

impl SplitReader {
    /// Reports the batches the trainer cuts of this epoch's pieces; it
    /// keeps the stream open (so that the last report is sent) until
    /// dropped.
    pub fn batch_reporter(&self) -> BatchReporter {
        BatchReporter {
            to_server: self.to_server.clone(),
            total: 0,
        }
    }

    /// The task writing this stream's frames: it ends once every sender
    /// (the reader, releases, reporters) is gone and the server has
    /// acknowledged the last frame. A process that exits should wait for
    /// it (briefly), or its last batch count may not reach the server.
    pub fn take_writer(&mut self) -> Option<StreamWriter> {
        self.writer.take()
    }

    /// The next piece; `None` at the end of the epoch. A piece sent by its
    /// bytes is read into `alloc(len)`.
    pub async fn next<B: std::ops::DerefMut<Target = [u8]>>(
        &mut self,
        alloc: impl FnOnce(usize) -> B,
    ) -> Result<Option<Piece<B>>, NetError> {
        self.ask(ToServer::Next, alloc).await
    }

    /// Says that piece `piece`, a [`Piece::Fetch`], could not be fetched,
    /// as `reason` says; the server's answer: those rows sent by the
    /// server, or else the next piece.
    pub async fn unfetched<B: std::ops::DerefMut<Target = [u8]>>(
        &mut self,
        piece: u64,
        reason: String,
        alloc: impl FnOnce(usize) -> B,
    ) -> Result<Option<Piece<B>>, NetError> {
        self.ask(ToServer::Unfetched { piece, reason }, alloc).await
    }

    /// Says that the rows of piece `piece`, a [`Piece::Fetch`], arrived.
    pub fn fetched(&self, piece: u64) {
        let _ = self.to_server.send(ToServer::Fetched { piece });
    }

    async fn ask<B: std::ops::DerefMut<Target = [u8]>>(
        &mut self,
        ask: ToServer,
        alloc: impl FnOnce(usize) -> B,
    ) -> Result<Option<Piece<B>>, NetError> {
        if self.ended {
            return Ok(None);
        }
        let broken = |peer: &Peer, e| peer.broken(std::io::Error::other(e));
        self.to_server
            .send(ask)
            .map_err(|_| broken(&self.peer, "the split stream's writer stopped"))?;
        let frame_error = |source| NetError::Frame {
            peer: self.peer.name().to_string(),
            source,
        };
        let frame = read_frame::<ToTrainer, _>(&mut self.recv, MAX_CONTROL_FRAME)
            .await
            .map_err(frame_error)?
            .ok_or_else(|| {
                frame_error(FrameError::Truncated {
                    got: 0,
                    expected: 4,
                })
            })?;
        match frame {
            ToTrainer::Shared { piece, name } => Ok(Some(Piece::Shared {
                name,
                release: Release {
                    piece,
                    to_server: self.to_server.clone(),
                },
            })),
            ToTrainer::Fetch { piece, from } => Ok(Some(Piece::Fetch { piece, from })),
            ToTrainer::Bytes { len, .. } if len > MAX_PARTITION_BYTES => {
                Err(frame_error(FrameError::Oversized {
                    len,
                    max: MAX_PARTITION_BYTES,
                }))
            }
            ToTrainer::Bytes { len, .. } => {
                let within = body_within(len);
                let bytes = if len <= ROOM_UP_FRONT {
                    let mut bytes = alloc(len as usize);
                    read_body_into(&mut self.recv, &mut bytes, within)
                        .await
                        .map_err(frame_error)?;
                    bytes
                } else {
                    // Room grows with what arrives; the trainer's own
                    // buffer is made once all of it has.
                    let read = read_body(&mut self.recv, len, within)
                        .await
                        .map_err(frame_error)?;
                    let mut bytes = alloc(read.len());
                    bytes.copy_from_slice(&read);
                    bytes
                };
                Ok(Some(Piece::Bytes(bytes)))
            }
            ToTrainer::End => {
                self.ended = true;
                Ok(None)
            }
            ToTrainer::Failed { message } => {
                self.ended = true;
                Err(NetError::Split {
                    peer: self.peer.name().to_string(),
                    message,
                })
            }
        }
    }
}

impl Drop for SplitReader {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.to_server.send(ToServer::Leave);
        }
    }
}
