//! A task in flight: a fused stage's stream over one input, cut into
//! partitions and stored as they come. A task whose next partition does not
//! fit in memory pauses: it returns itself, holding that partition, so its
//! slot is freed; the executor resumes it once memory is returned.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use ractor::DerivedActorRef;
use streambatch_core::{JobId, Resources, TaskId};
use streambatch_plan::{
    BatchIter, BatchUdf, Error, ExecPlan, KeySample, OpKind, Scratch, SharedInstance, TaskEnv,
    TaskInput, UdfError,
};
use streambatch_store::{ObjectStore, PutError, StoreError, batch_bytes, with_output_store};

use crate::exec::budget::{Budgets, Hold, ReducerPool};
use crate::exec::partitioner::{Output, Partitioner, Slice, joined};
use crate::exec::read_ahead::read_ahead;
use crate::job::{Keep, RunInput, input_hold};

/// An output to store, with its groups when the stage is an exchange's
/// map side.
type CutOutput = (RecordBatch, Option<Groups>);

/// How an exchange's map output is cut: where each destination's rows (a
/// sort's: each chunk's) start, and the end; and a sort's key sample.
#[derive(Clone)]
struct Groups {
    starts: Arc<[u32]>,
    sample: Option<Arc<KeySample>>,
}

/// What a task (and the worker running it) tells its job. Tasks hold only
/// this narrow sink, never the executor itself.
pub enum TaskEvent {
    /// The task stored its `seq`-th output.
    Output {
        /// The task.
        task: TaskId,
        /// The output's position among the task's outputs.
        seq: u32,
        /// The output.
        slice: Slice,
    },
    /// The task paused: its next output does not fit in memory yet.
    Paused(Box<TaskRun>),
    /// The task finished.
    Finished {
        /// The task.
        task: TaskId,
        /// Time it computed.
        busy: Duration,
        /// Its last output, not yet reported: it rides with this event (one
        /// message where a one-output task would send two).
        last: Option<(u32, Slice)>,
        /// When its last run computed, on the worker's clock.
        ran: Option<(Instant, Instant)>,
    },
    /// A stage's set-up failed, or the job cannot go on: it ends.
    Failed(Error),
    /// A task failed; the job retries it, skips it or ends (see
    /// `JobState::on_errored`).
    Errored {
        /// The task.
        task: TaskId,
        /// Why.
        error: Error,
    },
    /// The task's worker died (a panic); the task is retried.
    Lost {
        /// The task.
        task: TaskId,
        /// The panic message.
        message: String,
    },
}

/// Where a job's tasks send their [`TaskEvent`]s.
pub type TaskEvents = DerivedActorRef<TaskEvent>;

/// Makes the actor message `$msg` a sink of [`TaskEvent`]s through its
/// variant `$msg::Task`, so that its actor's reference derives the narrow
/// [`TaskEvents`] its tasks hold (the executor's and a relay's).
macro_rules! task_event_sink {
    ($msg:ident) => {
        impl From<$crate::exec::task::TaskEvent> for $msg {
            fn from(event: $crate::exec::task::TaskEvent) -> Self {
                Self::Task(event)
            }
        }

        impl TryFrom<$msg> for $crate::exec::task::TaskEvent {
            type Error = $msg;

            fn try_from(msg: $msg) -> Result<Self, $msg> {
                match msg {
                    $msg::Task(event) => Ok(event),
                    other => Err(other),
                }
            }
        }
    };
}
pub(crate) use task_event_sink;

/// What every task of one job shares.
pub struct JobCtx {
    /// The job's id (unique per process).
    pub job: JobId,
    /// The physical plan.
    pub plan: Arc<ExecPlan>,
    /// Where outputs go.
    pub store: Arc<dyn ObjectStore>,
    /// The stages' memory budgets.
    pub budgets: Budgets,
    /// Where the job's tasks report, told of every output.
    pub events: TaskEvents,
    /// Partition size target.
    pub target_bytes: u64,
    /// Per stage: set when the stage's remaining work is no longer needed.
    pub cancelled: Vec<AtomicBool>,
}

