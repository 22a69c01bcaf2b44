//! The benchmark workloads of `docs/workloads.md` (W1 to W4) and
//! the main job's operators, shared by the `streambatch bench` command, the
//! `batch_inference` example and the tests.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::Float32Type;
use arrow_array::{
    Array, ArrayRef, BinaryArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
};
use arrow_buffer::{Buffer, OffsetBuffer};
use arrow_schema::{DataType, Field};
use parquet::arrow::ArrowWriter;
use rand::{Rng, SeedableRng};

use crate::{BatchFn, Context, Error, NodeConfig, Resources, Result, UdfError};

/// Side of the synthetic square images.
pub const IMAGE_SIDE: usize = 64;
/// Bytes per image: 64 x 64 x 3 uint8.
pub const IMAGE_BYTES: usize = IMAGE_SIDE * IMAGE_SIDE * 3;
/// Width of the embeddings.
pub const EMBED_DIM: usize = 256;

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

/// Image bytes to normalised f32 pixels: `id` and `pixels`, a fixed-size list
/// of 12,288 floats, `(x / 255 - 0.5) / 0.25`.
pub fn preprocess(batch: RecordBatch) -> std::result::Result<RecordBatch, UdfError> {
    let ids = batch.column_by_name("id").ok_or("no column `id`")?.clone();
    let images = batch
        .column_by_name("image")
        .ok_or("no column `image`")?
        .as_binary_opt::<i32>()
        .ok_or("`image` is not binary")?;
    let mut pixels = Vec::with_capacity(images.len() * IMAGE_BYTES);
    for image in images.iter() {
        let image = image.ok_or("null image")?;
        if image.len() != IMAGE_BYTES {
            return Err(format!("image of {} bytes, expected {IMAGE_BYTES}", image.len()).into());
        }
        pixels.extend(image.iter().map(|&x| (x as f32 / 255.0 - 0.5) / 0.25));
    }
    let list = fixed_list(pixels, IMAGE_BYTES)?;
    Ok(RecordBatch::try_from_iter([("id", ids), ("pixels", list)])?)
}

fn fixed_list(values: Vec<f32>, width: usize) -> std::result::Result<ArrayRef, UdfError> {
    let field = Arc::new(Field::new("item", DataType::Float32, false));
    Ok(Arc::new(FixedSizeListArray::try_new(
        field,
        width as i32,
        Arc::new(Float32Array::from(values)),
        None,
    )?))
}

/// The fixed 12,288 x 256 "model" matrix, from a seed.
pub fn embedding_weights(seed: u64) -> Vec<f32> {
    seeded_uniform(seed, IMAGE_BYTES * EMBED_DIM, -0.01, 0.01)
}

/// `len` floats drawn uniformly from `low..high` with a seeded generator.
pub fn seeded_uniform(seed: u64, len: usize, low: f32, high: f32) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(low..high)).collect()
}

/// The embedding model on the CPU: pixels times the weight matrix, with a
/// cache-blocked SIMD matrix product (`matrixmultiply`). Its set-up (making
/// the weights) runs once per worker.
pub struct CpuEmbedder {
    weights: Vec<f32>,
}

impl CpuEmbedder {
    /// Loads the model (here: generates the seeded weights).
    pub fn new(seed: u64) -> Self {
        Self {
            weights: embedding_weights(seed),
        }
    }
}

impl BatchFn for CpuEmbedder {
    fn call(&mut self, batch: RecordBatch) -> std::result::Result<RecordBatch, UdfError> {
        let ids = batch.column_by_name("id").ok_or("no column `id`")?.clone();
        let pixels = batch
            .column_by_name("pixels")
            .ok_or("no column `pixels`")?
            .as_fixed_size_list_opt()
            .ok_or("`pixels` is not a fixed-size list")?;
        let rows = pixels.len();
        let input = pixels
            .values()
            .as_primitive_opt::<Float32Type>()
            .ok_or("`pixels` items are not f32")?;
        let start = if rows == 0 {
            0
        } else {
            pixels.value_offset_at(0)
        };
        let input = &input.values()[start..][..rows * IMAGE_BYTES];
        let mut out = vec![0f32; rows * EMBED_DIM];
        // SAFETY: the slices hold rows x 12,288, 12,288 x 256 and rows x 256
        // floats in row-major order, matching the dimensions and strides given.
        unsafe {
            matrixmultiply::sgemm(
                rows,
                IMAGE_BYTES,
                EMBED_DIM,
                1.0,
                input.as_ptr(),
                IMAGE_BYTES as isize,
                1,
                self.weights.as_ptr(),
                EMBED_DIM as isize,
                1,
                0.0,
                out.as_mut_ptr(),
                EMBED_DIM as isize,
                1,
            );
        }
        Ok(RecordBatch::try_from_iter([
            ("id", ids),
            ("embedding", fixed_list(out, EMBED_DIM)?),
        ])?)
    }
}

