//! A join reducer whose input outgrows its budget (a key on very many
//! rows, or too few reducers for the data): a Grace hash join. Past the
//! budget, the reducer cuts every batch of either side into [`BUCKETS`]
//! by a hash of its key (another seed than the exchange's, so that one
//! reducer's rows spread over all of them), and writes what it holds to
//! one scratch file per bucket and side whenever it holds more than the
//! budget. At the end of its input it joins bucket after bucket as
//! [`Join::run`] joins a whole input: equal keys fall in the same bucket,
//! so each bucket's pairs and unmatched rows are the whole join's. The
//! reducer then holds one bucket at a time, not its input. Within the
//! budget it joins in memory as before, with no file.

use std::hash::BuildHasher;
use std::sync::Arc;

use arrow_array::{RecordBatch, UInt32Array};
use arrow_row::{RowConverter, SortField};
use streambatch_core::batch_bytes;

use crate::error::{Error, Result};
use crate::exchange::cut::column_indices;
use crate::exchange::join::hash::{Join, SIDE_TAG};
use crate::exchange::reservation::MemoryReservation;
use crate::exchange::scratch::{Scratch, ScratchFile};
use crate::udf::BatchIter;

/// Buckets a spilling join cuts its input into: its input joins in
/// memory up to this many times its budget.
const BUCKETS: usize = 32;

