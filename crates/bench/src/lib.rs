//! The benchmark workloads of `docs/workloads.md` (W1 to W5, the store
//! and network benchmarks, the binary-files benchmark), their checks and the JSON line they print: what
//! `streambatch bench` runs, and what the examples and tests use to make
//! and check the main job's data. Not published: benchmarks stay out of the
//! library users link (`streambatch`), whose built-in operators
//! (`streambatch::ops`) the workloads use.

mod files;
mod g1;
mod j1;
mod net;
mod nodes;
mod s1;
mod s3;
mod shaped;
mod skip;
mod w5;
mod w6;

pub use files::{FilesApi, FilesExpected, PIECE_BYTES, binary_files, binary_files_input};
pub use g1::{G1_ROWS, g1};
pub use j1::j1;
pub use net::net_bench;
pub use s1::{s1, s1_cluster};
pub use s3::{S3Server, Throttle};
pub use shaped::{Shape, registry, w1_pipeline};
pub use skip::{SKIP_LOG, skip_test, under_ci};
pub use w5::{w5, w5_kill_one};
pub use w6::{
    W6A_IMAGES, W6A_STEP_MS, W6A_STORE_CAP, W6B_IMAGES, augmented, make_jpegs, w6_trainer, w6a, w6b,
};

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type};
use arrow_array::{Array, ArrayRef, BinaryArray, Int64Array, RecordBatch};
use arrow_buffer::{Buffer, OffsetBuffer};
use parquet::arrow::ArrowWriter;
use rand::{Rng, SeedableRng};
use streambatch::ops::{self, CpuEmbedder, EMBED_DIM, IMAGE_BYTES};
use streambatch::{
    Context, Error, JobStats, NodeConfig, OutputBuffer, Resources, Result, StoreStats, UdfError,
};

/// Writes `files` Parquet files of `rows_per_file` synthetic images (`id`,
/// `image`: 12,288 bytes) into `dir`, from a fixed seed.
pub fn make_images(dir: &Path, files: usize, rows_per_file: usize, seed: u64) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for f in 0..files {
        let first = (f * rows_per_file) as i64;
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(
            first..first + rows_per_file as i64,
        ));
        let mut pixels = vec![0u8; rows_per_file * IMAGE_BYTES];
        rng.fill(pixels.as_mut_slice());
        let offsets = OffsetBuffer::from_lengths(std::iter::repeat_n(IMAGE_BYTES, rows_per_file));
        let images: ArrayRef = Arc::new(BinaryArray::new(offsets, Buffer::from_vec(pixels), None));
        let batch = RecordBatch::try_from_iter([("id", ids), ("image", images)])
            .map_err(|e| Error::arrow("make_images", e))?;
        let path = dir.join(format!("images-{f:03}.parquet"));
        let tmp = dir.join(format!(".images-{f:03}.parquet.tmp"));
        let file = std::fs::File::create(&tmp).map_err(|e| Error::io("creating", &tmp, e))?;
        let bad = |e: parquet::errors::ParquetError| Error::BadFile {
            path: path.clone(),
            message: e.to_string(),
        };
        let mut writer = ArrowWriter::try_new(file, batch.schema(), None).map_err(bad)?;
        writer.write(&batch).map_err(bad)?;
        writer.close().map_err(bad)?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io("renaming into", &path, e))?;
    }
    Ok(())
}

/// The embeddings of `images` (each [`IMAGE_BYTES`] bytes) computed
/// directly, in f64, from the weights of [`ops::embedding_weights`]: the
/// reference the pipeline's output is checked against. The same
/// normalisation as [`ops::preprocess`], then one f64 matrix product.
///
/// # Panics
/// If an image is not [`IMAGE_BYTES`] bytes long or `weights` is not
/// 12,288 x 256.
pub fn reference_embeddings(images: &[&[u8]], weights: &[f32]) -> Vec<Vec<f32>> {
    let weights: Vec<f64> = weights.iter().map(|&w| w as f64).collect();
    reference_f64(images, &weights)
}

/// One image's reference embedding (see [`reference_embeddings`]).
pub fn reference_embedding(image: &[u8], weights: &[f32]) -> Vec<f32> {
    reference_embeddings(&[image], weights).remove(0)
}

fn reference_f64(images: &[&[u8]], weights: &[f64]) -> Vec<Vec<f32>> {
    assert_eq!(
        weights.len(),
        IMAGE_BYTES * EMBED_DIM,
        "12,288 x 256 weights"
    );
    let rows = images.len();
    let mut pixels = Vec::with_capacity(rows * IMAGE_BYTES);
    for image in images {
        assert_eq!(image.len(), IMAGE_BYTES, "an image of {IMAGE_BYTES} bytes");
        pixels.extend(
            image
                .iter()
                .map(|&x| ((x as f32 / 255.0 - 0.5) / 0.25) as f64),
        );
    }
    let mut out = vec![0f64; rows * EMBED_DIM];
    // SAFETY: the slices hold rows x 12,288, 12,288 x 256 and rows x 256
    // f64 in row-major order, matching the dimensions and strides given.
    unsafe {
        matrixmultiply::dgemm(
            rows,
            IMAGE_BYTES,
            EMBED_DIM,
            1.0,
            pixels.as_ptr(),
            IMAGE_BYTES as isize,
            1,
            weights.as_ptr(),
            EMBED_DIM as isize,
            1,
            0.0,
            out.as_mut_ptr(),
            EMBED_DIM as isize,
            1,
        );
    }
    out.chunks(EMBED_DIM)
        .map(|row| row.iter().map(|&x| x as f32).collect())
        .collect()
}

