//! An exchange's map outputs as the job keeps them for its reducers: once,
//! in their order of origin. A reducer's input is its place among the
//! reducers, not a list of slices, and a hash exchange's outputs are kept
//! without their cuts (each holder keeps its own, and finds a
//! destination's rows by it), so that the job's records grow with M + N,
//! not M x N: what the cuts add up to per destination is summed as the
//! outputs arrive ([`CutSums`]), a reducer reads its destination of every
//! output ([`Exchanged::parts`]), and an output lost with its node is
//! marked lost once, not in every reducer's input. A sort's outputs keep
//! their chunk starts (at most `key_range`'s chunks, whatever N is), by
//! which its reducers' rows are found here.

use std::sync::Arc;

use streambatch_plan::key_range::{SampledOutput, ranges, rows_within};
use streambatch_plan::{KeyRange, KeySample};

use crate::job::piece::{Origin, Part, Piece};

/// What a hash exchange's cuts add up to, per destination, as its map
/// outputs arrive: the job keeps these N sums, not the M cuts.
pub(crate) struct CutSums {
    /// Rows of each destination.
    rows: Vec<u64>,
    /// Bytes of each destination: its rows' share of each output's bytes.
    bytes: Vec<u64>,
    /// Outputs folded in.
    folded: usize,
    /// Why an output could not be folded in (the first such).
    refused: Option<String>,
}

impl CutSums {
    /// Sums for `n` destinations.
    pub(crate) fn new(n: usize) -> Self {
        Self {
            rows: vec![0; n],
            bytes: vec![0; n],
            folded: 0,
            refused: None,
        }
    }

    /// Adds where map output `part` (whole) was cut and leaves the cut to
    /// its holder ([`Part::forget_cut`]). A sort's output keeps its cut
    /// and is not summed.
    pub(crate) fn fold<P: Part>(&mut self, part: &mut P) {
        if part.sample().is_some() {
            return;
        }
        let (n, rows) = (self.rows.len(), part.rows());
        let cut = match fits(part.groups(), n, rows) {
            Ok(cut) => cut.clone(),
            Err(why) => {
                self.refused.get_or_insert(why);
                return;
            }
        };
        let whole = u128::from(part.bytes());
        for (d, w) in cut.windows(2).enumerate() {
            let len = u64::from(w[1] - w[0]);
            self.rows[d] += len;
            self.bytes[d] += (whole * u128::from(len) / rows.max(1) as u128) as u64;
        }
        self.folded += 1;
        leave_cut_to_holder(part);
    }
}

/// Leaves where a hash exchange's map output `part` was cut to its holder
/// ([`Part::forget_cut`]); a sort's output keeps its chunks.
pub(crate) fn leave_cut_to_holder<P: Part>(part: &mut P) {
    if part.sample().is_none() {
        part.forget_cut();
    }
}

/// A map output of the exchange.
struct MapOutput<P> {
    /// The whole output. Its part is `None` while it is lost with its node,
    /// and once no reducer still to finish reads it (freed).
    piece: Piece<P>,
    /// A sort's output: where each chunk's rows start, and the end; kept
    /// while the part is lost, since its reducers' rows are found by it.
    chunks: Option<Arc<[u32]>>,
    /// A sort's output: its keys' sample.
    sample: Option<Arc<KeySample>>,
    /// Reducers still to finish that read rows of it.
    readers: u32,
}

/// A reducer of the exchange.
struct Share {
    /// The destination it reduces (a hash or random cut's).
    destination: usize,
    /// A sort's reducer: the keys it keeps.
    range: Option<Arc<KeyRange>>,
    /// Its rows, and their bytes (their share of each output's bytes).
    rows: u64,
    bytes: u64,
    /// Counted in the readers of the outputs it reads, until it finishes.
    reading: bool,
}

/// Which rows of an output a reducer reads.
#[derive(Clone, Copy)]
enum Read {
    /// Rows `start..start + len` (a sort's reducer).
    Rows(usize, usize),
    /// Its destination, which the output's holder finds (a hash one's).
    Group(usize),
}

