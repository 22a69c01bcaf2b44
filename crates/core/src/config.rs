//! A node's settings: TOML through the `config` crate, with `STREAMBATCH_*`
//! environment variables overriding the file (`STREAMBATCH_CPUS=4`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use config::{Config, Environment, File, FileFormat, Value, ValueKind};

use crate::parse_size;

/// Why a node's configuration could not be loaded. Each variant names the key
/// and where its value came from (a file, or the environment).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read or parsed as TOML.
    #[error("cannot read config file {file}: {message}")]
    File {
        /// The file.
        file: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A key holds a value of the wrong kind or out of range.
    #[error("bad value for `{key}` in {origin}: {message}")]
    BadValue {
        /// The key, as written in TOML.
        key: String,
        /// The file or environment variable the value came from.
        origin: String,
        /// What was wrong with it.
        message: String,
    },
    /// A key that no setting has (often a typo).
    #[error("unknown key `{key}` in {origin}; known keys: {known}")]
    UnknownKey {
        /// The key.
        key: String,
        /// The file or environment variable.
        origin: String,
        /// The keys a node config accepts.
        known: String,
    },
}

/// One node's settings.
///
/// `configs/local.toml` documents every key; [`NodeConfig::default`] gives the
/// same values as that file.
///
/// ```
/// use streambatch_core::NodeConfig;
/// let c = NodeConfig::from_toml_str("cpus = 8\nstore_capacity = \"300MiB\"", "inline").unwrap();
/// assert_eq!((c.cpus, c.store_capacity), (8.0, 300 << 20));
/// let e = NodeConfig::from_toml_str("cpus = \"many\"", "inline").unwrap_err();
/// assert!(e.to_string().contains("`cpus`"));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct NodeConfig {
    /// Logical CPU slots. Default: the cores detected.
    pub cpus: f64,
    /// Logical GPU slots; `None` ("auto", the default) gives one slot per
    /// hardware GPU adapter found (a software rasterizer such as Mesa's
    /// llvmpipe counts only with `gpu_software`).
    pub gpus: Option<f64>,
    /// Whether "auto" counts software adapters (llvmpipe) as GPU slots:
    /// they run WGSL kernels correctly but far slower than a CPU path.
    /// Default: false.
    pub gpu_software: bool,
    /// Use only GPU adapters whose name contains this.
    pub gpu_adapter: Option<String>,
    /// Use only GPU adapters of this backend ("vulkan", ...).
    pub gpu_backend: Option<String>,
    /// Bytes the object store may hold in memory. Default: 30% of RAM.
    pub store_capacity: u64,
    /// A task yields a partition each time it has this many bytes. Default: 64 MiB.
    pub target_partition_bytes: u64,
    /// A join whose right input holds at most this many bytes (as Arrow
    /// batches) sends it whole to every task of the left instead of
    /// exchanging both (inner, left, semi and anti joins). Default: 512
    /// KiB, which a cluster's plan carries; 0 exchanges every join.
    pub broadcast_join_bytes: u64,
    /// Where the store spills partitions. Default: `$TMPDIR/streambatch-spill-UID`
    /// (one per user: the store refuses a spill directory another user
    /// owns), or where another user holds that name, a private one of an
    /// unpredictable name beside it.
    pub spill_dir: PathBuf,
    /// How often a task that met a system failure (its worker panicked, an
    /// input could not be fetched, the store failed) is retried before the
    /// job fails. Default: 3.
    pub max_task_retries: u32,
    /// Whether an operator's own error (a UDF's `Err`, a file it cannot
    /// decode) is retried like a system failure. Default: false (the job
    /// fails, unless `max_errored_partitions` allows skipping the input).
    pub retry_user_errors: bool,
    /// How many tasks whose operator failed the job may skip (their input
    /// left out of the output, each listed in the job's stats) before it
    /// fails, as Ray Data's `max_errored_blocks`. Default: 0.
    pub max_errored_partitions: u32,
    /// How long a cluster connection may hear nothing before its peer
    /// counts as lost (QUIC's idle timeout; keep-alives go at a tenth of
    /// it, at most every 500 ms). A lost worker's work is redone, a lost
    /// head ends the jobs. Both ends of a connection use the smaller of
    /// their values. Default: 5000; at least 200.
    pub node_timeout_ms: u32,
    /// The node's name in a cluster: the common name of its certificate.
    /// Default: `node`.
    pub name: String,
    /// Where a cluster node listens for its peers (QUIC over UDP). Default:
    /// `127.0.0.1:0`, any free port.
    pub listen: SocketAddr,
    /// The head's address; unset on the head itself.
    pub head: Option<SocketAddr>,
    /// The cluster's CA certificate (PEM), from `streambatch cluster init`.
    pub tls_ca: Option<PathBuf>,
    /// This node's certificate (PEM), signed by the cluster's CA.
    pub tls_cert: Option<PathBuf>,
    /// This node's private key (PEM), readable by its owner only.
    pub tls_key: Option<PathBuf>,
    /// Whether jobs record their timeline (each task's start and end, each
    /// pause, the store's bytes over time) for `Dataset::write_timeline`.
    /// Default: true; it costs under 2% of W3's throughput
    /// (docs/benchmarks.md).
    pub record_timeline: bool,
    /// Where this node serves Prometheus text metrics over HTTP (`GET
    /// /metrics`), as `127.0.0.1:9464`. Default: unset, no endpoint.
    pub metrics_addr: Option<SocketAddr>,
}

