//! A node's Prometheus metrics, served as text on `metrics_addr` (`GET
//! /metrics`): tasks by stage and state, rows and bytes per stage, the
//! store's bytes, slot use, pauses by cause, retries and lost partitions.
//!
//! The figures are read when scraped, from the live stats of the jobs the
//! node runs (the same [`JobStats`] that `Dataset::stats` returns) and from
//! its store; a job that has ended and that nobody else holds is folded
//! into running totals, so counters only grow. prometheus-client encodes
//! them (OpenMetrics text, which Prometheus scrapes) and hyper serves them.
//!
//! ```
//! use std::sync::Arc;
//! use streambatch_core::NodeConfig;
//! use streambatch_plan::Dataset;
//! use streambatch_sched::LocalCluster;
//!
//! let config = NodeConfig {
//!     metrics_addr: Some("127.0.0.1:0".parse().unwrap()),
//!     ..NodeConfig::default()
//! };
//! let cluster = Arc::new(LocalCluster::start(config).unwrap());
//! Dataset::range(cluster.clone(), 1000, 10).count().unwrap();
//! let text = cluster.metrics().render();
//! assert!(text.contains("streambatch_stage_rows_total{stage=\"range\"} 1000"));
//! ```

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use streambatch_plan::{JobStats, Pauses, RankStats, SplitWatch};
use streambatch_store::ObjectStore;

/// Label pairs of one series.
type Labels = Vec<(String, String)>;

/// What a node's metrics are read from.
pub struct NodeMetrics {
    store: Arc<dyn ObjectStore>,
    cpus: f64,
    gpus: f64,
    jobs: Mutex<Jobs>,
    /// Tasks holding a slot now, as the node's board counts them.
    busy: Arc<AtomicUsize>,
    /// Streaming splits whose ranks show, in the order they came.
    splits: Mutex<Vec<WatchedSplit>>,
}

/// A split's ranks, as the metrics read them.
struct WatchedSplit {
    read: SplitWatch,
    /// The figures last read: kept once the split is gone.
    last: Vec<RankStats>,
}

/// Jobs still watched, and what ended jobs added up to.
#[derive(Default)]
struct Jobs {
    watched: Vec<Arc<Mutex<JobStats>>>,
    ended: Tally,
}

/// Counts summed over jobs.
#[derive(Clone, Default)]
struct Tally {
    stages: BTreeMap<String, StageTally>,
    pauses: Pauses,
    lost_partitions: u64,
    remade_partitions: u64,
    jobs_ended: u64,
    jobs_running: u64,
}

#[derive(Clone, Default)]
struct StageTally {
    finished: u64,
    running: u64,
    retried: u64,
    skipped: u64,
    rows: u64,
    bytes: u64,
}

impl Tally {
    /// Adds a job's counts; its running tasks too unless it `ended`.
    fn add(&mut self, stats: &JobStats, ended: bool) {
        for op in &stats.operators {
            let stage = self.stages.entry(op.name.clone()).or_default();
            stage.finished += op.tasks;
            stage.retried += op.retries;
            stage.rows += op.rows;
            stage.bytes += op.bytes;
            if !ended {
                stage.running += op.running;
            }
        }
        for e in &stats.errored {
            self.stages.entry(e.stage.clone()).or_default().skipped += 1;
        }
        self.pauses.merge(&stats.pauses);
        self.lost_partitions += stats.recovery.lost_partitions;
        self.remade_partitions += stats.recovery.remade_partitions;
        if ended {
            self.jobs_ended += 1;
        } else {
            self.jobs_running += 1;
        }
    }
}

impl NodeMetrics {
    /// Metrics of a node with `cpus` and `gpus` slots over `store`.
    pub fn new(store: Arc<dyn ObjectStore>, cpus: f64, gpus: f64) -> Arc<Self> {
        Arc::new(Self {
            store,
            cpus,
            gpus,
            jobs: Mutex::default(),
            busy: Arc::default(),
            splits: Mutex::default(),
        })
    }

    /// The count of tasks holding a slot, for the node's board to keep.
    pub(crate) fn busy_slots(&self) -> Arc<AtomicUsize> {
        self.busy.clone()
    }

    /// Counts the job whose live stats are `live` from now on.
    pub fn watch(&self, live: Arc<Mutex<JobStats>>) {
        let mut jobs = self.lock();
        jobs.fold_ended();
        jobs.watched.push(live);
    }

