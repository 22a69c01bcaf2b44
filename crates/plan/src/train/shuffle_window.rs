//! The local shuffle of [`BatchOptions::local_shuffle`](crate::train::batching::BatchOptions::local_shuffle):
//! rows mixed within a window of the stream, the same order for the same
//! input order and seed.
//!
//! Each row, numbered as it arrives, gets a key: its number plus a random
//! delay below the window; rows leave in key order. A row's turn has come
//! once every row that could have a smaller key has arrived, that is once
//! the rows up to its key have, since no row has a key below its own
//! number. So at most a window of rows waits (plus the rows due and not
//! yet taken, fewer than a batch, and the rest of the partition last
//! read), a row leaves at most a window later than it came, and a batch is
//! ready as soon as its rows' turns have come.
//!
//! The window grows over the stream's first rows (row `i`'s delay is below
//! `min(window, i + 1)`), so that the first batch leaves after about two
//! batches of rows, not a window's worth: a trainer does not wait for the
//! window to fill at each epoch's start, and the first rows are mixed among
//! fewer (as a shuffle buffer that starts drawing before it is full).
//!
//! Rows are copied as they enter into pieces of at most [`PIECE_BYTES`]
//! (one row each where rows are larger), so that their partitions go at
//! once (a partition read from the store is unpinned) and a large row is
//! held only until it leaves.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use arrow_array::{Array, RecordBatch, UInt32Array};
use arrow_schema::SchemaRef;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{Error, Result};

/// The most bytes of rows a shuffle copies into one piece.
const PIECE_BYTES: usize = 1 << 20;

/// A waiting row: its key, its number, and where it is (piece, row).
type Waiting = Reverse<(u64, u64, usize, u32)>;

pub(crate) struct ShuffleWindow {
    window: u64,
    /// Rows that arrived so far.
    arrived: u64,
    waiting: BinaryHeap<Waiting>,
    /// Rows whose turn has come, in key order: (piece, row).
    due: VecDeque<(usize, u32)>,
    pieces: Vec<Option<RecordBatch>>,
    /// Per piece, its rows that have not left.
    left: Vec<usize>,
    piece_bytes: usize,
    schema: Option<SchemaRef>,
    rng: StdRng,
}

