//! cargo run --release -p streambatch-examples --example train
//!
//! Training ingest: one streaming job feeding two trainer processes, epoch
//! after epoch. The driver (this process) runs read_images (JPEGs of
//! 256x256) -> random resized crop to 224 -> flip on the embedded node,
//! split equally between two ranks (`Split::per_epoch`, so the crop and
//! flip change every epoch), and serves the ranks with the cluster's TLS.
//! It starts two trainer processes (this program with `--trainer`), each
//! opening its rank by handle with its own certificate and reading batches
//! of 64 from a shuffle buffer of 1,000 rows for 2 epochs, each batch
//! normalised to f32 as its collate step (after the buffer, which so holds
//! bytes, a quarter of the floats), a fixed sleep per batch standing for a
//! GPU step. Each trainer prints a line per epoch: images, time, and how long
//! it waited for data. Makes `data/train-images/` (2,000 seeded JPEGs) and
//! a throwaway cluster CA if absent.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use streambatch::arrow::schema::DataType;
use streambatch::prelude::*;
use streambatch::{Split, SplitOptions, TlsFiles};
use streambatch_split::{RemoteSplit, SplitHandle, SplitService};

const SEED: u64 = 7;
const IMAGES: usize = 2_000;
const EPOCHS: usize = 2;
const RANKS: usize = 2;
const BATCH: usize = 64;
/// A trainer's step per batch: a logical GPU.
const STEP: Duration = Duration::from_millis(20);

fn main() -> Result<()> {
    // SAFETY: first thing in `main`, one thread.
    unsafe { streambatch::use_private_runtime_dir() };
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag, handle, tls, name] if flag == "--trainer" => train(handle, Path::new(tls), name),
        [] => drive(),
        _ => Err(Error::Invalid(
            "usage: train (as the driver) or train --trainer HANDLE TLS_DIR NAME".into(),
        )),
    }
}

/// The driver: the pipeline, the split served, two trainer processes.
fn drive() -> Result<()> {
    let images = Path::new("data/train-images");
    if !images.join(format!("img-{:05}.jpg", IMAGES - 1)).exists() {
        println!(
            "making {IMAGES} JPEG images of 256x256 in {}",
            images.display()
        );
        streambatch_bench::make_jpegs(images, IMAGES, SEED)?;
    }
    // The certificates of the driver and the two trainers, made afresh in
    // the working directory's out/ (where the example writes), not under a
    // shared /tmp.
    let tls = Path::new("out/train-tls").to_path_buf();
    let _ = std::fs::remove_dir_all(&tls);
    std::fs::create_dir_all(&tls).map_err(|e| Error::Invalid(e.to_string()))?;
    streambatch::init_cluster(&tls, &["driver", "trainer-0", "trainer-1"])
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let ctx = Context::local()?;
    let dir = images.display().to_string();
    let plan_ctx = ctx.clone();
    let options = SplitOptions {
        equal: true,
        block_order_seed: Some(SEED),
        // Known: the next epoch's job starts while the trainers drain.
        epochs: Some(EPOCHS),
        ..SplitOptions::default()
    };
    let splits = Split::per_epoch(RANKS, options, move |epoch| {
        pipeline(&plan_ctx, &dir, epoch as u64)
    })?;
    let service = SplitService::start(
        splits,
        &TlsFiles::in_dir(&tls, "driver"),
        "127.0.0.1:0".parse().expect("an address"),
    )?;
    println!(
        "serving {RANKS} ranks on {} to trainer processes",
        service.addr()
    );
    let start = Instant::now();
    let trainers: Vec<_> = service
        .handles()
        .iter()
        .map(|handle| {
            let exe = std::env::current_exe().map_err(|e| Error::Invalid(e.to_string()))?;
            Command::new(exe)
                .arg("--trainer")
                .arg(handle.to_string())
                .arg(&tls)
                .arg(format!("trainer-{}", handle.rank))
                .spawn()
                .map_err(|e| Error::Invalid(format!("starting a trainer: {e}")))
        })
        .collect::<Result<_>>()?;
    for mut trainer in trainers {
        let status = trainer.wait().map_err(|e| Error::Invalid(e.to_string()))?;
        if !status.success() {
            return Err(Error::Invalid(format!("a trainer failed: {status}")));
        }
    }
    let images_in_all: usize = service.stats().iter().map(|s| s.rows).sum();
    println!(
        "{images_in_all} images to {RANKS} trainers over {EPOCHS} epochs in {:.1} s ({:.0} images/s), {} left over by the equal split",
        start.elapsed().as_secs_f64(),
        images_in_all as f64 / start.elapsed().as_secs_f64(),
        service.dropped_rows()
    );
    Ok(())
}

/// Epoch `epoch`'s pipeline: decode, crop, flip (both seeded by the epoch
/// and each image's path); the trainers normalise.
fn pipeline(ctx: &Context, dir: &str, epoch: u64) -> Result<Dataset> {
    let cpu = || Resources::cpu(1.0);
    Ok(ctx
        .read_images(dir, 256, 256)?
        .map_batches(
            streambatch::ops::random_resized_crop((256, 256), (224, 224), (0.08, 1.0), SEED, epoch),
            cpu(),
        )
        .map_batches(streambatch::ops::flip((224, 224), 0.5, SEED, epoch), cpu()))
}

/// A trainer process: its rank, epoch after epoch.
fn train(handle: &str, tls: &Path, name: &str) -> Result<()> {
    let handle: SplitHandle = handle.parse()?;
    let split = RemoteSplit::open(&TlsFiles::in_dir(tls, name), &handle)?;
    for epoch in 0..EPOCHS {
        let normalize =
            streambatch::ops::normalize((224, 224), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]);
        let options = BatchOptions::rows(BATCH)
            .local_shuffle(1_000, SEED + epoch as u64)
            .collate(normalize)
            .prefetch(2);
        let mut batches = split.iter_batches(epoch, options)?;
        let (start, mut waited, mut images) = (Instant::now(), Duration::ZERO, 0);
        loop {
            let asked = Instant::now();
            let Some(batch) = batches.next() else { break };
            waited += asked.elapsed();
            let batch = batch?;
            let pixels = batch
                .column_by_name("pixels")
                .ok_or_else(|| Error::Invalid("no pixels column".into()))?;
            if !matches!(pixels.data_type(), DataType::FixedSizeList(item, _) if item.data_type() == &DataType::Float32)
            {
                return Err(Error::Invalid(format!(
                    "pixels not normalised: {}",
                    pixels.data_type()
                )));
            }
            images += pixels.len();
            std::thread::sleep(STEP); // the training step
        }
        let took = start.elapsed();
        println!(
            "rank {} epoch {epoch}: {images} images in {:.1} s ({:.0} images/s), waited {:.2} s for data ({:.0}%)",
            handle.rank,
            took.as_secs_f64(),
            images as f64 / took.as_secs_f64(),
            waited.as_secs_f64(),
            100.0 * waited.as_secs_f64() / took.as_secs_f64()
        );
    }
    Ok(())
}
