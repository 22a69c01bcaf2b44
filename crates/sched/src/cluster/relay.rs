//! A job's relay on a cluster node: one actor per job and node, started by
//! the node's agent when the job starts there. It runs the driver's orders
//! (tasks go to the node's NodeManager, inputs held elsewhere are pulled
//! first), keeps the job's outputs here (offered to peers) until the driver
//! releases them, holds tasks paused for memory, and reports every task
//! event to the job's port on the driver.
//!
//! The job's budgets here are this node's: an output that does not fit this
//! node's share pauses its task, whatever other nodes hold.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow_array::RecordBatch;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use streambatch_core::{JobId, TaskId};
use streambatch_net::{Transport, Want, frame};
use streambatch_plan::{ExecPlan, KeyRange, PauseCause, StageKind};
use streambatch_store::{ObjectStore, batch_bytes, cuts_in_order};

use crate::cluster::pull::{PullCounts, found_all, local_rows, pull, pull_inputs, rows_outside};
use crate::cluster::serve::StoreServer;
use crate::exec::budget::Budgets;
use crate::exec::metrics::{NodeMetrics, NodeShare, TaskEnd};
use crate::exec::msg::NodeMsg;
use crate::exec::partitioner::{Output, Slice};
use crate::exec::task::{JobCtx, TaskEvent, TaskRun, task_event_sink};
use crate::job::{Keep, Part, RunInput, fingerprint_cut};
use crate::wire::groups::remote_member;
use crate::wire::msg::PortMsg;
use crate::wire::{
    Happened, InputSpec, JobKey, JobOrder, NodeEvent, PartSpec, Pulled, SampleSpec, StoreView,
};

/// The relay actor.
pub(crate) struct JobRelay;

/// Messages of a relay.
pub(crate) enum RelayMsg {
    /// A task of the job reported (on this node).
    Task(TaskEvent),
    /// The job's outputs here gave memory back.
    MemoryFreed,
    /// The driver's order.
    Order(JobOrder),
    /// This node drains (see `AgentMsg::Drain`).
    Drain,
    /// Partition `from` of draining node `holder` is stored here.
    Adopted {
        holder: String,
        from: u64,
        output: Arc<Output>,
    },
}

impl ractor::Message for RelayMsg {}

task_event_sink!(RelayMsg);

/// What a relay is started with.
pub(crate) struct RelayArgs {
    pub(crate) key: JobKey,
    /// The node-local id of the job.
    pub(crate) job: JobId,
    pub(crate) plan: Arc<ExecPlan>,
    pub(crate) target_bytes: u64,
    pub(crate) reserve: Vec<u64>,
    /// This node's name.
    pub(crate) node: String,
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) server: Arc<StoreServer>,
    pub(crate) transport: Transport,
    pub(crate) manager: ActorRef<NodeMsg>,
    pub(crate) metrics: Arc<NodeMetrics>,
}

/// A relay's state.
pub(crate) struct RelayState {
    key: JobKey,
    node: String,
    ctx: Arc<JobCtx>,
    port: ActorRef<PortMsg>,
    server: Arc<StoreServer>,
    transport: Transport,
    manager: ActorRef<NodeMsg>,
    /// The job's outputs stored here, by partition id, until released.
    outputs: HashMap<u64, Arc<Output>>,
    /// Tasks paused for memory.
    paused: HashMap<TaskId, Box<TaskRun>>,
    pulled: Arc<PullCounts>,
    /// The job ended; the relay stops once the driver has released the
    /// outputs it still reads.
    ending: bool,
    /// The node drains: the relay stops once no task of the job runs here
    /// and the driver has released every output kept here.
    draining: bool,
    /// Tasks of the job started here and not yet finished.
    running: std::collections::HashSet<TaskId>,
    /// What the job did here, for the node's metrics.
    share: NodeShare,
    /// The store's spilled bytes when the job came here: the store counts
    /// from when it opened, the job's figures from when it started.
    spilled_before: u64,
}

