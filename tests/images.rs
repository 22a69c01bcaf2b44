//! `read_images`: PNG and JPEG files written with the `image` crate, read
//! back as `height x width x 3` RGB tensors: PNG exactly, JPEG within its
//! loss; other sizes resized, grey and alpha converted; a file that is not
//! an image named in the error.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::ctx;
use image::{GrayImage, Rgb, RgbImage, Rgba, RgbaImage};
use streambatch::arrow::array::RecordBatch;
use streambatch::arrow::array::cast::AsArray;
use streambatch::prelude::*;

/// Each image `read_images` gave, by its file name.
fn read(dir: &Path, height: u32, width: u32) -> BTreeMap<String, Vec<u8>> {
    let batches = ctx()
        .read_images(dir.to_str().unwrap(), height, width)
        .unwrap()
        .collect()
        .unwrap();
    let mut images = BTreeMap::new();
    for b in &batches {
        let paths = b.column_by_name("path").unwrap().as_string::<i32>();
        let data = b.column_by_name("image").unwrap().as_binary::<i32>();
        for (path, image) in paths.iter().zip(data.iter()) {
            let name = Path::new(path.unwrap()).file_name().unwrap();
            images.insert(name.to_string_lossy().into_owned(), image.unwrap().to_vec());
        }
    }
    images
}

/// A 6 x 8 (height x width) image whose pixels all differ.
fn pattern(seed: u8) -> RgbImage {
    RgbImage::from_fn(8, 6, |x, y| {
        Rgb([
            (x * 31) as u8 ^ seed,
            (y * 41) as u8,
            ((x * y * 7) as u8).wrapping_add(seed),
        ])
    })
}

#[test]
fn png_files_read_back_pixel_for_pixel() {
    let dir = tempfile::tempdir().unwrap();
    let mut want = BTreeMap::new();
    for i in 0..40u8 {
        let image = pattern(i);
        let name = format!("img-{i:02}.png");
        image.save(dir.path().join(&name)).unwrap();
        want.insert(name, image.into_raw());
    }
    // Not an image by its extension: left out of a directory's files.
    std::fs::write(dir.path().join("notes.txt"), "not an image").unwrap();
    assert_eq!(read(dir.path(), 6, 8), want);
}

#[test]
fn grey_and_alpha_images_read_as_rgb() {
    let dir = tempfile::tempdir().unwrap();
    GrayImage::from_fn(8, 6, |x, y| image::Luma([(x * 10 + y) as u8]))
        .save(dir.path().join("grey.png"))
        .unwrap();
    RgbaImage::from_fn(8, 6, |x, y| Rgba([x as u8, y as u8, 200, (x * y) as u8]))
        .save(dir.path().join("alpha.png"))
        .unwrap();
    let got = read(dir.path(), 6, 8);
    let grey: Vec<u8> = (0..6u32)
        .flat_map(|y| (0..8u32).flat_map(move |x| [(x * 10 + y) as u8; 3]))
        .collect();
    let alpha: Vec<u8> = (0..6u32)
        .flat_map(|y| (0..8u32).flat_map(move |x| [x as u8, y as u8, 200]))
        .collect();
    assert_eq!(got["grey.png"], grey);
    assert_eq!(got["alpha.png"], alpha);
}

#[test]
fn jpeg_files_read_back_within_their_loss() {
    let dir = tempfile::tempdir().unwrap();
    // Smooth, so that JPEG keeps it close.
    let image = RgbImage::from_fn(64, 48, |x, y| Rgb([(x * 3) as u8, (y * 4) as u8, 128]));
    let path = dir.path().join("smooth.jpg");
    let file = std::fs::File::create(&path).unwrap();
    image::codecs::jpeg::JpegEncoder::new_with_quality(file, 95)
        .encode_image(&image)
        .unwrap();
    let got = &read(dir.path(), 48, 64)["smooth.jpg"];
    assert_eq!(got.len(), 48 * 64 * 3);
    // What a direct decode of the same file gives, exactly.
    assert_eq!(got, &image::open(&path).unwrap().into_rgb8().into_raw());
    let error: u64 = got
        .iter()
        .zip(image.as_raw())
        .map(|(a, b)| a.abs_diff(*b) as u64)
        .sum();
    assert!(error / (got.len() as u64) < 3, "mean error {error}");
}

#[test]
fn images_of_other_sizes_are_resized() {
    let dir = tempfile::tempdir().unwrap();
    RgbImage::from_pixel(40, 30, Rgb([10, 20, 30]))
        .save(dir.path().join("large.png"))
        .unwrap();
    RgbImage::from_pixel(3, 2, Rgb([200, 100, 50]))
        .save(dir.path().join("small.png"))
        .unwrap();
    let got = read(dir.path(), 6, 8);
    assert_eq!(got["large.png"], [10, 20, 30].repeat(48));
    assert_eq!(got["small.png"], [200, 100, 50].repeat(48));
}

