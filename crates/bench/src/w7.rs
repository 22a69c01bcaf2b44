//! W7, model batch inference: 2,000 JPEGs decoded, resized to 224 and
//! normalised, through a ResNet-50 ONNX model (the project's own, seeded
//! weights), the class scores written as Parquet. Its input (the JPEGs,
//! the model file, and the images pre-decoded as one tensor for the
//! harness's limit, onnxruntime alone) and the check of what the job wrote.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::Float32Type;
use streambatch::onnx::{Engine, OnnxModel, RESNET_CLASSES, RESNET_SIDE, resnet50};
use streambatch::{Context, Dataset, Error, NodeConfig, Resources, Result, ops};

use crate::w6::{MEAN, STD, image_id, make_jpegs};
use crate::{BenchResult, IdSet};

/// Images in W7's input.
pub const W7_IMAGES: usize = 2_000;
/// Rows per call of the model, for streambatch and every peer.
pub const W7_BATCH_ROWS: usize = 32;
/// W7's store capacity unless `--store-cap` says otherwise: the decoded
/// images wait in it for the model (which is the bound), so that a larger
/// store only holds more of them (1.2 GB for all 2,000; 128 MiB is
/// about 200, or 7 of the model's batches, ahead of it).
pub const W7_STORE_CAP: u64 = 128 << 20;
const SEED: u64 = 77;
const SIDE: u32 = RESNET_SIDE as u32;

/// W7's files under one folder.
#[derive(Clone, Debug)]
pub struct W7Input {
    /// `img-00000.jpg` ... (256 x 256).
    pub images: PathBuf,
    /// The ResNet-50 (`pixels` -> `scores`).
    pub model: PathBuf,
    /// Every image decoded, resized and normalised by the job's own
    /// operators, in id order: `f32[2000, 224, 224, 3]` as NumPy's `.npy`,
    /// what the limit (onnxruntime alone) reads.
    pub tensors: PathBuf,
}

/// Makes what is absent of W7's input under `dir`.
pub fn w7_input(dir: &Path) -> Result<W7Input> {
    let input = W7Input {
        images: dir.join("images"),
        model: dir.join("resnet50.onnx"),
        tensors: dir.join("tensors.npy"),
    };
    make_jpegs(&input.images, W7_IMAGES, SEED)?;
    if !input.model.exists() {
        write_atomically(&input.model, |file| file.write_all(&resnet50(SEED)))?;
    }
    if !input.tensors.exists() {
        let ctx = Context::with_config(NodeConfig::default())?;
        let batches = decoded(&ctx, &input.images)?.collect()?;
        write_npy(&input.tensors, &batches)?;
    }
    Ok(input)
}

/// The job's first operators: read, decode and resize, normalise.
fn decoded(ctx: &Context, images: &Path) -> Result<Dataset> {
    Ok(ctx
        .read_images(&images.display().to_string(), SIDE, SIDE)?
        .map_batches(ops::normalize((SIDE, SIDE), MEAN, STD), Resources::cpu(1.0))
        .named("normalize"))
}

/// W7 on an embedded node of `base`'s settings (partitions of at most
/// 8 MiB, about 13 decoded images: the model's input streams in small
/// steps): [`decoded`] -> the model on `engine` (each worker's session on
/// `model_cpus` threads, its stage asking as many CPU slots, a pool of as
/// many workers as the node's slots hold, in batches of [`W7_BATCH_ROWS`]) ->
/// `write_parquet(output)` (`path`, `scores`). Correct when every image
/// has one row of 1,000 finite scores; the harness then checks every score
/// against the limit's (onnxruntime over the same tensors).
pub fn w7(
    dir: &Path,
    output: &Path,
    engine: Engine,
    model_cpus: f64,
    base: &NodeConfig,
) -> Result<BenchResult> {
    let input = w7_input(dir)?;
    let model = OnnxModel::open(&input.model)
        .map_err(|e| Error::Invalid(e.to_string()))?
        .engine(engine);
    let config = NodeConfig {
        target_partition_bytes: base.target_partition_bytes.min(8 << 20),
        ..base.clone()
    };
    let workers = ((config.cpus / model_cpus).floor() as usize).max(1);
    let ctx = Context::with_config(config)?;
    let started = Instant::now();
    let ds = decoded(&ctx, &input.images)?
        .map_batches(
            model,
            Resources::cpu(model_cpus)
                .batch_rows(W7_BATCH_ROWS)
                .pool(1, workers),
        )
        .named("resnet50");
    ds.write_parquet(output)?;
    let wall = started.elapsed();
    let stats = ds.stats().unwrap_or_default();
    let written = ctx.read_parquet(&output.display().to_string())?.collect()?;
    let (rows, correct) = check_scores(&written, output)?;
    let images_per_s = rows as f64 / wall.as_secs_f64();
    Ok(BenchResult {
        extra: vec![
            ("engine".into(), serde_json::json!(engine.name())),
            (
                "images_per_s".into(),
                serde_json::json!(crate::round(images_per_s)),
            ),
            ("model_cpus".into(), serde_json::json!(model_cpus)),
        ],
        ..BenchResult::new(
            "w7",
            format!("engine={}", engine.name()),
            wall,
            rows,
            &stats,
            &ctx.store_stats(),
            correct,
        )
    })
}

