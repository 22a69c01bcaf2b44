//! Where and when tasks start: one decision of the policy per node per
//! pass, the snapshot it decides on, the open nodes, holds of input
//! outside the store, and the spill of last resort.

use super::*;

impl<P: Part> JobState<P> {
    /// Asks the policy for one decision per node per pass, so that tasks
    /// spread over the nodes (a stage capped by its pool too), until a pass
    /// decides nothing. The first pass asks the open nodes and those with
    /// queue room, from a node that moves on each pass; later ones only the
    /// nodes that decided in the pass before, since a decision never makes
    /// room on another node.
    pub(super) fn decide(&mut self, memory: &impl Memory) {
        let first = self.next_node;
        let mut decided = Vec::new();
        let (mut from, mut wrapped) = (first, false);
        while self.has_work() {
            let next = self.askable(from, wrapped.then_some(first));
            match next {
                Some(node) => {
                    from = node + 1;
                    if self.decide_on(memory, node) {
                        decided.push(node);
                    }
                }
                None if !wrapped => (from, wrapped) = (0, true),
                None => break,
            }
        }
        while !decided.is_empty() {
            self.next_node = (self.next_node + 1) % self.free.len();
            decided.rotate_left(1);
            let asked = std::mem::take(&mut decided);
            for node in asked {
                if !self.has_work() {
                    break;
                }
                if self.decide_on(memory, node) {
                    decided.push(node);
                }
            }
        }
        self.next_node = (self.next_node + 1) % self.free.len();
    }

