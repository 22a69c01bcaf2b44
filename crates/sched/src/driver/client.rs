//! A driver's connection to a cluster: it joins the head as a peer with its
//! own certificate (but no slots), learns the members from the head's
//! agent, and runs jobs on them: each job's Executor runs here, in the
//! driver, as Ray Data's streaming executor runs in its driver, and sends
//! tasks to the nodes' agents (docs/architecture.md, "The cluster").

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use ractor::{Actor, ActorRef};
use streambatch_core::{JobId, NodeConfig};
use streambatch_net::{
    Endpoint, Fetched, Locality, NetError, PartitionServer, Served, Transport, frame,
};
use streambatch_plan::{Error, ExecPlan, JobStats, JobStream, Result, Runner};

use crate::driver::executor::remote::{Joining, MAX_PAYLOAD_BYTES, RemoteNode};
use crate::driver::executor::{ExecutorArgs, Nodes};
use crate::driver::msg::ExecutorMsg;
use crate::driver::output::JobOutput;
use crate::driver::supervise::{Supervisor, SupervisorArgs, SupervisorMsg};
use crate::error::ClusterError;
use crate::exec::partitioner::{RemotePart, RemoteSource};
use crate::wire::groups::{head_group, node_group, remote_member};
use crate::wire::join::{load_identity, peer_timeout, runtime};
use crate::wire::msg::AgentMsg;
use crate::wire::plan::PlanSpec;
use crate::wire::{JobKey, JobOrder, JobStart, Members, NodeInfo, Order};

/// Running jobs' executors, each with the names of the nodes it uses.
type RunningJobs = Arc<Mutex<Vec<(Vec<String>, ActorRef<ExecutorMsg>)>>>;

/// Job ids, unique in this process (a process may hold several clients).
static NEXT_JOB: AtomicU64 = AtomicU64::new(1);

/// How long a driver waits for the head, or for a node to answer.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

/// A driver connected to a cluster's head.
pub struct ClusterClient {
    runtime: tokio::runtime::Runtime,
    /// The root of this driver's actors: its transport, jobs' ports and
    /// executors (see `supervise`).
    supervisor: ActorRef<SupervisorMsg>,
    transport: Transport,
    head: ActorRef<AgentMsg>,
    config: NodeConfig,
    /// The cluster's id.
    cluster: String,
    /// Running jobs' executors, by the nodes they use, told of node loss.
    jobs: RunningJobs,
}

/// A driver holds no partitions of its own, only the blobs its jobs'
/// recipes refer to (a model file), which each node pulls once per job.
struct DriverBlobs;

impl PartitionServer for DriverBlobs {
    fn serve(&self, id: u64, _: bool) -> std::result::Result<Served, String> {
        match streambatch_plan::Blob::find_id(id) {
            Some(blob) => Ok(Served::Bytes(Box::new(blob.bytes().clone()))),
            None => Err(format!(
                "partition {id}: a driver holds no partitions, and no blob of that id"
            )),
        }
    }
}

