//! A W6 trainer process: opens its rank of the driver's split by handle
//! with its own certificate and reads it epoch after epoch in batches of
//! 64 (through a shuffle window where the workload has one; two batches
//! made ahead; W6a's normalised to f32 as they are made, by the collate),
//! sleeping a fixed step per batch (a logical GPU). Checks
//! every row it gets and prints a JSON line per epoch (the ids it got, its time, its time waiting
//! for data, the rows that were wrong), then one with its peak memory and
//! where its pieces came from (the driver, or the nodes holding them).
//!
//! W6a's rows: every value in the range normalising a byte gives (NaN
//! fails), and one image in [`RECOMPUTED_EVERY`] made again here from its
//! file with the same operators, seeded by its path and the epoch, and
//! compared value for value: an image that reached the wrong row or epoch,
//! or was not cropped, flipped or normalised as asked, fails.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type};
use streambatch::{BatchOptions, Error, Result, TlsFiles};
use streambatch_split::{RemoteSplit, SplitHandle};

use super::{BATCH, RowCheck, SEED, image_id};
use crate::{checksum, checksum_filled, peak_rss_mib, w1_byte};

/// What the driver tells a trainer process (one JSON argument).
pub(super) struct TrainerSpec {
    pub handle: SplitHandle,
    pub tls_dir: PathBuf,
    pub name: String,
    pub epochs: usize,
    pub step: Duration,
    /// The local shuffle buffer's rows (0: none).
    pub shuffle_rows: usize,
    pub rows: RowCheck,
}

impl TrainerSpec {
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "handle": self.handle.to_string(),
            "tls_dir": self.tls_dir,
            "name": self.name,
            "epochs": self.epochs,
            "step_s": self.step.as_secs_f64(),
            "shuffle_rows": self.shuffle_rows,
            "rows": self.rows.name(),
        })
        .to_string()
    }

    fn parse(text: &str) -> Result<Self> {
        let bad = |what: &str| Error::Invalid(format!("a W6 trainer's spec: {what} in {text}"));
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
        let text_of = |key: &str| v[key].as_str().ok_or_else(|| bad(&format!("no `{key}`")));
        Ok(Self {
            handle: text_of("handle")?.parse()?,
            tls_dir: text_of("tls_dir")?.into(),
            name: text_of("name")?.into(),
            epochs: v["epochs"].as_u64().ok_or_else(|| bad("no `epochs`"))? as usize,
            step: Duration::from_secs_f64(v["step_s"].as_f64().ok_or_else(|| bad("no `step_s`"))?),
            shuffle_rows: v["shuffle_rows"]
                .as_u64()
                .ok_or_else(|| bad("no `shuffle_rows`"))? as usize,
            rows: RowCheck::named(text_of("rows")?).ok_or_else(|| bad("an unknown `rows`"))?,
        })
    }
}

/// Runs a trainer process from its spec (`streambatch bench w6a --trainer
/// SPEC`).
pub fn w6_trainer(spec: &str) -> Result<()> {
    let spec = TrainerSpec::parse(spec)?;
    let split = RemoteSplit::open(&TlsFiles::in_dir(&spec.tls_dir, &spec.name), &spec.handle)?;
    for epoch in 0..spec.epochs {
        let batches = BatchOptions::rows(BATCH).prefetch(2);
        let batches = match spec.rows {
            RowCheck::Pixels => batches.collate(super::normalize()),
            RowCheck::Filled => batches,
        };
        let options = match spec.shuffle_rows {
            0 => batches,
            rows => batches.local_shuffle(rows, SEED + epoch as u64),
        };
        let mut batches = split.iter_batches(epoch, options)?;
        let (started, mut waited) = (Instant::now(), Duration::ZERO);
        let (mut ids, mut wrong) = (Vec::new(), 0usize);
        loop {
            let asked = Instant::now();
            let Some(batch) = batches.next() else { break };
            waited += asked.elapsed();
            wrong += check(&batch?, spec.rows, epoch, &mut ids)?;
            std::thread::sleep(spec.step); // the training step
        }
        let line = serde_json::json!({
            "rank": spec.handle.rank,
            "epoch": epoch,
            "took_s": started.elapsed().as_secs_f64(),
            "waited_s": waited.as_secs_f64(),
            "wrong_rows": wrong,
            "ids": ids,
        });
        println!("{line}");
    }
    let sources = split.piece_sources();
    println!(
        "{}",
        serde_json::json!({
            "peak_rss_mib": peak_rss_mib(),
            "pieces_from_driver": sources.driver,
            "pieces_from_nodes": sources.node_memory + sources.node_bytes,
            "pieces_unfetched": sources.unfetched,
        })
    );
    Ok(())
}

/// W6a makes one image in this many again to compare (about 2% of the
/// pipeline's work over again, on the trainers).
const RECOMPUTED_EVERY: i64 = 32;

