//! Which rows of a source split one side of a `train_test_split` keeps:
//! those whose seeded hash of their position in the split falls on its
//! side of the test fraction (see `Dataset::train_test_split`).

use arrow_array::BooleanArray;

use crate::error::Error;
use crate::udf::BatchIter;

/// Which rows of one source split a side of a `train_test_split` keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowSample {
    /// The split's identity (a hash of what it reads).
    pub key: u64,
    /// The `train_test_split` seed.
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

/// One SplitMix64 step: the golden-ratio increment, then its finaliser.
fn mix(x: u64) -> u64 {
    streambatch_core::mix64(x.wrapping_add(0x9e37_79b9_7f4a_7c15))
}
