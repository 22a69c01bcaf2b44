//! What nodes tell each other inside actor messages: rkyv archives carried
//! as bytes and validated (bytecheck) by the receiver before use. A payload
//! that fails validation is dropped with a warning naming its sender.

#[cfg(test)]
mod fuzz;
pub(crate) mod groups;
mod ipc;
pub(crate) mod join;
pub(crate) mod msg;
pub(crate) mod plan;

use rkyv::{Archive, Deserialize, Serialize};
use streambatch_net::{Locality, Want};
use streambatch_plan::{KeyRange, KeySample};

/// A node introducing itself to the head: its slots, its store, and the
/// operators its binary registered.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct NodeInfo {
    /// Its name (its certificate's common name).
    pub name: String,
    /// Logical CPU slots.
    pub cpus: f64,
    /// Logical GPU slots.
    pub gpus: f64,
    /// Its store's capacity in bytes.
    pub store_capacity: u64,
    /// Where its store lives (for shared-memory hand-over).
    pub locality: Locality,
    /// The address it listens on.
    pub addr: String,
}

impl NodeInfo {
    /// The member's CPU and GPU slots.
    pub fn slots(&self) -> streambatch_core::Resources {
        streambatch_core::Resources {
            cpus: self.cpus,
            gpus: self.gpus,
            memory_bytes: 0,
        }
    }
}

/// The members of a cluster, as the head knows them.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Members {
    /// Every node that said hello and has not gone, the head first.
    pub nodes: Vec<NodeInfo>,
}

/// A job's identity across the cluster: its cluster, its driver's name and
/// its id (unique in the driver's process).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct JobKey {
    pub(crate) cluster: String,
    pub(crate) driver: String,
    pub(crate) job: u64,
}

impl JobKey {
    /// The process group of the job's port on its driver.
    pub(crate) fn port_group(&self) -> String {
        format!(
            "streambatch.{}.job.{}.{}",
            self.cluster, self.driver, self.job
        )
    }
}

/// Driver to node: a job starts. The node rebuilds the plan from its
/// registry, or refuses naming the operators it lacks.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct JobStart {
    pub(crate) key: JobKey,
    pub(crate) plan: crate::wire::plan::PlanSpec,
    /// Partition size target.
    pub(crate) target_bytes: u64,
    /// Each stage's memory reserve.
    pub(crate) reserve: Vec<u64>,
    /// The job's nodes and where they listen (name, address), so that
    /// nodes can pull partitions from each other.
    pub(crate) nodes: Vec<(String, String)>,
}

/// Where a task's input partition lies.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct PartSpec {
    /// The node holding it.
    pub(crate) holder: String,
    /// Its id in the holder's store.
    pub(crate) id: u64,
    /// Which of its rows: a range, a hash exchange's reducer's destination
    /// (which the holder finds by the cut it keeps), or all of a map output
    /// with its cut (`WithCut`, moving it off a draining node).
    pub(crate) want: Want,
}

impl PartSpec {
    /// Rows `offset..offset + len` of partition `id` of `holder`.
    pub(crate) fn range(holder: String, id: u64, offset: u64, len: u64) -> Self {
        let want = Want::Rows(streambatch_net::RowRange { offset, len });
        Self { holder, id, want }
    }
}

/// Driver to node: a task's input.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) enum InputSpec {
    Split(u64),
    Parts(Vec<PartSpec>),
}

/// Driver to node: the keys a sort's reducer keeps, as `arrow-row` bytes
/// (`streambatch_plan::KeyRange`; compared, never decoded).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct KeyRangeSpec {
    pub(crate) lo: Option<Vec<u8>>,
    pub(crate) hi: Option<Vec<u8>>,
}

impl From<KeyRangeSpec> for KeyRange {
    fn from(spec: KeyRangeSpec) -> Self {
        KeyRange {
            lo: spec.lo,
            hi: spec.hi,
        }
    }
}

/// Node to driver: a sort's map output's key sample
/// (`streambatch_plan::KeySample`, checked on receipt).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct SampleSpec {
    pub(crate) bytes: Vec<u8>,
    pub(crate) ends: Vec<u32>,
}

