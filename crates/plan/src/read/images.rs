//! `read_images`: PNG and JPEG files decoded (the `image` crate) and
//! resized to one size, each a fixed-size RGB tensor: `height x width x 3`
//! bytes, row-major, the channels innermost (as Ray Data's `read_images`
//! gives them, and as `ops::preprocess` reads an `image` column).

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{BinaryBuilder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use image::imageops::FilterType;

use crate::error::{Error, Result, bad_file};
use crate::udf::BatchIter;

/// Bytes of decoded images one batch holds at most (one image at least).
const BATCH_BYTES: usize = 4 << 20;

/// The size every image is resized to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageSize {
    /// Rows of pixels.
    pub height: u32,
    /// Pixels per row.
    pub width: u32,
}

impl ImageSize {
    /// Bytes of one decoded image (`check` has made sure they fit a
    /// binary value).
    pub fn bytes(self) -> usize {
        self.height as usize * self.width as usize * 3
    }

    /// An error unless images of this size hold something and fit one
    /// binary value (2 GiB).
    pub fn check(self) -> Result<()> {
        let bytes = u64::from(self.height) * u64::from(self.width) * 3;
        if bytes == 0 || bytes > i32::MAX as u64 {
            return Err(Error::Invalid(format!(
                "read_images: images of {} x {} pixels are {bytes} bytes each; \
                 a size must hold 1 byte to 2 GiB",
                self.height, self.width
            )));
        }
        Ok(())
    }
}

/// The schema of `read_images`: `path` (utf8) and `image` (binary, each
/// value `height x width x 3` bytes).
pub fn images_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("path", DataType::Utf8, false),
        Field::new("image", DataType::Binary, false),
    ]))
}

/// Whether `path` names a file `read_images` decodes (by its extension).
pub fn is_image(path: &Path) -> bool {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    ["png", "jpg", "jpeg"]
        .iter()
        .any(|known| ext.eq_ignore_ascii_case(known))
}

/// The images of `paths`, decoded and resized to `size`, in batches of
/// about 4 MiB. A file that is not a PNG or JPEG, or that fails to decode,
/// is an error naming it.
pub fn open_images(paths: Arc<Vec<PathBuf>>, size: ImageSize) -> BatchIter {
    let per_batch = (BATCH_BYTES / size.bytes().max(1)).max(1);
    let mut next = 0;
    Box::new(std::iter::from_fn(move || {
        if next == paths.len() {
            return None;
        }
        let chunk = &paths[next..(next + per_batch).min(paths.len())];
        next += chunk.len();
        Some(decode_batch(chunk, size))
    }))
}

fn decode_batch(paths: &[PathBuf], size: ImageSize) -> Result<RecordBatch> {
    let mut names = StringBuilder::new();
    let mut images = BinaryBuilder::with_capacity(paths.len(), paths.len() * size.bytes());
    for path in paths {
        images.append_value(decode(path, size)?);
        names.append_value(path.display().to_string());
    }
    let columns: Vec<ArrayRef> = vec![Arc::new(names.finish()), Arc::new(images.finish())];
    Ok(RecordBatch::try_new(images_schema(), columns).expect("matches the schema"))
}

/// One image as RGB bytes of `size`: grey, alpha and 16-bit images
/// converted to 8-bit RGB first, then resized with a triangle filter when
/// its own size differs.
fn decode(path: &Path, size: ImageSize) -> Result<Vec<u8>> {
    let file = crate::read::open_file(path)?;
    let reader = image::ImageReader::new(BufReader::new(file))
        .with_guessed_format()
        .map_err(|e| bad_file(path, e))?;
    if reader.format().is_none() {
        return Err(bad_file(path, "neither a PNG nor a JPEG image"));
    }
    let image = reader.decode().map_err(|e| bad_file(path, e))?.into_rgb8();
    let image = if image.dimensions() == (size.width, size.height) {
        image
    } else {
        image::imageops::resize(&image, size.width, size.height, FilterType::Triangle)
    };
    Ok(image.into_raw())
}
