//! The all-to-all operators of a [`Dataset`]: shuffle, distinct, sort and
//! group-by, each an exchange (see `exchange.rs` for its two ends,
//! `key_range.rs` for a sort's ranges, and docs/architecture.md for the
//! executor's part).

use streambatch_core::StageOptions;

use crate::dataset::Dataset;
use crate::exchange::{Cut, Exchange, Reduce};
use crate::logical::plan::LogicalOp;

impl Dataset {
    /// Every row sent to a random place, the same for the same `seed`
    /// however the job runs: rows are exchanged to
    /// [`exchange_partitions`](Self::exchange_partitions) reducers by a
    /// seeded hash of each row, and each reducer orders its rows by another.
    ///
    /// ```
    /// # use streambatch_plan::Dataset;
    /// # fn shuffled(ds: &Dataset) -> Dataset {
    /// ds.random_shuffle(7)
    /// # }
    /// ```
    pub fn random_shuffle(&self, seed: u64) -> Self {
        let cut = Cut::Random { seed };
        self.exchange(Exchange::new(
            cut,
            self.exchange_partitions(),
            Reduce::Shuffle { seed },
        ))
    }

    /// Each distinct row once (nulls equal to nulls), in no particular
    /// order: rows are exchanged by a hash of the whole row, and each
    /// reducer keeps the first of its equal rows.
    pub fn distinct(&self) -> Self {
        let cut = Cut::Random { seed: 0 };
        self.exchange(Exchange::new(
            cut,
            self.exchange_partitions(),
            Reduce::Distinct,
        ))
    }

    /// Each distinct value of `column` once (null included), as a table of
    /// that one column, in no particular order: each map task keeps its
    /// own distinct values, exchanged by a hash of the value.
    pub fn unique(&self, column: &str) -> Self {
        let unique = Reduce::Unique {
            column: column.to_string(),
        };
        let cut = Cut::Hash {
            keys: vec![column.to_string()],
        };
        self.exchange(Exchange {
            partial: Some(unique.clone()),
            ..Exchange::new(cut, self.exchange_partitions(), unique)
        })
    }

    fn exchange(&self, exchange: Exchange) -> Self {
        self.then(LogicalOp::Exchange(exchange))
    }

    /// The rows in the order of the key columns `keys` (the first, then
    /// the second among equal firsts, ...), `descending` or not, nulls
    /// last ascending and first descending (see [`sort_with`](Self::sort_with)).
    ///
    /// Each map task sorts each of its outputs and keeps a sample of its
    /// keys (a key per chunk of rows) as it streams; once every output is
    /// in, the quantiles of all the samples cut the keys into ranges, one
    /// per reducer (at most [`exchange_partitions`](Self::exchange_partitions)),
    /// and each reducer merges its range's rows of every output (nothing
    /// runs before the sort's job). The reducers' outputs go on in range
    /// order, to the driver or to a `limit` after the sort (so
    /// `sort(..).limit(n)` is the first n), through operators fused into
    /// the reducers; a later stage that runs tasks of its own gets them in
    /// order but may finish them out of it.
    ///
    /// ```
    /// # use streambatch_plan::Dataset;
    /// # fn newest_first(ds: &Dataset) -> Dataset {
    /// ds.sort(&["day", "amount"], true)
    /// # }
    /// ```
    pub fn sort(&self, keys: &[&str], descending: bool) -> Self {
        self.sort_with(
            keys,
            arrow_schema::SortOptions {
                descending,
                nulls_first: descending,
            },
        )
    }

    /// [`sort`](Self::sort) with nulls placed as `order` says.
    pub fn sort_with(&self, keys: &[&str], order: arrow_schema::SortOptions) -> Self {
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        let cut = Cut::Range {
            keys: keys.clone(),
            order,
        };
        self.exchange(Exchange::new(
            cut,
            self.exchange_partitions(),
            Reduce::Sort { keys, order },
        ))
    }

