//! Trainer processes for the tests of a split's Arrow Flight service: a
//! Python with pyarrow (`SB_PYTHON`, else `python3`; `.ci/run` makes one)
//! running `tests/flight/trainer.py`, which reads one rank and may be
//! killed or stall on purpose, then prints what it read.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/flight/trainer.py");

/// A Python that has pyarrow, if there is one.
pub fn pyarrow_python() -> Option<String> {
    let python = std::env::var("SB_PYTHON").unwrap_or_else(|_| "python3".into());
    let found = Command::new(&python)
        .args(["-c", "import pyarrow.flight"])
        .output()
        .is_ok_and(|o| o.status.success());
    found.then_some(python)
}

/// Starts a trainer reading `ticket` from the Flight service at `addr`
/// with the cluster certificate `trainer` of `tls`, as `how` says (`all`,
/// `kill-after:N`, `stall-after:N`; see the script).
pub fn start(python: &str, addr: SocketAddr, tls: &Path, ticket: Vec<u8>, how: &str) -> Child {
    Command::new(python)
        .arg(SCRIPT)
        .arg(addr.to_string())
        .arg(tls)
        .arg("trainer")
        .arg(String::from_utf8(ticket).expect("a ticket is text"))
        .arg(how)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting a trainer")
}

/// What a trainer printed: the ids it read, and how many of them (the
/// first) it confirmed.
pub struct Report {
    /// The ids read, in order.
    pub ids: Vec<i64>,
    /// How many of `ids` it confirmed.
    pub confirmed: usize,
}

/// The trainer's first report, waiting at most `within` (a trainer that
/// reports nothing in time panics, rather than hang the test), after which
/// it is killed. Panics on a report of an error.
pub fn report(mut child: Child, within: Duration) -> Report {
    let stdout = child.stdout.take().expect("stdout piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(within);
    let _ = child.kill();
    let stderr = child
        .wait_with_output()
        .map(|o| o.stderr)
        .unwrap_or_default();
    let line = line.unwrap_or_else(|_| {
        panic!(
            "a trainer reported nothing within {within:?}: {}",
            String::from_utf8_lossy(&stderr)
        )
    });
    let got: serde_json::Value = serde_json::from_str(&line).expect("a JSON report");
    assert!(got["error"].is_null(), "{got}");
    let ids = (got["ids"].as_array().expect("ids").iter())
        .map(|v| v.as_i64().expect("an id"))
        .collect();
    let confirmed = got["confirmed"].as_u64().unwrap_or(0) as usize;
    Report { ids, confirmed }
}