#[test]
fn a_file_that_is_not_an_image_is_named() {
    let dir = tempfile::tempdir().unwrap();
    pattern(1).save(dir.path().join("good.png")).unwrap();
    let bad = dir.path().join("broken.png");
    std::fs::write(&bad, b"\x89PNG\r\n\x1a\nnot really").unwrap();
    let err = ctx()
        .read_images(dir.path().to_str().unwrap(), 6, 8)
        .unwrap()
        .collect()
        .unwrap_err()
        .to_string();
    assert!(err.contains(&bad.display().to_string()), "{err}");
    let empty = tempfile::tempdir().unwrap();
    let err = ctx()
        .read_images(empty.path().to_str().unwrap(), 6, 8)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains(&empty.path().display().to_string()), "{err}");
    std::fs::write(empty.path().join("notes.txt"), "text").unwrap();
    let err = ctx()
        .read_images(empty.path().to_str().unwrap(), 6, 8)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("no .png, .jpg or .jpeg files"), "{err}");
    // Sizes that hold nothing, or more than a binary value can.
    for (height, width) in [(0, 8), (40_000, 40_000)] {
        let err = ctx()
            .read_images(dir.path().to_str().unwrap(), height, width)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("1 byte to 2 GiB"), "{err}");
    }
}

#[test]
fn decoded_images_feed_the_image_operators() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..10u8 {
        RgbImage::from_fn(64, 64, |x, y| Rgb([x as u8, y as u8, i]))
            .save(dir.path().join(format!("{i}.png")))
            .unwrap();
    }
    // W4's preprocessing takes 64 x 64 images with an `id`.
    let with_ids = |b: RecordBatch| {
        let ids = streambatch::arrow::array::Int64Array::from_iter_values(0..b.num_rows() as i64);
        let mut columns = b.columns().to_vec();
        columns.insert(0, std::sync::Arc::new(ids));
        let batch = RecordBatch::try_from_iter(["id", "path", "image"].into_iter().zip(columns));
        streambatch::ops::preprocess(batch?)
    };
    let pixels = ctx()
        .read_images(dir.path().to_str().unwrap(), 64, 64)
        .unwrap()
        .map_batches(with_ids, Resources::cpu(1.0))
        .collect()
        .unwrap();
    let rows: usize = pixels.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 10);
    assert!(pixels.iter().all(|b| b.column_by_name("pixels").is_some()));
}

/// The training augmentations over `read_images` rows, as a pipeline of
/// streambatch operators split between two ranks: every image arrives
/// once, cropped to 4 x 4, flipped or not, as 48 normalised floats.
#[test]
fn augmented_images_reach_two_ranks_once_each() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..30u8 {
        pattern(i)
            .save(dir.path().join(format!("img-{i:02}.png")))
            .unwrap();
    }
    let ds = ctx()
        .read_images(dir.path().to_str().unwrap(), 6, 8)
        .unwrap()
        .map_batches(
            streambatch::ops::random_resized_crop((6, 8), (4, 4), (0.3, 1.0), 7, 0),
            Resources::cpu(1.0),
        )
        .map_batches(
            streambatch::ops::flip((4, 4), 0.5, 7, 0),
            Resources::cpu(1.0),
        )
        .map_batches(
            streambatch::ops::normalize((4, 4), [0.5; 3], [0.25; 3]),
            Resources::cpu(1.0),
        );
    let splits = ds.streaming_split(2, false).unwrap();
    let paths: Vec<Vec<String>> = std::thread::scope(|s| {
        let ranks: Vec<_> = splits
            .iter()
            .map(|split| {
                s.spawn(move || {
                    let mut paths = Vec::new();
                    for batch in split.epoch(0) {
                        let batch = batch.unwrap();
                        let pixels = batch.column_by_name("pixels").unwrap().as_fixed_size_list();
                        assert_eq!(pixels.value_length(), 48);
                        let values = pixels
                            .values()
                            .as_primitive::<streambatch::arrow::array::types::Float32Type>();
                        assert!(values.values().iter().all(|v| (-2.0..=2.0).contains(v)));
                        let names = batch.column_by_name("path").unwrap().as_string::<i32>();
                        paths.extend(names.iter().map(|p| p.unwrap().to_string()));
                    }
                    paths
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let mut all = paths.concat();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 30, "every image once");
    assert_eq!(paths[0].len() + paths[1].len(), 30);
}