/// An exchange's map outputs and its reducers, those with rows only, by
/// place: a sort's in the order of their ranges.
pub(crate) struct Exchanged<P> {
    outputs: Vec<MapOutput<P>>,
    reducers: Vec<Share>,
}

impl<P: Part> Exchanged<P> {
    /// The exchange of map outputs `collected` (each whole and held) to
    /// its reducers: a hash exchange's (its cuts summed in `sums`) one per
    /// destination with rows; a sort's (its outputs still cut into
    /// chunks) by ranges of the keys its outputs' samples give (see
    /// `streambatch_plan::key_range`).
    pub(crate) fn new(mut collected: Vec<Piece<P>>, sums: CutSums) -> Result<Self, String> {
        if let Some(why) = sums.refused {
            return Err(why);
        }
        collected.sort_by_key(|p| p.id.from);
        let sorted = sums.folded < collected.len();
        let mut outputs = Vec::with_capacity(collected.len());
        for piece in collected {
            let part = piece.part.as_ref().ok_or("a map output is not held")?;
            let rows = piece.id.len;
            let (chunks, sample) = match (part.groups(), part.sample()) {
                (_, None) if sorted => {
                    return Err(format!(
                        "a map output of {rows} rows of a sort has no sample of its keys"
                    ));
                }
                (None, Some(_)) => {
                    return Err(format!(
                        "a map output of {rows} rows of a sort is not cut into chunks"
                    ));
                }
                (chunks, sample) => (chunks.cloned(), sample.cloned()),
            };
            outputs.push(MapOutput {
                piece,
                chunks,
                sample,
                readers: 0,
            });
        }
        let mut exchanged = Self {
            outputs,
            reducers: Vec::new(),
        };
        exchanged.reducers = match sorted {
            true => exchanged.sort_reducers(sums.rows.len())?,
            false => (0..sums.rows.len())
                .filter(|&d| sums.rows[d] > 0)
                .map(|destination| Share {
                    destination,
                    range: None,
                    rows: sums.rows[destination],
                    bytes: sums.bytes[destination],
                    reading: true,
                })
                .collect(),
        };
        for place in 0..exchanged.reducers.len() {
            let reads: Vec<(usize, Read)> = exchanged.reads(place).collect();
            let (mut rows, mut bytes) = (0, 0);
            for (i, read) in reads {
                let output = &mut exchanged.outputs[i];
                output.readers += 1;
                if let Read::Rows(start, len) = read {
                    let part = output.piece.part.as_ref().expect("checked above");
                    rows += len as u64;
                    bytes += part.sub(start, len).sliced_bytes();
                }
            }
            let share = &mut exchanged.reducers[place];
            if sorted {
                (share.rows, share.bytes) = (rows, bytes);
            }
        }
        // Outputs no reducer reads (no rows, or none in a kept range).
        for output in exchanged.outputs.iter_mut().filter(|o| o.readers == 0) {
            output.piece.part = None;
        }
        Ok(exchanged)
    }

    /// A sort's reducers: ranges of the keys, each with rows.
    fn sort_reducers(&self, n: usize) -> Result<Vec<Share>, String> {
        let sampled: Vec<SampledOutput<'_>> = self.outputs.iter().map(sampled).collect();
        Ok(ranges(&sampled, n)?
            .into_iter()
            .map(|input| Share {
                destination: 0,
                range: Some(Arc::new(input.range)),
                rows: 0,
                bytes: 0,
                reading: true,
            })
            .collect())
    }

    /// How many reducers it has.
    pub(crate) fn places(&self) -> usize {
        self.reducers.len()
    }

    /// How many map outputs it keeps.
    #[cfg(test)]
    pub(crate) fn outputs(&self) -> usize {
        self.outputs.len()
    }

