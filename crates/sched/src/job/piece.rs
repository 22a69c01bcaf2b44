//! Partitions as the job state holds them, with their lineage: each piece
//! of rows knows which output of which task it is ([`Origin`]), and each
//! task's input is kept as those names, so that a partition lost with its
//! node can be made again by re-running the task that made it (and, for
//! its input, the tasks before, down to the source).
//!
//! Pure values: nothing here touches a node, a store or a clock.

use std::collections::BTreeSet;
use std::sync::Arc;

use streambatch_core::TaskId;
use streambatch_plan::KeySample;

/// Rows of a stored partition, as the job state sees them.
pub(crate) trait Part: Clone {
    /// Rows in this part.
    fn rows(&self) -> usize;
    /// Bytes of the whole partition behind it.
    fn bytes(&self) -> u64;
    /// Rows `offset..offset + len` of this part.
    fn sub(&self, offset: usize, len: usize) -> Self;
    /// The node that holds it.
    fn node(&self) -> usize;
    /// Where each destination's rows start (and the end), when this is a
    /// whole output of an exchange's map side whose cut the job keeps: a
    /// sort's always, a hash exchange's until [`Part::forget_cut`].
    fn groups(&self) -> Option<&Arc<[u32]>> {
        None
    }
    /// Its keys' sample, when this is a whole output of a sort's map side
    /// (its groups are then chunks, see `streambatch_plan::key_range`).
    fn sample(&self) -> Option<&Arc<KeySample>> {
        None
    }
    /// Bytes of these rows: their share of the whole partition's.
    fn sliced_bytes(&self) -> u64 {
        self.bytes()
    }
    /// Takes `old`'s groups: this is the same output, moved to another node
    /// (which took its cut along where only its holder kept it).
    fn keep_groups(&mut self, old: &Self) {
        let _ = old;
    }
    /// Leaves where this whole output of a hash exchange was cut to its
    /// holder, which keeps it with the partition: the job keeps only what
    /// the cuts add up to (see `exchanged::CutSums`) and reads a
    /// destination's rows by [`Part::group`].
    fn forget_cut(&mut self) {}
    /// Whether its holder alone knows where it was cut
    /// ([`Part::forget_cut`]): moved to another node, the cut goes along.
    fn cut_at_holder(&self) -> bool {
        false
    }
    /// Destination `d`'s rows of this whole output, which its holder
    /// finds by the cut it keeps ([`Part::forget_cut`]).
    fn group(&self, d: usize) -> Self;
}

/// Which output of which task a partition is: its name across re-runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Origin {
    pub(crate) task: TaskId,
    pub(crate) seq: u32,
}

/// Rows `offset..offset + len` of output `from`: what a piece is, whether
/// or not its partition still exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PieceId {
    pub(crate) from: Origin,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

/// Rows of an output partition the job holds; `part` is `None` while the
/// partition is lost (its node is gone) and being made again.
#[derive(Clone)]
pub(crate) struct Piece<P> {
    pub(crate) id: PieceId,
    pub(crate) part: Option<P>,
}

impl<P: Part> Piece<P> {
    /// The whole of output `from`.
    pub(crate) fn whole(from: Origin, part: P) -> Self {
        let id = PieceId {
            from,
            offset: 0,
            len: part.rows(),
        };
        Self {
            id,
            part: Some(part),
        }
    }

    /// The piece named `id`, lost.
    pub(crate) fn lost(id: PieceId) -> Self {
        Self { id, part: None }
    }

    /// Rows `offset..offset + len` of this piece.
    pub(crate) fn sub(&self, offset: usize, len: usize) -> Self {
        Self {
            id: PieceId {
                from: self.id.from,
                offset: self.id.offset + offset,
                len,
            },
            part: self.part.as_ref().map(|p| p.sub(offset, len)),
        }
    }

    /// Forgets the partition when `node` held it. True when it did.
    pub(crate) fn lose(&mut self, node: usize) -> bool {
        let held = self.part.as_ref().is_some_and(|p| p.node() == node);
        if held {
            self.part = None;
        }
        held
    }

    /// Takes its rows from `whole`, output `from` made again, when this
    /// piece is of it and lost. True when it did.
    pub(crate) fn fill(&mut self, from: Origin, whole: &P) -> bool {
        let filled = self.part.is_none() && self.id.from == from;
        if filled {
            self.part = Some(whole.sub(self.id.offset, self.id.len));
        }
        filled
    }

    /// True when its partition is held somewhere.
    pub(crate) fn held(&self) -> bool {
        self.part.is_some()
    }
}

/// All pieces of a list are held.
pub(crate) fn all_held<P: Part>(pieces: &[Piece<P>]) -> bool {
    pieces.iter().all(Piece::held)
}

/// The lost pieces' origins.
pub(crate) fn missing<P: Part>(pieces: &[Piece<P>]) -> impl Iterator<Item = Origin> + '_ {
    pieces.iter().filter(|p| !p.held()).map(|p| p.id.from)
}

/// What a task reads as the job's lineage keeps it: a source split, pieces
/// of upstream outputs named by their origin, or its place among an
/// exchange's reducers, so that the task can run again after a loss (see
/// [`RunInput`](super::RunInput) for what it is handed). Inputs waiting in
/// a stage's queue are kept the same way.
#[derive(Clone)]
pub(crate) enum LineageInput<P> {
    /// The i-th split of the source.
    Split(usize),
    /// Upstream rows.
    Pieces(Vec<Piece<P>>),
    /// Reducer `place` of the exchange before its stage: its rows of every
    /// map output, which the job keeps once for all reducers (see
    /// [`Exchanged`](super::exchanged::Exchanged)).
    Reducer(u32),
}

