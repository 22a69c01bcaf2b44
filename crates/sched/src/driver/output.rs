//! The driver's end of a job: output partitions as the executor sends
//! them, read (from wherever they are stored) as the driver iterates.

use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use ractor::ActorRef;
use streambatch_plan::{Error, JobStats, JobStream, Result};

use crate::driver::msg::{ExecutorMsg, JobItem};
use crate::exec::partition::Slice;

/// A job's output stream.
pub(crate) struct JobOutput {
    rx: Receiver<JobItem>,
    live: Arc<Mutex<JobStats>>,
    ended: bool,
    /// Runs once the stream is done with (ended or dropped).
    on_done: Option<Box<dyn FnOnce() + Send>>,
    /// Told of each named output whether it could be read.
    reads: Option<ActorRef<ExecutorMsg>>,
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
            return match self.rx.recv() {
                Ok(JobItem::Output { slice, id }) => {
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
                Ok(JobItem::End(result)) => {
                    self.ended = true;
                    result.err().map(Err)
                }
                Err(_) => {
                    self.ended = true;
                    Some(Err(Error::JobLost))
                }
            };
        }
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
}

impl Drop for JobOutput {
    fn drop(&mut self) {
        if let Some(done) = self.on_done.take() {
            done();
        }
    }
}
