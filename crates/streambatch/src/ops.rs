//! Built-in operators: the ones TOML pipelines name (`preprocess_images`,
//! `seeded_uniform` constants), [`chunk_binary`] (large binary values cut
//! into pieces without copies), training augmentations over `read_images`
//! rows ([`random_resized_crop`], [`flip`], [`normalize`]), and the demo embedding model of the main job
//! (`crates/cli/src/infer.rs`), on the CPU ([`CpuEmbedder`]) or as a WGSL
//! kernel ([`gpu_embedder`]).
//!
//! The images they take are rows of `id` (Int64) and `image`: 64 x 64 x 3
//! `u8` pixels ([`IMAGE_BYTES`] bytes, Binary).
//!
//! ```
//! use std::sync::Arc;
//! use streambatch::ops::{self, CpuEmbedder, EMBED_DIM, IMAGE_BYTES};
//! use streambatch::prelude::*;
//! use arrow_array::{ArrayRef, BinaryArray, Int64Array};
//!
//! let image = vec![128u8; IMAGE_BYTES];
//! let batch = RecordBatch::try_from_iter([
//!     ("id", Arc::new(Int64Array::from(vec![0])) as ArrayRef),
//!     ("image", Arc::new(BinaryArray::from_vec(vec![&image[..]])) as ArrayRef),
//! ])
//! .unwrap();
//! let ctx = Context::local().unwrap();
//! let out = ctx
//!     .from_batches(vec![batch])
//!     .map_batches(ops::preprocess, Resources::cpu(1.0))
//!     .map_batches(
//!         Stateful::new("embed", || Ok::<_, UdfError>(CpuEmbedder::new(42))),
//!         Resources::cpu(1.0).batch_rows(64),
//!     )
//!     .collect()
//!     .unwrap();
//! assert_eq!(out[0].num_rows(), 1);
//! assert_eq!(out[0].schema().field(1).name(), "embedding");
//! # let _ = EMBED_DIM;
//! ```

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Float32Type;
use arrow_array::{Array, ArrayRef, FixedSizeListArray, Float32Array, RecordBatch};
use arrow_schema::{DataType, Field};
use rand::{Rng, SeedableRng};

use crate::{BatchFn, Error, GpuKernel, Result, UdfError};

pub use crate::augment::{Side, flip, normalize, random_resized_crop};
pub use crate::chunks::{BinaryPieces, chunk_binary};

/// Side of the square images [`preprocess`] takes.
pub const IMAGE_SIDE: usize = 64;
/// Bytes per image: 64 x 64 x 3 `u8`.
pub const IMAGE_BYTES: usize = IMAGE_SIDE * IMAGE_SIDE * 3;
/// Width of the demo embeddings.
pub const EMBED_DIM: usize = 256;

/// Image bytes to normalised f32 pixels (the TOML operator
/// `preprocess_images`): from `id` and `image` ([`IMAGE_BYTES`] bytes each)
/// to `id` and `pixels`, a fixed-size list of 12,288 floats
/// `(x / 255 - 0.5) / 0.25`. A null image or one of another size is an
/// error naming it.
///
/// ```
/// use std::sync::Arc;
/// use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch};
/// use streambatch::ops::{IMAGE_BYTES, preprocess};
///
/// let image = vec![255u8; IMAGE_BYTES];
/// let batch = RecordBatch::try_from_iter([
///     ("id", Arc::new(Int64Array::from(vec![7])) as ArrayRef),
///     ("image", Arc::new(BinaryArray::from_vec(vec![&image[..]])) as ArrayRef),
/// ])
/// .unwrap();
/// let pixels = preprocess(batch).unwrap();
/// assert_eq!(pixels.schema().field(1).name(), "pixels");
/// ```
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

/// `len` floats drawn uniformly from `low..high` by a generator seeded with
/// `seed` (the TOML constant `seeded_uniform`): the same seed gives the same
/// values on every machine.
///
/// ```
/// let a = streambatch::ops::seeded_uniform(1, 4, -1.0, 1.0);
/// assert_eq!(a, streambatch::ops::seeded_uniform(1, 4, -1.0, 1.0));
/// assert!(a.iter().all(|x| (-1.0..1.0).contains(x)));
/// ```
pub fn seeded_uniform(seed: u64, len: usize, low: f32, high: f32) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(low..high)).collect()
}

/// The demo model's 12,288 x 256 weight matrix (row-major), uniform in
/// `-0.01..0.01` from `seed`.
pub fn embedding_weights(seed: u64) -> Vec<f32> {
    seeded_uniform(seed, IMAGE_BYTES * EMBED_DIM, -0.01, 0.01)
}

/// The demo embedding model on the CPU: [`preprocess`]'s `pixels` times
/// [`embedding_weights`], with a cache-blocked SIMD matrix product
/// (`matrixmultiply`), giving `id` and `embedding` (256 floats). Wrap it in
/// [`Stateful`](crate::Stateful) so that its set-up (making the weights)
/// runs once per worker.
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
        if pixels.value_length() as usize != IMAGE_BYTES {
            return Err(format!(
                "`pixels` has {} values per row, expected {IMAGE_BYTES}",
                pixels.value_length()
            )
            .into());
        }
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

/// The demo embedding kernel in WGSL (`examples/pipelines/embed.wgsl`).
pub const EMBED_WGSL: &str = include_str!("../../../examples/pipelines/embed.wgsl");

/// The demo embedding model as a GPU kernel: the same seeded weights as
/// [`CpuEmbedder`], multiplied on the device, adding `embedding` to the batch.
/// Run it with `Resources::gpu(1.0)`; on a node without a GPU adapter the
/// job fails when it starts, naming the operator.
pub fn gpu_embedder(seed: u64) -> Result<GpuKernel> {
    let kernel =
        GpuKernel::from_wgsl("embed", EMBED_WGSL).map_err(|e| Error::Invalid(e.to_string()))?;
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
