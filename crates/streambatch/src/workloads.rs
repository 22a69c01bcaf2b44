//! The benchmark workloads of `docs/workloads.md` (W1, W3, W4's pieces) and
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
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..IMAGE_BYTES * EMBED_DIM)
        .map(|_| rng.random_range(-0.01f32..0.01))
        .collect()
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
}

impl BenchResult {
    /// The JSON line (keys of `docs/workloads.md`).
    pub fn to_json(&self) -> String {
        let wall = self.wall.as_secs_f64();
        serde_json::json!({
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
        })
        .to_string()
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

/// Bytes of one W1 row.
const W1_ROW_BYTES: usize = 10 << 20;

fn zero_rows(ids: &ArrayRef, row_bytes: usize) -> std::result::Result<RecordBatch, UdfError> {
    let rows = ids.len();
    let offsets = OffsetBuffer::from_lengths(std::iter::repeat_n(row_bytes, rows));
    let data: ArrayRef = Arc::new(BinaryArray::new(
        offsets,
        Buffer::from_vec(vec![0u8; rows * row_bytes]),
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
pub fn w1(store_cap: u64, base: &NodeConfig) -> Result<BenchResult> {
    let config = NodeConfig {
        cpus: 8.0,
        gpus: 4.0,
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
    let mut rows = 0u64;
    let mut id_sum = 0i64;
    let mut stream = ds.iter_batches()?;
    for batch in stream.by_ref() {
        let batch = batch?;
        rows += batch.num_rows() as u64;
        id_sum += batch
            .column(0)
            .as_primitive::<arrow_array::types::Int64Type>()
            .values()
            .iter()
            .sum::<i64>();
    }
    let wall = started.elapsed();
    let stats = ds.stats().unwrap_or_default();
    Ok(BenchResult {
        workload: "w1".into(),
        config: format!("store_cap={}", crate::format_bytes(store_cap)),
        wall,
        rows,
        partitions: stats.operators.first().map_or(0, |o| o.tasks),
        ideal: Some(Duration::from_secs_f64((160.0 * 0.5 + 800.0 * 0.05) / 8.0)),
        store_peak_bytes: stats.peak_store_bytes,
        spilled_bytes: stats.spilled_bytes,
        correct: rows == 800 && id_sum == (0..800).sum::<i64>(),
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
    Ok(BenchResult {
        workload: "w3".into(),
        config: format!("rows={rows},partitions={partitions}"),
        wall,
        rows: count as u64,
        partitions: partitions as u64,
        ideal: None,
        store_peak_bytes: stats.peak_store_bytes,
        spilled_bytes: stats.spilled_bytes,
        correct: count as u64 == rows,
    })
}
