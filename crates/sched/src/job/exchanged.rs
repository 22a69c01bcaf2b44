//! An exchange's map outputs as the job keeps them for its reducers: once,
//! in their order of origin, each with where it was cut. A reducer's input
//! is its place among the reducers, not a list of slices, so that the
//! job's records grow with M + N, not M x N: a reducer's rows of each
//! output are worked out when it starts ([`Exchanged::parts`]), and an
//! output lost with its node is marked lost once, not in every reducer's
//! input.

use std::sync::Arc;

use streambatch_plan::key_range::{SampledOutput, ranges, rows_within};
use streambatch_plan::{KeyRange, KeySample};

use crate::job::piece::{Origin, Part, Piece};

/// A map output of the exchange.
struct MapOutput<P> {
    /// The whole output. Its part is `None` while it is lost with its node,
    /// and once no reducer still to finish reads it (freed).
    piece: Piece<P>,
    /// Where each destination's rows start (a sort's: each chunk's), and
    /// the end: kept while the part is lost, since its reducers' rows are
    /// found by it.
    cut: Arc<[u32]>,
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
    /// Bytes of its rows: their share of each output's bytes.
    bytes: u64,
    /// Counted in the readers of the outputs it reads, until it finishes.
    reading: bool,
}

/// An exchange's map outputs and its reducers, those with rows only, by
/// place: a sort's in the order of their ranges.
pub(crate) struct Exchanged<P> {
    outputs: Vec<MapOutput<P>>,
    reducers: Vec<Share>,
}

