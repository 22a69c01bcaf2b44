//! The scheduling policy: a pure function of a snapshot of the job, tested
//! without actors, threads or clocks. The executor feeds it state and carries
//! out its decision, then asks again until it says nothing can run.
//!
//! The rule (docs/architecture.md, "Placement"): among stages whose task
//! fits the free resources, whose worker pool has room and whose outputs are
//! under budget, prefer the stage nearest the sink, since running it drains
//! memory; a paused task of a stage resumes before a new one starts, since
//! its output is already computed, and no new one starts while one is
//! paused (its output would most likely wait outside the store as well).
//! Where every slot is taken, a node may also be handed a few tasks to
//! queue for its next free slot (its workers take them without a round
//! trip to the executor), but only of a stage with short tasks, none of
//! them paused on the node, whose outputs in flight, a full queue's
//! included, fit its budget.

use streambatch_core::Resources;

/// What the policy sees of one stage.
#[derive(Clone, Debug, PartialEq)]
pub struct StageView {
    /// Inputs waiting for a task (queued partitions, or unread source splits).
    pub waiting_inputs: usize,
    /// Output bytes each paused task of this stage holds, oldest first.
    pub paused: Vec<u64>,
    /// Tasks running now.
    pub running: usize,
    /// What one task holds.
    pub resources: Resources,
    /// The most tasks at once (a stateful operator's pool size).
    pub max_running: Option<usize>,
    /// Whether a new output of `bytes` (the stage's typical partition) fits
    /// its memory budget now.
    pub budget_fits_typical: bool,
    /// Whether each paused task's output fits the budget now (same order as
    /// `paused`).
    pub paused_fits: Vec<bool>,
    /// Whether the node may be handed one more task of this stage to queue:
    /// its tasks are short (the round trip to the executor that queueing
    /// saves is a noticeable part of each), and the outputs of all its tasks
    /// in flight and of a full queue fit its budget now.
    pub queue_fits: bool,
}

/// A snapshot of the job.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// Stages from source to sink.
    pub stages: Vec<StageView>,
    /// Resources free on the node.
    pub free: Resources,
    /// All the node's resources: a task queued there must fit them.
    pub slots: Resources,
    /// Tasks the node may still be handed beyond its free slots, to run
    /// when one frees (0 where it queues none).
    pub queue_room: usize,
}

/// What to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Resume the `index`-th paused task of `stage`.
    Resume {
        /// The stage.
        stage: usize,
        /// Which paused task.
        index: usize,
    },
    /// Start a new task of `stage`.
    Dispatch {
        /// The stage.
        stage: usize,
    },
    /// Hand the node a new task of `stage` to start in its next free slot.
    Queue {
        /// The stage.
        stage: usize,
    },
}

/// The next task to run, or `None` when nothing can run now.
pub fn next_decision(snapshot: &Snapshot) -> Option<Decision> {
    for (stage, view) in snapshot.stages.iter().enumerate().rev() {
        if !view.resources.fits_in(&snapshot.free)
            || view.max_running.is_some_and(|m| view.running >= m)
        {
            continue;
        }
        if let Some(index) = view.paused_fits.iter().position(|fits| *fits) {
            return Some(Decision::Resume { stage, index });
        }
        // Not while a task of the stage is paused here: its output waits
        // for memory, and a new task's would most likely wait as well, on
        // the heap outside the store and its budgets (a stage's outputs
        // piled up there without end). A paused output that never fits is
        // let spill once nothing runs (`force_if_stuck`).
        if view.waiting_inputs > 0 && view.budget_fits_typical && view.paused.is_empty() {
            return Some(Decision::Dispatch { stage });
        }
    }
    if snapshot.queue_room == 0 {
        return None;
    }
    let queues = |v: &StageView| {
        v.waiting_inputs > 0
            && v.queue_fits
            && v.paused.is_empty()
            && v.max_running.is_none()
            && v.resources.fits_in(&snapshot.slots)
    };
    let stage = snapshot.stages.iter().rposition(queues)?;
    Some(Decision::Queue { stage })
}

