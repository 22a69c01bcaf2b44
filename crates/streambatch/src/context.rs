//! [`Context`]: where datasets run (an embedded node in this process, or a
//! cluster of node processes) and the sources they start from (`range`,
//! `read_parquet`, ...); and [`resolve_gpu_slots`], which turns
//! `gpus = "auto"` into GPU slots.

use std::path::Path;
use std::sync::Arc;

use arrow_array::RecordBatch;
use streambatch_core::NodeConfig;
use streambatch_gpu::{AdapterChoice, GpuPool};
use streambatch_plan::{Dataset, ImageSize, Result, Runner};
use streambatch_sched::{ClusterClient, LocalCluster};
use streambatch_store::StoreStats;

use crate::progress::ProgressRunner;

/// Turns `gpus = "auto"` into one slot per hardware GPU adapter found (of
/// the configured name and backend), opening those adapters for this
/// process. A software adapter (Mesa's llvmpipe) counts only with
/// `gpu_software = true`: it runs kernels far slower than the CPU. Returns a
/// line saying which adapters were left out, if any, for a node's log.
pub fn resolve_gpu_slots(config: &mut NodeConfig) -> Option<String> {
    if config.gpus.is_some() {
        return None;
    }
    let choice = AdapterChoice {
        name: config.gpu_adapter.clone(),
        backend: config.gpu_backend.clone(),
    };
    let pool = GpuPool::init(&choice);
    config.gpus = Some(pool.auto_slots(config.gpu_software) as f64);
    let software = pool.software_labels();
    (!config.gpu_software && !software.is_empty()).then(|| {
        format!(
            "gpus = \"auto\" counts no software adapter ({}): GPU stages get no slot here; \
             set gpu_software = true to run them on it",
            software.join(", ")
        )
    })
}

/// Where datasets run: an embedded one-node cluster in this process
/// (`Context::local()`), or a cluster of node processes
/// (`Context::connect("configs/cluster.toml")`). The same `Dataset` code
/// runs on either.
///
/// `Context::local()` reads no file: it uses the defaults of
/// `configs/local.toml` (cores detected, no GPU, 30% of RAM for the store)
/// with `STREAMBATCH_*` environment overrides.
///
/// On a machine whose only Vulkan driver is Mesa's (lavapipe), a process
/// without `XDG_RUNTIME_DIR` gets a line `error: XDG_RUNTIME_DIR is invalid
/// or not set` on stderr whenever the GPU adapters are listed. A context
/// cannot set it for you (setting a variable is only sound before threads
/// start): call [`use_private_runtime_dir`](crate::use_private_runtime_dir)
/// first thing in `main`, as the `streambatch` command does.
#[derive(Clone)]
pub struct Context {
    /// The embedded node, for a local context.
    local: Option<Arc<LocalCluster>>,
    /// The connection to a cluster, for a driver.
    client: Option<Arc<ClusterClient>>,
    runner: Arc<dyn Runner>,
}

impl Context {
    /// An embedded node with default settings (and `STREAMBATCH_*` overrides).
    pub fn local() -> Result<Self> {
        Self::with_config(NodeConfig::load(None)?)
    }

    /// An embedded node configured by a TOML file (and `STREAMBATCH_*` overrides).
    pub fn from_config_file(path: impl AsRef<Path>) -> Result<Self> {
        Self::with_config(NodeConfig::load(Some(path.as_ref()))?)
    }

    /// An embedded node with these settings. With `gpus` unset ("auto"),
    /// each hardware GPU adapter found (of the chosen name and backend) is
    /// one slot; a software one only with `gpu_software`.
    pub fn with_config(mut config: NodeConfig) -> Result<Self> {
        // An embedded node has no log of its own: `gpu_devices` tells.
        let _software_left_out = resolve_gpu_slots(&mut config);
        crate::keep_freed_memory();
        let cluster = Arc::new(LocalCluster::start(config)?);
        Ok(Self {
            runner: cluster.clone(),
            local: Some(cluster),
            client: None,
        })
    }