    /// The outputs reducer `place` reads, and which rows of each. A hash
    /// exchange's reducer reads every output with rows: which of them hold
    /// rows of its destination only their holders know.
    fn reads(&self, place: usize) -> impl Iterator<Item = (usize, Read)> + '_ {
        let share = &self.reducers[place];
        self.outputs
            .iter()
            .enumerate()
            .filter_map(move |(i, output)| {
                let read = match &share.range {
                    Some(range) => {
                        let (start, len) = rows_within(&sampled(output), range)?;
                        (len > 0).then_some(Read::Rows(start as usize, len as usize))?
                    }
                    None => (output.piece.id.len > 0).then_some(Read::Group(share.destination))?,
                };
                Some((i, read))
            })
    }

    /// A hash exchange's reducer `place`: the rows its outputs' holders
    /// must find for it (a sort's reducer is handed its rows).
    pub(crate) fn rows_found_by_holders(&self, place: u32) -> Option<u64> {
        let share = &self.reducers[place as usize];
        share.range.is_none().then_some(share.rows)
    }

    /// A sort's reducer's keys.
    pub(crate) fn range(&self, place: u32) -> Option<Arc<KeyRange>> {
        self.reducers[place as usize].range.clone()
    }

    /// What reducer `place` holds of its input outside the store, when its
    /// stage's tasks hold at most `cap` (see `job::input_hold`).
    pub(crate) fn hold(&self, place: u32, cap: u64) -> u64 {
        self.reducers[place as usize].bytes.min(cap)
    }

    /// Rows reducer `place` reads, in how many outputs.
    pub(crate) fn describe(&self, place: u32) -> String {
        let outputs = self.reads(place as usize).count();
        let rows = self.reducers[place as usize].rows;
        format!("reducer {place} of an exchange: {outputs} input partition(s), {rows} rows")
    }

    /// The outputs reducer `place` reads that are not held.
    pub(crate) fn missing(&self, place: u32) -> Vec<Origin> {
        self.reads(place as usize)
            .filter(|&(i, _)| !self.outputs[i].piece.held())
            .map(|(i, _)| self.outputs[i].piece.id.from)
            .collect()
    }

    /// Reducer `place`'s rows of every output it reads, in their order of
    /// origin (a sort stays stable, a seeded shuffle the same, wherever
    /// the outputs were made). Each must be held.
    pub(crate) fn parts(&self, place: u32) -> Vec<P> {
        self.reads(place as usize)
            .map(|(i, read)| {
                let part = self.outputs[i].piece.part.as_ref();
                let part = part.expect("a reducer starts on held input");
                match read {
                    Read::Rows(start, len) => part.sub(start, len),
                    Read::Group(d) => part.group(d),
                }
            })
            .collect()
    }

    /// Forgets the outputs `node` held.
    pub(crate) fn lose(&mut self, node: usize) {
        for output in &mut self.outputs {
            output.piece.lose(node);
        }
    }

    /// Output `from`, made again as `whole`, is held again, when a reducer
    /// still to finish reads it.
    pub(crate) fn fill(&mut self, from: Origin, whole: &P) {
        if let Ok(i) = self
            .outputs
            .binary_search_by_key(&from, |o| o.piece.id.from)
            && self.outputs[i].readers > 0
        {
            self.outputs[i].piece.fill(from, whole);
        }
    }

    /// Reducer `place` finished (or will not run): the outputs no reducer
    /// still to finish reads are let go.
    pub(crate) fn finished(&mut self, place: u32) {
        if !std::mem::take(&mut self.reducers[place as usize].reading) {
            return;
        }
        let read: Vec<usize> = self.reads(place as usize).map(|(i, _)| i).collect();
        for i in read {
            let output = &mut self.outputs[i];
            output.readers -= 1;
            if output.readers == 0 {
                output.piece.part = None;
            }
        }
    }

    /// Reducer `place`, finished, runs again (its outputs were lost): it
    /// reads its rows again, and those let go are missing.
    pub(crate) fn read_again(&mut self, place: u32) {
        if std::mem::replace(&mut self.reducers[place as usize].reading, true) {
            return;
        }
        let read: Vec<usize> = self.reads(place as usize).map(|(i, _)| i).collect();
        for i in read {
            self.outputs[i].readers += 1;
        }
    }

    /// The outputs some reducer still to finish reads.
    pub(crate) fn pieces(&self) -> impl Iterator<Item = &Piece<P>> {
        self.outputs
            .iter()
            .filter(|o| o.readers > 0)
            .map(|o| &o.piece)
    }

    /// [`Exchanged::pieces`], for lineage to move.
    pub(crate) fn pieces_mut(&mut self) -> impl Iterator<Item = &mut Piece<P>> {
        self.outputs
            .iter_mut()
            .filter(|o| o.readers > 0)
            .map(|o| &mut o.piece)
    }
}

