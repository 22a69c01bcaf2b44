//! A sort's ranges, found from samples its map tasks take as the input
//! streams (issue 26), with no pass over the input before the job.
//!
//! Each map task sorts each output by the keys and cuts it into chunks of
//! equal rows, keeping the `arrow-row` bytes of each chunk's first key and
//! of the output's last key ([`KeySample`]). Those bytes compare as the
//! keys do, so the executor picks ranges without decoding a key. Once
//! every map output is in, [`ranges`] takes the reducers' boundaries at the
//! quantiles of all the samples (each key weighted by its chunk's rows)
//! and hands each reducer the chunks of each output that may hold keys of
//! its [`KeyRange`]; the reducer keeps exactly its range's rows
//! ([`within`]). A chunk holding a boundary is read by the reducers on
//! both sides of it, each keeping its own rows, so every row is sorted
//! once and each reducer's input comes as sorted runs.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_row::{RowConverter, SortField};
use arrow_schema::SortOptions;

use crate::error::{Error, Result};
use crate::exchange::cut::{Partitioned, column_indices, gather, key_rows_of};
use crate::exchange::sort::sample::KeySample;
use crate::udf::BatchIter;

/// Chunks per destination in a map output: a boundary's chunk is read
/// twice, so about one row in this many crosses the exchange twice.
const CHUNKS_PER_DESTINATION: usize = 16;

/// The most chunks of one map output: the executor holds this many keys
/// per output until every output is in.
const MAX_CHUNKS: usize = 4096;

/// The most bytes of keys in one output's sample, fewer chunks for long
/// keys: a sample travels in a node's report of the output, a control
/// frame of at most 1 MiB.
const MAX_SAMPLE_BYTES: usize = 256 << 10;

/// The keys a reducer keeps, as `arrow-row` bytes: from `lo` (included;
/// `None`: the first) to `hi` (excluded; `None`: past the last).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyRange {
    /// The first key kept.
    pub lo: Option<Vec<u8>>,
    /// The first key past the range.
    pub hi: Option<Vec<u8>>,
}

/// The rows of `parts` (batches of one schema, one after another) as one
/// batch sorted by columns `keys` (stable), cut into chunks of about equal
/// rows for `n` destinations, with its [`KeySample`].
pub(crate) fn sorted_with_sample(
    parts: &[RecordBatch],
    keys: &[String],
    order: SortOptions,
    n: usize,
) -> Result<Partitioned> {
    let rows: usize = parts.iter().map(RecordBatch::num_rows).sum();
    let Some(first) = parts.first() else {
        return Err(Error::Invalid("sorting a map output of no batch".into()));
    };
    if rows == 0 {
        return Ok(Partitioned {
            batch: first.clone(),
            starts: vec![0],
            sample: Some(KeySample::default()),
        });
    }
    let at = column_indices(first, keys)?;
    let encoded = key_rows_of(parts, &at, &vec![order; at.len()])?;
    let positions = crate::exchange::sort::sorted::sorted_positions(&encoded);
    let key = |at: usize| encoded.row(positions[at] as usize);
    let mut chunks = (CHUNKS_PER_DESTINATION * n.max(1))
        .clamp(1, MAX_CHUNKS)
        .min(rows);
    let (mut starts, mut sample) = sampled(chunks, rows, &key);
    while sample.key_bytes() > MAX_SAMPLE_BYTES {
        if chunks == 1 {
            return Err(Error::Invalid(format!(
                "sort: keys of over {} KiB cannot be sorted (a first and a last key take {} bytes)",
                MAX_SAMPLE_BYTES / 2048,
                sample.key_bytes()
            )));
        }
        chunks = (chunks * MAX_SAMPLE_BYTES / sample.key_bytes()).clamp(1, chunks - 1);
        (starts, sample) = sampled(chunks, rows, &key);
    }
    Ok(Partitioned {
        batch: gather(parts, positions)?,
        starts,
        sample: Some(sample),
    })
}

