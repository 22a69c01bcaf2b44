//! `join`: the plan of a hash join. Both inputs are read side by side by
//! one source stage (see `union.rs`), each batch tagged with its side; the
//! map side cuts each batch by a hash of its side's key columns (equal keys
//! of either side meet at one reducer), and each reducer joins its left
//! rows with its right rows (`hash_join.rs`). A small right input is
//! broadcast instead: carried in the plan and joined in the left's tasks.

use std::sync::Arc;

use arrow_array::RecordBatch;

use crate::dataset::Dataset;
use crate::error::Result;
use crate::exchange::join::hash::{Broadcast, Join, JoinHow};
use crate::exchange::{Cut, Exchange, Reduce};
use crate::logical::ops::{OpKind, OpSpec};

impl Dataset {
    /// The rows, when they hold at most `limit` bytes as Arrow arrays;
    /// `None` (the job stopped) as soon as they hold more.
    fn collect_under(&self, limit: u64) -> Result<Option<Vec<RecordBatch>>> {
        if limit == 0 {
            return Ok(None);
        }
        let mut held = 0u64;
        let mut rows = Vec::new();
        for batch in self.iter_batches()? {
            let batch = batch?;
            held += batch.get_array_memory_size() as u64;
            if held > limit {
                return Ok(None);
            }
            rows.push(batch);
        }
        Ok(Some(rows))
    }

    /// The rows of this dataset (the left) joined with `other`'s (the
    /// right) on equal values of the columns `on` (named alike on both
    /// sides), keeping the rows `how` says; see [`join_on`](Self::join_on).
    ///
    /// ```
    /// # use streambatch_plan::{Dataset, JoinHow};
    /// # fn named(orders: &Dataset, customers: &Dataset) -> streambatch_plan::Result<Dataset> {
    /// orders.join(customers, &["customer"], JoinHow::Left)
    /// # }
    /// ```
    pub fn join(&self, other: &Dataset, on: &[&str], how: JoinHow) -> Result<Dataset> {
        self.join_on(other, on, on, how)
    }

    /// The rows of this dataset joined with `other`'s where each of the
    /// left's columns `left_on` equals the right's column of the same place
    /// in `right_on` (see [`Join`] for the output's columns). Both inputs
    /// are read by one source stage (each must be a source and row-wise
    /// operators, as for [`union`](Self::union)) and exchanged by a hash
    /// of their keys to [`exchange_partitions`](Self::exchange_partitions)
    /// reducers of the two together; each reducer builds a hash table of
    /// its right rows and probes it with its left rows. The inputs'
    /// schemas are needed now: where the plan does not know one, its first
    /// batch is computed.
    ///
    /// An inner, left, semi or anti join whose right input holds at most
    /// `NodeConfig::broadcast_join_bytes` (512 KiB by default, less what
    /// the broadcast joins before it carry) is a broadcast join instead:
    /// the right input is run now, its rows carried in the plan, and each
    /// task of the left (whatever operators come before it: the left need
    /// not be a source and row-wise operators) probes a table of them with
    /// its batches, with no exchange. A larger right input stops that run
    /// as soon as it is over the limit.
    pub fn join_on(
        &self,
        other: &Dataset,
        left_on: &[&str],
        right_on: &[&str],
        how: JoinHow,
    ) -> Result<Dataset> {
        let join = Join::new(how, left_on, right_on, self.schema()?, other.schema()?)?;
        // A cluster's plan carries every broadcast input: they share the
        // limit.
        let carried: u64 = self
            .plan
            .chain()
            .iter()
            .map(|op| match op {
                crate::logical::plan::LogicalOp::Op(OpSpec {
                    kind: OpKind::BroadcastJoin(b),
                    ..
                }) => b.right.get_array_memory_size() as u64,
                _ => 0,
            })
            .sum();
        let limit = self
            .runner()
            .config()
            .broadcast_join_bytes
            .saturating_sub(carried);
        if !how.keeps_right_unmatched()
            && let Some(right) = other.collect_under(limit)?
        {
            let name = format!("join[{}, broadcast]", how.name());
            let kind = OpKind::BroadcastJoin(Arc::new(Broadcast::new(join, &right)?));
            return Ok(self.then(crate::logical::plan::LogicalOp::Op(OpSpec {
                name,
                kind,
                options: streambatch_core::Resources::cpu(1.0).into(),
            })));
        }
        let cut = Cut::Join {
            left: join.left_on.clone(),
            right: join.right_on.clone(),
        };
        let name = format!("join[{}]", how.name());
        let read = self.read_sides(&[self, other], &[Some(0), Some(1)], &name, None)?;
        let partitions = read.exchange_partitions();
        Ok(
            read.then(crate::logical::plan::LogicalOp::Exchange(Exchange::new(
                cut,
                partitions,
                Reduce::Join(join),
            ))),
        )
    }
}
