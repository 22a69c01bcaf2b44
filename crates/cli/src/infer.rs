//! `streambatch infer`, the main job: batch inference with an ONNX model
//! over a synthetic image dataset, on the embedded one-node default, or
//! with `--cluster FILE` on the cluster whose head FILE names (the same
//! code; see the README).
//!
//! Makes `data/images/` (64,000 64x64x3 images in 128 Parquet files,
//! 750 MiB, fixed seed) and `data/models/convnet.onnx` (the project's own
//! network: convolutions, batch normalisation, pooling and a projection to
//! 256, seeded weights) if absent, then runs read_parquet -> preprocess
//! (CPU) -> the model (a stateful operator: one session per worker, kept
//! warm) -> write_parquet(out/embeddings), with live progress per operator
//! and a stats table at the end. `--model FILE` runs the user's model
//! instead, its one input fed the images' pixels. It checks every output
//! against the reference engine (rten) run directly on the same images.
//!
//! It lives in the `streambatch` binary, so that the main job, the CLI and
//! the benchmark harness share one release build. The pipeline uses only
//! the public API; making the images and the check come from the
//! benchmark crate.

use std::path::{Path, PathBuf};

use streambatch::prelude::*;
use streambatch_bench as bench;

const SEED: u64 = 42;
/// The dataset: 128 Parquet files of 500 images (750 MiB), enough that the progress
/// bars move for several seconds on a laptop's cores.
const FILES: usize = 128;
const IMAGES_PER_FILE: usize = 500;
/// Where the main job's own model is made.
const CONVNET: &str = "data/models/convnet.onnx";

/// Runs the main job on the embedded node, or on `cluster`'s nodes, with
/// the project's convnet or the model file `model`.
pub fn run(cluster: Option<&Path>, model: Option<&Path>) -> Result<()> {
    let images = Path::new("data/images");
    // The last file missing: the data is absent, or an older, smaller set.
    if !images
        .join(format!("images-{:03}.parquet", FILES - 1))
        .exists()
    {
        let n = FILES * IMAGES_PER_FILE;
        println!("making {n} synthetic images in {}", images.display());
        bench::make_images(images, FILES, IMAGES_PER_FILE, SEED)?;
    }
    let model_file = match model {
        Some(file) => file.to_path_buf(),
        None => make_convnet()?,
    };
    // Absolute, so that it is named the same wherever nodes started (an
    // object store URL names the same object everywhere).
    let model_file = match streambatch::object_url(&model_file) {
        Some(_) => model_file,
        None => std::fs::canonicalize(&model_file)
            .map_err(|e| streambatch::Error::io("opening", &model_file, e))?,
    };
    let onnx_error = |e: streambatch::onnx::OnnxError| streambatch::Error::Udf {
        operator: "onnx".into(),
        source: e.into(),
    };
    let mut onnx = OnnxModel::open(&model_file).map_err(onnx_error)?;
    let info = onnx.info().clone();
    let [input] = &info.inputs[..] else {
        return Err(streambatch::Error::Invalid(format!(
            "model {}: the main job feeds one input, the images' pixels; it has {}",
            model_file.display(),
            info.inputs.len()
        )));
    };
    onnx = onnx
        .input(&input.name, "pixels")
        .checked()
        .map_err(onnx_error)?;
    // On a cluster the driver sends its file: a node needs no copy.
    if cluster.is_some() && streambatch::object_url(&model_file).is_none() {
        onnx = onnx.send_to_nodes();
    }
    let output = info.outputs[0].name.clone();
    println!("model {}: {info}", model_file.display());

    let ctx = match cluster {
        Some(file) => {
            println!("connecting to the cluster of {}", file.display());
            Context::connect(file)?.with_progress()
        }
        None => {
            let ctx = Context::local()?.with_progress();
            println!(
                "node: {} CPU slots, {} GPU slots, store {}",
                ctx.config().cpus,
                ctx.config().gpus.unwrap_or(0.0),
                streambatch::format_bytes(ctx.config().store_capacity)
            );
            ctx
        }
    };
    let registry = streambatch::registry();
    let cpus = ctx.config().cpus.ceil().max(1.0) as usize;
    let ds = ctx
        .read_parquet("data/images")?
        .map_batches(registry.udf("preprocess", b"")?, Resources::cpu(1.0))
        .map_batches(
            onnx.clone(),
            Resources::cpu(1.0).batch_rows(64).pool(1, cpus),
        );
    let files = ds.write_parquet("out/embeddings")?;
    let stats = ds.stats().expect("the job ran");
    println!("\nwrote {} files to out/embeddings\n{stats}", files.len());

    // Check every output written against the reference engine's answer.
    let written = Path::new("out/embeddings");
    let check = bench::check_model_outputs(&ctx, images, written, &onnx, &output)?;
    if !check.all_match() {
        return Err(streambatch::Error::Udf {
            operator: "check".into(),
            source: format!(
                "of {} images, {} outputs written, {} equal to the reference engine's",
                check.images, check.rows, check.matching
            )
            .into(),
        });
    }
    println!(
        "checked all {} outputs against the reference engine run directly: equal within 1e-4",
        check.rows
    );
    Ok(())
}

/// Writes the project's convnet to [`CONVNET`] unless it is there already,
/// byte for byte.
fn make_convnet() -> Result<PathBuf> {
    let path = PathBuf::from(CONVNET);
    let bytes = streambatch::onnx::convnet(SEED);
    if std::fs::read(&path).ok().as_deref() != Some(&bytes[..]) {
        let dir = path.parent().expect("a file in a folder");
        std::fs::create_dir_all(dir).map_err(|e| streambatch::Error::io("making", dir, e))?;
        std::fs::write(&path, &bytes).map_err(|e| streambatch::Error::io("writing", &path, e))?;
    }
    Ok(path)
}