impl JobCtx {
    /// What the tasks of job `job` over `plan` share: they store into
    /// `store` within `budgets`, cut partitions of `target_bytes`, and
    /// report to `events`; no stage is cancelled yet.
    pub fn new(
        job: JobId,
        plan: Arc<ExecPlan>,
        store: Arc<dyn ObjectStore>,
        budgets: Budgets,
        events: TaskEvents,
        target_bytes: u64,
    ) -> Self {
        let cancelled = plan.stages.iter().map(|_| AtomicBool::default()).collect();
        Self {
            job,
            plan,
            store,
            budgets,
            events,
            target_bytes,
            cancelled,
        }
    }
}

/// A task, from dispatch to its last output.
pub struct TaskRun {
    /// The job it belongs to.
    pub job: Arc<JobCtx>,
    /// Its id.
    pub task: TaskId,
    /// Its stage.
    pub stage: usize,
    input: Option<RunInput<Slice>>,
    stream: Option<BatchIter>,
    exhausted: bool,
    partitioner: Partitioner,
    /// Outputs to store, each with its groups where the stage is an
    /// exchange's map side.
    pending: VecDeque<CutOutput>,
    /// Outputs produced so far, in order.
    next_seq: u32,
    /// The outputs to store (an earlier attempt delivered the others:
    /// they are recomputed, since later ones depend on them, and dropped).
    keep: Keep,
    /// Set by the executor when nothing else can progress: outputs may
    /// exceed the budget and the store spills to make room.
    pub may_spill: bool,
    /// When paused because the store was full: its free count then. Only a
    /// later free can make room, so the task waits for one.
    pub store_full_at: Option<u64>,
    busy: Duration,
    /// The last output, stored once the stream ended: reported with
    /// `Finished`.
    last: Option<(u32, Slice)>,
    /// When its last run (until it finished or paused) computed: a node
    /// may queue a task after the job state started it, so its timeline
    /// needs the worker's own times.
    pub ran: Option<(Instant, Instant)>,
    /// The budget held for what the task keeps in memory outside the store
    /// (a binary file read whole, a reducer's input) until the task ends.
    _held: Option<Hold>,
    /// A reducer's memory for its input, shared with its scratch.
    _reducer_pool: Option<Arc<ReducerPool>>,
}

/// How a drive of a task ended.
pub enum Outcome {
    /// All outputs are stored and reported.
    Finished {
        /// Time spent computing.
        busy: Duration,
        /// The last output, to report with the end (see `TaskEvent::Finished`).
        last: Option<(u32, Slice)>,
        /// When this run computed.
        ran: Option<(Instant, Instant)>,
    },
    /// The next output does not fit; the task waits with it.
    Paused(Box<TaskRun>),
    /// An operator failed; the job ends.
    Failed(Error),
}

/// This worker's instance of operator `op` of `job`, set up on first use.
fn instance_for(
    job: &Arc<JobCtx>,
    op: usize,
    udf: &Arc<dyn BatchUdf>,
    resources: &Resources,
    instances: &mut InstanceCache,
) -> Result<SharedInstance, UdfError> {
    if let Some((_, i)) = instances.get(&(job.job, op)) {
        return Ok(i.clone());
    }
    let i: SharedInstance = Arc::new(std::sync::Mutex::new(udf.instantiate_for(resources)?));
    instances.insert((job.job, op), (Arc::downgrade(job), i.clone()));
    Ok(i)
}

/// Sets up this worker's instances of the stateful operators of `stage`
/// before any task needs them (a pool's first `min` workers).
pub fn set_up_stage(
    job: &Arc<JobCtx>,
    stage: usize,
    instances: &mut InstanceCache,
) -> Result<(), Error> {
    let stage = &job.plan.stages[stage];
    for (op, spec) in stage.stateful_ops() {
        if let OpKind::MapBatches(udf) = &spec.kind {
            instance_for(job, op, udf, &spec.options.resources, instances).map_err(|source| {
                Error::Udf {
                    operator: format!("{} (set-up)", spec.name),
                    source,
                }
            })?;
        }
    }
    Ok(())
}

/// Per-worker instances of stateful operators, by (job, operator position);
/// an instance goes when its job does.
pub type InstanceCache = HashMap<(JobId, usize), (Weak<JobCtx>, SharedInstance)>;

