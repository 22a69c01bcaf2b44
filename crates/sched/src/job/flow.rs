//! How partitions flow between stages: routing outputs to the next
//! stage, limits, settling finished stages, and what each stage waits
//! for, as the recorder reports it.

use super::exchanged::{CutSums, Exchanged};
use super::lineage::{cut_fingerprint, regroup};
use super::order::OutOfOrder;
use super::*;

impl<P: Part> JobState<P> {
    /// Tells the recorder what each stage waits for, having decided.
    pub(super) fn report_stages(&mut self, memory: &impl Memory) {
        let now: Vec<StageNow> = (0..self.stages.len())
            .map(|i| {
                let (s, shape) = (&self.stages[i], &self.shapes[i]);
                let runs_tasks = shape.kind.runs_tasks();
                let queued = if runs_tasks { s.startable() } else { 0 };
                let waiting = if s.done || !runs_tasks {
                    None
                } else if let Some(p) = s.paused.first() {
                    Some(match p.store_full_at {
                        Some(_) => Wait::StoreFull,
                        None => Wait::OutputBudget,
                    })
                } else if queued > 0 {
                    let pool_full = shape.max_running.is_some_and(|max| s.running >= max);
                    if pool_full || self.fitting[i] == 0 {
                        Some(Wait::NoSlot)
                    } else {
                        // A slot is free: the policy held the input back
                        // for its memory budget.
                        Some(Wait::OutputBudget)
                    }
                } else if s.running == 0 {
                    Some(Wait::Input)
                } else {
                    None
                };
                StageNow {
                    queued,
                    held_bytes: memory.held(i),
                    waiting,
                }
            })
            .collect();
        self.recorder.stages_now(&now);
    }

    /// Hands rows to the driver (counted until it says it read them, when
    /// the job keeps lineage).
    ///
    /// A sort's outputs go one at a time when the job keeps lineage: the
    /// next once the driver has read the last, so that one lost before it
    /// was read is made again and handed over again before any after it.
    pub(super) fn emit(&mut self, piece: Piece<P>) {
        if self.one_at_a_time() {
            self.to_driver.push_back(piece);
            return self.emit_next();
        }
        self.hand(piece);
    }

    /// The driver gets a sort's outputs one at a time (see [`Self::emit`]).
    pub(crate) fn one_at_a_time(&self) -> bool {
        self.made.is_some()
            && self
                .order
                .as_ref()
                .is_some_and(|o| o.stage + 1 == self.stages.len())
    }

    fn hand(&mut self, piece: Piece<P>) {
        let part = piece.part.expect("only held rows are handed out");
        if self.made.is_some() {
            self.unread += 1;
        }
        self.told_drained = false;
        self.actions.push(Action::Emit { part, id: piece.id });
    }

    /// The next of a sort's outputs, once the driver has read the last and
    /// none it lost waits to be made again; one lost with its node waits
    /// to be made again as well.
    pub(super) fn emit_next(&mut self) {
        let free = self.unread == 0 && self.reemit.is_empty();
        if free && self.to_driver.front().is_some_and(Piece::held) {
            let piece = self.to_driver.pop_front().expect("looked at above");
            self.hand(piece);
        }
    }

    /// Hands an output of stage `to - 1` to stage `to` (or the driver),
    /// in range order where stage `to - 1` reduces a sort.
    pub(super) fn route(&mut self, to: usize, piece: Piece<P>) {
        let Some(order) = self.order.as_mut().filter(|o| o.stage + 1 == to) else {
            return self.route_now(to, piece);
        };
        match order.output(piece) {
            Ok(due) => self.pass_on(to, due),
            Err(OutOfOrder) => self.fail(Error::PartitionLost {
                operator: self.shapes[to - 1].name.clone(),
                why: "an output of the sort was lost after it was passed on; its order cannot be kept (run the job again)".into(),
            }),
        }
    }

    /// Passes the ordered outputs whose turn has come to stage `to`.
    pub(super) fn pass_on(&mut self, to: usize, due: Vec<Piece<P>>) {
        for piece in due {
            self.route_now(to, piece);
        }
    }

    /// The outputs of the sort whose turn has come, passed on.
    pub(super) fn pass_on_due(&mut self) {
        if let Some(order) = self.order.as_mut() {
            let (to, due) = (order.stage + 1, order.due());
            self.pass_on(to, due);
        }
    }

    fn route_now(&mut self, to: usize, piece: Piece<P>) {
        if to == self.stages.len() {
            return self.emit(piece);
        }
        match self.shapes[to].kind {
            ShapeKind::Limit(_) => {
                let s = &mut self.stages[to];
                let take = piece.id.len.min(s.limit_left);
                if take == 0 {
                    return;
                }
                s.limit_left -= take;
                self.recorder.output(to, take, 0);
                self.route(to + 1, piece.sub(0, take));
                self.check_limits();
            }
            ShapeKind::Repartition(_) => self.stages[to].collected.push(piece),
            ShapeKind::Exchange(n) => {
                let mut piece = piece;
                if let Some(part) = piece.part.as_mut() {
                    // Kept before the cut is left to the holder: an output
                    // made again must be cut the same.
                    if let Some(cut) = cut_fingerprint(part) {
                        self.exchanged.insert(piece.id.from, cut);
                    }
                    let s = &mut self.stages[to];
                    s.cut_sums.get_or_insert_with(|| CutSums::new(n)).fold(part);
                }
                self.stages[to].collected.push(piece)
            }
            ShapeKind::Source { .. } | ShapeKind::Map => self.stages[to]
                .queue
                .push_back(LineageInput::Pieces(vec![piece])),
        }
    }

