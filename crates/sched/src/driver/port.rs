//! A job's port on its driver: where the job's nodes report.

use std::sync::{Arc, OnceLock};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use streambatch_net::frame;

use crate::driver::msg::ExecutorMsg;
use crate::wire::msg::PortMsg;
use crate::wire::{JobKey, NodeEvent};

/// A job's port on its driver: a remote actor, in the process group
/// `JobKey::port_group`, through which nodes report to the executor. It
/// exists before the job starts on the nodes (they look for it then), and
/// the executor after (it dispatches at once): the executor's reference is
/// set once it exists; no event comes before the first task.
pub(crate) struct JobPort;

/// The executor a port forwards to, once it exists.
pub(crate) type ExecutorCell = Arc<OnceLock<ActorRef<ExecutorMsg>>>;

impl Actor for JobPort {
    type Msg = PortMsg;
    type State = ExecutorCell;
    type Arguments = (JobKey, ExecutorCell);

    async fn pre_start(
        &self,
        myself: ActorRef<PortMsg>,
        (key, executor): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        ractor::pg::join(key.port_group(), vec![myself.get_cell()]);
        Ok(executor)
    }

    async fn handle(
        &self,
        myself: ActorRef<PortMsg>,
        PortMsg::Event(bytes): PortMsg,
        executor: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match frame::decode::<NodeEvent>(&bytes) {
            Ok(event) => {
                let Some(executor) = executor.get() else {
                    // The executor sets the cell before its first task goes
                    // out: no event of a started job comes before it.
                    tracing::warn!(node = %event.node, "an event of a job that did not start was dropped");
                    return Ok(());
                };
                if executor.cast(ExecutorMsg::Node(event)).is_err() {
                    myself.stop(None);
                }
            }
            Err(error) => tracing::warn!(%error, "a node event that is not valid was dropped"),
        }
        Ok(())
    }
}
