//! Node processes of a benchmark's local cluster: each this binary's
//! `streambatch node` on 127.0.0.1, started from a TOML config written
//! here with certificates of a fresh cluster CA (W5, W6b, S1 on a cluster).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use streambatch::{Error, Result};

/// A node process, stopped when dropped.
pub(crate) struct NodeProcess {
    pub(crate) child: Child,
    pub(crate) addr: String,
}

impl NodeProcess {
    /// Its peak resident memory (VmHWM) in MiB.
    pub(crate) fn peak_rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()));
        status
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("VmHWM:"))?.to_string();
                line.split_whitespace().nth(1)?.parse::<f64>().ok()
            })
            .map_or(0.0, |kib| kib / 1024.0)
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        // SIGTERM: the node stops cleanly and its store removes its segments.
        // SAFETY: kill(2) on the pid of a child this process has not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn failed(what: String) -> Error {
    Error::Start {
        what: "a benchmark's node",
        source: what.into(),
    }
}

/// Writes a node's config; `head` is the head's address for other nodes,
/// `timeout_ms` its `node_timeout_ms` (default when `None`).
pub(crate) fn node_config(
    dir: &Path,
    name: &str,
    head: Option<&str>,
    slots: (u32, u32),
    timeout_ms: Option<u32>,
) -> PathBuf {
    node_config_with_store(dir, name, head, slots, timeout_ms, "300MiB")
}

/// [`node_config`] with a store of `store` (a size, as TOML takes it).
pub(crate) fn node_config_with_store(
    dir: &Path,
    name: &str,
    head: Option<&str>,
    slots: (u32, u32),
    timeout_ms: Option<u32>,
    store: &str,
) -> PathBuf {
    let head = head.map_or(String::new(), |h| format!("head = \"{h}\"\n"));
    let extra = timeout_ms.map_or(String::new(), |ms| format!("node_timeout_ms = {ms}\n"));
    let tls = dir.join("tls");
    let text = format!(
        "name = \"{name}\"\nlisten = \"127.0.0.1:0\"\n{head}\
         tls_ca = \"{tls}/ca.pem\"\ntls_cert = \"{tls}/{name}.pem\"\ntls_key = \"{tls}/{name}.key\"\n\
         cpus = {}\ngpus = {}\nstore_capacity = \"{store}\"\nspill_dir = \"{}\"\n{extra}",
        slots.0,
        slots.1,
        dir.join("store").display(),
        tls = tls.display(),
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("writing a node config");
    path
}

pub(crate) fn start_node(exe: &Path, dir: &Path, config: &Path, name: &str) -> Result<NodeProcess> {
    let log = std::fs::File::create(dir.join(format!("{name}.log")))
        .map_err(|e| Error::io("creating", dir, e))?;
    let mut child = Command::new(exe)
        .args(["node", "--config"])
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(|e| Error::io("starting", exe, e))?;
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped");
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| Error::io("reading from", exe, e))?;
    let addr = line
        .trim()
        .rsplit(' ')
        .next()
        .filter(|_| line.contains("listening on"))
        .ok_or_else(|| {
            failed(format!(
                "{name} did not start; see {}/{name}.log",
                dir.display()
            ))
        })?
        .to_string();
    Ok(NodeProcess { child, addr })
}

/// Removes the shared-memory segments of a killed node (it could not).
pub(crate) fn remove_segments(prefix: &str) {
    for entry in std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
    {
        if entry.file_name().to_string_lossy().starts_with(prefix) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