/// Adds the ids of `batch`'s rows (of `epoch`) to `ids`; the number of
/// rows whose values are not what the pipeline makes.
fn check(batch: &RecordBatch, rows: RowCheck, epoch: usize, ids: &mut Vec<i64>) -> Result<usize> {
    let missing = |c: &str| Error::Invalid(format!("a W6 batch has no {c} column"));
    match rows {
        RowCheck::Pixels => {
            let paths = batch
                .column_by_name("path")
                .ok_or_else(|| missing("`path`"))?;
            let pixels = batch
                .column_by_name("pixels")
                .ok_or_else(|| missing("`pixels`"))?;
            let (paths, pixels) = (paths.as_string::<i32>(), pixels.as_fixed_size_list());
            let mut wrong = 0;
            for row in 0..batch.num_rows() {
                let id = image_id(paths.value(row)).unwrap_or(-1);
                ids.push(id);
                let values = pixels.value(row);
                let values = values.as_primitive::<Float32Type>().values();
                let mut right = normalised(values);
                if (id + epoch as i64) % RECOMPUTED_EVERY == 0 {
                    right &= made_again(paths.value(row), epoch)?[..] == values[..];
                }
                wrong += usize::from(!right);
            }
            Ok(wrong)
        }
        RowCheck::Filled => {
            let id = batch.column_by_name("id").ok_or_else(|| missing("`id`"))?;
            let data = batch
                .column_by_name("data")
                .ok_or_else(|| missing("`data`"))?;
            let (id, data) = (id.as_primitive::<Int64Type>(), data.as_binary::<i32>());
            let mut wrong = 0;
            for (id, bytes) in id.values().iter().zip(data.iter()) {
                ids.push(*id);
                let bytes = bytes.unwrap_or_default();
                let want = checksum_filled(w1_byte(*id), super::W6B_IMAGE_BYTES);
                wrong +=
                    usize::from(bytes.len() != super::W6B_IMAGE_BYTES || checksum(bytes) != want);
            }
            Ok(wrong)
        }
    }
}

/// The image at `path` as W6a's pipeline makes it in `epoch`, here: read
/// as `read_images` reads it (decoded to 8-bit RGB, already 256 x 256),
/// then the same operators with the same seeds.
fn made_again(path: &str, epoch: usize) -> Result<Vec<f32>> {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, BinaryArray, StringArray};
    let bad = |e: &dyn std::fmt::Display| Error::Invalid(format!("making {path} again: {e}"));
    let image = image::open(path)
        .map_err(|e| bad(&e))?
        .into_rgb8()
        .into_raw();
    let batch = RecordBatch::try_from_iter([
        ("path", Arc::new(StringArray::from(vec![path])) as ArrayRef),
        (
            "image",
            Arc::new(BinaryArray::from_vec(vec![&image[..]])) as ArrayRef,
        ),
    ])
    .map_err(|e| bad(&e))?;
    let made = super::augment_batch(batch, epoch as u64).map_err(|e| bad(&e))?;
    let pixels = made
        .column_by_name("pixels")
        .ok_or_else(|| bad(&"no `pixels`"))?
        .as_fixed_size_list()
        .value(0);
    Ok(pixels.as_primitive::<Float32Type>().values().to_vec())
}

/// Whether an image's values are what normalising bytes gives: 224 x 224 x
/// 3 of them, each finite and between (0 - mean) / std and (1 - mean) / std
/// of some channel (NaN fails every comparison).
fn normalised(values: &[f32]) -> bool {
    let (low, high) = super::NORMALISED_RANGE;
    let side = super::SIDE as usize;
    // Counted rather than `all`: a loop without an early exit vectorises.
    let outside: usize = values
        .iter()
        .map(|&v| usize::from(!(v >= low && v <= high)))
        .sum();
    values.len() == side * side * 3 && outside == 0
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, BinaryArray, StringArray};
    use streambatch::arrow::schema::{DataType, Field};

    use super::*;

    /// Image 0 of a fresh directory as the pipeline makes it in `epoch`.
    fn row(dir: &std::path::Path, epoch: usize) -> (RecordBatch, String) {
        super::super::make_jpegs(dir, 1, 7).unwrap();
        let path = dir.join("img-00000.jpg").display().to_string();
        let image = image::open(&path).unwrap().into_rgb8().into_raw();
        let batch = RecordBatch::try_from_iter([
            (
                "path",
                Arc::new(StringArray::from(vec![path.as_str()])) as ArrayRef,
            ),
            (
                "image",
                Arc::new(BinaryArray::from_vec(vec![&image[..]])) as ArrayRef,
            ),
        ])
        .unwrap();
        (
            super::super::augment_batch(batch, epoch as u64).unwrap(),
            path,
        )
    }

    #[test]
    fn a_row_of_another_epoch_or_with_a_nan_is_wrong() {
        let dir = std::env::temp_dir().join(format!("sb-w6-check-{}", std::process::id()));
        let (made, _) = row(&dir, 0);
        let mut ids = vec![];
        assert_eq!(check(&made, RowCheck::Pixels, 0, &mut ids).unwrap(), 0);
        assert_eq!(ids, [0]);
        // Epoch 32 also makes image 0 again, with other crops and flips.
        assert_eq!(check(&made, RowCheck::Pixels, 32, &mut ids).unwrap(), 1);
        // A NaN among the values: outside every range.
        let pixels = made.column_by_name("pixels").unwrap().as_fixed_size_list();
        let mut values = pixels
            .values()
            .as_primitive::<Float32Type>()
            .values()
            .to_vec();
        values[5] = f32::NAN;
        let nan = arrow_array::FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Float32, false)),
            pixels.value_length(),
            Arc::new(arrow_array::Float32Array::from(values)),
            None,
        );
        let nan = RecordBatch::try_new(made.schema(), vec![made.column(0).clone(), Arc::new(nan)])
            .unwrap();
        assert_eq!(check(&nan, RowCheck::Pixels, 1, &mut ids).unwrap(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
