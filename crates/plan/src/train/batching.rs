//! Batches as a trainer wants them, made from partitions of any size:
//! exactly `batch_size` rows each (the last may be shorter, or dropped with
//! `drop_last`), and with a local shuffle, rows mixed across partitions
//! within a window of rows, in an order fixed by a seed
//! (`shuffle_window.rs`).
//!
//! Without shuffling, a batch inside one partition is a slice of it (no
//! copy); only a batch that spans partitions is copied, once. A shuffled
//! row is copied twice: into the window as it enters (so that its
//! partition goes at once), and into its batch with arrow's `interleave`.
//! With `prefetch_batches`, a thread of their own makes the next batches
//! while the trainer computes. A `collate` function, as PyTorch's and Ray
//! Data's `collate_fn`, turns each batch into what the step takes (on
//! that thread too): work that widens rows (bytes to f32) done there keeps
//! the shuffle window narrow.

use std::collections::VecDeque;
use std::sync::{Arc, mpsc};

use arrow_array::RecordBatch;

use crate::error::{Error, Result};
use crate::train::shuffle_window::ShuffleWindow;
use crate::udf::{BatchIter, UdfError};

/// A function each batch passes through once cut (and shuffled): see
/// [`BatchOptions::collate`].
pub type Collate =
    Arc<dyn Fn(RecordBatch) -> std::result::Result<RecordBatch, UdfError> + Send + Sync>;

/// How [`Dataset::iter_batches_with`](crate::dataset::Dataset::iter_batches_with)
/// cuts its batches.
///
/// ```
/// let options = streambatch_plan::BatchOptions::rows(64)
///     .drop_last(true)
///     .local_shuffle(1_000, 7);
/// assert_eq!(options.batch_size, Some(64));
/// ```
#[derive(Clone, Default)]
pub struct BatchOptions {
    /// Rows per batch; `None`: the partitions as the job makes them.
    pub batch_size: Option<usize>,
    /// Drops the last batch when it is shorter than `batch_size`.
    pub drop_last: bool,
    /// Rows mixed across partitions within a window of this many rows
    /// (`None`: no shuffle): each row leaves at most this many rows later
    /// than it came, in an order fixed by the seed, and about this many
    /// rows wait at once. A batch is drawn as soon as its rows' turns have
    /// come, without waiting for the window to fill (see
    /// `ShuffleWindow`). The rows are copied as they enter, so that their
    /// partitions go at once (a partition read from the store is unpinned).
    pub local_shuffle_buffer_size: Option<usize>,
    /// Seeds the shuffle: the same seed over the same input order gives
    /// the same batches.
    pub seed: u64,
    /// Batches made ready ahead, on a thread of their own, while the
    /// consumer works on the last (0: each is made when asked for). A
    /// batch within one partition pins that partition in the store, so
    /// what waits ahead is counted against the store's capacity.
    pub prefetch_batches: usize,
    /// Applied to each batch as it is made (on the prefetch thread where
    /// there is one), after the shuffle: see [`BatchOptions::collate`].
    pub collate: Option<Collate>,
}

impl std::fmt::Debug for BatchOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchOptions")
            .field("batch_size", &self.batch_size)
            .field("drop_last", &self.drop_last)
            .field("local_shuffle_buffer_size", &self.local_shuffle_buffer_size)
            .field("seed", &self.seed)
            .field("prefetch_batches", &self.prefetch_batches)
            .field("collate", &self.collate.as_ref().map(|_| "fn"))
            .finish()
    }
}

impl BatchOptions {
    /// Batches of exactly `n` rows (the last may be shorter).
    pub fn rows(n: usize) -> Self {
        Self {
            batch_size: Some(n),
            ..Self::default()
        }
    }

    /// Drops (`true`) or keeps a last batch shorter than the others.
    pub fn drop_last(self, drop_last: bool) -> Self {
        Self { drop_last, ..self }
    }