    /// A limit that has all its rows ends every stage before it.
    pub(super) fn check_limits(&mut self) {
        let Some(limit) = (0..self.stages.len()).rev().find(|&i| {
            matches!(self.shapes[i].kind, ShapeKind::Limit(_)) && self.stages[i].limit_left == 0
        }) else {
            return;
        };
        for stage in 0..=limit {
            let s = &mut self.stages[stage];
            if !s.cancelled {
                self.actions.push(Action::Cancel { stage });
            }
            // Reducers that will not run read nothing of their exchange.
            if let Some(exchange) = &mut self.exchanges[stage] {
                for input in s.queue.iter().chain(&s.blocked) {
                    if let LineageInput::Reducer(place) = input {
                        exchange.finished(*place);
                    }
                }
            }
            s.cancelled = true;
            s.done = true;
            s.queue.clear();
            s.blocked.clear();
            s.collected.clear();
            s.cut_sums = None;
            s.next_split = s.splits;
            // Re-runs go on: a later stage waits for what they make again.
            // The other tasks not running are dropped (paused ones too: the
            // nodes drop them on `Cancel`).
            let tasks = &mut self.tasks;
            let rerun = |task: &TaskId| tasks.get(task).is_some_and(|r| r.rerun);
            let paused = std::mem::take(&mut s.paused);
            let (paused, dropped): (Vec<Paused>, Vec<Paused>) =
                paused.into_iter().partition(|p| rerun(&p.task));
            s.paused = paused;
            let (retry, dropped_retry): (Vec<TaskId>, Vec<TaskId>) =
                s.retry.drain(..).partition(rerun);
            s.retry = retry.into();
            let (blocked, dropped_blocked): (Vec<TaskId>, Vec<TaskId>) =
                s.blocked_tasks.drain(..).partition(rerun);
            s.blocked_tasks = blocked;
            let dropped: Vec<TaskId> = dropped
                .into_iter()
                .map(|p| p.task)
                .chain(dropped_retry)
                .chain(dropped_blocked)
                .collect();
            for task in dropped {
                self.drop_task(task);
            }
        }
    }

    /// Drops a task its cancelled stage no longer needs, keeping its
    /// lineage when it delivered outputs: a later stage may still need one
    /// of them made again, and those it was asked to make again are asked
    /// of a re-run.
    pub(super) fn drop_task(&mut self, task: TaskId) {
        if let Some(record) = self.tasks.remove(&task) {
            self.forget_task(task, record);
        }
    }

    /// [`JobState::drop_task`] for a record already taken out.
    pub(super) fn forget_task(&mut self, task: TaskId, record: TaskRecord<P>) {
        self.reducer_done(record.stage, &record.input);
        if let Some(made) = self.made.as_mut().filter(|_| record.delivered > 0) {
            let made_task = Made {
                stage: record.stage,
                input: record.input.forget(),
                reruns: record.reruns,
            };
            made.insert(task, made_task);
        }
        for seq in record.again.into_iter().chain(record.again_next) {
            self.demand(Origin { task, seq }, false);
        }
    }

    /// Marks stages whose input is complete and whose tasks are all done;
    /// a finished repartition hands its groups on. True when something changed.
    pub(super) fn settle(&mut self) -> bool {
        let mut changed = false;
        for i in 0..self.stages.len() {
            if self.stages[i].done {
                continue;
            }
            if i > 0 && !self.stages[i - 1].done {
                break;
            }
            let s = &self.stages[i];
            match self.shapes[i].kind {
                ShapeKind::Repartition(n) => {
                    if !all_held(&s.collected) {
                        break;
                    }
                    let groups = regroup(std::mem::take(&mut self.stages[i].collected), n);
                    let next = i + 1;
                    let runs_tasks = next < self.stages.len()
                        && matches!(
                            self.shapes[next].kind,
                            ShapeKind::Source { .. } | ShapeKind::Map
                        );
                    if runs_tasks {
                        self.stages[next]
                            .queue
                            .extend(groups.into_iter().map(LineageInput::Pieces));
                    } else {
                        // A limit (or the driver) takes rows, not task inputs.
                        for piece in groups.into_iter().flatten() {
                            self.route(next, piece);
                        }
                    }
                }
                ShapeKind::Exchange(n) => {
                    if !all_held(&s.collected) {
                        break;
                    }
                    let collected = std::mem::take(&mut self.stages[i].collected);
                    let sums = self.stages[i].cut_sums.take();
                    // The stats show what crossed the exchange.
                    let (mut rows, mut bytes) = (0, 0);
                    for piece in &collected {
                        rows += piece.id.len;
                        bytes += piece.part.as_ref().expect("all held").bytes();
                    }
                    self.recorder.exchanged(i, rows, bytes);
                    match Exchanged::new(collected, sums.unwrap_or_else(|| CutSums::new(n))) {
                        Ok(exchange) => {
                            let places = exchange.places() as u32;
                            self.exchanges[i + 1] = Some(exchange);
                            let reducers = (0..places).map(LineageInput::Reducer);
                            self.stages[i + 1].queue.extend(reducers);
                        }
                        Err(message) => {
                            let stage = self.shapes[i].name.clone();
                            self.fail(Error::Invalid(format!("{stage}: {message}")));
                        }
                    }
                }
                ShapeKind::Limit(_) => {}
                _ if !s.idle() => break,
                _ => {}
            }
            self.stages[i].done = true;
            changed = true;
        }
        changed
    }

