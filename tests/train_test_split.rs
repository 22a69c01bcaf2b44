//! `train_test_split`: two disjoint sides holding every row between them,
//! the test side near its fraction, the same rows for the same seed
//! whatever the block order or a filter's pruning, without materialising.

mod common;

use std::collections::HashSet;

use common::{ctx, sorted_i64};
use streambatch::ParquetWriteOptions;
use streambatch::prelude::*;

fn ids(ds: &Dataset) -> Vec<i64> {
    sorted_i64(&ds.collect().unwrap(), "id")
}

#[test]
fn the_sides_are_disjoint_whole_and_near_the_fraction() {
    let ds = ctx().range(10_000, 16);
    let (train, test) = ds.train_test_split(0.2, 7).unwrap();
    let (train, test) = (ids(&train), ids(&test));
    let train_set: HashSet<i64> = train.iter().copied().collect();
    assert!(test.iter().all(|id| !train_set.contains(id)), "disjoint");
    let mut all = [train.clone(), test.clone()].concat();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..10_000).collect::<Vec<_>>(),
        "every row on one side"
    );
    assert!(
        (1_700..=2_300).contains(&test.len()),
        "{} test rows",
        test.len()
    );
    let (_, none) = ds.train_test_split(0.0, 7).unwrap();
    let (_, every) = ds.train_test_split(1.0, 7).unwrap();
    assert_eq!((none.count().unwrap(), every.count().unwrap()), (0, 10_000));
}

#[test]
fn the_same_seed_gives_the_same_rows_whatever_the_block_order() {
    let ds = ctx().range(5_000, 10);
    let test = ids(&ds.train_test_split(0.3, 7).unwrap().1);
    let shuffled_first = ds
        .randomize_block_order(5)
        .train_test_split(0.3, 7)
        .unwrap()
        .1;
    let shuffled_after = ds
        .train_test_split(0.3, 7)
        .unwrap()
        .1
        .randomize_block_order(9);
    assert_eq!(ids(&shuffled_first), test);
    assert_eq!(ids(&shuffled_after), test);
    let other_seed = ids(&ds.train_test_split(0.3, 8).unwrap().1);
    assert_ne!(other_seed, test, "another seed, other rows");
}

#[test]
fn a_filter_that_prunes_row_groups_moves_no_row_to_the_other_side() {
    let ctx = ctx();
    let dir = tempfile::tempdir().unwrap();
    let options = ParquetWriteOptions {
        max_row_group_rows: 500,
        ..ParquetWriteOptions::default()
    };
    ctx.range(6_000, 3)
        .write_parquet_with(dir.path(), &options)
        .unwrap();
    let read = ctx.read_parquet(dir.path().to_str().unwrap()).unwrap();
    let keep = || col("id").gt_eq(lit(4_600_i64));
    // Filtering first (the row groups before 4,600 pruned, shifting the
    // positions of the rest were they counted after pruning) or after:
    // the same test rows.
    let filtered_then_split = read.filter(keep()).train_test_split(0.5, 3).unwrap().1;
    let split_then_filtered = read.train_test_split(0.5, 3).unwrap().1.filter(keep());
    let expected = ids(&split_then_filtered);
    assert!(!expected.is_empty());
    assert_eq!(ids(&filtered_then_split), expected);
}

#[test]
fn a_bad_fraction_or_a_split_after_a_limit_is_refused() {
    let ds = ctx().range(100, 2);
    for bad in [-0.1, 1.5, f64::NAN] {
        let error = ds.train_test_split(bad, 1).err().expect("refused");
        assert!(error.to_string().contains("test fraction"), "{error}");
    }
    let error = ds
        .limit(10)
        .train_test_split(0.5, 1)
        .err()
        .expect("refused");
    assert!(error.to_string().contains("after a limit"), "{error}");
}
