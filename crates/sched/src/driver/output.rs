//! The driver's end of a job: output partitions as the executor sends
//! them, read (from wherever they are stored) as the driver iterates, or
//! handed on unread ([`JobStream::next_pulled`]).

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use ractor::ActorRef;
use streambatch_plan::{Error, HeldAt, HeldRows, HeldSource, JobStats, JobStream, Pulled, Result};

use crate::driver::msg::{ExecutorMsg, JobItem};
use crate::exec::partitioner::Slice;
use crate::job::PieceId;

/// Outputs with rows found lost.
#[derive(Default)]
struct Owing {
    /// The rows lost of each output, once every piece of it is gone: when
    /// the job sends it again, only those are handed on (the others
    /// reached a consumer).
    rows: HashMap<PieceId, Vec<(usize, usize)>>,
    /// Outputs with rows found lost that have not come again yet, counted
    /// from the first rows found lost (the job hears of them later, once
    /// every piece of the output is gone).
    outputs: usize,
}

type Owed = Arc<Mutex<Owing>>;

fn owing(owed: &Owed) -> std::sync::MutexGuard<'_, Owing> {
    owed.lock().unwrap_or_else(|p| p.into_inner())
}

/// A job's output stream.
pub(crate) struct JobOutput {
    rx: Receiver<JobItem>,
    live: Arc<Mutex<JobStats>>,
    ended: bool,
    /// Runs once the stream is done with (ended or dropped).
    on_done: Option<Box<dyn FnOnce() + Send>>,
    /// Told of each named output whether it could be read.
    reads: Option<ActorRef<ExecutorMsg>>,
    owed: Owed,
    /// Outputs (or rows owed of one) still to hand on.
    pending: VecDeque<Pulled>,
    /// An item received while looking ahead, not yet handled.
    early: Option<JobItem>,
}

impl JobOutput {
    pub(crate) fn new(
        rx: Receiver<JobItem>,
        live: Arc<Mutex<JobStats>>,
        on_done: Option<Box<dyn FnOnce() + Send>>,
    ) -> Self {
        Self {
            rx,
            live,
            ended: false,
            on_done,
            reads: None,
            owed: Owed::default(),
            pending: VecDeque::new(),
            early: None,
        }
    }

    /// Tells `executor` of each output whether it could be read: one held
    /// by a node that is gone is made again and sent anew, not an error.
    pub(crate) fn confirming_reads(mut self, executor: ActorRef<ExecutorMsg>) -> Self {
        self.reads = Some(executor);
        self
    }
}

impl JobOutput {
    /// The next output as `take` makes it of its slice; an output that
    /// could not be taken and will be made again is skipped.
    fn next_with<T>(&mut self, take: impl Fn(Slice) -> Result<T>) -> Option<Result<T>> {
        if self.ended {
            return None;
        }
        loop {
            let item = self.recv();
            return match item {
                Ok(JobItem::Output { slice, id, .. }) => {
                    let taken = take(slice);
                    if let (Some(id), Some(executor)) = (id, &self.reads) {
                        let read = taken.is_ok();
                        let _ = executor.cast(ExecutorMsg::Read { id, read });
                        if let Err(e) = &taken {
                            tracing::warn!(error = %e, "an output could not be read; it is made again");
                            continue;
                        }
                    }
                    Some(taken)
                }
                // Read as they come, every output is confirmed soon.
                Ok(JobItem::Drained) => continue,
                Ok(JobItem::End(result)) => self.end(result),
                Err(_) => self.end(Err(Error::JobLost)),
            };
        }
    }

    /// The next item: the one received looking ahead, else the next sent.
    fn recv(&mut self) -> std::result::Result<JobItem, std::sync::mpsc::RecvError> {
        self.early.take().map_or_else(|| self.rx.recv(), Ok)
    }

    fn end<T>(&mut self, result: Result<()>) -> Option<Result<T>> {
        self.ended = true;
        result.err().map(Err)
    }

    /// `slice`, output `id`, as rows a node holds, read later by whoever
    /// takes them: only the rows owed of it when it was sent before and
    /// found lost. `None` where it is not held by a node.
    fn held(&mut self, slice: &Slice, id: PieceId, executor: &ActorRef<ExecutorMsg>) -> Option<()> {
        let part = slice.remote_part()?;
        let (addr, locality) = part.source.place(&part.holder)?;
        let at = HeldAt {
            node: part.holder.clone(),
            addr,
            host: locality.host,
            store_dir: locality.store_dir,
            partition: part.id,
            partition_rows: part.rows,
            first: slice.offset,
        };
        let source = HeldOutput {
            slice: slice.clone(),
            read: Mutex::default(),
            id,
            executor: executor.clone(),
            lost: Mutex::default(),
            owed: self.owed.clone(),
        };
        let whole = HeldRows::new(at, slice.len, Box::new(source));
        let rows = |(offset, len)| Pulled::Held(whole.slice(offset, len));
        self.hand_on(id, slice.len, Pulled::Held(whole.clone()), rows);
        Some(())
    }

    /// Hands on output `id` of `len` rows: `whole`, or only the rows owed
    /// of it (`rows` cuts them) when it was sent before and found lost.
    fn hand_on(
        &mut self,
        id: PieceId,
        len: usize,
        whole: Pulled,
        rows: impl Fn((usize, usize)) -> Pulled,
    ) {
        let owed = {
            let mut owing = owing(&self.owed);
            let owed = owing.rows.remove(&id);
            if owed.is_some() {
                owing.outputs = owing.outputs.saturating_sub(1);
            }
            owed
        };
        match owed {
            Some(ranges) => (self.pending).extend(
                (ranges.into_iter())
                    .filter(|&(offset, n)| n > 0 && offset + n <= len)
                    .map(rows),
            ),
            None => self.pending.push_back(whole),
        }
    }