/// `join` of `input` (batches of either side, tagged as the map side
/// tagged them): in memory while it stays within what `scratch`'s pool grants,
/// else bucket by bucket through scratch files in `scratch.dir`. Read
/// lazily: nothing happens until the first batch is asked for.
pub fn join(join: Arc<Join>, input: BatchIter, scratch: Scratch) -> BatchIter {
    let mut input = Some(input);
    let mut output: Option<BatchIter> = None;
    // Held with the output it accounts for, given back once that ends.
    let mut reservation = scratch.reservation();
    Box::new(std::iter::from_fn(move || {
        if let Some(input) = input.take() {
            match joined(&join, input, &scratch, &mut reservation) {
                Ok(joined) => output = Some(joined),
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

/// Reads `input` whole, in buckets on disk once it holds more than the
/// budget; then the join's output, as it is made.
fn joined(
    join: &Arc<Join>,
    input: BatchIter,
    scratch: &Scratch,
    reservation: &mut MemoryReservation,
) -> Result<BatchIter> {
    let mut held = Vec::new();
    let mut buckets: Option<Buckets> = None;
    for batch in input {
        let batch = batch?;
        if batch.num_rows() == 0 {
            continue;
        }
        let grown = reservation.try_grow(batch_bytes(&batch));
        match &mut buckets {
            Some(buckets) => buckets.add(&batch)?,
            None => held.push(batch),
        }
        if !grown {
            let buckets = match &mut buckets {
                Some(buckets) => buckets,
                None => buckets.insert(Buckets::new(join)?),
            };
            for batch in std::mem::take(&mut held) {
                buckets.add(&batch)?;
            }
            buckets.write(scratch)?;
            reservation.free();
        }
    }
    match buckets {
        None => Ok(Box::new(join.run(&held)?)),
        Some(buckets) => Ok(buckets.join(join.clone())),
    }
}

/// A join's input cut by key into buckets, each on disk and in memory.
struct Buckets {
    /// Each side's key columns, and their `arrow-row` converter (the two
    /// sides' key types are equal, so equal keys make equal rows).
    keys: [Vec<String>; 2],
    converter: RowConverter,
    files: Vec<Vec<ScratchFile>>,
    /// Per bucket, each side's rows not yet written.
    held: Vec<[Vec<RecordBatch>; 2]>,
}

impl Buckets {
    fn new(join: &Join) -> Result<Self> {
        let fields = join
            .left_on
            .iter()
            .map(|k| {
                let field = join
                    .left
                    .field_with_name(k)
                    .map_err(|e| Error::arrow("join", e))?;
                Ok(SortField::new(field.data_type().clone()))
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            keys: [join.left_on.clone(), join.right_on.clone()],
            converter: RowConverter::new(fields).map_err(|e| Error::arrow("join", e))?,
            files: (0..BUCKETS).map(|_| Vec::new()).collect(),
            held: (0..BUCKETS).map(|_| [Vec::new(), Vec::new()]).collect(),
        })
    }

    /// Cuts `batch` by its keys' bucket, held until the next write.
    fn add(&mut self, batch: &RecordBatch) -> Result<()> {
        let side = match batch.schema().metadata().get(SIDE_TAG).map(String::as_str) {
            Some("0") => 0,
            Some("1") => 1,
            _ => {
                return Err(Error::Invalid(
                    "join: a reducer got rows that are not marked as either input's".into(),
                ));
            }
        };
        let at = column_indices(batch, &self.keys[side])?;
        let columns: Vec<_> = at.iter().map(|&k| batch.column(k).clone()).collect();
        let rows = self
            .converter
            .convert_columns(&columns)
            .map_err(|e| Error::arrow("join", e))?;
        let state = foldhash::fast::FixedState::with_seed(0x6275_636b_6574);
        let mut rows_of: Vec<Vec<u32>> = vec![Vec::new(); BUCKETS];
        for (i, row) in rows.iter().enumerate() {
            rows_of[(state.hash_one(row.as_ref()) % BUCKETS as u64) as usize].push(i as u32);
        }
        for (bucket, rows) in rows_of.into_iter().enumerate() {
            if !rows.is_empty() {
                let part = arrow_select::take::take_record_batch(batch, &UInt32Array::from(rows))
                    .map_err(|e| Error::arrow("join", e))?;
                self.held[bucket][side].push(part);
            }
        }
        Ok(())
    }

    /// Writes what each bucket holds: a file per side (more only where a
    /// side's batches differ in nullability, a file per run of one schema).
    fn write(&mut self, scratch: &Scratch) -> Result<()> {
        for (held, files) in self.held.iter_mut().zip(&mut self.files) {
            for side in held.iter_mut() {
                let mut side = std::mem::take(side).into_iter().peekable();
                while let Some(first) = side.next() {
                    let schema = first.schema();
                    let mut same = vec![first];
                    while let Some(next) = side.next_if(|b| b.schema() == schema) {
                        same.push(next);
                    }
                    files.push(scratch.write("join-bucket", &schema, same.into_iter().map(Ok))?);
                }
            }
        }
        Ok(())
    }

    /// The join of each bucket in turn, made as it is read.
    fn join(self, join: Arc<Join>) -> BatchIter {
        Box::new(self.files.into_iter().zip(self.held).flat_map(
            move |(files, held)| -> BatchIter {
                match bucket(&join, files, held) {
                    Ok(probe) => probe,
                    Err(e) => Box::new(std::iter::once(Err(e))),
                }
            },
        ))
    }
}

/// One bucket's join: its files read back, with what it still holds.
fn bucket(join: &Join, files: Vec<ScratchFile>, held: [Vec<RecordBatch>; 2]) -> Result<BatchIter> {
    let mut batches = Vec::new();
    for file in files {
        for batch in file.read()? {
            batches.push(batch?);
        }
    }
    batches.extend(held.into_iter().flatten());
    if batches.is_empty() {
        return Ok(Box::new(std::iter::empty()));
    }
    Ok(Box::new(join.run(&batches)?))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use arrow_array::{ArrayRef, Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema, SchemaRef};

    use super::*;
    use crate::exchange::join::hash::JoinHow;
    use crate::exchange::reservation::FixedPool;

    fn schema(side: &str, tag: &str) -> SchemaRef {
        let metadata = HashMap::from([(SIDE_TAG.to_string(), tag.to_string())]);
        Arc::new(Schema::new_with_metadata(
            vec![
                Field::new("k", DataType::Int64, true),
                Field::new(side, DataType::Utf8, true),
            ],
            metadata,
        ))
    }

    /// `n` rows of one side: keys from `0..spread` with a hot key 7 on
    /// every third row and a null key on every eleventh.
    fn side(name: &str, tag: &str, n: i64, spread: i64) -> Vec<RecordBatch> {
        (0..n)
            .step_by(100)
            .map(|start| {
                let ids = start..(start + 100).min(n);
                let k: Vec<Option<i64>> = ids
                    .clone()
                    .map(|i| match (i % 3, i % 11) {
                        (_, 0) => None,
                        (0, _) => Some(7),
                        _ => Some((i * 7_919) % spread),
                    })
                    .collect();
                let v: Vec<String> = ids.map(|i| format!("{name}{i}")).collect();
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(Int64Array::from(k)),
                    Arc::new(StringArray::from(v)),
                ];
                RecordBatch::try_new(schema(name, tag), columns).unwrap()
            })
            .collect()
    }

    fn rows(batches: &[RecordBatch]) -> Vec<String> {
        let mut rows: Vec<String> = batches
            .iter()
            .flat_map(|b| crate::udf::row::batch_to_rows(b).unwrap())
            .map(|r| format!("{r:?}"))
            .collect();
        rows.sort();
        rows
    }

    /// Every kind of join through buckets on disk (a budget of 16 KiB,
    /// about six of the input's batches) gives the rows of the join in
    /// memory: pairs, a hot key's product, null keys and both sides'
    /// unmatched rows. Buckets not yet joined are on disk; once all are,
    /// no file is left.
    #[test]
    fn a_join_through_buckets_on_disk_gives_the_join_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let (left, right) = (side("l", "0", 1_500, 400), side("r", "1", 900, 600));
        let mut input = left.clone();
        input.extend(right.clone());
        for how in [
            JoinHow::Inner,
            JoinHow::Left,
            JoinHow::Right,
            JoinHow::Full,
            JoinHow::Semi,
            JoinHow::Anti,
        ] {
            let plan = Join::new(how, &["k"], &["k"], schema("l", "0"), schema("r", "1")).unwrap();
            let want: Vec<RecordBatch> = plan.run(&input).unwrap().collect::<Result<_>>().unwrap();
            let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let count = written.clone();
            let pool = Arc::new(FixedPool::new(16 << 10));
            let scratch = Scratch::new(
                dir.path().to_path_buf(),
                pool.clone(),
                Arc::new(move |bytes| {
                    count.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
                }),
            );
            let batches: BatchIter = Box::new(input.clone().into_iter().map(Ok));
            let mut out = join(Arc::new(plan), batches, scratch);
            let first = out.next().unwrap().unwrap();
            let on_disk = std::fs::read_dir(dir.path()).unwrap().count();
            assert!(on_disk > 0, "{how:?}: no bucket was written");
            let mut got = vec![first];
            got.extend(out.map(Result::unwrap));
            assert!(
                rows(&want).len() > 100,
                "{how:?}: too few rows to mean much"
            );
            assert_eq!(rows(&got), rows(&want), "{how:?}");
            assert_eq!(
                std::fs::read_dir(dir.path()).unwrap().count(),
                0,
                "{how:?}: files left"
            );
            assert_eq!(pool.used(), 0, "{how:?}: memory not given back");
        }
    }

    /// Within its budget a join writes no file; the same join spills when
    /// another reservation holds the pool it draws on.
    #[test]
    fn a_join_within_its_budget_writes_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut input = side("l", "0", 500, 50);
        input.extend(side("r", "1", 500, 50));
        let plan = Join::new(
            JoinHow::Inner,
            &["k"],
            &["k"],
            schema("l", "0"),
            schema("r", "1"),
        )
        .unwrap();
        let plan = Arc::new(plan);
        let pool = Arc::new(FixedPool::new(1 << 30));
        let scratch = Scratch::new(dir.path().to_path_buf(), pool.clone(), Arc::new(|_| {}));
        let batches: BatchIter = Box::new(input.clone().into_iter().map(Ok));
        let mut out = join(plan.clone(), batches, scratch.clone());
        assert!(out.next().is_some());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        drop(out);
        assert_eq!(pool.used(), 0, "an output dropped gives its memory back");

        let mut other = MemoryReservation::new(pool.clone());
        assert!(other.try_grow((1 << 30) - 1));
        let batches: BatchIter = Box::new(input.into_iter().map(Ok));
        let mut out = join(plan, batches, scratch);
        assert!(out.next().is_some());
        assert!(
            std::fs::read_dir(dir.path()).unwrap().count() > 0,
            "a full pool makes the join spill"
        );
    }
}
