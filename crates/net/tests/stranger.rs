//! A local process without the cluster's key material tries ractor_cluster's
//! loopback TCP listener as an outsider would: a stock ractor_cluster client
//! with the old fixed cookie, under a new name and under a member's. It must
//! not get an actor session at all, and the members' sessions must live on.
//!
//! Its own test binary: the listener is found among this process's sockets,
//! so no other test's transports may be running beside it.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::Actor;
use ractor_cluster::node::NodeServerSessionInformation;
use ractor_cluster::{NodeEventSubscription, NodeServer, NodeServerMessage};
use streambatch_net::{
    Endpoint, Identity, Locality, PartitionServer, Served, TlsFiles, Transport, init_cluster,
};

struct Nothing;

impl PartitionServer for Nothing {
    fn serve(&self, _: u64, _: bool) -> Result<Served, String> {
        Err("no partitions here".into())
    }
}

/// What a transport's NodeServer reported, by event.
#[derive(Default)]
struct Seen {
    opened: Vec<String>,
    authenticated: Vec<String>,
}

struct Recorder(Arc<Mutex<Seen>>);

impl NodeEventSubscription for Recorder {
    fn node_session_opened(&self, s: NodeServerSessionInformation) {
        self.0.lock().unwrap().opened.push(s.peer_addr);
    }

    fn node_session_disconnected(&self, _: NodeServerSessionInformation) {}

    fn node_session_authenticated(&self, s: NodeServerSessionInformation) {
        self.0.lock().unwrap().authenticated.push(s.peer_addr);
    }
}

async fn transport(dir: &Path, name: &str) -> Transport {
    let identity = Identity::load(&TlsFiles::in_dir(dir, name)).unwrap();
    let endpoint = Endpoint::bind("127.0.0.1:0".parse().unwrap(), &identity).unwrap();
    let here = Locality::here(Path::new("/store"));
    Transport::start(name, endpoint, Arc::new(Nothing), here, None)
        .await
        .unwrap()
}

fn record(transport: &Transport) -> Arc<Mutex<Seen>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    transport
        .node_server()
        .cast(NodeServerMessage::SubscribeToEvents {
            id: "stranger-test".into(),
            subscription: Box::new(Recorder(seen.clone())),
        })
        .unwrap();
    seen
}

/// The loopback TCP ports this process listens on: ractor_cluster's
/// listeners, the port an outsider reads from /proc/net/tcp.
fn listening_ports() -> Vec<SocketAddr> {
    let ours: HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            Some(
                link.strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, state, inode) = (f[1], f[3], f[9]);
            (state == "0A" && ours.contains(inode)).then_some(local)
        })
        .map(|local| {
            let (_, port) = local.split_once(':').unwrap();
            let port = u16::from_str_radix(port, 16).unwrap();
            SocketAddr::from(([127, 0, 0, 1], port))
        })
        .collect()
}

/// Connects to `addr` as `name` with ractor_cluster's own client and the
/// cookie streambatch used to hard-code, and waits until its session ends
/// (or 10 s pass). Returns whether that client ever saw its session
/// authenticated.
async fn try_as(name: &str, addr: SocketAddr) -> bool {
    let server = NodeServer::new(
        0,
        "streambatch".into(),
        name.into(),
        "localhost".into(),
        None,
        None,
    )
    .with_listen_addr(std::net::Ipv4Addr::LOCALHOST.into());
    let (intruder, handle) = Actor::spawn(None, server, ()).await.unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    intruder
        .cast(NodeServerMessage::SubscribeToEvents {
            id: "intruder".into(),
            subscription: Box::new(Recorder(seen.clone())),
        })
        .unwrap();
    ractor_cluster::client_connect(&intruder, addr)
        .await
        .unwrap();
    for _ in 0..100 {
        let sessions = ractor::call_t!(intruder, NodeServerMessage::GetSessions, 1_000).unwrap();
        if sessions.is_empty() && !seen.lock().unwrap().opened.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    intruder.stop(None);
    handle.await.unwrap();
    !seen.lock().unwrap().authenticated.is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_on_the_loopback_listener_gets_no_session() {
    let dir = tempfile::tempdir().unwrap();
    init_cluster(dir.path(), &["head", "worker-1"]).unwrap();
    let head = transport(dir.path(), "head").await;
    let worker = transport(dir.path(), "worker-1").await;
    let on_head = record(&head);
    let on_worker = record(&worker);
    worker.join(head.local_addr()).await.unwrap();
    // The member's session comes up over QUIC.
    for _ in 0..100 {
        if !on_head.lock().unwrap().authenticated.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(on_head.lock().unwrap().authenticated, ["worker-1"]);

    let ports = listening_ports();
    assert_eq!(
        ports.len(),
        2,
        "one loopback listener per transport: {ports:?}"
    );
    for addr in ports {
        for name in ["intruder", "worker-1", "head"] {
            let authenticated = try_as(name, addr).await;
            assert!(
                !authenticated,
                "{name} at {addr}: the stranger authenticated"
            );
        }
    }
    for (node, seen, member) in [
        ("head", &on_head, "worker-1"),
        ("worker-1", &on_worker, "head"),
    ] {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.opened, [member], "{node}: a stranger opened a session");
        assert_eq!(
            seen.authenticated,
            [member],
            "{node}: a stranger authenticated"
        );
    }
    // Nothing lost: the member's session is still there on both sides.
    let sessions = ractor::call_t!(head.node_server(), NodeServerMessage::GetSessions, 1_000);
    assert_eq!(
        sessions.unwrap().len(),
        1,
        "head keeps the member's session"
    );
    let sessions = ractor::call_t!(worker.node_server(), NodeServerMessage::GetSessions, 1_000);
    assert_eq!(
        sessions.unwrap().len(),
        1,
        "the member keeps its session to head"
    );
    head.stop();
    worker.stop();
}
