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
        map_images(&batch, from, |path, image, pixels| {
            let mut rng = row_rng(seed, epoch, path);
            let crop = crop_box(&mut rng, from, scale);
            resize(image, from.1, crop, out, pixels);
            Ok(())
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
        map_images(&batch, from, |path, image, pixels| {
            // Its own stream, apart from the crop's.
            let mut rng = row_rng(seed ^ 0x9e37_79b9_7f4a_7c15, epoch, path);
            if !rng.random_bool(p.clamp(0.0, 1.0)) {
                pixels.extend_from_slice(image);
                return Ok(());
            }
            let width = from.1 as usize * 3;
            for row in image.chunks_exact(width) {
                for pixel in row.chunks_exact(3).rev() {
                    pixels.extend_from_slice(pixel);
                }
            }
            Ok(())
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
        if size == 0 {
            return Err("normalize: images of no pixels".into());
        }
        // Each channel's 256 values worked out once: a lookup per byte.
        let table: Vec<[f32; 3]> = (0..=255u8)
            .map(|x| std::array::from_fn(|c| (x as f32 / 255.0 - mean[c]) / std[c]))
            .collect();
        let mut pixels = vec![0f32; images.len() * size];
        for ((row, image), out) in images.iter().enumerate().zip(pixels.chunks_exact_mut(size)) {
            let image = checked(image, size, row)?;
            for (pixel, out) in image.chunks_exact(3).zip(out.chunks_exact_mut(3)) {
                out[0] = table[pixel[0] as usize][0];
                out[1] = table[pixel[1] as usize][1];
                out[2] = table[pixel[2] as usize][2];
            }
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

/// Applies `f` to each row's (path, image), which appends the row's new
/// image to one buffer for the whole new `image` column.
fn map_images(
    batch: &RecordBatch,
    from: Side,
    f: impl Fn(&str, &[u8], &mut Vec<u8>) -> Result<(), UdfError>,
) -> Result<RecordBatch, UdfError> {
    let images = images(batch)?;
    let paths = batch
        .column_by_name("path")
        .ok_or("no column `path` (rows of read_images)")?
        .as_string_opt::<i32>()
        .ok_or("`path` is not text")?;
    let size = from.0 as usize * from.1 as usize * 3;
    let (mut values, mut lengths) = (Vec::new(), Vec::with_capacity(images.len()));
    for row in 0..images.len() {
        let image = checked(images.is_valid(row).then(|| images.value(row)), size, row)?;
        let before = values.len();
        f(paths.value(row), image, &mut values)?;
        lengths.push(values.len() - before);
    }
    let offsets = arrow_buffer::OffsetBuffer::from_lengths(lengths);
    let column = BinaryArray::new(offsets, arrow_buffer::Buffer::from_vec(values), None);
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
/// resized to `out` by bilinear interpolation, appended to `pixels`: each
/// source row the output needs is interpolated across once (columns and
/// weights worked out once per image), then each output row between its
/// two source rows.
fn resize(
    image: &[u8],
    width: u32,
    (top, left, h, w): (u32, u32, u32, u32),
    out: Side,
    pixels: &mut Vec<u8>,
) {
    let (out_h, out_w) = (out.0 as usize, out.1 as usize);
    // Pixel centres mapped back into the crop: the two neighbours and the
    // weight of the second.
    let source = |o: usize, crop: u32, sides: usize| {
        let s = ((o as f32 + 0.5) * crop as f32 / sides as f32 - 0.5).clamp(0.0, (crop - 1) as f32);
        let first = s.floor() as usize;
        (first, (first + 1).min(crop as usize - 1), s.fract())
    };
    let columns: Vec<(usize, usize, f32)> = (0..out_w).map(|ox| source(ox, w, out_w)).collect();
    let across = |y: usize, row: &mut Vec<f32>| {
        let start = ((top as usize + y) * width as usize + left as usize) * 3;
        let line = &image[start..start + w as usize * 3];
        row.clear();
        for &(x0, x1, fx) in &columns {
            for c in 0..3 {
                row.push(line[x0 * 3 + c] as f32 * (1.0 - fx) + line[x1 * 3 + c] as f32 * fx);
            }
        }
    };
    pixels.reserve(out_h * out_w * 3);
    // The rows interpolated across last, and which source rows they are.
    let (mut upper, mut lower) = (Vec::new(), Vec::new());
    let mut held: (Option<usize>, Option<usize>) = (None, None);
    for oy in 0..out_h {
        let (y0, y1, fy) = source(oy, h, out_h);
        if held.0 != Some(y0) {
            if held.1 == Some(y0) {
                std::mem::swap(&mut upper, &mut lower);
                held.0 = held.1.take();
            } else {
                across(y0, &mut upper);
                held.0 = Some(y0);
            }
        }
        if held.1 != Some(y1) {
            across(y1, &mut lower);
            held.1 = Some(y1);
        }
        pixels.extend(
            upper
                .iter()
                .zip(&lower)
                .map(|(&top_row, &bottom_row)| rounded(top_row * (1.0 - fy) + bottom_row * fy)),
        );
    }
}

/// The byte nearest a value between 0 and 255 (halves up): an add and a
/// saturating cast, where `f32::round` is a call.
fn rounded(value: f32) -> u8 {
    (value + 0.5) as u8
}

#[cfg(test)]
mod tests {
    use arrow_array::StringArray;

    use super::*;

    /// Bilinear resizing computed directly, pixel by pixel.
    fn resized_directly(
        image: &[u8],
        width: u32,
        (top, left, h, w): (u32, u32, u32, u32),
        (out_h, out_w): Side,
    ) -> Vec<u8> {
        let at = |y: usize, x: usize, c: usize| {
            image[((top as usize + y) * width as usize + left as usize + x) * 3 + c] as f32
        };
        let mut pixels = vec![];
        for oy in 0..out_h as usize {
            let sy = ((oy as f32 + 0.5) * h as f32 / out_h as f32 - 0.5).clamp(0.0, (h - 1) as f32);
            let (y0, fy) = (sy.floor() as usize, sy.fract());
            let y1 = (y0 + 1).min(h as usize - 1);
            for ox in 0..out_w as usize {
                let sx =
                    ((ox as f32 + 0.5) * w as f32 / out_w as f32 - 0.5).clamp(0.0, (w - 1) as f32);
                let (x0, fx) = (sx.floor() as usize, sx.fract());
                let x1 = (x0 + 1).min(w as usize - 1);
                for c in 0..3 {
                    let top_row = at(y0, x0, c) * (1.0 - fx) + at(y0, x1, c) * fx;
                    let bottom_row = at(y1, x0, c) * (1.0 - fx) + at(y1, x1, c) * fx;
                    let value: f32 = top_row * (1.0 - fy) + bottom_row * fy;
                    pixels.push(value.round().clamp(0.0, 255.0) as u8);
                }
            }
        }
        pixels
    }

    #[test]
    fn resizing_row_by_row_gives_the_direct_pixels() {
        let mut rng = StdRng::seed_from_u64(11);
        let (height, width) = (37u32, 29u32);
        let image: Vec<u8> = (0..height * width * 3).map(|_| rng.random()).collect();
        for _ in 0..200 {
            let (top, left) = (rng.random_range(0..height), rng.random_range(0..width));
            let h = rng.random_range(1..=height - top);
            let w = rng.random_range(1..=width - left);
            let out = (rng.random_range(1..50), rng.random_range(1..50));
            let crop = (top, left, h, w);
            let mut resized = vec![1, 2]; // appended after what is there
            resize(&image, width, crop, out, &mut resized);
            assert_eq!(
                resized[2..],
                resized_directly(&image, width, crop, out),
                "{crop:?} to {out:?}"
            );
        }
    }

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
        let mut out = Vec::new();
        resize(&image, 2, (0, 0, 1, 2), (1, 4), &mut out);
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
