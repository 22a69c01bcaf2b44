//! An embedded one-node cluster: a tokio runtime, a Supervisor over the
//! NodeManager (with its workers) and the jobs' executors, and a store, all
//! in this process. It runs jobs for `Dataset`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use ractor::{Actor, ActorRef};
use streambatch_core::{JobId, NodeConfig, NodeId};
use streambatch_plan::{Error, ExecPlan, JobStats, JobStream, Result, Runner};
use streambatch_store::{ObjectStore, SharedStore, StoreConfig};

use crate::driver::executor::{ExecutorArgs, Nodes};
use crate::driver::msg::JobItem;
use crate::driver::output::JobOutput;
use crate::driver::supervise::{Supervisor, SupervisorArgs, SupervisorMsg};
use crate::exec::metrics::{MetricsServer, NodeMetrics};
use crate::exec::node::NodeArgs;
use crate::exec::worker::WorkerThreads;

/// One node running in this process.
///
/// ```
/// use std::sync::Arc;
/// use streambatch_core::NodeConfig;
/// use streambatch_plan::Dataset;
/// use streambatch_sched::LocalCluster;
///
/// let cluster = Arc::new(LocalCluster::start(NodeConfig::default()).unwrap());
/// let n = Dataset::range(cluster, 1000, 10).count().unwrap();
/// assert_eq!(n, 1000);
/// ```
pub struct LocalCluster {
    runtime: Option<tokio::runtime::Runtime>,
    supervisor: ActorRef<SupervisorMsg>,
    threads: WorkerThreads,
    store: Arc<dyn ObjectStore>,
    config: NodeConfig,
    next_job: AtomicU64,
    /// The node's metrics and, with `metrics_addr`, their endpoint.
    metrics: Arc<NodeMetrics>,
    metrics_server: Option<MetricsServer>,
}

impl LocalCluster {
    /// Starts a node with `config` and a shared-memory store of its capacity.
    pub fn start(config: NodeConfig) -> Result<Self> {
        let store_config = StoreConfig {
            strict_capacity: config.store_capacity_was_set(),
            ..StoreConfig::new(config.store_capacity, &config.spill_dir)
        };
        let store =
            SharedStore::open(store_config).map_err(|e| Error::store("opening the store", e))?;
        Self::with_store(config, Arc::new(store))
    }

    /// Starts a node with `config` over the given store.
    pub fn with_store(config: NodeConfig, store: Arc<dyn ObjectStore>) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("streambatch-rt")
            .enable_time()
            // The metrics endpoint listens on TCP.
            .enable_io()
            .build()
            .map_err(|e| Error::Start {
                what: "the runtime",
                source: e.into(),
            })?;
        let threads = WorkerThreads::default();
        let slots = config.slots();
        let metrics = NodeMetrics::new(store.clone(), slots.cpus, slots.gpus);
        // Spawn from a plain thread so that starting works inside an async context too.
        let manager = NodeArgs {
            // The embedded node is the only one: the first id.
            id: NodeId(0),
            threads: threads.clone(),
            capacity: slots,
            busy: metrics.busy_slots(),
        };
        let args = SupervisorArgs {
            manager: Some(manager),
        };
        let supervisor = std::thread::scope(|s| {
            s.spawn(|| runtime.block_on(Actor::spawn(None, Supervisor, args)))
                .join()
        })
        .map_err(|_| Error::Start {
            what: "the node's supervisor",
            source: "it panicked".into(),
        })?
        .map_err(|e| Error::Start {
            what: "the node's supervisor",
            source: e.into(),
        })?
        .0;
        let metrics_server = match config.metrics_addr {
            Some(addr) => Some(
                MetricsServer::start(metrics.clone(), addr, runtime.handle()).map_err(|e| {
                    supervisor.stop(None);
                    Error::Start {
                        what: "the metrics endpoint",
                        source: format!("metrics_addr {addr}: {e}").into(),
                    }
                })?,
            ),
            None => None,
        };
        Ok(Self {
            runtime: Some(runtime),
            supervisor,
            threads,
            store,
            config,
            next_job: AtomicU64::new(1),
            metrics,
            metrics_server,
        })
    }

    /// The node's store.
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }

    /// The node's metrics (served on `metrics_addr` when it is set).
    pub fn metrics(&self) -> Arc<NodeMetrics> {
        self.metrics.clone()
    }

    /// Where the metrics endpoint listens (with `metrics_addr` only).
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_server.as_ref().map(MetricsServer::addr)
    }
}

impl Runner for LocalCluster {
    fn run(&self, plan: ExecPlan) -> Result<Box<dyn JobStream>> {
        let (output, rx) = mpsc::channel();
        let live = Arc::new(Mutex::new(JobStats::default()));
        self.metrics.watch(live.clone());
        let (store, config) = (self.store.clone(), self.config.clone());
        let (job_output, job_live) = (output.clone(), live.clone());
        let job = JobId(self.next_job.fetch_add(1, Ordering::Relaxed));
        let job = Box::new(move |manager| ExecutorArgs {
            job,
            plan: Arc::new(plan),
            nodes: Nodes::Local { manager, store },
            config,
            output: job_output,
            live: job_live,
        });
        let supervisor = self.supervisor.clone();
        let runtime = self.runtime.as_ref().expect("present until drop");
        runtime.spawn(async move {
            let started = ractor::call!(supervisor, |reply| SupervisorMsg::StartLocalJob {
                job,
                reply
            });
            let failed = match started {
                Ok(Ok(_)) => return,
                Ok(Err(e)) => e,
                Err(e) => Error::Start {
                    what: "the executor",
                    source: e.into(),
                },
            };
            let _ = output.send(JobItem::End(Err(failed)));
        });
        Ok(Box::new(JobOutput::new(rx, live, None)))
    }

    fn watch_split(&self, ranks: streambatch_plan::SplitWatch) {
        self.metrics.watch_split(ranks);
    }

    fn config(&self) -> &NodeConfig {
        &self.config
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.metrics_server.take();
        self.supervisor.stop(None);
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
        }
        // The workers' threads end once their actors are gone; wait (a
        // little) for them to drop what they hold, so that the store, freed
        // with this node, unlinks its segments even when the process exits
        // right after.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for thread in threads {
            while !thread.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
}