    /// Mixes rows inside a buffer of `rows` rows, seeded by `seed`.
    pub fn local_shuffle(self, rows: usize, seed: u64) -> Self {
        Self {
            local_shuffle_buffer_size: Some(rows),
            seed,
            ..self
        }
    }

    /// Makes `n` batches ready ahead of the consumer.
    pub fn prefetch(self, n: usize) -> Self {
        Self {
            prefetch_batches: n,
            ..self
        }
    }

    /// Passes each batch through `collate` as it is made, after the
    /// shuffle (PyTorch's and Ray Data's `collate_fn`): the window and the
    /// batches cut from it hold the rows as the job made them, and the
    /// step gets what `collate` makes of each batch. Rows that `collate`
    /// widens (bytes normalised to f32) wait in the window narrow. An
    /// error it returns is the stream's next item, naming it `collate`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use arrow_array::{ArrayRef, Int64Array, RecordBatch};
    /// use arrow_array::cast::AsArray;
    /// use arrow_array::types::Int64Type;
    /// use streambatch_plan::BatchOptions;
    /// let part: ArrayRef = Arc::new(Int64Array::from_iter_values(0..5));
    /// let part = RecordBatch::try_from_iter([("x", part)]).unwrap();
    /// let doubled = BatchOptions::rows(2).collate(|batch: RecordBatch| {
    ///     let x = arrow_arith::numeric::add(batch.column(0), batch.column(0))?;
    ///     Ok(RecordBatch::try_new(batch.schema(), vec![x])?)
    /// });
    /// let firsts: Vec<i64> = doubled
    ///     .cut([Ok(part)].into_iter())?
    ///     .map(|b| b.map(|b| b.column(0).as_primitive::<Int64Type>().value(0)))
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(firsts, [0, 4, 8]);
    /// # Ok::<(), streambatch_plan::Error>(())
    /// ```
    pub fn collate<F>(self, collate: F) -> Self
    where
        F: Fn(RecordBatch) -> std::result::Result<RecordBatch, UdfError> + Send + Sync + 'static,
    {
        Self {
            collate: Some(Arc::new(collate)),
            ..self
        }
    }

    /// `input`'s partitions cut into batches, made ahead on a thread of
    /// their own when `prefetch_batches` asks for it.
    pub fn cut<I>(self, input: I) -> Result<BatchIter>
    where
        I: Iterator<Item = Result<RecordBatch>> + Send + 'static,
    {
        let ahead = self.prefetch_batches;
        let batches = Batches::new(input, self)?;
        Ok(match ahead {
            0 => Box::new(batches),
            n => Box::new(Prefetched::new(batches, n)),
        })
    }

    fn check(&self) -> Result<()> {
        if self.batch_size == Some(0) {
            return Err(Error::Invalid("batch_size must be at least 1".into()));
        }
        if self.local_shuffle_buffer_size.is_some() && self.batch_size.is_none() {
            return Err(Error::Invalid(
                "a local shuffle needs a batch_size: its batches are drawn from the window".into(),
            ));
        }
        if self.local_shuffle_buffer_size == Some(0) {
            return Err(Error::Invalid(
                "a local shuffle's window must hold at least 1 row".into(),
            ));
        }
        Ok(())
    }
}

/// `batches`, calling `on_batch` as each is handed to the consumer (a
/// rank's count of batches delivered).
pub fn counted(batches: BatchIter, on_batch: impl FnMut() + Send + 'static) -> BatchIter {
    Box::new(Counted {
        batches,
        on_batch: Box::new(on_batch),
    })
}

struct Counted {
    batches: BatchIter,
    on_batch: Box<dyn FnMut() + Send>,
}

impl Iterator for Counted {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Result<RecordBatch>> {
        let next = self.batches.next();
        if let Some(Ok(_)) = next {
            (self.on_batch)();
        }
        next
    }
}

