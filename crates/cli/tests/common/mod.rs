//! Real clusters for tests: node processes of the `streambatch` binary on
//! 127.0.0.1, with certificates from `streambatch cluster init`, killed when
//! the cluster is dropped.

#![allow(dead_code)] // each test binary uses part of it

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_streambatch");

/// A node process, killed when dropped.
pub struct Node {
    pub child: Child,
    pub addr: String,
    pub name: String,
}

impl Drop for Node {
    /// SIGTERM first: the node stops cleanly and its store removes its
    /// shared-memory segments; SIGKILL if it has not stopped within 5 s.
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return; // gone already (and its pid perhaps another's now)
        }
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .stderr(Stdio::null())
            .status();
        for _ in 0..250 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    /// SIGKILL, as a machine that vanishes: the node cleans nothing up. Its
    /// shared-memory segments (its store's name starts with its name and
    /// pid) are removed here, as its next start would.
    pub fn kill_hard(&mut self) {
        let pid = self.child.id();
        self.child.kill().unwrap();
        let _ = self.child.wait();
        let prefix = format!("sb-{}-{pid}-", self.name);
        for entry in std::fs::read_dir("/dev/shm").unwrap().flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// What one worker node has.
#[derive(Clone)]
pub struct NodeSpec {
    pub name: String,
    pub cpus: u32,
    /// GPU slots; `None`: "auto", one per adapter found.
    pub gpus: Option<u32>,
    /// The node whose store directory it shares (for shared memory).
    pub store_of: Option<String>,
    /// Variables set for its process only (as `SB_FAILPOINTS`).
    pub env: Vec<(String, String)>,
}

impl NodeSpec {
    pub fn cpu(name: &str, cpus: u32) -> Self {
        Self {
            name: name.into(),
            cpus,
            gpus: Some(0),
            store_of: None,
            env: Vec::new(),
        }
    }

    pub fn gpu(name: &str, gpus: u32) -> Self {
        Self {
            name: name.into(),
            cpus: 0,
            gpus: Some(gpus),
            store_of: None,
            env: Vec::new(),
        }
    }

    /// A node with one GPU slot per adapter it finds, and `cpus` CPU slots.
    pub fn auto_gpu(name: &str, cpus: u32) -> Self {
        Self {
            name: name.into(),
            cpus,
            gpus: None,
            store_of: None,
            env: Vec::new(),
        }
    }

    pub fn sharing_store_with(mut self, other: &str) -> Self {
        self.store_of = Some(other.into());
        self
    }

    /// Sets `key` to `value` in the node's environment.
    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// A head (no slots) and worker nodes.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub head: Node,
    pub nodes: Vec<Node>,
    /// TOML lines every node's and the driver's config ends with.
    pub extra: String,
    /// Held while the cluster lives (see `ONE_CLUSTER`).
    _alone: std::sync::MutexGuard<'static, ()>,
}

/// One cluster (and its driver) at a time in a test process. A driver's
/// ractor_cluster NodeServer numbers its peers' sessions from zero, and the
/// remote actors it makes are named by those numbers in the process-wide
/// registry, so two drivers in one process (which users do not run) could
/// mistake each other's peers' actors: tests that ran side by side lost a
/// node's agent now and then.
static ONE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Cluster {
    pub fn start(specs: &[NodeSpec]) -> Self {
        Self::start_with_store(specs, "128MiB")
    }

    /// A cluster whose nodes' stores hold `store` each (as "24MiB").
    pub fn start_with_store(specs: &[NodeSpec], store: &str) -> Self {
        Self::start_configured(specs, store, "")
    }

    /// [`Cluster::start_with_store`], with `extra` TOML lines (as
    /// "node_timeout_ms = 2000\n") in every config, the driver's included.
    pub fn start_configured(specs: &[NodeSpec], store: &str, extra: &str) -> Self {
        let alone = ONE_CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().unwrap();
        // `spare-1` and `spare-2` have certificates for nodes added later.
        let mut names = vec!["head", "driver", "spare-1", "spare-2"]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
        names.extend(specs.iter().map(|s| s.name.clone()));
        let init = Command::new(BIN)
            .current_dir(dir.path())
            .args(["cluster", "init", "tls", "--nodes", &names.join(",")])
            .output()
            .unwrap();
        assert!(
            init.status.success(),
            "{}",
            String::from_utf8_lossy(&init.stderr)
        );
        let head_config = config(dir.path(), "head", None, 0, Some(0), "head", store);
        append(&head_config, extra);
        let head = start(dir.path(), &head_config, "head");
        let nodes = specs
            .iter()
            .map(|s| {
                let spill = s.store_of.as_deref().unwrap_or(&s.name);
                let path = config(
                    dir.path(),
                    &s.name,
                    Some(&head.addr),
                    s.cpus,
                    s.gpus,
                    spill,
                    store,
                );
                append(&path, extra);
                start_with_env(dir.path(), &path, &s.name, &s.env)
            })
            .collect();
        let driver = config(
            dir.path(),
            "driver",
            Some(&head.addr),
            0,
            Some(0),
            "driver",
            store,
        );
        append(&driver, extra);
        Self {
            dir,
            head,
            nodes,
            extra: extra.into(),
            _alone: alone,
        }
    }

    /// Starts another node joining the head; its name must be `spare-1`
    /// or `spare-2` (their certificates were made with the cluster's).
    pub fn add(&mut self, spec: NodeSpec) {
        let dir = self.dir.path();
        let path = config(
            dir,
            &spec.name,
            Some(&self.head.addr),
            spec.cpus,
            spec.gpus,
            &spec.name,
            "128MiB",
        );
        append(&path, &self.extra);
        self.nodes
            .push(start_with_env(dir, &path, &spec.name, &spec.env));
    }

    /// Starts the node `name` again from its config (after it was killed),
    /// with `env`, in its old place in `nodes`.
    pub fn restart(&mut self, name: &str, env: &[(String, String)]) {
        let dir = self.dir.path();
        let config = dir.join(format!("{name}.toml"));
        let node = start_with_env(dir, &config, name, env);
        let old = self.nodes.iter_mut().find(|n| n.name == name).unwrap();
        *old = node;
    }

    pub fn driver_config(&self) -> PathBuf {
        self.dir.path().join("driver.toml")
    }
}

/// Appends `lines` to the config at `path`.
fn append(path: &Path, lines: &str) {
    let mut text = std::fs::read_to_string(path).unwrap();
    text.push_str(lines);
    std::fs::write(path, text).unwrap();
}

pub fn config(
    dir: &Path,
    name: &str,
    head: Option<&str>,
    cpus: u32,
    gpus: Option<u32>,
    spill_dir: &str,
    store_capacity: &str,
) -> PathBuf {
    let gpus = gpus.map_or("\"auto\"".to_string(), |g| g.to_string());
    let head = head.map_or(String::new(), |h| format!("head = \"{h}\"\n"));
    let tls = dir.join("tls");
    let spill = dir.join("spill").join(spill_dir);
    let text = format!(
        "name = \"{name}\"\nlisten = \"127.0.0.1:0\"\n{head}\
         tls_ca = \"{tls}/ca.pem\"\ntls_cert = \"{tls}/{name}.pem\"\ntls_key = \"{tls}/{name}.key\"\n\
         cpus = {cpus}\ngpus = {gpus}\nstore_capacity = \"{store_capacity}\"\nspill_dir = \"{spill}\"\n",
        tls = tls.display(),
        spill = spill.display(),
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Starts a node and waits for its "listening on" line.
pub fn start(dir: &Path, config: &Path, name: &str) -> Node {
    start_with_env(dir, config, name, &[])
}

/// [`start`], with `env` set for the node's process.
pub fn start_with_env(dir: &Path, config: &Path, name: &str, env: &[(String, String)]) -> Node {
    // Appended: a node started again writes after its earlier run's lines.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))
        .unwrap();
    let mut child = Command::new(BIN)
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args(["node", "--config"])
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .rsplit(' ')
        .next()
        .filter(|_| line.contains("listening on"))
        .unwrap_or_else(|| {
            let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
            panic!("node {name} did not start: {line:?}\n{log}")
        })
        .to_string();
    Node {
        child,
        addr,
        name: name.into(),
    }
}

/// Runs `streambatch ARGS` in `dir` with `env` set, and checks that it
/// succeeded (its stderr shown if not).
pub fn streambatch(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let out = Command::new(BIN)
        .current_dir(dir)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "streambatch {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The node names `cluster status` lists for `cluster`.
pub fn members(cluster: &Cluster) -> Vec<String> {
    let config = cluster.driver_config();
    let args = ["cluster", "status", "--config", config.to_str().unwrap()];
    let out = streambatch(cluster.dir.path(), &args, &[]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}

/// The node of the W1-shaped tests: 8 CPU and 4 GPU slots, and a 3 MiB
/// store, small enough that outputs wait for memory.
pub fn small_w1_node() -> streambatch::NodeConfig {
    streambatch::NodeConfig {
        cpus: 8.0,
        gpus: Some(4.0),
        store_capacity: 3 << 20,
        ..Default::default()
    }
}

/// A W1-shaped job for tests on `ctx`: 80 rows of 128 KiB in 16
/// partitions, quick sleeps (not run yet).
pub fn small_w1(ctx: &streambatch::Context) -> streambatch::Dataset {
    let shape = streambatch_bench::Shape {
        rows: 80,
        partitions: 16,
        row_bytes: 128 << 10,
        millis: (20, 5, 5),
    };
    let source = ctx.range(shape.rows, shape.partitions);
    streambatch_bench::w1_pipeline(source, &streambatch_bench::registry(), shape).unwrap()
}

/// A pipeline file in `dir` reading `dir/images`, preprocessing them and
/// writing Parquet to `out` on 2 CPUs: its name.
pub fn preprocess_pipeline(dir: &Path, out: &str) -> String {
    let file = format!("{out}.toml");
    let text = format!(
        "[node]\ncpus = 2\ngpus = 0\n\n[source]\nread_parquet = \"images\"\n\n\
         [[ops]]\nop = \"preprocess_images\"\n\n[sink]\nwrite_parquet = \"{out}\"\n"
    );
    std::fs::write(dir.join(&file), text).unwrap();
    file
}

/// A small W1 for the cluster job tests: 40 rows of 64 KiB in 8
/// partitions, quick sleeps.
pub fn tiny_w1_shape() -> streambatch_bench::Shape {
    streambatch_bench::Shape {
        rows: 40,
        partitions: 8,
        row_bytes: 64 << 10,
        millis: (20, 5, 5),
    }
}

/// The sorted ids a W1-shaped job of [`tiny_w1_shape`] outputs on `ctx`,
/// and its stats.
pub fn w1_ids(ctx: &streambatch::Context) -> (Vec<i64>, streambatch::JobStats) {
    let shape = tiny_w1_shape();
    let ds = streambatch_bench::w1_pipeline(
        ctx.range(shape.rows, shape.partitions),
        &streambatch_bench::registry(),
        shape,
    )
    .unwrap();
    let mut ids = Vec::new();
    for batch in ds.iter_batches().unwrap() {
        ids.extend_from_slice(ids_of(&batch.unwrap()));
    }
    ids.sort_unstable();
    (ids, ds.stats().unwrap())
}

/// The ids (first column) of a W1-shaped job's output batch.
pub fn ids_of(batch: &arrow_array::RecordBatch) -> &[i64] {
    let column = batch.column(0).as_any();
    let ids = column.downcast_ref::<arrow_array::Int64Array>().unwrap();
    ids.values()
}

/// Starts `streambatch run FILE` in `dir` with `SB_FAILPOINTS=faults` and
/// `env`, its output discarded.
pub fn run_pipeline(
    dir: &Path,
    file: &str,
    faults: &str,
    env: &[(String, String)],
) -> std::process::Child {
    Command::new(BIN)
        .current_dir(dir)
        .envs(env.iter().cloned())
        .env("SB_FAILPOINTS", faults)
        .args(["run", file])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// SIGKILLs `job` as soon as `ready()` (polled every 2 ms), and waits for
/// it; panics if the job ends first or nothing is ready in 60 s (`what`
/// names the moment).
pub fn kill_when(job: &mut std::process::Child, what: &str, mut ready: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !ready() {
        assert!(
            job.try_wait().unwrap().is_none(),
            "the job ended before {what}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "no {what} in 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    job.kill().unwrap();
    job.wait().unwrap();
}

/// SIGKILLs a write into `out` once its staging has held `parts` parts
/// and then given every one up (renamed in): in its commit, before its
/// removals (a `commit.pause` failpoint holds it there).
pub fn kill_between_renames_and_removals(job: &mut std::process::Child, out: &Path, parts: usize) {
    let staged_parts = || {
        let staging = std::fs::read_dir(out).ok()?.flatten().find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".streambatch-staging-")
        })?;
        let entries = std::fs::read_dir(staging.path()).ok()?.flatten();
        Some(
            entries
                .filter(|p| p.file_name().to_string_lossy().starts_with("part-"))
                .count(),
        )
    };
    let mut saw_staged = false;
    kill_when(job, "a commit", || {
        let staged = staged_parts();
        saw_staged |= staged == Some(parts);
        saw_staged && staged == Some(0)
    });
}
