//! Operators as batch-stream adapters. A task chains them over its input, so
//! a fused stage is one pull loop with no copies between operators.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{Field, Schema};
use streambatch_core::{Resources, StageOptions, TaskId, batch_bytes};

use crate::error::{Error, Result};
use crate::exchange::Reduce;
use crate::sink::{FileSink, write_part};
use crate::udf::expr::Expr;
use crate::udf::row::{Row, Value, batch_into_rows, batch_to_rows, rows_into_batch};
use crate::udf::{
    BatchFn, BatchGeneratorFn, BatchIter, BatchUdf, Predicate, RowFlatMapFn, RowMapFn,
};

/// Rows, bytes and time of one operator inside a fused stage, summed over
/// its tasks. Time is inclusive of the operators before it in the stage.
#[derive(Debug, Default)]
pub struct OpCounter {
    rows: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
}

impl OpCounter {
    /// (rows, bytes, inclusive time) so far.
    pub fn read(&self) -> (u64, u64, Duration) {
        (
            self.rows.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
            Duration::from_nanos(self.nanos.load(Ordering::Relaxed)),
        )
    }
}

/// Counts what flows out of an operator.
pub fn counted(input: BatchIter, counter: Arc<OpCounter>) -> BatchIter {
    let mut input = input;
    Box::new(std::iter::from_fn(move || {
        let started = Instant::now();
        let next = input.next();
        counter
            .nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if let Some(Ok(batch)) = &next {
            counter
                .rows
                .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
            counter
                .bytes
                .fetch_add(batch_bytes(batch), Ordering::Relaxed);
        }
        next
    }))
}

/// A batch function instance shared by the tasks a worker runs.
pub type SharedInstance = Arc<Mutex<Box<dyn BatchFn>>>;

/// What an operator does.
#[derive(Clone)]
pub enum OpKind {
    /// Row to row.
    Map(RowMapFn),
    /// Row to any number of rows.
    FlatMap(RowFlatMapFn),
    /// A batch to any number of batches, produced lazily.
    FlatMapBatches(BatchGeneratorFn),
    /// Keep matching rows.
    Filter(Predicate),
    /// Compute these columns only.
    Select(Vec<Expr>),
    /// Add or replace one column.
    WithColumn(String, Expr),
    /// A batch function.
    MapBatches(Arc<dyn BatchUdf>),
    /// Write each task's rows to a file in a staging directory.
    WriteFiles(FileSink),
    /// A reducer of an exchange: all of the task's input at once.
    Reduce(crate::exchange::Reduce),
    /// A broadcast join: each batch joined with the right input's rows.
    BroadcastJoin(Arc<crate::exchange::join::hash::Broadcast>),
}

/// One operator of a plan: what it does, its name and how it runs.
#[derive(Clone)]
pub struct OpSpec {
    /// The name shown in stats and errors.
    pub name: String,
    /// What it does.
    pub kind: OpKind,
    /// Resources, batch size, pool.
    pub options: StageOptions,
}

impl OpSpec {
    /// True when the operator keeps per-worker state.
    pub fn is_stateful(&self) -> bool {
        matches!(&self.kind, OpKind::MapBatches(udf) if udf.is_stateful())
    }
}

/// Returns a worker's instance of a stateful operator (by its position in the
/// plan), setting it up on first use.
pub type InstanceSource<'a> = dyn FnMut(usize, &Arc<dyn BatchUdf>, &Resources) -> Result<SharedInstance, crate::udf::UdfError>
    + 'a;

/// What a task tells its operators about itself, and how it obtains the
/// per-worker instances of stateful operators.
pub struct TaskEnv<'a> {
    /// The task.
    pub task: TaskId,
    /// Returns the worker's instance of a stateful operator (by its position
    /// in the plan), setting it up on first use.
    pub instance: &'a mut InstanceSource<'a>,
    /// Where a sort reducer whose range outgrows its budget writes sorted
    /// runs; `None`: it sorts its range in memory whatever its size.
    pub scratch: Option<crate::exchange::scratch::Scratch>,
    /// A sort reducer's range of keys: it keeps only those of its input's
    /// rows (see `key_range.rs`).
    pub range: Option<Arc<crate::exchange::sort::range::KeyRange>>,
}

