//! `train_test_split`: two disjoint datasets from one, each row on the test
//! side when a seeded hash of its stable position falls under the test
//! fraction. A row's position is its source split's identity (the file or
//! range it comes from, stable whatever order the splits run in) and its
//! index in that split's rows, so the same seed gives the same rows on each
//! side whatever the execution or block order, and nothing is materialised:
//! each source task drops the other side's rows as it reads
//! ([`RowSample`](crate::read::row_sample::RowSample)).

use std::sync::Arc;

use streambatch_core::fnv1a;

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::logical::plan::{LogicalOp, LogicalPlan};
use crate::logical::source::SourceSplit;
use crate::read::row_sample::RowSample;

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
    /// a `limit` (which rows it keeps depends on the split) and after an
    /// all-to-all operator (a side's rows would not be a sample of the
    /// dataset's); a union's inputs are each sampled as they are read.
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
        // Each side samples the rows its source reads: behind an exchange
        // (a join's two inputs, a group's rows) a side's rows would not be
        // a sample of the dataset's.
        if let Some(LogicalOp::Exchange(e)) =
            ops.iter().find(|op| matches!(op, LogicalOp::Exchange(_)))
        {
            return Err(Error::Invalid(format!(
                "train_test_split after `{}`: split its input first, or write its output \
                 and split that",
                e.reduce.name()
            )));
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
                    let sampled = |split: &SourceSplit| SourceSplit::Sampled {
                        inner: Arc::new(split.without_pruning()),
                        sample,
                    };
                    // A union's side samples its reads, before its operators.
                    *split = match &*split {
                        SourceSplit::Side { inner, side } => SourceSplit::Side {
                            inner: Arc::new(sampled(inner)),
                            side: side.clone(),
                        },
                        other => sampled(other),
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
        SourceSplit::Batch(_) => fnv1a(format!("batch {ordinal}").as_bytes()),
        SourceSplit::Sampled { sample, .. } => sample.key,
        SourceSplit::Side { inner, .. } => identity(inner, ordinal),
        other => fnv1a(other.describe().as_bytes()),
    }
}
