//! A sort reducer whose range outgrows its budget (a hot key: equal keys
//! are never split between ranges): its input is read as it streams, sorted
//! in runs of at most the budget ([`Sorted`]), each written to a scratch
//! file as it fills, and the runs are merged k ways as the output is read.
//! A range within the budget is sorted in memory as before, with no file.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{SchemaRef, SortOptions};
use streambatch_core::batch_bytes;

use crate::error::{Error, Result};
use crate::exchange::cut::column_indices;
use crate::exchange::reservation::MemoryReservation;
use crate::exchange::scratch::{Scratch, ScratchFile};
use crate::exchange::sort::sorted::{CHUNK_ROWS, Sorted};
use crate::udf::BatchIter;

/// Rows per batch of a run on disk: a merge holds one batch of each run.
const RUN_CHUNK_ROWS: usize = 8 * 1024;

/// Runs a merge reads at once; more are first merged into longer runs.
const MERGE_WIDTH: usize = 32;

/// `input` sorted by `keys` in `order`: in memory while it stays within
/// what `scratch`'s pool grants, else as runs written to `scratch.dir` and merged.
/// Read lazily: nothing happens until the first batch is asked for.
pub fn sort(
    input: BatchIter,
    keys: Vec<String>,
    order: SortOptions,
    scratch: Scratch,
) -> BatchIter {
    let mut input = Some(input);
    let mut output: Option<BatchIter> = None;
    // Held with the output it accounts for, given back once that ends.
    let mut reservation = scratch.reservation();
    Box::new(std::iter::from_fn(move || {
        if let Some(input) = input.take() {
            match sorted_in_runs(input, &keys, order, &scratch, &mut reservation) {
                Ok(Some(sorted)) => output = Some(sorted),
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
        let next = output.as_mut()?.next();
        if next.is_none() {
            reservation.free();
        }
        next
    }))
}

/// Reads `input` whole, writing a sorted run whenever it holds more than
/// the budget; `None` when it has no batch (nothing to emit, not even an
/// empty batch: its schema is not known).
fn sorted_in_runs(
    input: BatchIter,
    keys: &[String],
    order: SortOptions,
    scratch: &Scratch,
    reservation: &mut MemoryReservation,
) -> Result<Option<BatchIter>> {
    let mut schema = None;
    let mut held = Vec::new();
    let mut runs = Vec::new();
    for batch in input {
        let batch = batch?;
        let schema = schema.get_or_insert_with(|| batch.schema());
        if batch.num_rows() == 0 {
            continue;
        }
        let batch = conform(batch, schema, &mut held)?;
        let grown = reservation.try_grow(batch_bytes(&batch));
        held.push(batch);
        if !grown {
            let run = Sorted::new(schema, std::mem::take(&mut held), keys, order)?
                .with_chunk_rows(RUN_CHUNK_ROWS);
            runs.push(scratch.write("sort-run", schema, run)?);
            reservation.free();
        }
        if runs.len() == MERGE_WIDTH {
            // Merged into one longer run, so that a merge never reads more
            // than this many files at once (a batch and a buffer each).
            let merged = merge(schema, std::mem::take(&mut runs), None, keys, order)?
                .with_chunk_rows(RUN_CHUNK_ROWS);
            runs.push(scratch.write("sort-run", schema, merged)?);
        }
    }
    let Some(schema) = schema else {
        return Ok(None);
    };
    let last = Sorted::new(&schema, held, keys, order)?;
    if runs.is_empty() {
        return Ok(Some(Box::new(last)));
    }
    Ok(Some(Box::new(merge(
        &schema,
        runs,
        Some(last),
        keys,
        order,
    )?)))
}

/// Runs merged in the order they were written, then `last` (the part
/// still in memory): a tie goes to the run that came first, and each run
/// is a stable sort, so the merge is one too.
fn merge(
    schema: &SchemaRef,
    runs: Vec<ScratchFile>,
    last: Option<Sorted>,
    keys: &[String],
    order: SortOptions,
) -> Result<Merge> {
    // A run written before the schema was widened is widened as it is read.
    let mut sources: Vec<BatchIter> = runs
        .into_iter()
        .map(|run| {
            let schema = schema.clone();
            let widened = run.read()?.map(move |batch| {
                batch?
                    .with_schema(schema.clone())
                    .map_err(|e| Error::arrow("sort: a run's batch", e))
            });
            Ok(Box::new(widened) as BatchIter)
        })
        .collect::<Result<_>>()?;
    if let Some(last) = last {
        sources.push(Box::new(last));
    }
    Merge::new(schema.clone(), sources, keys, order)
}

/// `batch` under `schema`, the schema of the input's first batch. An
/// input's batches may differ in nullability alone (outputs of different
/// map tasks): then `schema` becomes all-nullable and the batches `held`
/// are widened to it, since a merge and a run's file take one schema. An
/// input whose batches agree keeps its schema.
fn conform(
    batch: RecordBatch,
    schema: &mut SchemaRef,
    held: &mut [RecordBatch],
) -> Result<RecordBatch> {
    if batch.schema() == *schema {
        return Ok(batch);
    }
    let other = |e| {
        Error::Invalid(format!(
            "sort: a reducer got batches of other columns ({e})"
        ))
    };
    let wide = nullable(schema);
    if wide != *schema {
        *schema = wide;
        for held in held.iter_mut() {
            *held = held.clone().with_schema(schema.clone()).map_err(other)?;
        }
    }
    batch.with_schema(schema.clone()).map_err(other)
}

/// `schema` with every field nullable.
fn nullable(schema: &SchemaRef) -> SchemaRef {
    let fields: Vec<_> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    Arc::new(arrow_schema::Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    ))
}

/// Sorted sources merged into one order, a chunk at a time; ties go to
/// the earlier source.
struct Merge {
    sources: Vec<Source>,
    converter: RowConverter,
    keys: Vec<usize>,
    /// The batches the next chunk takes rows from.
    inputs: Vec<RecordBatch>,
    /// Rows per emitted batch.
    chunk_rows: usize,
    done: bool,
}

/// A sorted source and where the merge is in it.
struct Source {
    batches: BatchIter,
    /// Its current batch, that batch's keys and the next row.
    now: Option<(RecordBatch, Rows, usize)>,
    /// The current batch's place in `Merge::inputs`.
    slot: usize,
}

impl Merge {
    fn new(
        schema: SchemaRef,
        sources: Vec<BatchIter>,
        keys: &[String],
        order: SortOptions,
    ) -> Result<Self> {
        let empty = RecordBatch::new_empty(schema.clone());
        let keys = column_indices(&empty, keys)?;
        let fields = keys
            .iter()
            .map(|&k| SortField::new_with_options(schema.field(k).data_type().clone(), order))
            .collect();
        let converter = RowConverter::new(fields).map_err(|e| Error::arrow("sort", e))?;
        let sources = sources
            .into_iter()
            .map(|batches| Source {
                batches,
                now: None,
                slot: 0,
            })
            .collect();
        let mut merge = Self {
            sources,
            converter,
            keys,
            inputs: Vec::new(),
            chunk_rows: CHUNK_ROWS,
            done: false,
        };
        for i in 0..merge.sources.len() {
            merge.advance(i)?;
        }
        Ok(merge)
    }

    /// Emits batches of at most `rows` rows (a merge written as a run).
    fn with_chunk_rows(mut self, rows: usize) -> Self {
        self.chunk_rows = rows;
        self
    }

    /// Moves source `i` to its next non-empty batch (or its end), making
    /// that batch one of the next chunk's inputs.
    fn advance(&mut self, i: usize) -> Result<()> {
        let source = &mut self.sources[i];
        source.now = None;
        for batch in source.batches.by_ref() {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            let columns: Vec<_> = self.keys.iter().map(|&k| batch.column(k).clone()).collect();
            let rows = self
                .converter
                .convert_columns(&columns)
                .map_err(|e| Error::arrow("sort", e))?;
            source.slot = self.inputs.len();
            self.inputs.push(batch.clone());
            source.now = Some((batch, rows, 0));
            break;
        }
        Ok(())
    }

    /// The source whose next row comes first (the earliest among equals).
    fn first(&self) -> Option<usize> {
        let mut best: Option<(usize, arrow_row::Row<'_>)> = None;
        for (i, source) in self.sources.iter().enumerate() {
            let Some((_, rows, at)) = &source.now else {
                continue;
            };
            let row = rows.row(*at);
            if best.as_ref().is_none_or(|(_, b)| row < *b) {
                best = Some((i, row));
            }
        }
        best.map(|(i, _)| i)
    }

    fn chunk(&mut self) -> Result<Option<RecordBatch>> {
        let mut picks = Vec::with_capacity(self.chunk_rows);
        while picks.len() < self.chunk_rows {
            let Some(i) = self.first() else {
                break;
            };
            let source = &mut self.sources[i];
            let (batch, _, at) = source.now.as_mut().expect("first picks a live source");
            picks.push((source.slot, *at));
            *at += 1;
            if *at == batch.num_rows() {
                self.advance(i)?;
            }
        }
        if picks.is_empty() {
            return Ok(None);
        }
        let inputs: Vec<&RecordBatch> = self.inputs.iter().collect();
        let chunk = crate::exchange::gather::interleave_batches(&inputs, &picks)
            .map_err(|e| Error::arrow("sort", e))?;
        // The next chunk starts from the sources' current batches alone.
        let current: Vec<RecordBatch> = self
            .sources
            .iter()
            .filter_map(|s| s.now.as_ref().map(|(b, _, _)| b.clone()))
            .collect();
        let mut slot = 0;
        for source in &mut self.sources {
            if source.now.is_some() {
                source.slot = slot;
                slot += 1;
            }
        }
        self.inputs = current;
        Ok(Some(chunk))
    }
}

impl Iterator for Merge {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.chunk() {
            Ok(Some(chunk)) => Some(Ok(chunk)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use arrow_array::{Array, ArrayRef, Int64Array, StringArray};

    use super::*;
    use crate::exchange::reservation::FixedPool;

    /// Batches of 7 rows: keys from a small set (ties across batches and
    /// runs), some null; `tag` numbers the rows in arrival order.
    fn input(batches: usize) -> Vec<RecordBatch> {
        let keys = ["pear", "apple", "fig", "plum-long-key-a", "plum-long-key-b"];
        (0..batches)
            .map(|b| {
                let rows = (0..7).map(|r| b * 7 + r);
                let k: Vec<Option<&str>> = rows
                    .clone()
                    .map(|i| (i % 6 != 5).then(|| keys[(i * 7 + i / 3) % keys.len()]))
                    .collect();
                let k: ArrayRef = Arc::new(StringArray::from(k));
                let t: ArrayRef = Arc::new(Int64Array::from_iter_values(rows.map(|i| i as i64)));
                RecordBatch::try_from_iter([("k", k), ("tag", t)]).unwrap()
            })
            .collect()
    }

    fn rows(out: &[RecordBatch]) -> Vec<(Option<String>, i64)> {
        out.iter()
            .flat_map(|b| {
                let k = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
                let t = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
                (0..b.num_rows())
                    .map(|i| (k.is_valid(i).then(|| k.value(i).to_string()), t.value(i)))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn scratch(dir: &Path, budget_bytes: u64) -> Scratch {
        let pool = Arc::new(FixedPool::new(budget_bytes));
        Scratch::new(dir.to_path_buf(), pool, Arc::new(|_| {}))
    }

    fn files_in(dir: &Path) -> usize {
        std::fs::read_dir(dir).unwrap().count()
    }

    /// Every batch its own run (a budget of one byte), 70 of them (merged
    /// 32 at a time into longer runs first): the merge gives the order of
    /// a stable sort of the whole in memory, in both directions and both
    /// null placements; the runs' files are gone once it starts.
    #[test]
    fn runs_merged_give_the_order_of_a_stable_sort_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let batches = input(70);
        let schema = batches[0].schema();
        let keys = vec!["k".to_string()];
        for (descending, nulls_first) in
            [(false, false), (false, true), (true, false), (true, true)]
        {
            let order = SortOptions {
                descending,
                nulls_first,
            };
            let whole = Sorted::new(&schema, batches.clone(), &keys, order).unwrap();
            let want = rows(&whole.collect::<Result<Vec<_>>>().unwrap());
            let input: BatchIter = Box::new(batches.clone().into_iter().map(Ok));
            let mut sorted = sort(input, keys.clone(), order, scratch(dir.path(), 1));
            let first = sorted.next().unwrap().unwrap();
            assert_eq!(files_in(dir.path()), 0, "a run file left on disk");
            let mut out = vec![first];
            out.extend(sorted.map(Result::unwrap));
            assert_eq!(
                rows(&out),
                want,
                "descending {descending}, nulls first {nulls_first}"
            );
        }
    }

    /// Batches that differ in nullability alone (a first one declared
    /// non-null, later ones with nulls) sort under the all-nullable
    /// schema, in runs and in memory; batches that agree keep theirs.
    #[test]
    fn batches_differing_in_nullability_sort_under_a_nullable_schema() {
        use arrow_schema::{DataType, Field, Schema};
        let dir = tempfile::tempdir().unwrap();
        let strict = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("tag", DataType::Int64, false),
        ]));
        let batch = |schema: &SchemaRef, keys: Vec<Option<&str>>, first: i64| {
            let tags = Int64Array::from_iter_values(first..first + keys.len() as i64);
            RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(StringArray::from(keys)), Arc::new(tags)],
            )
            .unwrap()
        };
        let loose = nullable(&strict);
        let batches = vec![
            batch(&strict, vec![Some("b"), Some("a")], 0),
            batch(&loose, vec![None, Some("a"), Some("c")], 2),
            batch(&strict, vec![Some("a")], 5),
        ];
        let want = vec![
            (None, 2),
            (Some("a".to_string()), 1),
            (Some("a".to_string()), 3),
            (Some("a".to_string()), 5),
            (Some("b".to_string()), 0),
            (Some("c".to_string()), 4),
        ];
        let order = SortOptions {
            descending: false,
            nulls_first: true,
        };
        for budget_bytes in [1, 1 << 30] {
            let input: BatchIter = Box::new(batches.clone().into_iter().map(Ok));
            let out: Vec<RecordBatch> = sort(
                input,
                vec!["k".into()],
                order,
                scratch(dir.path(), budget_bytes),
            )
            .collect::<Result<_>>()
            .unwrap();
            assert_eq!(rows(&out), want, "budget {budget_bytes}");
            assert!(
                out.iter().all(|b| b.schema() == loose),
                "budget {budget_bytes}"
            );
        }
        let agreeing: BatchIter = Box::new(
            vec![
                batch(&strict, vec![Some("b")], 0),
                batch(&strict, vec![Some("a")], 1),
            ]
            .into_iter()
            .map(Ok),
        );
        let out: Vec<RecordBatch> = sort(agreeing, vec!["k".into()], order, scratch(dir.path(), 1))
            .collect::<Result<_>>()
            .unwrap();
        assert!(out.iter().all(|b| b.schema() == strict));
        assert_eq!(rows(&out), [(Some("a".into()), 1), (Some("b".into()), 0)]);
    }

    /// A merge emits chunks of at most `CHUNK_ROWS` rows, across runs.
    #[test]
    fn a_merge_emits_bounded_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let n = CHUNK_ROWS + CHUNK_ROWS / 2;
        let k: ArrayRef = Arc::new(Int64Array::from_iter_values((0..n as i64).rev()));
        let batch = RecordBatch::try_from_iter([("k", k)]).unwrap();
        let halves = vec![batch.slice(0, n / 2), batch.slice(n / 2, n - n / 2)];
        let input: BatchIter = Box::new(halves.into_iter().map(Ok));
        let out: Vec<RecordBatch> = sort(
            input,
            vec!["k".into()],
            SortOptions::default(),
            scratch(dir.path(), 1),
        )
        .collect::<Result<_>>()
        .unwrap();
        assert_eq!(
            out.iter().map(RecordBatch::num_rows).collect::<Vec<_>>(),
            [CHUNK_ROWS, n - CHUNK_ROWS]
        );
        let keys: Vec<i64> = out
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(keys, (0..n as i64).collect::<Vec<_>>());
    }

    /// Within its budget a range is sorted in memory: no file is written.
    #[test]
    fn a_range_within_its_budget_writes_no_run() {
        let dir = tempfile::tempdir().unwrap();
        let input: BatchIter = Box::new(input(9).into_iter().map(Ok));
        let mut sorted = sort(
            input,
            vec!["k".into()],
            SortOptions::default(),
            scratch(dir.path(), 1 << 30),
        );
        assert!(sorted.next().is_some());
        assert_eq!(files_in(dir.path()), 0);
    }

    /// No input batch: no output (its schema is unknown); empty batches
    /// only: one empty batch of their schema.
    #[test]
    fn no_rows_sort_to_nothing_or_one_empty_batch() {
        let dir = tempfile::tempdir().unwrap();
        let none: BatchIter = Box::new(std::iter::empty());
        assert_eq!(
            sort(
                none,
                vec!["k".into()],
                SortOptions::default(),
                scratch(dir.path(), 1)
            )
            .count(),
            0
        );
        let empty = input(1)[0].slice(0, 0);
        let only_empty: BatchIter = Box::new(std::iter::once(Ok(empty)));
        let out: Vec<RecordBatch> = sort(
            only_empty,
            vec!["k".into()],
            SortOptions::default(),
            scratch(dir.path(), 1),
        )
        .collect::<Result<_>>()
        .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].num_rows(), 0);
    }
}
