//! What an exchange does at its two ends (issue 26): the map side's cut of
//! each output by destination ([`Cut`]) and what a reducer makes of its
//! destination's rows ([`Reduce`]). The exchange itself, between them, is
//! the executor's: it collects the map side's outputs, each one stored
//! partition with where each destination's rows start, and hands reducer
//! `d` the slices of destination `d` once every output is in.
//!
//! Both ends depend on the rows alone, never on the order in which tasks
//! ran: a re-run makes the same cut (lineage re-makes a lost output
//! exactly), and the same seed gives the same output however the job was
//! scheduled.
//!
//! The families, each a folder or file here: the cut by destination
//! (`cut`), rows gathered from several batches (`gather`), `sort`, `group`
//! and `join`, the scratch files their reducers spill to (`scratch`) and
//! the memory they hold before they do (`reservation`).
//! It imports only `udf` and `error` below it; the planner (`logical`)
//! names its reducers.

pub(crate) mod archive;
pub(crate) mod cut;
pub(crate) mod gather;
pub(crate) mod group;
pub(crate) mod join;
pub(crate) mod reservation;
pub(crate) mod scratch;
pub(crate) mod sort;

use std::collections::HashSet;

use arrow_array::{RecordBatch, UInt32Array};
use arrow_row::Rows;
use arrow_schema::{SchemaRef, SortOptions};

use crate::error::{Error, Result};
use crate::exchange::cut::{Partitioned, by_hash, column_indices, group, key_rows, key_rows_of};
use crate::exchange::group::aggregate::{Agg, Step, aggregate};
use crate::exchange::sort::sorted::Sorted;

/// How the map side picks each row's destination.
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum Cut {
    /// By a hash of the key columns: equal keys (nulls included) meet.
    Hash {
        /// The key columns.
        keys: Vec<String>,
    },
    /// By a hash of the whole row, seeded: distinct rows spread evenly,
    /// whatever the input's order; equal rows meet (as `distinct` needs).
    Random {
        /// The seed.
        seed: u64,
    },
    /// A join's inputs by a hash of each side's key columns (as
    /// [`Cut::Hash`]), the side read from each batch's tag
    /// ([`SIDE_TAG`](crate::exchange::join::hash::SIDE_TAG)): equal keys of both sides meet.
    Join {
        /// The left input's key columns.
        left: Vec<String>,
        /// The right input's, as many, of the same types.
        right: Vec<String>,
    },
    /// By the key columns' order, for a sort: each output is sorted and
    /// cut into chunks with a sample of its keys, and the reducers' ranges
    /// are taken from every output's sample once all are in (see
    /// `key_range.rs`).
    Range {
        /// The key columns.
        keys: Vec<String>,
        /// How they are ordered.
        #[rkyv(with = archive::SortOrder)]
        order: SortOptions,
    },
}

impl Cut {
    /// The rows of `parts` (a map output's batches, of one schema, one
    /// after another) as one batch grouped by destination, among `n`.
    pub fn apply(&self, parts: &[RecordBatch], n: usize) -> Result<Partitioned> {
        let Some(first) = parts.first() else {
            return Err(Error::Invalid("cutting a map output of no batch".into()));
        };
        match self {
            Cut::Hash { keys } => by_hash(parts, &column_indices(first, keys)?, n, 0),
            Cut::Join { left, right } => {
                let tag = first
                    .schema()
                    .metadata()
                    .get(crate::exchange::join::hash::SIDE_TAG)
                    .cloned();
                let keys = match tag.as_deref() {
                    Some("0") => left,
                    Some("1") => right,
                    _ => {
                        return Err(Error::Invalid(
                            "join: a map output is not marked as either input's".into(),
                        ));
                    }
                };
                by_hash(parts, &column_indices(first, keys)?, n, 0)
            }
            Cut::Random { seed } => {
                let rows = whole_rows(parts)?;
                let n = n.max(1) as u64;
                group(parts, n as usize, |row| {
                    (seeded_hash(&rows, row, *seed) % n) as usize
                })
            }
            Cut::Range { keys, order } => {
                crate::exchange::sort::range::sorted_with_sample(parts, keys, *order, n)
            }
        }
    }
}