impl ClusterClient {
    /// Connects to the head named by `config` (`head`, and the TLS keys);
    /// `file` is where the config came from, for errors.
    pub fn connect(
        config: &NodeConfig,
        file: Option<&Path>,
    ) -> std::result::Result<Self, ClusterError> {
        let origin = |key| NodeConfig::origin_of(key, file);
        let head = config.head.ok_or_else(|| ClusterError::Missing {
            key: "head",
            origin: origin("head"),
            hint: "a driver needs the head's address, as \"127.0.0.1:7400\"",
        })?;
        let identity = load_identity(config, file)?;
        let cluster = identity.cluster_id().to_string();
        let runtime = runtime("streambatch-driver")?;
        let unreachable = |source| ClusterError::HeadUnreachable {
            addr: head,
            origin: origin("head"),
            waited_s: CONNECT_WITHIN.as_secs(),
            source,
        };
        let jobs = RunningJobs::default();
        let (supervisor, transport, head) = runtime.block_on(async {
            let (supervisor, _) = Actor::spawn(None, Supervisor, SupervisorArgs { manager: None })
                .await
                .map_err(|e| ClusterError::Start {
                    what: "the driver's supervisor",
                    source: e.into(),
                })?;
            let endpoint =
                Endpoint::bind_with_timeout(config.listen, &identity, peer_timeout(config))
                    .map_err(|source| ClusterError::Listen {
                        origin: origin("listen"),
                        source,
                    })?;
            let here = Locality::here(&config.spill_dir);
            let transport = Transport::start(
                &config.name,
                endpoint,
                Arc::new(DriverBlobs),
                here,
                Some(supervisor.get_cell()),
            )
            .await
            .map_err(|source| ClusterError::Start {
                what: "the transport",
                source: source.into(),
            })?;
            let _ = supervisor.cast(SupervisorMsg::Transport(transport.node_server().get_id()));
            let head_name: Arc<Mutex<String>> = Arc::default();
            let lost = NodeLoss {
                jobs: jobs.clone(),
                head: head_name.clone(),
            };
            transport.on_peer_lost(move |peer: &str| lost.lost(peer));
            match tokio::time::timeout(CONNECT_WITHIN, transport.join(head)).await {
                Ok(Ok(peer)) => {
                    *head_name.lock().unwrap_or_else(|p| p.into_inner()) = peer.name().into()
                }
                Ok(Err(e)) => return Err(unreachable(e)),
                Err(_) => return Err(unreachable(NetError::Config("no answer".into()))),
            }
            let agent = agent_of(&head_group(&cluster)).await.ok_or_else(|| {
                let why = "the QUIC connection opened but the actor session did not";
                unreachable(NetError::Config(why.into()))
            })?;
            Ok((supervisor, transport, agent))
        })?;
        Ok(Self {
            runtime,
            supervisor,
            transport,
            head,
            config: config.clone(),
            cluster,
            jobs,
        })
    }

    /// The cluster's members, as the head knows them now.
    pub fn members(&self) -> std::result::Result<Members, ClusterError> {
        let head = self.head.clone();
        let bytes = self
            .runtime
            .block_on(async move { ractor::call_t!(head, AgentMsg::GetMembers, 5_000) })
            .map_err(|e| ClusterError::Stopped(format!("the head did not answer: {e}")))?;
        frame::decode(&bytes)
            .map_err(|e| ClusterError::Stopped(format!("the head's member list: {e}")))
    }

    /// Connects to each member with slots and starts job `key` there;
    /// returns them in the order the job numbers its nodes.
    async fn start_on_nodes(
        &self,
        key: &JobKey,
        (plan, spec): (&ExecPlan, &PlanSpec),
        members: Vec<NodeInfo>,
    ) -> Result<(Vec<RemoteNode>, JobStart)> {
        let smallest = members.iter().map(|n| n.store_capacity).min().unwrap_or(1);
        let (target_bytes, reserve) = plan.sizing(self.config.target_partition_bytes, smallest);
        let start = JobStart {
            key: key.clone(),
            plan: spec.clone(),
            target_bytes,
            reserve,
            nodes: members
                .iter()
                .map(|m| (m.name.clone(), m.addr.clone()))
                .collect(),
        };
        let bytes = frame::encode(&start).to_vec();
        // A frame over ractor_cluster's limit would close the session (and
        // the node would look lost): refuse such a plan here, saying why.
        let limit = MAX_PAYLOAD_BYTES;
        if bytes.len() > limit {
            return Err(Error::Invalid(format!(
                "the plan takes {} bytes on the wire, over the {limit} a cluster message \
                 carries: give operators large parameters (weights, tables) as files \
                 they read on the node",
                bytes.len()
            )));
        }
        let mut nodes: Vec<RemoteNode> = Vec::new();
        // A node that refuses (or fails) ends the job on those that started it.
        let undo = |nodes: &[RemoteNode]| {
            for node in nodes {
                let _ = node.order(key, JobOrder::End);
            }
        };
        for member in members {
            let started = start_on(&self.transport, &self.cluster, key, &member, &bytes);
            let agent = match started.await {
                Ok(agent) => agent,
                Err(e) => {
                    undo(&nodes);
                    return Err(e);
                }
            };
            nodes.push(RemoteNode::new(member, agent));
        }
        Ok((nodes, start))
    }
}

