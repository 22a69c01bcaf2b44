//! Real node processes on 127.0.0.1: a head and two workers started from
//! TOML form a cluster; a node of another CA is refused and the cluster
//! keeps running; a killed worker leaves the member list; bad configs fail
//! at start naming the key and the file.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{BIN, Node};

fn write_config(dir: &Path, name: &str, head: Option<&str>, ca_dir: &str) -> PathBuf {
    let head = head.map_or(String::new(), |h| format!("head = \"{h}\"\n"));
    let text = format!(
        "name = \"{name}\"\nlisten = \"127.0.0.1:0\"\n{head}\
         tls_ca = \"{ca_dir}/ca.pem\"\ntls_cert = \"{ca_dir}/{name}.pem\"\ntls_key = \"{ca_dir}/{name}.key\"\n\
         cpus = 2\ngpus = 0\nstore_capacity = \"64MiB\"\nspill_dir = \"spill/{name}\"\n"
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Starts the node of `config`, named by its file.
fn start(dir: &Path, config: &Path) -> Node {
    let name = config.file_stem().unwrap().to_str().unwrap();
    common::start(dir, config, name)
}

fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

/// The node names `cluster status` lists.
fn members(dir: &Path, config: &Path) -> Vec<String> {
    let out = run(
        dir,
        &["cluster", "status", "--config", config.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect()
}

#[test]
fn nodes_from_toml_form_a_cluster_and_strangers_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let init = run(
        dir,
        &[
            "cluster",
            "init",
            "tls",
            "--nodes",
            "head,worker-1,worker-2,driver",
        ],
    );
    assert!(init.status.success());
    let init = run(dir, &["cluster", "init", "other", "--nodes", "intruder"]);
    assert!(init.status.success());

    let head = start(dir, &write_config(dir, "head", None, "tls"));
    let _w1 = start(dir, &write_config(dir, "worker-1", Some(&head.addr), "tls"));
    let mut w2 = start(dir, &write_config(dir, "worker-2", Some(&head.addr), "tls"));
    let driver = write_config(dir, "driver", Some(&head.addr), "tls");
    assert_eq!(members(dir, &driver), ["head", "worker-1", "worker-2"]);

    // A node whose certificate comes from another CA (trusting ours) is
    // refused in the handshake: it cannot join, and says so naming `head`.
    let intruder = write_config(dir, "intruder", Some(&head.addr), "other");
    let text = std::fs::read_to_string(&intruder)
        .unwrap()
        .replace("other/ca.pem", "tls/ca.pem");
    std::fs::write(&intruder, text).unwrap();
    let out = run(dir, &["node", "--config", intruder.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`head` in") && err.contains("intruder.toml"),
        "{err}"
    );
    // The cluster keeps running.
    assert_eq!(members(dir, &driver), ["head", "worker-1", "worker-2"]);

    // A worker that dies leaves the member list (QUIC's idle timeout).
    w2.child.kill().unwrap();
    // A killed node cannot remove its shared-memory segments: this test does.
    let pid = w2.child.id();
    let _ = w2.child.wait();
    for entry in std::fs::read_dir("/dev/shm").unwrap().flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(&format!("sb-worker_2-{pid}-"))
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = members(dir, &driver);
        if now == ["head", "worker-1"] {
            break;
        }
        assert!(Instant::now() < deadline, "still listed: {now:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn a_bad_config_fails_at_start_naming_the_key_and_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    assert!(
        run(dir, &["cluster", "init", "tls", "--nodes", "head"])
            .status
            .success()
    );
    let fails = |text: &str, expected: &[&str]| {
        let path = dir.join("node.toml");
        std::fs::write(&path, text).unwrap();
        let out = run(dir, &["node", "--config", "node.toml"]);
        assert!(!out.status.success(), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        for e in expected {
            assert!(err.contains(e), "{text}: {err}");
        }
    };
    let tls = "tls_ca = \"tls/ca.pem\"\ntls_cert = \"tls/head.pem\"\ntls_key = \"tls/head.key\"\n";
    fails("nmae = \"head\"\n", &["unknown key `nmae`", "node.toml"]);
    fails("listen = 7400\n", &["`listen`", "node.toml"]);
    fails(&format!("cpus = \"two\"\n{tls}"), &["`cpus`", "node.toml"]);
    fails("name = \"head\"\n", &["`tls_ca` is not set", "node.toml"]);
    fails(
        &tls.replace("tls/head.pem", "tls/missing.pem"),
        &["`tls_cert`", "node.toml", "tls/missing.pem"],
    );
    fails(
        &format!("{tls}head = \"127.0.0.1:9\"\n"),
        &[
            "cannot reach the head at 127.0.0.1:9",
            "`head` in node.toml",
        ],
    );
}
