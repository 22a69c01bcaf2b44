//! Supervision and failure classes: a worker killed by a panic is restarted
//! and its task retried; an operator's own error fails the job, or is
//! retried (`retry_user_errors`) or skipped (`max_errored_partitions`).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use common::{ctx, ctx_with, sorted_i64};
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

/// `range(100, 10)` -> `check`, whose UDF errs on the partitions holding
/// 30 and 70 (each once when `once`, else always).
fn checked(ctx: &Context, once: bool) -> Result<(Vec<i64>, streambatch::JobStats)> {
    let failed: Arc<std::sync::Mutex<Vec<i64>>> = Arc::default();
    let ds = ctx
        .range(100, 10)
        .map_batches(
            move |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                let ids = b.column(0).as_primitive::<Int64Type>();
                for bad in [30, 70] {
                    let mut seen = failed.lock().unwrap();
                    if ids.values().contains(&bad) && !(once && seen.contains(&bad)) {
                        seen.push(bad);
                        return Err(format!("row {bad} is bad").into());
                    }
                }
                Ok(b)
            },
            Resources::cpu(0.5),
        )
        .named("check");
    let out = ds.collect()?;
    Ok((sorted_i64(&out, "id"), ds.stats().unwrap()))
}

#[test]
fn an_operators_error_fails_the_job_at_once_by_default() {
    let err = checked(&ctx(), true).unwrap_err().to_string();
    assert!(err.contains("check") && err.contains("is bad"), "{err}");
}

#[test]
fn an_operators_error_is_retried_when_the_job_asks() {
    let ctx = ctx_with(|c| c.retry_user_errors = true);
    let (ids, stats) = checked(&ctx, true).unwrap();
    assert_eq!(ids, (0..100).collect::<Vec<_>>());
    assert_eq!(stats.operators[1].retries, 2);
    assert!(stats.errored.is_empty());
    // An error that repeats still fails the job, after the retries.
    let err = checked(&ctx, false).unwrap_err().to_string();
    assert!(err.contains("is bad"), "{err}");
}

#[test]
fn bad_inputs_are_skipped_up_to_the_limit_and_listed() {
    let ctx = ctx_with(|c| c.max_errored_partitions = 2);
    let (ids, stats) = checked(&ctx, false).unwrap();
    let expected: Vec<i64> = (0..100)
        .filter(|i| !(30..40).contains(i) && !(70..80).contains(i))
        .collect();
    assert_eq!(ids, expected);
    assert_eq!(stats.errored.len(), 2);
    for skipped in &stats.errored {
        assert!(skipped.stage.contains("check"), "{skipped:?}");
        assert!(skipped.message.contains("is bad"), "{skipped:?}");
        assert!(skipped.input.contains("10 rows"), "{skipped:?}");
    }
    assert!(stats.to_string().contains("skipped: task"), "{stats}");
    // One more bad input than allowed: the job fails.
    let strict = ctx_with(|c| c.max_errored_partitions = 1);
    let err = checked(&strict, false).unwrap_err().to_string();
    assert!(err.contains("is bad"), "{err}");
}