/// Connects to `member` (unless connected) and starts job `key` there with
/// the `JobStart` in `bytes`; its agent, or why not.
async fn start_on(
    transport: &Transport,
    cluster: &str,
    key: &JobKey,
    member: &NodeInfo,
    bytes: &[u8],
) -> Result<ActorRef<AgentMsg>> {
    let lost = || Error::NodeLost {
        node: member.name.clone(),
    };
    if transport.peer(&member.name).is_none() {
        let addr = member.addr.parse().map_err(|_| lost())?;
        transport.join(addr).await.map_err(|e| Error::OnNode {
            node: member.name.clone(),
            message: e.to_string(),
        })?;
    }
    let agent = agent_of(&node_group(cluster, &member.name))
        .await
        .ok_or_else(lost)?;
    let answer =
        ractor::call_t!(agent, AgentMsg::StartJob, 10_000, bytes.to_vec()).map_err(|_| lost())?;
    if !answer.is_empty() {
        let _ = agent.cast(AgentMsg::Order(
            frame::encode(&Order {
                key: key.clone(),
                order: JobOrder::End,
            })
            .to_vec(),
        ));
        return Err(Error::Invalid(format!("refused at submission: {answer}")));
    }
    Ok(agent)
}

/// A running job, as the driver's loop taking in new nodes sees it.
struct RunningJob {
    transport: Transport,
    head: ActorRef<AgentMsg>,
    cluster: String,
    executor: ActorRef<ExecutorMsg>,
    /// The driver's jobs, with the nodes each runs on.
    jobs: RunningJobs,
    source: Arc<ClusterSource>,
    /// Where new nodes wait for the executor.
    joining: Joining,
}

/// While job `start.key` runs: every second, asks the head for its members and
/// starts the job on each node with slots that joined since, then hands it
/// to the executor (which gives it tasks at its next decision).
async fn take_in_new_nodes(job: RunningJob, mut start: JobStart) {
    let RunningJob {
        transport,
        head,
        cluster,
        executor,
        jobs,
        source,
        joining,
    } = job;
    let mut known: std::collections::HashSet<String> =
        start.nodes.iter().map(|(name, _)| name.clone()).collect();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Ok(bytes) = ractor::call_t!(head, AgentMsg::GetMembers, 2_000) else {
            continue;
        };
        let Ok(members) = frame::decode::<Members>(&bytes) else {
            continue;
        };
        for member in members.nodes {
            if known.contains(&member.name) || (member.cpus <= 0.0 && member.gpus <= 0.0) {
                continue;
            }
            known.insert(member.name.clone());
            start.nodes.push((member.name.clone(), member.addr.clone()));
            let bytes = frame::encode(&start).to_vec();
            match start_on(&transport, &cluster, &start.key, &member, &bytes).await {
                Ok(agent) => {
                    tracing::info!(node = %member.name, job = start.key.job, "a node joined the job");
                    source
                        .agents
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(member.name.clone(), agent.clone());
                    (source.places.lock().unwrap_or_else(|p| p.into_inner()))
                        .extend(ClusterSource::places_of(std::slice::from_ref(&member)));
                    for (names, e) in jobs.lock().unwrap_or_else(|p| p.into_inner()).iter_mut() {
                        if e.get_id() == executor.get_id() {
                            names.push(member.name.clone());
                        }
                    }
                    let node = RemoteNode::new(member, agent);
                    joining.lock().unwrap_or_else(|p| p.into_inner()).push(node);
                    if executor.cast(ExecutorMsg::NodeJoined).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(node = %member.name, error = %e, "a new node did not take the job")
                }
            }
        }
    }
}

