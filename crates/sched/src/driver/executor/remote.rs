//! The executor's remote backend: a job whose tasks run on cluster nodes,
//! each reached through its agent and sent the job's orders. The nodes'
//! events come back through the job's port; the executor keeps a shadow of
//! each node's budgets and store to decide on, makes again what a lost
//! node ran and held, adds nodes that join the running job and moves the
//! outputs of one that drains.

use std::collections::HashMap;
use std::sync::Arc;

use ractor::ActorRef;
use streambatch_core::{NodeConfig, Resources, TaskId};
use streambatch_net::{RowRange, Want, frame};
use streambatch_plan::{Error, KeySample};

use crate::driver::executor::{Backend, Opened, Opening, memory_freed};
use crate::driver::msg::ExecutorMsg;
use crate::exec::budget::{Budgets, StageTotals};
use crate::exec::partitioner::{RemotePart, RemoteSource, Slice};
use crate::job::record::Recorder;
use crate::job::{Action, JobState, Memory, Origin, Part, RunInput, Start};
use crate::wire::msg::AgentMsg;
use crate::wire::{
    Happened, InputSpec, JobKey, JobOrder, KeyRangeSpec, NodeEvent, NodeInfo, Order, PartSpec,
    StoreView,
};

/// A cluster node as a job's executor sees it.
pub(crate) struct RemoteNode {
    /// Its name.
    pub(crate) name: String,
    /// Where it listens.
    pub(crate) addr: String,
    /// Its agent.
    pub(crate) agent: ActorRef<AgentMsg>,
    /// Its slots.
    pub(crate) slots: Resources,
    /// Its store's capacity.
    pub(crate) capacity: u64,
}

impl RemoteNode {
    /// The member `info` of the cluster, reached through `agent`.
    pub(crate) fn new(info: NodeInfo, agent: ActorRef<AgentMsg>) -> Self {
        Self {
            slots: info.slots(),
            capacity: info.store_capacity,
            name: info.name,
            addr: info.addr,
            agent,
        }
    }

    /// Sends the node an order of job `key`.
    pub(crate) fn order(&self, key: &JobKey, order: JobOrder) -> Result<(), OrderError> {
        let order = encode_order(key, order)?;
        let sent = self.agent.cast(AgentMsg::Order(order));
        sent.map_err(|_| OrderError::Gone)
    }
}

/// Room in a cluster frame for ractor_cluster's envelope around a payload.
const ENVELOPE_BYTES: usize = 64 << 10;

/// The most bytes a payload of a cluster message may take: one over it
/// would close the session, and the node would look lost.
pub(crate) const MAX_PAYLOAD_BYTES: usize = frame::MAX_CONTROL_FRAME as usize - ENVELOPE_BYTES;

/// Why an order did not go.
#[derive(Debug, PartialEq)]
pub(crate) enum OrderError {
    /// The node's agent is gone.
    Gone,
    /// It takes this many bytes, over [`MAX_PAYLOAD_BYTES`].
    TooLarge(usize),
}

impl OrderError {
    /// Why an order to node `node` did not go, as the job's error.
    pub(crate) fn why(&self, node: &str) -> Error {
        let message = match self {
            Self::Gone => format!("node {node} is gone"),
            // A task's input listing too many partitions (a reducer of an
            // exchange of as many map outputs): the job cannot go on.
            Self::TooLarge(bytes) => format!(
                "an order to node {node} takes {bytes} bytes, over the {MAX_PAYLOAD_BYTES} a \
                 cluster message carries: its task reads too many partitions (an exchange \
                 of this many map outputs; a larger target_partition_bytes makes fewer)"
            ),
        };
        Error::Invalid(message)
    }
}

/// Order `order` of job `key` as a cluster message carries it.
fn encode_order(key: &JobKey, order: JobOrder) -> Result<Vec<u8>, OrderError> {
    let order = Order {
        key: key.clone(),
        order,
    };
    let bytes = frame::encode(&order).to_vec();
    match bytes.len() {
        len if len > MAX_PAYLOAD_BYTES => Err(OrderError::TooLarge(len)),
        _ => Ok(bytes),
    }
}

