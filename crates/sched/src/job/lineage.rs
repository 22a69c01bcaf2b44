//! Lineage and node loss: what a lost node took, which tasks run again to
//! make it, what moves off a draining node, what the driver read.

use super::*;

impl<P: Part> JobState<P> {
    /// Node `node` (named `name`) is gone, with the tasks placed there and
    /// the partitions it held. Those tasks run again elsewhere; the lost
    /// partitions the job still needs are made again by running the tasks
    /// that made them (their inputs too, down to the source, as far as
    /// those were freed); the rest of the job goes on meanwhile. Without
    /// lineage (a job on the embedded node) the job fails.
    pub(crate) fn on_node_lost(&mut self, node: usize, name: &str) {
        if self.ended || self.lost.get(node).copied().unwrap_or(true) {
            return;
        }
        let clean = self.left_cleanly(node);
        self.lost[node] = true;
        self.draining[node] = true;
        self.reopen(node);
        self.moving.retain(|_, from| *from != node);
        if clean {
            tracing::info!(node = %name, "a drained node left");
            return;
        }
        if self.made.is_none() {
            return self.fail(Error::NodeLost { node: name.into() });
        }
        tracing::warn!(node = %name, "node lost; making its partitions again");
        self.recorder.node_lost(name);
        let mut needed = BTreeSet::new();
        for exchange in self.exchanges.iter_mut().flatten() {
            exchange.lose(node);
        }
        for stage in 0..self.stages.len() {
            let s = &mut self.stages[stage];
            let queue = std::mem::take(&mut s.queue);
            for piece in s.blocked.iter_mut().flat_map(LineageInput::pieces_mut) {
                piece.lose(node);
            }
            for piece in &mut s.collected {
                piece.lose(node);
            }
            needed.extend(missing(&s.collected));
            for mut entry in queue {
                entry.pieces_mut().iter_mut().for_each(|p| {
                    p.lose(node);
                });
                let whole = self.missing_input(stage, &entry).is_empty();
                let s = &mut self.stages[stage];
                match whole {
                    true => s.queue.push_back(entry),
                    false => s.blocked.push(entry),
                }
            }
            for entry in &self.stages[stage].blocked {
                needed.extend(self.missing_input(stage, entry));
            }
        }
        // A sort's outputs waiting for their turn, or for the driver, are
        // made again.
        let order = self.order.as_mut().into_iter().flat_map(|o| o.held_mut());
        for piece in order.chain(self.to_driver.iter_mut()) {
            if piece.lose(node) {
                needed.insert(piece.id.from);
            }
        }
        for record in self.tasks.values_mut() {
            // A task placed elsewhere may have read its input already: its
            // lost pieces are made again only should it run again.
            for piece in record.input.pieces_mut() {
                piece.lose(node);
            }
        }
        let mut there: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, r)| r.placed && r.node == node)
            .map(|(t, _)| *t)
            .collect();
        there.sort_unstable(); // the same order in every replay
        for task in there {
            let stage = self.tasks[&task].stage;
            let paused = &mut self.stages[stage].paused;
            match paused.iter().position(|p| p.task == task) {
                Some(at) => {
                    paused.remove(at);
                }
                None => self.release(task),
            }
            let record = self.tasks.get_mut(&task).expect("listed above");
            record.attempts += 1;
            let attempts = record.attempts;
            if attempts > self.failures.max_task_retries {
                let operator = self.shapes[stage].name.clone();
                return self.fail(Error::PartitionLost {
                    operator,
                    why: format!("its task was tried {attempts} times"),
                });
            }
            self.recorder.retry(stage);
            self.recorder
                .event(stage, task, EventKind::TaskRetried, node);
            self.requeue(task);
        }
        self.sort_waiting_tasks();
        for (stage, s) in self.stages.iter().enumerate() {
            for task in &s.blocked_tasks {
                needed.extend(self.missing_input(stage, &self.tasks[task].input));
            }
        }
        for origin in needed {
            self.demand(origin, true);
        }
        if self.stranded().is_some() {
            self.fail(Error::NodeLost { node: name.into() });
        }
    }

    /// The driver tried to read the rows `id` names: `read` says whether it
    /// could. Rows it could not read (their node is gone) are made again
    /// and handed to it anew.
    pub(crate) fn on_read(&mut self, id: PieceId, read: bool) {
        if self.made.is_none() {
            return;
        }
        self.unread = self.unread.saturating_sub(1);
        if read {
            return self.emit_next();
        }
        if !self.ended {
            self.reemit.push(Piece::lost(id));
            self.demand(id.from, true);
            if let Some(operator) = self.stranded() {
                self.fail(Error::PartitionLost {
                    operator,
                    why: "no node left can run its task".into(),
                });
            }
        }
    }

    /// Output `origin`, asked to move off a draining node, is now held as
    /// `whole` on another: every piece of it the job holds there and has
    /// not handed to a task takes its rows from `whole` instead, so that
    /// the draining node is asked for it no more.
    pub(crate) fn on_moved(&mut self, origin: Origin, whole: P) {
        let Some(from) = self.moving.remove(&origin) else {
            return;
        };
        let mut moved = |piece: &mut Piece<P>| {
            if piece.id.from == origin && piece.part.as_ref().is_some_and(|p| p.node() == from) {
                let mut part = whole.sub(piece.id.offset, piece.id.len);
                if let Some(old) = &piece.part {
                    part.keep_groups(old);
                }
                piece.part = Some(part);
            }
        };
        self.for_each_unplaced_piece(&mut moved);
    }

    /// Asks for the outputs held on draining nodes that the job still needs
    /// to be moved to nodes that stay (spread over them in turn), each once.
    pub(super) fn hand_over(&mut self) {
        if !std::mem::take(&mut self.hand_over_due) {
            return;
        }
        let draining: Vec<bool> = (0..self.free.len())
            .map(|n| self.draining[n] && !self.lost[n])
            .collect();
        if !draining.contains(&true) {
            return;
        }
        let stays: Vec<usize> = (0..self.free.len())
            .filter(|&n| !self.draining[n] && !self.lost[n])
            .collect();
        if stays.is_empty() {
            return;
        }
        let mut asked = Vec::new();
        let moving = std::mem::take(&mut self.moving);
        self.for_each_unplaced_piece(&mut |piece: &mut Piece<P>| {
            if let Some(part) = &piece.part {
                let from = part.node();
                if draining[from] && !moving.contains_key(&piece.id.from) {
                    asked.push((piece.id.from, from, part.clone()));
                }
            }
        });
        self.moving = moving;
        for (origin, from, part) in asked {
            if self.moving.contains_key(&origin) {
                continue; // another piece of the same output
            }
            let Some(stage) = self.stage_of(origin.task).or_else(|| {
                self.made
                    .as_ref()
                    .and_then(|m| m.get(&origin.task))
                    .map(|m| m.stage)
            }) else {
                continue;
            };
            let to = stays[self.moving.len() % stays.len()];
            self.moving.insert(origin, from);
            self.actions.push(Action::Move {
                origin,
                stage,
                part,
                to,
            });
        }
    }

    /// Calls `f` on every piece the job holds that no task has been handed:
    /// queued, waiting for a lost piece, collected by a repartition, the
    /// input of a task waiting to run (again), or an exchange's output a
    /// reducer still reads (a running reducer keeps the rows it was handed,
    /// `TaskRecord::holding`).
    pub(super) fn for_each_unplaced_piece(&mut self, f: &mut impl FnMut(&mut Piece<P>)) {
        for s in &mut self.stages {
            let queued = s.queue.iter_mut().chain(&mut s.blocked);
            queued.flat_map(LineageInput::pieces_mut).for_each(&mut *f);
            s.collected.iter_mut().for_each(&mut *f);
        }
        for exchange in self.exchanges.iter_mut().flatten() {
            exchange.pieces_mut().for_each(&mut *f);
        }
        for record in self.tasks.values_mut().filter(|r| !r.placed) {
            record.input.pieces_mut().iter_mut().for_each(&mut *f);
        }
        if let Some(order) = self.order.as_mut() {
            order.held_mut().for_each(&mut *f);
        }
        self.to_driver.iter_mut().for_each(&mut *f);
    }

    /// Output `origin` is needed and gone: its task is asked to make it
    /// again, run again first when it had finished (its own inputs asked
    /// for in turn). `lost` when it was lost with its node, not freed after
    /// use: only those re-runs count against `max_task_retries` (one loss
    /// may re-run a source task once for each of its readers).
    pub(super) fn demand(&mut self, origin: Origin, lost: bool) {
        if self.ended {
            return;
        }
        if let Some(record) = self.tasks.get_mut(&origin.task) {
            let asked = if !record.placed {
                record.again.insert(origin.seq)
            } else if !record.again.contains(&origin.seq) {
                // This attempt is past it, or not asked to make it.
                record.again_next.insert(origin.seq)
            } else {
                false
            };
            if asked && lost {
                self.recorder.lost_partitions(1);
            }
            return;
        }
        let Some(made) = self.made.as_mut().and_then(|m| m.remove(&origin.task)) else {
            return self.fail(Error::PartitionLost {
                operator: "(unknown)".into(),
                why: format!("task {} that made it is not known", origin.task),
            });
        };
        if lost && made.reruns >= self.failures.max_task_retries.max(1) {
            return self.fail(Error::PartitionLost {
                operator: self.shapes[made.stage].name.clone(),
                why: format!("its task was already run again {} times", made.reruns),
            });
        }
        if let (LineageInput::Reducer(place), Some(exchange)) =
            (&made.input, &mut self.exchanges[made.stage])
        {
            exchange.read_again(*place);
        }
        self.tasks.insert(
            origin.task,
            TaskRecord {
                stage: made.stage,
                node: 0,
                input: made.input,
                attempts: 0,
                delivered: u32::MAX,
                again: BTreeSet::from([origin.seq]),
                again_next: BTreeSet::new(),
                placed: false,
                spilling: false,
                queued: false,
                rerun: true,
                reruns: made.reruns + u32::from(lost),
                holding: Vec::new(),
            },
        );
        self.recorder.rerun(made.stage);
        if lost {
            self.recorder.lost_partitions(1);
        }
        self.requeue(origin.task);
    }

    /// Output `origin` of a task of `stage` was made again: every piece
    /// waiting for it is filled, and what waited on them goes on.
    pub(super) fn remade(&mut self, stage: usize, origin: Origin, whole: P) {
        self.recorder.remade(stage);
        for exchange in self.exchanges.iter_mut().flatten() {
            exchange.fill(origin, &whole);
        }
        for at in 0..self.stages.len() {
            let s = &mut self.stages[at];
            for piece in s.blocked.iter_mut().flat_map(LineageInput::pieces_mut) {
                piece.fill(origin, &whole);
            }
            for piece in &mut s.collected {
                piece.fill(origin, &whole);
            }
            for entry in std::mem::take(&mut s.blocked) {
                let whole = self.missing_input(at, &entry).is_empty();
                let s = &mut self.stages[at];
                match whole {
                    true => s.queue.push_front(entry),
                    false => s.blocked.push(entry),
                }
            }
        }
        for record in self.tasks.values_mut() {
            for piece in record.input.pieces_mut() {
                piece.fill(origin, &whole);
            }
        }
        let order = self.order.as_mut().into_iter().flat_map(|o| o.held_mut());
        for piece in order.chain(self.to_driver.iter_mut()) {
            piece.fill(origin, &whole);
        }
        self.pass_on_due();
        self.sort_waiting_tasks();
        for mut piece in std::mem::take(&mut self.reemit) {
            if !piece.fill(origin, &whole) {
                self.reemit.push(piece);
            } else if self.one_at_a_time() {
                // Lost before the driver read it: it goes first again.
                self.to_driver.push_front(piece);
            } else {
                self.emit(piece);
            }
        }
        self.emit_next();
    }
}