/// Batches cut from `input`'s partitions as [`BatchOptions`] says.
pub struct Batches<I> {
    input: I,
    options: BatchOptions,
    /// Partitions read and not yet wholly handed out, oldest first, and
    /// how many of the first one's rows were.
    pending: VecDeque<RecordBatch>,
    taken: usize,
    /// Rows in `pending` not yet handed out.
    pending_rows: usize,
    shuffle: Option<ShuffleWindow>,
    ended: bool,
}

impl<I: Iterator<Item = Result<RecordBatch>>> Batches<I> {
    /// Cuts `input`'s partitions; an error for options that cannot hold
    /// (a batch size of 0, a shuffle without a batch size).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use arrow_array::{ArrayRef, Int64Array, RecordBatch};
    /// use streambatch_plan::{BatchOptions, Batches};
    /// let part = |n: i64| {
    ///     let x: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n));
    ///     Ok(RecordBatch::try_from_iter([("x", x)]).unwrap())
    /// };
    /// // Partitions of 3, 5 and 2 rows, in batches of 4.
    /// let batches = Batches::new([part(3), part(5), part(2)].into_iter(), BatchOptions::rows(4))?;
    /// let sizes: Vec<usize> = batches.map(|b| b.map(|b| b.num_rows())).collect::<Result<_, _>>()?;
    /// assert_eq!(sizes, [4, 4, 2]);
    /// # Ok::<(), streambatch_plan::Error>(())
    /// ```
    pub fn new(input: I, options: BatchOptions) -> Result<Self> {
        options.check()?;
        let shuffle = options
            .local_shuffle_buffer_size
            .map(|rows| ShuffleWindow::new(rows, options.seed));
        Ok(Self {
            input,
            options,
            pending: VecDeque::new(),
            taken: 0,
            pending_rows: 0,
            shuffle,
            ended: false,
        })
    }

    /// The next non-empty partition of the input, or `None` at its end.
    fn pull(&mut self) -> Option<Result<RecordBatch>> {
        if self.ended {
            return None;
        }
        loop {
            match self.input.next() {
                Some(Ok(batch)) if batch.num_rows() == 0 => continue,
                Some(next) => return Some(next),
                None => {
                    self.ended = true;
                    return None;
                }
            }
        }
    }

    /// The next `n` rows of `pending` (at most what it holds), as one batch.
    fn cut(&mut self, n: usize) -> Result<RecordBatch> {
        let mut pieces = Vec::new();
        let mut left = n.min(self.pending_rows);
        while left > 0 {
            let first = self.pending.front().expect("rows are pending");
            let here = (first.num_rows() - self.taken).min(left);
            pieces.push(first.slice(self.taken, here));
            self.taken += here;
            left -= here;
            if self.taken == first.num_rows() {
                self.pending.pop_front();
                self.taken = 0;
            }
        }
        self.pending_rows -= pieces.iter().map(RecordBatch::num_rows).sum::<usize>();
        match pieces.len() {
            1 => Ok(pieces.pop().expect("one piece")),
            _ => {
                let schema = pieces[0].schema();
                arrow_select::concat::concat_batches(&schema, &pieces)
                    .map_err(|e| Error::Invalid(format!("joining partitions into a batch: {e}")))
            }
        }
    }

    fn next_in_order(&mut self, size: usize) -> Option<Result<RecordBatch>> {
        while self.pending_rows < size {
            match self.pull()? {
                Ok(batch) => {
                    self.pending_rows += batch.num_rows();
                    self.pending.push_back(batch);
                }
                Err(e) => return Some(Err(e)),
            }
        }
        Some(self.cut(size))
    }

    /// `batch` through the options' `collate`, if any.
    fn collated(&self, batch: RecordBatch) -> Result<RecordBatch> {
        match &self.options.collate {
            None => Ok(batch),
            Some(collate) => collate(batch).map_err(|source| Error::Udf {
                operator: "collate".into(),
                source,
            }),
        }
    }

