//! What a task reports: outputs, pauses, its end, its failure, and what
//! the job does with each (retries included).

use super::exchanged::leave_cut_to_holder;
use super::lineage::cut_fingerprint;
use super::*;

impl<P: Part> JobState<P> {
    /// Task `task` stored its `seq`-th output.
    pub(crate) fn on_output(&mut self, task: TaskId, seq: u32, part: P) {
        let Some(record) = self.tasks.get_mut(&task) else {
            return;
        };
        let origin = Origin { task, seq };
        self.hand_over_due |= self.draining[part.node()];
        if seq < record.delivered {
            if record.again.remove(&seq) {
                let stage = record.stage;
                let cut = self.exchanged.get(&origin);
                if cut.is_some_and(|&cut| cut_fingerprint(&part) != Some(cut)) {
                    return self.end(Err(Error::PartitionLost {
                        operator: self.shapes[stage].name.clone(),
                        why: "its output was made again with other destinations or keys (is an operator not deterministic?)".into(),
                    }));
                }
                let mut part = part;
                if cut.is_some() {
                    leave_cut_to_holder(&mut part);
                }
                self.remade(stage, origin, part);
            }
            return;
        }
        record.delivered = seq.saturating_add(1);
        let (stage, node) = (record.stage, record.node);
        if self.stages[stage].cancelled {
            return;
        }
        let bytes = part.bytes();
        self.recorder
            .event_sized(stage, task, EventKind::PartitionYielded, node, bytes, None);
        let s = &mut self.stages[stage];
        s.outputs += 1;
        s.typical_bytes = if s.typical_bytes == 0 {
            bytes
        } else {
            (s.typical_bytes * 7 + bytes) / 8
        };
        if bytes > s.largest_bytes {
            s.largest_bytes = bytes;
            self.actions.push(Action::FitReserve { stage, bytes });
        }
        self.recorder.output(stage, part.rows(), bytes);
        self.route(stage + 1, Piece::whole(origin, part));
    }

    /// Task `task` paused, holding an output of `pending_bytes`. False when
    /// its stage is no longer needed: the task is dropped.
    pub(crate) fn on_paused(
        &mut self,
        task: TaskId,
        pending_bytes: u64,
        store_full_at: Option<u64>,
    ) -> bool {
        let Some((stage, node)) = self.placed(task) else {
            return false;
        };
        self.release(task);
        let cause = match store_full_at {
            Some(_) => PauseCause::StoreFull,
            None => PauseCause::OutputBudget,
        };
        self.recorder.event_sized(
            stage,
            task,
            EventKind::TaskSuspended,
            node,
            pending_bytes,
            Some(cause),
        );
        let rerun = self.tasks.get(&task).is_some_and(|r| r.rerun);
        let s = &mut self.stages[stage];
        if (s.cancelled && !rerun) || self.ended {
            self.drop_task(task);
            return false;
        }
        s.paused.push(Paused {
            task,
            node,
            pending_bytes,
            store_full_at,
        });
        true
    }

    /// Task `task` finished. Returns its stage, whose counts the caller
    /// records with [`JobState::record_finished`].
    pub(crate) fn on_finished(&mut self, task: TaskId) -> Option<usize> {
        let (stage, node) = self.placed(task)?;
        self.release(task);
        let mut record = self.tasks.remove(&task).expect("placed above");
        self.recorder
            .event(stage, task, EventKind::TaskFinished, node);
        if !record.again.is_empty() && self.stages[stage].cancelled {
            // It stopped early with its stage, before the outputs it was
            // to make again: a re-run makes them.
            self.forget_task(task, record);
            return Some(stage);
        }
        if !record.again.is_empty() {
            let operator = self.shapes[stage].name.clone();
            self.end(Err(Error::PartitionLost {
                operator,
                why:
                    "running its task again made fewer outputs (is an operator not deterministic?)"
                        .into(),
            }));
            return Some(stage);
        }
        let outputs = std::mem::replace(&mut record.delivered, u32::MAX);
        if let Some(order) = self.order.as_mut() {
            let due = order.finished(task, outputs);
            self.pass_on(stage + 1, due);
        }
        if !record.again_next.is_empty() {
            // Asked for while this attempt ran past them: once more.
            record.placed = false;
            self.tasks.insert(task, record);
            self.requeue(task);
        } else {
            self.reducer_done(stage, &record.input);
            if let Some(made) = &mut self.made {
                let input = record.input.forget();
                let reruns = record.reruns;
                made.insert(
                    task,
                    Made {
                        stage,
                        input,
                        reruns,
                    },
                );
            }
        }
        Some(stage)
    }