/// The store of a node of capacity `capacity`, before it reports.
fn store_of(capacity: u64) -> StoreView {
    StoreView {
        capacity,
        ..Default::default()
    }
}

/// Where `slice`, held by a node of a cluster job, lies, for the node that
/// reads it: its rows, or its destination for the holder to find.
fn part_spec(slice: &Slice) -> PartSpec {
    let part = slice
        .remote_part()
        .expect("a cluster job's partitions are on its nodes");
    let (offset, len) = (slice.offset as u64, slice.len as u64);
    let want = match slice.destination() {
        Some(d) => Want::Group(d),
        None => Want::Rows(RowRange { offset, len }),
    };
    PartSpec {
        holder: part.holder.clone(),
        id: part.id,
        want,
    }
}

/// Nodes that took a running job, waiting for its executor to add them.
pub(crate) type Joining = Arc<std::sync::Mutex<Vec<RemoteNode>>>;

/// Tasks on cluster nodes.
pub(super) struct Remote {
    key: JobKey,
    nodes: Vec<RemoteNode>,
    source: Arc<dyn RemoteSource>,
    /// Per node: the job's budgets there, as this executor accounts them
    /// (each node enforces its own; these steer the decisions).
    shadows: Vec<Budgets>,
    /// Per node: its store as its last event saw it.
    stores: Vec<StoreView>,
    /// Each stage's memory reserve, for the budgets of a node that joins.
    reserve: Vec<u64>,
    joining: Joining,
    /// Per node: it was lost (its events are not heard any more).
    gone: Vec<bool>,
    /// Partitions asked to move off a draining node, by holder and id:
    /// which output they are, of which stage, and whether their cut goes
    /// with them (`JobOrder::Adopt.with_cut`).
    adopting: HashMap<(String, u64), (Origin, usize, bool)>,
}

impl Memory for Remote {
    fn fits(&self, node: usize, stage: usize, bytes: u64) -> bool {
        let store = self.stores[node];
        self.shadows[node].fits(stage, bytes) && bytes <= store.capacity.saturating_sub(store.used)
    }

    fn frees(&self, node: usize) -> u64 {
        self.stores[node].frees
    }

    fn held(&self, stage: usize) -> u64 {
        self.shadows.first().map_or(0, |b| b.totals().held(stage))
    }

    fn capacity(&self, node: usize) -> u64 {
        self.stores[node].capacity
    }

    fn outside(&self, _node: usize) -> u64 {
        0
    }
}

impl Remote {
    /// Opens job `key` on cluster `nodes`, whose partitions `source` reads:
    /// the job's `port` finds this executor from now, and nodes that join
    /// wait in `joining`.
    pub(super) fn open(
        opening: Opening<'_>,
        key: JobKey,
        port: crate::driver::port::ExecutorCell,
        nodes: Vec<RemoteNode>,
        source: Arc<dyn RemoteSource>,
        joining: Joining,
    ) -> Opened {
        let Opening {
            plan,
            config,
            myself,
            ..
        } = opening;
        let _ = port.set(myself.clone());
        let smallest = nodes.iter().map(|n| n.capacity).min().unwrap_or(1);
        let (target_bytes, reserve) = plan.sizing(config.target_partition_bytes, smallest);
        let totals = StageTotals::new(reserve.len());
        let shadow = |n: &RemoteNode| {
            Budgets::adding_to(
                totals.clone(),
                n.capacity,
                reserve.clone(),
                memory_freed(myself),
            )
        };
        let shadows = nodes.iter().map(shadow).collect();
        let stores = nodes.iter().map(|n| store_of(n.capacity)).collect();
        let free = nodes.iter().map(|n| n.slots).collect();
        let gone = vec![false; nodes.len()];
        let capacity = nodes.iter().map(|n| n.capacity).sum();
        let remote = Remote {
            gone,
            key,
            nodes,
            source,
            shadows,
            stores,
            reserve,
            joining,
            adopting: HashMap::new(),
        };
        Opened {
            backend: Box::new(remote),
            free,
            capacity,
            target_bytes,
            // A cluster node's relay counts spills from the job's start itself.
            store_before: (0, 0),
        }
    }

