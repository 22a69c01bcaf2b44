//! The split stream between a driver and a trainer, over real QUIC on
//! 127.0.0.1: rows a node holds go as where to fetch them; the trainer
//! says at once that it has them, or that it could not fetch them (then
//! the driver sends them itself); a trainer that says so of a piece that
//! was not one to fetch breaks the protocol, loses its connection, and its
//! epoch is lost.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use streambatch_net::split::{
    FetchFrom, Piece, ServedEpoch, SplitItem, SplitServer, open_split, serve_split,
};
use streambatch_net::{
    Endpoint, Identity, Locality, Peer, RowRange, Served, StreamKind, TlsFiles, handshake,
    init_cluster,
};

/// What the driver's side saw, in order.
type Log = Arc<Mutex<Vec<String>>>;

/// Serves one epoch: a piece to fetch, then the end; a trainer holding it
/// stalls after the time given.
struct OneFetch(Log, Duration);

fn from() -> FetchFrom {
    FetchFrom {
        node: "worker-1".into(),
        addr: "127.0.0.1:9".into(),
        locality: Locality {
            host: "a-host".into(),
            store_dir: "/store".into(),
        },
        partition: 7,
        partition_rows: 100,
        rows: RowRange {
            offset: 10,
            len: 20,
        },
    }
}

impl SplitServer for OneFetch {
    fn open(
        &self,
        _: u64,
        _: u32,
        _: u64,
        _: (&str, &Locality),
    ) -> Result<Box<dyn ServedEpoch>, String> {
        Ok(Box::new(Epoch {
            log: self.0.clone(),
            sent: false,
            stall: self.1,
        }))
    }
}

struct Epoch {
    log: Log,
    sent: bool,
    stall: Duration,
}

impl Epoch {
    fn note(&self, what: String) {
        self.log.lock().unwrap().push(what);
    }
}

impl ServedEpoch for Epoch {
    fn next(&mut self, _: bool) -> Option<Result<SplitItem, String>> {
        if std::mem::replace(&mut self.sent, true) {
            return None;
        }
        Some(Ok(SplitItem::Fetch(from())))
    }

    fn unfetched(&mut self, _: bool, reason: &str) -> Option<Result<Served, String>> {
        self.note(format!("unfetched: {reason}"));
        Some(Ok(Served::Bytes(Box::new(b"rows".to_vec()))))
    }

    fn confirmed(&mut self) {
        self.note("confirmed".into());
    }

    fn lost(self: Box<Self>, reason: String) {
        self.note(format!("lost: {reason}"));
    }

    fn stall_limit(&self) -> Duration {
        self.stall
    }

    fn stalled(self: Box<Self>, reason: String) {
        self.note(format!("stalled: {reason}"));
    }

    fn batch_counter(&self) -> Box<dyn Fn(u64) + Send> {
        Box::new(|_| {})
    }
}

/// A driver serving [`OneFetch`] and a trainer connected to it.
async fn connected() -> (Peer, Log, tempfile::TempDir) {
    connected_stalling_after(Duration::from_secs(600)).await
}

/// [`connected`], a trainer stalled once it held its piece for `stall`.
async fn connected_stalling_after(stall: Duration) -> (Peer, Log, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    init_cluster(dir.path(), &["driver", "trainer"]).unwrap();
    let identity = |name| Identity::load(&TlsFiles::in_dir(dir.path(), name)).unwrap();
    let driver = Endpoint::bind("127.0.0.1:0".parse().unwrap(), &identity("driver")).unwrap();
    let log = Log::default();
    let server = Arc::new(OneFetch(log.clone(), stall));
    let serving = driver.clone();
    tokio::spawn(async move {
        while let Some(incoming) = serving.incoming().await {
            let Some(peer) = handshake(incoming).await else {
                continue;
            };
            let server = server.clone();
            tokio::spawn(async move {
                while let Some((kind, send, recv)) = peer.accept().await {
                    assert_eq!(kind, StreamKind::Split);
                    let here = Locality::here(std::path::Path::new("/dev/shm"));
                    serve_split(&peer, send, recv, server.as_ref(), &here).await;
                }
            });
        }
    });
    let trainer = Endpoint::bind("127.0.0.1:0".parse().unwrap(), &identity("trainer")).unwrap();
    let peer = trainer.connect(driver.local_addr()).await.unwrap();
    (peer, log, dir)
}

fn here() -> Locality {
    Locality {
        host: "elsewhere".into(),
        store_dir: "/dev/shm".into(),
    }
}

/// Waits until the driver's side noted `what`.
async fn noted(log: &Log, what: &str) -> Vec<String> {
    noted_times(log, what, 1).await
}

