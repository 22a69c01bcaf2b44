//! cargo run --release --example batch_inference
//!
//! The main job: batch inference over a synthetic image dataset on the
//! embedded one-node default. Makes `data/images/` (400 64x64x3 images in 8
//! Parquet files, fixed seed) if absent, then runs
//! read_parquet -> preprocess (CPU) -> embed (a 12,288 x 256 matmul: a WGSL
//! kernel on the GPU where an adapter exists, else a stateful CPU operator
//! set up once per worker) -> write_parquet(out/embeddings),
//! with live progress per operator and a stats table at the end. It checks
//! a sample of the embeddings against a direct computation.

use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type};
use streambatch::prelude::*;
use streambatch::workloads::{self, CpuEmbedder, EMBED_DIM};

const SEED: u64 = 42;

fn main() -> Result<()> {
    let images = Path::new("data/images");
    if !images.exists() {
        println!("making 400 synthetic images in {}", images.display());
        workloads::make_images(images, 8, 50, SEED)?;
    }
    let ctx = Context::local()?.with_progress();
    println!(
        "node: {} CPU slots, {} GPU slots, store {}",
        ctx.config().cpus,
        ctx.config().gpus.unwrap_or(0.0),
        streambatch::format_bytes(ctx.config().store_capacity)
    );
    let pixels = ctx
        .read_parquet("data/images")?
        .map_batches(workloads::preprocess, Resources::cpu(1.0))
        .named("preprocess");
    // The embedding runs as a WGSL kernel where a GPU adapter exists, and
    // as a CPU matmul otherwise.
    let devices = ctx.gpu_devices();
    let ds = match devices.first() {
        Some(device) => {
            println!("embedding on the GPU: {device}");
            pixels.map_batches(
                workloads::gpu_embedder(SEED)?,
                Resources::gpu(1.0).batch_rows(64),
            )
        }
        None => {
            println!("embedding on the CPU (no GPU adapter found)");
            let cpus = ctx.config().cpus.ceil().max(1.0) as usize;
            let embed = Stateful::new("embed", || Ok::<_, UdfError>(CpuEmbedder::new(SEED)));
            pixels.map_batches(embed, Resources::cpu(1.0).batch_rows(64).pool(1, cpus))
        }
    };
    let files = ds.write_parquet("out/embeddings")?;
    let stats = ds.stats().expect("the job ran");
    println!("\nwrote {} files to out/embeddings\n{stats}", files.len());

    // Check a sample of the output against a direct computation.
    let weights = workloads::embedding_weights(SEED);
    let inputs = ctx
        .read_parquet("data/images")?
        .filter((col("id") % lit(50)).eq(lit(7)))
        .collect()?;
    let outputs = ctx
        .read_parquet("out/embeddings")?
        .filter((col("id") % lit(50)).eq(lit(7)))
        .collect()?;
    let mut checked = 0;
    for input in &inputs {
        let ids = input.column(0).as_primitive::<Int64Type>();
        for (row, id) in ids.values().iter().enumerate() {
            let expected = workloads::reference_embedding(
                input.column(1).as_binary::<i32>().value(row),
                &weights,
            );
            let got = outputs
                .iter()
                .find_map(|b| {
                    let ids = b.column(0).as_primitive::<Int64Type>();
                    ids.values().iter().position(|x| x == id).map(|r| {
                        let list = b.column(1).as_fixed_size_list();
                        list.value(r)
                            .as_primitive::<Float32Type>()
                            .values()
                            .to_vec()
                    })
                })
                .ok_or_else(|| {
                    streambatch::Error::Execution(format!("no embedding for image {id}"))
                })?;
            let err = got
                .iter()
                .zip(&expected)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            let scale = expected
                .iter()
                .map(|x| x.abs())
                .fold(0f32, f32::max)
                .max(1e-6);
            if got.len() != EMBED_DIM || err / scale > 1e-3 {
                return Err(streambatch::Error::Execution(format!(
                    "embedding of image {id} is off by {err}"
                )));
            }
            checked += 1;
        }
    }
    println!("checked {checked} embeddings against a direct computation: equal within 1e-3");
    Ok(())
}
