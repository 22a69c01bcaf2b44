//! Checks of a job's output: that each expected id comes exactly once
//! ([`IdSet`]), and the cheap whole-buffer [`checksum`] the workloads and
//! their peers compare bytes with.

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use streambatch::{Error, Result};

use crate::ProgressLines;

/// The ids a job output, checked against `0..n`: a bitmap of those seen,
/// so that each must come exactly once (a count and a sum would take 5, 5
/// for 4, 6).
#[derive(Clone, Debug)]
pub struct IdSet {
    n: u64,
    seen: Vec<u64>,
    rows: u64,
    distinct: u64,
}

impl IdSet {
    /// Expecting each of `0..n` once.
    pub fn new(n: u64) -> Self {
        Self {
            n,
            seen: vec![0; n.div_ceil(64) as usize],
            rows: 0,
            distinct: 0,
        }
    }

    /// One output row's id.
    pub fn add(&mut self, id: i64) {
        self.rows += 1;
        if let Ok(i) = u64::try_from(id)
            && i < self.n
        {
            let (word, bit) = ((i / 64) as usize, 1u64 << (i % 64));
            if self.seen[word] & bit == 0 {
                self.seen[word] |= bit;
                self.distinct += 1;
            }
        }
    }

    /// Rows added.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Ids of `0..n` seen (at least once).
    pub fn distinct(&self) -> u64 {
        self.distinct
    }

    /// Every id of `0..n` came, and nothing else: as many rows as ids, each
    /// in range, none twice.
    pub fn each_once(&self) -> bool {
        self.rows == self.n && self.distinct == self.n
    }
}

/// Reads a W1-shaped job's output (an `id` column first), counting its rows
/// in `progress`, into an [`IdSet`] of `0..n`.
pub(crate) fn check_ids(
    ds: &streambatch::Dataset,
    progress: &mut ProgressLines,
    n: u64,
) -> Result<IdSet> {
    let mut ids = IdSet::new(n);
    for batch in ds.iter_batches()? {
        let batch = batch?;
        progress.add(batch.num_rows() as u64);
        let column = batch.column(0).as_primitive_opt::<Int64Type>();
        let column = column.ok_or_else(|| Error::Invalid("`id` is not Int64".into()))?;
        if column.null_count() > 0 {
            return Err(Error::Invalid(format!(
                "{} null ids in the output",
                column.null_count()
            )));
        }
        for id in column.values() {
            ids.add(*id);
        }
    }
    Ok(ids)
}

/// A checksum of all of `bytes`, cheap enough to run over every byte a
/// benchmark moves: the wrapping sum of its little-endian `u64` words, word
/// `i` weighted by `2i + 1` (a last partial word padded with zeros). Any
/// one changed word changes it (odd weights are invertible mod 2^64), and
/// so does moving a word. Trailing zero bytes do not: compare the lengths
/// too. `tools/bench/common.py` computes the same (`checksum`).
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    let mut sum = 0u64;
    let mut weight = 1u64;
    for word in &mut words {
        let word = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        sum = sum.wrapping_add(word.wrapping_mul(weight));
        weight = weight.wrapping_add(2);
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        sum = sum.wrapping_add(u64::from_le_bytes(last).wrapping_mul(weight));
    }
    sum
}

/// [`checksum`] of `len` bytes all equal to `byte`, without the bytes: the
/// `n` whole words weigh 1 + 3 + ... + (2n - 1) = n^2.
pub fn checksum_filled(byte: u8, len: usize) -> u64 {
    let n = (len / 8) as u64;
    let word = u64::from_le_bytes([byte; 8]);
    let rest = len % 8;
    let mut last = [0u8; 8];
    last[..rest].fill(byte);
    word.wrapping_mul(n.wrapping_mul(n))
        .wrapping_add(u64::from_le_bytes(last).wrapping_mul(2 * n + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::W1_ROW_BYTES;

    #[test]
    fn the_checksum_sees_a_changed_or_moved_byte() {
        let bytes: Vec<u8> = (0..1003u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let sum = checksum(&bytes);
        for at in [0, 7, 8, 500, 1000, 1002] {
            let mut wrong = bytes.clone();
            wrong[at] ^= 1;
            assert_ne!(checksum(&wrong), sum, "byte {at}");
        }
        let mut moved = bytes.clone();
        moved.swap(3, 11); // two different words
        assert_ne!(bytes[3], bytes[11]);
        assert_ne!(checksum(&moved), sum);
        assert_ne!(checksum(&bytes[..1000]), sum);
    }

    #[test]
    fn the_checksum_is_the_one_the_peers_compute() {
        // tools/bench/test_checks.py asserts the same value for common.checksum.
        let bytes: Vec<u8> = (0..=255u8).chain(*b"abc").collect();
        assert_eq!(checksum(&bytes), 0x3531_2d29_3e5d_1521);
    }

    #[test]
    fn a_filled_rows_checksum_is_its_bytes_checksum_and_differs_by_id() {
        for len in [0, 1, 7, 8, 9, 64, 1001, W1_ROW_BYTES] {
            for byte in [1u8, 7, 255] {
                assert_eq!(
                    checksum_filled(byte, len),
                    checksum(&vec![byte; len]),
                    "{len}"
                );
            }
        }
        // Every id's W1 row has a checksum of its own.
        let sums: std::collections::HashSet<u64> = (1..=255u8)
            .map(|b| checksum_filled(b, W1_ROW_BYTES))
            .collect();
        assert_eq!(sums.len(), 255);
    }

    #[test]
    fn ids_must_come_each_exactly_once() {
        let set = |ids: &[i64]| {
            let mut set = IdSet::new(8);
            ids.iter().for_each(|id| set.add(*id));
            set
        };
        assert!(set(&[3, 0, 1, 2, 4, 5, 6, 7]).each_once());
        // 5, 5 for 4, 6: as many rows, and the ids sum to 0 + ... + 7.
        let fives = [0i64, 1, 2, 3, 5, 5, 5, 7];
        assert_eq!(fives.iter().sum::<i64>(), (0..8).sum::<i64>());
        assert!(!set(&fives).each_once());
        assert!(!set(&[0, 1, 2, 3, 4, 5, 6]).each_once(), "one missing");
        assert!(!set(&[0, 1, 2, 3, 4, 5, 6, 7, 7]).each_once(), "one twice");
        assert!(!set(&[0, 1, 2, 3, 4, 5, 6, 8]).each_once(), "one foreign");
        assert!(!set(&[-1, 1, 2, 3, 4, 5, 6, 7]).each_once(), "one negative");
    }
}