/// Chains `op` (the `index`-th operator of the plan) over `input`.
pub fn apply(
    op: &OpSpec,
    index: usize,
    input: BatchIter,
    env: &mut TaskEnv<'_>,
) -> Result<BatchIter> {
    let name = op.name.clone();
    let udf_error = move |source: crate::udf::UdfError| Error::Udf {
        operator: name.clone(),
        source,
    };
    let name = op.name.clone();
    let arrow_error = move |e| Error::arrow(&name, e);
    Ok(match &op.kind {
        OpKind::Map(f) => {
            let f = f.clone();
            let on_err = udf_error.clone();
            Box::new(non_empty(input).map(move |b| {
                let rows = batch_into_rows(b?).map_err(|m| on_err(m.into()))?;
                let rows = rows
                    .into_iter()
                    .map(|r| f(r))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(&on_err)?;
                rows_into_batch(rows).map_err(|m| on_err(m.into()))
            }))
        }
        OpKind::FlatMap(f) => Box::new(FlatMap {
            input,
            f: f.clone(),
            pending: Vec::new().into_iter(),
            output: Vec::new().into_iter(),
            trim: false,
            on_err: Box::new(udf_error),
        }),
        OpKind::FlatMapBatches(f) => {
            let f = f.clone();
            let on_err = udf_error.clone();
            let input = match op.options.batch_rows {
                Some(rows) => Box::new(Rebatch::new(input, rows, arrow_error.clone())),
                None => non_empty(input),
            };
            Box::new(input.flat_map(move |b| -> BatchIter {
                match b {
                    Ok(b) => {
                        let on_err = on_err.clone();
                        Box::new(f(b).map(move |out| out.map_err(&on_err)))
                    }
                    Err(e) => Box::new(std::iter::once(Err(e))),
                }
            }))
        }
        OpKind::Filter(Predicate::Expr(e)) => {
            let e = e.clone();
            Box::new(non_empty(input).map(move |b| {
                let b = b?;
                let mask = e.evaluate_predicate(&b).map_err(&arrow_error)?;
                arrow_select::filter::filter_record_batch(&b, &mask).map_err(&arrow_error)
            }))
        }
        OpKind::Filter(Predicate::Rows(f)) => {
            let f = f.clone();
            Box::new(non_empty(input).map(move |b| {
                let b = b?;
                let rows = batch_to_rows(&b).map_err(|m| udf_error(m.into()))?;
                let mask: BooleanArray = rows.iter().map(|r| Some(f(r))).collect();
                arrow_select::filter::filter_record_batch(&b, &mask).map_err(&arrow_error)
            }))
        }
        OpKind::Select(exprs) => {
            let exprs = exprs.clone();
            Box::new(input.map(move |b| {
                let b = b?;
                let columns = exprs
                    .iter()
                    .map(|e| e.evaluate(&b))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(&arrow_error)?;
                let fields: Vec<Field> = exprs
                    .iter()
                    .zip(&columns)
                    .map(|(e, c)| Field::new(e.output_name(), c.data_type().clone(), true))
                    .collect();
                RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(&arrow_error)
            }))
        }
        OpKind::WithColumn(name, expr) => {
            let (name, expr) = (name.clone(), expr.clone());
            Box::new(input.map(move |b| {
                let b = b?;
                let column = expr.evaluate(&b).map_err(&arrow_error)?;
                with_column(&b, &name, column).map_err(&arrow_error)
            }))
        }
        OpKind::MapBatches(udf) => {
            let instance = if udf.is_stateful() {
                (env.instance)(index, udf, &op.options.resources).map_err(&udf_error)?
            } else {
                let resources = &op.options.resources;
                Arc::new(Mutex::new(
                    udf.instantiate_for(resources).map_err(&udf_error)?,
                ))
            };
            let input = match op.options.batch_rows {
                Some(rows) => Box::new(Rebatch::new(input, rows, arrow_error.clone())),
                None => non_empty(input),
            };
            Box::new(input.flat_map(move |b| {
                let out = b.and_then(|b| {
                    let mut f = instance.lock().unwrap_or_else(|p| p.into_inner());
                    f.call_many(b).map_err(&udf_error)
                });
                let out: Vec<Result<RecordBatch>> = match out {
                    Ok(batches) => batches.into_iter().map(Ok).collect(),
                    Err(e) => vec![Err(e)],
                };
                out
            }))
        }
        OpKind::BroadcastJoin(broadcast) => broadcast.stream(input),
        // Sort and join reducers write to scratch files rather than hold
        // an input that outgrows their budget.
        OpKind::Reduce(Reduce::Sort { keys, order }) if env.range.is_some() => {
            let range = env.range.take().expect("matched above");
            let input = crate::exchange::sort::range::within(input, keys.clone(), *order, range);
            apply(op, index, input, env)?
        }
        OpKind::Reduce(Reduce::Sort { keys, order }) if env.scratch.is_some() => {
            let scratch = env.scratch.clone().expect("matched above");
            crate::exchange::sort::runs::sort(input, keys.clone(), *order, scratch)
        }
        OpKind::Reduce(Reduce::Join(join)) if env.scratch.is_some() => {
            let scratch = env.scratch.clone().expect("matched above");
            crate::exchange::join::spill::join(Arc::new(join.clone()), input, scratch)
        }
        OpKind::Reduce(reduce) => {
            let reduce = reduce.clone();
            let mut input = Some(input);
            Box::new(
                std::iter::from_fn(move || {
                    let batches: Vec<RecordBatch> = match input.take()?.collect() {
                        Ok(batches) => batches,
                        Err(e) => return Some(Err(e)),
                    };
                    let schema = batches.first()?.schema();
                    Some(reduce.stream_all(&schema, &batches))
                })
                .flat_map(|out| match out {
                    Ok(batches) => batches,
                    Err(e) => Box::new(std::iter::once(Err(e))),
                }),
            )
        }
        OpKind::WriteFiles(sink) => {
            let sink = sink.clone();
            let task = env.task;
            let mut input = Some(input);
            Box::new(std::iter::from_fn(move || {
                let input = input.take()?;
                Some(write_part(&sink, task, input).map(|written| {
                    let (paths, rows): (Vec<String>, Vec<i64>) = written
                        .into_iter()
                        .map(|(p, r)| (p.display().to_string(), r as i64))
                        .unzip();
                    let paths: ArrayRef = Arc::new(StringArray::from(paths));
                    let rows: ArrayRef = Arc::new(Int64Array::from(rows));
                    RecordBatch::try_from_iter([("path", paths), ("rows", rows)])
                        .expect("two equal columns")
                }))
            }))
        }
    })
}

