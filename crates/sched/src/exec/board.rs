//! A node's board: the tasks waiting to run on the node and what each of
//! its workers runs, shared by the node manager and the workers' threads.
//!
//! A worker that finishes a task takes the next one from the board itself,
//! with no message to the manager and back. The job state may hand the
//! embedded node a few short tasks per slot beyond its free slots (see
//! `JobState::queueing`), so the next task is usually there already: a slot
//! stays busy while the executor hears of the last task and decides the
//! next, instead of waiting a round trip between threads per task. The
//! board, not the job state, keeps the node within its resources: a task
//! starts only when its stage's CPUs and GPUs fit beside what runs,
//! whatever the jobs handed it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use streambatch_core::{Resources, TaskId};

use crate::exec::msg::Work;
use crate::exec::task::{TaskEvents, TaskRun};

/// The board of one node.
pub(crate) struct Board {
    state: Mutex<BoardState>,
    /// Signalled when work is posted, resources are freed or the board closes.
    changed: Condvar,
    /// Tasks holding a slot now, for the node's metrics.
    busy: Arc<AtomicUsize>,
}

struct BoardState {
    /// The node's resources.
    capacity: Resources,
    /// What the running tasks hold.
    in_use: Resources,
    /// Tasks any worker may run, oldest first.
    open: VecDeque<Box<TaskRun>>,
    /// Per worker, by index.
    seats: Vec<Seat>,
    /// Tasks the manager holds until a pool's worker is free: it is told
    /// when a worker goes idle.
    held: usize,
    closed: bool,
}

#[derive(Default)]
struct Seat {
    /// Work for this worker alone (a pool's task or set-up).
    directed: Option<Directed>,
    /// What it runs now.
    running: Option<Running>,
    /// It waits for work (or is about to ask for it).
    waiting: bool,
    /// Its thread sleeps on the board's condition variable.
    asleep: bool,
}

struct Directed {
    work: Work,
    resources: Resources,
    task: Option<TaskId>,
    events: TaskEvents,
}

/// What a worker runs: the resources it holds, the task (`None` for a
/// pool's set-up) and where the task's job hears of it.
pub(crate) struct Running {
    resources: Resources,
    /// The task.
    pub(crate) task: Option<TaskId>,
    /// The job's event sink.
    pub(crate) events: TaskEvents,
}

/// No resources (what a pool's set-up holds). Not `Resources::default()`,
/// which is one CPU, a task's default.
pub(crate) const NOTHING: Resources = Resources {
    cpus: 0.0,
    gpus: 0.0,
    memory_bytes: 0,
};

/// The resources one task of `run`'s stage holds while it runs.
fn resources_of(run: &TaskRun) -> Resources {
    run.job.plan.stages[run.stage].options.resources
}

impl BoardState {
    /// Some worker's thread sleeps, to be woken by a change.
    fn anyone_asleep(&self) -> bool {
        self.seats.iter().any(|s| s.asleep)
    }

    /// What the running tasks leave of the node's resources.
    fn free(&self) -> Resources {
        Resources {
            cpus: self.capacity.cpus - self.in_use.cpus,
            gpus: self.capacity.gpus - self.in_use.gpus,
            memory_bytes: 0,
        }
    }

    fn fits(&self, need: &Resources) -> bool {
        need.fits_in(&self.free())
    }

    fn hold(&mut self, need: Resources) {
        self.in_use.cpus += need.cpus;
        self.in_use.gpus += need.gpus;
    }

    fn give_back(&mut self, held: Resources) {
        self.in_use.cpus -= held.cpus;
        self.in_use.gpus -= held.gpus;
    }

    /// Open tasks that could start now, each beside the ones before it.
    fn startable(&self) -> usize {
        let mut free = self.free();
        let mut n = 0;
        for run in &self.open {
            let need = resources_of(run);
            if need.fits_in(&free) {
                free.cpus -= need.cpus;
                free.gpus -= need.gpus;
                n += 1;
            }
        }
        n
    }

    /// The work `worker` may start now, if any.
    fn take(&mut self, worker: usize) -> Option<Work> {
        if let Some(directed) = &self.seats[worker].directed {
            // Its own work first; it waits for room rather than let open
            // tasks take it.
            if !self.fits(&directed.resources) {
                return None;
            }
            let d = self.seats[worker].directed.take().expect("seen above");
            self.hold(d.resources);
            self.seats[worker].running = Some(Running {
                resources: d.resources,
                task: d.task,
                events: d.events,
            });
            return Some(d.work);
        }
        // The stage nearest the sink first, as the job state's policy
        // prefers (running it drains memory); the oldest of it first.
        let at = self
            .open
            .iter()
            .enumerate()
            .filter(|(_, run)| self.fits(&resources_of(run)))
            .max_by_key(|(at, run)| (run.stage, std::cmp::Reverse(*at)))
            .map(|(at, _)| at)?;
        let run = self.open.remove(at).expect("found above");
        let resources = resources_of(&run);
        self.hold(resources);
        self.seats[worker].running = Some(Running {
            resources,
            task: Some(run.task),
            events: run.job.events.clone(),
        });
        Some(Work::Task(run))
    }
}