/// `output` as `streambatch_plan::key_range` reads a sort's.
fn sampled<P>(output: &MapOutput<P>) -> SampledOutput<'_> {
    SampledOutput {
        rows: output.piece.id.len,
        starts: output
            .chunks
            .as_deref()
            .expect("a sort's outputs have chunks"),
        sample: output
            .sample
            .as_deref()
            .expect("a sort's outputs have samples"),
    }
}

/// `cut`, when it cuts `rows` rows into `n` destinations, in order.
fn fits(cut: Option<&Arc<[u32]>>, n: usize, rows: usize) -> Result<&Arc<[u32]>, String> {
    let cut = cut
        .filter(|c| c.len() == n + 1 && c.first() == Some(&0) && c.last() == Some(&(rows as u32)))
        .ok_or_else(|| format!("a map output of {rows} rows is not cut into {n} destinations"))?;
    match cut.windows(2).position(|w| w[1] < w[0]) {
        Some(d) => Err(format!("destination {d} ends before it starts")),
        None => Ok(cut),
    }
}

#[cfg(test)]
mod tests {
    use streambatch_core::TaskId;

    use super::*;

    /// Rows `offset..offset + len` of a map output on `node`, of 10 bytes
    /// a row.
    #[derive(Clone, Debug, PartialEq)]
    struct Rows {
        task: u64,
        node: usize,
        offset: usize,
        len: usize,
        groups: Option<Arc<[u32]>>,
        sample: Option<Arc<KeySample>>,
        /// `groups` stand for the cut its holder keeps: the job sees none.
        cut_at_holder: bool,
    }

    impl Part for Rows {
        fn rows(&self) -> usize {
            self.len
        }
        fn bytes(&self) -> u64 {
            self.len as u64 * 10
        }
        fn sub(&self, offset: usize, len: usize) -> Self {
            let whole = offset == 0 && len == self.len;
            Rows {
                offset: self.offset + offset,
                len,
                groups: self.groups.clone().filter(|_| whole),
                sample: self.sample.clone().filter(|_| whole),
                cut_at_holder: self.cut_at_holder && whole,
                ..self.clone()
            }
        }
        fn node(&self) -> usize {
            self.node
        }
        fn groups(&self) -> Option<&Arc<[u32]>> {
            self.groups.as_ref().filter(|_| !self.cut_at_holder)
        }
        fn sample(&self) -> Option<&Arc<KeySample>> {
            self.sample.as_ref()
        }
        fn forget_cut(&mut self) {
            self.cut_at_holder = true;
        }
        fn cut_at_holder(&self) -> bool {
            self.cut_at_holder
        }
        fn group(&self, d: usize) -> Self {
            assert!(self.cut_at_holder, "a destination is found by its holder");
            let cut = self.groups.clone().unwrap();
            self.sub(cut[d] as usize, (cut[d + 1] - cut[d]) as usize)
        }
    }

    fn origin(task: u64) -> Origin {
        Origin {
            task: TaskId(task),
            seq: 0,
        }
    }