    /// The next `size` rows whose turn has come in the shuffle (see
    /// [`ShuffleWindow`]), reading the input only until they have.
    fn next_shuffled(&mut self, size: usize) -> Option<Result<RecordBatch>> {
        loop {
            let ended = self.ended;
            if self.shuffle.as_mut()?.ready(size, ended) {
                return self.shuffle.as_mut()?.take(size, ended);
            }
            if ended {
                return None;
            }
            match self.pull() {
                Some(Ok(batch)) => {
                    if let Err(e) = self.shuffle.as_mut()?.add(batch) {
                        return Some(Err(e));
                    }
                }
                Some(Err(e)) => return Some(Err(e)),
                None => {} // ended: what waits leaves next
            }
        }
    }
}

impl<I: Iterator<Item = Result<RecordBatch>>> Iterator for Batches<I> {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Result<RecordBatch>> {
        let Some(size) = self.options.batch_size else {
            return self.pull().map(|batch| self.collated(batch?));
        };
        let next = match self.options.local_shuffle_buffer_size {
            Some(_) => self.next_shuffled(size),
            None => match self.next_in_order(size) {
                None if self.pending_rows > 0 => Some(self.cut(size)),
                next => next,
            },
        };
        match next {
            Some(Ok(batch)) if batch.num_rows() < size && self.options.drop_last => None,
            Some(Ok(batch)) => Some(self.collated(batch)),
            next => next,
        }
    }
}

/// Batches made on a thread of their own, up to `ahead` of the consumer.
/// Dropped, it lets the thread go; the thread ends (and drops its input,
/// stopping the job) once its next batch finds no one to take it.
pub struct Prefetched {
    ready: mpsc::Receiver<Result<RecordBatch>>,
    /// The thread, joined once it hangs up: a panic there is an error
    /// here, not a short stream.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Prefetched {
    /// Starts making `input`'s batches, at most `ahead` (at least 1) ready
    /// at a time.
    pub fn new<I>(input: I, ahead: usize) -> Self
    where
        I: Iterator<Item = Result<RecordBatch>> + Send + 'static,
    {
        // A rendezvous channel already holds one batch ready (the one the
        // thread waits to hand over); each slot of the channel one more.
        let (tx, ready) = mpsc::sync_channel(ahead.max(1) - 1);
        let thread = std::thread::Builder::new()
            .name("streambatch-prefetch".into())
            .spawn(move || {
                for batch in input {
                    if tx.send(batch).is_err() {
                        break;
                    }
                }
            })
            .expect("a thread starts");
        Self {
            ready,
            thread: Some(thread),
        }
    }
}

impl Iterator for Prefetched {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Result<RecordBatch>> {
        if let Ok(batch) = self.ready.recv() {
            return Some(batch);
        }
        match self.thread.take()?.join() {
            Ok(()) => None,
            Err(_) => Some(Err(Error::Invalid(
                "the thread making batches ahead panicked".into(),
            ))),
        }
    }
}

impl crate::dataset::Dataset {
    /// Runs the plan and streams its rows in batches cut as `options` says:
    /// exactly `batch_size` rows each (a batch inside one partition is a
    /// slice of it), the last short one dropped with `drop_last`, rows
    /// mixed across partitions within a seeded local shuffle window (see
    /// [`Batches`](crate::train::batching::Batches) for an example), made ahead with
    /// `prefetch_batches`.
    pub fn iter_batches_with(&self, options: BatchOptions) -> Result<BatchIter> {
        options.cut(self.iter_batches()?)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array};

    use super::*;

    /// Partitions of the given sizes holding 0, 1, 2, ... in order.
    fn partitions(sizes: &[usize]) -> Vec<Result<RecordBatch>> {
        let mut next = 0i64;
        sizes
            .iter()
            .map(|&n| {
                let x: ArrayRef = Arc::new(Int64Array::from_iter_values(next..next + n as i64));
                next += n as i64;
                Ok(RecordBatch::try_from_iter([("x", x)]).unwrap())
            })
            .collect()
    }

    fn values(batch: &RecordBatch) -> Vec<i64> {
        let x = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        x.values().to_vec()
    }