impl Runner for ClusterClient {
    fn run(&self, plan: ExecPlan) -> Result<Box<dyn JobStream>> {
        let spec = PlanSpec::of(&plan)?;
        let members: Vec<NodeInfo> = self
            .members()
            .map_err(|e| Error::Invalid(e.to_string()))?
            .nodes
            .into_iter()
            .filter(|n| n.cpus > 0.0 || n.gpus > 0.0)
            .collect();
        if members.is_empty() {
            return Err(Error::Invalid(
                "the cluster has no node with slots to run tasks".into(),
            ));
        }
        let key = JobKey {
            cluster: self.cluster.clone(),
            driver: self.config.name.clone(),
            job: NEXT_JOB.fetch_add(1, Ordering::Relaxed),
        };
        let (output, rx) = mpsc::channel();
        let live = Arc::new(Mutex::new(JobStats::default()));
        let executor_cell: Arc<OnceLock<ActorRef<ExecutorMsg>>> = Arc::default();
        let handle = self.runtime.handle().clone();
        let source = Arc::new(ClusterSource {
            handle: handle.clone(),
            transport: self.transport.clone(),
            agents: Mutex::new(HashMap::new()),
            places: Mutex::new(ClusterSource::places_of(&members)),
            key: key.clone(),
        });
        let joining = Joining::default();
        let (port, executor, watcher) = self.runtime.block_on(async {
            let executor = executor_cell.clone();
            let port = ractor::call!(self.supervisor, |reply| SupervisorMsg::OpenPort {
                key: key.clone(),
                executor,
                reply
            })
            .map_err(|e| Error::Start {
                what: "the job's port",
                source: e.into(),
            })??;
            let (nodes, start) = match self.start_on_nodes(&key, (&plan, &spec), members).await {
                Ok(started) => started,
                Err(e) => {
                    port.stop(None);
                    return Err(e);
                }
            };
            *source.agents.lock().unwrap_or_else(|p| p.into_inner()) = nodes
                .iter()
                .map(|n| (n.name.clone(), n.agent.clone()))
                .collect();
            let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
            let args = ExecutorArgs {
                job: JobId(key.job),
                plan: Arc::new(plan),
                nodes: Nodes::Remote {
                    key: key.clone(),
                    port: executor_cell.clone(),
                    nodes,
                    source: source.clone(),
                    joining: joining.clone(),
                },
                config: self.config.clone(),
                output,
                live: live.clone(),
            };
            let ending = source.clone();
            let started = ractor::call!(self.supervisor, |reply| SupervisorMsg::StartJob {
                args: Box::new(args),
                end: Box::new(move || ending.end_job()),
                reply
            })
            .map_err(|e| Error::Start {
                what: "the executor",
                source: e.into(),
            });
            let executor = match started.and_then(|s| s) {
                Ok(executor) => executor,
                Err(e) => {
                    port.stop(None);
                    return Err(e);
                }
            };
            self.jobs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((names, executor.clone()));
            let job = RunningJob {
                transport: self.transport.clone(),
                head: self.head.clone(),
                cluster: self.cluster.clone(),
                executor: executor.clone(),
                jobs: self.jobs.clone(),
                source: source.clone(),
                joining: joining.clone(),
            };
            let watcher = tokio::spawn(take_in_new_nodes(job, start));
            Ok::<_, Error>((port, executor, watcher))
        })?;
        let jobs = self.jobs.clone();
        let reads = executor.clone();
        let on_done = Box::new(move || {
            // Ended, or the driver dropped the stream: either way the job
            // ends (a no-op if it has), and then its port.
            let _ = executor.cast(ExecutorMsg::Cancel);
            watcher.abort();
            port.stop(None);
            jobs.lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(_, e)| e.get_id() != executor.get_id());
        });
        Ok(Box::new(
            JobOutput::new(rx, live, Some(on_done)).confirming_reads(reads),
        ))
    }

    fn config(&self) -> &NodeConfig {
        &self.config
    }
}

impl Drop for ClusterClient {
    fn drop(&mut self) {
        self.transport.stop();
        self.supervisor.stop(None);
    }
}

