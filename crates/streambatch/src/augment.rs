//! Training augmentations over [`read_images`](crate::Context::read_images)
//! rows (`path`, and `image`: height x width x 3 RGB bytes): a random
//! resized crop, a horizontal flip and normalisation to f32.
//!
//! The random ones draw each row's choice from a generator seeded by the
//! operator's seed, the epoch and the row's `path`, so a row is cropped and
//! flipped the same way whatever partition or task it lands in, and
//! differently each epoch.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BinaryArray, FixedSizeListArray, Float32Array, RecordBatch};
use arrow_schema::{DataType, Field};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::UdfError;

/// A square of `(height, width)` pixels.
pub type Side = (u32, u32);

/// Crops each image to a random region of `scale` of its area (a share
/// such as `(0.08, 1.0)`) and an aspect ratio between 3/4 and 4/3, then
/// resizes it to `out` (bilinear), as torchvision's `RandomResizedCrop`:
/// from images of `from` pixels. Seeded per row by `seed`, `epoch` and the
/// row's path.
///
/// ```
/// # use std::sync::Arc;
/// # use arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
/// let image = vec![9u8; 8 * 8 * 3];
/// let batch = RecordBatch::try_from_iter([
///     ("path", Arc::new(StringArray::from(vec!["a.png"])) as ArrayRef),
///     ("image", Arc::new(BinaryArray::from_vec(vec![&image[..]])) as ArrayRef),
/// ])
/// .unwrap();
/// let crop = streambatch::ops::random_resized_crop((8, 8), (4, 4), (0.25, 1.0), 7, 0);
/// let out = crop(batch).unwrap();
/// assert_eq!(out.column(1).as_any().downcast_ref::<BinaryArray>().unwrap().value(0), &[9u8; 48][..]);
/// ```
pub fn random_resized_crop(
    from: Side,
    out: Side,
    scale: (f32, f32),
    seed: u64,
    epoch: u64,
) -> impl Fn(RecordBatch) -> Result<RecordBatch, UdfError> + Clone + Send + Sync + 'static {
    move |batch| {
        map_images(&batch, from, |path, image| {
            let mut rng = row_rng(seed, epoch, path);
            let (top, left, h, w) = crop_box(&mut rng, from, scale);
            Ok(resize(image, from.1, (top, left, h, w), out))
        })
    }
}

/// Flips each image left to right with probability `p`, from images of
/// `from` pixels. Seeded per row by `seed`, `epoch` and the row's path.
pub fn flip(
    from: Side,
    p: f64,
    seed: u64,
    epoch: u64,
) -> impl Fn(RecordBatch) -> Result<RecordBatch, UdfError> + Clone + Send + Sync + 'static {
    move |batch| {
        map_images(&batch, from, |path, image| {
            // Its own stream, apart from the crop's.
            let mut rng = row_rng(seed ^ 0x9e37_79b9_7f4a_7c15, epoch, path);
            if !rng.random_bool(p.clamp(0.0, 1.0)) {
                return Ok(image.to_vec());
            }
            let width = from.1 as usize * 3;
            let mut flipped = Vec::with_capacity(image.len());
            for row in image.chunks_exact(width) {
                flipped.extend(row.chunks_exact(3).rev().flatten());
            }
            Ok(flipped)
        })
    }
}

/// Each image's bytes to f32 `(x / 255 - mean[c]) / std[c]` per channel,
/// as column `pixels` (a fixed-size list of height x width x 3), from
/// images of `from` pixels; the other columns as they were.
pub fn normalize(
    from: Side,
    mean: [f32; 3],
    std: [f32; 3],
) -> impl Fn(RecordBatch) -> Result<RecordBatch, UdfError> + Clone + Send + Sync + 'static {
    move |batch| {
        let images = images(&batch)?;
        let size = from.0 as usize * from.1 as usize * 3;
        let mut pixels = Vec::with_capacity(images.len() * size);
        for (row, image) in images.iter().enumerate() {
            let image = checked(image, size, row)?;
            pixels.extend(
                image
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| (x as f32 / 255.0 - mean[i % 3]) / std[i % 3]),
            );
        }
        let field = Arc::new(Field::new("item", DataType::Float32, false));
        let list = FixedSizeListArray::try_new(
            field,
            size as i32,
            Arc::new(Float32Array::from(pixels)),
            None,
        )?;
        replace_image(&batch, "pixels", Arc::new(list))
    }
}

/// The `image` column.
fn images(batch: &RecordBatch) -> Result<&BinaryArray, UdfError> {
    Ok(batch
        .column_by_name("image")
        .ok_or("no column `image` (rows of read_images)")?
        .as_binary_opt::<i32>()
        .ok_or("`image` is not binary")?)
}

/// `image` when it holds `size` bytes; an error naming the row otherwise.
fn checked(image: Option<&[u8]>, size: usize, row: usize) -> Result<&[u8], UdfError> {
    let image = image.ok_or_else(|| format!("row {row}: a null image"))?;
    if image.len() != size {
        return Err(format!(
            "row {row}: an image of {} bytes, expected {size}",
            image.len()
        )
        .into());
    }
    Ok(image)
}