/// The result of one benchmark run: the JSON line `streambatch bench` prints.
#[derive(Debug, Clone)]
pub struct BenchResult {
    /// `w1`, `w3`, ...
    pub workload: String,
    /// The settings that vary between runs.
    pub config: String,
    /// Wall time.
    pub wall: Duration,
    /// Output rows.
    pub rows: u64,
    /// Partitions processed.
    pub partitions: u64,
    /// Ideal wall time, where the workload defines one.
    pub ideal: Option<Duration>,
    /// The store's high-water mark during the run.
    pub store_peak_bytes: u64,
    /// Bytes spilled.
    pub spilled_bytes: u64,
    /// Whether the output matched the expected one.
    pub correct: bool,
    /// Workload-specific figures, added to the JSON line.
    pub extra: Vec<(String, serde_json::Value)>,
    /// The timed job's stats (with its timeline, when the node recorded
    /// one).
    pub stats: JobStats,
}

impl BenchResult {
    /// A run's result: partitions are the source tasks (from the job's
    /// stats); the store's peak and spilled bytes come from the store the
    /// job ran on (`Context::store_stats`).
    pub fn new(
        workload: &str,
        config: String,
        wall: Duration,
        rows: u64,
        stats: &JobStats,
        store: &StoreStats,
        correct: bool,
    ) -> Self {
        Self {
            workload: workload.into(),
            config,
            wall,
            rows,
            partitions: stats.operators.first().map_or(0, |o| o.tasks),
            ideal: None,
            store_peak_bytes: store.peak_bytes,
            spilled_bytes: store.spilled_bytes,
            correct,
            extra: Vec::new(),
            stats: stats.clone(),
        }
    }

    /// The JSON line (keys of `docs/workloads.md`). `peak_rss_mib` is this
    /// process's VmHWM, read now: call it when the run has ended.
    pub fn to_json(&self) -> String {
        let wall = self.wall.as_secs_f64();
        let mut line = serde_json::json!({
            "workload": self.workload,
            "system": "streambatch",
            "config": self.config,
            "wall_s": round(wall),
            "rows": self.rows,
            "rows_per_s": round(self.rows as f64 / wall),
            "partitions_per_s": round(self.partitions as f64 / wall),
            "efficiency": self.ideal.map(|i| round(i.as_secs_f64() / wall)),
            "peak_rss_mib": peak_rss_mib(),
            "store_peak_bytes": self.store_peak_bytes,
            "spilled_bytes": self.spilled_bytes,
            "correct": self.correct,
        });
        for (key, value) in &self.extra {
            line[key] = value.clone();
        }
        line.to_string()
    }
}

pub(crate) fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The ids a job output, checked against `0..n`: a bitmap of those seen,
/// so that each must come exactly once (a count and a sum would take 5, 5
/// for 4, 6).
#[derive(Clone, Debug)]
pub struct IdSet {
    n: u64,
    seen: Vec<u64>,
    rows: u64,
    distinct: u64,
}

impl IdSet {
    /// Expecting each of `0..n` once.
    pub fn new(n: u64) -> Self {
        Self {
            n,
            seen: vec![0; n.div_ceil(64) as usize],
            rows: 0,
            distinct: 0,
        }
    }

    /// One output row's id.
    pub fn add(&mut self, id: i64) {
        self.rows += 1;
        if let Ok(i) = u64::try_from(id)
            && i < self.n
        {
            let (word, bit) = ((i / 64) as usize, 1u64 << (i % 64));
            if self.seen[word] & bit == 0 {
                self.seen[word] |= bit;
                self.distinct += 1;
            }
        }
    }

    /// Rows added.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Ids of `0..n` seen (at least once).
    pub fn distinct(&self) -> u64 {
        self.distinct
    }

    /// Every id of `0..n` came, and nothing else: as many rows as ids, each
    /// in range, none twice.
    pub fn each_once(&self) -> bool {
        self.rows == self.n && self.distinct == self.n
    }
}

/// Reads a W1-shaped job's output (an `id` column first), counting its rows
/// in `progress`, into an [`IdSet`] of `0..n`.
pub(crate) fn check_ids(
    ds: &streambatch::Dataset,
    progress: &mut ProgressLines,
    n: u64,
) -> Result<IdSet> {
    let mut ids = IdSet::new(n);
    for batch in ds.iter_batches()? {
        let batch = batch?;
        progress.add(batch.num_rows() as u64);
        let column = batch.column(0).as_primitive_opt::<Int64Type>();
        let column = column.ok_or_else(|| Error::Invalid("`id` is not Int64".into()))?;
        if column.null_count() > 0 {
            return Err(Error::Invalid(format!(
                "{} null ids in the output",
                column.null_count()
            )));
        }
        for id in column.values() {
            ids.add(*id);
        }
    }
    Ok(ids)
}