impl<P: Part> Exchanged<P> {
    /// The exchange of map outputs `collected` (each whole and held, cut
    /// for `n` destinations) to its reducers: one per destination with
    /// rows; a sort's by ranges of the keys its outputs' samples give
    /// (see `streambatch_plan::key_range`).
    pub(crate) fn new(mut collected: Vec<Piece<P>>, n: usize) -> Result<Self, String> {
        collected.sort_by_key(|p| p.id.from);
        let sorted = collected
            .iter()
            .any(|p| p.part.as_ref().is_some_and(|p| p.sample().is_some()));
        let mut outputs = Vec::with_capacity(collected.len());
        for piece in collected {
            let part = piece.part.as_ref().ok_or("a map output is not held")?;
            let rows = piece.id.len;
            let (cut, sample) = (part.groups().cloned(), part.sample().cloned());
            let cut = match (cut, sample.is_some(), sorted) {
                (Some(cut), true, true) => cut,
                (_, false, true) => {
                    return Err(format!(
                        "a map output of {rows} rows of a sort has no sample of its keys"
                    ));
                }
                (None, true, true) => {
                    return Err(format!(
                        "a map output of {rows} rows of a sort is not cut into chunks"
                    ));
                }
                (Some(cut), _, false) if fits(&cut, n, rows)? => cut,
                _ => {
                    return Err(format!(
                        "a map output of {rows} rows is not cut into {n} destinations"
                    ));
                }
            };
            outputs.push(MapOutput {
                piece,
                cut,
                sample,
                readers: 0,
            });
        }
        let mut exchanged = Self {
            outputs,
            reducers: Vec::new(),
        };
        exchanged.reducers = match sorted {
            true => exchanged.sort_reducers(n)?,
            false => (0..n)
                .filter(|&d| exchanged.outputs.iter().any(|o| o.cut[d + 1] > o.cut[d]))
                .map(|destination| Share {
                    destination,
                    range: None,
                    bytes: 0,
                    reading: true,
                })
                .collect(),
        };
        for place in 0..exchanged.reducers.len() {
            let reads: Vec<(usize, usize, usize)> = exchanged.reads(place).collect();
            let mut bytes = 0;
            for (i, start, len) in reads {
                let output = &mut exchanged.outputs[i];
                output.readers += 1;
                let part = output.piece.part.as_ref().expect("checked above");
                bytes += part.sub(start, len).sliced_bytes();
            }
            exchanged.reducers[place].bytes = bytes;
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

    /// The outputs reducer `place` reads rows of: (output, first row, rows).
    fn reads(&self, place: usize) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let share = &self.reducers[place];
        self.outputs
            .iter()
            .enumerate()
            .filter_map(move |(i, output)| {
                let (start, len) = match &share.range {
                    Some(range) => rows_within(&sampled(output), range)?,
                    None => {
                        let d = share.destination;
                        (output.cut[d], output.cut[d + 1] - output.cut[d])
                    }
                };
                (len > 0).then_some((i, start as usize, len as usize))
            })
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
        let (outputs, rows) = self
            .reads(place as usize)
            .fold((0, 0), |(n, rows), (_, _, len)| (n + 1, rows + len));
        format!("reducer {place} of an exchange: {outputs} input partition(s), {rows} rows")
    }

    /// The outputs reducer `place` reads that are not held.
    pub(crate) fn missing(&self, place: u32) -> Vec<Origin> {
        self.reads(place as usize)
            .filter(|&(i, _, _)| !self.outputs[i].piece.held())
            .map(|(i, _, _)| self.outputs[i].piece.id.from)
            .collect()
    }

    /// Reducer `place`'s rows of every output it reads, in their order of
    /// origin (a sort stays stable, a seeded shuffle the same, wherever
    /// the outputs were made). Each must be held.
    pub(crate) fn parts(&self, place: u32) -> Vec<P> {
        self.reads(place as usize)
            .map(|(i, start, len)| {
                let part = self.outputs[i].piece.part.as_ref();
                part.expect("a reducer starts on held input")
                    .sub(start, len)
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
        let read: Vec<usize> = self.reads(place as usize).map(|(i, _, _)| i).collect();
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
        let read: Vec<usize> = self.reads(place as usize).map(|(i, _, _)| i).collect();
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
        starts: &output.cut,
        sample: output
            .sample
            .as_deref()
            .expect("a sort's outputs have samples"),
    }
}

/// Whether `cut` cuts `rows` rows into `n` destinations, in order.
fn fits(cut: &[u32], n: usize, rows: usize) -> Result<bool, String> {
    if cut.len() != n + 1 || cut.first() != Some(&0) || cut.last() != Some(&(rows as u32)) {
        return Ok(false);
    }
    match cut.windows(2).position(|w| w[1] < w[0]) {
        Some(d) => Err(format!("destination {d} ends before it starts")),
        None => Ok(true),
    }
}

#[cfg(test)]
mod tests {
    use streambatch_core::TaskId;

    use super::*;

    /// Rows `offset..offset + len` of a map output on `node`.
    #[derive(Clone, Debug, PartialEq)]
    struct Rows {
        task: u64,
        node: usize,
        offset: usize,
        len: usize,
        groups: Option<Arc<[u32]>>,
        sample: Option<Arc<KeySample>>,
    }

    impl Part for Rows {
        fn rows(&self) -> usize {
            self.len
        }
        fn bytes(&self) -> u64 {
            100
        }
        fn sub(&self, offset: usize, len: usize) -> Self {
            let whole = offset == 0 && len == self.len;
            Rows {
                offset: self.offset + offset,
                len,
                groups: self.groups.clone().filter(|_| whole),
                sample: self.sample.clone().filter(|_| whole),
                ..self.clone()
            }
        }
        fn node(&self) -> usize {
            self.node
        }
        fn groups(&self) -> Option<&Arc<[u32]>> {
            self.groups.as_ref()
        }
        fn sample(&self) -> Option<&Arc<KeySample>> {
            self.sample.as_ref()
        }
        fn sliced_bytes(&self) -> u64 {
            self.len as u64 * 10
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
        }
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
        let exchange = Exchanged::new(collected, 3).unwrap();
        assert_eq!(exchange.places(), 2);
        let held: Vec<bool> = exchange.outputs.iter().map(|o| o.piece.held()).collect();
        assert_eq!(held, [true, false, true], "in order of origin");
        assert_eq!(handed(&exchange, 0), [(3, 0, 1), (7, 0, 2)]);
        assert_eq!(handed(&exchange, 1), [(7, 2, 3)]);
        assert_eq!(exchange.hold(0, u64::MAX), 30);
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
        let mut exchange = Exchanged::new(collected, 2).unwrap();
        exchange.lose(1);
        assert!(exchange.missing(0).is_empty(), "reducer 0 reads none of it");
        assert_eq!(exchange.missing(1), [origin(2)]);
        assert_eq!(exchange.pieces().filter(|p| p.held()).count(), 1);
        exchange.fill(origin(2), &output(2, 2, &[0, 0, 3]));
        assert!(exchange.missing(1).is_empty());
        assert_eq!(exchange.parts(1)[1].node, 2, "read where it was made again");
    }

    #[test]
    fn an_output_is_let_go_once_its_last_reader_finishes_and_read_again_when_asked() {
        let collected = vec![
            Piece::whole(origin(1), output(1, 0, &[0, 2, 4])),
            Piece::whole(origin(2), output(2, 0, &[0, 0, 3])),
        ];
        let mut exchange = Exchanged::new(collected, 2).unwrap();
        exchange.finished(0);
        exchange.finished(0);
        assert!(exchange.missing(1).is_empty(), "reducer 1 still reads both");
        exchange.finished(1);
        assert_eq!(exchange.pieces().count(), 0, "no reader left");
        // Reducer 0's output was lost: it reads output 1 again, which was
        // let go, and none of output 2.
        exchange.read_again(0);
        assert_eq!(exchange.missing(0), [origin(1)]);
        exchange.fill(origin(2), &output(2, 0, &[0, 0, 3]));
        let held = |e: &Exchanged<Rows>| e.pieces().filter(|p| p.held()).count();
        assert_eq!(held(&exchange), 0, "not filled: no one reads it");
        exchange.fill(origin(1), &output(1, 1, &[0, 2, 4]));
        assert_eq!(handed(&exchange, 0), [(1, 0, 2)]);
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
        let mut exchange = Exchanged::new(collected, 2).unwrap();
        assert_eq!(exchange.places(), 2);
        assert_eq!(handed(&exchange, 0), [(1, 0, 4)]);
        assert_eq!(handed(&exchange, 1), [(2, 0, 4)]);
        assert!(exchange.range(0).unwrap().hi.is_some());
        exchange.finished(0);
        assert_eq!(exchange.pieces().count(), 1, "the first output is let go");
    }

    #[test]
    fn an_output_cut_otherwise_is_refused() {
        let refused = |cut: &[u32], n| {
            let collected = vec![Piece::whole(origin(1), output(1, 0, cut))];
            Exchanged::new(collected, n).err().unwrap()
        };
        assert!(refused(&[0, 2], 2).contains("not cut into 2 destinations"));
        assert!(refused(&[0, 3, 2, 4], 3).contains("destination 1 ends before it starts"));
        let unsampled = |task| Piece::whole(origin(task), output(task, 0, &[0, 1]));
        let mut sampled = output(2, 0, &[0, 1]);
        sampled.sample = Some(Arc::new(KeySample::default()));
        let collected = vec![unsampled(1), Piece::whole(origin(2), sampled)];
        let err = Exchanged::new(collected, 1).err().unwrap();
        assert!(err.contains("has no sample"), "{err}");
    }
}