    /// The first node from `from` (up to `below`) that is open or has
    /// queue room.
    fn askable(&self, from: usize, below: Option<usize>) -> Option<usize> {
        let first = |set: &BTreeSet<usize>| match below {
            Some(end) => set.range(from..end).next().copied(),
            None => set.range(from..).next().copied(),
        };
        match (first(&self.open), first(&self.queue_open)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Carries out the policy's decision for `node`, if any; true if there
    /// was one.
    pub(super) fn decide_on(&mut self, memory: &impl Memory, node: usize) -> bool {
        let paused_here = || {
            self.stages
                .iter()
                .flat_map(|s| &s.paused)
                .any(|p| p.node == node)
        };
        if self.draining[node] && !paused_here() {
            return false;
        }
        let snapshot = self.snapshot(memory, node);
        match policy::next_decision(&snapshot) {
            Some(decision) => {
                if tracing::enabled!(target: "streambatch::schedule", tracing::Level::DEBUG) {
                    self.log_decision(&snapshot, decision, node);
                }
                self.carry_out(decision, node, false);
                true
            }
            None => false,
        }
    }

    /// Logs a decision with its reason (`RUST_LOG=streambatch=debug`).
    pub(super) fn log_decision(&self, snapshot: &Snapshot, decision: Decision, node: usize) {
        let (what, stage) = match decision {
            Decision::Resume { stage, .. } => ("resume a task", stage),
            Decision::Dispatch { stage } => ("start a task", stage),
            Decision::Queue { stage } => ("queue a task", stage),
        };
        tracing::debug!(
            target: "streambatch::schedule",
            stage = %self.shapes[stage].name,
            node,
            reason = %policy::reason(snapshot, decision),
            "{what}"
        );
    }

    /// Some stage has an input to start a task on, or a paused task.
    pub(super) fn has_work(&self) -> bool {
        self.stages.iter().zip(&self.shapes).any(|(s, shape)| {
            !s.paused.is_empty() || (shape.kind.runs_tasks() && s.startable() > 0)
        })
    }

    /// Keeps `open`, `queue_open`, `fits_here` and `fitting` up to date
    /// after `node`'s free slots or queue changed.
    pub(super) fn reopen(&mut self, node: usize) {
        if !self.lost[node] && self.queued[node] < self.queue_room[node] {
            self.queue_open.insert(node);
        } else {
            self.queue_open.remove(&node);
        }
        let free = self.free[node];
        let mut fits = false;
        for (stage, shape) in self.shapes.iter().enumerate() {
            let here =
                !self.lost[node] && shape.kind.runs_tasks() && shape.resources.fits_in(&free);
            let was = std::mem::replace(&mut self.fits_here[node][stage], here);
            match (was, here) {
                (false, true) => self.fitting[stage] += 1,
                (true, false) => self.fitting[stage] -= 1,
                _ => {}
            }
            fits |= here;
        }
        if fits {
            self.open.insert(node);
        } else {
            self.open.remove(&node);
        }
    }

    /// What the policy sees of node `node`: its free slots, the tasks
    /// paused there, and its memory.
    pub(super) fn snapshot(&self, memory: &impl Memory, node: usize) -> Snapshot {
        let holding = self.holding(node);
        // Holds `fits` does not count yet: tasks started and not opened, or
        // all of them where the budgets are a remote node's shadow. (Asked
        // only when there are holds: it takes the budgets' lock.)
        let unseen = match holding.all {
            0 => 0,
            all => all.saturating_sub(memory.outside(node)),
        };
        let queue_room = match self.draining[node] {
            true => 0,
            false => self.queue_room[node] - self.queued[node],
        };
        let stages = self
            .stages
            .iter()
            .zip(&self.shapes)
            .enumerate()
            .map(|(i, (s, shape))| {
                let runs = shape.kind.runs_tasks() && !self.draining[node];
                let here = || s.paused.iter().filter(|p| p.node == node);
                let paused_fits = here()
                    .map(|p| {
                        let freed_since = p.store_full_at.is_none_or(|at| memory.frees(node) > at);
                        freed_since && memory.fits(node, i, p.pending_bytes + unseen)
                    })
                    .collect();
                let holds = || hold_fits(self.next_held_bytes(i), holding, memory.capacity(node));
                // A queued task starts when a slot frees, whatever memory
                // holds then: queue only where the outputs of every task in
                // flight and of a full queue fit now, so that no start of a
                // queued task can take memory the policy would not give it.
                let in_flight = || {
                    let per_task = s.outputs.div_ceil(s.finished.max(1));
                    s.typical_bytes * per_task * (s.running + queue_room + 1) as u64
                };
                StageView {
                    waiting_inputs: if runs { s.startable() } else { 0 },
                    paused_fits,
                    paused: here().map(|p| p.pending_bytes).collect(),
                    running: s.running,
                    resources: shape.resources,
                    max_running: shape.max_running,
                    budget_fits_typical: memory.fits(node, i, s.typical_bytes + unseen) && holds(),
                    queue_fits: queue_room > 0
                        && s.finished > 0
                        && s.typical_busy <= QUEUE_TASKS_UNDER
                        && memory.fits(node, i, in_flight() + unseen)
                        && holds(),
                }
            })
            .collect();
        Snapshot {
            stages,
            free: self.free[node],
            slots: self.slots[node],
            queue_room,
        }
    }

    /// Bytes the tasks placed on `node` (running or paused) hold outside
    /// the store ([`StageShape::held_bytes`], [`StageShape::input_held_cap`]);
    /// 0 without a stage whose tasks hold any, which costs nothing to find.
    pub(super) fn holding(&self, node: usize) -> Holding {
        let mut holding = Holding::default();
        let holds = |s: &StageShape| !s.held_bytes.is_empty() || s.input_held_cap > 0;
        if !self.shapes.iter().any(holds) {
            return holding;
        }
        for r in self.tasks.values().filter(|r| r.placed && r.node == node) {
            let held = self.task_hold(r.stage, &r.input);
            holding.all += held;
            holding.largest = holding.largest.max(held);
        }
        holding
    }

    /// Starts or resumes a task on `node` as decided (a decision's paused
    /// index counts the tasks paused on that node).
    pub(super) fn carry_out(&mut self, decision: Decision, node: usize, may_spill: bool) {
        let (stage, task, kind) = match decision {
            Decision::Resume { stage, index } => {
                let paused = &mut self.stages[stage].paused;
                let at = paused
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.node == node)
                    .nth(index)
                    .map(|(at, _)| at)
                    .expect("the policy resumes a task paused on this node");
                let task = paused.remove(at).task;
                if let Some(record) = self.tasks.get_mut(&task) {
                    record.spilling = may_spill;
                    self.spilling_tasks += usize::from(may_spill);
                }
                self.actions.push(Action::Resume {
                    task,
                    node,
                    may_spill,
                });
                (stage, task, EventKind::TaskResumed)
            }
            Decision::Dispatch { stage } => {
                let task = self.start(stage, node, may_spill);
                (stage, task, EventKind::TaskStarted)
            }
            Decision::Queue { stage } => {
                let task = self.start(stage, node, may_spill);
                if let Some(record) = self.tasks.get_mut(&task) {
                    record.queued = true;
                }
                (stage, task, EventKind::TaskStarted)
            }
        };
        let queued = matches!(decision, Decision::Queue { .. });
        if queued {
            self.queued[node] += 1;
        } else {
            let resources = self.shapes[stage].resources;
            self.free[node].cpus -= resources.cpus;
            self.free[node].gpus -= resources.gpus;
        }
        self.reopen(node);
        let s = &mut self.stages[stage];
        s.running += 1;
        s.queued += usize::from(queued);
        let running = s.running - s.queued;
        self.recorder.task_started(stage, running);
        self.recorder.event(stage, task, kind, node);
    }

    /// A new task of `stage` on `node`: a retry first, else the next split,
    /// else the first input held on that node, else the oldest input.
    pub(super) fn start(&mut self, stage: usize, node: usize, may_spill: bool) -> TaskId {
        let s = &mut self.stages[stage];
        if let Some(task) = s.retry.pop_front() {
            let record = self
                .tasks
                .get_mut(&task)
                .expect("a retried task has a record");
            record.node = node;
            record.placed = true;
            record.queued = false;
            record.spilling = may_spill;
            self.spilling_tasks += usize::from(may_spill);
            let keep = Keep::of(record.delivered, &record.again);
            let input = &self.tasks[&task].input;
            let (start, holding) = self.start_of(task, stage, node, input, keep, may_spill);
            self.tasks.get_mut(&task).expect("looked up above").holding = holding;
            self.actions.push(Action::Start(start));
            return task;
        }
        let input = if s.next_split < s.splits {
            s.next_split += 1;
            LineageInput::Split(s.next_split - 1)
        } else {
            let on_node = |p: &Piece<P>| p.part.as_ref().is_some_and(|p| p.node() == node);
            // Only the oldest inputs are searched, so that a long queue
            // costs no more per start than a short one.
            let local = s
                .queue
                .iter()
                .take(LOCAL_SEARCH)
                .position(|input| input.pieces().first().is_some_and(on_node))
                .unwrap_or(0);
            s.queue
                .remove(local)
                .expect("the policy dispatches only stages with input")
        };
        let task = TaskId(self.next_task);
        self.next_task += 1;
        if let (Some(order), LineageInput::Reducer(place)) = (self.order.as_mut(), &input)
            && order.stage == stage
        {
            order.started(task, *place);
        }
        let (start, holding) = self.start_of(task, stage, node, &input, Keep::all(), may_spill);
        self.tasks.insert(
            task,
            TaskRecord {
                stage,
                node,
                input,
                attempts: 0,
                delivered: 0,
                again: BTreeSet::new(),
                again_next: BTreeSet::new(),
                placed: true,
                queued: false,
                spilling: may_spill,
                rerun: false,
                reruns: 0,
                holding,
            },
        );
        self.actions.push(Action::Start(start));
        self.spilling_tasks += usize::from(may_spill);
        task
    }

    /// How `task` of `stage` starts on `node` over `input` (held now),
    /// and what of a reducer's input it holds while it runs.
    fn start_of(
        &self,
        task: TaskId,
        stage: usize,
        node: usize,
        input: &LineageInput<P>,
        keep: Keep,
        may_spill: bool,
    ) -> (Start<P>, Vec<P>) {
        let run_input = self.held_input(stage, input);
        let holding = reducer_holding(input, &run_input);
        let start = Start {
            task,
            stage,
            node,
            input: run_input,
            rows: self.rows_found_by_holders(stage, input),
            keep,
            may_spill,
        };
        (start, holding)
    }

    /// The stage and node of a task placed on a node.
    pub(super) fn placed(&self, task: TaskId) -> Option<(usize, usize)> {
        self.tasks
            .get(&task)
            .filter(|r| r.placed)
            .map(|r| (r.stage, r.node))
    }

    /// Placed task `task` gave its slot (or its place in its node's
    /// queue) back.
    pub(super) fn release(&mut self, task: TaskId) {
        let record = self
            .tasks
            .get_mut(&task)
            .expect("a placed task has a record");
        let (node, stage) = (record.node, record.stage);
        let queued = std::mem::take(&mut record.queued);
        if std::mem::take(&mut record.spilling) {
            self.spilling_tasks -= 1;
        }
        if queued {
            self.queued[node] -= 1;
        } else {
            let resources = self.shapes[stage].resources;
            self.free[node].cpus += resources.cpus;
            self.free[node].gpus += resources.gpus;
        }
        self.reopen(node);
        let s = &mut self.stages[stage];
        s.running -= 1;
        s.queued -= usize::from(queued);
        self.recorder.task_stopped(stage, s.running - s.queued);
    }

    /// Nothing runs but tasks let spill, and the last stage holds nothing
    /// the driver has not taken, yet work remains: memory is full of
    /// partitions that only more input could consume (a repartition or an
    /// exchange larger than the store). Runs one more task that may spill,
    /// where a slot is free: the spilling tasks use every slot, not one.
    /// True when it did.
    pub(super) fn force_if_stuck(&mut self, memory: &impl Memory) -> bool {
        if self.running_anywhere() > self.spilling_tasks || self.finished() {
            return false;
        }
        let last = self
            .shapes
            .iter()
            .rposition(|s| s.kind.runs_tasks())
            .unwrap_or(0);
        // Outputs of the last stage free memory as the driver reads them,
        // unless they wait for an earlier one (a sort's, in its order or
        // for the driver to read the one before): those do not.
        let for_driver: u64 = self
            .to_driver
            .iter()
            .filter_map(|p| p.part.as_ref())
            .map(Part::bytes)
            .sum();
        let waiting = self.order.as_ref().map_or(0, |o| o.held_bytes()) + for_driver;
        // With lineage the driver confirms each read: once it has read
        // every output handed to it, what the last stage still holds is
        // the driver's own (a `collect`, batches mapped from a node's
        // memory) and no wait frees it.
        let driver_reads_more = self.made.is_none() || self.unread > 0;
        if memory.held(last) > waiting && driver_reads_more {
            return false;
        }
        for node in 0..self.free.len() {
            if let Some(decision) = policy::forced_decision(&self.snapshot(memory, node)) {
                tracing::debug!(
                    target: "streambatch::schedule",
                    ?decision,
                    node,
                    reason = "memory is full and nothing can run",
                    "let a task spill"
                );
                self.carry_out(decision, node, true);
                return true;
            }
        }
        false
    }
}

impl<P: Part> JobState<P> {
    /// What the next task `start` gives `stage` holds outside the store
    /// while it runs, for a retry (which goes first) as for a new input:
    /// its split's held bytes, or a reducer's input up to its stage's cap.
    fn next_held_bytes(&self, stage: usize) -> u64 {
        let (s, shape) = (&self.stages[stage], &self.shapes[stage]);
        match s.retry.front() {
            Some(task) => self
                .tasks
                .get(task)
                .map_or(0, |r| self.task_hold(stage, &r.input)),
            None if s.next_split < s.splits => {
                shape.held_bytes.get(s.next_split).copied().unwrap_or(0)
            }
            None => s
                .queue
                .front()
                .map_or(0, |input| self.task_hold(stage, input)),
        }
    }