/// A checksum of all of `bytes`, cheap enough to run over every byte a
/// benchmark moves: the wrapping sum of its little-endian `u64` words, word
/// `i` weighted by `2i + 1` (a last partial word padded with zeros). Any
/// one changed word changes it (odd weights are invertible mod 2^64), and
/// so does moving a word. Trailing zero bytes do not: compare the lengths
/// too. `tools/bench/common.py` computes the same (`checksum`).
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    let mut sum = 0u64;
    let mut weight = 1u64;
    for word in &mut words {
        let word = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        sum = sum.wrapping_add(word.wrapping_mul(weight));
        weight = weight.wrapping_add(2);
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        sum = sum.wrapping_add(u64::from_le_bytes(last).wrapping_mul(weight));
    }
    sum
}

/// [`checksum`] of `len` bytes all equal to `byte`, without the bytes: the
/// `n` whole words weigh 1 + 3 + ... + (2n - 1) = n^2.
pub fn checksum_filled(byte: u8, len: usize) -> u64 {
    let n = (len / 8) as u64;
    let word = u64::from_le_bytes([byte; 8]);
    let rest = len % 8;
    let mut last = [0u8; 8];
    last[..rest].fill(byte);
    word.wrapping_mul(n.wrapping_mul(n))
        .wrapping_add(u64::from_le_bytes(last).wrapping_mul(2 * n + 1))
}

/// This process's peak resident memory in MiB (VmHWM), where Linux reports it.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(round(kib / 1024.0))
}

/// Progress of a workload that iterates its output: with `to_stdout`, a
/// `{"progress": {...}}` JSON line at most once a second, so that a harness
/// that stops a run at its time limit can report the rate it reached.
pub struct ProgressLines {
    to_stdout: bool,
    started: Instant,
    last: Instant,
    rows: u64,
    partitions: u64,
}

impl ProgressLines {
    /// Counts from now; prints only when `to_stdout`.
    pub fn new(to_stdout: bool) -> Self {
        let now = Instant::now();
        Self {
            to_stdout,
            started: now,
            last: now,
            rows: 0,
            partitions: 0,
        }
    }

    /// One output batch of `rows` rows arrived.
    pub fn add(&mut self, rows: u64) {
        self.rows += rows;
        self.partitions += 1;
        if self.to_stdout && self.last.elapsed() >= Duration::from_secs(1) {
            self.last = Instant::now();
            let line = serde_json::json!({"progress": {
                "rows": self.rows,
                "partitions": self.partitions,
                "elapsed_s": round(self.started.elapsed().as_secs_f64()),
            }});
            println!("{line}");
        }
    }

    /// Rows counted so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }
}

/// Bytes of one W1 row.
pub(crate) const W1_ROW_BYTES: usize = 10 << 20;

/// The byte W1's row `id` is filled with (never 0, so that filling it
/// writes every page, as a real producer's output would).
pub(crate) fn w1_byte(id: i64) -> u8 {
    (id % 255 + 1) as u8
}

/// Checks that each row of a W1-shaped batch (`id`, `data`) holds its id's
/// bytes, all of them: `row_bytes` long, and the [`checksum`] of a row
/// filled with [`w1_byte`] of its id. About a millisecond per 10 MiB row.
pub(crate) fn check_rows(b: &RecordBatch, row_bytes: usize) -> std::result::Result<(), UdfError> {
    let ids = b
        .column(0)
        .as_primitive_opt::<Int64Type>()
        .ok_or("`id` is not Int64")?;
    let data = b.column_by_name("data").ok_or("no column `data`")?;
    let data = data.as_binary_opt::<i32>().ok_or("`data` is not Binary")?;
    if data.len() != ids.len() {
        return Err("`id` and `data` differ in length".into());
    }
    for (id, row) in ids.values().iter().zip(data.iter()) {
        let row = row.ok_or("null row")?;
        let want = checksum_filled(w1_byte(*id), row_bytes);
        if row.len() != row_bytes || checksum(row) != want {
            return Err(format!("row {id} does not hold its bytes").into());
        }
    }
    Ok(())
}