/// When nothing runs and nothing may start, the job is stuck on memory
/// (for example a repartition holding more than the store): the task to run
/// anyway, letting it spill. A paused task nearest the sink first, else a new
/// task of the stage nearest the sink, budgets ignored.
pub fn forced_decision(snapshot: &Snapshot) -> Option<Decision> {
    let fits = |v: &StageView| {
        v.resources.fits_in(&snapshot.free) && v.max_running.is_none_or(|m| v.running < m)
    };
    let stages = || {
        snapshot
            .stages
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, v)| fits(v))
    };
    if let Some((stage, _)) = stages().find(|(_, v)| !v.paused.is_empty()) {
        return Some(Decision::Resume { stage, index: 0 });
    }
    stages()
        .find(|(_, v)| v.waiting_inputs > 0)
        .map(|(stage, _)| Decision::Dispatch { stage })
}

/// Why `decision` was taken on `snapshot`, for the debug log: what it does,
/// and why each stage nearer the sink was passed over.
pub fn reason(snapshot: &Snapshot, decision: Decision) -> String {
    let (stage, why) = match decision {
        Decision::Resume { stage, .. } => (stage, "its paused output fits memory now"),
        Decision::Dispatch { stage } => (
            stage,
            "an input waits, a slot fits and its output fits its budget",
        ),
        Decision::Queue { stage } => (
            stage,
            "an input waits, every slot is taken and a full queue's outputs fit its budget",
        ),
    };
    let passed: Vec<String> = snapshot
        .stages
        .iter()
        .enumerate()
        .skip(stage + 1)
        .filter_map(|(i, v)| passed_over(v, &snapshot.free).map(|r| format!("stage {i} {r}")))
        .collect();
    if passed.is_empty() {
        why.to_string()
    } else {
        format!("{why}; nearer the sink, {}", passed.join(", "))
    }
}

/// Why the policy runs nothing of a stage now; `None` when it has nothing
/// to run.
fn passed_over(view: &StageView, free: &Resources) -> Option<&'static str> {
    if view.waiting_inputs == 0 && view.paused.is_empty() {
        None
    } else if !view.resources.fits_in(free) {
        Some("has no free slot")
    } else if view.max_running.is_some_and(|m| view.running >= m) {
        Some("has its pool full")
    } else {
        Some("is over its memory budget")
    }
}