/// The agent in process group `group`, once it is seen (ractor_cluster
/// announces a peer's groups right after its session is ready).
async fn agent_of(group: &str) -> Option<ActorRef<AgentMsg>> {
    let started = Instant::now();
    loop {
        if let Some(agent) = remote_member::<AgentMsg>(group) {
            return Some(agent);
        }
        if started.elapsed() >= CONNECT_WITHIN {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads the job's partitions from the nodes holding them, and tells those
/// nodes when the job is done with them.
struct ClusterSource {
    handle: tokio::runtime::Handle,
    transport: Transport,
    agents: Mutex<HashMap<String, ActorRef<AgentMsg>>>,
    /// Where each node of the job listens, and its store's locality.
    places: Mutex<HashMap<String, (String, Locality)>>,
    key: JobKey,
}

impl RemoteSource for ClusterSource {
    fn fetch(&self, holder: &str, id: u64, keep: Arc<RemotePart>) -> Result<RecordBatch> {
        let failed = |message: String| Error::OnNode {
            node: holder.to_string(),
            message: format!("fetching partition {id}: {message}"),
        };
        if self.transport.is_lost(holder) {
            return Err(failed("the node is lost".into()));
        }
        let fetched = self
            .handle
            .block_on(self.transport.fetch(holder, id))
            .map_err(|e| failed(e.to_string()))?;
        match fetched {
            // The batch holds the part (whose drop releases it) and the
            // lease (the holder's pin) while its buffers live.
            Fetched::Shared(name, lease) => {
                streambatch_store::open_shared_keeping(&name, Arc::new((keep, lease)))
                    .map(|p| p.batch)
                    .map_err(|e| failed(e.to_string()))
            }
            // Asked for whole: rows alone would not be the partition.
            Fetched::Rows(_) => Err(failed("sent rows, not the partition".into())),
            Fetched::Bytes(bytes) => {
                streambatch_store::ipc::decode_unaligned(&bytes).map_err(|e| failed(e.to_string()))
            }
        }
    }

    fn place(&self, holder: &str) -> Option<(String, Locality)> {
        let places = self.places.lock().unwrap_or_else(|p| p.into_inner());
        places.get(holder).cloned()
    }

    fn release(&self, holder: &str, id: u64) {
        let agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(agent) = agents.get(holder) {
            let order = Order {
                key: self.key.clone(),
                order: JobOrder::Release { ids: vec![id] },
            };
            let _ = agent.cast(AgentMsg::Order(frame::encode(&order).to_vec()));
        }
    }
}

impl ClusterSource {
    /// Where `members` listen, and their stores' localities, by name.
    fn places_of(members: &[NodeInfo]) -> HashMap<String, (String, Locality)> {
        (members.iter())
            .map(|m| (m.name.clone(), (m.addr.clone(), m.locality.clone())))
            .collect()
    }

    /// Tells every node of the job (those that joined it too) that it
    /// ended: for a job whose executor failed before it could.
    fn end_job(&self) {
        let order = Order {
            key: self.key.clone(),
            order: JobOrder::End,
        };
        let bytes = frame::encode(&order).to_vec();
        for agent in self
            .agents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            let _ = agent.cast(AgentMsg::Order(bytes.clone()));
        }
    }
}

/// Tells running jobs when one of their nodes is lost (its last session).
struct NodeLoss {
    jobs: RunningJobs,
    /// The head's name: its loss ends every running job.
    head: Arc<Mutex<String>>,
}

impl NodeLoss {
    /// `lost`'s last session ended.
    fn lost(&self, lost: &str) {
        let head = *self.head.lock().unwrap_or_else(|p| p.into_inner()) == lost;
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        for (nodes, executor) in jobs.iter() {
            if head {
                let _ = executor.cast(ExecutorMsg::HeadLost(lost.to_string()));
            } else if nodes.iter().any(|n| n == lost) {
                let _ = executor.cast(ExecutorMsg::NodeLost(lost.to_string()));
            }
        }
    }
}