/// What a reducer makes of its destination's rows.
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum Reduce {
    /// The rows in a seeded random order ([`Dataset::random_shuffle`](crate::dataset::Dataset::random_shuffle)).
    Shuffle {
        /// The seed.
        seed: u64,
    },
    /// Each distinct row once ([`Dataset::distinct`](crate::dataset::Dataset::distinct)).
    Distinct,
    /// Each distinct value of one column once, as a one-column table
    /// ([`Dataset::unique`](crate::dataset::Dataset::unique)).
    Unique {
        /// The column.
        column: String,
    },
    /// The rows in the order of their keys ([`Dataset::sort`](crate::dataset::Dataset::sort)).
    Sort {
        /// The key columns.
        keys: Vec<String>,
        /// How they are ordered.
        #[rkyv(with = archive::SortOrder)]
        order: SortOptions,
    },
    /// Each group of equal keys as a batch of its own, the groups in key
    /// order ([`Grouped::map_groups`](crate::dataset::all_to_all::Grouped::map_groups)).
    Groups {
        /// The key columns.
        keys: Vec<String>,
    },
    /// A join's left and right rows joined ([`Dataset::join`](crate::dataset::Dataset::join)).
    Join(crate::exchange::join::hash::Join),
    /// Rows aggregated by keys ([`Dataset::groupby`](crate::dataset::Dataset::groupby)):
    /// a map task's rows to partial states, or partial states merged.
    Aggregate {
        /// The key columns.
        keys: Vec<String>,
        /// The aggregates.
        aggs: Vec<Agg>,
        /// Which step.
        step: Step,
    },
}

impl Reduce {
    /// The reduce, checked as its constructors check it: one that
    /// arrived from a peer is hostile until it is (a join's keys against
    /// its schemas; the rest holds nothing to check).
    pub fn checked(self) -> Result<Self> {
        Ok(match self {
            Reduce::Join(join) => Reduce::Join(join.checked()?),
            other => other,
        })
    }

