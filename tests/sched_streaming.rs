//! Dynamic splitting, streaming between stages, memory-aware backpressure,
//! slot limits, early stop under `limit`, and worker pools.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use common::{ctx_with, sorted_i64};
use streambatch::prelude::*;
use streambatch::{EventKind, StageId, batch_bytes};

/// A flag one thread raises and another waits for, with a timeout.
#[derive(Clone, Default)]
struct Flag(Arc<(Mutex<bool>, Condvar)>);

impl Flag {
    fn raise(&self) {
        *self.0.0.lock().unwrap() = true;
        self.0.1.notify_all();
    }
    fn wait(&self, timeout: Duration) -> bool {
        let guard = self.0.0.lock().unwrap();
        *self
            .0
            .1
            .wait_timeout_while(guard, timeout, |raised| !*raised)
            .unwrap()
            .0
    }
}

#[test]
fn expansion_is_split_into_partitions_and_streams_downstream_before_the_task_ends() {
    let target: u64 = 64 * 1024;
    let ctx = ctx_with(|c| c.target_partition_bytes = target);
    let downstream_started = Flag::default();
    let (waiter, raiser) = (downstream_started.clone(), downstream_started.clone());
    let ds = ctx
        .range(100, 1)
        .flat_map(move |r: Row| {
            let id = r.int("id").unwrap();
            if id == 99 {
                // The last input row waits for the downstream stage: with no
                // streaming, this would time out.
                assert!(
                    waiter.wait(Duration::from_secs(60)),
                    "downstream never started while flat_map ran"
                );
            }
            Ok::<_, UdfError>(
                (0..100)
                    .map(|k| {
                        Row::new()
                            .with("id", id)
                            .with("k", k)
                            .with("pad", vec![k as u8; 100])
                    })
                    .collect(),
            )
        })
        .map_batches(
            move |b: RecordBatch| {
                raiser.raise();
                Ok::<_, UdfError>(b)
            },
            Resources::cpu(0.5),
        );
    let out = ds.collect().unwrap();

    // 10,000 rows of about 130 bytes: many partitions, none over target + one row.
    let row_bytes = 8 + 8 + 100 + 4;
    assert!(out.len() >= 15, "only {} partitions", out.len());
    for b in &out {
        assert!(
            batch_bytes(b) <= target + row_bytes,
            "a partition of {} bytes",
            batch_bytes(b)
        );
    }
    let mut pairs: Vec<(i64, i64)> = out
        .iter()
        .flat_map(|b| {
            let ids = b
                .column_by_name("id")
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec();
            let ks = b
                .column_by_name("k")
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec();
            ids.into_iter().zip(ks)
        })
        .collect();
    pairs.sort();
    assert_eq!(
        pairs,
        (0..100)
            .flat_map(|i| (0..100).map(move |k| (i, k)))
            .collect::<Vec<_>>()
    );

    // From the recorded events: stage 1 got its first task before stage 0's only task ended.
    let stats = ds.stats().unwrap();
    let first_downstream = stats
        .position(|e| e.stage == StageId(1) && e.kind == EventKind::TaskStarted)
        .unwrap();
    let expander_done = stats
        .position(|e| e.stage == StageId(0) && e.kind == EventKind::TaskFinished)
        .unwrap();
    assert!(
        first_downstream < expander_done,
        "events: {:?}",
        &stats.events[..stats.events.len().min(40)]
    );
    assert_eq!(stats.operators[0].tasks, 1);
}

