//! cargo run --release -p streambatch-examples --example embedding_report
//!
//! A report on the main job's output (run `cargo run --release -- infer`
//! first): its 64,000 embeddings joined with a table of
//! labels (made here from the ids: the first 60,000 images have one),
//! counted per label, and the images without a label found by an anti
//! join. The README shows the same code.

use streambatch::prelude::*;

fn main() -> Result<()> {
    // SAFETY: first thing in `main`, one thread (see `streambatch infer`).
    unsafe { streambatch::use_private_runtime_dir() };
    if !std::path::Path::new("out/embeddings").exists() {
        return Err(Error::Invalid(
            "no out/embeddings: run `cargo run --release -- infer` first".into(),
        ));
    }
    let ctx = Context::local()?;
    let embeddings = ctx.read_parquet("out/embeddings")?; // id, embedding
    let labels = ctx
        .range(60_000, 4)
        .with_column("label", col("id") % lit(10));
    let per_label = embeddings
        .join(&labels, &["id"], JoinHow::Inner)?
        .groupby(&["label"])
        .aggregate(&[Agg::count(), Agg::min("id"), Agg::max("id")])
        .sort(&["label"], false);
    let batches = per_label.collect()?;
    println!("{}", per_label.explain()?);
    println!("label  count()  min(id)  max(id)");
    let mut counted = 0;
    for batch in &batches {
        let column = |i: usize| {
            batch
                .column(i)
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>()
                .expect("Int64 columns")
                .clone()
        };
        let (label, count, min, max) = (column(0), column(1), column(2), column(3));
        for row in 0..batch.num_rows() {
            println!(
                "{:>5}  {:>7}  {:>7}  {:>7}",
                label.value(row),
                count.value(row),
                min.value(row),
                max.value(row)
            );
            counted += count.value(row);
        }
    }
    let unlabelled = embeddings.join(&labels, &["id"], JoinHow::Anti)?.count()?;
    println!("{counted} embeddings labelled, {unlabelled} without a label");
    if counted != 60_000 || unlabelled != 4_000 {
        return Err(Error::Invalid(format!(
            "expected 60,000 labelled and 4,000 unlabelled, got {counted} and {unlabelled}"
        )));
    }
    Ok(())
}