    /// The rows grouped by the values of `keys` (none: one group of every
    /// row), to aggregate: see [`Grouped::aggregate`].
    pub fn groupby(&self, keys: &[&str]) -> Grouped {
        Grouped {
            input: self.clone(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
        }
    }

    /// The reducers of an exchange over this dataset: one per source split,
    /// or more where the source's files hold more than a partition's
    /// target bytes per split (`exchange_target`: at most a sixteenth of
    /// the store), so that a reducer holds about a partition (at least one
    /// reducer, at most 1,024).
    pub fn exchange_partitions(&self) -> usize {
        let Some(LogicalOp::Source { splits, .. }) = self.plan.chain().into_iter().next() else {
            return 1;
        };
        let bytes: u64 = splits
            .iter()
            .flat_map(|s| s.files())
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum();
        let config = self.runner().config();
        let target = crate::logical::plan::exchange_target(
            config.target_partition_bytes,
            config.store_capacity,
        );
        let by_bytes = bytes.div_ceil(target) as usize;
        splits.len().max(by_bytes).clamp(1, 1024)
    }
}

/// A dataset grouped by keys: [`Dataset::groupby`].
#[derive(Clone)]
pub struct Grouped {
    input: Dataset,
    keys: Vec<String>,
}

impl Grouped {
    /// Rows cut by a hash of the keys.
    fn cut(&self) -> Cut {
        Cut::Hash {
            keys: self.keys.clone(),
        }
    }

    /// Reducers: one per source split, or one for a single group.
    fn partitions(&self) -> usize {
        match self.keys.is_empty() {
            true => 1,
            false => self.input.exchange_partitions(),
        }
    }

    /// One row per group: its keys, then each aggregate (named as
    /// [`Agg::name`](crate::exchange::group::aggregate::Agg::name) says). Each map task aggregates its
    /// rows into partial states before the exchange, so a group crosses it
    /// once per task however many rows it has; groups come in no
    /// particular order.
    ///
    /// ```
    /// # use streambatch_plan::{Agg, Dataset};
    /// # fn totals(ds: &Dataset) -> Dataset {
    /// ds.groupby(&["customer"])
    ///     .aggregate(&[Agg::count(), Agg::sum("amount"), Agg::mean("amount")])
    /// # }
    /// ```
    pub fn aggregate(&self, aggs: &[crate::exchange::group::aggregate::Agg]) -> Dataset {
        let step = |step| crate::exchange::Reduce::Aggregate {
            keys: self.keys.clone(),
            aggs: aggs.to_vec(),
            step,
        };
        self.input.exchange(Exchange {
            partial: Some(step(crate::exchange::group::aggregate::Step::Partial)),
            ..Exchange::new(
                self.cut(),
                self.partitions(),
                step(crate::exchange::group::aggregate::Step::Final),
            )
        })
    }

    /// `udf` called on each group as a batch of its own (every row of the
    /// group, whatever its size), its outputs the dataset's rows: rows are
    /// exchanged by a hash of the keys, and each reducer calls `udf` on its
    /// groups in key order, on `options`' resources (its batch size is
    /// ignored: a call is a group).
    ///
    /// ```
    /// # use streambatch_plan::{Dataset, UdfError};
    /// # use arrow_array::RecordBatch;
    /// # fn firsts(ds: &Dataset) -> Dataset {
    /// // The first row of each customer's group.
    /// ds.groupby(&["customer"]).map_groups(
    ///     |group: RecordBatch| Ok::<_, UdfError>(group.slice(0, 1)),
    ///     streambatch_core::Resources::cpu(1.0),
    /// )
    /// # }
    /// ```
    pub fn map_groups(
        &self,
        udf: impl crate::udf::BatchUdf,
        options: impl Into<StageOptions>,
    ) -> Dataset {
        // A call is a group: not cut into batches, and fused into the
        // reducers (a stage of its own would join and cut its outputs).
        let options = StageOptions {
            batch_rows: None,
            no_fuse: false,
            ..options.into()
        };
        let groups = Reduce::Groups {
            keys: self.keys.clone(),
        };
        self.input
            .exchange(Exchange {
                reduce_resources: Some(options.resources),
                ..Exchange::new(self.cut(), self.partitions(), groups)
            })
            .map_batches(udf, options)
    }
}