/// One row of `row_bytes` per id, in a buffer allocated for this batch and
/// filled row by row with [`w1_byte`] of the row's id, as a producer's
/// output would be (a one-row batch is one row in a buffer of its own). The
/// buffer is freed with the batch's last reference.
pub(crate) fn filled_rows(
    ids: &ArrayRef,
    row_bytes: usize,
    place: Rows,
) -> std::result::Result<RecordBatch, UdfError> {
    let ids_i64 = ids
        .as_primitive_opt::<Int64Type>()
        .ok_or("`id` is not Int64")?;
    let rows = ids_i64.len();
    let bytes = match place {
        Rows::Output => {
            let first = ids_i64.values().first().map_or(0, |&id| w1_byte(id));
            let mut buffer = OutputBuffer::filled(rows * row_bytes, first);
            let chunks = buffer.as_mut_slice().chunks_mut(row_bytes.max(1));
            for (row, &id) in chunks.zip(ids_i64.values()).skip(1) {
                row.fill(w1_byte(id));
            }
            buffer.into_buffer()
        }
        Rows::Heap => {
            let mut bytes = Vec::with_capacity(rows * row_bytes);
            for &id in ids_i64.values() {
                bytes.resize(bytes.len() + row_bytes, w1_byte(id));
            }
            Buffer::from_vec(bytes)
        }
    };
    let offsets = OffsetBuffer::from_lengths(std::iter::repeat_n(row_bytes, rows));
    let data: ArrayRef = Arc::new(BinaryArray::new(offsets, bytes, None));
    Ok(RecordBatch::try_from_iter([
        ("id", ids.clone()),
        ("data", data),
    ])?)
}

/// Where [`filled_rows`] makes its bytes.
#[derive(Clone, Copy)]
pub(crate) enum Rows {
    /// On the heap: rows that the next operator of the task consumes.
    Heap,
    /// In the task's store ([`OutputBuffer`]): a stage's output, stored
    /// without a copy.
    Output,
}

/// Runs `make`, then sleeps what is left of `total`: a task that takes
/// `total` in all, its real work included, as the workloads' ideals assume
/// (the sleep stands for the rest of the stage's work).
pub(crate) fn taking<T>(total: Duration, make: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = make();
    if let Some(rest) = total.checked_sub(started.elapsed()) {
        std::thread::sleep(rest);
    }
    out
}

/// W1: the paper's heterogeneous pipeline under a memory cap, scaled 1/10.
/// 8 CPU and 4 GPU logical slots; `produce` (0.5 s per 5 rows, 10 MiB rows)
/// -> `consume` (0.05 s per row, a new 10 MiB row) -> `inference` (1 GPU,
/// 0.05 s per row; checks every byte of each row, outputs its id; a row
/// not holding its bytes fails the job). Correct when each id of 0..800
/// comes out exactly once.
pub fn w1(store_cap: u64, base: &NodeConfig, progress: &mut ProgressLines) -> Result<BenchResult> {
    let config = NodeConfig {
        cpus: 8.0,
        gpus: Some(4.0),
        store_capacity: store_cap,
        ..base.clone()
    };
    let ctx = Context::with_config(config)?;
    let started = Instant::now();
    let ds = ctx
        .range(800, 160)
        .flat_map_batches(
            // Each row in a buffer of its own, as a producer of rows makes them.
            |b: RecordBatch| {
                let ids = b.column(0);
                taking(Duration::from_millis(500), || {
                    (0..ids.len())
                        .map(|i| filled_rows(&ids.slice(i, 1), W1_ROW_BYTES, Rows::Heap))
                        .collect::<Vec<_>>()
                })
            },
            Resources::cpu(1.0).batch_rows(5),
        )
        .named("produce")
        .map_batches(
            |b: RecordBatch| {
                taking(Duration::from_millis(50), || {
                    filled_rows(b.column(0), W1_ROW_BYTES, Rows::Output)
                })
            },
            Resources::cpu(1.0).batch_rows(1),
        )
        .named("consume")
        .map_batches(
            |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                // The check of every byte is part of the stage's 0.05 s.
                taking(Duration::from_millis(50), || check_rows(&b, W1_ROW_BYTES))?;
                Ok(b.project(&[0])?)
            },
            Resources::gpu(1.0).batch_rows(1),
        )
        .named("inference");
    let ids = check_ids(&ds, progress, 800)?;
    let wall = started.elapsed();
    let stats = ds.stats().unwrap_or_default();
    let config = format!("store_cap={}", streambatch::format_bytes(store_cap));
    let rows = progress.rows();
    let correct = ids.each_once();
    Ok(BenchResult {
        ideal: Some(Duration::from_secs_f64((160.0 * 0.5 + 800.0 * 0.05) / 8.0)),
        ..BenchResult::new(
            "w1",
            config,
            wall,
            rows,
            &stats,
            &ctx.store_stats(),
            correct,
        )
    })
}

/// The untimed run W3 makes first, on the same node, before its timed
/// shape: rows and partitions (the peers' scripts warm up with the same).
pub const W3_WARM_UP: (u64, usize) = (1_000, 20);