impl ShuffleWindow {
    /// Mixes rows within `window` rows, seeded by `seed`.
    pub(crate) fn new(window: usize, seed: u64) -> Self {
        Self {
            window: window.max(1) as u64,
            arrived: 0,
            waiting: BinaryHeap::new(),
            due: VecDeque::new(),
            pieces: Vec::new(),
            left: Vec::new(),
            piece_bytes: PIECE_BYTES,
            schema: None,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// Copies `batch`'s rows in, each keyed.
    pub(crate) fn add(&mut self, batch: RecordBatch) -> Result<()> {
        self.schema.get_or_insert_with(|| batch.schema());
        let rows = batch.num_rows();
        let row_bytes = batch.get_array_memory_size() / rows.max(1);
        let per_piece = (self.piece_bytes / row_bytes.max(1)).clamp(1, rows.max(1));
        for first in (0..rows).step_by(per_piece) {
            let end = (first + per_piece).min(rows) as u32;
            let indices = UInt32Array::from_iter_values(first as u32..end);
            let piece = arrow_select::take::take_record_batch(&batch, &indices)
                .map_err(|e| Error::Invalid(format!("buffering rows to shuffle: {e}")))?;
            let at = self.pieces.len();
            for row in 0..piece.num_rows() as u32 {
                let span = self.window.min(self.arrived + 1);
                let key = self.arrived + self.rng.random_range(0..span);
                self.waiting.push(Reverse((key, self.arrived, at, row)));
                self.arrived += 1;
            }
            self.left.push(piece.num_rows());
            self.pieces.push(Some(piece));
        }
        Ok(())
    }

    /// Up to `n` rows whose turn has come (every waiting row's, once the
    /// input has `ended`), in key order, as one batch; `None` if none has.
    pub(crate) fn take(&mut self, n: usize, ended: bool) -> Option<Result<RecordBatch>> {
        self.collect_due(ended);
        let picked: Vec<(usize, usize)> = self
            .due
            .drain(..n.min(self.due.len()))
            .map(|(piece, row)| (piece, row as usize))
            .collect();
        if picked.is_empty() {
            return None;
        }
        let batch = self.gather(&picked);
        for &(piece, _) in &picked {
            self.left[piece] -= 1;
            if self.left[piece] == 0 {
                self.pieces[piece] = None;
            }
        }
        self.compact();
        Some(batch)
    }

    /// Whether `n` rows can leave now (or, once the input `ended`, any).
    pub(crate) fn ready(&mut self, n: usize, ended: bool) -> bool {
        self.collect_due(ended);
        self.due.len() >= n || (ended && !self.due.is_empty())
    }

    /// Moves the rows whose turn has come (every row, once the input
    /// `ended`) from the heap to `due`. `due` stays in key order: a row
    /// arriving later has a key of at least its number, above every key
    /// already due.
    fn collect_due(&mut self, ended: bool) {
        while let Some(Reverse((key, ..))) = self.waiting.peek() {
            if !ended && *key >= self.arrived {
                break;
            }
            let Reverse((_, _, piece, row)) = self.waiting.pop().expect("peeked");
            self.due.push_back((piece, row));
        }
    }

    /// The rows `picked` (piece, row) as one batch, in that order.
    fn gather(&self, picked: &[(usize, usize)]) -> Result<RecordBatch> {
        let schema = self.schema.clone().expect("rows were added");
        // Only the pieces drawn from take part, renumbered.
        let mut used: Vec<usize> = picked.iter().map(|&(piece, _)| piece).collect();
        used.sort_unstable();
        used.dedup();
        let position = |piece: usize| used.binary_search(&piece).expect("listed above");
        let indices: Vec<(usize, usize)> = picked
            .iter()
            .map(|&(piece, row)| (position(piece), row))
            .collect();
        let columns = (0..schema.fields().len())
            .map(|c| {
                let arrays: Vec<&dyn Array> = used
                    .iter()
                    .map(|&p| {
                        self.pieces[p]
                            .as_ref()
                            .expect("a live piece")
                            .column(c)
                            .as_ref()
                    })
                    .collect();
                arrow_select::interleave::interleave(&arrays, &indices)
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::Invalid(format!("drawing a shuffled batch: {e}")))?;
        RecordBatch::try_new(schema, columns)
            .map_err(|e| Error::Invalid(format!("drawing a shuffled batch: {e}")))
    }

    /// Forgets the slots of pieces wholly gone once they are most of them,
    /// so that a long stream keeps a short list.
    fn compact(&mut self) {
        let live = self.pieces.iter().filter(|p| p.is_some()).count();
        if self.pieces.len() < 64 || live * 2 > self.pieces.len() {
            return;
        }
        let mut renumber = vec![usize::MAX; self.pieces.len()];
        let mut pieces = Vec::with_capacity(live);
        let mut left = Vec::with_capacity(live);
        for (old, piece) in self.pieces.drain(..).enumerate() {
            if let Some(piece) = piece {
                renumber[old] = pieces.len();
                pieces.push(Some(piece));
                left.push(self.left[old]);
            }
        }
        self.waiting = self
            .waiting
            .drain()
            .map(|Reverse((key, n, piece, row))| Reverse((key, n, renumber[piece], row)))
            .collect();
        for (piece, _) in &mut self.due {
            *piece = renumber[*piece];
        }
        self.pieces = pieces;
        self.left = left;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{ArrayRef, Int64Array};

    use super::*;

    impl ShuffleWindow {
        /// Rows of the pieces held, left or not.
        fn held(&self) -> usize {
            self.pieces
                .iter()
                .flatten()
                .map(RecordBatch::num_rows)
                .sum()
        }
    }

    /// `n` rows numbered from `first`.
    fn rows(first: i64, n: usize) -> RecordBatch {
        let x: ArrayRef = Arc::new(Int64Array::from_iter_values(first..first + n as i64));
        RecordBatch::try_from_iter([("x", x)]).unwrap()
    }

    /// Streams `total` rows in partitions of `part` through a window,
    /// drawing `batch` rows whenever they are due: the rows in the order
    /// they left, and after each draw the rows held (in pieces) and the
    /// rows that had arrived when the first batch left.
    fn stream(
        window: usize,
        piece_bytes: usize,
        total: usize,
        part: usize,
        batch: usize,
    ) -> (Vec<i64>, Vec<usize>, u64) {
        let mut shuffle = ShuffleWindow::new(window, 9);
        shuffle.piece_bytes = piece_bytes;
        let (mut out, mut held, mut first) = (Vec::new(), Vec::new(), None);
        let mut next = 0;
        loop {
            let ended = next >= total;
            if shuffle.ready(batch, ended) {
                let got = shuffle.take(batch, ended).unwrap().unwrap();
                out.extend(
                    got.column(0)
                        .as_primitive::<Int64Type>()
                        .values()
                        .iter()
                        .copied(),
                );
                held.push(shuffle.held());
                first.get_or_insert(shuffle.arrived);
            } else if ended {
                return (out, held, first.unwrap_or(0));
            } else {
                shuffle
                    .add(rows(next as i64, part.min(total - next)))
                    .unwrap();
                next += part;
            }
        }
    }

    #[test]
    fn every_row_leaves_once_at_most_a_window_late_and_mixed() {
        let (window, total) = (1_000, 20_000);
        let (out, _, _) = stream(window, PIECE_BYTES, total, 50, 64);
        let mut sorted = out.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..total as i64).collect::<Vec<_>>(),
            "every row once"
        );
        let late: Vec<i64> = out
            .iter()
            .enumerate()
            .map(|(at, &row)| at as i64 - row)
            .collect();
        // A row leaves no later than a window (and a batch) after it came.
        assert!(
            late.iter().all(|&l| l < (window + 64) as i64),
            "{:?}",
            late.iter().max()
        );
        // Mixed: rows move by a good part of the window on average.
        let mean = late.iter().map(|l| l.abs()).sum::<i64>() as f64 / total as f64;
        assert!(mean > window as f64 / 8.0, "{mean}");
        assert_eq!(
            stream(window, PIECE_BYTES, total, 50, 64).0,
            out,
            "the seed fixes the order"
        );
    }

    #[test]
    fn the_first_batch_leaves_long_before_the_window_fills() {
        let (_, _, first) = stream(1_000, PIECE_BYTES, 20_000, 10, 64);
        // About two batches of rows, not 1,000.
        assert!(first <= 200, "{first} rows arrived before the first batch");
    }

    #[test]
    fn it_holds_about_its_window_large_rows_once() {
        // Pieces of whole partitions (small rows): a window, a partition
        // read past it, and the pieces whose last rows wait.
        let (_, held, _) = stream(100, PIECE_BYTES, 5_000, 50, 8);
        assert!(
            held.iter().all(|&h| h <= 100 + 3 * 50),
            "{:?}",
            held.iter().max()
        );
        // A piece per row (each larger than a piece): no row held after it left.
        let (_, held, _) = stream(100, 1, 5_000, 50, 8);
        assert!(
            held.iter().all(|&h| h <= 100 + 50),
            "{:?}",
            held.iter().max()
        );
    }

    #[test]
    fn a_window_of_one_keeps_the_order() {
        let (out, _, _) = stream(1, PIECE_BYTES, 500, 7, 10);
        assert_eq!(out, (0..500).collect::<Vec<_>>());
    }
}