    /// Shows a streaming split's ranks from now on (see
    /// `Runner::watch_split`).
    pub fn watch_split(&self, read: SplitWatch) {
        let mut splits = self.splits.lock().unwrap_or_else(|p| p.into_inner());
        splits.push(WatchedSplit {
            read,
            last: Vec::new(),
        });
    }

    /// Every watched split's ranks now, by split (numbered from 0).
    fn split_ranks(&self) -> Vec<Vec<RankStats>> {
        let mut splits = self.splits.lock().unwrap_or_else(|p| p.into_inner());
        splits
            .iter_mut()
            .map(|split| {
                if let Some(now) = (split.read)() {
                    split.last = now;
                }
                split.last.clone()
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, Jobs> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The metrics now, in the OpenMetrics text format.
    pub fn render(&self) -> String {
        let tally = {
            let mut jobs = self.lock();
            jobs.fold_ended();
            let mut tally = jobs.ended.clone();
            for live in &jobs.watched {
                let stats = live.lock().unwrap_or_else(|p| p.into_inner());
                tally.add(&stats, !stats.wall.is_zero());
            }
            tally
        };
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry(&tally));
        text
    }

    fn registry(&self, tally: &Tally) -> Registry {
        let mut registry = Registry::with_prefix("streambatch");
        let tasks = Family::<Labels, Counter>::default();
        let running = Family::<Labels, Gauge>::default();
        let rows = Family::<Labels, Counter>::default();
        let bytes = Family::<Labels, Counter>::default();
        let stage = |name: &str| vec![("stage".to_string(), name.to_string())];
        let state = |name: &str, state: &str| {
            let mut labels = stage(name);
            labels.push(("state".into(), state.into()));
            labels
        };
        for (name, s) in &tally.stages {
            for (label, n) in [
                ("finished", s.finished),
                ("retried", s.retried),
                ("skipped", s.skipped),
            ] {
                tasks.get_or_create(&state(name, label)).inc_by(n);
            }
            running.get_or_create(&stage(name)).set(s.running as i64);
            rows.get_or_create(&stage(name)).inc_by(s.rows);
            bytes.get_or_create(&stage(name)).inc_by(s.bytes);
        }
        registry.register(
            "tasks",
            "Tasks by stage and how they ended (finished, retried after a failure, skipped)",
            tasks,
        );
        registry.register("tasks_running", "Tasks running now, by stage", running);
        registry.register("stage_rows", "Rows each stage output", rows);
        registry.register("stage_bytes", "Bytes each stage output", bytes);

        let store = self.store.stats();
        let gauge = |v: u64| {
            let g = Gauge::<i64>::default();
            g.set(v as i64);
            g
        };
        let counter = |v: u64| {
            let c = Counter::<u64>::default();
            c.inc_by(v);
            c
        };
        registry.register(
            "store_used_bytes",
            "Bytes the store holds in memory",
            gauge(store.used_bytes),
        );
        registry.register(
            "store_capacity_bytes",
            "Bytes the store may hold in memory",
            gauge(store.capacity_bytes),
        );
        registry.register(
            "store_spilled_bytes",
            "Bytes the store spilled to disk",
            counter(store.spilled_bytes),
        );
        registry.register(
            "store_restored_bytes",
            "Bytes the store read back from disk",
            counter(store.restored_bytes),
        );

        let slots = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        for (kind, n) in [("cpu", self.cpus), ("gpu", self.gpus)] {
            slots
                .get_or_create(&vec![("kind".into(), kind.into())])
                .set(n);
        }
        registry.register("slots", "Logical slots of the node, by kind", slots);
        // The board's count: what runs on this node's workers now.
        let busy = self.busy.load(Ordering::Relaxed) as u64;
        registry.register("slots_busy", "Tasks holding a slot now", gauge(busy));

        let pauses = Family::<Labels, Counter>::default();
        let paused = Family::<Labels, Counter<f64, AtomicU64>>::default();
        let p = &tally.pauses;
        for (cause, n, time) in [
            ("output budget", p.output_budget_count, p.output_budget),
            ("store full", p.store_full_count, p.store_full),
        ] {
            let labels = vec![("cause".to_string(), cause.to_string())];
            pauses.get_or_create(&labels).inc_by(n);
            paused.get_or_create(&labels).inc_by(time.as_secs_f64());
        }
        registry.register("pauses", "Tasks paused for memory, by cause", pauses);
        registry.register(
            "paused_seconds",
            "Task-seconds paused for memory, by cause",
            paused,
        );
        registry.register(
            "lost_partitions",
            "Partitions lost with a node that jobs still needed",
            counter(tally.lost_partitions),
        );
        registry.register(
            "remade_partitions",
            "Partitions made again after a node was lost",
            counter(tally.remade_partitions),
        );
        let jobs = Family::<Labels, Gauge>::default();
        for (state, n) in [("running", tally.jobs_running), ("ended", tally.jobs_ended)] {
            jobs.get_or_create(&vec![("state".into(), state.into())])
                .set(n as i64);
        }
        registry.register("jobs", "Jobs this node ran, running or ended", jobs);
        self.register_splits(&mut registry);
        registry
    }

    /// Each streaming split's ranks: rows, pieces and batches taken, the
    /// time the trainer waited for data and the time data waited for the
    /// trainer.
    fn register_splits(&self, registry: &mut Registry) {
        let rows = Family::<Labels, Counter>::default();
        let pieces = Family::<Labels, Counter>::default();
        let batches = Family::<Labels, Counter>::default();
        let trainer_waited = Family::<Labels, Counter<f64, AtomicU64>>::default();
        let data_waited = Family::<Labels, Counter<f64, AtomicU64>>::default();
        for (split, ranks) in self.split_ranks().iter().enumerate() {
            for (rank, stats) in ranks.iter().enumerate() {
                let labels = vec![
                    ("split".to_string(), split.to_string()),
                    ("rank".to_string(), rank.to_string()),
                ];
                rows.get_or_create(&labels).inc_by(stats.rows as u64);
                pieces.get_or_create(&labels).inc_by(stats.pieces as u64);
                batches.get_or_create(&labels).inc_by(stats.batches as u64);
                trainer_waited
                    .get_or_create(&labels)
                    .inc_by(stats.waited_for_data.as_secs_f64());
                data_waited
                    .get_or_create(&labels)
                    .inc_by(stats.data_waited.as_secs_f64());
            }
        }
        registry.register(
            "split_rows",
            "Rows each rank of a streaming split took",
            rows,
        );
        registry.register(
            "split_pieces",
            "Pieces of partitions each rank of a streaming split took",
            pieces,
        );
        registry.register(
            "split_batches",
            "Batches each rank's consumer of a streaming split got",
            batches,
        );
        registry.register(
            "split_trainer_wait_seconds",
            "Time each rank's trainer waited for data",
            trainer_waited,
        );
        registry.register(
            "split_data_wait_seconds",
            "Time the rows a rank took waited for its trainer, summed over pieces",
            data_waited,
        );
    }
}

impl Jobs {
    /// Adds the jobs nobody else holds (they ended, or never started) to
    /// the totals, and lets them go.
    fn fold_ended(&mut self) {
        let ended = &mut self.ended;
        self.watched.retain(|live| {
            let gone = Arc::strong_count(live) == 1;
            if gone {
                ended.add(&live.lock().unwrap_or_else(|p| p.into_inner()), true);
            }
            !gone
        });
    }
}

/// The HTTP endpoint of a node's metrics; it stops when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsServer {
    /// Serves `metrics` on `addr` (port 0: any free port) from `runtime`.
    /// Fails when the address cannot be bound.
    pub fn start(
        metrics: Arc<NodeMetrics>,
        addr: SocketAddr,
        runtime: &tokio::runtime::Handle,
    ) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let task = runtime.spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of descriptors, say: wait rather than spin.
                        tracing::warn!("metrics endpoint: accepting a connection failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let response = respond(&metrics, &request);
                        async move { Ok::<_, Infallible>(response) }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let served = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                    if let Err(e) = served {
                        tracing::debug!("metrics endpoint: a connection ended: {e}");
                    }
                });
            }
        });
        Ok(Self { addr, task })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn respond<B>(metrics: &NodeMetrics, request: &Request<B>) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&hyper::Method::GET, "/metrics") => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "streambatch serves GET /metrics only\n".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