    /// A driver of the cluster whose head `path` names (with this driver's
    /// TLS files; see `configs/cluster.toml`). Jobs run on the cluster's
    /// nodes; each operator must be one every node can rebuild (made from a
    /// [`Registry`](crate::Registry), a built-in or a WGSL kernel), else the
    /// job is refused at submission, naming it.
    pub fn connect(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let config = NodeConfig::load(Some(path))?;
        let client = ClusterClient::connect(&config, Some(path)).map_err(|e| {
            streambatch_plan::Error::Start {
                what: "the connection to the cluster",
                source: e.into(),
            }
        })?;
        let client = Arc::new(client);
        Ok(Self {
            local: None,
            runner: client.clone(),
            client: Some(client),
        })
    }

    /// This context, drawing live progress bars per operator (on stderr,
    /// when it is a terminal) while jobs run.
    pub fn with_progress(&self) -> Self {
        Self {
            local: self.local.clone(),
            client: self.client.clone(),
            runner: Arc::new(ProgressRunner::new(self.runner.clone())),
        }
    }

    /// The node's settings.
    pub fn config(&self) -> &NodeConfig {
        self.runner.config()
    }

    /// GPU adapters this node uses, one per slot ("name (backend)"); for a
    /// cluster driver, the nodes with GPU slots ("node: N GPU slots").
    pub fn gpu_devices(&self) -> Vec<String> {
        if let Some(client) = &self.client {
            let members = client.members().map(|m| m.nodes).unwrap_or_default();
            return members
                .iter()
                .filter(|n| n.gpus > 0.0)
                .map(|n| format!("{}: {} GPU slots", n.name, n.gpus))
                .collect();
        }
        if self.config().gpus == Some(0.0) {
            return Vec::new();
        }
        GpuPool::global().labels()
    }

    /// The embedded node's store counters (zeros for a cluster driver,
    /// whose partitions live on the nodes; see a job's stats).
    pub fn store_stats(&self) -> StoreStats {
        self.local
            .as_ref()
            .map(|l| l.store().stats())
            .unwrap_or_default()
    }

    /// Where the embedded node serves its Prometheus metrics (`GET
    /// /metrics`), when its config sets `metrics_addr`.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.local.as_ref().and_then(|l| l.metrics_addr())
    }

    /// Integers `0..n` in a column `id`, in `partitions` partitions.
    pub fn range(&self, n: u64, partitions: usize) -> Dataset {
        Dataset::range(self.runner.clone(), n, partitions)
    }

    /// The given batches, one partition each.
    pub fn from_batches(&self, batches: Vec<RecordBatch>) -> Dataset {
        Dataset::from_batches(self.runner.clone(), batches)
    }

    /// Parquet files: a file, a directory or a glob.
    pub fn read_parquet(&self, path: &str) -> Result<Dataset> {
        Dataset::read_parquet(self.runner.clone(), path, None)
    }

    /// Parquet files, reading only `columns`.
    pub fn read_parquet_columns(&self, path: &str, columns: &[&str]) -> Result<Dataset> {
        Dataset::read_parquet(self.runner.clone(), path, Some(columns))
    }

    /// CSV files with a header row.
    pub fn read_csv(&self, path: &str) -> Result<Dataset> {
        Dataset::read_csv(self.runner.clone(), path)
    }

    /// Newline-delimited JSON files: one row per object, the schema
    /// inferred from the files.
    pub fn read_json(&self, path: &str) -> Result<Dataset> {
        Dataset::read_json(self.runner.clone(), path)
    }

    /// Arrow IPC files, their schemas read now.
    pub fn read_ipc(&self, path: &str) -> Result<Dataset> {
        Dataset::read_ipc(self.runner.clone(), path)
    }

    /// Text files: one row per line (`text`), without its line ending.
    pub fn read_text(&self, path: &str) -> Result<Dataset> {
        Dataset::read_text(self.runner.clone(), path)
    }

    /// Files read whole: one row per file (`path`, `bytes`).
    pub fn read_binary_files(&self, path: &str) -> Result<Dataset> {
        Dataset::read_binary_files(self.runner.clone(), path)
    }

    /// PNG and JPEG files decoded and resized to `height x width`: one row
    /// per image (`path`, `image`: `height x width x 3` RGB bytes,
    /// row-major, as `ops::preprocess` reads them).
    pub fn read_images(&self, path: &str, height: u32, width: u32) -> Result<Dataset> {
        Dataset::read_images(self.runner.clone(), path, ImageSize { height, width })
    }
}