/// Applies `f` to each row's (path, image), giving the new `image` column.
fn map_images(
    batch: &RecordBatch,
    from: Side,
    f: impl Fn(&str, &[u8]) -> Result<Vec<u8>, UdfError>,
) -> Result<RecordBatch, UdfError> {
    let images = images(batch)?;
    let paths = batch
        .column_by_name("path")
        .ok_or("no column `path` (rows of read_images)")?
        .as_string_opt::<i32>()
        .ok_or("`path` is not text")?;
    let size = from.0 as usize * from.1 as usize * 3;
    let mut out = Vec::with_capacity(images.len());
    for row in 0..images.len() {
        let image = checked(images.is_valid(row).then(|| images.value(row)), size, row)?;
        out.push(f(paths.value(row), image)?);
    }
    let column = BinaryArray::from_iter_values(out.iter());
    replace_image(batch, "image", Arc::new(column))
}

/// `batch` with its `image` column replaced by `column`, named `name`.
fn replace_image(
    batch: &RecordBatch,
    name: &str,
    column: ArrayRef,
) -> Result<RecordBatch, UdfError> {
    let schema = batch.schema();
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (field, array) in schema.fields().iter().zip(batch.columns()) {
        if field.name() == "image" {
            fields.push(Field::new(name, column.data_type().clone(), false));
            columns.push(column.clone());
        } else {
            fields.push(field.as_ref().clone());
            columns.push(array.clone());
        }
    }
    let schema = Arc::new(arrow_schema::Schema::new(fields));
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// A generator for one row: FNV-1a of the path, mixed with seed and epoch
/// (stable across platforms and Rust versions, unlike std's hasher).
fn row_rng(seed: u64, epoch: u64, path: &str) -> StdRng {
    let hash = streambatch_core::fnv1a(path.as_bytes());
    let mixed = hash ^ seed.rotate_left(17) ^ epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    StdRng::seed_from_u64(mixed)
}

/// A crop box (top, left, height, width) of `scale` of the area and an
/// aspect ratio in 3/4..4/3 (ten tries, then the whole image's centre
/// square, as torchvision falls back).
fn crop_box(rng: &mut StdRng, (height, width): Side, scale: (f32, f32)) -> (u32, u32, u32, u32) {
    let area = (height * width) as f32;
    let (low, high) = (scale.0.min(scale.1).max(0.0), scale.0.max(scale.1).min(1.0));
    for _ in 0..10 {
        let target = area * rng.random_range(low..=high);
        let ratio = (rng.random_range((3f32 / 4.0).ln()..=(4f32 / 3.0).ln())).exp();
        let w = (target * ratio).sqrt().round() as u32;
        let h = (target / ratio).sqrt().round() as u32;
        if (1..=width).contains(&w) && (1..=height).contains(&h) {
            let top = rng.random_range(0..=height - h);
            let left = rng.random_range(0..=width - w);
            return (top, left, h, w);
        }
    }
    let side = height.min(width);
    ((height - side) / 2, (width - side) / 2, side, side)
}

/// The crop `(top, left, h, w)` of an RGB image `width` pixels wide,
/// resized to `out` by bilinear interpolation.
fn resize(image: &[u8], width: u32, (top, left, h, w): (u32, u32, u32, u32), out: Side) -> Vec<u8> {
    let (out_h, out_w) = (out.0 as usize, out.1 as usize);
    let mut pixels = Vec::with_capacity(out_h * out_w * 3);
    let at = |y: usize, x: usize, c: usize| {
        image[((top as usize + y) * width as usize + left as usize + x) * 3 + c] as f32
    };
    for oy in 0..out_h {
        // Pixel centres mapped back into the crop.
        let sy = ((oy as f32 + 0.5) * h as f32 / out_h as f32 - 0.5).clamp(0.0, (h - 1) as f32);
        let (y0, fy) = (sy.floor() as usize, sy.fract());
        let y1 = (y0 + 1).min(h as usize - 1);
        for ox in 0..out_w {
            let sx = ((ox as f32 + 0.5) * w as f32 / out_w as f32 - 0.5).clamp(0.0, (w - 1) as f32);
            let (x0, fx) = (sx.floor() as usize, sx.fract());
            let x1 = (x0 + 1).min(w as usize - 1);
            for c in 0..3 {
                let top_row = at(y0, x0, c) * (1.0 - fx) + at(y0, x1, c) * fx;
                let bottom_row = at(y1, x0, c) * (1.0 - fx) + at(y1, x1, c) * fx;
                let value = top_row * (1.0 - fy) + bottom_row * fy;
                pixels.push(value.round().clamp(0.0, 255.0) as u8);
            }
        }
    }
    pixels
}

#[cfg(test)]
mod tests {
    use arrow_array::StringArray;

    use super::*;

    /// Images of 4 x 6 pixels whose bytes name their row, column and channel.
    fn batch(paths: &[&str]) -> RecordBatch {
        let image: Vec<u8> = (0..4u8)
            .flat_map(|y| (0..6u8).flat_map(move |x| (0..3u8).map(move |c| y * 60 + x * 6 + c)))
            .collect();
        let images: Vec<&[u8]> = paths.iter().map(|_| &image[..]).collect();
        RecordBatch::try_from_iter([
            (
                "path",
                Arc::new(StringArray::from(paths.to_vec())) as ArrayRef,
            ),
            ("image", Arc::new(BinaryArray::from_vec(images)) as ArrayRef),
        ])
        .unwrap()
    }

    fn image(batch: &RecordBatch, row: usize) -> Vec<u8> {
        batch.column(1).as_binary::<i32>().value(row).to_vec()
    }

    #[test]
    fn a_flip_mirrors_each_row_and_is_fixed_by_seed_epoch_and_path() {
        let input = batch(&["a", "b"]);
        let always = flip((4, 6), 1.0, 1, 0)(input.clone()).unwrap();
        let first_row: Vec<u8> = image(&always, 0)[..18].to_vec();
        let expected: Vec<u8> = (0..6u8)
            .rev()
            .flat_map(|x| (0..3u8).map(move |c| x * 6 + c))
            .collect();
        assert_eq!(first_row, expected);
        let never = flip((4, 6), 0.0, 1, 0)(input.clone()).unwrap();
        assert_eq!(image(&never, 0), image(&input, 0));
        // Half the rows, by path: the same choice in any batch, another epoch another.
        let paths: Vec<String> = (0..200).map(|i| format!("img-{i}.png")).collect();
        let names: Vec<&str> = paths.iter().map(String::as_str).collect();
        let flipped = |epoch| {
            let out = flip((4, 6), 0.5, 1, epoch)(batch(&names)).unwrap();
            (0..200)
                .map(|r| image(&out, r) != image(&input, 0))
                .collect::<Vec<bool>>()
        };
        let epoch0 = flipped(0);
        let count = epoch0.iter().filter(|f| **f).count();
        assert!((60..140).contains(&count), "{count} of 200 flipped");
        assert_eq!(flipped(0), epoch0);
        assert_ne!(flipped(1), epoch0);
        let alone = flip((4, 6), 0.5, 1, 0)(batch(&names[7..8])).unwrap();
        assert_eq!(
            image(&alone, 0) != image(&input, 0),
            epoch0[7],
            "a row's choice is its own"
        );
    }

    #[test]
    fn a_crop_is_seeded_per_row_and_resized_to_its_size() {
        let input = batch(&["a", "b"]);
        let crop = random_resized_crop((4, 6), (2, 2), (0.1, 0.5), 3, 0);
        let out = crop(input.clone()).unwrap();
        assert_eq!(image(&out, 0).len(), 2 * 2 * 3);
        assert_eq!(crop(input.clone()).unwrap(), out, "seeded");
        let alone = crop(batch(&["b"])).unwrap();
        assert_eq!(image(&alone, 0), image(&out, 1), "a row's crop is its own");
        // Each output pixel blends its inputs' channels alike: c0 <= c1 <= c2.
        for pixel in image(&out, 0).chunks(3) {
            assert!(pixel[0] <= pixel[1] && pixel[1] <= pixel[2], "{pixel:?}");
        }
        let other_epoch = random_resized_crop((4, 6), (2, 2), (0.1, 0.5), 3, 1);
        let paths: Vec<String> = (0..50).map(|i| format!("{i}")).collect();
        let names: Vec<&str> = paths.iter().map(String::as_str).collect();
        assert_ne!(
            crop(batch(&names)).unwrap(),
            other_epoch(batch(&names)).unwrap()
        );
    }

    #[test]
    fn resizing_a_crop_interpolates_between_its_pixels() {
        // A 1 x 2 crop of two grey pixels, 0 and 100, stretched to 1 x 4.
        let image = [0, 0, 0, 100, 100, 100];
        let out = resize(&image, 2, (0, 0, 1, 2), (1, 4));
        let reds: Vec<u8> = out.chunks(3).map(|p| p[0]).collect();
        assert_eq!(reds, vec![0, 25, 75, 100]);
    }

    #[test]
    fn normalize_gives_f32_pixels_per_channel() {
        let out = normalize((4, 6), [0.0, 0.5, 1.0], [1.0, 0.5, 0.25])(batch(&["a"])).unwrap();
        assert_eq!(out.schema().field(1).name(), "pixels");
        let list = out.column(1).as_fixed_size_list();
        let values = list
            .values()
            .as_primitive::<arrow_array::types::Float32Type>();
        // Pixel (0, 1): bytes 6, 7, 8.
        let expected = [
            6.0 / 255.0,
            (7.0 / 255.0 - 0.5) / 0.5,
            (8.0 / 255.0 - 1.0) / 0.25,
        ];
        for (got, want) in values.values()[3..6].iter().zip(expected) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
        let wrong = normalize((5, 6), [0.0; 3], [1.0; 3])(batch(&["a"]));
        assert!(wrong.unwrap_err().to_string().contains("expected 90"));
    }
}