    /// The operator's name in plans and stats.
    pub fn name(&self) -> &'static str {
        match self {
            Reduce::Shuffle { .. } => "random_shuffle",
            Reduce::Distinct => "distinct",
            Reduce::Unique { .. } => "unique",
            Reduce::Sort { .. } => "sort",
            Reduce::Groups { .. } => "groups",
            Reduce::Join(_) => "join",
            Reduce::Aggregate {
                step: Step::Partial,
                ..
            } => "partial_aggregate",
            Reduce::Aggregate {
                step: Step::Final, ..
            } => "aggregate",
        }
    }

    /// Reduces one destination's rows, `batches`, of schema `schema`: one
    /// batch, or (for [`Reduce::Groups`]) one per group.
    pub fn run_all(&self, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<RecordBatch>> {
        let keys = match self {
            Reduce::Groups { keys } => keys,
            Reduce::Join(join) => return join.run(batches)?.collect(),
            _ => return Ok(vec![self.run(schema, batches)?]),
        };
        let all = arrow_select::concat::concat_batches(schema, batches)
            .map_err(|e| self.arrow_error(e))?;
        let at = column_indices(&all, keys)?;
        let rows = key_rows(&all, &at, &[])?;
        let mut order: Vec<u32> = (0..all.num_rows() as u32).collect();
        order.sort_by(|&a, &b| rows.row(a as usize).cmp(&rows.row(b as usize)));
        let mut groups = Vec::new();
        let mut start = 0;
        while start < order.len() {
            let key = rows.row(order[start] as usize);
            let end = start
                + order[start..]
                    .iter()
                    .position(|&r| rows.row(r as usize) != key)
                    .unwrap_or(order.len() - start);
            let indices = UInt32Array::from(order[start..end].to_vec());
            groups.push(
                arrow_select::take::take_record_batch(&all, &indices)
                    .map_err(|e| self.arrow_error(e))?,
            );
            start = end;
        }
        Ok(groups)
    }

    /// [`run_all`](Self::run_all)'s batches as they are made (a join's or
    /// a sort's output never held whole).
    pub fn stream_all(
        &self,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<crate::udf::BatchIter> {
        Ok(match self {
            Reduce::Join(join) => Box::new(join.run(batches)?),
            Reduce::Sort { keys, order } => {
                Box::new(Sorted::new(schema, batches.to_vec(), keys, *order)?)
            }
            _ => Box::new(self.run_all(schema, batches)?.into_iter().map(Ok)),
        })
    }

    /// Reduces one destination's rows, `batches`, of schema `schema`
    /// (a join's or `map_groups`' into one batch).
    pub fn run(&self, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<RecordBatch> {
        let whole = match self {
            Reduce::Join(join) => Some(join.schema()),
            Reduce::Groups { .. } | Reduce::Sort { .. } => Some(schema.clone()),
            _ => None,
        };
        if let Some(schema) = whole {
            let out: Vec<RecordBatch> =
                self.stream_all(&schema, batches)?.collect::<Result<_>>()?;
            return arrow_select::concat::concat_batches(&schema, &out)
                .map_err(|e| self.arrow_error(e));
        }
        let all = arrow_select::concat::concat_batches(schema, batches)
            .map_err(|e| self.arrow_error(e))?;
        match self {
            Reduce::Aggregate { keys, aggs, step } => return aggregate(&all, keys, aggs, *step),

            Reduce::Unique { column } => {
                let at = column_indices(&all, std::slice::from_ref(column))?;
                let values = all.project(&at).map_err(|e| self.arrow_error(e))?;
                return Reduce::Distinct.run(&values.schema(), &[values]);
            }
            _ => {}
        }
        if all.num_rows() == 0 {
            return Ok(all);
        }
        let rows = whole_rows(std::slice::from_ref(&all))?;
        let order: Vec<u32> = match self {
            // Ordered by a seeded hash of each row (ties, by the row), so
            // that the order is the rows' own, not their arrival's.
            Reduce::Shuffle { seed } => {
                let salt = seed ^ 0x5eed_5eed_5eed_5eed;
                let keys: Vec<u64> = (0..all.num_rows())
                    .map(|row| seeded_hash(&rows, row, salt))
                    .collect();
                let mut order: Vec<u32> = (0..all.num_rows() as u32).collect();
                order.sort_unstable_by(|&a, &b| {
                    let (a, b) = (a as usize, b as usize);
                    keys[a]
                        .cmp(&keys[b])
                        .then_with(|| rows.row(a).cmp(&rows.row(b)))
                });
                order
            }
            Reduce::Sort { .. }
            | Reduce::Aggregate { .. }
            | Reduce::Join(_)
            | Reduce::Groups { .. }
            | Reduce::Unique { .. } => {
                unreachable!("handled above and in run_all")
            }
            // The first of each distinct row, in the rows' order (so the
            // same input gives the same output, whatever its arrival).
            Reduce::Distinct => {
                let mut seen = HashSet::new();
                let mut order: Vec<u32> = (0..all.num_rows() as u32)
                    .filter(|&row| seen.insert(rows.row(row as usize)))
                    .collect();
                order.sort_unstable_by(|&a, &b| rows.row(a as usize).cmp(&rows.row(b as usize)));
                order
            }
        };
        arrow_select::take::take_record_batch(&all, &UInt32Array::from(order))
            .map_err(|e| self.arrow_error(e))
    }

    fn arrow_error(&self, e: arrow_schema::ArrowError) -> Error {
        Error::arrow(self.name(), e)
    }
}

/// What an exchange is: see [`Cut`], [`Reduce`].
#[derive(Clone, Debug, PartialEq)]
pub struct Exchange {
    /// The map side's cut.
    pub cut: Cut,
    /// Destinations: reducers.
    pub partitions: usize,
    /// What each reducer does.
    pub reduce: Reduce,
    /// What each map task does to all of its rows before the cut (a
    /// partial aggregation), if anything.
    pub partial: Option<Reduce>,
    /// The reducers' resources, where not one CPU (a `map_groups` function
    /// runs in the reducers' tasks, on its own resources).
    pub reduce_resources: Option<streambatch_core::Resources>,
}

impl Exchange {
    /// An exchange with no partial step, its reducers on one CPU each.
    pub fn new(cut: Cut, partitions: usize, reduce: Reduce) -> Self {
        Self {
            cut,
            partitions,
            reduce,
            partial: None,
            reduce_resources: None,
        }
    }
}

/// Every column of `parts` (batches of one schema) encoded as comparable
/// rows, one after another.
fn whole_rows(parts: &[RecordBatch]) -> Result<Rows> {
    let all: Vec<usize> = (0..parts.first().map_or(0, RecordBatch::num_columns)).collect();
    key_rows_of(parts, &all, &[])
}

fn seeded_hash(rows: &Rows, row: usize, seed: u64) -> u64 {
    streambatch_core::mix64(streambatch_core::fnv1a(rows.row(row).as_ref()) ^ seed)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{Int64Array, StringArray};

    use super::*;

    fn batch(ids: &[Option<i64>], names: &[Option<&str>]) -> RecordBatch {
        RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(ids.to_vec())) as _),
            ("name", Arc::new(StringArray::from(names.to_vec())) as _),
        ])
        .unwrap()
    }

    fn ids(b: &RecordBatch) -> Vec<Option<i64>> {
        b.column(0).as_primitive::<Int64Type>().iter().collect()
    }

    #[test]
    fn a_hash_cut_sends_equal_keys_nulls_included_to_one_destination() {
        let b = batch(
            &[Some(1), None, Some(2), Some(1), None, Some(3)],
            &[Some("a"), Some("b"), None, Some("c"), Some("d"), None],
        );
        let cut = Cut::Hash {
            keys: vec!["id".into()],
        };
        let p = cut.apply(std::slice::from_ref(&b), 4).unwrap();
        assert_eq!(p.starts.len(), 5);
        let mut seen = Vec::new();
        for d in 0..4 {
            for id in ids(&p.rows_for(d)) {
                seen.push(id);
                let again = cut.apply(&[batch(&[id], &[Some("z")])], 4).unwrap();
                assert_eq!(
                    again.rows_for(d).num_rows(),
                    1,
                    "{id:?} left destination {d}"
                );
            }
        }
        seen.sort();
        assert_eq!(seen, [None, None, Some(1), Some(1), Some(2), Some(3)]);
        let missing = Cut::Hash {
            keys: vec!["nope".into()],
        };
        let err = missing
            .apply(std::slice::from_ref(&b), 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope") && err.contains("id"), "{err}");
    }

    #[test]
    fn a_shuffle_is_the_same_rows_in_an_order_its_seed_fixes_whatever_the_arrival() {
        let values: Vec<Option<i64>> = (0..200).map(Some).collect();
        let names = vec![Some("x"); 200];
        let all = batch(&values, &names);
        let schema = all.schema();
        let shuffled = |seed, parts: &[RecordBatch]| {
            ids(&Reduce::Shuffle { seed }.run(&schema, parts).unwrap())
        };
        let one = shuffled(1, &[all.slice(0, 120), all.slice(120, 80)]);
        let reversed = shuffled(1, &[all.slice(120, 80), all.slice(0, 120)]);
        assert_eq!(one, reversed);
        assert_ne!(one, values, "not shuffled");
        assert_ne!(one, shuffled(2, std::slice::from_ref(&all)));
        let mut sorted = one.clone();
        sorted.sort();
        assert_eq!(sorted, values);
        // A random cut spreads rows over every destination.
        let p = Cut::Random { seed: 1 }
            .apply(std::slice::from_ref(&all), 4)
            .unwrap();
        assert!(
            (0..4).all(|d| p.rows_for(d).num_rows() > 20),
            "{:?}",
            p.starts
        );
    }

    #[test]
    fn every_cut_of_gathered_batches_is_the_cut_of_them_joined() {
        let values: Vec<Option<i64>> = (0..300)
            .map(|i| (i % 7 != 0).then_some((i * 37) % 101))
            .collect();
        let names: Vec<Option<&str>> = (0..300).map(|i| Some(["a", "b", "c"][i % 3])).collect();
        let all = batch(&values, &names);
        let parts = [all.slice(0, 1), all.slice(1, 150), all.slice(151, 149)];
        let order = SortOptions::default();
        for cut in [
            Cut::Hash {
                keys: vec!["id".into()],
            },
            Cut::Random { seed: 3 },
            Cut::Range {
                keys: vec!["id".into()],
                order,
            },
        ] {
            let whole = cut.apply(std::slice::from_ref(&all), 5).unwrap();
            let gathered = cut.apply(&parts, 5).unwrap();
            assert_eq!(gathered.batch, whole.batch, "{cut:?}");
            assert_eq!(gathered.starts, whole.starts, "{cut:?}");
            assert_eq!(gathered.sample, whole.sample, "{cut:?}");
        }
        let none = Cut::Random { seed: 3 }
            .apply(&[], 5)
            .unwrap_err()
            .to_string();
        assert!(none.contains("no batch"), "{none}");
    }

    #[test]
    fn distinct_keeps_each_row_once_nulls_included() {
        let b = batch(
            &[Some(1), None, Some(1), None, Some(2), Some(1)],
            &[Some("a"), None, Some("a"), None, Some("a"), Some("b")],
        );
        let out = Reduce::Distinct
            .run(&b.schema(), &[b.slice(0, 3), b.slice(3, 3)])
            .unwrap();
        let mut rows: Vec<(Option<i64>, Option<String>)> = ids(&out)
            .into_iter()
            .zip(
                out.column(1)
                    .as_string::<i32>()
                    .iter()
                    .map(|s| s.map(String::from)),
            )
            .collect();
        rows.sort();
        assert_eq!(
            rows,
            [
                (None, None),
                (Some(1), Some("a".into())),
                (Some(1), Some("b".into())),
                (Some(2), Some("a".into()))
            ]
        );
        let empty = Reduce::Distinct.run(&b.schema(), &[]).unwrap();
        assert_eq!(empty.num_rows(), 0);
    }
}