/// W3: scheduling overhead. `rows` one-integer rows in `partitions`
/// partitions through a no-op `map_batches`, then count; timed after one
/// untimed run of [`W3_WARM_UP`]'s shape on the same node.
pub fn w3(rows: u64, partitions: usize, base: &NodeConfig) -> Result<BenchResult> {
    let ctx = Context::with_config(base.clone())?;
    let no_op = |ctx: &Context, rows: u64, partitions: usize| {
        let ds = ctx
            .range(rows, partitions)
            .map_batches(|b: RecordBatch| Ok::<_, UdfError>(b), Resources::cpu(1.0));
        ds.count().map(|count| (count as u64, ds))
    };
    no_op(&ctx, W3_WARM_UP.0, W3_WARM_UP.1)?;
    let started = Instant::now();
    let (count, ds) = no_op(&ctx, rows, partitions)?;
    let wall = started.elapsed();
    let stats = ds.stats().unwrap_or_default();
    let config = format!("rows={rows},partitions={partitions}");
    Ok(BenchResult::new(
        "w3",
        config,
        wall,
        count,
        &stats,
        &ctx.store_stats(),
        count == rows,
    ))
}

/// Bytes of one W2 row: 10 MiB and one byte, so that a row of the constant
/// byte `v` sums to `v` mod 256.
const W2_ROW_BYTES: usize = (10 << 20) + 1;

/// W2: memory-limited expansion with real bytes. 100 rows; stage A makes 10
/// rows of 10 MiB per row (10 GiB in all), one at a time; stage B (`no_fuse`,
/// so it runs as its own stage and every row crosses the store) reduces each
/// row to its byte sum mod 256 in about 20 ms. Count and check every sum.
pub fn w2(store_cap: u64, base: &NodeConfig, progress: &mut ProgressLines) -> Result<BenchResult> {
    let config = NodeConfig {
        store_capacity: store_cap,
        ..base.clone()
    };
    let ctx = Context::with_config(config)?;
    let started = Instant::now();
    let ds = ctx
        .range(100, 100)
        .flat_map_batches(
            |b: RecordBatch| {
                let id = b.column(0).as_primitive::<Int64Type>().value(0);
                (0..10i64).map(move |k| -> std::result::Result<RecordBatch, UdfError> {
                    let value = ((id * 10 + k) % 251) as u8;
                    let data: ArrayRef = Arc::new(BinaryArray::from_vec(vec![
                        vec![value; W2_ROW_BYTES].as_slice(),
                    ]));
                    let key: ArrayRef = Arc::new(Int64Array::from(vec![id * 10 + k]));
                    Ok(RecordBatch::try_from_iter([("key", key), ("data", data)])?)
                })
            },
            Resources::cpu(1.0).batch_rows(1),
        )
        .named("expand")
        .map_batches(
            |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                let data = b
                    .column_by_name("data")
                    .ok_or("no column `data`")?
                    .as_binary::<i32>();
                let sums: Int64Array = taking(Duration::from_millis(20), || {
                    data.iter()
                        .map(|d| d.map(|d| d.iter().map(|&x| x as i64).sum::<i64>() % 256))
                        .collect()
                });
                let key = b.column_by_name("key").ok_or("no column `key`")?.clone();
                Ok(RecordBatch::try_from_iter([
                    ("key", key),
                    ("sum", Arc::new(sums) as ArrayRef),
                ])?)
            },
            // Its own stage: fused with `expand`, a task would hold ten
            // 10 MiB rows and the stage's budget would cover both.
            Resources::cpu(1.0).no_fuse().batch_rows(1),
        )
        .named("reduce");
    let mut correct = true;
    for batch in ds.iter_batches()? {
        let batch = batch?;
        progress.add(batch.num_rows() as u64);
        let keys = batch.column(0).as_primitive::<Int64Type>();
        let sums = batch.column(1).as_primitive::<Int64Type>();
        correct &= keys
            .values()
            .iter()
            .zip(sums.values())
            .all(|(k, s)| *s == k % 251);
    }
    let wall = started.elapsed();
    let rows = progress.rows();
    let stats = ds.stats().unwrap_or_default();
    let config = format!("store_cap={}", streambatch::format_bytes(store_cap));
    Ok(BenchResult::new(
        "w2",
        config,
        wall,
        rows,
        &stats,
        &ctx.store_stats(),
        correct && rows == 1000,
    ))
}

