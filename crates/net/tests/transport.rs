//! Real QUIC between transports on 127.0.0.1: partitions fetched by bytes
//! and by shared name, strangers refused in the handshake, bad frames closing
//! only their own connection, and ractor_cluster's actors and membership
//! events over the same connections.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use ractor_cluster::{NodeEventSubscription, NodeServerMessage, RactorClusterMessage};
use streambatch_net::{
    Endpoint, Fetched, FetchedPart, Identity, Locality, NetError, PartRows, PartitionServer,
    RowRange, Served, TlsFiles, Transport, Want, close_code, init_cluster,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

/// Serves fixed partitions: by name to a peer on the same host and store
/// directory (counting the pins held), by bytes to others.
struct Fixed(HashMap<u64, Vec<u8>>, Arc<AtomicUsize>);

/// A pin on a partition served by name, counted while held.
struct Pin(Arc<AtomicUsize>);

impl Pin {
    fn new(pinned: &Arc<AtomicUsize>) -> Self {
        pinned.fetch_add(1, Ordering::SeqCst);
        Self(pinned.clone())
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl PartitionServer for Fixed {
    fn serve(&self, partition: u64, shares_memory: bool) -> Result<Served, String> {
        let bytes = self.0.get(&partition).ok_or("no such partition")?;
        Ok(if shares_memory {
            let pin = Box::new(Pin::new(&self.1));
            Served::Shared(format!("segment@0+{}", bytes.len()), pin)
        } else {
            Served::Bytes(Box::new(bytes.clone()))
        })
    }

    /// A byte per row: the rows asked for alone, to a peer that does not
    /// share memory.
    fn serve_rows(
        &self,
        partition: u64,
        rows: RowRange,
        shares_memory: bool,
    ) -> Result<Served, String> {
        let bytes = self.0.get(&partition).ok_or("no such partition")?;
        if shares_memory {
            return self.serve(partition, true);
        }
        let (at, len) = (rows.offset as usize, rows.len as usize);
        let rows = bytes.get(at..at + len).ok_or("no such rows")?;
        Ok(Served::Rows(Box::new(rows.to_vec())))
    }

    /// Kept cut into three groups of a million rows.
    fn group_rows(&self, partition: u64, group: u32) -> Result<RowRange, String> {
        self.0.get(&partition).ok_or("no such partition")?;
        match group {
            0..3 => Ok(RowRange {
                offset: u64::from(group) * 1_000_000,
                len: 1_000_000,
            }),
            _ => Err(format!("no group {group}")),
        }
    }

    fn cut(&self, partition: u64) -> Result<Vec<u32>, String> {
        self.0.get(&partition).ok_or("no such partition")?;
        Ok(vec![0, 1_000_000, 2_000_000, 3_000_000])
    }
}

fn identity(dir: &Path, name: &str) -> Identity {
    Identity::load(&TlsFiles::in_dir(dir, name)).unwrap()
}

async fn transport(dir: &Path, name: &str, store_dir: &str) -> Transport {
    counting_pins(dir, name, store_dir, Arc::default()).await
}

/// A transport whose partitions served by name count their pins in `pinned`.
async fn counting_pins(
    dir: &Path,
    name: &str,
    store_dir: &str,
    pinned: Arc<AtomicUsize>,
) -> Transport {
    let endpoint = Endpoint::bind("127.0.0.1:0".parse().unwrap(), &identity(dir, name)).unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let server = Arc::new(Fixed(HashMap::from([(7, data)]), pinned));
    let here = Locality::here(Path::new(store_dir));
    Transport::start(name, endpoint, server, here, None)
        .await
        .unwrap()
}

fn expected() -> Vec<u8> {
    (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetches_by_bytes_or_by_name_and_refuses_strangers() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    init_cluster(&tls, &["head", "worker-1", "worker-2"]).unwrap();
    let other = dir.path().join("other");
    init_cluster(&other, &["intruder"]).unwrap();

    let head = transport(&tls, "head", "/store/head").await;
    let worker = transport(&tls, "worker-1", "/store/worker").await;
    let peer = worker.join(head.local_addr()).await.unwrap();
    assert_eq!(peer.name(), "head");

    // Different store directories: the bytes travel over QUIC.
    let got = worker.fetch("head", 7).await.unwrap();
    assert_eq!(got, Fetched::Bytes(expected()));
    // The same host and directory: only the name travels.
    let sharing = transport(&tls, "worker-2", "/store/head").await;
    sharing.join(head.local_addr()).await.unwrap();
    match sharing.fetch("head", 7).await.unwrap() {
        Fetched::Shared(name, _lease) => assert_eq!(name, "segment@0+3000000"),
        _ => panic!("the same host and store directory: a name, not bytes"),
    }
    // Some rows: those alone over QUIC; by name where memory is shared.
    let rows = Some(RowRange {
        offset: 1_000,
        len: 20,
    });
    let got = worker.fetch_rows("head", 7, rows).await.unwrap();
    assert_eq!(got, Fetched::Rows(expected()[1_000..1_020].to_vec()));
    assert!(matches!(
        sharing.fetch_rows("head", 7, rows).await.unwrap(),
        Fetched::Shared(..)
    ));
    // A partition the holder lacks: an error naming both.
    let err = worker.fetch("head", 8).await.unwrap_err().to_string();
    assert!(
        err.contains("head") && err.contains('8') && err.contains("no such partition"),
        "{err}"
    );

    // A node with a certificate of another CA (which trusts the cluster's
    // CA, so that only the head's check can refuse it) and a client with no
    // certificate are refused in the handshake.
    let intruder = TlsFiles {
        ca: tls.join("ca.pem"),
        ..TlsFiles::in_dir(&other, "intruder")
    };
    let intruder = Identity::load(&intruder).unwrap();
    let config = intruder.client_config().unwrap();
    assert_refused(&tls, &head, config).await;
    let config = identity(&tls, "worker-1")
        .anonymous_client_config()
        .unwrap();
    assert_refused(&tls, &head, config).await;
    // The cluster keeps running.
    assert_eq!(
        worker.fetch("head", 7).await.unwrap(),
        Fetched::Bytes(expected())
    );
    for t in [head, worker, sharing] {
        t.stop();
    }
}

/// Several partitions of one holder on one stream: each answered in the
/// order asked, by bytes, by rows alone, or by name where memory is
/// shared; a group's rows named by the holder, a partition's cut sent
/// before it; a partition or group the holder lacks fails the fetch,
/// naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetches_many_partitions_of_a_holder_on_one_stream() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    init_cluster(&tls, &["head", "worker-1", "worker-2"]).unwrap();
    let pinned = Arc::new(AtomicUsize::new(0));
    let head = counting_pins(&tls, "head", "/store/head", pinned.clone()).await;
    let worker = transport(&tls, "worker-1", "/store/worker").await;
    worker.join(head.local_addr()).await.unwrap();
    let rows = |offset, len| Some(RowRange { offset, len });
    let want = |want| PartRows { partition: 7, want };
    let asked = [
        want(Want::Rows(RowRange { offset: 5, len: 3 })),
        want(Want::Whole),
        want(Want::Group(1)),
        want(Want::Rows(RowRange {
            offset: 2_999_990,
            len: 10,
        })),
        want(Want::WithCut),
    ];
    let got = worker.fetch_many("head", &asked).await.unwrap();
    let part = |fetched, rows| FetchedPart {
        fetched,
        rows,
        cut: None,
    };
    assert_eq!(
        got,
        [
            part(Fetched::Rows(expected()[5..8].to_vec()), rows(5, 3)),
            part(Fetched::Bytes(expected()), None),
            part(
                Fetched::Rows(expected()[1_000_000..2_000_000].to_vec()),
                rows(1_000_000, 1_000_000)
            ),
            part(
                Fetched::Rows(expected()[2_999_990..].to_vec()),
                rows(2_999_990, 10)
            ),
            FetchedPart {
                cut: Some(vec![0, 1_000_000, 2_000_000, 3_000_000]),
                ..part(Fetched::Bytes(expected()), None)
            },
        ]
    );
    let sharing = transport(&tls, "worker-2", "/store/head").await;
    sharing.join(head.local_addr()).await.unwrap();
    let mut got = sharing.fetch_many("head", &asked[1..3]).await.unwrap();
    assert!(
        got.iter().all(|f| matches!(f.fetched, Fetched::Shared(..))),
        "{got:?}"
    );
    assert_eq!(
        got[1].rows,
        rows(1_000_000, 1_000_000),
        "a group's rows named"
    );
    // Each name holds its own pin: dropping one lets that one go.
    assert_eq!(pinned.load(Ordering::SeqCst), 2);
    got.pop();
    settles(&pinned, 1).await;
    drop(got);
    settles(&pinned, 0).await;
    for (lacks, why) in [
        (
            PartRows {
                partition: 8,
                want: Want::Whole,
            },
            "no such partition",
        ),
        (want(Want::Group(3)), "no group 3"),
    ] {
        let mut lacking = asked.to_vec();
        lacking.insert(1, lacks);
        let err = worker
            .fetch_many("head", &lacking)
            .await
            .unwrap_err()
            .to_string();
        let partition = lacks.partition.to_string();
        assert!(
            err.contains("head") && err.contains(&partition) && err.contains(why),
            "{err}"
        );
    }
    // The connection serves on.
    assert_eq!(
        worker.fetch_many("head", &asked[1..2]).await.unwrap(),
        [part(Fetched::Bytes(expected()), None)]
    );
    for t in [head, worker, sharing] {
        t.stop();
    }
}

/// Waits (at most 5 s) for `pinned` to come to `count`.
async fn settles(pinned: &AtomicUsize, count: usize) {
    for _ in 0..500 {
        if pinned.load(Ordering::SeqCst) == count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(pinned.load(Ordering::SeqCst), count, "pins held");
}

/// Connects to `head` with `config` and checks that the head refuses.
async fn assert_refused(tls: &Path, head: &Transport, config: quinn::ClientConfig) {
    let dialer =
        Endpoint::bind("127.0.0.1:0".parse().unwrap(), &identity(tls, "worker-2")).unwrap();
    match dialer.connect_with(head.local_addr(), config).await {
        Err(NetError::Connect { .. }) => {}
        Err(other) => panic!("unexpected error: {other}"),
        // TLS 1.3: the client may finish its side before the server has
        // checked its certificate; the server then closes at once, and no
        // stream gets through.
        Ok(peer) => {
            let reason = tokio::time::timeout(Duration::from_secs(5), peer.connection().closed())
                .await
                .expect("the head must close a connection it refused");
            assert!(
                reason.to_string().contains("certificate") || reason.to_string().contains("alert"),
                "{reason}"
            );
        }
    }
}

/// Sends `bytes` on a fetch stream of a fresh, legitimate connection and
/// returns how the head closed that connection.
async fn send_raw(tls: &Path, head: &Transport, bytes: &[u8]) -> quinn::ConnectionError {
    let endpoint =
        Endpoint::bind("127.0.0.1:0".parse().unwrap(), &identity(tls, "worker-2")).unwrap();
    let peer = endpoint.connect(head.local_addr()).await.unwrap();
    let (mut send, _recv) = peer.connection().open_bi().await.unwrap();
    send.write_all(bytes).await.unwrap();
    send.flush().await.unwrap();
    let _ = send.finish();
    tokio::time::timeout(Duration::from_secs(5), peer.connection().closed())
        .await
        .expect("the head must close a connection that sends a bad frame")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_frame_closes_its_connection_only() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    init_cluster(&tls, &["head", "worker-1", "worker-2"]).unwrap();
    let head = transport(&tls, "head", "/store/head").await;
    let worker = transport(&tls, "worker-1", "/store/worker").await;
    worker.join(head.local_addr()).await.unwrap();

    let oversized = [b"F".as_slice(), &u32::MAX.to_le_bytes()].concat();
    let truncated = [b"F".as_slice(), &100u32.to_le_bytes(), &[1, 2, 3]].concat();
    let malformed = [b"F".as_slice(), &8u32.to_le_bytes(), &[0xff; 8]].concat();
    let unknown_kind = b"Zhello".to_vec();
    for (what, bytes) in [
        ("stream ended before its kind byte", Vec::new()),
        ("oversized", oversized),
        ("truncated", truncated),
        ("malformed", malformed),
        ("unknown stream kind", unknown_kind),
    ] {
        let reason = send_raw(&tls, &head, &bytes).await;
        match reason {
            quinn::ConnectionError::ApplicationClosed(close) => {
                assert_eq!(
                    close.error_code,
                    quinn::VarInt::from_u32(close_code::PROTOCOL),
                    "{what}"
                );
            }
            other => panic!("{what}: closed with {other}"),
        }
        // The worker's own connection still serves it.
        assert_eq!(
            worker.fetch("head", 7).await.unwrap(),
            Fetched::Bytes(expected()),
            "after a {what} frame"
        );
    }
    // Garbage on the actor protocol's stream: ractor_cluster ends that
    // session (it closes the stream), and nothing else.
    let endpoint =
        Endpoint::bind("127.0.0.1:0".parse().unwrap(), &identity(&tls, "worker-2")).unwrap();
    let peer = endpoint.connect(head.local_addr()).await.unwrap();
    let (mut send, mut recv) = peer
        .open(streambatch_net::StreamKind::Cluster)
        .await
        .unwrap();
    send.write_all(&[0xff; 64]).await.unwrap();
    send.flush().await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), recv.read_to_end(1 << 20)).await;
    assert!(
        ended.is_ok(),
        "the head must end a session that sends garbage"
    );
    assert_eq!(
        worker.fetch("head", 7).await.unwrap(),
        Fetched::Bytes(expected()),
        "after garbage on a cluster stream"
    );
    head.stop();
    worker.stop();
}

/// A message a remote node can send: a cast and nothing else.
#[derive(RactorClusterMessage)]
enum Greeting {
    Hello(String),
}

struct Greeter;

impl Actor for Greeter {
    type Msg = Greeting;
    type State = mpsc::UnboundedSender<String>;
    type Arguments = mpsc::UnboundedSender<String>;

    async fn pre_start(
        &self,
        _: ActorRef<Greeting>,
        tx: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(tx)
    }

    async fn handle(
        &self,
        _: ActorRef<Greeting>,
        Greeting::Hello(text): Greeting,
        tx: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _ = tx.send(text);
        Ok(())
    }
}

struct Membership(mpsc::UnboundedSender<(&'static str, String)>);

impl NodeEventSubscription for Membership {
    fn node_session_opened(&self, _: ractor_cluster::node::NodeServerSessionInformation) {}

    fn node_session_disconnected(&self, ses: ractor_cluster::node::NodeServerSessionInformation) {
        let _ = self.0.send(("down", ses.peer_addr));
    }

    fn node_session_authenticated(&self, ses: ractor_cluster::node::NodeServerSessionInformation) {
        let _ = self.0.send(("up", ses.peer_addr));
    }
}

/// The sessions `transport` sees come up and go down, with the peer's name.
fn membership(transport: &Transport) -> mpsc::UnboundedReceiver<(&'static str, String)> {
    let (tx, rx) = mpsc::unbounded_channel();
    transport
        .node_server()
        .cast(NodeServerMessage::SubscribeToEvents {
            id: "test".into(),
            subscription: Box::new(Membership(tx)),
        })
        .unwrap();
    rx
}

async fn wait<T>(what: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), what)
        .await
        .expect("timed out")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actors_talk_across_nodes_and_a_lost_node_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    init_cluster(&tls, &["head", "worker-1"]).unwrap();
    let head = transport(&tls, "head", "/store/head").await;
    let mut events = membership(&head);

    let worker = transport(&tls, "worker-1", "/store/worker").await;
    let (tx, mut greetings) = mpsc::unbounded_channel();
    let (greeter, _) = Actor::spawn(None, Greeter, tx).await.unwrap();
    let group = "greeters".to_string();
    ractor::pg::join(group.clone(), vec![greeter.get_cell()]);
    worker.join(head.local_addr()).await.unwrap();

    let (event, peer) = wait(events.recv()).await.unwrap();
    assert_eq!((event, peer.as_str()), ("up", "worker-1"));
    // The head sees the worker's actor in the group and sends it a message
    // over QUIC.
    let remote = wait(async {
        loop {
            let members = ractor::pg::get_members(&group);
            if let Some(cell) = members.into_iter().find(|c| !c.get_id().is_local()) {
                break cell;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    ActorRef::<Greeting>::from(remote)
        .cast(Greeting::Hello("over quic".into()))
        .unwrap();
    assert_eq!(wait(greetings.recv()).await.unwrap(), "over quic");

    // The worker goes away: the head hears of it.
    worker.stop();
    let (event, peer) = wait(events.recv()).await.unwrap();
    assert_eq!((event, peer.as_str()), ("down", "worker-1"));
    head.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_under_another_name_than_its_certificate_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    init_cluster(&tls, &["head", "worker-1"]).unwrap();
    let head = transport(&tls, "head", "/store/head").await;
    let mut events = membership(&head);

    // worker-1's certificate, declaring itself "mallory" in the actor protocol.
    let endpoint =
        Endpoint::bind("127.0.0.1:0".parse().unwrap(), &identity(&tls, "worker-1")).unwrap();
    let server = Arc::new(Fixed(HashMap::new(), Arc::default()));
    let here = Locality::here(Path::new("/store/mallory"));
    let mallory = Transport::start("mallory", endpoint, server, here, None)
        .await
        .unwrap();
    mallory.join(head.local_addr()).await.unwrap();
    let mut seen = Vec::new();
    while !seen.contains(&("down", "worker-1".to_string())) {
        seen.push(wait(events.recv()).await.unwrap());
    }
    mallory.stop();

    // Under its own name the same certificate keeps its session.
    let worker = transport(&tls, "worker-1", "/store/worker").await;
    worker.join(head.local_addr()).await.unwrap();
    loop {
        let (event, peer) = wait(events.recv()).await.unwrap();
        if event == "up" {
            assert_eq!(peer, "worker-1");
            break;
        }
    }
    let later = tokio::time::timeout(Duration::from_millis(500), events.recv()).await;
    assert!(later.is_err(), "the session ended: {later:?}");
    worker.stop();
    head.stop();
}

/// The peers `transport` loses: their last session ended.
fn losses(transport: &Transport) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    transport.on_peer_lost(move |peer: &str| {
        let _ = tx.send(peer.to_string());
    });
    rx
}

/// The peer of the next session torn down.
async fn next_down(events: &mut mpsc::UnboundedReceiver<(&'static str, String)>) -> String {
    wait(async {
        loop {
            if let ("down", peer) = events.recv().await.unwrap() {
                break peer;
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_session_torn_down_is_not_the_loss_of_its_node() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    init_cluster(&tls, &["head", "worker-1"]).unwrap();
    let head = transport(&tls, "head", "/store/head").await;
    let mut events = membership(&head);
    let mut lost = losses(&head);
    let worker = transport(&tls, "worker-1", "/store/worker").await;
    worker.join(head.local_addr()).await.unwrap();
    assert_eq!(
        wait(events.recv()).await.unwrap(),
        ("up", "worker-1".into())
    );
    // The worker dials again (as after a reconnect, or both sides dialling):
    // the session election keeps one session and tears the other down.
    worker.join(head.local_addr()).await.unwrap();
    let torn_down = next_down(&mut events).await;
    assert_eq!(torn_down, "worker-1");
    // A session to the worker lives on, and the worker was not lost.
    let sessions = ractor::call_t!(head.node_server(), NodeServerMessage::GetSessions, 1_000);
    assert_eq!(
        sessions.unwrap().len(),
        1,
        "one session to worker-1 remains"
    );
    assert!(
        lost.try_recv().is_err(),
        "a duplicate's teardown counted as a loss"
    );
    // The worker goes away: now it is lost, once.
    worker.stop();
    assert_eq!(wait(lost.recv()).await.unwrap(), "worker-1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(lost.try_recv().is_err(), "one loss per node");
    head.stop();
}

/// A listener added after a peer's session opened (a node's agent starts
/// after its transport accepts peers) still tells a duplicate's teardown
/// from the peer's loss: sessions are counted from the transport's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_added_late_counts_the_sessions_opened_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    init_cluster(&tls, &["head", "worker-1"]).unwrap();
    let head = transport(&tls, "head", "/store/head").await;
    let mut events = membership(&head);
    let worker = transport(&tls, "worker-1", "/store/worker").await;
    worker.join(head.local_addr()).await.unwrap();
    assert_eq!(
        wait(events.recv()).await.unwrap(),
        ("up", "worker-1".into())
    );
    let mut lost = losses(&head);
    worker.join(head.local_addr()).await.unwrap();
    let torn_down = next_down(&mut events).await;
    assert_eq!(torn_down, "worker-1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        lost.try_recv().is_err(),
        "a duplicate's teardown counted as a loss"
    );
    worker.stop();
    assert_eq!(wait(lost.recv()).await.unwrap(), "worker-1");
    head.stop();
}

/// Serves a partition only after blocking its thread for a while, as a
/// restore of a spilled partition from a slow disk does.
struct SlowDisk(Duration);

impl PartitionServer for SlowDisk {
    fn serve(&self, _: u64, _: bool) -> Result<Served, String> {
        std::thread::sleep(self.0);
        Ok(Served::Bytes(Box::new(expected())))
    }
}

/// A holder on a one-thread runtime (a node's small async runtime) serving
/// partitions whose restore blocks for twice the peer timeout each: its
/// keep-alives and actor sessions go on, so the puller gets every
/// partition and never counts the holder lost. Served on the runtime, the
/// restores stalled it and the connection timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_restores_do_not_make_a_holder_look_lost() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    init_cluster(&tls, &["head", "worker-1"]).unwrap();
    let timeout = Duration::from_millis(400);
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let holder_tls = tls.clone();
    let holder = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let endpoint = Endpoint::bind_with_timeout(
                "127.0.0.1:0".parse().unwrap(),
                &identity(&holder_tls, "head"),
                timeout,
            )
            .unwrap();
            let server = Arc::new(SlowDisk(timeout * 2));
            let here = Locality::here(Path::new("/store/head"));
            let head = Transport::start("head", endpoint, server, here, None)
                .await
                .unwrap();
            addr_tx.send(head.local_addr()).unwrap();
            let _ = stop_rx.await;
            head.stop();
        });
    });
    let endpoint = Endpoint::bind_with_timeout(
        "127.0.0.1:0".parse().unwrap(),
        &identity(&tls, "worker-1"),
        timeout,
    )
    .unwrap();
    let here = Locality::here(Path::new("/store/worker"));
    let worker = Transport::start(
        "worker-1",
        endpoint,
        Arc::new(SlowDisk(timeout)),
        here,
        None,
    )
    .await
    .unwrap();
    let mut lost = losses(&worker);
    worker.join(addr_rx.recv().unwrap()).await.unwrap();
    let fetches = tokio::join!(
        worker.fetch("head", 7),
        worker.fetch("head", 7),
        worker.fetch("head", 7),
        worker.fetch("head", 7)
    );
    for got in [fetches.0, fetches.1, fetches.2, fetches.3] {
        assert_eq!(got.unwrap(), Fetched::Bytes(expected()));
    }
    assert!(lost.try_recv().is_err(), "the holder was counted lost");
    stop_tx.send(()).unwrap();
    holder.join().unwrap();
    worker.stop();
}