/// Waits until the driver's side noted `what` `times` times.
async fn noted_times(log: &Log, what: &str, times: usize) -> Vec<String> {
    for _ in 0..200 {
        let seen = log.lock().unwrap().clone();
        if seen.iter().filter(|s| s.starts_with(what)).count() >= times {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the driver never noted {what}: {:?}", log.lock().unwrap());
}

#[tokio::test]
async fn a_fetched_piece_is_confirmed_before_the_next_ask() {
    let (peer, log, _dir) = connected().await;
    let mut reader = open_split(&peer, 1, 0, 0, &here()).await.unwrap();
    let Some(Piece::Fetch { piece, from: got }) = reader.next(|n| vec![0; n]).await.unwrap() else {
        panic!("not a piece to fetch");
    };
    assert_eq!(got, from());
    // The ask for it confirmed what came before (nothing); saying the rows
    // arrived confirms them, before any other ask.
    noted_times(&log, "confirmed", 1).await;
    reader.fetched(piece);
    let seen = noted_times(&log, "confirmed", 2).await;
    assert_eq!(seen, ["confirmed", "confirmed"]);
    assert!(
        reader.next(|n| vec![0; n]).await.unwrap().is_none(),
        "the end"
    );
}

#[tokio::test]
async fn an_unfetched_piece_is_sent_by_the_driver() {
    let (peer, log, _dir) = connected().await;
    let mut reader = open_split(&peer, 1, 0, 0, &here()).await.unwrap();
    let Some(Piece::Fetch { piece, .. }) = reader.next(|n| vec![0; n]).await.unwrap() else {
        panic!("not a piece to fetch");
    };
    let sent = reader
        .unfetched(piece, "node unreachable".into(), |n| vec![0; n])
        .await
        .unwrap();
    let Some(Piece::Bytes(bytes)) = sent else {
        panic!("the driver did not send the rows");
    };
    assert_eq!(bytes, b"rows");
    noted(&log, "unfetched: node unreachable").await;
}

#[tokio::test]
async fn saying_unfetched_of_another_piece_breaks_the_protocol() {
    let (peer, log, _dir) = connected().await;
    let mut reader = open_split(&peer, 1, 0, 0, &here()).await.unwrap();
    let Some(Piece::Fetch { piece, .. }) = reader.next(|n| vec![0; n]).await.unwrap() else {
        panic!("not a piece to fetch");
    };
    let answer = reader
        .unfetched(piece + 5, "made up".into(), |n| vec![0; n])
        .await;
    assert!(answer.is_err(), "answered a broken ask");
    let seen = noted(&log, "lost").await;
    assert!(
        seen.iter().any(|s| s.contains("broke the protocol")),
        "{seen:?}"
    );
    assert!(!seen.iter().any(|s| s.starts_with("unfetched")), "{seen:?}");
}

#[tokio::test]
async fn saying_fetched_twice_breaks_the_protocol() {
    let (peer, log, _dir) = connected().await;
    let mut reader = open_split(&peer, 1, 0, 0, &here()).await.unwrap();
    let Some(Piece::Fetch { piece, .. }) = reader.next(|n| vec![0; n]).await.unwrap() else {
        panic!("not a piece to fetch");
    };
    reader.fetched(piece);
    reader.fetched(piece); // confirmed already: no longer one to fetch
    let seen = noted(&log, "lost").await;
    assert!(
        seen.iter().any(|s| s.contains("broke the protocol")),
        "{seen:?}"
    );
    assert!(reader.next(|n| vec![0; n]).await.is_err(), "answered after");
}

/// A trainer that holds its piece and asks for nothing more (alive, stuck)
/// is declared stalled at the limit: the driver's side hears it (and gives
/// its rows to the others), and the trainer's next ask gets an error
/// naming the stall instead of rows.
#[tokio::test]
async fn a_trainer_that_stops_asking_is_stalled_at_the_limit() {
    let (peer, log, _dir) = connected_stalling_after(Duration::from_millis(300)).await;
    let mut reader = open_split(&peer, 1, 0, 0, &here()).await.unwrap();
    let Some(Piece::Fetch { .. }) = reader.next(|n| vec![0; n]).await.unwrap() else {
        panic!("not a piece to fetch");
    };
    let seen = noted(&log, "stalled").await;
    assert!(
        seen.iter().any(|s| s.contains("asked for nothing")),
        "{seen:?}"
    );
    assert!(!seen.iter().any(|s| s.starts_with("lost")), "{seen:?}");
    let err = reader
        .next(|n| vec![0; n])
        .await
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e.contains("stalled")),
        "{err:?}"
    );
}