    /// A node joins the running job: the others learn where it listens
    /// (to fetch its outputs), and it gets slots, a shadow budget and
    /// stats of its own.
    fn join(&mut self, node: RemoteNode, job: &mut JobState<Slice>, me: &ActorRef<ExecutorMsg>) {
        let peer = JobOrder::Peer {
            name: node.name.clone(),
            addr: node.addr.clone(),
        };
        for other in &self.nodes {
            let _ = other.order(&self.key, peer.clone());
        }
        let totals = self.shadows[0].totals().clone();
        let reserve = self.reserve.clone();
        let shadow = Budgets::adding_to(totals, node.capacity, reserve, memory_freed(me));
        self.shadows.push(shadow);
        self.stores.push(store_of(node.capacity));
        self.gone.push(false);
        job.recorder().node_joined(&node.name);
        let number = job.add_node(node.slots);
        debug_assert_eq!(number, self.nodes.len());
        self.nodes.push(node);
    }

    /// The order that starts a task on its node.
    fn run_order(start: Start<Slice>) -> JobOrder {
        let (input, range) = match start.input {
            RunInput::Split(i) => (InputSpec::Split(i as u64), None),
            RunInput::Parts(parts, range) => (
                InputSpec::Parts(parts.iter().map(part_spec).collect()),
                range,
            ),
        };
        let range = range.map(|r| KeyRangeSpec {
            lo: r.lo.clone(),
            hi: r.hi.clone(),
        });
        JobOrder::Run {
            task: start.task.0,
            stage: start.stage as u64,
            input,
            keep_from: start.keep.from,
            keep_again: start.keep.again,
            may_spill: start.may_spill,
            range,
            rows: start.rows,
        }
    }

    /// Sends `node` an order; a node that cannot be reached is lost.
    fn tell(&mut self, node: usize, order: JobOrder, job: &mut JobState<Slice>) {
        let target = &self.nodes[node];
        match target.order(&self.key, order) {
            Ok(()) => {}
            Err(OrderError::Gone) => {
                self.gone[node] = true;
                job.on_node_lost(node, &target.name.clone());
            }
            Err(too_large) => job.fail(too_large.why(&target.name)),
        }
    }

    fn tell_all(&self, order: JobOrder) {
        for (node, gone) in self.nodes.iter().zip(&self.gone) {
            if !gone {
                let _ = node.order(&self.key, order.clone());
            }
        }
    }
}

impl Backend for Remote {
    #[cfg(feature = "failpoints")]
    fn job_id(&self) -> u64 {
        self.key.job
    }

    fn record_nodes(&self, recorder: &Recorder) {
        let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        recorder.nodes(&names);
    }

    /// A cluster job may lose nodes: it keeps what it needs to make their
    /// partitions again.
    fn configure(&self, job: JobState<Slice>, _config: &NodeConfig) -> JobState<Slice> {
        job.with_lineage()
    }

    fn advance(&self, job: &mut JobState<Slice>) -> Vec<Action<Slice>> {
        job.advance(self)
    }

    fn listen(&self, on: bool) {
        self.shadows.iter().for_each(|b| b.listen(on));
    }

    fn store_now(&self) -> (u64, u64) {
        self.stores
            .iter()
            .fold((0, 0), |(u, s), v| (u + v.used, s + v.spilled))
    }

    fn names_outputs(&self) -> bool {
        true
    }