/// Where each of `chunks` chunks of `rows` sorted rows starts (and the
/// end), and the sample of their first keys and the last (`key(i)`: the
/// `i`-th row's key in order).
fn sampled<'a>(
    chunks: usize,
    rows: usize,
    key: &impl Fn(usize) -> arrow_row::Row<'a>,
) -> (Vec<usize>, KeySample) {
    let starts: Vec<usize> = (0..=chunks).map(|c| c * rows / chunks).collect();
    let mut sample = KeySample::default();
    for &start in &starts[..chunks] {
        sample.push(key(start).as_ref());
    }
    sample.push(key(rows - 1).as_ref());
    (starts, sample)
}

/// A map output as [`ranges`] reads it: its rows, where each chunk starts
/// (and the end), and its sample.
pub struct SampledOutput<'a> {
    /// Rows in the output.
    pub rows: usize,
    /// Where each chunk starts, and the end.
    pub starts: &'a [u32],
    /// Its keys.
    pub sample: &'a KeySample,
}

/// A reducer's input: its range, and the rows of each map output (by its
/// position in the list given to [`ranges`]) that may hold keys of it.
#[derive(Debug, PartialEq, Eq)]
pub struct RangeInput {
    /// The keys it keeps.
    pub range: KeyRange,
    /// (output, first row, rows), outputs ascending.
    pub rows: Vec<(usize, u32, u32)>,
}