fn non_empty(input: BatchIter) -> BatchIter {
    Box::new(input.filter(|b| b.as_ref().map_or(true, |b| b.num_rows() > 0)))
}

fn with_column(
    batch: &RecordBatch,
    name: &str,
    column: ArrayRef,
) -> Result<RecordBatch, arrow_schema::ArrowError> {
    let schema = batch.schema();
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut columns = batch.columns().to_vec();
    let field = Field::new(name, column.data_type().clone(), true);
    match schema.index_of(name) {
        Ok(i) => {
            fields[i] = field;
            columns[i] = column;
        }
        Err(_) => {
            fields.push(field);
            columns.push(column);
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// A batch of `flat_map` output is emitted once this many bytes (or
/// rows) gather, even from one input row's output: a large expansion (a
/// file cut into a row per piece) streams out in batches of about this
/// size, each a partition by itself (the partitioner's `alone_bytes`),
/// instead of building up in memory as one batch.
const FLAT_MAP_CHUNK_BYTES: usize = 1 << 20;
/// Rows of a batch of `flat_map` output at most.
const FLAT_MAP_CHUNK_ROWS: usize = 4096;

struct FlatMap {
    input: BatchIter,
    f: RowFlatMapFn,
    /// The input batch's rows not yet given to `f`, each moved into it.
    pending: std::vec::IntoIter<Row>,
    /// The rows `f` returned for the last input row not yet in a batch,
    /// each moved into one (and freed with it) as it is emitted.
    output: std::vec::IntoIter<Row>,
    /// True while `output` is a large expansion: once it is emitted, the
    /// memory its rows held goes back to the system.
    trim: bool,
    on_err: Box<dyn Fn(crate::udf::UdfError) -> Error + Send>,
}

impl Iterator for FlatMap {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut out = Vec::new();
        let mut bytes = 0;
        loop {
            if self.output.len() == 0 && std::mem::take(&mut self.trim) {
                return_freed_memory();
            }
            if let Some(row) = self.output.next() {
                bytes += row_bytes(&row);
                out.push(row);
                if bytes >= FLAT_MAP_CHUNK_BYTES || out.len() >= FLAT_MAP_CHUNK_ROWS {
                    break;
                }
                continue;
            }
            let Some(row) = self.pending.next() else {
                if !out.is_empty() {
                    break;
                }
                match self.input.next()? {
                    Ok(b) => match batch_into_rows(b) {
                        Ok(rows) => self.pending = rows.into_iter(),
                        Err(m) => return Some(Err((self.on_err)(m.into()))),
                    },
                    Err(e) => return Some(Err(e)),
                }
                continue;
            };
            match (self.f)(row) {
                Ok(rows) => {
                    self.trim = rows.iter().map(row_bytes).sum::<usize>() >= TRIM_AFTER_BYTES;
                    self.output = rows.into_iter();
                }
                Err(e) => return Some(Err((self.on_err)(e))),
            }
        }
        Some(rows_into_batch(out).map_err(|m| (self.on_err)(m.into())))
    }
}

/// An expansion of at least this many bytes returns its memory to the
/// system once emitted ([`return_freed_memory`]).
const TRIM_AFTER_BYTES: usize = 32 << 20;

/// Hands the allocator's free memory back to the system. A large
/// `flat_map` expansion is thousands of allocations (a file cut into
/// 64 KiB pieces) freed while batches are built among them; glibc keeps
/// such memory in the arena of the worker thread that freed it, resident,
/// and the next file, cut on another worker, takes fresh memory beside it
/// (the process's peak grew by a file or more). `malloc_trim` releases the
/// free pages of every arena; it costs a walk of the arenas, once per
/// expansion of [`TRIM_AFTER_BYTES`] or more.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages to the kernel; it has no
    // preconditions and leaves every allocation in place.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn row_bytes(row: &Row) -> usize {
    row.values()
        .iter()
        .map(|v| match v {
            Value::Str(s) => s.len() + 8,
            Value::Bytes(b) => b.len() + 8,
            _ => 8,
        })
        .sum()
}

/// Cuts and joins batches into batches of exactly `rows` rows (the last may
/// be shorter), for operators that declare `batch_rows`.
struct Rebatch<E> {
    input: BatchIter,
    rows: usize,
    buffer: Vec<RecordBatch>,
    buffered: usize,
    done: bool,
    on_err: E,
}

impl<E> Rebatch<E> {
    fn new(input: BatchIter, rows: usize, on_err: E) -> Self {
        Self {
            input,
            rows,
            buffer: Vec::new(),
            buffered: 0,
            done: false,
            on_err,
        }
    }
}

impl<E: Fn(arrow_schema::ArrowError) -> Error> Iterator for Rebatch<E> {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.buffered < self.rows && !self.done {
            match self.input.next() {
                Some(Ok(b)) if b.num_rows() > 0 => {
                    self.buffered += b.num_rows();
                    self.buffer.push(b);
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Some(Err(e)),
                None => self.done = true,
            }
        }
        if self.buffered == 0 {
            return None;
        }
        let take = self.rows.min(self.buffered);
        let schema = self.buffer[0].schema();
        // Take whole batches while they fit, then a slice of the next one.
        let mut parts = Vec::new();
        let mut need = take;
        while need > 0 {
            let b = self.buffer.remove(0);
            if b.num_rows() <= need {
                need -= b.num_rows();
                parts.push(b);
            } else {
                parts.push(b.slice(0, need));
                self.buffer.insert(0, b.slice(need, b.num_rows() - need));
                need = 0;
            }
        }
        self.buffered -= take;
        if parts.len() == 1 {
            return parts.pop().map(Ok);
        }
        Some(arrow_select::concat::concat_batches(&schema, &parts).map_err(&self.on_err))
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;

    use super::*;
    use crate::logical::source::SourceSplit;

    const PIECE: usize = 64 << 10;

    fn byte(i: usize) -> u8 {
        (i % 251) as u8
    }

    /// Runs a `flat_map` that cuts `bytes` into a row per 64 KiB piece
    /// (`path`, `offset`, `bytes`) over a one-row batch, as a task would.
    fn cut_into_pieces(input: RecordBatch) -> Vec<RecordBatch> {
        let cut: RowFlatMapFn = Arc::new(|row: Row| {
            let path = row.str("path").ok_or("no path")?.to_string();
            let data = row.bytes("bytes").ok_or("no bytes")?;
            Ok(data
                .chunks(PIECE)
                .enumerate()
                .map(|(i, piece)| {
                    Row::new()
                        .with("path", path.as_str())
                        .with("offset", (i * PIECE) as i64)
                        .with("bytes", piece.to_vec())
                })
                .collect())
        });
        let op = OpSpec {
            name: "flat_map".into(),
            kind: OpKind::FlatMap(cut),
            options: StageOptions::default(),
        };
        let mut no_instances = |_: usize,
                                _: &Arc<dyn BatchUdf>,
                                _: &Resources|
         -> Result<SharedInstance, crate::udf::UdfError> {
            Err("no stateful operator here".into())
        };
        let mut env = TaskEnv {
            task: TaskId(1),
            instance: &mut no_instances,
            scratch: None,
            range: None,
        };
        let input: BatchIter = Box::new(std::iter::once(Ok(input)));
        apply(&op, 0, input, &mut env)
            .expect("a flat_map applies")
            .collect::<Result<Vec<_>>>()
            .expect("the cut succeeds")
    }

    #[test]
    fn a_large_row_expands_into_several_batches_not_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("large.bin");
        // 5 MiB and 3 bytes: 80 whole pieces and a short one.
        let size = 5 * (1 << 20) + 3;
        std::fs::write(&path, (0..size).map(byte).collect::<Vec<u8>>()).unwrap();
        let split = SourceSplit::BinaryFiles {
            paths: Arc::new(vec![path.clone()]),
            largest: size as u64,
        };
        let file = split.open().unwrap().next().unwrap().unwrap();
        let batches = cut_into_pieces(file);

        // Batches of a mebibyte (16 pieces) as the output is made, not one
        // batch of the whole file.
        let rows: Vec<usize> = batches.iter().map(RecordBatch::num_rows).collect();
        assert_eq!(rows, [16, 16, 16, 16, 16, 1]);
        for b in &batches {
            assert!(b.get_array_memory_size() < 2 * FLAT_MAP_CHUNK_BYTES);
        }
        // Every piece, in order, with its path, offset and bytes.
        let name = path.display().to_string();
        let mut at = 0;
        for b in &batches {
            let paths = b.column_by_name("path").unwrap().as_string::<i32>();
            let offsets = b
                .column_by_name("offset")
                .unwrap()
                .as_primitive::<Int64Type>();
            let pieces = b.column_by_name("bytes").unwrap().as_binary::<i32>();
            for i in 0..b.num_rows() {
                assert_eq!(paths.value(i), name);
                assert_eq!(offsets.value(i), at as i64);
                let expected: Vec<u8> = (at..size.min(at + PIECE)).map(byte).collect();
                assert_eq!(pieces.value(i), &expected[..], "the piece at {at}");
                at += expected.len();
            }
        }
        assert_eq!(at, size);
    }

    #[test]
    fn a_small_row_expands_into_one_batch() {
        let input = RecordBatch::try_from_iter([
            ("path", Arc::new(StringArray::from(vec!["p"])) as ArrayRef),
            (
                "bytes",
                Arc::new(arrow_array::BinaryArray::from(vec![&[7u8; 3][..]])) as ArrayRef,
            ),
        ])
        .unwrap();
        // One input row of 3 bytes gives one piece: one batch of one row.
        let batches = cut_into_pieces(input);
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].num_rows(), 1);
        let pieces = batches[0]
            .column_by_name("bytes")
            .unwrap()
            .as_binary::<i32>();
        assert_eq!(pieces.value(0), [7, 7, 7]);
    }
}