impl SampleSpec {
    pub(crate) fn of(sample: &KeySample) -> Self {
        let (bytes, ends) = sample.clone().into_parts();
        Self { bytes, ends }
    }
}

/// Driver to node: what the job asks of it.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) enum JobOrder {
    /// Run a task.
    Run {
        task: u64,
        stage: u64,
        input: InputSpec,
        /// Outputs to store: from `keep_from` on, and those in `keep_again`
        /// (delivered by an earlier attempt, then lost).
        keep_from: u32,
        keep_again: Vec<u32>,
        may_spill: bool,
        /// A sort's reducer: the keys it keeps of its input.
        range: Option<KeyRangeSpec>,
        /// A hash exchange's reducer: the rows the holders must find for it
        /// in all (the cuts summed as the driver got them).
        rows: Option<u64>,
    },
    /// Resume a task paused here.
    Resume { task: u64, may_spill: bool },
    /// The driver is done with these partitions (they may be freed).
    Release { ids: Vec<u64> },
    /// A stage's remaining work is not needed.
    Cancel { stage: u64 },
    /// A stage's reserve fits its largest output.
    FitReserve { stage: u64, bytes: u64 },
    /// A node that joined the job listens at `addr`.
    Peer { name: String, addr: String },
    /// Take over partition `id` (of `rows` rows, an output of `stage`)
    /// from `holder`, which drains: pull it, store it here, and report it
    /// (`Happened::Adopted`). `with_cut`: a hash exchange's map output,
    /// whose cut only its holder keeps: pull and keep that too.
    Adopt {
        holder: String,
        id: u64,
        rows: u64,
        stage: u64,
        with_cut: bool,
    },
    /// The job ended: free all it holds here.
    End,
}

/// Driver to node: an order of a job.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct Order {
    pub(crate) key: JobKey,
    pub(crate) order: JobOrder,
}

/// A node's store as its last event saw it.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Default)]
pub(crate) struct StoreView {
    pub(crate) used: u64,
    pub(crate) capacity: u64,
    pub(crate) frees: u64,
    pub(crate) spilled: u64,
}

/// Node to driver: what a task did.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) enum Happened {
    Output {
        task: u64,
        seq: u32,
        id: u64,
        rows: u64,
        bytes: u64,
        /// An exchange's map side: where each destination's rows start
        /// (and the end); empty otherwise.
        groups: Vec<u32>,
        /// A sort's map side: the output's key sample.
        sample: Option<SampleSpec>,
    },
    Paused {
        task: u64,
        pending_bytes: u64,
        store_full_at: Option<u64>,
    },
    Finished {
        task: u64,
        busy_us: u64,
    },
    Failed {
        message: String,
    },
    Errored {
        task: u64,
        message: String,
        user_error: bool,
    },
    Lost {
        task: u64,
        message: String,
    },
    MemoryFreed,
    /// The node drains: it takes no new task of the job, hands what it
    /// holds over (`JobOrder::Adopt` to other nodes) and leaves once the job
    /// has no more of it.
    Draining,
    /// Partition `from` of draining node `holder` is stored here as `id`;
    /// `cut`: the fingerprint of the cut it was pulled and stored with
    /// (`job::fingerprint_cut`), for the driver to check.
    Adopted {
        holder: String,
        from: u64,
        id: u64,
        rows: u64,
        bytes: u64,
        cut: Option<u64>,
    },
    /// The job's relay on the node failed (sent by the node's agent): the
    /// node is lost to the job, with all it held of it.
    RelayFailed {
        message: String,
    },
}

/// A node's inputs pulled from other nodes for a job, so far.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Default)]
pub(crate) struct Pulled {
    pub(crate) shared: u64,
    pub(crate) quic: u64,
    pub(crate) quic_bytes: u64,
}

/// Node to driver: an event of a job, with the node's store as it is now.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct NodeEvent {
    pub(crate) node: String,
    pub(crate) job: u64,
    pub(crate) happened: Happened,
    pub(crate) store: StoreView,
    pub(crate) pulled: Pulled,
}