    /// Whether an output with rows found lost is still to come again.
    fn owes(&self) -> bool {
        owing(&self.owed).outputs > 0
    }
}

impl Iterator for JobOutput {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_with(|slice| slice.read())
    }
}

impl JobStream for JobOutput {
    fn live_stats(&self) -> Arc<Mutex<JobStats>> {
        self.live.clone()
    }

    /// Each output's rows are known where it is stored: nothing is read.
    fn next_rows(&mut self) -> Option<Result<usize>> {
        self.next_with(|slice| Ok(slice.len))
    }

    fn next_held_ready(&mut self) -> Option<HeldRows> {
        self.held_ready()
    }

    /// Outputs held by cluster nodes are handed on unread (the executor
    /// hears of each once every piece of it was read or dropped); a
    /// sort's, which come one at a time, are read here.
    fn next_pulled(&mut self) -> Option<Result<Pulled>> {
        loop {
            if let Some(pulled) = self.pending.pop_front() {
                return Some(Ok(pulled));
            }
            if self.ended {
                return None;
            }
            let Some(executor) = self.reads.clone() else {
                return self.next().map(|batch| batch.map(Pulled::Batch));
            };
            let item = self.recv();
            match item {
                Ok(JobItem::Output {
                    slice,
                    id: Some(id),
                    in_order: false,
                }) if self.held(&slice, id, &executor).is_some() => continue,
                Ok(JobItem::Output { slice, id, .. }) => {
                    let read = slice.read();
                    if let Some(id) = id {
                        let _ = executor.cast(ExecutorMsg::Read {
                            id,
                            read: read.is_ok(),
                        });
                    }
                    match (read, id) {
                        (Ok(batch), Some(id)) => {
                            let rows = |(offset, len)| Pulled::Batch(batch.slice(offset, len));
                            self.hand_on(id, slice.len, Pulled::Batch(batch.clone()), rows);
                        }
                        (Ok(batch), None) => return Some(Ok(Pulled::Batch(batch))),
                        (Err(e), id) => {
                            tracing::warn!(error = %e, "an output could not be read; it is made again");
                            if let Some(id) = id {
                                // All its rows are owed: a Drained sent
                                // before it comes again is stale.
                                let mut owing = owing(&self.owed);
                                owing.rows.entry(id).or_default().push((0, slice.len));
                                owing.outputs += 1;
                            }
                        }
                    }
                }
                // Sent before a lost output was reported: that one comes
                // again, then the job is drained anew.
                Ok(JobItem::Drained) if self.owes() => {}
                Ok(JobItem::Drained) => return Some(Ok(Pulled::Drained)),
                Ok(JobItem::End(result)) => return self.end(result),
                Err(_) => return self.end(Err(Error::JobLost)),
            }
        }
    }
}

impl JobOutput {
    /// Looks ahead: the next held output if the executor has sent it
    /// already (else, or for anything else, `None`: that waits for
    /// [`JobStream::next_pulled`]).
    fn held_ready(&mut self) -> Option<HeldRows> {
        if self.pending.is_empty() && self.early.is_none() && !self.ended {
            let executor = self.reads.clone()?;
            match self.rx.try_recv().ok()? {
                JobItem::Output {
                    slice,
                    id: Some(id),
                    in_order: false,
                } if self.held(&slice, id, &executor).is_some() => {}
                other => self.early = Some(other),
            }
        }
        match self.pending.pop_front()? {
            Pulled::Held(held) => Some(held),
            other => {
                self.pending.push_front(other);
                None
            }
        }
    }
}

impl Drop for JobOutput {
    fn drop(&mut self) {
        if let Some(done) = self.on_done.take() {
            done();
        }
    }
}

/// An output a node holds, handed on unread: once no piece of it is left,
/// the executor hears whether every row was read (or dropped), or some were
/// lost and must be made again.
struct HeldOutput {
    slice: Slice,
    /// The output once read here (its pieces are read together).
    read: Mutex<Option<RecordBatch>>,
    id: PieceId,
    executor: ActorRef<ExecutorMsg>,
    /// Rows no one could read: (offset, len) in the output.
    lost: Mutex<Vec<(usize, usize)>>,
    owed: Owed,
}

impl HeldSource for HeldOutput {
    /// Reads the whole output once (a node serves whole partitions to
    /// the driver), then its rows from that.
    fn read(&self, offset: usize, len: usize) -> Result<RecordBatch> {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.slice.len)
        {
            return Err(Error::Invalid(format!(
                "rows {offset}+{len} outside an output of {}",
                self.slice.len
            )));
        }
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        let whole = match &*read {
            Some(whole) => whole.clone(),
            None => read.insert(self.slice.read()?).clone(),
        };
        Ok(whole.slice(offset, len))
    }

    fn lost(&self, offset: usize, len: usize) {
        let mut lost = self.lost.lock().unwrap_or_else(|p| p.into_inner());
        if lost.is_empty() {
            // From now on the job's end waits for this output to come again.
            owing(&self.owed).outputs += 1;
        }
        lost.push((offset, len));
    }

    fn any_lost(&self) -> bool {
        !(self.lost.lock().unwrap_or_else(|p| p.into_inner())).is_empty()
    }
}

impl Drop for HeldOutput {
    fn drop(&mut self) {
        let lost = std::mem::take(self.lost.get_mut().unwrap_or_else(|p| p.into_inner()));
        let read = lost.is_empty();
        if !read {
            // Before the executor hears of it, so that the output sent
            // again finds what it owes.
            let mut owing = owing(&self.owed);
            owing.rows.entry(self.id).or_default().extend(lost);
        }
        let _ = self.executor.cast(ExecutorMsg::Read { id: self.id, read });
    }
}
