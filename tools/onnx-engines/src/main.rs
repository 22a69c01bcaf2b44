//! Runs one model on tract and on rten over the same batches of seeded
//! inputs, on every CPU, and prints each engine's images per second and
//! how far apart their outputs are.

use std::time::Instant;

use rten_tensor::prelude::*;
use tract_onnx::prelude::*;

const BATCH: usize = 32;
const BATCHES: usize = 4;
const SIDE: usize = 224;

fn main() -> TractResult<()> {
    let path = std::env::args().nth(1).expect("a model file (data/w7/resnet50.onnx)");
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let inputs: Vec<Vec<f32>> = (0..BATCHES)
        .map(|b| {
            (0..BATCH * SIDE * SIDE * 3)
                .map(|i| (((i + b * 7919) * 2_654_435_761) % 1000) as f32 / 500.0 - 1.0)
                .collect()
        })
        .collect();

    tract_linalg::multithread::set_default_executor(tract_linalg::multithread::Executor::multithread(threads));
    let model = tract_onnx::onnx()
        .model_for_path(&path)?
        .with_input_fact(0, f32::fact([BATCH, SIDE, SIDE, 3]).into())?
        .into_optimized()?
        .into_runnable()?;
    let tract_run = |x: &Vec<f32>| -> TractResult<Vec<f32>> {
        let t = tract_ndarray::Array4::from_shape_vec((BATCH, SIDE, SIDE, 3), x.clone())?;
        let out = model.run(tvec!(Tensor::from(t).into()))?;
        Ok(out[0].to_array_view::<f32>()?.iter().copied().collect())
    };
    tract_run(&inputs[0])?; // warm
    let started = Instant::now();
    let tract_out: Vec<Vec<f32>> = inputs.iter().map(tract_run).collect::<TractResult<_>>()?;
    let tract_s = started.elapsed().as_secs_f64();

    let pool = std::sync::Arc::new(rten::ThreadPool::with_num_threads(threads));
    let rten_model = rten::Model::load_file(&path).expect("rten loads it");
    let (input_id, output_id) = (rten_model.input_ids()[0], rten_model.output_ids()[0]);
    let rten_run = |x: &Vec<f32>| -> Vec<f32> {
        let t = rten_tensor::NdTensor::from_data([BATCH, SIDE, SIDE, 3], x.clone());
        let opts = rten::RunOptions::default().with_thread_pool(Some(pool.clone()));
        let out = rten_model
            .run(vec![(input_id, t.view().into())], &[output_id], Some(opts))
            .expect("rten runs it");
        let out: rten_tensor::Tensor<f32> = out.into_iter().next().unwrap().try_into().unwrap();
        out.to_vec()
    };
    rten_run(&inputs[0]);
    let started = Instant::now();
    let rten_out: Vec<Vec<f32>> = inputs.iter().map(rten_run).collect();
    let rten_s = started.elapsed().as_secs_f64();

    let mut worst = 0f32;
    for (a, b) in tract_out.iter().zip(&rten_out) {
        for (row_a, row_b) in a.chunks(1000).zip(b.chunks(1000)) {
            let scale = row_b.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
            for (x, y) in row_a.iter().zip(row_b) {
                worst = worst.max((x - y).abs() / scale);
            }
        }
    }
    let images = (BATCH * BATCHES) as f64;
    println!(
        "{{\"threads\": {threads}, \"images\": {images}, \"tract_images_per_s\": {:.2}, \"rten_images_per_s\": {:.2}, \"largest_difference\": {worst:e}}}",
        images / tract_s,
        images / rten_s
    );
    Ok(())
}
