//! `streambatch infer`, the main job: batch inference over a synthetic
//! image dataset on the embedded one-node default, or with `--cluster FILE`
//! on the cluster whose head FILE names (the same code; see the README).
//! Makes `data/images/` (64,000 64x64x3 images in 128 Parquet files,
//! 750 MiB, fixed seed) if absent, then runs read_parquet -> preprocess
//! (CPU) -> embed (a 12,288 x 256 matmul: a WGSL kernel on the GPU where a
//! hardware adapter exists, else a stateful CPU operator set up once per
//! worker) -> write_parquet(out/embeddings), with live progress per
//! operator and a stats table at the end. It checks every embedding
//! against a direct computation.
//!
//! It lives in the `streambatch` binary, so that the main job, the CLI and
//! the benchmark harness share one release build. The pipeline uses only
//! the public API: its operators come from the built-in registry
//! (`streambatch::registry()`), so that any node can rebuild them; making
//! the images and the check come from the benchmark crate.

use std::path::Path;

use streambatch::prelude::*;
use streambatch_bench as bench;

const SEED: u64 = 42;
/// The dataset: 128 Parquet files of 500 images (750 MiB), enough that the progress
/// bars move for several seconds on a laptop's cores.
const FILES: usize = 128;
const IMAGES_PER_FILE: usize = 500;

/// Runs the main job on the embedded node, or on `cluster`'s nodes.
pub fn run(cluster: Option<&Path>) -> Result<()> {
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
    let seed = SEED.to_le_bytes();
    let pixels = ctx
        .read_parquet("data/images")?
        .map_batches(registry.udf("preprocess", b"")?, Resources::cpu(1.0));
    // The embedding runs as a WGSL kernel where this process found a real
    // GPU, and as a CPU matmul (set up once per worker) otherwise: a
    // software rasterizer (lavapipe) embeds far slower than the matmul.
    let software_only = cluster.is_none() && !streambatch::GpuPool::global().has_hardware();
    let ds = match ctx.gpu_devices().first() {
        Some(device) if !software_only => {
            println!("embedding on the GPU: {device}");
            let embed = registry.udf("gpu_embedder", &seed)?;
            pixels.map_batches(embed, Resources::gpu(1.0).batch_rows(64))
        }
        found => {
            match found {
                Some(device) => {
                    println!("embedding on the CPU ({device} is a software rasterizer)")
                }
                None => println!("embedding on the CPU"),
            }
            let cpus = ctx.config().cpus.ceil().max(1.0) as usize;
            let embed = registry.udf("cpu_embedder", &seed)?;
            pixels.map_batches(embed, Resources::cpu(1.0).batch_rows(64).pool(1, cpus))
        }
    };
    let files = ds.write_parquet("out/embeddings")?;
    let stats = ds.stats().expect("the job ran");
    println!("\nwrote {} files to out/embeddings\n{stats}", files.len());

    // Check every embedding written against a direct computation.
    let output = Path::new("out/embeddings");
    let check = bench::check_embeddings(&ctx, images, output, SEED)?;
    if !check.all_match() {
        return Err(streambatch::Error::Udf {
            operator: "check".into(),
            source: format!(
                "of {} images, {} embeddings written, {} equal to the direct computation",
                check.images, check.rows, check.matching
            )
            .into(),
        });
    }
    println!(
        "checked all {} embeddings against a direct computation: equal within 1e-4",
        check.rows
    );
    Ok(())
}