    /// Map output of task `task` on `node`, cut at `cut`.
    fn output(task: u64, node: usize, cut: &[u32]) -> Rows {
        Rows {
            task,
            node,
            offset: 0,
            len: *cut.last().unwrap() as usize,
            groups: Some(cut.into()),
            sample: None,
            cut_at_holder: false,
        }
    }

    /// The exchange of `collected` to `n` destinations, each output's cut
    /// summed as it arrives, as the job does.
    fn exchange(mut collected: Vec<Piece<Rows>>, n: usize) -> Result<Exchanged<Rows>, String> {
        let mut sums = CutSums::new(n);
        for piece in &mut collected {
            sums.fold(piece.part.as_mut().unwrap());
        }
        Exchanged::new(collected, sums)
    }

    /// What reducer `place` is handed: (task, first row, rows) per part.
    fn handed(exchange: &Exchanged<Rows>, place: u32) -> Vec<(u64, usize, usize)> {
        let parts = exchange.parts(place).into_iter();
        parts.map(|p| (p.task, p.offset, p.len)).collect()
    }

    #[test]
    fn reducers_read_their_destination_of_every_output_in_order_of_origin() {
        // Arrived out of order; destination 1 has no rows, so no reducer;
        // an output of no rows is let go at once.
        let collected = vec![
            Piece::whole(origin(7), output(7, 1, &[0, 2, 2, 5])),
            Piece::whole(origin(3), output(3, 0, &[0, 1, 1, 1])),
            Piece::whole(origin(5), output(5, 0, &[0, 0, 0, 0])),
        ];
        let exchange = exchange(collected, 3).unwrap();
        assert_eq!(exchange.places(), 2);
        let held: Vec<bool> = exchange.outputs.iter().map(|o| o.piece.held()).collect();
        assert_eq!(held, [true, false, true], "in order of origin");
        let kept: Vec<&Rows> = exchange.pieces().filter_map(|p| p.part.as_ref()).collect();
        assert!(kept.iter().all(|p| p.groups().is_none()), "no cut kept");
        assert!(kept.iter().all(|p| p.cut_at_holder()));
        assert_eq!(handed(&exchange, 0), [(3, 0, 1), (7, 0, 2)]);
        // Which outputs hold rows of a destination only their holders
        // know: output 3's holder finds none of destination 2.
        assert_eq!(handed(&exchange, 1), [(3, 1, 0), (7, 2, 3)]);
        assert_eq!(exchange.hold(0, u64::MAX), 30, "each output's share");
        assert_eq!(exchange.hold(1, 20), 20, "up to the cap");
        assert!(exchange.range(0).is_none());
        assert_eq!(
            exchange.describe(0),
            "reducer 0 of an exchange: 2 input partition(s), 3 rows"
        );
    }

    #[test]
    fn an_output_lost_is_missing_to_its_readers_until_made_again() {
        let collected = vec![
            Piece::whole(origin(1), output(1, 0, &[0, 2, 4])),
            Piece::whole(origin(2), output(2, 1, &[0, 0, 3])),
        ];
        let mut exchange = exchange(collected, 2).unwrap();
        exchange.lose(1);
        assert_eq!(exchange.missing(0), [origin(2)], "every reducer reads it");
        assert_eq!(exchange.missing(1), [origin(2)]);
        assert_eq!(exchange.pieces().filter(|p| p.held()).count(), 1);
        let mut remade = output(2, 2, &[0, 0, 3]);
        leave_cut_to_holder(&mut remade);
        exchange.fill(origin(2), &remade);
        assert!(exchange.missing(1).is_empty());
        assert_eq!(exchange.parts(1)[1].node, 2, "read where it was made again");
        assert_eq!(handed(&exchange, 1), [(1, 2, 2), (2, 0, 3)]);
    }