impl Board {
    /// A board for a node of `capacity`, counting the tasks that hold a
    /// slot in `busy`.
    pub(crate) fn new(capacity: Resources, busy: Arc<AtomicUsize>) -> Self {
        Self {
            state: Mutex::new(BoardState {
                capacity,
                in_use: NOTHING,
                open: VecDeque::new(),
                seats: Vec::new(),
                held: 0,
                closed: false,
            }),
            changed: Condvar::new(),
            busy,
        }
    }

    /// A task `started`, or let its slot go.
    fn count_busy(&self, running: &Running, started: bool) {
        if running.task.is_some() {
            match started {
                true => self.busy.fetch_add(1, Ordering::Relaxed),
                false => self.busy.fetch_sub(1, Ordering::Relaxed),
            };
        }
    }

    fn state(&self) -> MutexGuard<'_, BoardState> {
        // Every update is a few field writes that cannot panic halfway.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A seat for a new worker; its index.
    pub(crate) fn add_worker(&self) -> usize {
        let mut state = self.state();
        state.seats.push(Seat::default());
        state.seats.len() - 1
    }

    /// Posts a task any worker may run. True when a worker must be added:
    /// more tasks could start now than workers wait.
    pub(crate) fn post(&self, run: Box<TaskRun>) -> bool {
        let mut state = self.state();
        state.open.push_back(run);
        let waiting = state
            .seats
            .iter()
            .filter(|s| s.waiting && s.directed.is_none())
            .count();
        let more = state.startable() > waiting;
        let wake = state.anyone_asleep();
        // Any worker takes an open task, unless it waits for room for work
        // of its own: then only waking all is sure to reach one that takes it.
        let one = state.seats.iter().all(|s| s.directed.is_none());
        drop(state);
        match (wake, one) {
            (false, _) => {}
            (true, true) => self.changed.notify_one(),
            (true, false) => self.changed.notify_all(),
        }
        more
    }

    /// Hands `worker` work of its own (a pool's task or set-up), which it
    /// starts once `resources` fit.
    pub(crate) fn direct(
        &self,
        worker: usize,
        work: Work,
        resources: Resources,
        task: Option<TaskId>,
        events: TaskEvents,
    ) {
        let mut state = self.state();
        let seat = &mut state.seats[worker];
        debug_assert!(
            seat.directed.is_none(),
            "a worker is handed one thing at a time"
        );
        seat.directed = Some(Directed {
            work,
            resources,
            task,
            events,
        });
        drop(state);
        self.changed.notify_all();
    }

    /// `worker` waits for work and has none handed to it.
    pub(crate) fn is_idle(&self, worker: usize) -> bool {
        let state = self.state();
        let seat = &state.seats[worker];
        seat.waiting && seat.directed.is_none()
    }

    /// `worker` sets up a pool (runs or was handed a set-up).
    pub(crate) fn sets_up(&self, worker: usize) -> bool {
        let state = self.state();
        let seat = &state.seats[worker];
        let running = seat.running.as_ref().is_some_and(|r| r.task.is_none());
        let handed = seat.directed.as_ref().is_some_and(|d| d.task.is_none());
        running || handed
    }

    /// How many tasks the manager holds for a pool's worker.
    pub(crate) fn set_held(&self, held: usize) {
        self.state().held = held;
    }

    /// The next work of `worker`'s thread: blocks until there is some that
    /// fits; `None` once the board is closed.
    pub(crate) fn next(&self, worker: usize) -> Option<Work> {
        let mut state = self.state();
        loop {
            if state.closed {
                return None;
            }
            if let Some(work) = state.take(worker) {
                state.seats[worker].waiting = false;
                if let Some(running) = &state.seats[worker].running {
                    self.count_busy(running, true);
                }
                return Some(work);
            }
            state.seats[worker].waiting = true;
            state.seats[worker].asleep = true;
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
            state.seats[worker].asleep = false;
        }
    }

    /// `worker` is done with its work: what it held is free, and it counts
    /// as waiting from here (the manager may hand it work at once). True
    /// when the manager holds tasks for a pool's worker: it must be told.
    /// (The manager counts what it holds before it looks for a worker, and
    /// both sides do so under the lock, so one of them sees the other.)
    pub(crate) fn done(&self, worker: usize) -> bool {
        let mut state = self.state();
        if let Some(running) = state.seats[worker].running.take() {
            state.give_back(running.resources);
            self.count_busy(&running, false);
        }
        state.seats[worker].waiting = true;
        let work_waits = !state.open.is_empty() || state.seats.iter().any(|s| s.directed.is_some());
        let wake = work_waits && state.anyone_asleep();
        let held = state.held > 0;
        drop(state);
        if wake {
            self.changed.notify_all();
        }
        held
    }

    /// `worker`'s thread died: what it ran (its resources are free again),
    /// and the task it was handed and had not started.
    pub(crate) fn lost(&self, worker: usize) -> (Option<Running>, Option<Box<TaskRun>>) {
        let mut state = self.state();
        let seat = std::mem::take(&mut state.seats[worker]);
        if let Some(running) = &seat.running {
            state.give_back(running.resources);
            self.count_busy(running, false);
        }
        drop(state);
        self.changed.notify_all();
        let handed = match seat.directed.map(|d| d.work) {
            Some(Work::Task(run)) => Some(run),
            _ => None,
        };
        (seat.running, handed)
    }

    /// No more work: every worker's thread ends.
    pub(crate) fn close(&self) {
        self.state().closed = true;
        self.changed.notify_all();
    }
}
