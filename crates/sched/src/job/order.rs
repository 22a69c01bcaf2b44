//! Outputs handed to the driver in the order of their reducers, for a job
//! whose last stage reduces a sort's exchange: reducer `d` holds the keys
//! of range `d`, so the driver must get every output of reducer 0 (in the
//! order it made them), then reducer 1's, and so on, whichever finishes
//! first. Outputs that come early wait here (still counted as unread).

use std::collections::{BTreeMap, HashMap};

use streambatch_core::TaskId;

use crate::job::piece::{Part, Piece, PieceId};

pub(super) struct EmitOrder<P> {
    /// The stage whose outputs are ordered: the sort's reducers.
    pub(super) stage: usize,
    /// A reducer's input, by its first piece, to its place.
    by_input: HashMap<PieceId, u32>,
    /// A reducer task's place.
    of_task: HashMap<TaskId, u32>,
    /// The next output to hand over: (place, its output number).
    next: (u32, u32),
    held: BTreeMap<(u32, u32), Piece<P>>,
    /// Outputs each finished reducer made, by place.
    made: HashMap<u32, u32>,
}

impl<P: Part> EmitOrder<P> {
    pub(super) fn new(stage: usize) -> Self {
        Self {
            stage,
            by_input: HashMap::new(),
            of_task: HashMap::new(),
            next: (0, 0),
            held: BTreeMap::new(),
            made: HashMap::new(),
        }
    }

    /// The reducers' inputs, in the order their outputs go to the driver.
    pub(super) fn places(&mut self, inputs: &[Vec<Piece<P>>]) {
        for (place, input) in inputs.iter().enumerate() {
            if let Some(first) = input.first() {
                self.by_input.insert(first.id, place as u32);
            }
        }
    }

    /// A task of the ordered stage starts over `input`.
    pub(super) fn started(&mut self, task: TaskId, input: &[Piece<P>]) {
        if let Some(place) = input.first().and_then(|p| self.by_input.remove(&p.id)) {
            self.of_task.insert(task, place);
        }
    }

    /// An output of the ordered stage: the outputs it is now time to hand
    /// over (none while an earlier one is missing). Outputs of tasks with
    /// no place (none should come) pass at once.
    pub(super) fn output(&mut self, piece: Piece<P>) -> Vec<Piece<P>> {
        let from = piece.id.from;
        let Some(&place) = self.of_task.get(&from.task) else {
            return vec![piece];
        };
        self.held.insert((place, from.seq), piece);
        self.due()
    }

    /// Task `task`, which made `outputs`, finished.
    pub(super) fn finished(&mut self, task: TaskId, outputs: u32) -> Vec<Piece<P>> {
        match self.of_task.get(&task) {
            Some(&place) => {
                self.made.insert(place, outputs);
                self.due()
            }
            None => Vec::new(),
        }
    }

    /// Bytes of the outputs waiting here: memory the driver will not free
    /// until an earlier output comes.
    pub(super) fn held_bytes(&self) -> u64 {
        self.held
            .values()
            .filter_map(|p| p.part.as_ref())
            .map(Part::bytes)
            .sum()
    }

    fn due(&mut self) -> Vec<Piece<P>> {
        let mut due = Vec::new();
        loop {
            if let Some(piece) = self.held.remove(&self.next) {
                due.push(piece);
                self.next.1 += 1;
            } else if self.made.get(&self.next.0) == Some(&self.next.1) {
                self.next = (self.next.0 + 1, 0);
            } else {
                return due;
            }
        }
    }
}