/// The store's put and get against this machine's memcpy, in one run: put
/// of a `put_bytes` partition as a ratio to memcpy bandwidth, and get of a
/// 1 MiB and of a `big_bytes` partition (zero-copy: about equal).
pub fn store_bench(
    put_bytes: usize,
    big_bytes: usize,
    spill_dir: &Path,
) -> Result<serde_json::Value> {
    use streambatch_store::{ObjectStore, SharedStore, StoreConfig};
    let bad = |e: streambatch_store::StoreError| Error::store("store benchmark", e);
    let capacity = (2 * put_bytes + big_bytes + (64 << 20)) as u64;
    let store = SharedStore::open(StoreConfig::new(capacity, spill_dir)).map_err(bad)?;
    let bytes_batch = |len: usize| {
        let mut values = Vec::with_capacity(len);
        values.resize(len, 7u8);
        let offsets = OffsetBuffer::from_lengths([len]);
        let data: ArrayRef = Arc::new(BinaryArray::new(offsets, Buffer::from_vec(values), None));
        RecordBatch::try_from_iter([("data", data)]).expect("one column")
    };
    let best = |runs: usize, mut f: Box<dyn FnMut() -> Duration + '_>| {
        (0..runs).map(|_| f()).min().expect("runs > 0")
    };

    // memcpy between two touched buffers of the same size.
    let src = vec![1u8; put_bytes];
    let mut dst = vec![0u8; put_bytes];
    let memcpy = best(
        10,
        Box::new(|| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&dst);
            t.elapsed()
        }),
    );
    // put: the partition is encoded and copied into the (pre-faulted) segment.
    let batch = bytes_batch(put_bytes);
    drop(
        store
            .try_put(batch.clone())
            .map_err(|e| Error::store("store benchmark", e))?,
    ); // maps the segments
    let put = best(
        10,
        Box::new(|| {
            let t = Instant::now();
            let part = store.try_put(batch.clone()).expect("fits");
            let elapsed = t.elapsed();
            drop(part);
            elapsed
        }),
    );
    // get: 1 MiB and a large partition.
    let small = store
        .try_put(bytes_batch(1 << 20))
        .map_err(|e| Error::store("store benchmark", e))?;
    let large = store
        .try_put(bytes_batch(big_bytes))
        .map_err(|e| Error::store("store benchmark", e))?;
    let get = |part: &streambatch_store::PartitionRef| {
        best(
            20,
            Box::new(|| {
                let t = Instant::now();
                let b = part.get().expect("live");
                let elapsed = t.elapsed();
                std::hint::black_box(b);
                elapsed
            }),
        )
    };
    let (get_small, get_large) = (get(&small), get(&large));
    let gbps = |bytes: usize, d: Duration| bytes as f64 / d.as_secs_f64() / 1e9;
    Ok(serde_json::json!({
        "workload": "store",
        "system": "streambatch",
        "memcpy_gb_per_s": round(gbps(put_bytes, memcpy)),
        "put_gb_per_s": round(gbps(put_bytes, put)),
        "put_to_memcpy": round(memcpy.as_secs_f64() / put.as_secs_f64()),
        "put_bytes": put_bytes,
        "get_1mib_us": round(get_small.as_secs_f64() * 1e6),
        "get_large_us": round(get_large.as_secs_f64() * 1e6),
        "large_bytes": big_bytes,
        "get_large_to_small": round(get_large.as_secs_f64() / get_small.as_secs_f64()),
    }))
}

/// Where W4's embedding runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The CPU matmul ([`CpuEmbedder`]), 1 CPU slot per task.
    Cpu,
    /// The WGSL kernel ([`ops::gpu_embedder`]) on a GPU adapter, 1 GPU slot
    /// per task.
    Gpu,
}

/// Images in W4's input.
pub const W4_IMAGES: u64 = 2_000;

/// Makes W4's input (2,000 images in 20 files, seed 42) in `dir` if absent.
pub fn w4_input(dir: &Path) -> Result<()> {
    if dir.join("images-019.parquet").exists() {
        return Ok(());
    }
    make_images(dir, 20, 100, 42)
}

/// W4: batch inference on real files. `read_parquet` -> preprocess ->
/// 12,288 x 256 matmul in batches of 64 on `device` -> `write_parquet`; then
/// every embedding written is checked against [`reference_embeddings`].
/// `rows` is the rows written (and checked). Makes W4's input in `input`
/// if absent ([`w4_input`]).
pub fn w4(device: Device, input: &Path, output: &Path, base: &NodeConfig) -> Result<BenchResult> {
    w4_input(input)?;
    w4_on(device, input, output, base)
}

/// W4 on the images in `input`, whatever their number (`make_images`):
/// as [`w4`], which runs it on W4's 2,000 images.
pub fn w4_on(
    device: Device,
    input: &Path,
    output: &Path,
    base: &NodeConfig,
) -> Result<BenchResult> {
    // The GPU run measures the kernel on whatever adapter there is, a
    // software one (lavapipe) included: "auto" leaves that out by default.
    let config = NodeConfig {
        gpu_software: base.gpu_software || device == Device::Gpu,
        ..base.clone()
    };
    let ctx = Context::with_config(config)?;
    let started = Instant::now();
    let pixels = ctx
        .read_parquet(&input.display().to_string())?
        .map_batches(ops::preprocess, Resources::cpu(1.0))
        .named("preprocess");
    let (ds, kernel) = match device {
        Device::Cpu => {
            let embed =
                streambatch::Stateful::new("embed", || Ok::<_, UdfError>(CpuEmbedder::new(42)));
            let slots = ctx.config().cpus.ceil().max(1.0) as usize;
            (
                pixels.map_batches(embed, Resources::cpu(1.0).batch_rows(64).pool(1, slots)),
                None,
            )
        }
        Device::Gpu => {
            let kernel = ops::gpu_embedder(42)?;
            (
                pixels.map_batches(kernel.clone(), Resources::gpu(1.0).batch_rows(64)),
                Some(kernel),
            )
        }
    };
    ds.write_parquet(output)?;
    let wall = started.elapsed();
    let stats = ds.stats().unwrap_or_default();
    let store = ctx.store_stats();
    let check = check_embeddings(&ctx, input, output, 42)?;
    let mut extra = vec![
        (
            "device".to_string(),
            serde_json::json!(format!("{device:?}").to_lowercase()),
        ),
        ("images".to_string(), serde_json::json!(check.images)),
        (
            "rows_matching".to_string(),
            serde_json::json!(check.matching),
        ),
    ];
    if let Some(kernel) = kernel {
        let t = kernel.timings();
        extra.push(("gpu_adapter".into(), serde_json::json!(kernel.device())));
        extra.push((
            "gpu_upload_s".into(),
            serde_json::json!(round(t.upload.as_secs_f64())),
        ));
        extra.push((
            "gpu_compute_s".into(),
            serde_json::json!(round(t.compute.as_secs_f64())),
        ));
        extra.push((
            "gpu_readback_s".into(),
            serde_json::json!(round(t.readback.as_secs_f64())),
        ));
    }
    let config = format!("device={device:?}").to_lowercase();
    Ok(BenchResult {
        extra,
        ..BenchResult::new(
            "w4",
            config,
            wall,
            check.rows,
            &stats,
            &store,
            check.all_match(),
        )
    })
}