    fn cut(sizes: &[usize], options: BatchOptions) -> Vec<Vec<i64>> {
        Batches::new(partitions(sizes).into_iter(), options)
            .unwrap()
            .map(|b| values(&b.unwrap()))
            .collect()
    }

    #[test]
    fn batches_have_exactly_their_size_across_partition_boundaries() {
        let batches = cut(&[3, 5, 0, 1, 7], BatchOptions::rows(4));
        let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![4, 4, 4, 4]);
        assert_eq!(batches.concat(), (0..16).collect::<Vec<_>>());
        let batches = cut(&[10], BatchOptions::rows(4));
        assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4, 2]);
        let batches = cut(&[10], BatchOptions::rows(4).drop_last(true));
        assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4]);
        assert!(cut(&[], BatchOptions::rows(4)).is_empty());
        assert_eq!(
            cut(&[2, 3], BatchOptions::default()),
            [vec![0, 1], vec![2, 3, 4]]
        );
    }

    #[test]
    fn a_batch_inside_one_partition_is_a_slice_of_it_not_a_copy() {
        let input = partitions(&[8]);
        let source = input[0].as_ref().unwrap().column(0).to_data().buffers()[0].as_ptr();
        let batches: Vec<RecordBatch> = Batches::new(input.into_iter(), BatchOptions::rows(4))
            .unwrap()
            .map(|b| b.unwrap())
            .collect();
        let second = batches[1].column(0).to_data();
        let at = second.buffers()[0].as_ptr() as usize + second.offset() * 8;
        assert_eq!(
            at,
            source as usize + 4 * 8,
            "the second batch copied its rows"
        );
    }

    #[test]
    fn a_shuffle_keeps_every_row_once_and_its_seed_fixes_the_order() {
        let options = BatchOptions::rows(5).local_shuffle(12, 7);
        let sizes = [4, 4, 4, 4, 4, 3];
        let first = cut(&sizes, options.clone());
        let mut all = first.concat();
        assert_ne!(all, (0..23).collect::<Vec<_>>(), "not shuffled");
        all.sort_unstable();
        assert_eq!(all, (0..23).collect::<Vec<_>>());
        assert_eq!(
            cut(&sizes, options.clone()),
            first,
            "the same seed, the same order"
        );
        assert_ne!(
            cut(&sizes, BatchOptions::rows(5).local_shuffle(12, 8)),
            first
        );
        let sizes: Vec<usize> = first.iter().map(Vec::len).collect();
        assert_eq!(sizes, [5, 5, 5, 5, 3]);
        let dropped = cut(&[4, 4, 4, 4, 4, 3], options.drop_last(true));
        assert_eq!(dropped.len(), 4);
    }

    #[test]
    fn a_shuffle_reads_no_more_than_its_window_before_a_batch() {
        let read = std::cell::Cell::new(0);
        let input = partitions(&[4; 10])
            .into_iter()
            .inspect(|_| read.set(read.get() + 1));
        let mut batches = Batches::new(input, BatchOptions::rows(2).local_shuffle(10, 1)).unwrap();
        let first = batches.next().unwrap().unwrap();
        assert_eq!(first.num_rows(), 2);
        // A window of 10 rows: at most three partitions of 4 before the
        // first rows are due, not the whole input.
        let partitions_read = read.get();
        assert!((1..=3).contains(&partitions_read), "{partitions_read}");
        assert!(
            values(&first)
                .iter()
                .all(|v| *v < 4 * partitions_read as i64),
            "{:?}",
            values(&first)
        );
    }

    #[test]
    fn prefetched_batches_come_in_order_and_are_made_ahead() {
        let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = made.clone();
        let input = partitions(&[4; 6]).into_iter().inspect(move |_| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        let mut batches = BatchOptions::rows(4).prefetch(2).cut(input).unwrap();
        let first = values(&batches.next().unwrap().unwrap());
        assert_eq!(first, vec![0, 1, 2, 3]);
        // While this consumer holds the first, the thread makes two more.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while made.load(std::sync::atomic::Ordering::SeqCst) < 3 {
            assert!(std::time::Instant::now() < deadline, "nothing made ahead");
            std::thread::yield_now();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(
            made.load(std::sync::atomic::Ordering::SeqCst),
            3,
            "no more than 2 ahead"
        );
        let rest: Vec<i64> = batches.flat_map(|b| values(&b.unwrap())).collect();
        assert_eq!(rest, (4..24).collect::<Vec<_>>());
    }

    #[test]
    fn a_panic_making_batches_ahead_is_an_error_not_a_short_stream() {
        let input = partitions(&[4, 4]).into_iter().enumerate().map(|(i, b)| {
            assert!(i == 0, "the input breaks");
            b
        });
        let batches: Vec<Result<RecordBatch>> = Prefetched::new(input, 2).collect();
        assert_eq!(batches.len(), 2);
        assert!(batches[0].is_ok());
        assert!(batches[1].is_err(), "the panic was not reported");
    }

    /// Multiplies column `x` by 10, after checking each batch is whole.
    fn times_ten(batch: RecordBatch) -> std::result::Result<RecordBatch, UdfError> {
        let x: Vec<i64> = values(&batch).iter().map(|v| v * 10).collect();
        if x.len() != 5 && x.len() != 3 {
            return Err(format!("a batch of {} rows", x.len()).into());
        }
        let x: ArrayRef = Arc::new(Int64Array::from(x));
        Ok(RecordBatch::try_from_iter([("x", x)])?)
    }

    #[test]
    fn collate_takes_each_batch_after_the_shuffle_and_its_errors_name_it() {
        let sizes = [4, 4, 4, 4, 4, 3];
        let shuffled = BatchOptions::rows(5).local_shuffle(12, 7);
        let plain = cut(&sizes, shuffled.clone());
        let collated = cut(&sizes, shuffled.clone().collate(times_ten));
        let expected: Vec<Vec<i64>> = plain
            .iter()
            .map(|b| b.iter().map(|v| v * 10).collect())
            .collect();
        assert_eq!(collated, expected, "the shuffle's batches, each collated");
        // On the prefetch thread too, and without a batch size.
        let ahead = shuffled.collate(times_ten).prefetch(2);
        let input = partitions(&sizes).into_iter();
        let ahead: Vec<Vec<i64>> = ahead
            .cut(input)
            .unwrap()
            .map(|b| values(&b.unwrap()))
            .collect();
        assert_eq!(ahead, expected);
        let whole = BatchOptions::default().collate(times_ten);
        let whole: Vec<Vec<i64>> = Batches::new(partitions(&[5, 3]).into_iter(), whole)
            .unwrap()
            .map(|b| values(&b.unwrap()))
            .collect();
        assert_eq!(whole, [vec![0, 10, 20, 30, 40], vec![50, 60, 70]]);
        // An error of the collate is the stream's, naming it.
        let failing = BatchOptions::rows(4).collate(times_ten);
        let mut batches = Batches::new(partitions(&[8]).into_iter(), failing).unwrap();
        let error = batches.next().unwrap().unwrap_err().to_string();
        assert!(
            error.contains("`collate`") && error.contains("a batch of 4 rows"),
            "{error}"
        );
    }

    #[test]
    fn options_that_cannot_hold_are_refused() {
        let input = || partitions(&[1]).into_iter();
        assert!(Batches::new(input(), BatchOptions::rows(0)).is_err());
        let shuffle_only = BatchOptions::default().local_shuffle(10, 1);
        assert!(Batches::new(input(), shuffle_only).is_err());
        let no_window = BatchOptions::rows(4).local_shuffle(0, 1);
        assert!(Batches::new(input(), no_window).is_err());
    }

    #[test]
    fn an_error_of_the_input_is_passed_on() {
        let input = vec![
            partitions(&[3]).remove(0),
            Err(Error::Invalid("broken".into())),
        ];
        let mut batches = Batches::new(input.into_iter(), BatchOptions::rows(4)).unwrap();
        assert!(batches.next().unwrap().is_err());
    }
}