const KNOWN_KEYS: [&str; 21] = [
    "cpus",
    "gpus",
    "gpu_software",
    "gpu_adapter",
    "gpu_backend",
    "store_capacity",
    "target_partition_bytes",
    "broadcast_join_bytes",
    "spill_dir",
    "max_task_retries",
    "retry_user_errors",
    "max_errored_partitions",
    "node_timeout_ms",
    "name",
    "listen",
    "head",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "record_timeline",
    "metrics_addr",
];

/// The default spill directory: `$TMPDIR/streambatch-spill-UID`, UID this
/// process's user, kept across runs so that a store can clean what a
/// crashed one left there. Its name is predictable: where another user
/// holds it (or it is not private), a node still starts, on a private
/// directory of an unpredictable name beside it (`...-UID-XXXXXX`, 0700).
/// Resolved once a process.
fn default_spill_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        let tmp = std::env::temp_dir();
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        let usual = tmp.join(format!("streambatch-spill-{uid}"));
        let ours = |meta: &std::fs::Metadata| {
            meta.is_dir() && meta.uid() == uid && meta.mode() & 0o077 == 0
        };
        match std::fs::symlink_metadata(&usual) {
            // One made so by an earlier run first: its leftovers are
            // cleaned there, and no new one is made each run.
            Ok(meta) if !ours(&meta) => earlier_private_dir(&tmp, &usual, &ours)
                .or_else(|| private_dir_beside(&usual))
                .unwrap_or(usual),
            _ => usual,
        }
    })
    .clone()
}

/// A directory `USUAL-XXXXXX` in `tmp` that an earlier run made and that
/// is still this user's and private.
fn earlier_private_dir(
    tmp: &Path,
    usual: &Path,
    ours: &dyn Fn(&std::fs::Metadata) -> bool,
) -> Option<PathBuf> {
    let prefix = format!("{}-", usual.file_name()?.to_string_lossy());
    let mut found: Vec<PathBuf> = std::fs::read_dir(tmp)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .filter(|e| std::fs::symlink_metadata(e.path()).is_ok_and(|m| ours(&m)))
        .map(|e| e.path())
        .collect();
    found.sort();
    found.into_iter().next()
}

/// A new directory `PATH-XXXXXX` (six random letters), made 0700 by this
/// process: `mkdtemp`, which never opens one that exists.
fn private_dir_beside(path: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut template = path.as_os_str().as_bytes().to_vec();
    template.extend_from_slice(b"-XXXXXX\0");
    // SAFETY: `template` is a NUL-terminated buffer that mkdtemp rewrites
    // in place, within its length.
    let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    if made.is_null() {
        return None;
    }
    template.pop();
    let dir = PathBuf::from(std::ffi::OsStr::from_bytes(&template));
    tracing::warn!(
        taken = %path.display(),
        spill_dir = %dir.display(),
        "the usual spill directory belongs to another user or is not private; spilling to a private one"
    );
    Some(dir)
}

impl Default for NodeConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            cpus: cores as f64,
            gpus: None,
            gpu_software: false,
            gpu_adapter: None,
            gpu_backend: None,
            store_capacity: default_store_capacity(),
            target_partition_bytes: 64 << 20,
            broadcast_join_bytes: 512 << 10,
            spill_dir: default_spill_dir(),
            max_task_retries: 3,
            retry_user_errors: false,
            max_errored_partitions: 0,
            node_timeout_ms: 5_000,
            name: "node".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            head: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            record_timeline: true,
            metrics_addr: None,
        }
    }
}

