//! An embedded one-node cluster: a tokio runtime, a NodeManager with its
//! workers, and a store, all in this process. It runs jobs for `Dataset`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use ractor::{Actor, ActorRef};
use streambatch_core::{JobId, NodeConfig, NodeId};
use streambatch_plan::{Error, ExecPlan, JobStats, JobStream, Result, Runner};
use streambatch_store::{ObjectStore, SharedStore, StoreConfig};

use crate::executor::{Executor, ExecutorArgs, Nodes};
use crate::msg::{JobItem, NodeMsg};
use crate::node::{NodeArgs, NodeManager};
use crate::output::JobOutput;
use crate::worker::WorkerThreads;

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
    node: ActorRef<NodeMsg>,
    threads: WorkerThreads,
    store: Arc<dyn ObjectStore>,
    config: NodeConfig,
    next_job: AtomicU64,
}

impl LocalCluster {
    /// Starts a node with `config` and a shared-memory store of its capacity.
    pub fn start(config: NodeConfig) -> Result<Self> {
        let store_config = StoreConfig::new(config.store_capacity, &config.spill_dir);
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
            .build()
            .map_err(|e| Error::Start {
                what: "the runtime",
                source: e.into(),
            })?;
        let threads = WorkerThreads::default();
        // Spawn from a plain thread so that starting works inside an async context too.
        let node = std::thread::scope(|s| {
            let args = NodeArgs {
                // The embedded node is the only one: the first id.
                id: NodeId(0),
                threads: threads.clone(),
            };
            s.spawn(|| runtime.block_on(Actor::spawn(None, NodeManager, args)))
                .join()
        })
        .map_err(|_| Error::Start {
            what: "the node manager",
            source: "it panicked".into(),
        })?
        .map_err(|e| Error::Start {
            what: "the node manager",
            source: e.into(),
        })?
        .0;
        Ok(Self {
            runtime: Some(runtime),
            node,
            threads,
            store,
            config,
            next_job: AtomicU64::new(1),
        })
    }

    /// The node's store.
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }
}

impl Runner for LocalCluster {
    fn run(&self, plan: ExecPlan) -> Result<Box<dyn JobStream>> {
        let (output, rx) = mpsc::channel();
        let live = Arc::new(Mutex::new(JobStats::default()));
        let args = ExecutorArgs {
            job: JobId(self.next_job.fetch_add(1, Ordering::Relaxed)),
            plan: Arc::new(plan),
            nodes: Nodes::Local {
                manager: self.node.clone(),
                store: self.store.clone(),
            },
            config: self.config.clone(),
            output: output.clone(),
            live: live.clone(),
        };
        let runtime = self.runtime.as_ref().expect("present until drop");
        runtime.spawn(async move {
            if let Err(e) = Actor::spawn(None, Executor, args).await {
                let _ = output.send(JobItem::End(Err(Error::Start {
                    what: "the executor",
                    source: e.into(),
                })));
            }
        });
        Ok(Box::new(JobOutput::new(rx, live, None)))
    }

    fn config(&self) -> &NodeConfig {
        &self.config
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.node.stop(None);
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