/// Applies a decision to a snapshot, as the executor will to its state, so
/// that the next call sees its effect.
pub fn apply(snapshot: &mut Snapshot, decision: Decision) {
    let stage = match decision {
        Decision::Resume { stage, index } => {
            let view = &mut snapshot.stages[stage];
            view.paused.remove(index);
            view.paused_fits.remove(index);
            stage
        }
        Decision::Dispatch { stage } => {
            snapshot.stages[stage].waiting_inputs -= 1;
            stage
        }
        Decision::Queue { stage } => {
            let view = &mut snapshot.stages[stage];
            view.waiting_inputs -= 1;
            view.running += 1;
            snapshot.queue_room -= 1;
            return;
        }
    };
    let view = &mut snapshot.stages[stage];
    view.running += 1;
    snapshot.free.cpus -= view.resources.cpus;
    snapshot.free.gpus -= view.resources.gpus;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(waiting: usize, resources: Resources) -> StageView {
        StageView {
            waiting_inputs: waiting,
            paused: vec![],
            running: 0,
            resources,
            max_running: None,
            budget_fits_typical: true,
            paused_fits: vec![],
            queue_fits: true,
        }
    }

    fn drain(mut s: Snapshot) -> Vec<Decision> {
        let mut out = Vec::new();
        while let Some(d) = next_decision(&s) {
            apply(&mut s, d);
            out.push(d);
        }
        out
    }

    #[test]
    fn a_reason_names_the_stages_nearer_the_sink_it_passed_over() {
        let mut full = stage(3, Resources::cpu(1.0));
        full.budget_fits_typical = false;
        let s = Snapshot {
            stages: vec![
                stage(5, Resources::cpu(1.0)),
                stage(0, Resources::cpu(1.0)),
                full,
                stage(2, Resources::gpu(1.0)),
            ],
            free: Resources::cpu(2.0),
            slots: Resources::cpu(2.0),
            queue_room: 0,
        };
        let decision = next_decision(&s).unwrap();
        assert_eq!(decision, Decision::Dispatch { stage: 0 });
        assert_eq!(
            reason(&s, decision),
            "an input waits, a slot fits and its output fits its budget; nearer the sink, \
             stage 2 is over its memory budget, stage 3 has no free slot"
        );
    }

    #[test]
    fn prefers_the_stage_nearest_the_sink() {
        let s = Snapshot {
            stages: vec![stage(5, Resources::cpu(1.0)), stage(5, Resources::cpu(1.0))],
            free: Resources::cpu(2.0),
            slots: Resources::cpu(2.0),
            queue_room: 0,
        };
        assert_eq!(
            drain(s),
            vec![
                Decision::Dispatch { stage: 1 },
                Decision::Dispatch { stage: 1 }
            ]
        );
    }

    #[test]
    fn never_exceeds_gpu_slots() {
        let mut s = Snapshot {
            stages: vec![
                stage(0, Resources::cpu(1.0)),
                stage(10, Resources::gpu(1.0)),
            ],
            free: Resources {
                cpus: 8.0,
                gpus: 2.0,
                memory_bytes: 0,
            },
            slots: Resources {
                cpus: 8.0,
                gpus: 2.0,
                memory_bytes: 0,
            },
            queue_room: 0,
        };
        s.stages[1].running = 0;
        assert_eq!(drain(s).len(), 2);
    }

    #[test]
    fn pool_size_caps_running_tasks() {
        let mut st = stage(10, Resources::cpu(1.0));
        st.max_running = Some(3);
        let s = Snapshot {
            stages: vec![st],
            free: Resources::cpu(8.0),
            slots: Resources::cpu(8.0),
            queue_room: 0,
        };
        assert_eq!(drain(s).len(), 3);
    }

    #[test]
    fn over_budget_stage_waits_but_downstream_runs() {
        let mut up = stage(10, Resources::cpu(1.0));
        up.budget_fits_typical = false;
        let s = Snapshot {
            stages: vec![up, stage(1, Resources::cpu(1.0))],
            free: Resources::cpu(4.0),
            slots: Resources::cpu(4.0),
            queue_room: 0,
        };
        assert_eq!(drain(s), vec![Decision::Dispatch { stage: 1 }]);
    }

    #[test]
    fn paused_task_resumes_first_when_its_output_fits() {
        let mut st = stage(3, Resources::cpu(1.0));
        st.paused = vec![10, 20];
        st.paused_fits = vec![false, true];
        let s = Snapshot {
            stages: vec![st],
            free: Resources::cpu(1.0),
            slots: Resources::cpu(1.0),
            queue_room: 0,
        };
        assert_eq!(drain(s), vec![Decision::Resume { stage: 0, index: 1 }]);
    }

    #[test]
    fn no_new_task_starts_while_one_of_its_stage_waits_for_memory() {
        let mut st = stage(3, Resources::cpu(1.0));
        st.paused = vec![10];
        st.paused_fits = vec![false];
        let mut downstream = stage(1, Resources::cpu(1.0));
        downstream.budget_fits_typical = true;
        let s = Snapshot {
            stages: vec![st, downstream],
            free: Resources::cpu(2.0),
            slots: Resources::cpu(2.0),
            queue_room: 0,
        };
        // Free slots and inputs, the budget fits a typical output: only
        // the stage with nothing paused runs.
        assert_eq!(drain(s), vec![Decision::Dispatch { stage: 1 }]);
    }

    #[test]
    fn a_stuck_job_forces_the_paused_task_nearest_the_sink() {
        let mut up = stage(4, Resources::cpu(1.0));
        up.budget_fits_typical = false;
        up.paused = vec![10];
        up.paused_fits = vec![false];
        let mut mid = stage(0, Resources::cpu(1.0));
        mid.paused = vec![10, 10];
        mid.paused_fits = vec![false, false];
        let s = Snapshot {
            stages: vec![up, mid, stage(0, Resources::cpu(1.0))],
            free: Resources::cpu(2.0),
            slots: Resources::cpu(2.0),
            queue_room: 0,
        };
        assert_eq!(next_decision(&s), None);
        assert_eq!(
            forced_decision(&s),
            Some(Decision::Resume { stage: 1, index: 0 })
        );
        let mut only_waiting = s.clone();
        only_waiting.stages[0].paused.clear();
        only_waiting.stages[1].paused.clear();
        assert_eq!(
            forced_decision(&only_waiting),
            Some(Decision::Dispatch { stage: 0 })
        );
    }

    #[test]
    fn a_full_node_queues_up_to_its_room_once_the_slots_are_taken() {
        let s = Snapshot {
            stages: vec![
                stage(10, Resources::cpu(1.0)),
                stage(10, Resources::cpu(1.0)),
            ],
            free: Resources::cpu(2.0),
            slots: Resources::cpu(2.0),
            queue_room: 3,
        };
        let stage1 = |d| d == Decision::Dispatch { stage: 1 } || d == Decision::Queue { stage: 1 };
        let decisions = drain(s);
        assert_eq!(decisions.len(), 5);
        assert!(decisions.iter().all(|d| stage1(*d)));
        assert_eq!(decisions[1], Decision::Dispatch { stage: 1 });
        assert_eq!(decisions[2], Decision::Queue { stage: 1 });
    }

    #[test]
    fn queues_only_what_fits_the_node_its_budget_and_no_pool() {
        let full = Resources::cpu(0.0);
        let slots = Resources::cpu(2.0);
        let one = |view: StageView| Snapshot {
            stages: vec![view],
            free: full,
            slots,
            queue_room: 4,
        };
        let queued = |view: StageView| next_decision(&one(view));
        assert_eq!(
            queued(stage(3, Resources::cpu(1.0))),
            Some(Decision::Queue { stage: 0 })
        );
        assert_eq!(queued(stage(3, Resources::gpu(1.0))), None);
        let mut over = stage(3, Resources::cpu(1.0));
        over.queue_fits = false;
        assert_eq!(queued(over), None);
        let mut pooled = stage(3, Resources::cpu(1.0));
        pooled.max_running = Some(8);
        assert_eq!(queued(pooled), None);
        let mut paused = stage(3, Resources::cpu(1.0));
        paused.paused = vec![10];
        paused.paused_fits = vec![false];
        assert_eq!(queued(paused), None);
        let mut none_room = one(stage(3, Resources::cpu(1.0)));
        none_room.queue_room = 0;
        assert_eq!(next_decision(&none_room), None);
    }

    proptest::proptest! {
        #[test]
        fn decisions_never_oversubscribe(
            stages in proptest::collection::vec((0usize..20, 0u8..3, proptest::option::of(1usize..4)), 1..5),
            cpus in 0u8..9, gpus in 0u8..3, room in 0usize..4,
        ) {
            let views: Vec<StageView> = stages.iter().map(|(w, kind, max)| {
                let r = match kind { 0 => Resources::cpu(1.0), 1 => Resources::cpu(0.5), _ => Resources::gpu(1.0) };
                StageView { max_running: *max, ..stage(*w, r) }
            }).collect();
            let slots = Resources { cpus: cpus as f64, gpus: gpus as f64, memory_bytes: 0 };
            let mut s = Snapshot { stages: views, free: slots, slots, queue_room: room };
            while let Some(d) = next_decision(&s) {
                if let Decision::Queue { stage } = d {
                    proptest::prop_assert!(s.stages[stage].resources.fits_in(&slots));
                    proptest::prop_assert!(s.stages[stage].max_running.is_none());
                }
                apply(&mut s, d);
                proptest::prop_assert!(s.free.cpus >= -1e-9 && s.free.gpus >= -1e-9);
                for v in &s.stages {
                    proptest::prop_assert!(v.max_running.is_none_or(|m| v.running <= m));
                }
                let running: usize = s.stages.iter().map(|v| v.running).sum();
                proptest::prop_assert!(running <= cpus as usize * 2 + gpus as usize + room);
            }
        }
    }
}