    /// Sorts each stage's tasks waiting to run again by their input: whole
    /// ones to the retry queue, in order, those missing a piece aside.
    pub(super) fn sort_waiting_tasks(&mut self) {
        for stage in 0..self.stages.len() {
            let s = &mut self.stages[stage];
            let waiting: Vec<TaskId> = s.retry.drain(..).chain(s.blocked_tasks.drain(..)).collect();
            for task in waiting {
                let whole = self
                    .missing_input(stage, &self.tasks[&task].input)
                    .is_empty();
                let s = &mut self.stages[stage];
                match whole {
                    true => s.retry.push_back(task),
                    false => s.blocked_tasks.push(task),
                }
            }
        }
    }

    /// A stage with work left whose task fits no node that takes tasks.
    pub(super) fn stranded(&self) -> Option<String> {
        let takes = |need: &Resources| {
            (0..self.slots.len()).any(|n| !self.draining[n] && need.fits_in(&self.slots[n]))
        };
        self.shapes
            .iter()
            .zip(&self.stages)
            .find(|(shape, s)| {
                shape.kind.runs_tasks() && !(s.done && s.idle()) && !takes(&shape.resources)
            })
            .map(|(shape, _)| shape.name.clone())
    }

    pub(super) fn running_anywhere(&self) -> usize {
        self.stages.iter().map(|s| s.running).sum()
    }

    /// Pieces of partitions the job keeps, wherever: the measure of its
    /// records that an exchange must keep growing with M + N.
    #[cfg(test)]
    pub(crate) fn pieces_kept(&self) -> usize {
        let stages: usize = self
            .stages
            .iter()
            .map(|s| {
                let queued = s.queue.iter().chain(&s.blocked);
                queued.map(|i| i.pieces().len()).sum::<usize>() + s.collected.len()
            })
            .sum();
        let tasks: usize = self
            .tasks
            .values()
            .map(|r| r.input.pieces().len() + r.holding.len())
            .sum();
        let exchanges: usize = self.exchanges.iter().flatten().map(|e| e.outputs()).sum();
        stages + tasks + exchanges
    }

    /// Numbers of map outputs' cuts the job keeps, collected or exchanged:
    /// none of a hash exchange's, whose holders keep them.
    #[cfg(test)]
    pub(crate) fn cut_numbers_kept(&self) -> usize {
        let collected = self.stages.iter().flat_map(|s| &s.collected);
        let exchanged = self.exchanges.iter().flatten().flat_map(|e| e.pieces());
        collected
            .chain(exchanged)
            .filter_map(|p| p.part.as_ref()?.groups().map(|g| g.len()))
            .sum()
    }

    /// What the job holds, for a simulation that finds it stuck.
    pub(crate) fn describe(&self) -> String {
        let mut out = String::new();
        for (i, s) in self.stages.iter().enumerate() {
            out += &format!(
                "stage {i}: done {} cancelled {} queue {} blocked {:?} retry {:?} blocked_tasks {:?} paused {} running {} collected {} (missing {:?})\n",
                s.done,
                s.cancelled,
                s.queue.len(),
                s.blocked
                    .iter()
                    .map(|e| self.missing_input(i, e))
                    .collect::<Vec<_>>(),
                s.retry,
                s.blocked_tasks,
                s.paused.len(),
                s.running,
                s.collected.len(),
                missing(&s.collected).collect::<Vec<_>>(),
            );
        }
        let mut tasks: Vec<_> = self.tasks.iter().collect();
        tasks.sort_by_key(|(t, _)| **t);
        for (t, r) in tasks {
            out += &format!(
                "task {t}: stage {} node {} placed {} delivered {} again {:?} next {:?} missing {:?}\n",
                r.stage,
                r.node,
                r.placed,
                r.delivered,
                r.again,
                r.again_next,
                self.missing_input(r.stage, &r.input)
            );
        }
        out += &format!(
            "reemit {:?} unread {} draining {:?} lost {:?} free {:?}",
            self.reemit.iter().map(|p| p.id).collect::<Vec<_>>(),
            self.unread,
            self.draining,
            self.lost,
            self.free.iter().map(|f| f.cpus).collect::<Vec<_>>()
        );
        out
    }
}