/// W2's shape scaled down: 20 rows -> 10 rows of 1 MiB each (200 MiB) ->
/// a byte sum per row.
fn expand_and_reduce(ctx: &Context) -> (Vec<(i64, i64, i64)>, streambatch::JobStats) {
    // An odd length, so that byte sums mod 256 differ from row to row.
    const ROW: usize = (1 << 20) + 1;
    let ds = ctx
        .range(20, 4)
        .flat_map(|r: Row| {
            let id = r.int("id").unwrap();
            Ok::<_, UdfError>(
                (0..10)
                    .map(|k| {
                        let bytes = vec![((id * 10 + k) % 251) as u8; ROW];
                        Row::new().with("id", id).with("k", k).with("data", bytes)
                    })
                    .collect(),
            )
        })
        .map_batches(
            |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                let data = b.column_by_name("data").unwrap().as_binary::<i32>();
                let sums: ArrayRef =
                    Arc::new(Int64Array::from_iter_values(data.iter().map(|d| {
                        d.unwrap().iter().map(|&x| x as i64).sum::<i64>() % 256
                    })));
                Ok(RecordBatch::try_from_iter([
                    ("id", b.column_by_name("id").unwrap().clone()),
                    ("k", b.column_by_name("k").unwrap().clone()),
                    ("sum", sums),
                ])?)
            },
            Resources::cpu(0.5),
        );
    let out = ds.collect().unwrap();
    let mut rows: Vec<(i64, i64, i64)> = out
        .iter()
        .flat_map(|b| {
            let col = |n: &str| {
                b.column_by_name(n)
                    .unwrap()
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec()
            };
            let (i, k, s) = (col("id"), col("k"), col("sum"));
            (0..b.num_rows()).map(move |r| (i[r], k[r], s[r]))
        })
        .collect();
    rows.sort();
    (rows, ds.stats().unwrap())
}

#[test]
fn memory_pressure_stays_within_a_small_store_and_matches_an_uncapped_run() {
    let cap: u64 = 16 << 20;
    let capped = ctx_with(|c| c.store_capacity = cap);
    let (rows, stats) = expand_and_reduce(&capped);
    assert!(
        stats.operators[0].bytes >= 200 << 20,
        "produced only {} bytes",
        stats.operators[0].bytes
    );
    assert!(
        stats.peak_store_bytes <= cap,
        "job peak {} > cap {cap}",
        stats.peak_store_bytes
    );
    assert!(
        capped.store_stats().peak_bytes <= cap,
        "store peak {} > cap {cap}",
        capped.store_stats().peak_bytes
    );
    // The cap bit: tasks paused with their output until memory was returned.
    assert!(
        stats
            .events
            .iter()
            .any(|e| e.kind == EventKind::TaskSuspended),
        "no task ever waited for memory"
    );

    let uncapped = ctx_with(|c| c.store_capacity = 4 << 30);
    let (expected, _) = expand_and_reduce(&uncapped);
    assert_eq!(rows.len(), 200);
    assert_eq!(rows, expected);
    // And both equal the direct computation.
    let direct: Vec<(i64, i64, i64)> = (0..20)
        .flat_map(|id| (0..10).map(move |k| (id, k, ((id * 10 + k) % 251) * ((1 << 20) + 1) % 256)))
        .collect();
    assert_eq!(rows, direct);
}

#[test]
fn a_gpu_stage_never_runs_more_tasks_than_gpu_slots() {
    let ctx = ctx_with(|c| {
        c.cpus = 8.0;
        c.gpus = Some(2.0);
    });
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (r, m) = (running.clone(), most.clone());
    let ds = ctx.range(40, 40).map_batches(
        move |b: RecordBatch| {
            let now = r.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            r.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, UdfError>(b)
        },
        Resources::gpu(1.0),
    );
    assert_eq!(
        sorted_i64(&ds.collect().unwrap(), "id"),
        (0..40).collect::<Vec<_>>()
    );
    assert!(
        most.load(Ordering::SeqCst) <= 2,
        "{} GPU tasks at once",
        most.load(Ordering::SeqCst)
    );
    let stats = ds.stats().unwrap();
    assert!(stats.peak_running[1] <= 2 && stats.peak_running[1] >= 1);
}

#[test]
fn a_gpu_stage_on_a_node_without_gpus_fails_naming_the_operator() {
    let ctx = ctx_with(|c| c.gpus = Some(0.0));
    let err = ctx
        .range(10, 2)
        .map_batches(|b: RecordBatch| Ok::<_, UdfError>(b), Resources::gpu(1.0))
        .named("embed_on_gpu")
        .count()
        .unwrap_err();
    assert!(
        err.to_string().contains("embed_on_gpu") && err.to_string().contains("GPU"),
        "{err}"
    );
}

#[test]
fn limit_stops_the_source_early() {
    let ctx = ctx_with(|c| c.cpus = 4.0);
    let ds = ctx.range(100_000, 1000).limit(10);
    assert_eq!(ds.count().unwrap(), 10);
    let stats = ds.stats().unwrap();
    let started = stats
        .events
        .iter()
        .filter(|e| e.stage == StageId(0) && e.kind == EventKind::TaskStarted)
        .count();
    assert!(started < 100, "{started} source tasks started for 10 rows");
}