impl TaskRun {
    /// A new task over `input`, storing the outputs `keep` names.
    pub(crate) fn new(
        job: Arc<JobCtx>,
        task: TaskId,
        stage: usize,
        input: RunInput<Slice>,
        keep: Keep,
    ) -> Self {
        let target = job.target_bytes;
        Self {
            job,
            task,
            stage,
            input: Some(input),
            stream: None,
            exhausted: false,
            partitioner: Partitioner::new(target),
            pending: VecDeque::new(),
            next_seq: 0,
            keep,
            may_spill: false,
            store_full_at: None,
            busy: Duration::ZERO,
            last: None,
            ran: None,
            _held: None,
            _reducer_pool: None,
        }
    }

    /// Bytes of the output the task waits to store (0 when none).
    pub fn pending_bytes(&self) -> u64 {
        self.pending
            .front()
            .map_or(0, |(batch, _)| batch_bytes(batch))
    }

    /// Runs the task until it finishes, fails or must pause.
    pub fn drive(mut self, instances: &mut InstanceCache) -> Outcome {
        let started = Instant::now();
        // Operators that make an `OutputBuffer` get it in this job's store.
        let store = self.job.store.clone();
        let outcome = with_output_store(store, || self.drive_inner(instances));
        let ended = Instant::now();
        self.busy += ended - started;
        self.ran = Some((started, ended));
        match outcome {
            Ok(true) => Outcome::Finished {
                busy: self.busy,
                last: self.last.take(),
                ran: self.ran,
            },
            Ok(false) => Outcome::Paused(Box::new(self)),
            Err(e) => Outcome::Failed(e),
        }
    }

    /// Its stage's remaining work is not needed, and it is not remaking
    /// outputs a later stage needs.
    fn cancelled(&self) -> bool {
        !self.keep.remakes_only() && self.job.cancelled[self.stage].load(Ordering::Relaxed)
    }

    /// It only makes lost outputs again (see [`Keep::remakes_only`]).
    pub fn remakes_only(&self) -> bool {
        self.keep.remakes_only()
    }

    /// Ok(true): finished; Ok(false): must pause.
    fn drive_inner(&mut self, instances: &mut InstanceCache) -> Result<bool, Error> {
        if self.stream.is_none() {
            self.open(instances)?;
        }
        loop {
            while let Some((batch, groups)) = self.pending.pop_front() {
                if let Some(batch) = self.store(batch, groups.clone())? {
                    self.pending.push_front((batch, groups));
                    return Ok(false);
                }
            }
            let all_kept = self.next_seq > 0 && self.keep.done_after(self.next_seq - 1);
            if self.exhausted || all_kept || self.cancelled() {
                return Ok(true);
            }
            let ready = match self.stream.as_mut().expect("opened above").next() {
                Some(batch) => self.partitioner.push(batch?),
                None => {
                    self.exhausted = true;
                    self.partitioner.flush().into_iter().collect()
                }
            };
            for parts in ready {
                let cut = self.cut(parts)?;
                self.pending.push_back(cut);
            }
        }
    }

    fn open(&mut self, instances: &mut InstanceCache) -> Result<(), Error> {
        let mut range = None;
        let mut reducer_pool = None;
        let input = match self.input.take().expect("a task is opened once") {
            RunInput::Split(i) => {
                let held = self.job.plan.stages[self.stage].split_held_bytes(i);
                if held > 0 {
                    self._held = Some(self.job.budgets.hold(held));
                }
                TaskInput::Split(i)
            }
            // Read in order, a few slices ahead of the task (a window of a
            // quarter partition): a reducer that spills sorted runs never
            // holds its whole range, and each input is let go once read.
            RunInput::Parts(slices, keys) => {
                range = keys;
                let cap = crate::exec::budget::input_held_cap(
                    &self.job.plan.stages[self.stage],
                    self.job.target_bytes,
                );
                if cap > 0 {
                    let admitted = input_hold(cap, &slices);
                    let pool = ReducerPool::new(self.job.budgets.clone(), cap, admitted);
                    reducer_pool = Some(Arc::new(pool));
                }
                TaskInput::Batches(read_ahead(slices, self.job.target_bytes / 4))
            }
        };
        let job = &self.job;
        // Kept by the task as long as it runs (a reducer without a scratch
        // directory holds its input in memory), and by its scratch.
        self._reducer_pool = reducer_pool.clone();
        let scratch = match reducer_pool {
            Some(pool) => job
                .store
                .scratch_dir()
                .map_err(|e| Error::store("making a scratch directory", e))?
                .map(|dir| {
                    let store = job.store.clone();
                    Scratch::new(
                        dir.to_path_buf(),
                        pool,
                        Arc::new(move |bytes| store.count_scratch(bytes)),
                    )
                }),
            None => None,
        };
        let mut instance = |op: usize, udf: &Arc<dyn BatchUdf>, resources: &Resources| {
            instance_for(job, op, udf, resources, instances)
        };
        let mut env = TaskEnv {
            task: self.task,
            instance: &mut instance,
            scratch,
            range,
        };
        self.stream = Some(self.job.plan.stages[self.stage].open(input, &mut env)?);
        Ok(())
    }

