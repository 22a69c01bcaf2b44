//! The driver's end of a job: output partitions as the executor sends
//! them, read (from wherever they are stored) as the driver iterates.

use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use ractor::ActorRef;
use streambatch_plan::{Error, JobStats, JobStream, Result};

use crate::driver::msg::{ExecutorMsg, JobItem};

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

impl Iterator for JobOutput {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        loop {
            return match self.rx.recv() {
                Ok(JobItem::Output { slice, id }) => {
                    let batch = slice.read();
                    if let (Some(id), Some(executor)) = (id, &self.reads) {
                        let read = batch.is_ok();
                        let _ = executor.cast(ExecutorMsg::Read { id, read });
                        if let Err(e) = &batch {
                            tracing::warn!(error = %e, "an output could not be read; it is made again");
                            continue;
                        }
                    }
                    Some(batch)
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

impl JobStream for JobOutput {
    fn live_stats(&self) -> Arc<Mutex<JobStats>> {
        self.live.clone()
    }
}

impl Drop for JobOutput {
    fn drop(&mut self) {
        if let Some(done) = self.on_done.take() {
            done();
        }
    }
}
