//! `train_test_split`: two disjoint datasets from one, each row on the test
//! side when a seeded hash of its stable position falls under the test
//! fraction. A row's position is its source split's identity (the file or
//! range it comes from, stable whatever order the splits run in) and its
//! index in that split's rows, so the same seed gives the same rows on each
//! side whatever the execution or block order, and nothing is materialised:
//! each source task drops the other side's rows as it reads.

use std::sync::Arc;

use arrow_array::BooleanArray;

use crate::dataset::Dataset;
use crate::plan::{LogicalOp, LogicalPlan};
use crate::source::SourceSplit;
use crate::{BatchIter, Error, Result};

/// Which rows of one source split a side of a `train_test_split` keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowSample {
    /// The split's identity (a hash of what it reads).
    pub key: u64,
    /// The split's seed.
    pub seed: u64,
    /// The share of rows on the test side, 0 to 1.
    pub test_fraction: f64,
    /// Whether this side is the test side.
    pub test: bool,
}

impl RowSample {
    /// Whether the row at `position` of the split is on this side.
    pub fn keeps(&self, position: u64) -> bool {
        let hash = mix(mix(self.key ^ self.seed.rotate_left(17)) ^ position);
        // The top 53 bits as a uniform fraction in [0, 1).
        let unit = (hash >> 11) as f64 / (1u64 << 53) as f64;
        (unit < self.test_fraction) == self.test
    }

    /// `rows` (the split's stream) with only this side's rows.
    pub fn filter(self, rows: BatchIter) -> BatchIter {
        let mut position = 0u64;
        Box::new(rows.map(move |batch| {
            let batch = batch?;
            let start = position;
            position += batch.num_rows() as u64;
            let mask: BooleanArray = (start..position).map(|p| Some(self.keeps(p))).collect();
            arrow_select::filter::filter_record_batch(&batch, &mask).map_err(|source| {
                Error::Arrow {
                    operator: "train_test_split".into(),
                    source,
                }
            })
        }))
    }
}

/// SplitMix64's finaliser: every input bit moves every output bit.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// FNV-1a of `text`: a split's identity from its description.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Dataset {
    /// Splits the rows into a train and a test dataset, disjoint, the test
    /// side holding about `test_fraction` of them: a row is on the test
    /// side when a hash of `seed` and its stable position (its source
    /// split, by what it reads, and its index there) says so. The same
    /// seed gives the same rows whatever order the job runs in (a
    /// randomised block order included) and nothing is read twice or held:
    /// each side's source tasks drop the other side's rows as they read.
    /// Operators after the source see only their side's rows (a row made
    /// by `flat_map_batches` goes with the row it came from). Refused after
    /// a `limit` (which rows it keeps depends on the split).
    ///
    /// ```
    /// # use streambatch_plan::{Dataset, Runner};
    /// # fn demo(ds: &Dataset) -> streambatch_plan::Result<()> {
    /// let (train, test) = ds.train_test_split(0.2, 7)?;
    /// assert_eq!(train.count()? + test.count()?, ds.count()?);
    /// # Ok(()) }
    /// ```
    pub fn train_test_split(&self, test_fraction: f64, seed: u64) -> Result<(Dataset, Dataset)> {
        if !(0.0..=1.0).contains(&test_fraction) {
            return Err(Error::Invalid(format!(
                "train_test_split: the test fraction must be within 0 and 1, not {test_fraction}"
            )));
        }
        let ops = self.plan.chain();
        if ops.iter().any(|op| matches!(op, LogicalOp::Limit(_))) {
            return Err(Error::Invalid(
                "train_test_split after a limit: split first, then limit each side".into(),
            ));
        }
        let side = |test: bool| {
            let mut ops = ops.clone();
            if let Some(LogicalOp::Source { splits, .. }) = ops.first_mut() {
                for (ordinal, split) in splits.iter_mut().enumerate() {
                    let sample = RowSample {
                        key: identity(split, ordinal),
                        seed,
                        test_fraction,
                        test,
                    };
                    *split = SourceSplit::Sampled {
                        inner: Arc::new(split.without_pruning()),
                        sample,
                    };
                }
            }
            let mut plan = None;
            for op in ops {
                plan = Some(Arc::new(LogicalPlan { input: plan, op }));
            }
            self.with_plan(plan.expect("a chain starts at its source"))
        };
        Ok((side(false), side(true)))
    }
}

/// A split's identity: what it reads (a batch given in memory: its place
/// among the source's batches).
fn identity(split: &SourceSplit, ordinal: usize) -> u64 {
    match split {
        SourceSplit::Batch(_) => fnv(&format!("batch {ordinal}")),
        SourceSplit::Sampled { sample, .. } => sample.key,
        other => fnv(&other.describe()),
    }
}