    /// An output partition's gathered batches as one, its rows grouped by
    /// destination where the stage is an exchange's map side.
    fn cut(&self, parts: Vec<RecordBatch>) -> Result<CutOutput, Error> {
        let Some((cut, n)) = &self.job.plan.stages[self.stage].cut else {
            return Ok((joined(parts)?, None));
        };
        let cut = cut.apply(&parts, *n)?;
        let groups = Groups {
            starts: cut.starts.iter().map(|&s| s as u32).collect(),
            sample: cut.sample.map(Arc::new),
        };
        Ok((cut.batch, Some(groups)))
    }

    /// Stores one output and reports it; hands the batch back when it does
    /// not fit (unless the task may spill: then the store makes room).
    fn store(
        &mut self,
        batch: RecordBatch,
        groups: Option<Groups>,
    ) -> Result<Option<RecordBatch>, Error> {
        let seq = self.next_seq;
        if !self.keep.stores(seq) {
            self.next_seq += 1;
            return Ok(None);
        }
        #[cfg(feature = "failpoints")]
        if let Some(message) = crate::exec::failpoint::store_put(self.task, seq) {
            return Err(Error::store("storing an output", message));
        }
        let bytes = batch_bytes(&batch);
        let budgets = &self.job.budgets;
        let reservation = if self.may_spill {
            budgets.force_admit(self.stage, bytes)
        } else {
            match budgets.try_admit(self.stage, bytes) {
                Ok(r) => r,
                Err(refused) => {
                    let stage = &self.job.plan.stages[self.stage].name;
                    tracing::debug!(%stage, task = %self.task, %refused, "output waits for memory");
                    self.store_full_at = None;
                    return Ok(Some(batch));
                }
            }
        };
        // An exchange's map output is stored cut by destination: spilled,
        // each reducer reads its own rows alone.
        let cut = groups.as_ref().map_or(&[][..], |g| &g.starts[..]);
        let stored = if self.may_spill {
            self.job
                .store
                .put_grouped(batch, cut)
                .map_err(|e| self.store_error(e))?
        } else {
            let frees = self.job.store.stats().frees;
            match self.job.store.try_put_grouped(batch, cut) {
                Ok(part) => part,
                Err(PutError::Full { batch, .. }) => {
                    reservation.cancel();
                    self.store_full_at = Some(frees);
                    return Ok(Some(batch));
                }
                Err(PutError::TooLarge { batch, .. }) => {
                    // Only a spilling put can take it; the executor allows one
                    // when nothing else can make progress.
                    reservation.cancel();
                    return Ok(Some(batch));
                }
                Err(PutError::Store(e)) => return Err(self.store_error(e)),
            }
        };
        self.next_seq += 1;
        let mut slice = Slice::whole(Output::new(stored, bytes, Some(reservation)));
        if let Some(groups) = groups {
            slice = slice.with_groups(groups.starts);
            if let Some(sample) = groups.sample {
                slice = slice.with_sample(sample);
            }
        }
        if self.exhausted && self.pending.is_empty() {
            // The task ends right after this output: one event tells both.
            self.last = Some((seq, slice));
            return Ok(None);
        }
        // A send fails only when the job has ended; the output is then unwanted.
        let _ = self.job.events.send_message(TaskEvent::Output {
            task: self.task,
            seq,
            slice,
        });
        Ok(None)
    }

    fn store_error(&self, e: StoreError) -> Error {
        let stage = &self.job.plan.stages[self.stage].name;
        Error::store(format!("storing an output of stage `{stage}`"), e)
    }
}

// Local only (see `msg`).
impl ractor::Message for TaskEvent {}