/// Cuts the rows of `pieces` into `n` groups of (nearly) equal rows, in order.
pub(super) fn regroup<P: Part>(pieces: Vec<Piece<P>>, n: usize) -> Vec<Vec<Piece<P>>> {
    let total: usize = pieces.iter().map(|p| p.id.len).sum();
    let mut groups: Vec<Vec<Piece<P>>> = (0..n).map(|_| Vec::new()).collect();
    let (mut group, mut filled) = (0, 0);
    let want = |g: usize| (g + 1) * total / n - g * total / n;
    for piece in pieces {
        let rows = piece.id.len;
        let mut offset = 0;
        while offset < rows {
            while group < n - 1 && filled == want(group) {
                group += 1;
                filled = 0;
            }
            let room = if group == n - 1 {
                usize::MAX
            } else {
                want(group) - filled
            };
            let take = (rows - offset).min(room);
            groups[group].push(piece.sub(offset, take));
            offset += take;
            filled += take;
        }
    }
    groups.retain(|g| !g.is_empty());
    groups
}

/// A fingerprint of where map output `part` was cut and, for a sort's, of
/// its keys' sample; `None` when it is not an exchange's whole map output.
pub(super) fn cut_fingerprint<P: Part>(part: &P) -> Option<u64> {
    Some(fingerprint_cut(part.groups()?, part.sample().map(|s| &**s)))
}

/// A fingerprint of cut `groups` and, for a sort's output, of its keys'
/// `sample` (see [`cut_fingerprint`]).
pub(crate) fn fingerprint_cut(groups: &[u32], sample: Option<&streambatch_plan::KeySample>) -> u64 {
    use streambatch_core::{fnv1a, mix64};
    let cut: Vec<u8> = groups.iter().flat_map(|g| g.to_le_bytes()).collect();
    // A sample's fingerprint, odd, so that no sample differs from one.
    let sample = sample.map_or(0, |s| mix64(s.fingerprint()) | 1);
    mix64(fnv1a(&cut) ^ sample.rotate_left(17))
}