/// What [`check_embeddings`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbeddingCheck {
    /// Images in the input.
    pub images: u64,
    /// Embedding rows written (each one checked).
    pub rows: u64,
    /// Rows written that are the first for their image's id and equal the
    /// reference within 1e-4 of its largest value.
    pub matching: u64,
}

impl EmbeddingCheck {
    /// Every image has exactly one embedding, and each equals the reference.
    pub fn all_match(&self) -> bool {
        self.images > 0 && self.rows == self.images && self.matching == self.rows
    }
}

/// Whether an embedding `got` equals its reference `want`: as long, and
/// each element within 1e-4 of the reference's largest magnitude. Every
/// element is compared on its own with `<=`, so that a NaN (or infinite)
/// element, which no comparison holds for, never matches; a maximum folded
/// from 0 would skip NaN and let an all-NaN embedding pass.
pub fn embedding_matches(got: &[f32], want: &[f32]) -> bool {
    let scale = want.iter().map(|x| x.abs()).fold(0f32, f32::max).max(1e-6);
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(a, b)| (a - b).abs() / scale <= 1e-4)
}

/// Checks every embedding row in `output` against [`reference_embeddings`]
/// of its image in `input`, with the weights of `seed` ([`embedding_matches`]:
/// each element within 1e-4 of the reference's largest value; NaN and
/// infinities never match). A row whose id is not an image's, or repeats
/// one, does not match.
pub fn check_embeddings(
    ctx: &Context,
    input: &Path,
    output: &Path,
    seed: u64,
) -> Result<EmbeddingCheck> {
    let images = ctx.read_parquet(&input.display().to_string())?.collect()?;
    let embeddings = ctx.read_parquet(&output.display().to_string())?.collect()?;
    let mut by_id = std::collections::HashMap::new();
    for (b, batch) in images.iter().enumerate() {
        let ids = batch.column(0).as_primitive::<Int64Type>();
        for (r, id) in ids.values().iter().enumerate() {
            by_id.insert(*id, (b, r));
        }
    }
    let weights: Vec<f64> = ops::embedding_weights(seed)
        .iter()
        .map(|&w| w as f64)
        .collect();
    let mut seen = std::collections::HashSet::new();
    let mut check = EmbeddingCheck {
        images: images.iter().map(|b| b.num_rows() as u64).sum(),
        rows: 0,
        matching: 0,
    };
    for batch in &embeddings {
        let ids = batch.column(0).as_primitive::<Int64Type>();
        let list = batch
            .column_by_name("embedding")
            .and_then(|c| c.as_fixed_size_list_opt())
            .ok_or_else(|| Error::BadFile {
                path: output.to_path_buf(),
                message: "no fixed-size list column `embedding`".into(),
            })?;
        check.rows += ids.len() as u64;
        // Rows whose image is known, first of their id, of the right width.
        let mut candidates = Vec::new();
        for (r, id) in ids.values().iter().enumerate() {
            let Some(&(b, i)) = by_id.get(id) else {
                continue;
            };
            let image = images[b].column(1).as_binary::<i32>().value(i);
            if seen.insert(*id)
                && image.len() == IMAGE_BYTES
                && list.value_length() as usize == EMBED_DIM
            {
                candidates.push((r, image));
            }
        }
        for chunk in candidates.chunks(64) {
            let refs: Vec<&[u8]> = chunk.iter().map(|(_, image)| *image).collect();
            let want = reference_f64(&refs, &weights);
            for ((r, _), want) in chunk.iter().zip(&want) {
                let got = list.value(*r);
                let got = got.as_primitive::<Float32Type>().values();
                if embedding_matches(got, want) {
                    check.matching += 1;
                }
            }
        }
    }
    Ok(check)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_sees_a_changed_or_moved_byte() {
        let bytes: Vec<u8> = (0..1003u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let sum = checksum(&bytes);
        for at in [0, 7, 8, 500, 1000, 1002] {
            let mut wrong = bytes.clone();
            wrong[at] ^= 1;
            assert_ne!(checksum(&wrong), sum, "byte {at}");
        }
        let mut moved = bytes.clone();
        moved.swap(3, 11); // two different words
        assert_ne!(bytes[3], bytes[11]);
        assert_ne!(checksum(&moved), sum);
        assert_ne!(checksum(&bytes[..1000]), sum);
    }

    #[test]
    fn the_checksum_is_the_one_the_peers_compute() {
        // tools/bench/test_checks.py asserts the same value for common.checksum.
        let bytes: Vec<u8> = (0..=255u8).chain(*b"abc").collect();
        assert_eq!(checksum(&bytes), 0x3531_2d29_3e5d_1521);
    }

    #[test]
    fn a_filled_rows_checksum_is_its_bytes_checksum_and_differs_by_id() {
        for len in [0, 1, 7, 8, 9, 64, 1001, W1_ROW_BYTES] {
            for byte in [1u8, 7, 255] {
                assert_eq!(
                    checksum_filled(byte, len),
                    checksum(&vec![byte; len]),
                    "{len}"
                );
            }
        }
        // Every id's W1 row has a checksum of its own.
        let sums: std::collections::HashSet<u64> = (1..=255u8)
            .map(|b| checksum_filled(b, W1_ROW_BYTES))
            .collect();
        assert_eq!(sums.len(), 255);
    }

    #[test]
    fn ids_must_come_each_exactly_once() {
        let set = |ids: &[i64]| {
            let mut set = IdSet::new(8);
            ids.iter().for_each(|id| set.add(*id));
            set
        };
        assert!(set(&[3, 0, 1, 2, 4, 5, 6, 7]).each_once());
        // 5, 5 for 4, 6: as many rows, and the ids sum to 0 + ... + 7.
        let fives = [0i64, 1, 2, 3, 5, 5, 5, 7];
        assert_eq!(fives.iter().sum::<i64>(), (0..8).sum::<i64>());
        assert!(!set(&fives).each_once());
        assert!(!set(&[0, 1, 2, 3, 4, 5, 6]).each_once(), "one missing");
        assert!(!set(&[0, 1, 2, 3, 4, 5, 6, 7, 7]).each_once(), "one twice");
        assert!(!set(&[0, 1, 2, 3, 4, 5, 6, 8]).each_once(), "one foreign");
        assert!(!set(&[-1, 1, 2, 3, 4, 5, 6, 7]).each_once(), "one negative");
    }

    #[test]
    fn a_w1_row_with_one_wrong_byte_anywhere_fails_the_check() {
        let row_bytes = 4096 + 3;
        let ids: ArrayRef = Arc::new(Int64Array::from(vec![7, 300]));
        let batch = filled_rows(&ids, row_bytes, Rows::Heap).unwrap();
        check_rows(&batch, row_bytes).unwrap();
        let data = batch.column(1).as_binary::<i32>();
        for at in [0, 1, 2048, row_bytes - 1, row_bytes, 2 * row_bytes - 2] {
            let mut bytes = data.value_data().to_vec();
            bytes[at] = bytes[at].wrapping_add(1);
            let offsets = OffsetBuffer::from_lengths([row_bytes, row_bytes]);
            let wrong: ArrayRef =
                Arc::new(BinaryArray::new(offsets, Buffer::from_vec(bytes), None));
            let wrong = RecordBatch::try_from_iter([("id", ids.clone()), ("data", wrong)]).unwrap();
            let err = check_rows(&wrong, row_bytes).unwrap_err().to_string();
            assert!(err.contains("does not hold its bytes"), "byte {at}: {err}");
        }
        // A row of another id's bytes, and a row of the wrong length.
        let other: ArrayRef = Arc::new(Int64Array::from(vec![8, 300]));
        let data = batch.column(1).clone();
        let swapped = RecordBatch::try_from_iter([("id", other), ("data", data)]).unwrap();
        assert!(check_rows(&swapped, row_bytes).is_err());
        assert!(check_rows(&batch, row_bytes - 1).is_err());
    }

    #[test]
    fn an_embedding_with_a_nan_or_infinity_does_not_match() {
        let want = [1.0f32, -2.0, 0.5];
        assert!(embedding_matches(&want, &want));
        assert!(embedding_matches(&[1.0, -2.0, 0.500_01], &want));
        assert!(!embedding_matches(&[1.0, -2.0, 0.6], &want));
        assert!(!embedding_matches(&[f32::NAN; 3], &want));
        assert!(!embedding_matches(&[1.0, f32::NAN, 0.5], &want));
        assert!(!embedding_matches(&[1.0, -2.0, f32::INFINITY], &want));
        assert!(!embedding_matches(&[1.0, -2.0], &want));
    }
}