    fn apply(&mut self, action: Action<Slice>, job: &mut JobState<Slice>) {
        match action {
            Action::Start(start) => {
                let node = start.node;
                self.tell(node, Self::run_order(start), job);
            }
            Action::Resume {
                task,
                node,
                may_spill,
            } => {
                let order = JobOrder::Resume {
                    task: task.0,
                    may_spill,
                };
                self.tell(node, order, job);
            }
            Action::Cancel { stage } => self.tell_all(JobOrder::Cancel {
                stage: stage as u64,
            }),
            Action::FitReserve { stage, bytes } => {
                for shadow in &self.shadows {
                    shadow.fit_reserve(stage, bytes);
                }
                self.tell_all(JobOrder::FitReserve {
                    stage: stage as u64,
                    bytes,
                });
            }
            Action::Move {
                origin,
                stage,
                part: slice,
                to,
            } => {
                let part = slice
                    .remote_part()
                    .expect("a cluster job's partitions are on its nodes");
                let with_cut = slice.cut_at_holder();
                let (holder, id) = (part.holder.clone(), part.id);
                let order = JobOrder::Adopt {
                    holder: holder.clone(),
                    id,
                    rows: part.rows as u64,
                    stage: stage as u64,
                    with_cut,
                };
                self.adopting
                    .insert((holder, id), (origin, stage, with_cut));
                self.tell(to, order, job);
            }
            Action::Emit { .. } | Action::End(_) | Action::Drained => {
                unreachable!("the executor's")
            }
        }
    }

    fn end(&self, job: &mut JobState<Slice>) {
        let (used, spilled) = self.store_now();
        job.recorder_mut().ended(used, spilled, 0);
        self.tell_all(JobOrder::End);
    }

    fn joined(&mut self, job: &mut JobState<Slice>, myself: &ActorRef<ExecutorMsg>) {
        let joined = std::mem::take(&mut *self.joining.lock().unwrap_or_else(|p| p.into_inner()));
        for node in joined {
            self.join(node, job, myself);
        }
    }

    /// What the node ran and held is made again on the others (nothing,
    /// when it drained and held nothing the job needs).
    fn node_lost(&mut self, job: &mut JobState<Slice>, name: String) {
        if let Some(node) = self.nodes.iter().position(|n| n.name == name) {
            self.gone[node] = true;
            job.on_node_lost(node, &name);
        }
    }