/// (rows, whether every one of the [`W7_IMAGES`] images has exactly one
/// row of 1,000 finite scores).
fn check_scores(batches: &[RecordBatch], output: &Path) -> Result<(u64, bool)> {
    let mut ids = IdSet::new(W7_IMAGES as u64);
    let mut good = true;
    for batch in batches {
        let bad = |what: &str| Error::BadFile {
            path: output.to_path_buf(),
            message: format!("no {what} column"),
        };
        let paths = batch
            .column_by_name("path")
            .and_then(|c| c.as_string_opt::<i32>())
            .ok_or_else(|| bad("string `path`"))?;
        let scores = batch
            .column_by_name("scores")
            .and_then(|c| c.as_fixed_size_list_opt())
            .ok_or_else(|| bad("fixed-size list `scores`"))?;
        good &= scores.value_length() as usize == RESNET_CLASSES;
        let values = scores.values().as_primitive::<Float32Type>().values();
        // `is_finite` is false for NaN and infinities.
        good &= values.iter().all(|x| x.is_finite());
        for path in paths.iter() {
            // A row not named as an image counts, under an id no image has.
            ids.add(path.and_then(image_id).unwrap_or(-1));
        }
    }
    Ok((ids.rows(), good && ids.each_once()))
}

/// Writes `batches`' `pixels` rows, ordered by their image's id, as one
/// `.npy` array `f32[rows, 224, 224, 3]`.
fn write_npy(path: &Path, batches: &[RecordBatch]) -> Result<()> {
    let mut rows: Vec<(i64, &[f32])> = Vec::new();
    let side = RESNET_SIDE * RESNET_SIDE * 3;
    for batch in batches {
        let paths = batch.column_by_name("path").map(|c| c.as_string::<i32>());
        let pixels = batch
            .column_by_name("pixels")
            .and_then(|c| c.as_fixed_size_list_opt());
        let (Some(paths), Some(pixels)) = (paths, pixels) else {
            return Err(Error::Invalid(
                "W7: decoded rows without `path` and `pixels`".into(),
            ));
        };
        let values = pixels.values().as_primitive::<Float32Type>().values();
        for (r, p) in paths.iter().enumerate() {
            let id = p.and_then(image_id).ok_or_else(|| {
                Error::Invalid(format!("W7: an image named {p:?}, not img-NNNNN.jpg"))
            })?;
            rows.push((id, &values[r * side..(r + 1) * side]));
        }
    }
    rows.sort_by_key(|(id, _)| *id);
    let header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {RESNET_SIDE}, {RESNET_SIDE}, 3), }}",
        rows.len()
    );
    // Magic, version 1.0, the header's length, then the header padded
    // with spaces and a newline so that the data starts 64-byte aligned.
    let unpadded = 10 + header.len() + 1;
    let padded = format!(
        "{header}{}\n",
        " ".repeat(unpadded.next_multiple_of(64) - unpadded)
    );
    write_atomically(path, |file| {
        file.write_all(b"\x93NUMPY\x01\x00")?;
        file.write_all(&(padded.len() as u16).to_le_bytes())?;
        file.write_all(padded.as_bytes())?;
        for (_, row) in &rows {
            for x in *row {
                file.write_all(&x.to_le_bytes())?;
            }
        }
        Ok(())
    })
}

/// The file at `path`, written by `write` into a temporary file renamed
/// into place once whole.
fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> Result<()> {
    let dir = path.parent().expect("a file in a folder");
    std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
    let tmp = path.with_extension("tmp");
    let file = std::fs::File::create(&tmp).map_err(|e| Error::io("creating", &tmp, e))?;
    let mut file = BufWriter::new(file);
    write(&mut file)
        .and_then(|()| file.into_inner().map_err(|e| e.into_error()))
        .and_then(|file| file.sync_all())
        .map_err(|e| Error::io("writing", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io("renaming into", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_score_that_is_nan_or_a_missing_image_fails_the_check() {
        use arrow_array::{ArrayRef, FixedSizeListArray, Float32Array, StringArray};
        use std::sync::Arc;
        let batch = |ids: &[usize], value: f32| {
            let paths: ArrayRef = Arc::new(StringArray::from_iter_values(
                ids.iter().map(|i| format!("d/img-{i:05}.jpg")),
            ));
            let item = Arc::new(arrow_schema::Field::new(
                "item",
                arrow_schema::DataType::Float32,
                false,
            ));
            let values = Float32Array::from(vec![value; ids.len() * RESNET_CLASSES]);
            let scores: ArrayRef = Arc::new(
                FixedSizeListArray::try_new(item, RESNET_CLASSES as i32, Arc::new(values), None)
                    .unwrap(),
            );
            RecordBatch::try_from_iter([("path", paths), ("scores", scores)]).unwrap()
        };
        let all: Vec<usize> = (0..W7_IMAGES).collect();
        let out = Path::new("out");
        assert_eq!(
            check_scores(&[batch(&all, 1.0)], out).unwrap(),
            (2000, true)
        );
        assert!(!check_scores(&[batch(&all, f32::NAN)], out).unwrap().1);
        assert!(!check_scores(&[batch(&all[1..], 1.0)], out).unwrap().1);
        let twice = [batch(&all, 1.0), batch(&[7], 1.0)];
        assert!(!check_scores(&twice, out).unwrap().1);
    }
}