    /// Records the counts of a finished task's stage, which computed for
    /// `busy`.
    pub(crate) fn record_finished(&mut self, stage: usize, busy: Duration, ops: Vec<OpStats>) {
        let s = &mut self.stages[stage];
        s.finished += 1;
        s.typical_busy = match s.typical_busy.is_zero() {
            true => busy,
            false => (s.typical_busy * 7 + busy) / 8,
        };
        self.recorder.task_finished(stage, busy, ops);
    }

    /// Task `task`'s worker died (`message`): the task is retried, or the
    /// job fails once it has been tried `max_task_retries + 1` times.
    pub(crate) fn on_lost(&mut self, task: TaskId, message: String) {
        let Some(record) = self.tasks.get(&task).filter(|r| r.placed) else {
            return;
        };
        if record.attempts < self.failures.max_task_retries {
            return self.retry(task, message);
        }
        let (stage, attempts) = (record.stage, record.attempts + 1);
        self.release(task);
        let operator = self.shapes[stage].name.clone();
        self.end(Err(Error::Panicked {
            operator,
            attempts,
            message,
        }));
    }

    /// Task `task` failed with `error`, an operator's own (`user_error`) or
    /// a system failure. A system failure is retried up to
    /// `max_task_retries`, and so is an operator's error when
    /// `retry_user_errors`; an operator's error that is not (or no longer)
    /// retried skips the task while `max_errored_partitions` allows, listing
    /// it in the stats. Otherwise the job fails with `error`.
    pub(crate) fn on_errored(&mut self, task: TaskId, error: Error, user_error: bool) {
        let Some(record) = self.tasks.get(&task).filter(|r| r.placed) else {
            return;
        };
        let retried = !user_error || self.failures.retry_user_errors;
        if retried && record.attempts < self.failures.max_task_retries {
            return self.retry(task, error.to_string());
        }
        if user_error && self.skipped < self.failures.max_errored_partitions {
            self.skipped += 1;
            self.release(task);
            let record = self.tasks.remove(&task).expect("looked up above");
            if let Some(order) = self.order.as_mut() {
                // A skipped reducer of a sort made what it made.
                let due = order.finished(task, record.delivered);
                self.pass_on(record.stage + 1, due);
            }
            self.recorder
                .event(record.stage, task, EventKind::TaskSkipped, record.node);
            self.recorder.errored(streambatch_plan::ErroredTask {
                stage: self.shapes[record.stage].name.clone(),
                task,
                input: self.describe_input(record.stage, &record.input),
                message: error.to_string(),
            });
            self.reducer_done(record.stage, &record.input);
            tracing::warn!(%task, %error, "task skipped (max_errored_partitions)");
            return;
        }
        self.end(Err(error));
    }

    /// Lets go of `task`'s slot and queues it again (`message` says why).
    pub(super) fn retry(&mut self, task: TaskId, message: String) {
        let record = self.tasks.get_mut(&task).expect("the caller found it");
        record.attempts += 1;
        let (stage, node, attempts) = (record.stage, record.node, record.attempts);
        self.release(task);
        tracing::warn!(%task, attempts, %message, "task failed; retrying");
        self.recorder.retry(stage);
        self.recorder
            .event(stage, task, EventKind::TaskRetried, node);
        self.requeue(task);
    }

    /// Queues a task that is not placed to run (again): to start once its
    /// input is whole (its lost pieces are asked for), or dropped when its
    /// stage is no longer needed.
    pub(super) fn requeue(&mut self, task: TaskId) {
        if self.ended {
            return; // its input may be gone with the job's exchanges
        }
        self.hand_over_due = true;
        let record = self.tasks.get_mut(&task).expect("the caller found it");
        record.placed = false;
        record.holding.clear();
        let next = std::mem::take(&mut record.again_next);
        record.again.extend(next);
        let stage = record.stage;
        let missing = self.missing_input(stage, &self.tasks[&task].input);
        let lost = !self.tasks[&task].rerun;
        let s = &mut self.stages[stage];
        if s.cancelled && lost {
            // Not a re-run: no more of its outputs are needed.
            self.drop_task(task);
        } else if missing.is_empty() {
            s.retry.push_back(task);
        } else {
            s.blocked_tasks.push(task);
            for origin in missing {
                self.demand(origin, lost);
            }
        }
    }

    /// The job fails with `error`.
    pub(crate) fn fail(&mut self, error: Error) {
        self.end(Err(error));
    }

    /// The driver no longer wants outputs: the job ends without error.
    pub(crate) fn cancel(&mut self) {
        self.end(Ok(()));
    }
}