/// The inputs of up to `n` reducers, each a range of the keys of `outputs`
/// (in key order, those with no rows left out): boundaries at the
/// quantiles of every output's chunks, equal keys never split.
pub fn ranges(
    outputs: &[SampledOutput<'_>],
    n: usize,
) -> std::result::Result<Vec<RangeInput>, String> {
    let mut weighted: Vec<(&[u8], u64)> = Vec::new();
    for (i, output) in outputs.iter().enumerate() {
        check(output).map_err(|why| format!("map output {i}: {why}"))?;
        for c in 0..output.starts.len().saturating_sub(1) {
            let rows = output.starts[c + 1] - output.starts[c];
            weighted.push((output.sample.key(c), u64::from(rows)));
        }
    }
    weighted.sort_unstable();
    let total: u64 = weighted.iter().map(|&(_, rows)| rows).sum();
    let n = n.max(1) as u64;
    // Boundary d: the first chunk key with at least d/n of the rows before it.
    let mut bounds: Vec<&[u8]> = Vec::new();
    let (mut before, mut d) = (0u64, 1u64);
    for &(key, rows) in &weighted {
        while d < n && before >= d * total / n {
            if bounds.last().is_none_or(|&last| last < key) {
                bounds.push(key);
            }
            d += 1;
        }
        before += rows;
    }
    let mut inputs = Vec::with_capacity(bounds.len() + 1);
    for r in 0..=bounds.len() {
        let lo = r.checked_sub(1).map(|b| bounds[b]);
        let hi = bounds.get(r).copied();
        let range = KeyRange {
            lo: lo.map(<[u8]>::to_vec),
            hi: hi.map(<[u8]>::to_vec),
        };
        let rows: Vec<(usize, u32, u32)> = outputs
            .iter()
            .enumerate()
            .filter_map(|(i, output)| {
                let (start, len) = rows_within(output, &range)?;
                Some((i, start, len))
            })
            .collect();
        if !rows.is_empty() {
            inputs.push(RangeInput { range, rows });
        }
    }
    Ok(inputs)
}

/// The rows of `output` that may hold keys of `range`, as (first row,
/// rows): the reducer of `range` reads them. `None` when it has none.
pub fn rows_within(output: &SampledOutput<'_>, range: &KeyRange) -> Option<(u32, u32)> {
    let (first, last) = chunks_within(output, range.lo.as_deref(), range.hi.as_deref())?;
    let start = output.starts[first];
    Some((start, output.starts[last] - start))
}

/// The output's chunks are cut as a sorted output's must be.
fn check(output: &SampledOutput<'_>) -> std::result::Result<(), String> {
    let starts = output.starts;
    if output.rows == 0 && output.sample.is_empty() && starts == [0] {
        return Ok(());
    }
    let sample = output.sample;
    // Keys out of order would send rows to no reducer.
    let keys_in_order = (1..sample.len()).all(|i| sample.key(i - 1) <= sample.key(i));
    let fits = starts.len() >= 2
        && starts.len() == sample.len()
        && starts[0] == 0
        && starts.last().map(|&s| s as usize) == Some(output.rows)
        && starts.windows(2).all(|w| w[0] <= w[1])
        && keys_in_order;
    match fits {
        true => Ok(()),
        false => Err(format!(
            "{} rows cut at {} starts, with {} keys (in order or not)",
            output.rows,
            starts.len(),
            output.sample.len()
        )),
    }
}

/// The chunks `first..last` of `output` that may hold keys from `lo` to
/// `hi`: chunk `c` holds keys from its first key to the next chunk's (or
/// the last key), so it is read when those reach into the range.
fn chunks_within(
    output: &SampledOutput<'_>,
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
) -> Option<(usize, usize)> {
    let chunks = output.starts.len().checked_sub(1)?;
    let key = |c: usize| output.sample.key(c);
    let first = lo.map_or(0, |lo| partition_point(chunks, |c| key(c + 1) < lo));
    let last = hi.map_or(chunks, |hi| partition_point(chunks, |c| key(c) < hi));
    (first < last).then_some((first, last))
}

/// The first of `0..len` for which `below` is false (`below` true, then false).
fn partition_point(len: usize, below: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, len);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if below(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// `input` (batches each sorted by `keys`, as a reducer's slices of sorted
/// map outputs are) with only the rows whose keys lie in `range`: the rows
/// of the chunks at its ends that belong to the reducers beside it are
/// sliced off, found by a binary search of the keys.
pub(crate) fn within(
    input: BatchIter,
    keys: Vec<String>,
    order: SortOptions,
    range: Arc<KeyRange>,
) -> BatchIter {
    let mut converter: Option<(RowConverter, Vec<usize>)> = None;
    Box::new(input.map(move |batch| {
        let batch = batch?;
        if batch.num_rows() == 0 {
            return Ok(batch);
        }
        if converter.is_none() {
            let at = column_indices(&batch, &keys)?;
            let fields = at
                .iter()
                .map(|&k| SortField::new_with_options(batch.column(k).data_type().clone(), order))
                .collect();
            let made = RowConverter::new(fields).map_err(|e| Error::arrow("sort", e))?;
            converter = Some((made, at));
        }
        let (converter, at) = converter.as_ref().expect("made above");
        let columns: Vec<ArrayRef> = at.iter().map(|&k| batch.column(k).clone()).collect();
        let first_at_least = |bound: &[u8]| -> Result<usize> {
            let (mut lo, mut hi) = (0, batch.num_rows());
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                let row: Vec<ArrayRef> = columns.iter().map(|c| c.slice(mid, 1)).collect();
                let key = converter
                    .convert_columns(&row)
                    .map_err(|e| Error::arrow("sort", e))?;
                if key.row(0).as_ref() < bound {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            Ok(lo)
        };
        let start = match &range.lo {
            Some(lo) => first_at_least(lo)?,
            None => 0,
        };
        let end = match &range.hi {
            Some(hi) => first_at_least(hi)?,
            None => batch.num_rows(),
        };
        Ok(batch.slice(start, end.saturating_sub(start)))
    }))
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{Array, Int64Array};

    use super::*;

    fn batch(keys: Vec<Option<i64>>) -> RecordBatch {
        let tags = Int64Array::from_iter_values(0..keys.len() as i64);
        RecordBatch::try_from_iter([
            ("k", Arc::new(Int64Array::from(keys)) as ArrayRef),
            ("tag", Arc::new(tags) as ArrayRef),
        ])
        .unwrap()
    }

    fn column(b: &RecordBatch, i: usize) -> Vec<Option<i64>> {
        b.column(i).as_primitive::<Int64Type>().iter().collect()
    }

    /// Seeded keys, with duplicates and nulls.
    fn keys(seed: u64, n: usize, spread: u64) -> Vec<Option<i64>> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = streambatch_core::mix64(x + 1);
                (!x.is_multiple_of(17)).then_some((x % spread) as i64)
            })
            .collect()
    }

    /// Every map output sorted and sampled, the reducers' ranges taken,
    /// each reducer's rows kept and sorted: the keys in order, each row once.
    fn sort_through_ranges(
        outputs: &[RecordBatch],
        n: usize,
        order: SortOptions,
    ) -> Vec<(Option<i64>, i64)> {
        let key = vec!["k".to_string()];
        let cut: Vec<Partitioned> = outputs
            .iter()
            .map(|b| sorted_with_sample(std::slice::from_ref(b), &key, order, n).unwrap())
            .collect();
        let starts: Vec<Vec<u32>> = cut
            .iter()
            .map(|p| p.starts.iter().map(|&s| s as u32).collect())
            .collect();
        let sampled: Vec<SampledOutput<'_>> = cut
            .iter()
            .zip(&starts)
            .map(|(p, starts)| SampledOutput {
                rows: p.batch.num_rows(),
                starts,
                sample: p.sample.as_ref().unwrap(),
            })
            .collect();
        let inputs = ranges(&sampled, n).unwrap();
        assert!(inputs.len() <= n);
        let mut out = Vec::new();
        for input in inputs {
            let slices: Vec<Result<RecordBatch>> = input
                .rows
                .iter()
                .map(|&(i, start, len)| Ok(cut[i].batch.slice(start as usize, len as usize)))
                .collect();
            let kept = within(
                Box::new(slices.into_iter()),
                key.clone(),
                order,
                Arc::new(input.range),
            );
            let mut rows: Vec<(Option<i64>, i64)> = Vec::new();
            for b in kept {
                let b = b.unwrap();
                let tags = column(&b, 1);
                rows.extend(
                    column(&b, 0)
                        .into_iter()
                        .zip(tags.into_iter().map(Option::unwrap)),
                );
            }
            let mut sorted = rows.clone();
            sort_keys(&mut sorted, order);
            out.extend(sorted);
        }
        out
    }

    fn sort_keys(rows: &mut [(Option<i64>, i64)], order: SortOptions) {
        rows.sort_by(|a, b| {
            let by_key = match (a.0, b.0) {
                (None, None) => std::cmp::Ordering::Equal,
                (None, Some(_)) if order.nulls_first => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some(_), None) if order.nulls_first => std::cmp::Ordering::Greater,
                (Some(_), None) => std::cmp::Ordering::Less,
                (Some(x), Some(y)) if order.descending => y.cmp(&x),
                (Some(x), Some(y)) => x.cmp(&y),
            };
            by_key.then(a.1.cmp(&b.1))
        });
    }

    #[test]
    fn rows_through_sampled_ranges_come_out_sorted_each_once() {
        for (order, spread, n) in [
            (SortOptions::default(), 1_000_000, 8),
            (
                SortOptions {
                    descending: true,
                    nulls_first: false,
                },
                50,
                8,
            ),
            (SortOptions::default(), 3, 16),
            (SortOptions::default(), 1, 4),
            (
                SortOptions {
                    descending: false,
                    nulls_first: true,
                },
                500,
                1,
            ),
            (
                SortOptions {
                    descending: true,
                    nulls_first: true,
                },
                40,
                3,
            ),
        ] {
            // Tags unique across outputs: output i's rows are tagged from i * 10_000.
            let outputs: Vec<RecordBatch> = (0..5)
                .map(|i| {
                    let b = batch(keys(i, 100 + 350 * i as usize, spread));
                    let tags = Int64Array::from_iter_values(
                        (0..b.num_rows() as i64).map(|t| t + 10_000 * i as i64),
                    );
                    RecordBatch::try_new(b.schema(), vec![b.column(0).clone(), Arc::new(tags)])
                        .unwrap()
                })
                .collect();
            let got = sort_through_ranges(&outputs, n, order);
            let mut want: Vec<(Option<i64>, i64)> = outputs
                .iter()
                .flat_map(|b| {
                    column(b, 0)
                        .into_iter()
                        .zip(column(b, 1).into_iter().map(Option::unwrap))
                })
                .collect();
            sort_keys(&mut want, order);
            let key_order =
                |rows: &[(Option<i64>, i64)]| rows.iter().map(|r| r.0).collect::<Vec<_>>();
            assert_eq!(
                key_order(&got),
                key_order(&want),
                "{order:?}, spread {spread}"
            );
            let mut got_rows = got.clone();
            got_rows.sort_by_key(|r| r.1);
            let mut want_rows = want.clone();
            want_rows.sort_by_key(|r| r.1);
            assert_eq!(got_rows, want_rows, "each row once");
        }
    }

    #[test]
    fn boundaries_split_the_rows_evenly_and_never_split_equal_keys() {
        let outputs: Vec<RecordBatch> = (0..4).map(|i| batch(keys(i, 2_000, 1_000_000))).collect();
        let key = vec!["k".to_string()];
        let cut: Vec<Partitioned> = outputs
            .iter()
            .map(|b| {
                sorted_with_sample(std::slice::from_ref(b), &key, SortOptions::default(), 8)
                    .unwrap()
            })
            .collect();
        let starts: Vec<Vec<u32>> = cut
            .iter()
            .map(|p| p.starts.iter().map(|&s| s as u32).collect())
            .collect();
        let sampled: Vec<SampledOutput<'_>> = cut
            .iter()
            .zip(&starts)
            .map(|(p, starts)| SampledOutput {
                rows: 2_000,
                starts,
                sample: p.sample.as_ref().unwrap(),
            })
            .collect();
        let inputs = ranges(&sampled, 8).unwrap();
        assert_eq!(inputs.len(), 8);
        for input in &inputs {
            let read: u32 = input.rows.iter().map(|r| r.2).sum();
            // 1,000 rows each, give or take a chunk at each end per output.
            assert!((900..=1_200).contains(&read), "{read} rows read");
        }
        // One key everywhere: one reducer.
        let same: Vec<RecordBatch> = (0..3).map(|_| batch(vec![Some(7); 100])).collect();
        let cut: Vec<Partitioned> = same
            .iter()
            .map(|b| {
                sorted_with_sample(std::slice::from_ref(b), &key, SortOptions::default(), 8)
                    .unwrap()
            })
            .collect();
        let starts: Vec<Vec<u32>> = cut
            .iter()
            .map(|p| p.starts.iter().map(|&s| s as u32).collect())
            .collect();
        let sampled: Vec<SampledOutput<'_>> = cut
            .iter()
            .zip(&starts)
            .map(|(p, starts)| SampledOutput {
                rows: 100,
                starts,
                sample: p.sample.as_ref().unwrap(),
            })
            .collect();
        assert_eq!(ranges(&sampled, 8).unwrap().len(), 1);
    }

    #[test]
    fn empty_outputs_are_left_out_and_bad_samples_refused() {
        let key = vec!["k".to_string()];
        let empty = sorted_with_sample(&[batch(vec![])], &key, SortOptions::default(), 4).unwrap();
        let starts = [0u32];
        let sampled = [SampledOutput {
            rows: 0,
            starts: &starts,
            sample: empty.sample.as_ref().unwrap(),
        }];
        assert_eq!(ranges(&sampled, 4).unwrap(), vec![]);
        let full = sorted_with_sample(
            &[batch(vec![Some(1), Some(2)])],
            &key,
            SortOptions::default(),
            4,
        )
        .unwrap();
        let short = [0u32, 2];
        let sampled = [SampledOutput {
            rows: 2,
            starts: &short,
            sample: full.sample.as_ref().unwrap(),
        }];
        let err = ranges(&sampled, 4).unwrap_err();
        assert!(
            err.contains("map output 0") && err.contains("2 starts"),
            "{err}"
        );
        // From a peer: no rows but starts past them, or keys out of order.
        let none = KeySample::default();
        let past = [0u32, 5];
        let sampled = [SampledOutput {
            rows: 0,
            starts: &past,
            sample: &none,
        }];
        assert!(ranges(&sampled, 4).is_err());
        let backwards = KeySample::from_parts(vec![9, 1, 1], vec![1, 2, 3]).unwrap();
        let starts = [0u32, 1, 2];
        let sampled = [SampledOutput {
            rows: 2,
            starts: &starts,
            sample: &backwards,
        }];
        assert!(ranges(&sampled, 4).unwrap_err().contains("in order"));
        assert!(KeySample::from_parts(vec![1, 2, 3], vec![2, 1]).is_err());
        assert!(KeySample::from_parts(vec![1, 2, 3], vec![1, 2]).is_err());
        let sample = KeySample::from_parts(vec![1, 2, 3], vec![1, 3]).unwrap();
        assert_eq!((sample.key(0), sample.key(1)), (&[1u8][..], &[2u8, 3][..]));
        let moved = KeySample::from_parts(vec![1, 2, 3], vec![2, 3]).unwrap();
        assert_ne!(
            sample.fingerprint(),
            moved.fingerprint(),
            "the same bytes, other keys"
        );
        assert_eq!(sample.fingerprint(), sample.clone().fingerprint());
    }

    #[test]
    fn long_keys_make_fewer_chunks_so_that_a_sample_fits_its_report() {
        let keys: Vec<String> = (0..4_000).map(|i| format!("{i:0>1000}")).collect();
        let b = RecordBatch::try_from_iter([(
            "k",
            Arc::new(arrow_array::StringArray::from(keys)) as ArrayRef,
        )])
        .unwrap();
        let p = sorted_with_sample(
            std::slice::from_ref(&b),
            &["k".to_string()],
            SortOptions::default(),
            64,
        )
        .unwrap();
        let sample = p.sample.unwrap();
        let keys = sample.len();
        let (bytes, _) = sample.into_parts();
        // Within the bound give or take the last key (about 1 KB here).
        assert!(bytes.len() <= MAX_SAMPLE_BYTES + 1_100, "{}", bytes.len());
        assert!(keys > 100, "{keys} keys");
        assert_eq!(p.starts.len(), keys);
        // A key too long for any sample to fit: an error, not a frame a
        // node cannot send.
        let huge = vec!["x".repeat(300 << 10), "y".repeat(300 << 10)];
        let b = RecordBatch::try_from_iter([(
            "k",
            Arc::new(arrow_array::StringArray::from(huge)) as ArrayRef,
        )])
        .unwrap();
        let err = sorted_with_sample(
            std::slice::from_ref(&b),
            &["k".to_string()],
            SortOptions::default(),
            4,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("cannot be sorted"), "{err}");
    }

    #[test]
    fn a_map_output_is_sorted_stably_in_chunks() {
        let b = batch(vec![Some(3), None, Some(1), Some(3), Some(2)]);
        let ascending = SortOptions {
            descending: false,
            nulls_first: false,
        };
        let p =
            sorted_with_sample(std::slice::from_ref(&b), &["k".to_string()], ascending, 1).unwrap();
        assert_eq!(
            column(&p.batch, 0),
            [Some(1), Some(2), Some(3), Some(3), None]
        );
        assert_eq!(
            column(&p.batch, 1),
            [Some(2), Some(4), Some(0), Some(3), Some(1)]
        );
        assert_eq!(
            p.starts,
            [0, 1, 2, 3, 4, 5],
            "one row per chunk below 16 per destination"
        );
        assert_eq!(p.sample.as_ref().unwrap().len(), 6);
        assert!(p.batch.column(0).is_null(4));
    }
}