    /// What a task of `stage` over `input` holds outside the store.
    fn task_hold(&self, stage: usize, input: &LineageInput<P>) -> u64 {
        let shape = &self.shapes[stage];
        match input {
            LineageInput::Split(i) => shape.held_bytes.get(*i).copied().unwrap_or(0),
            LineageInput::Pieces(pieces) => input_hold(
                shape.input_held_cap,
                pieces.iter().filter_map(|p| p.part.as_ref()),
            ),
            LineageInput::Reducer(place) => self.exchange(stage).hold(*place, shape.input_held_cap),
        }
    }
}

/// What an attempt over `input` (handed `parts`) keeps while placed: a
/// reducer's rows (see `TaskRecord::holding`), else nothing.
fn reducer_holding<P: Part>(input: &LineageInput<P>, parts: &RunInput<P>) -> Vec<P> {
    match (input, parts) {
        (LineageInput::Reducer(_), RunInput::Parts(parts, _)) => parts.clone(),
        _ => Vec::new(),
    }
}

/// Whether a task holding `next` bytes outside the store may start on a
/// node whose tasks hold `holding` (in all, and the largest) and whose
/// store holds `capacity`: one task may hold any amount, the others
/// together at most half the capacity. So two large files are never held
/// at once, small ones are read beside a large one, and outputs keep room
/// (the budgets give them what the holds leave).
pub(super) fn hold_fits(next: u64, holding: Holding, capacity: u64) -> bool {
    let all = holding.all + next;
    next == 0 || all - holding.largest.max(next) <= capacity / 2
}

/// Bytes tasks placed on a node hold outside the store.
#[derive(Clone, Copy, Default)]
pub(super) struct Holding {
    all: u64,
    largest: u64,
}