impl<P: Part> LineageInput<P> {
    /// The pieces of upstream rows it names (none for a split or a
    /// reducer, whose rows the exchange keeps).
    pub(crate) fn pieces(&self) -> &[Piece<P>] {
        match self {
            Self::Pieces(pieces) => pieces,
            Self::Split(_) | Self::Reducer(_) => &[],
        }
    }

    /// [`LineageInput::pieces`], to mark lost or fill.
    pub(crate) fn pieces_mut(&mut self) -> &mut [Piece<P>] {
        match self {
            Self::Pieces(pieces) => pieces,
            Self::Split(_) | Self::Reducer(_) => &mut [],
        }
    }

    /// The input without its partitions: the lineage kept once the task
    /// is done, which holds no memory of the store.
    pub(crate) fn forget(&self) -> Self {
        match self {
            Self::Split(i) => Self::Split(*i),
            Self::Pieces(pieces) => {
                Self::Pieces(pieces.iter().map(|p| Piece::lost(p.id)).collect())
            }
            Self::Reducer(place) => Self::Reducer(*place),
        }
    }
}

/// Which outputs of a task an attempt stores: those from `from` on (not
/// delivered yet) and the earlier ones in `again` (delivered, then lost).
/// The others it computes (outputs depend on those before them) and drops.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keep {
    /// The first output not delivered yet (`u32::MAX`: all were).
    pub from: u32,
    /// Delivered outputs to make again, ascending.
    pub again: Vec<u32>,
}

impl Keep {
    /// Every output: a first attempt.
    pub fn all() -> Self {
        Self::default()
    }

    /// An attempt that stores outputs from `from` on and those in `again`.
    pub(crate) fn of(from: u32, again: &BTreeSet<u32>) -> Self {
        Self {
            from,
            again: again.iter().copied().filter(|&s| s < from).collect(),
        }
    }

    /// Whether output `seq` is stored.
    pub fn stores(&self, seq: u32) -> bool {
        seq >= self.from || self.again.binary_search(&seq).is_ok()
    }

    /// True when the attempt only makes lost outputs again (its task had
    /// finished): it runs to them even once its stage is cancelled, since
    /// a later stage still needs them.
    pub fn remakes_only(&self) -> bool {
        self.from == u32::MAX
    }

    /// True when no output after `seq` is wanted: the attempt may stop.
    pub fn done_after(&self, seq: u32) -> bool {
        self.from == u32::MAX && self.again.last().is_none_or(|&last| last <= seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct Rows {
        node: usize,
        offset: usize,
        len: usize,
    }

    impl Part for Rows {
        fn rows(&self) -> usize {
            self.len
        }
        fn bytes(&self) -> u64 {
            self.len as u64
        }
        fn sub(&self, offset: usize, len: usize) -> Self {
            Rows {
                node: self.node,
                offset: self.offset + offset,
                len,
            }
        }
        fn node(&self) -> usize {
            self.node
        }
        fn group(&self, _: usize) -> Self {
            unreachable!("no exchange here")
        }
    }

    fn origin(task: u64, seq: u32) -> Origin {
        Origin {
            task: TaskId(task),
            seq,
        }
    }

    #[test]
    fn a_lost_piece_is_filled_with_its_own_rows_of_the_remade_output() {
        let whole = Rows {
            node: 1,
            offset: 0,
            len: 10,
        };
        let mut piece = Piece::whole(origin(3, 0), whole).sub(4, 3);
        assert!(!piece.lose(0), "node 0 does not hold it");
        assert!(piece.lose(1));
        assert!(!piece.fill(
            origin(3, 1),
            &Rows {
                node: 2,
                offset: 0,
                len: 10
            }
        ));
        assert!(piece.fill(
            origin(3, 0),
            &Rows {
                node: 2,
                offset: 0,
                len: 10
            }
        ));
        assert_eq!(
            piece.part,
            Some(Rows {
                node: 2,
                offset: 4,
                len: 3
            })
        );
        assert!(
            !piece.fill(
                origin(3, 0),
                &Rows {
                    node: 0,
                    offset: 0,
                    len: 10
                }
            ),
            "held"
        );
    }

    #[test]
    fn keep_stores_new_outputs_and_the_lost_ones_only() {
        let keep = Keep::of(5, &BTreeSet::from([1, 3, 7]));
        assert_eq!(keep.again, vec![1, 3]);
        let stored: Vec<u32> = (0..8).filter(|&s| keep.stores(s)).collect();
        assert_eq!(stored, vec![1, 3, 5, 6, 7]);
        assert!(!keep.done_after(3), "outputs from 5 on are still wanted");
        let rebuild = Keep::of(u32::MAX, &BTreeSet::from([2, 4]));
        assert!(!rebuild.done_after(3));
        assert!(rebuild.done_after(4));
        assert!(Keep::all().stores(0) && !Keep::all().done_after(100));
    }

    #[test]
    fn forgetting_an_input_keeps_what_it_was() {
        let part = Rows {
            node: 0,
            offset: 0,
            len: 6,
        };
        let input = LineageInput::Pieces(vec![Piece::whole(origin(1, 2), part).sub(2, 4)]);
        let lineage = input.forget();
        let missing = |input: &LineageInput<Rows>| missing(input.pieces()).collect::<Vec<_>>();
        assert_eq!(missing(&lineage), vec![origin(1, 2)]);
        assert_eq!(lineage.pieces()[0].id, input.pieces()[0].id);
        assert!(missing(&input).is_empty());
    }
}