    fn node_event(&mut self, job: &mut JobState<Slice>, event: NodeEvent) {
        let Some(node) = self.nodes.iter().position(|n| n.name == event.node) else {
            return;
        };
        if self.gone[node] {
            return;
        }
        if let Happened::RelayFailed { message } = &event.happened {
            tracing::warn!(node = %event.node, %message, "the job's relay failed; the node is lost to the job");
            return self.node_lost(job, event.node);
        }
        self.stores[node] = event.store;
        let pulled = event.pulled;
        // A node speaks only for the tasks placed on it.
        let task = match event.happened {
            Happened::Output { task, .. }
            | Happened::Errored { task, .. }
            | Happened::Paused { task, .. }
            | Happened::Finished { task, .. }
            | Happened::Lost { task, .. } => Some(TaskId(task)),
            Happened::Failed { .. }
            | Happened::MemoryFreed
            | Happened::Draining
            | Happened::Adopted { .. }
            | Happened::RelayFailed { .. } => None,
        };
        if task.is_some_and(|task| job.node_of(task) != Some(node)) {
            return;
        }
        job.recorder()
            .node_inputs(node, pulled.shared, pulled.quic, pulled.quic_bytes);
        job.recorder()
            .node_store(node, event.store.used, event.store.spilled);
        match event.happened {
            Happened::Output {
                task,
                seq,
                id,
                rows,
                bytes,
                groups,
                sample,
            } => {
                let sample = sample.map(|s| KeySample::from_parts(s.bytes, s.ends));
                let sample = match sample.transpose() {
                    Ok(sample) => sample,
                    Err(message) => {
                        let node = event.node;
                        return job.fail(Error::OnNode { node, message });
                    }
                };
                let task = TaskId(task);
                let stage = job.stage_of(task);
                let shadow = stage.map(|s| self.shadows[node].force_admit(s, bytes));
                let part = RemotePart::new(
                    (node, event.node),
                    (id, rows as usize, bytes),
                    self.source.clone(),
                    shadow,
                );
                let mut slice = Slice::remote(part);
                // Checked where the exchange reads them (the count, the
                // end); each start is kept within the rows as it is sliced.
                if !groups.is_empty() {
                    slice = slice.with_groups(groups.into());
                }
                if let Some(sample) = sample {
                    slice = slice.with_sample(Arc::new(sample));
                }
                job.on_output(task, seq, slice);
            }
            Happened::Paused {
                task,
                pending_bytes,
                store_full_at,
            } => {
                job.on_paused(TaskId(task), pending_bytes, store_full_at);
            }
            Happened::Finished { task, busy_us } => {
                if let Some(stage) = job.on_finished(TaskId(task)) {
                    let busy = std::time::Duration::from_micros(busy_us);
                    job.record_finished(stage, busy, Vec::new());
                    job.recorder().node_finished(node);
                }
            }
            Happened::Failed { message } => job.fail(Error::OnNode {
                node: event.node,
                message,
            }),
            Happened::Errored {
                message,
                user_error,
                ..
            } => {
                let error = Error::OnNode {
                    node: event.node,
                    message,
                };
                job.on_errored(task.expect("an errored task names it"), error, user_error)
            }
            Happened::Lost { task, message } => job.on_lost(TaskId(task), message),
            Happened::MemoryFreed => {}
            Happened::Draining => job.drain_node(node),
            Happened::Adopted {
                holder,
                from,
                id,
                rows,
                bytes,
                cut,
            } => {
                let adopting = self.adopting.remove(&(holder.clone(), from));
                let Some((origin, stage, with_cut)) = adopting else {
                    return;
                };
                // A map output's cut must have come whole: a reducer's rows
                // are found by it. Else the copy goes, the output stays.
                if with_cut && cut != job.cut_fingerprint(origin) {
                    tracing::warn!(node = %event.node, %holder, partition = from, "a moved map output came with another cut; it stays where it was");
                    let source = self.source.clone();
                    return source.release(&event.node, id);
                }
                let shadow = self.shadows[node].force_admit(stage, bytes);
                let part = RemotePart::new(
                    (node, event.node),
                    (id, rows as usize, bytes),
                    self.source.clone(),
                    Some(shadow),
                );
                job.on_moved(origin, Slice::remote(part));
            }
            Happened::RelayFailed { .. } => {} // handled above
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reducer's order naming `outputs` map outputs' destinations.
    fn reducer_order(outputs: u64) -> JobOrder {
        let part = |id| PartSpec {
            holder: "worker-1".into(),
            id,
            want: Want::Group(7),
        };
        JobOrder::Run {
            task: 1,
            stage: 2,
            input: InputSpec::Parts((0..outputs).map(part).collect()),
            keep_from: 0,
            keep_again: Vec::new(),
            may_spill: false,
            range: None,
            rows: Some(outputs),
        }
    }

    /// An order a cluster message cannot carry is refused with its size,
    /// not sent to close the session (the node would look lost).
    #[test]
    fn an_order_over_a_cluster_message_is_refused_with_its_size() {
        let key = JobKey {
            cluster: "c".into(),
            driver: "driver".into(),
            job: 1,
        };
        let fits = encode_order(&key, reducer_order(1_000)).unwrap();
        let per_output = fits.len() / 1_000;
        assert!(
            (24..=64).contains(&per_output),
            "{per_output} bytes an output"
        );
        match encode_order(&key, reducer_order(40_000)) {
            Err(too_large @ OrderError::TooLarge(len)) => {
                assert!(len > MAX_PAYLOAD_BYTES);
                let why = too_large.why("worker-1").to_string();
                assert!(
                    why.contains("worker-1") && why.contains(&len.to_string()),
                    "{why}"
                );
            }
            other => panic!("{:?}", other.map(|b| b.len())),
        }
    }
}