#[test]
fn stateful_setup_runs_once_per_worker() {
    struct Tagger {
        setup_thread: std::thread::ThreadId,
        calls: Arc<Mutex<Vec<(std::thread::ThreadId, std::thread::ThreadId)>>>,
    }
    impl BatchFn for Tagger {
        fn call(&mut self, b: RecordBatch) -> std::result::Result<RecordBatch, UdfError> {
            self.calls
                .lock()
                .unwrap()
                .push((self.setup_thread, std::thread::current().id()));
            std::thread::sleep(Duration::from_millis(5));
            Ok(b)
        }
    }
    let setups = Arc::new(Mutex::new(Vec::new()));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (s, c) = (setups.clone(), calls.clone());
    let op = Stateful::new("tagger", move || {
        s.lock().unwrap().push(std::thread::current().id());
        Ok::<_, UdfError>(Tagger {
            setup_thread: std::thread::current().id(),
            calls: c.clone(),
        })
    });
    let ctx = ctx_with(|c| c.cpus = 4.0);
    let ds = ctx
        .range(2000, 50)
        .map_batches(op, Resources::cpu(0.5).pool(1, 3));
    assert_eq!(
        sorted_i64(&ds.collect().unwrap(), "id"),
        (0..2000).collect::<Vec<_>>()
    );

    let setups = setups.lock().unwrap().clone();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 50);
    let distinct: HashSet<_> = setups.iter().collect();
    assert_eq!(
        distinct.len(),
        setups.len(),
        "a worker ran set-up twice: {setups:?}"
    );
    assert!(
        (1..=3).contains(&setups.len()),
        "{} set-ups for a pool of at most 3",
        setups.len()
    );
    // Every call ran on the worker whose set-up made its instance.
    assert!(calls.iter().all(|(setup, call)| setup == call));
    let per_worker: HashMap<_, usize> = calls.iter().fold(HashMap::new(), |mut m, (w, _)| {
        *m.entry(*w).or_default() += 1;
        m
    });
    assert_eq!(per_worker.values().sum::<usize>(), 50);
}

#[test]
fn a_pool_sets_up_its_min_workers_before_tasks_need_them() {
    let setups = Arc::new(AtomicUsize::new(0));
    let s = setups.clone();
    let op = Stateful::new("warm", move || {
        s.fetch_add(1, Ordering::SeqCst);
        Ok::<_, UdfError>(|b: RecordBatch| Ok::<_, UdfError>(b))
    });
    let ctx = ctx_with(|c| c.cpus = 4.0);
    // One task, but a pool of at least 3: three set-ups.
    let ds = ctx
        .range(10, 1)
        .map_batches(op, Resources::cpu(0.5).pool(3, 4));
    assert_eq!(ds.count().unwrap(), 10);
    // Set-ups run on their workers' threads and may end after the job does.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while setups.load(Ordering::SeqCst) < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        setups.load(Ordering::SeqCst),
        3,
        "the pool's min workers were not all set up, or one more was"
    );
}

#[test]
fn a_failing_set_up_ends_the_job_naming_the_operator() {
    let op = Stateful::new("load_model", || {
        Err::<fn(RecordBatch) -> std::result::Result<RecordBatch, UdfError>, _>(
            "weights file is missing",
        )
    });
    let err = ctx_with(|_| {})
        .range(10, 2)
        .map_batches(op, Resources::cpu(0.5))
        .count()
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("load_model") && text.contains("weights file is missing"),
        "{text}"
    );
}

