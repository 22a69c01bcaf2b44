//! The driver's end of a job: output partitions as the executor sends
//! them, read (from wherever they are stored) as the driver iterates.

use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use streambatch_plan::{Error, JobStats, JobStream, Result};

use crate::msg::JobItem;

/// A job's output stream.
pub(crate) struct JobOutput {
    rx: Receiver<JobItem>,
    live: Arc<Mutex<JobStats>>,
    ended: bool,
    /// Runs once the stream is done with (ended or dropped).
    on_done: Option<Box<dyn FnOnce() + Send>>,
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
        }
    }
}

impl Iterator for JobOutput {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        match self.rx.recv() {
            Ok(JobItem::Output(slice)) => Some(slice.read()),
            Ok(JobItem::End(result)) => {
                self.ended = true;
                result.err().map(Err)
            }
            Err(_) => {
                self.ended = true;
                Some(Err(Error::JobLost))
            }
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
