//! The outputs of a sort's reducers, passed on in range order: reducer `d`
//! holds the keys of range `d`, so the stage after (a limit, or the
//! driver) must get every output of reducer 0 (in the order it made them),
//! then reducer 1's, and so on, whichever finishes first. Outputs that come
//! early wait here: still pieces of the job (lost with their node and made
//! again like any other, see `JobState::for_each_unplaced_piece`), and
//! counted as memory a stuck job cannot wait for (`force_if_stuck`).

use std::collections::BTreeMap;

use super::HashMap;

use streambatch_core::TaskId;

use crate::job::piece::{Part, Piece};

pub(super) struct EmitOrder<P> {
    /// The stage whose outputs are ordered: the sort's reducers.
    pub(super) stage: usize,
    /// A reducer task's place.
    of_task: HashMap<TaskId, u32>,
    /// The next output to pass on: (place, its output number).
    next: (u32, u32),
    held: BTreeMap<(u32, u32), Piece<P>>,
    /// Outputs each finished (or skipped) reducer made, by place.
    made: HashMap<u32, u32>,
}

/// An output of a place already passed on came again (made again after the
/// stage after lost it): the order cannot be kept.
#[derive(Debug)]
pub(super) struct OutOfOrder;

impl<P: Part> EmitOrder<P> {
    pub(super) fn new(stage: usize) -> Self {
        Self {
            stage,
            of_task: HashMap::default(),
            next: (0, 0),
            held: BTreeMap::new(),
            made: HashMap::default(),
        }
    }

    /// Reducer `place` of the ordered stage starts as `task`: its outputs
    /// take its place.
    pub(super) fn started(&mut self, task: TaskId, place: u32) {
        self.of_task.insert(task, place);
    }

    /// An output of the ordered stage: the outputs it is now time to pass
    /// on (none while an earlier one is missing).
    pub(super) fn output(&mut self, piece: Piece<P>) -> Result<Vec<Piece<P>>, OutOfOrder> {
        let from = piece.id.from;
        let Some(&place) = self.of_task.get(&from.task) else {
            return Ok(vec![piece]);
        };
        if (place, from.seq) < self.next {
            return Err(OutOfOrder);
        }
        self.held.insert((place, from.seq), piece);
        Ok(self.due())
    }

    /// Task `task` finished (or was skipped) having made `outputs`; its
    /// first end counts (a re-run makes the same outputs again).
    pub(super) fn finished(&mut self, task: TaskId, outputs: u32) -> Vec<Piece<P>> {
        match self.of_task.get(&task) {
            Some(&place) if outputs != u32::MAX => {
                self.made.entry(place).or_insert(outputs);
                self.due()
            }
            _ => Vec::new(),
        }
    }

    /// The outputs waiting here.
    pub(super) fn held(&self) -> impl Iterator<Item = &Piece<P>> {
        self.held.values()
    }

    /// The outputs waiting here, for lineage to mark lost or fill.
    pub(super) fn held_mut(&mut self) -> impl Iterator<Item = &mut Piece<P>> {
        self.held.values_mut()
    }

    /// Bytes of the outputs waiting here: memory the stage after will not
    /// free until an earlier output comes.
    pub(super) fn held_bytes(&self) -> u64 {
        self.held
            .values()
            .filter_map(|p| p.part.as_ref())
            .map(Part::bytes)
            .sum()
    }

    /// The outputs whose turn has come, in order: up to the first one
    /// missing or lost (waiting to be made again).
    pub(super) fn due(&mut self) -> Vec<Piece<P>> {
        let mut due = Vec::new();
        loop {
            if self.held.get(&self.next).is_some_and(Piece::held) {
                due.push(self.held.remove(&self.next).expect("looked up above"));
                self.next.1 += 1;
            } else if self.made.get(&self.next.0) == Some(&self.next.1) {
                self.next = (self.next.0 + 1, 0);
            } else {
                return due;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::piece::Origin;

    #[derive(Clone, Debug, PartialEq)]
    struct Rows(usize);

    impl Part for Rows {
        fn rows(&self) -> usize {
            self.0
        }
        fn bytes(&self) -> u64 {
            self.0 as u64
        }
        fn sub(&self, _: usize, len: usize) -> Self {
            Rows(len)
        }
        fn node(&self) -> usize {
            0
        }
        fn group(&self, _: usize) -> Self {
            unreachable!("no exchange here")
        }
    }

    fn piece(task: u64, seq: u32) -> Piece<Rows> {
        Piece::whole(
            Origin {
                task: TaskId(task),
                seq,
            },
            Rows(1),
        )
    }

    /// Reducers at places 0, 1, 2 run as tasks 10, 11, 12.
    fn three() -> EmitOrder<Rows> {
        let mut order = EmitOrder::new(1);
        // Started out of place order: each task takes its input's place.
        for place in [2, 0, 1] {
            order.started(TaskId(10 + u64::from(place)), place);
        }
        order
    }

    fn seqs(due: Vec<Piece<Rows>>) -> Vec<(u64, u32)> {
        due.iter()
            .map(|p| (p.id.from.task.0, p.id.from.seq))
            .collect()
    }

    #[test]
    fn outputs_go_on_in_place_order_whoever_finishes_first() {
        let mut order = three();
        assert!(seqs(order.output(piece(12, 0)).unwrap()).is_empty());
        assert!(seqs(order.finished(TaskId(12), 1)).is_empty());
        assert!(seqs(order.output(piece(11, 1)).unwrap()).is_empty());
        assert_eq!(seqs(order.output(piece(10, 0)).unwrap()), [(10, 0)]);
        // Place 0 ends with one output; place 1 waits for its first.
        assert!(seqs(order.finished(TaskId(10), 1)).is_empty());
        assert_eq!(order.held_bytes(), 2);
        assert_eq!(
            seqs(order.output(piece(11, 0)).unwrap()),
            [(11, 0), (11, 1)]
        );
        // A re-run's end (`u32::MAX`) changes nothing; place 1's first does.
        assert!(seqs(order.finished(TaskId(11), u32::MAX)).is_empty());
        assert_eq!(seqs(order.finished(TaskId(11), 2)), [(12, 0)]);
        assert_eq!(order.held_bytes(), 0);
        // An output of a place passed on, made again: out of order.
        assert!(order.output(piece(10, 0)).is_err());
    }

    #[test]
    fn a_reducer_with_no_output_and_a_lost_output_hold_the_rest_back_no_longer_than_needed() {
        let mut order = three();
        assert!(seqs(order.output(piece(11, 0)).unwrap()).is_empty());
        // Place 0 made nothing (a skipped task): place 1 goes on.
        assert_eq!(seqs(order.finished(TaskId(10), 0)), [(11, 0)]);
        order.finished(TaskId(11), 1);
        assert!(seqs(order.output(piece(12, 0)).unwrap()).len() == 1);
        assert!(seqs(order.output(piece(12, 1)).unwrap()).len() == 1);
        // An output lost while it waits is passed on once made again.
        let mut order = three();
        order.output(piece(10, 1)).unwrap();
        order.held_mut().for_each(|p| p.part = None);
        assert!(seqs(order.output(piece(10, 0)).unwrap()) == [(10, 0)]);
        assert!(order.due().is_empty(), "a lost output went on");
        order.held_mut().for_each(|p| p.part = Some(Rows(1)));
        assert_eq!(seqs(order.due()), [(10, 1)]);
    }
}