    #[test]
    fn an_output_is_let_go_once_its_last_reader_finishes_and_read_again_when_asked() {
        let collected = vec![
            Piece::whole(origin(1), output(1, 0, &[0, 2, 4])),
            Piece::whole(origin(2), output(2, 0, &[0, 0, 3])),
            Piece::whole(origin(3), output(3, 0, &[0, 0, 0])),
        ];
        let mut exchange = exchange(collected, 2).unwrap();
        exchange.finished(0);
        exchange.finished(0);
        assert!(exchange.missing(1).is_empty(), "reducer 1 still reads both");
        assert_eq!(exchange.pieces().count(), 2, "reducer 1 reads both");
        exchange.finished(1);
        assert_eq!(exchange.pieces().count(), 0, "no reader left");
        // Reducer 0's output was lost: it reads both outputs with rows
        // again, which were let go.
        exchange.read_again(0);
        assert_eq!(exchange.missing(0), [origin(1), origin(2)]);
        let held = |e: &Exchanged<Rows>| e.pieces().filter(|p| p.held()).count();
        exchange.fill(origin(3), &output(3, 0, &[0, 0, 0]));
        assert_eq!(held(&exchange), 0, "not filled: no one reads it");
        for task in [1, 2] {
            let mut remade = output(task, 1, &[[0, 2, 4], [0, 0, 3]][task as usize - 1]);
            leave_cut_to_holder(&mut remade);
            exchange.fill(origin(task), &remade);
        }
        assert_eq!(handed(&exchange, 0), [(1, 0, 2), (2, 0, 0)]);
    }

    #[test]
    fn a_sorts_reducers_read_the_chunks_that_may_hold_their_keys() {
        // Keys 1..=4 and 5..=8, in chunks of two rows: the first key of
        // each chunk, then the last.
        let sorted = |task: u64, keys: &[u8]| {
            let ends = (1..=keys.len() as u32).collect();
            let sample = KeySample::from_parts(keys.to_vec(), ends).unwrap();
            Rows {
                sample: Some(Arc::new(sample)),
                ..output(task, 0, &[0, 2, 4])
            }
        };
        let collected = vec![
            Piece::whole(origin(1), sorted(1, &[1, 3, 4])),
            Piece::whole(origin(2), sorted(2, &[5, 7, 8])),
        ];
        let mut exchange = exchange(collected, 2).unwrap();
        assert_eq!(exchange.places(), 2);
        assert!(
            exchange
                .pieces()
                .all(|p| p.part.as_ref().unwrap().groups().is_some()),
            "a sort's outputs keep their chunks"
        );
        assert_eq!(handed(&exchange, 0), [(1, 0, 4)]);
        assert_eq!(handed(&exchange, 1), [(2, 0, 4)]);
        assert_eq!(exchange.hold(0, u64::MAX), 40);
        assert!(exchange.range(0).unwrap().hi.is_some());
        exchange.finished(0);
        assert_eq!(exchange.pieces().count(), 1, "the first output is let go");
    }

    #[test]
    fn an_output_cut_otherwise_is_refused() {
        let refused = |cut: &[u32], n| {
            let collected = vec![Piece::whole(origin(1), output(1, 0, cut))];
            exchange(collected, n).err().unwrap()
        };
        assert!(refused(&[0, 2], 2).contains("not cut into 2 destinations"));
        assert!(refused(&[0, 3, 2, 4], 3).contains("destination 1 ends before it starts"));
        let unsampled = |task| Piece::whole(origin(task), output(task, 0, &[0, 1]));
        let mut sampled = output(2, 0, &[0, 1]);
        sampled.sample = Some(Arc::new(KeySample::default()));
        let collected = vec![unsampled(1), Piece::whole(origin(2), sampled)];
        let err = exchange(collected, 1).err().unwrap();
        assert!(err.contains("has no sample"), "{err}");
        let mut uncut = output(1, 0, &[0, 1]);
        uncut.groups = None;
        let err = exchange(vec![Piece::whole(origin(1), uncut)], 1)
            .err()
            .unwrap();
        assert!(err.contains("not cut into 1 destinations"), "{err}");
    }
}
