//! W4, batch inference on real files: its synthetic image input, the f64
//! reference embeddings and the check of every embedding the job wrote.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type};
use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch};
use arrow_buffer::{Buffer, OffsetBuffer};
use parquet::arrow::ArrowWriter;
use rand::{Rng, SeedableRng};
use streambatch::ops::{self, CpuEmbedder, EMBED_DIM, IMAGE_BYTES};
use streambatch::{Context, Error, NodeConfig, Resources, Result, UdfError};

use crate::{BenchResult, round};

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