impl NodeConfig {
    /// Loads `file` (when given) over the defaults, then applies `STREAMBATCH_*`
    /// environment overrides.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut builder = Config::builder();
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::File {
                    file: path.to_path_buf(),
                    message: "no such file".into(),
                });
            }
            builder = builder.add_source(File::from(path).format(FileFormat::Toml));
        }
        let origin = file.map_or_else(|| "defaults".to_string(), |p| p.display().to_string());
        let cfg = builder
            .add_source(Environment::with_prefix("STREAMBATCH").try_parsing(true))
            .build()
            .map_err(|e| ConfigError::File {
                file: origin.clone().into(),
                message: e.to_string(),
            })?;
        Self::from_config(&cfg, &origin)
    }

    /// Parses TOML text; `origin` names it in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let cfg = Config::builder()
            .add_source(File::from_str(text, FileFormat::Toml))
            .build()
            .map_err(|e| ConfigError::File {
                file: origin.into(),
                message: e.to_string(),
            })?;
        Self::from_config(&cfg, origin)
    }

    fn from_config(cfg: &Config, origin: &str) -> Result<Self, ConfigError> {
        use config::Source;
        let table = cfg.collect().map_err(|e| ConfigError::File {
            file: origin.into(),
            message: e.to_string(),
        })?;
        if let Some((key, value)) = table
            .iter()
            .find(|(k, _)| !KNOWN_KEYS.contains(&k.as_str()))
        {
            return Err(ConfigError::UnknownKey {
                key: key.clone(),
                origin: value_origin(value, origin),
                known: KNOWN_KEYS.join(", "),
            });
        }
        let defaults = Self::default();
        let reader = Reader {
            table: &table,
            origin,
        };
        let config = Self {
            cpus: reader.number("cpus", defaults.cpus)?,
            gpus: reader.gpus()?,
            gpu_software: reader.flag("gpu_software", defaults.gpu_software)?,
            gpu_adapter: reader.text("gpu_adapter")?,
            gpu_backend: reader.text("gpu_backend")?,
            store_capacity: reader.size("store_capacity", defaults.store_capacity)?,
            target_partition_bytes: reader
                .size("target_partition_bytes", defaults.target_partition_bytes)?,
            broadcast_join_bytes: reader
                .size("broadcast_join_bytes", defaults.broadcast_join_bytes)?,
            spill_dir: reader.path("spill_dir", defaults.spill_dir)?,
            max_task_retries: reader.number("max_task_retries", defaults.max_task_retries as f64)?
                as u32,
            retry_user_errors: reader.flag("retry_user_errors", defaults.retry_user_errors)?,
            max_errored_partitions: reader.number(
                "max_errored_partitions",
                defaults.max_errored_partitions as f64,
            )? as u32,
            node_timeout_ms: reader.number("node_timeout_ms", defaults.node_timeout_ms as f64)?
                as u32,
            name: reader.text("name")?.unwrap_or(defaults.name),
            listen: reader.addr("listen")?.unwrap_or(defaults.listen),
            head: reader.addr("head")?,
            tls_ca: reader.optional_path("tls_ca")?,
            tls_cert: reader.optional_path("tls_cert")?,
            tls_key: reader.optional_path("tls_key")?,
            record_timeline: reader.flag("record_timeline", defaults.record_timeline)?,
            metrics_addr: reader.addr("metrics_addr")?,
        };
        if config.store_capacity == 0 || config.target_partition_bytes == 0 {
            let key = if config.store_capacity == 0 {
                "store_capacity"
            } else {
                "target_partition_bytes"
            };
            return Err(reader.bad(key, "must be greater than zero".into()));
        }
        if config.node_timeout_ms < 200 {
            return Err(reader.bad("node_timeout_ms", "must be at least 200".into()));
        }
        Ok(config)
    }
}

struct Reader<'a> {
    table: &'a config::Map<String, Value>,
    origin: &'a str,
}