#[test]
fn a_repartition_larger_than_the_store_spills_instead_of_stalling() {
    let cap: u64 = 16 << 20;
    let ctx = ctx_with(|c| c.store_capacity = cap);
    let ds = ctx
        .range(48, 8)
        .flat_map_batches(
            |b: RecordBatch| {
                let ids = b.column(0).as_primitive::<Int64Type>().values().to_vec();
                ids.into_iter().map(|id| {
                    let data: ArrayRef = Arc::new(arrow_array::BinaryArray::from_vec(vec![
                        vec![id as u8; 1 << 20].as_slice(),
                    ]));
                    RecordBatch::try_from_iter([
                        ("id", Arc::new(Int64Array::from(vec![id])) as ArrayRef),
                        ("data", data),
                    ])
                })
            },
            Resources::cpu(1.0),
        )
        .repartition(3)
        .map_batches(
            |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                let data = b.column_by_name("data").unwrap().as_binary::<i32>();
                let sums: Int64Array = data
                    .iter()
                    .map(|d| d.map(|d| d.iter().map(|&x| x as i64).sum::<i64>()))
                    .collect();
                Ok(RecordBatch::try_from_iter([
                    ("id", b.column(0).clone()),
                    ("sum", Arc::new(sums) as ArrayRef),
                ])?)
            },
            Resources::cpu(0.5),
        );
    // 48 MiB through a 16 MiB store: the repartition must hold it all. Run
    // with a deadline so that a stall fails the test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let job = ds.clone();
    std::thread::spawn(move || {
        let _ = tx.send(job.collect());
    });
    let out = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the job stalled")
        .unwrap();
    let mut got: Vec<(i64, i64)> = out
        .iter()
        .flat_map(|b| {
            let ids = b.column(0).as_primitive::<Int64Type>().values().to_vec();
            let sums = b.column(1).as_primitive::<Int64Type>().values().to_vec();
            ids.into_iter().zip(sums)
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        (0..48).map(|id| (id, id * (1 << 20))).collect::<Vec<_>>()
    );
    assert_eq!(out.iter().filter(|b| b.num_rows() > 0).count(), 3);
    let stats = ds.stats().unwrap();
    assert!(stats.spilled_bytes > 0, "nothing spilled");
    assert!(stats.peak_store_bytes <= cap && ctx.store_stats().peak_bytes <= cap);
    // The timeline's samples count the spilled bytes up to the job's total.
    let spilled: Vec<u64> = stats.store_samples.iter().map(|s| s.spilled).collect();
    assert!(spilled.is_sorted(), "spilled bytes went down: {spilled:?}");
    assert_eq!(spilled.last(), Some(&stats.spilled_bytes));

    // A second job on the same store counts its own spills and restores
    // only.
    let before = ctx.store_stats();
    assert_eq!(ds.count().unwrap(), 48);
    let (again, after) = (ds.stats().unwrap(), ctx.store_stats());
    assert!(again.spilled_bytes > 0, "the second job spilled nothing");
    assert_eq!(
        again.spilled_bytes,
        after.spilled_bytes - before.spilled_bytes,
        "{again}"
    );
    assert_eq!(
        again.restored_bytes,
        after.restored_bytes - before.restored_bytes,
        "{again}"
    );
}

#[test]
fn an_output_buffer_is_written_in_the_store_and_read_downstream() {
    const ROW: usize = 2 << 20;
    let ctx = ctx_with(|c| c.store_capacity = 64 << 20);
    let placed = Arc::new(AtomicUsize::new(0));
    let counter = placed.clone();
    let ds = ctx
        .range(20, 20)
        .map_batches(
            move |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                let id = b.column(0).as_primitive::<Int64Type>().value(0);
                let bytes = streambatch::OutputBuffer::filled(ROW, id as u8);
                if bytes.is_in_store() {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                let offsets = arrow_buffer::OffsetBuffer::from_lengths([ROW]);
                let data = arrow_array::BinaryArray::new(offsets, bytes.into_buffer(), None);
                Ok(RecordBatch::try_from_iter([
                    ("id", b.column(0).clone()),
                    ("data", Arc::new(data) as ArrayRef),
                ])?)
            },
            Resources::cpu(1.0).batch_rows(1),
        )
        .map_batches(
            |b: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
                let id = b.column(0).as_primitive::<Int64Type>().value(0);
                let data = b.column(1).as_binary::<i32>().value(0);
                assert!(data.len() == ROW && data.iter().all(|&x| x == id as u8));
                Ok(b.project(&[0])?)
            },
            Resources::cpu(0.5),
        );
    let out = ds.collect().unwrap();
    assert_eq!(sorted_i64(&out, "id"), (0..20).collect::<Vec<_>>());
    // Every output fit: none was made on the heap and copied.
    assert_eq!(placed.load(Ordering::Relaxed), 20);
    drop((out, ds));
    assert_eq!(ctx.store_stats().used_bytes, 0);
}