impl Actor for JobRelay {
    type Msg = RelayMsg;
    type State = RelayState;
    type Arguments = RelayArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<RelayMsg>,
        args: RelayArgs,
    ) -> Result<RelayState, ActorProcessingErr> {
        // The driver's port joined its group before it started the job; the
        // group reaches this node over the same session, so it is seen soon.
        let group = args.key.port_group();
        let mut port = None;
        for _ in 0..250 {
            port = remote_member::<PortMsg>(&group);
            if port.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let port = port.ok_or_else(|| format!("the job's port ({group}) is not reachable"))?;
        let notify = myself.clone();
        let budgets = Budgets::new(
            args.store.stats().capacity_bytes,
            args.reserve,
            Arc::new(move || {
                let _ = notify.cast(RelayMsg::MemoryFreed);
            }),
        );
        let share = NodeShare::new(
            args.plan.stages.iter().map(|s| s.name.clone()),
            &args.metrics,
        );
        let ctx = Arc::new(JobCtx::new(
            args.job,
            args.plan,
            args.store,
            budgets,
            myself.get_derived(),
            args.target_bytes,
        ));
        let spilled_before = ctx.store.stats().spilled_bytes;
        Ok(RelayState {
            key: args.key,
            node: args.node,
            ctx,
            port,
            server: args.server,
            transport: args.transport,
            manager: args.manager,
            outputs: HashMap::new(),
            paused: HashMap::new(),
            pulled: Arc::default(),
            ending: false,
            draining: false,
            running: Default::default(),
            share,
            spilled_before,
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<RelayMsg>,
        state: &mut RelayState,
    ) -> Result<(), ActorProcessingErr> {
        for id in state.outputs.keys() {
            state.server.withdraw(*id);
        }
        state.outputs.clear();
        state.paused.clear();
        state.share.close();
        let _ = state.manager.cast(NodeMsg::JobEnded { job: state.ctx.job });
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<RelayMsg>,
        msg: RelayMsg,
        state: &mut RelayState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RelayMsg::Task(event) => state.on_task_event(event),
            RelayMsg::MemoryFreed => state.report(Happened::MemoryFreed),
            RelayMsg::Order(order) => {
                #[cfg(feature = "failpoints")]
                crate::exec::failpoint::relay(state.key.job);
                state.on_order(order, &myself)
            }
            RelayMsg::Drain => {
                state.draining = true;
                state.report(Happened::Draining);
            }
            RelayMsg::Adopted {
                holder,
                from,
                output,
            } => state.on_adopted(holder, from, output),
        }
        if state.draining
            && state.running.is_empty()
            && state.paused.is_empty()
            && state.outputs.is_empty()
        {
            myself.stop(Some("drained".into()));
        }
        Ok(())
    }
}

impl RelayState {
    fn report(&self, happened: Happened) {
        let stats = self.ctx.store.stats();
        let event = NodeEvent {
            node: self.node.clone(),
            job: self.key.job,
            happened,
            store: StoreView {
                used: stats.used_bytes,
                capacity: stats.capacity_bytes,
                frees: stats.frees,
                spilled: stats.spilled_bytes.saturating_sub(self.spilled_before),
            },
            pulled: Pulled {
                shared: self.pulled.shared.load(Ordering::Relaxed),
                quic: self.pulled.quic.load(Ordering::Relaxed),
                quic_bytes: self.pulled.quic_bytes.load(Ordering::Relaxed),
            },
        };
        let _ = self
            .port
            .cast(PortMsg::Event(frame::encode(&event).to_vec()));
    }

    fn on_task_event(&mut self, event: TaskEvent) {
        let happened = match event {
            TaskEvent::Output { task, seq, slice } => {
                let Some(output) = slice.stored() else {
                    return;
                };
                let id = output.part().id().0;
                let bytes = slice.partition_bytes();
                self.share.output(task, slice.len as u64, bytes);
                self.server.offer(output.part().clone());
                self.outputs.insert(id, output.clone());
                Happened::Output {
                    task: task.0,
                    seq,
                    id,
                    rows: slice.len as u64,
                    bytes,
                    groups: Part::groups(&slice).map_or_else(Vec::new, |g| g.to_vec()),
                    sample: Part::sample(&slice).map(|s| SampleSpec::of(s)),
                }
            }
            TaskEvent::Paused(run) => {
                let cause = match run.store_full_at {
                    Some(_) => PauseCause::StoreFull,
                    None => PauseCause::OutputBudget,
                };
                self.share.paused(run.task, cause);
                let happened = Happened::Paused {
                    task: run.task.0,
                    pending_bytes: run.pending_bytes(),
                    store_full_at: run.store_full_at,
                };
                self.paused.insert(run.task, run);
                happened
            }
            TaskEvent::Finished {
                task, busy, last, ..
            } => {
                if let Some((seq, slice)) = last {
                    self.on_task_event(TaskEvent::Output { task, seq, slice });
                }
                self.running.remove(&task);
                self.share.ended(task, TaskEnd::Finished);
                Happened::Finished {
                    task: task.0,
                    busy_us: busy.as_micros() as u64,
                }
            }
            TaskEvent::Failed(error) => Happened::Failed {
                message: within_a_frame(error.to_string()),
            },
            TaskEvent::Errored { task, error } => {
                self.running.remove(&task);
                let how = match error.is_user_error() {
                    true => TaskEnd::Errored,
                    false => TaskEnd::Retried,
                };
                self.share.ended(task, how);
                Happened::Errored {
                    task: task.0,
                    user_error: error.is_user_error(),
                    message: within_a_frame(error.to_string()),
                }
            }
            TaskEvent::Lost { task, message } => {
                self.running.remove(&task);
                self.share.ended(task, TaskEnd::Retried);
                Happened::Lost {
                    task: task.0,
                    message,
                }
            }
        };
        self.report(happened);
    }

    fn on_order(&mut self, order: JobOrder, myself: &ActorRef<RelayMsg>) {
        if let Err(why) = check_order(&self.ctx.plan, &order) {
            let message = format!(
                "node {}: an order that does not fit the job: {why}",
                self.node
            );
            return self.report(Happened::Failed { message });
        }
        match order {
            JobOrder::Run {
                task,
                stage,
                input,
                keep_from,
                mut keep_again,
                may_spill,
                range,
                rows,
            } => {
                keep_again.sort_unstable();
                keep_again.dedup();
                let keep = Keep {
                    from: keep_from,
                    again: keep_again,
                };
                let input = (input, range.map(|r| Arc::new(r.into())), rows);
                self.run(TaskId(task), stage as usize, input, keep, may_spill, myself)
            }
            JobOrder::Resume { task, may_spill } => {
                if let Some(mut run) = self.paused.remove(&TaskId(task)) {
                    self.share.resumed(run.task);
                    run.may_spill = may_spill;
                    self.dispatch(run);
                }
            }
            JobOrder::Release { ids } => {
                for id in ids {
                    self.server.withdraw(id);
                    self.outputs.remove(&id);
                }
                if self.ending && self.outputs.is_empty() {
                    myself.stop(None);
                }
            }
            JobOrder::Cancel { stage } => {
                let stage = stage as usize;
                if let Some(flag) = self.ctx.cancelled.get(stage) {
                    flag.store(true, Ordering::Relaxed);
                }
                let running = &mut self.running;
                self.paused.retain(|task, run| {
                    let keep = run.stage != stage || run.remakes_only();
                    if !keep {
                        running.remove(task);
                    }
                    keep
                });
            }
            JobOrder::FitReserve { stage, bytes } => {
                self.ctx.budgets.fit_reserve(stage as usize, bytes)
            }
            JobOrder::Peer { name, addr } => {
                if let Ok(addr) = addr.parse() {
                    self.transport.learn(&name, addr);
                }
            }
            JobOrder::Adopt {
                holder,
                id,
                rows,
                stage,
                with_cut,
            } => {
                let part = match with_cut {
                    true => PartSpec {
                        holder,
                        id,
                        want: Want::WithCut,
                    },
                    false => PartSpec::range(holder, id, 0, rows),
                };
                self.adopt(part, stage as usize, myself)
            }
            JobOrder::End => {
                self.ending = true;
                self.paused.clear();
                let _ = self.manager.cast(NodeMsg::JobEnded { job: self.ctx.job });
                if self.outputs.is_empty() {
                    myself.stop(None);
                }
            }
        }
    }

    /// Starts a task: inputs held here are sliced from the store; inputs
    /// held elsewhere are pulled first (on a task of their own, so that the
    /// relay keeps reporting meanwhile).
    fn run(
        &mut self,
        task: TaskId,
        stage: usize,
        (input, range, rows): (InputSpec, Option<Arc<KeyRange>>, Option<u64>),
        keep: Keep,
        may_spill: bool,
        myself: &ActorRef<RelayMsg>,
    ) {
        // Counted as running from here on, on every path: a draining node
        // stops only once nothing runs, so a task it forgot would hold it.
        self.running.insert(task);
        self.share.started(task, stage);
        let parts = match input {
            InputSpec::Split(i) => {
                let mut run = TaskRun::new(
                    self.ctx.clone(),
                    task,
                    stage,
                    RunInput::Split(i as usize),
                    keep,
                );
                run.may_spill = may_spill;
                return self.dispatch(Box::new(run));
            }
            InputSpec::Parts(parts) => parts,
        };
        let mut local = Vec::new();
        let mut pulls = Vec::new();
        for (at, part) in parts.into_iter().enumerate() {
            match self
                .outputs
                .get(&part.id)
                .filter(|_| part.holder == self.node)
            {
                Some(output) => match local_rows(output, &part) {
                    Some(slice) => local.push((at, slice)),
                    None => {
                        self.running.remove(&task);
                        self.share.ended(task, TaskEnd::Errored);
                        return self.on_task_event(TaskEvent::Failed(rows_outside(&part)));
                    }
                },
                None => pulls.push((at, part)),
            }
        }
        let ctx = self.ctx.clone();
        let transport = self.transport.clone();
        let manager = self.manager.clone();
        let relay = myself.clone();
        let counts = self.pulled.clone();
        tokio::spawn(async move {
            let mut slices = local;
            #[cfg(feature = "failpoints")]
            for (_, part) in &pulls {
                if let Some(message) = crate::exec::failpoint::fetch(task, part.id) {
                    let error = streambatch_plan::Error::OnNode {
                        node: part.holder.clone(),
                        message,
                    };
                    let _ = relay.cast(RelayMsg::Task(TaskEvent::Errored { task, error }));
                    return;
                }
            }
            match pull_inputs(&transport, pulls, &counts, task).await {
                Ok(pulled) => slices.extend(pulled),
                Err(error) => {
                    // A system failure: the driver may retry the task.
                    let event = TaskEvent::Errored { task, error };
                    let _ = relay.cast(RelayMsg::Task(event));
                    return;
                }
            }
            slices.sort_by_key(|(at, _)| *at);
            if let Err(error) = found_all(task, &slices, rows) {
                let _ = relay.cast(RelayMsg::Task(TaskEvent::Errored { task, error }));
                return;
            }
            let input = RunInput::Parts(slices.into_iter().map(|(_, s)| s).collect(), range);
            let mut run = TaskRun::new(ctx.clone(), task, stage, input, keep);
            run.may_spill = may_spill;
            let pool = ctx.plan.stages[stage].options.pool.map(|p| p.max);
            tracing::debug!(target: "streambatch::pull", task = task.0, "inputs pulled");
            let _ = manager.cast(NodeMsg::Run {
                run: Box::new(run),
                pool,
            });
        });
    }

    /// Takes over `part` from its draining holder: pulls it (on a task of
    /// its own; a map output with its cut), stores it here within the
    /// job's budget and the store's room, and reports it. A partition that
    /// does not fit, or whose cut did not come whole, stays where it is,
    /// and its holder leaves once the job is done with it.
    fn adopt(&self, part: PartSpec, stage: usize, myself: &ActorRef<RelayMsg>) {
        let (ctx, transport, counts) = (
            self.ctx.clone(),
            self.transport.clone(),
            self.pulled.clone(),
        );
        let relay = myself.clone();
        tokio::spawn(async move {
            let stored = match pull(&transport, &part, &counts).await {
                Ok((slice, cut)) => slice
                    .read()
                    .map_err(|e| e.to_string())
                    .and_then(|batch| store_adopted(&ctx, stage, batch, cut.as_deref())),
                Err(e) => Err(e.to_string()),
            };
            match stored {
                Ok(output) => {
                    let msg = RelayMsg::Adopted {
                        holder: part.holder,
                        from: part.id,
                        output,
                    };
                    let _ = relay.cast(msg);
                }
                Err(why) => tracing::warn!(
                    holder = %part.holder, id = part.id, %why,
                    "a draining node's partition stays there"
                ),
            }
        });
    }

    /// Keeps an adopted partition as this node's output, and reports it.
    fn on_adopted(&mut self, holder: String, from: u64, output: Arc<Output>) {
        if self.ending {
            return;
        }
        let part = output.part().clone();
        let (id, rows) = (part.id().0, part.rows() as u64);
        let bytes = Slice::whole(output.clone()).partition_bytes();
        // The cut as the store kept it (none where it did not cut the rows).
        let cut = part.groups().map(|cut| fingerprint_cut(&cut, None));
        self.server.offer(part);
        self.outputs.insert(id, output);
        self.report(Happened::Adopted {
            holder,
            from,
            id,
            rows,
            bytes,
            cut,
        });
    }

    fn dispatch(&self, run: Box<TaskRun>) {
        let pool = self.ctx.plan.stages[run.stage].options.pool.map(|p| p.max);
        let _ = self.manager.cast(NodeMsg::Run { run, pool });
    }
}

/// Stores a partition taken over from a draining node as an output of
/// `stage` (with the `cut` it came with), if the stage's budget and the
/// store have room for it.
fn store_adopted(
    ctx: &JobCtx,
    stage: usize,
    batch: RecordBatch,
    cut: Option<&[u32]>,
) -> Result<Arc<Output>, String> {
    let rows = batch.num_rows();
    if let Some(cut) = cut.filter(|cut| !cuts_in_order(cut, rows)) {
        let groups = cut.len().saturating_sub(1);
        return Err(format!(
            "the cut sent with it ({groups} groups) does not cut its {rows} rows in order"
        ));
    }
    let bytes = batch_bytes(&batch);
    let reservation = ctx
        .budgets
        .try_admit(stage, bytes)
        .map_err(|refused| refused.to_string())?;
    let put = match cut {
        Some(cut) => ctx.store.try_put_grouped(batch, cut),
        None => ctx.store.try_put(batch),
    };
    match put {
        Ok(part) => Ok(Output::new(part, bytes, Some(reservation))),
        Err(e) => {
            reservation.cancel();
            Err(e.to_string())
        }
    }
}

/// A UDF's error message may be long; the event carrying it must fit in a
/// cluster frame (one over the limit would close the session).
fn within_a_frame(mut message: String) -> String {
    const MAX: usize = 16 << 10;
    if message.len() > MAX {
        let mut end = MAX;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str(" [...]");
    }
    message
}

/// Checks an order's indexes against the plan before any is used, so that
/// an order that does not fit (a peer's bug, or bytes from a stranger that
/// still validate) fails the job with a message instead of panicking.
fn check_order(plan: &ExecPlan, order: &JobOrder) -> Result<(), String> {
    let stage = |stage: u64| {
        plan.stages
            .get(stage as usize)
            .ok_or_else(|| format!("stage {stage} of a plan of {}", plan.stages.len()))
    };
    match order {
        JobOrder::Run {
            stage: at, input, ..
        } => {
            let s = stage(*at)?;
            match (&s.kind, input) {
                (StageKind::Source { splits, .. }, InputSpec::Split(i))
                    if *i < splits.len() as u64 =>
                {
                    Ok(())
                }
                (StageKind::Map { .. }, InputSpec::Parts(_)) => Ok(()),
                _ => Err(format!("stage {at} (`{}`) cannot run that input", s.name)),
            }
        }
        JobOrder::Cancel { stage: at }
        | JobOrder::FitReserve { stage: at, .. }
        | JobOrder::Adopt { stage: at, .. } => stage(*at).map(|_| ()),
        JobOrder::Resume { .. }
        | JobOrder::Release { .. }
        | JobOrder::Peer { .. }
        | JobOrder::End => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use streambatch_core::{NodeConfig, Resources};
    use streambatch_plan::{Dataset, Error, JobStream, Runner};

    use super::*;

    /// Keeps the plan of the job it is asked to run, and runs nothing.
    struct Capture(Mutex<Option<ExecPlan>>, NodeConfig);

    impl Runner for Capture {
        fn run(&self, plan: ExecPlan) -> Result<Box<dyn JobStream>, Error> {
            *self.0.lock().unwrap() = Some(plan);
            Err(Error::NodeLost {
                node: "none: the plan is captured".into(),
            })
        }

        fn config(&self) -> &NodeConfig {
            &self.1
        }
    }

    fn plan() -> ExecPlan {
        let capture = Arc::new(Capture(Mutex::new(None), NodeConfig::default()));
        let ds = Dataset::range(capture.clone(), 10, 2).map_batches(
            |b: arrow_array::RecordBatch| Ok::<_, streambatch_plan::UdfError>(b),
            Resources::gpu(1.0),
        );
        let _ = ds.count();
        capture.0.lock().unwrap().take().expect("the plan was run")
    }

    fn run(stage: u64, input: InputSpec) -> JobOrder {
        JobOrder::Run {
            task: 1,
            stage,
            input,
            keep_from: 0,
            keep_again: Vec::new(),
            may_spill: false,
            range: None,
            rows: None,
        }
    }

    /// An actor that drops what it is sent.
    struct Ignore<M>(std::marker::PhantomData<fn() -> M>);

    impl<M: ractor::Message> Actor for Ignore<M> {
        type Msg = M;
        type State = ();
        type Arguments = ();

        async fn pre_start(&self, _: ActorRef<M>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
    }

    async fn ignoring<M: ractor::Message>() -> ActorRef<M> {
        let (actor, _) = Actor::spawn(None, Ignore(std::marker::PhantomData), ())
            .await
            .unwrap();
        actor
    }

    /// An order over rows outside an output held here fails its task, and
    /// leaves it counted as running nowhere: a draining node stops only
    /// once nothing runs, and would wait for that task for ever.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_task_over_rows_outside_an_output_leaves_nothing_running() {
        use arrow_array::{ArrayRef, Int64Array};
        use streambatch_net::{Endpoint, Identity, Locality, TlsFiles, init_cluster};
        use streambatch_store::{SharedStore, StoreConfig};

        let dir = tempfile::tempdir().unwrap();
        let tls = dir.path().join("tls");
        init_cluster(&tls, &["node"]).unwrap();
        let identity = Identity::load(&TlsFiles::in_dir(&tls, "node")).unwrap();
        let endpoint = Endpoint::bind("127.0.0.1:0".parse().unwrap(), &identity).unwrap();
        let shared =
            SharedStore::open(StoreConfig::new(16 << 20, dir.path().join("spill"))).unwrap();
        let server = Arc::new(StoreServer::new(shared.clone()));
        let here = Locality::here(dir.path());
        let transport = Transport::start("node", endpoint, server.clone(), here, None)
            .await
            .unwrap();
        let myself = ignoring::<RelayMsg>().await;
        let plan = Arc::new(plan());
        let store: Arc<dyn ObjectStore> = Arc::new(shared);
        let metrics = NodeMetrics::new(store.clone(), 1.0, 1.0);
        let budgets = Budgets::new(16 << 20, vec![0; plan.stages.len()], Arc::new(|| {}));
        let events = myself.get_derived();
        let ctx = JobCtx::new(
            JobId(1),
            plan.clone(),
            store.clone(),
            budgets,
            events,
            1 << 20,
        );
        let ctx = Arc::new(ctx);
        let mut state = RelayState {
            key: JobKey {
                cluster: "c".into(),
                driver: "driver".into(),
                job: 1,
            },
            node: "node".into(),
            ctx,
            port: ignoring::<PortMsg>().await,
            server,
            transport: transport.clone(),
            manager: ignoring::<NodeMsg>().await,
            outputs: HashMap::new(),
            paused: HashMap::new(),
            pulled: Arc::default(),
            ending: false,
            draining: true,
            running: Default::default(),
            share: NodeShare::new(plan.stages.iter().map(|s| s.name.clone()), &metrics),
            spilled_before: 0,
        };
        // An output of 10 rows held here, and an order for rows 5..25 of it.
        let x: ArrayRef = Arc::new(Int64Array::from_iter_values(0..10));
        let part = store
            .put(RecordBatch::try_from_iter([("x", x)]).unwrap())
            .unwrap();
        let id = part.id().0;
        state.outputs.insert(id, Output::new(part, 80, None));
        let outside = PartSpec::range("node".into(), id, 5, 20);
        let input = InputSpec::Parts(vec![outside]);
        state.run(
            TaskId(1),
            1,
            (input, None, None),
            Keep::all(),
            false,
            &myself,
        );
        assert!(state.running.is_empty(), "the failed task still runs here");
        transport.stop();
    }

    #[test]
    fn orders_that_do_not_fit_the_plan_are_refused() {
        let plan = plan();
        assert_eq!(plan.stages.len(), 2);
        assert!(check_order(&plan, &run(0, InputSpec::Split(1))).is_ok());
        assert!(check_order(&plan, &run(1, InputSpec::Parts(vec![]))).is_ok());
        let refused = [
            run(2, InputSpec::Split(0)),
            run(0, InputSpec::Split(2)),
            run(0, InputSpec::Parts(vec![])),
            run(1, InputSpec::Split(0)),
            JobOrder::Cancel { stage: 9 },
            JobOrder::FitReserve {
                stage: u64::MAX,
                bytes: 1,
            },
        ];
        for order in refused {
            let why = check_order(&plan, &order).unwrap_err();
            assert!(why.contains("stage"), "{order:?}: {why}");
        }
    }
}
