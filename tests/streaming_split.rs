//! One running job split among trainer ranks in this process, a thread
//! each: every row of an epoch reaches exactly one rank, `equal` gives each
//! rank the same count, a slow rank takes less and holds no one back, and a
//! rank that never comes is named after the barrier's timeout.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use common::{ctx, ctx_with};
use streambatch::prelude::*;
use streambatch::{Split, SplitOptions};

/// A batch's ids (its first column).
fn ids(batch: Result<RecordBatch>) -> Vec<i64> {
    let batch = batch.expect("the epoch runs");
    batch
        .column(0)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec()
}

/// The ids each rank got in `epoch`, each rank on its own thread, waiting
/// `step[rank]` after each batch (a training step).
fn consume(splits: &[Split], epoch: usize, step: &[Duration]) -> Vec<Vec<i64>> {
    std::thread::scope(|s| {
        let ranks: Vec<_> = splits
            .iter()
            .map(|split| {
                let pause = step[split.rank()];
                s.spawn(move || {
                    let mut ids = Vec::new();
                    for batch in split.epoch(epoch) {
                        ids.extend(self::ids(batch));
                        std::thread::sleep(pause);
                    }
                    ids
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

fn each_once(ranks: &[Vec<i64>], n: i64) {
    let mut all: Vec<i64> = ranks.concat();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..n).collect::<Vec<_>>(),
        "every row once across ranks"
    );
}

#[test]
fn every_row_of_every_epoch_reaches_exactly_one_rank() {
    let splits = ctx().range(10_000, 37).streaming_split(3, false).unwrap();
    for epoch in 0..2 {
        let ranks = consume(&splits, epoch, &[Duration::ZERO; 3]);
        each_once(&ranks, 10_000);
    }
}

#[test]
fn equal_splits_give_every_rank_the_same_rows_and_count_the_rest() {
    let splits = ctx().range(1_000, 7).streaming_split(3, true).unwrap();
    let steps = [Duration::ZERO, Duration::from_millis(5), Duration::ZERO];
    let ranks = consume(&splits, 0, &steps);
    assert!(
        ranks.iter().all(|r| r.len() == 333),
        "{:?}",
        ranks.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let distinct: HashSet<i64> = ranks.concat().into_iter().collect();
    assert_eq!(distinct.len(), 999, "a row went to two ranks");
    assert_eq!(splits[0].dropped_rows(), 1);
}

#[test]
fn a_slow_rank_takes_fewer_partitions_and_holds_no_one_back() {
    let splits = ctx().range(20_000, 40).streaming_split(2, false).unwrap();
    let steps = [Duration::ZERO, Duration::from_millis(50)];
    let ranks = consume(&splits, 0, &steps);
    each_once(&ranks, 20_000);
    assert!(
        ranks[0].len() > 2 * ranks[1].len(),
        "fast {} rows, slow {}",
        ranks[0].len(),
        ranks[1].len()
    );
    // Each rank's stats count what it got.
    let stats = splits[1].stats();
    assert_eq!(stats[0].rows, ranks[0].len());
    assert_eq!(stats[1].rows, ranks[1].len());
    assert_eq!(stats[0].pieces + stats[1].pieces, 40);
    // A consumer of `epoch` gets each piece as a batch.
    assert_eq!(stats[0].batches, stats[0].pieces);
    assert_eq!(stats[1].batches, stats[1].pieces);
}

#[test]
fn each_rank_counts_the_batches_iter_batches_cut_for_it() {
    let splits = ctx().range(1_000, 10).streaming_split(2, true).unwrap();
    let got: Vec<usize> = std::thread::scope(|s| {
        let ranks: Vec<_> = splits
            .iter()
            .map(|split| {
                s.spawn(move || {
                    let options = BatchOptions::rows(7).local_shuffle(50, 1).prefetch(2);
                    let mut got = 0;
                    for batch in split.iter_batches(0, options).unwrap() {
                        batch.unwrap();
                        got += 1;
                    }
                    got
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    });
    // 500 rows a rank in batches of 7: 72, the last of 3 rows.
    assert_eq!(got, [72, 72]);
    let stats = splits[0].stats();
    assert_eq!((stats[0].batches, stats[1].batches), (72, 72));
    assert!(stats[0].pieces < 72 && stats[0].rows == 500, "{stats:?}");
}

#[test]
fn a_rank_that_never_asks_is_named_after_the_timeout() {
    let options = SplitOptions {
        equal: false,
        barrier_timeout: Duration::from_millis(200),
        ..SplitOptions::default()
    };
    let splits = ctx()
        .range(100, 2)
        .streaming_split_with(2, options)
        .unwrap();
    let err = splits[0].epoch(0).next().unwrap().unwrap_err();
    match &err {
        Error::SplitBarrier { epoch, missing, .. } => {
            assert_eq!((*epoch, missing.as_slice()), (0, [1].as_slice()));
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("rank(s) [1]"), "{err}");
}

#[test]
fn batches_of_a_split_are_cut_as_asked() {
    let splits = ctx().range(1_000, 9).streaming_split(1, false).unwrap();
    let sizes: Vec<usize> = splits[0]
        .iter_batches(0, BatchOptions::rows(100))
        .unwrap()
        .map(|b| b.unwrap().num_rows())
        .collect();
    assert_eq!(sizes, vec![100; 10]);
}

#[test]
fn a_rank_that_leaves_mid_epoch_leaves_its_rows_to_the_others() {
    let splits = ctx().range(5_000, 20).streaming_split(2, false).unwrap();
    let (stay, leave) = (&splits[0], &splits[1]);
    let ranks = std::thread::scope(|s| {
        let left = s.spawn(|| {
            // At most one batch (the other rank may have taken all), then
            // the rank's thread ends, its stream dropped.
            let mut stream = leave.epoch(0);
            stream.next().map(ids).unwrap_or_default()
        });
        let stayed = s.spawn(|| stay.epoch(0).flat_map(ids).collect::<Vec<i64>>());
        vec![stayed.join().unwrap(), left.join().unwrap()]
    });
    each_once(&ranks, 5_000);
}

/// The first id of each partition, in the order they came (one CPU slot:
/// splits run one after another, in the plan's order).
fn first_ids(batches: impl Iterator<Item = Result<RecordBatch>>) -> Vec<i64> {
    batches
        .map(|b| b.unwrap().column(0).as_primitive::<Int64Type>().value(0))
        .collect()
}

#[test]
fn a_seeded_block_order_moves_whole_partitions_and_changes_each_epoch() {
    let ctx = ctx_with(|c| c.cpus = 1.0);
    let ds = ctx.range(1_000, 10);
    let in_order: Vec<i64> = (0..10).map(|i| i * 100).collect();
    let shuffled = first_ids(ds.randomize_block_order(3).iter_batches().unwrap());
    assert_ne!(shuffled, in_order);
    let mut sorted = shuffled.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, in_order, "whole partitions, each once");
    let again = first_ids(ds.randomize_block_order(3).iter_batches().unwrap());
    assert_eq!(again, shuffled, "the same seed, the same order");

    let options = SplitOptions {
        block_order_seed: Some(3),
        ..SplitOptions::default()
    };
    let splits = ds.streaming_split_with(1, options).unwrap();
    let epoch0 = first_ids(splits[0].epoch(0));
    let epoch1 = first_ids(splits[0].epoch(1));
    assert_eq!(epoch0, shuffled, "epoch 0 runs seed 3 + 0");
    assert_ne!(epoch1, epoch0, "a new order each epoch");
}

#[test]
fn partitions_a_filter_emptied_hold_no_rank_up() {
    let ds = ctx().range(1_000, 10).filter(col("id").lt(lit(500)));
    for equal in [false, true] {
        let splits = ds.streaming_split(2, equal).unwrap();
        let ranks = consume(&splits, 0, &[Duration::ZERO; 2]);
        each_once(&ranks, 500);
    }
}

#[test]
fn an_equal_split_gives_a_leaving_ranks_rows_to_the_others() {
    let splits = ctx().range(3_000, 30).streaming_split(3, true).unwrap();
    let ranks = std::thread::scope(|s| {
        let left = s.spawn(|| {
            let mut stream = splits[2].epoch(0);
            stream.next().map(ids).unwrap_or_default()
        });
        let stay: Vec<_> = splits[..2]
            .iter()
            .map(|split| s.spawn(move || split.epoch(0).flat_map(ids).collect::<Vec<i64>>()))
            .collect();
        let mut ranks: Vec<Vec<i64>> = stay.into_iter().map(|r| r.join().unwrap()).collect();
        ranks.push(left.join().unwrap());
        ranks
    });
    assert_eq!(ranks[0].len(), ranks[1].len(), "the two left are equal");
    // Fewer than the two ranks left, unless rank 2 left only after one of
    // them had finished its third (then its share could go to no one).
    let dropped = splits[0].dropped_rows();
    let late = ranks[0].len() == 1_000;
    assert!(dropped < 2 || late, "{dropped} rows left over");
    let mut all: Vec<i64> = ranks.concat();
    assert_eq!(
        all.len() + dropped,
        3_000,
        "every row delivered once, or dropped and counted"
    );
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len() + dropped, 3_000, "a row went to two ranks");
}

#[test]
fn a_pipeline_made_per_epoch_runs_that_epochs_operators() {
    let ctx = ctx();
    let base = ctx.range(1_000, 8);
    // Each epoch's pipeline adds its epoch to every id: the rows differ by
    // epoch, the split is the same.
    let splits = Split::per_epoch(2, SplitOptions::default(), move |epoch| {
        Ok(base.with_column("id", col("id") + lit(epoch as i64 * 10_000)))
    })
    .unwrap();
    for epoch in 0..2 {
        let ranks = consume(&splits, epoch, &[Duration::ZERO; 2]);
        let shifted: Vec<Vec<i64>> = ranks
            .iter()
            .map(|r| r.iter().map(|id| id - epoch as i64 * 10_000).collect())
            .collect();
        each_once(&shifted, 1_000);
    }
    let failing = Split::per_epoch(1, SplitOptions::default(), |epoch| {
        Err(Error::Invalid(format!("no plan for epoch {epoch}")))
    })
    .unwrap();
    let error = failing[0].epoch(3).next().unwrap().unwrap_err();
    assert!(error.to_string().contains("no plan for epoch 3"), "{error}");
}

#[test]
fn an_epochs_timeline_shows_when_each_rank_waited_for_data() {
    // A short step a batch: with none, one rank's thread can take all 8
    // partitions of an epoch before the other's is scheduled, and the
    // per-rank figures below need rows on both.
    const STEP: [Duration; 2] = [Duration::from_millis(5); 2];
    let slow = ctx().range(2_000, 8).map_batches(
        |batch: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
            std::thread::sleep(Duration::from_millis(10));
            Ok(batch)
        },
        Resources::cpu(1.0),
    );
    let splits = slow.streaming_split(2, false).unwrap();
    assert!(splits[0].epoch_stats().is_none(), "no epoch ran yet");
    let ranks = consume(&splits, 0, &STEP);
    each_once(&ranks, 2_000);
    let stats = splits[0].epoch_stats().expect("the epoch's job ended");
    assert!(!stats.rank_waits.is_empty(), "the ranks waited for the job");
    assert!(
        stats
            .rank_waits
            .iter()
            .all(|w| w.rank < 2 && w.from <= w.to)
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("epoch.json");
    splits[1].write_timeline(&path).unwrap();
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let waits = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "waiting for data")
        .count();
    assert_eq!(waits, stats.rank_waits.len());
    // Each rank's track is named with what it got of the epoch.
    assert_eq!(stats.rank_totals.len(), 2);
    for (rank, got) in stats.rank_totals.iter().enumerate() {
        assert_eq!(got.rows, ranks[rank].len());
        assert_eq!(got.batches, got.pieces);
        let name = format!(
            "rank {rank} (trainer): {} rows, {} batches",
            got.rows, got.batches
        );
        let named = trace["traceEvents"].as_array().unwrap().iter().any(|e| {
            e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == name.as_str()
        });
        assert!(named, "no track named {name}");
    }
    // The next epoch's figures are its own, not the sum of both.
    let ranks = consume(&splits, 1, &STEP);
    each_once(&ranks, 2_000);
    let next = splits[0].epoch_stats().expect("the epoch's job ended");
    let rows: Vec<usize> = next.rank_totals.iter().map(|r| r.rows).collect();
    assert_eq!(rows, [ranks[0].len(), ranks[1].len()]);
    let all = splits[0].stats();
    for (rank, got) in next.rank_totals.iter().enumerate() {
        assert!(got.batches > 0 && got.batches == got.pieces, "{got:?}");
        assert!(got.batches < all[rank].batches, "epoch 0's counted too");
    }
}

#[test]
fn the_next_epochs_job_starts_while_the_last_rank_finishes_this_one() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let made = Arc::new(AtomicUsize::new(0));
    let counted = made.clone();
    let ds = ctx().range(800, 4).map_batches(
        move |batch: RecordBatch| -> std::result::Result<RecordBatch, UdfError> {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(batch)
        },
        Resources::cpu(1.0),
    );
    // A failure here ends the eager rank's wait too, instead of a hang.
    let options = SplitOptions {
        barrier_timeout: Duration::from_secs(30),
        ..SplitOptions::default()
    };
    let splits = ds.streaming_split_with(2, options).unwrap();
    let ranks = std::thread::scope(|s| {
        let eager = s.spawn(|| {
            let mut ids = Vec::new();
            for epoch in 0..2 {
                for batch in splits[0].epoch(epoch) {
                    ids.extend(self::ids(batch));
                }
            }
            ids
        });
        let late = s.spawn(|| {
            let mut ids: Vec<i64> = splits[1].epoch(0).flat_map(self::ids).collect();
            // Before this rank asks for epoch 1, the other rank's ask has
            // started its job: every partition of it gets made.
            let start = std::time::Instant::now();
            while made.load(Ordering::SeqCst) < 8 && start.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(made.load(Ordering::SeqCst), 8, "epoch 1's job ran early");
            ids.extend(splits[1].epoch(1).flat_map(self::ids));
            ids
        });
        [eager.join().unwrap(), late.join().unwrap()]
    });
    let mut all = ranks.concat();
    all.sort_unstable();
    let twice: Vec<i64> = (0..800).flat_map(|i| [i, i]).collect();
    assert_eq!(all, twice, "every row once in each of the two epochs");
}

#[test]
fn with_the_epochs_known_each_epochs_job_starts_before_any_rank_asks() {
    use std::sync::{Arc, Mutex};
    let planned = Arc::new(Mutex::new(Vec::new()));
    let noted = planned.clone();
    let ctx = ctx();
    let options = SplitOptions {
        epochs: Some(2),
        barrier_timeout: Duration::from_secs(30),
        ..SplitOptions::default()
    };
    let splits = Split::per_epoch(2, options, move |epoch| {
        noted.lock().unwrap().push(epoch);
        Ok(ctx.range(400, 4))
    })
    .unwrap();
    assert_eq!(
        *planned.lock().unwrap(),
        [0],
        "epoch 0's job, with the split"
    );
    let first = consume(&splits, 0, &[Duration::ZERO; 2]);
    each_once(&first, 400);
    // Epoch 0's job ended: epoch 1's started though no rank asked yet.
    assert_eq!(*planned.lock().unwrap(), [0, 1]);
    let second = consume(&splits, 1, &[Duration::ZERO; 2]);
    each_once(&second, 400);
    // Two epochs: no third job.
    assert_eq!(*planned.lock().unwrap(), [0, 1]);
}
