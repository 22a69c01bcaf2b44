//! Supervision: a worker killed by a panic is restarted, its task retried,
//! and the output is unchanged.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use common::{ctx, sorted_i64};
use streambatch::prelude::*;

fn doubled(
    ctx: &Context,
    panic_once: Option<Arc<AtomicBool>>,
) -> (Vec<i64>, streambatch::JobStats) {
    let ds = ctx
        .range(1000, 20)
        .map_batches(
            move |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                let ids = b.column(0).as_primitive::<Int64Type>();
                if ids.values().contains(&500)
                    && panic_once
                        .as_ref()
                        .is_some_and(|f| !f.swap(true, Ordering::SeqCst))
                {
                    panic!("injected panic on the partition holding 500");
                }
                let doubled =
                    arrow_array::Int64Array::from_iter_values(ids.values().iter().map(|v| v * 2));
                Ok(RecordBatch::try_from_iter([("d", Arc::new(doubled) as _)])?)
            },
            Resources::cpu(0.5),
        )
        .named("double");
    let out = ds.collect().unwrap();
    (sorted_i64(&out, "d"), ds.stats().unwrap())
}

#[test]
fn a_panicking_worker_is_restarted_and_the_output_is_unchanged() {
    let ctx = ctx();
    let (plain, _) = doubled(&ctx, None);
    let (with_panic, stats) = doubled(&ctx, Some(Arc::new(AtomicBool::new(false))));
    assert_eq!(with_panic, plain);
    assert_eq!(plain, (0..1000).map(|i| i * 2).collect::<Vec<_>>());
    assert_eq!(stats.operators[1].retries, 1);
    // The node keeps working after the restart.
    assert_eq!(ctx.range(100, 10).count().unwrap(), 100);
}

#[test]
fn a_task_that_always_panics_fails_the_job_naming_the_operator() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let a = attempts.clone();
    let err = ctx()
        .range(10, 1)
        .map_batches(
            move |_b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                a.fetch_add(1, Ordering::SeqCst);
                panic!("always")
            },
            Resources::cpu(0.5),
        )
        .named("always_panics")
        .count()
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("always_panics") && text.contains("panicked"),
        "{text}"
    );
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        4,
        "one try and three retries"
    );
}