/// A cluster node's share of a job, for its metrics: the tasks the job ran
/// here, their rows and bytes, their pauses, and the tasks that failed here
/// for the driver to retry. The job's own stats live with its driver.
pub(crate) struct NodeShare {
    live: Arc<Mutex<JobStats>>,
    started: std::time::Instant,
    /// Tasks started here and not ended: their stage, and since when and
    /// why they are paused.
    tasks: std::collections::HashMap<streambatch_core::TaskId, (usize, Option<Paused>)>,
}

type Paused = (std::time::Instant, streambatch_plan::PauseCause);

/// How a task of a cluster node's share ended there.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskEnd {
    Finished,
    /// It failed in a way the driver retries: its worker panicked, or a
    /// system error (a failed put or fetch). The driver decides; the node
    /// counts it retried, as the driver does while its retries last.
    Retried,
    /// Its operator failed: the driver skips it, retries it (with
    /// `retry_user_errors`) or ends the job; the node counts none of these.
    Errored,
}

impl NodeShare {
    /// A share of a job with these stages, counted by `metrics`.
    pub(crate) fn new(stage_names: impl Iterator<Item = String>, metrics: &NodeMetrics) -> Self {
        let stats = JobStats {
            operators: stage_names
                .map(|name| streambatch_plan::OperatorStats {
                    name,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let live = Arc::new(Mutex::new(stats));
        metrics.watch(live.clone());
        Self {
            live,
            started: std::time::Instant::now(),
            tasks: Default::default(),
        }
    }

    fn with(&self, f: impl FnOnce(&mut JobStats)) {
        f(&mut self.live.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// `task` of `stage` starts here.
    pub(crate) fn started(&mut self, task: streambatch_core::TaskId, stage: usize) {
        self.tasks.insert(task, (stage, None));
        self.with(|s| s.operators[stage].running += 1);
    }

    /// `task` output `rows` rows in `bytes` bytes.
    pub(crate) fn output(&self, task: streambatch_core::TaskId, rows: u64, bytes: u64) {
        if let Some((stage, _)) = self.tasks.get(&task) {
            self.with(|s| {
                s.operators[*stage].rows += rows;
                s.operators[*stage].bytes += bytes;
            });
        }
    }

    /// `task` paused for `cause`, letting go of its slot.
    pub(crate) fn paused(
        &mut self,
        task: streambatch_core::TaskId,
        cause: streambatch_plan::PauseCause,
    ) {
        if let Some((stage, paused)) = self.tasks.get_mut(&task) {
            *paused = Some((std::time::Instant::now(), cause));
            let stage = *stage;
            self.with(|s| s.operators[stage].running -= 1);
        }
    }

    /// Paused `task` runs again.
    pub(crate) fn resumed(&mut self, task: streambatch_core::TaskId) {
        if let Some((stage, paused)) = self.tasks.get_mut(&task) {
            let (stage, paused) = (*stage, paused.take());
            self.with(|s| {
                s.operators[stage].running += 1;
                if let Some((since, cause)) = paused {
                    s.pauses.add(cause, since.elapsed());
                }
            });
        }
    }

    /// `task` ended here, as `how` says.
    pub(crate) fn ended(&mut self, task: streambatch_core::TaskId, how: TaskEnd) {
        if let Some((stage, paused)) = self.tasks.remove(&task) {
            self.with(|s| {
                stop(s, stage, paused);
                let op = &mut s.operators[stage];
                op.tasks += u64::from(how == TaskEnd::Finished);
                op.retries += u64::from(how == TaskEnd::Retried);
            });
        }
    }

    /// The job ended on this node.
    pub(crate) fn close(&mut self) {
        let wall = self
            .started
            .elapsed()
            .max(std::time::Duration::from_nanos(1));
        let paused: Vec<_> = self.tasks.drain().collect();
        self.with(|s| {
            for (_, (stage, paused)) in paused {
                stop(s, stage, paused);
            }
            s.wall = wall;
        });
    }
}

/// A task of `stage` stops here: a paused one adds its pause, a running one
/// gives back its slot.
fn stop(stats: &mut JobStats, stage: usize, paused: Option<Paused>) {
    match paused {
        Some((since, cause)) => stats.pauses.add(cause, since.elapsed()),
        None => stats.operators[stage].running -= 1,
    }
}