impl Reader<'_> {
    fn bad(&self, key: &str, message: String) -> ConfigError {
        let origin = self
            .table
            .get(key)
            .map_or(self.origin.to_string(), |v| value_origin(v, self.origin));
        ConfigError::BadValue {
            key: key.into(),
            origin,
            message,
        }
    }

    fn number(&self, key: &str, default: f64) -> Result<f64, ConfigError> {
        let Some(value) = self.table.get(key) else {
            return Ok(default);
        };
        let n = match &value.kind {
            ValueKind::I64(n) => *n as f64,
            ValueKind::U64(n) => *n as f64,
            ValueKind::Float(n) => *n,
            ValueKind::String(s) => s
                .trim()
                .parse::<f64>()
                .map_err(|_| self.bad(key, format!("expected a number, found `{s}`")))?,
            other => return Err(self.bad(key, format!("expected a number, found {other}"))),
        };
        if !n.is_finite() || n < 0.0 {
            return Err(self.bad(key, format!("expected a non-negative number, found {n}")));
        }
        Ok(n)
    }

    fn flag(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.table.get(key).map(|v| &v.kind) {
            None => Ok(default),
            Some(ValueKind::Boolean(b)) => Ok(*b),
            // From an environment variable.
            Some(ValueKind::String(s)) => match s.trim() {
                "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                _ => Err(self.bad(key, format!("expected true or false, found `{s}`"))),
            },
            Some(other) => Err(self.bad(key, format!("expected true or false, found {other}"))),
        }
    }

    fn gpus(&self) -> Result<Option<f64>, ConfigError> {
        match self.table.get("gpus").map(|v| &v.kind) {
            None => Ok(None),
            Some(ValueKind::String(s)) if s.trim().eq_ignore_ascii_case("auto") => Ok(None),
            Some(_) => self.number("gpus", 0.0).map(Some),
        }
    }

    fn text(&self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.table.get(key).map(|v| &v.kind) {
            None => Ok(None),
            Some(ValueKind::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.bad(key, format!("expected text, found {other}"))),
        }
    }

    fn size(&self, key: &str, default: u64) -> Result<u64, ConfigError> {
        let Some(value) = self.table.get(key) else {
            return Ok(default);
        };
        match &value.kind {
            ValueKind::I64(n) if *n >= 0 => Ok(*n as u64),
            ValueKind::U64(n) => Ok(*n),
            ValueKind::String(s) => parse_size(s).map_err(|m| self.bad(key, m)),
            other => Err(self.bad(
                key,
                format!("expected a size like \"300MiB\", found {other}"),
            )),
        }
    }

    fn optional_path(&self, key: &str) -> Result<Option<PathBuf>, ConfigError> {
        if !self.table.contains_key(key) {
            return Ok(None);
        }
        self.path(key, PathBuf::new()).map(Some)
    }

    /// A socket address, `host:port`; a host name is resolved now.
    fn addr(&self, key: &str) -> Result<Option<SocketAddr>, ConfigError> {
        let Some(text) = self.text(key)? else {
            return Ok(None);
        };
        let resolved = text
            .to_socket_addrs()
            .map_err(|e| {
                self.bad(
                    key,
                    format!("expected an address like \"127.0.0.1:7400\", found `{text}` ({e})"),
                )
            })?
            .next();
        resolved
            .map(Some)
            .ok_or_else(|| self.bad(key, format!("`{text}` resolves to no address")))
    }

    fn path(&self, key: &str, default: PathBuf) -> Result<PathBuf, ConfigError> {
        let Some(value) = self.table.get(key) else {
            return Ok(default);
        };
        match &value.kind {
            ValueKind::String(s) if !s.is_empty() => Ok(PathBuf::from(s)),
            other => Err(self.bad(key, format!("expected a directory path, found {other}"))),
        }
    }
}

impl NodeConfig {
    /// The node's CPU and GPU slots (no GPU while `gpus` is unresolved).
    pub fn slots(&self) -> crate::Resources {
        crate::Resources {
            cpus: self.cpus,
            gpus: self.gpus.unwrap_or(0.0),
            memory_bytes: 0,
        }
    }

    /// Whether `store_capacity` was asked for (by a file, the environment
    /// or code) rather than left at its default, 30% of memory: a store
    /// refuses to start with a capacity asked for that /dev/shm cannot
    /// back, and cuts a default one to fit.
    pub fn store_capacity_was_set(&self) -> bool {
        self.store_capacity != default_store_capacity()
    }

    /// Where the value of `key` came from, for errors about it found after
    /// loading (a TLS file that is missing, a head that does not answer).
    pub fn origin_of(key: &str, file: Option<&Path>) -> String {
        let var = format!("STREAMBATCH_{}", key.to_uppercase());
        if std::env::var_os(&var).is_some() {
            format!("the environment ({var})")
        } else {
            file.map_or_else(|| "the defaults".to_string(), |f| f.display().to_string())
        }
    }
}

fn value_origin(value: &Value, fallback: &str) -> String {
    match value.origin() {
        Some(o) => o.to_string(),
        None if fallback == "defaults" => "the environment (STREAMBATCH_*)".into(),
        None => fallback.to_string(),
    }
}

/// 30% of physical memory, as Ray sizes its object store; 2 GiB when unknown.
fn default_store_capacity() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        });
    total.map_or(2 << 30, |t| t / 10 * 3)
}