/// One image's embedding computed directly, in f64: the reference the
/// pipeline's output is checked against.
pub fn reference_embedding(image: &[u8], weights: &[f32]) -> Vec<f32> {
    let pixels: Vec<f64> = image
        .iter()
        .map(|&x| ((x as f32 / 255.0 - 0.5) / 0.25) as f64)
        .collect();
    (0..EMBED_DIM)
        .map(|j| {
            pixels
                .iter()
                .enumerate()
                .map(|(i, p)| p * weights[i * EMBED_DIM + j] as f64)
                .sum::<f64>() as f32
        })
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
}

impl BenchResult {
    /// A run's result: partitions are the source tasks; store figures come
    /// from the job's stats.
    pub fn new(
        workload: &str,
        config: String,
        wall: Duration,
        rows: u64,
        stats: &crate::JobStats,
        correct: bool,
    ) -> Self {
        Self {
            workload: workload.into(),
            config,
            wall,
            rows,
            partitions: stats.operators.first().map_or(0, |o| o.tasks),
            ideal: None,
            store_peak_bytes: stats.peak_store_bytes,
            spilled_bytes: stats.spilled_bytes,
            correct,
            extra: Vec::new(),
        }
    }

    /// The JSON line (keys of `docs/workloads.md`).
    pub fn to_json(&self) -> String {
        let wall = self.wall.as_secs_f64();
        let mut line = serde_json::json!({
            "workload": self.workload,
            "system": "streambatch",
            "config": self.config,
            "wall_s": round(wall),
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

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
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
const W1_ROW_BYTES: usize = 10 << 20;

/// Rows of `row_bytes` zero bytes, one per id. The bytes are slices of one
/// zeroed buffer made (and touched) once per process, so that the workload
/// measures the pipeline, not the allocator's first touch of fresh pages.
fn zero_rows(ids: &ArrayRef, row_bytes: usize) -> std::result::Result<RecordBatch, UdfError> {
    static ZEROS: std::sync::OnceLock<Buffer> = std::sync::OnceLock::new();
    const MAX_BYTES: usize = 64 << 20;
    let rows = ids.len();
    if rows * row_bytes > MAX_BYTES {
        return Err(format!(
            "{rows} rows of {row_bytes} bytes exceed the {MAX_BYTES}-byte zero buffer"
        )
        .into());
    }
    let zeros = ZEROS.get_or_init(|| {
        // Written, not calloc'd: its pages are real memory, not the shared zero page.
        let mut bytes = vec![0u8; MAX_BYTES];
        for page in bytes.chunks_mut(4096) {
            page[0] = std::hint::black_box(0);
        }
        Buffer::from_vec(bytes)
    });
    let offsets = OffsetBuffer::from_lengths(std::iter::repeat_n(row_bytes, rows));
    let data: ArrayRef = Arc::new(BinaryArray::new(
        offsets,
        zeros.slice_with_length(0, rows * row_bytes),
        None,
    ));
    Ok(RecordBatch::try_from_iter([
        ("id", ids.clone()),
        ("data", data),
    ])?)
}

/// W1: the paper's heterogeneous pipeline under a memory cap, scaled 1/10.
/// 8 CPU and 4 GPU logical slots; `produce` (0.5 s per 5 rows, 10 MiB rows)
/// -> `consume` (0.05 s per row) -> `inference` (1 GPU, 0.05 s per row).
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
        .map_batches(
            |b: RecordBatch| {
                std::thread::sleep(Duration::from_millis(500));
                zero_rows(b.column(0), W1_ROW_BYTES)
            },
            Resources::cpu(1.0).batch_rows(5),
        )
        .named("produce")
        .map_batches(
            |b: RecordBatch| {
                std::thread::sleep(Duration::from_millis(50));
                zero_rows(b.column(0), W1_ROW_BYTES)
            },
            Resources::cpu(1.0).batch_rows(1),
        )
        .named("consume")
        .map_batches(
            |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                std::thread::sleep(Duration::from_millis(50));
                Ok(b.project(&[0])?)
            },
            Resources::gpu(1.0).batch_rows(1),
        )
        .named("inference");
    let mut id_sum = 0i64;
    let mut stream = ds.iter_batches()?;
    for batch in stream.by_ref() {
        let batch = batch?;
        progress.add(batch.num_rows() as u64);
        id_sum += batch
            .column(0)
            .as_primitive::<arrow_array::types::Int64Type>()
            .values()
            .iter()
            .sum::<i64>();
    }
    let wall = started.elapsed();
    let stats = ds.stats().unwrap_or_default();
    let config = format!("store_cap={}", crate::format_bytes(store_cap));
    let rows = progress.rows();
    let correct = rows == 800 && id_sum == (0..800).sum::<i64>();
    Ok(BenchResult {
        ideal: Some(Duration::from_secs_f64((160.0 * 0.5 + 800.0 * 0.05) / 8.0)),
        ..BenchResult::new("w1", config, wall, rows, &stats, correct)
    })
}

/// W3: scheduling overhead. `rows` one-integer rows in `partitions`
/// partitions through a no-op `map_batches`, then count.
pub fn w3(rows: u64, partitions: usize, base: &NodeConfig) -> Result<BenchResult> {
    let ctx = Context::with_config(base.clone())?;
    let started = Instant::now();
    let ds = ctx
        .range(rows, partitions)
        .map_batches(|b: RecordBatch| Ok::<_, UdfError>(b), Resources::cpu(1.0));
    let count = ds.count()?;
    let wall = started.elapsed();
    let stats = ds.stats().unwrap_or_default();
    let config = format!("rows={rows},partitions={partitions}");
    Ok(BenchResult::new(
        "w3",
        config,
        wall,
        count as u64,
        &stats,
        count as u64 == rows,
    ))
}

/// Bytes of one W2 row: 10 MiB and one byte, so that a row of the constant
/// byte `v` sums to `v` mod 256.
const W2_ROW_BYTES: usize = (10 << 20) + 1;

/// W2: memory-limited expansion with real bytes. 100 rows; stage A makes 10
/// rows of 10 MiB per row (10 GiB in all), one at a time; stage B (which
/// declares its memory per task, so it runs as its own stage) reduces each
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
                let id = b
                    .column(0)
                    .as_primitive::<arrow_array::types::Int64Type>()
                    .value(0);
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
                let started = Instant::now();
                let data = b
                    .column_by_name("data")
                    .ok_or("no column `data`")?
                    .as_binary::<i32>();
                let sums: Int64Array = data
                    .iter()
                    .map(|d| d.map(|d| d.iter().map(|&x| x as i64).sum::<i64>() % 256))
                    .collect();
                if let Some(rest) = Duration::from_millis(20).checked_sub(started.elapsed()) {
                    std::thread::sleep(rest);
                }
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
        let keys = batch
            .column(0)
            .as_primitive::<arrow_array::types::Int64Type>();
        let sums = batch
            .column(1)
            .as_primitive::<arrow_array::types::Int64Type>();
        correct &= keys
            .values()
            .iter()
            .zip(sums.values())
            .all(|(k, s)| *s == k % 251);
    }
    let wall = started.elapsed();
    let rows = progress.rows();
    let stats = ds.stats().unwrap_or_default();
    let config = format!("store_cap={}", crate::format_bytes(store_cap));
    Ok(BenchResult::new(
        "w2",
        config,
        wall,
        rows,
        &stats,
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

/// The embedding kernel in WGSL (`examples/pipelines/embed.wgsl`).
pub const EMBED_WGSL: &str = include_str!("../../../examples/pipelines/embed.wgsl");

/// The embedding model as a GPU kernel: the same seeded weights as
/// [`CpuEmbedder`], multiplied on the device.
pub fn gpu_embedder(seed: u64) -> Result<crate::GpuKernel> {
    let kernel = crate::GpuKernel::from_wgsl("embed", EMBED_WGSL)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let params: Vec<u8> = [0u32, IMAGE_BYTES as u32, EMBED_DIM as u32, 0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    Ok(kernel
        .constant("weights", &embedding_weights(seed))
        .output("embedding", EMBED_DIM)
        .params(&params)
        .dispatch(|rows| [(EMBED_DIM as u32).div_ceil(64), rows as u32, 1]))
}

/// Where W4's embedding runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The CPU matmul (`CpuEmbedder`), 1 CPU slot per task.
    Cpu,
    /// The WGSL kernel (`gpu_embedder`) on a GPU adapter, 1 GPU slot per task.
    Gpu,
}

/// Makes W4's input (2,000 images in 20 files, seed 42) in `dir` if absent.
pub fn w4_input(dir: &Path) -> Result<()> {
    if dir.join("images-019.parquet").exists() {
        return Ok(());
    }
    make_images(dir, 20, 100, 42)
}

/// W4: batch inference on real files. `read_parquet` -> preprocess ->
/// 12,288 x 256 matmul in batches of 64 on `device` -> `write_parquet`; then
/// every 25th embedding is checked against a direct computation.
pub fn w4(device: Device, input: &Path, output: &Path, base: &NodeConfig) -> Result<BenchResult> {
    w4_input(input)?;
    let ctx = Context::with_config(base.clone())?;
    let started = Instant::now();
    let pixels = ctx
        .read_parquet(&input.display().to_string())?
        .map_batches(preprocess, Resources::cpu(1.0))
        .named("preprocess");
    let (ds, kernel) = match device {
        Device::Cpu => {
            let embed = crate::Stateful::new("embed", || Ok::<_, UdfError>(CpuEmbedder::new(42)));
            let slots = base.cpus.ceil().max(1.0) as usize;
            (
                pixels.map_batches(embed, Resources::cpu(1.0).batch_rows(64).pool(1, slots)),
                None,
            )
        }
        Device::Gpu => {
            let kernel = gpu_embedder(42)?;
            (
                pixels.map_batches(kernel.clone(), Resources::gpu(1.0).batch_rows(64)),
                Some(kernel),
            )
        }
    };
    ds.write_parquet(output)?;
    let wall = started.elapsed();
    let stats = ds.stats().unwrap_or_default();
    let correct = check_embeddings(&ctx, input, output, 25, 42)?;
    let mut extra = vec![(
        "device".to_string(),
        serde_json::json!(format!("{device:?}").to_lowercase()),
    )];
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
    // Rows read: the first operator of the first stage.
    let rows = stats
        .operators
        .first()
        .map_or(0, |o| o.ops.first().map_or(o.rows, |op| op.rows));
    let config = format!("device={device:?}").to_lowercase();
    Ok(BenchResult {
        extra,
        ..BenchResult::new("w4", config, wall, rows, &stats, correct)
    })
}

/// Checks every `step`-th image's embedding in `output` against
/// [`reference_embedding`] with the weights of `seed` (max error at most
/// 1e-4 of the largest value).
pub fn check_embeddings(
    ctx: &Context,
    input: &Path,
    output: &Path,
    step: i64,
    seed: u64,
) -> Result<bool> {
    let pick = crate::col("id") % crate::lit(step);
    let images = ctx
        .read_parquet(&input.display().to_string())?
        .filter(pick.clone().eq(crate::lit(0)))
        .collect()?;
    let embeddings = ctx
        .read_parquet(&output.display().to_string())?
        .filter(pick.eq(crate::lit(0)))
        .collect()?;
    let weights = embedding_weights(seed);
    let mut found = std::collections::HashMap::new();
    for b in &embeddings {
        let ids = b.column(0).as_primitive::<arrow_array::types::Int64Type>();
        let list = b.column(1).as_fixed_size_list();
        for (r, id) in ids.values().iter().enumerate() {
            found.insert(
                *id,
                list.value(r)
                    .as_primitive::<Float32Type>()
                    .values()
                    .to_vec(),
            );
        }
    }
    let mut all = !images.is_empty();
    for b in &images {
        let ids = b.column(0).as_primitive::<arrow_array::types::Int64Type>();
        for (r, id) in ids.values().iter().enumerate() {
            let want = reference_embedding(b.column(1).as_binary::<i32>().value(r), &weights);
            let Some(got) = found.get(id) else {
                return Ok(false);
            };
            let scale = want.iter().map(|x| x.abs()).fold(0f32, f32::max).max(1e-6);
            let err = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            all &= got.len() == EMBED_DIM && err / scale <= 1e-4;
        }
    }
    Ok(all)
}
