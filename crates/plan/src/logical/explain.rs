//! What a dataset will run, before it runs: the logical plan, the stages it
//! fuses into with their resources and worker pools, and the memory each
//! stage's outputs are reserved in the store (see [`ExecPlan::sizing`]).

use std::fmt;

use streambatch_core::{PoolSize, Resources, format_bytes};

use crate::logical::plan::{ExecPlan, LogicalOp, StageKind};

/// A dataset's plan, as `Dataset::explain` shows it.
#[derive(Clone, Debug)]
pub struct Explain {
    /// The logical plan, one line per step, source first.
    pub logical: Vec<String>,
    /// The physical stages, source first.
    pub stages: Vec<StageExplain>,
    /// The store capacity the budgets are drawn from.
    pub store_capacity: u64,
    /// The partition size tasks cut their outputs at (the configured
    /// `target_partition_bytes`, made smaller when the store is small).
    pub partition_bytes: u64,
    /// What the stages' reserves leave of the capacity: a pool any stage's
    /// outputs may use beyond its reserve.
    pub shared_pool: u64,
}

/// One stage of an [`Explain`].
#[derive(Clone, Debug)]
pub struct StageExplain {
    /// The fused operators' names joined by `->`.
    pub name: String,
    /// Source, map, limit, repartition or exchange.
    pub kind: &'static str,
    /// The map side of an exchange: how its outputs are cut, into how
    /// many destinations.
    pub cut: Option<String>,
    /// The operators fused in it.
    pub ops: Vec<String>,
    /// What each of its tasks holds.
    pub resources: Resources,
    /// Rows per call of its function, when fixed.
    pub batch_rows: Option<usize>,
    /// The worker pool of a stateful operator.
    pub pool: Option<PoolSize>,
    /// Bytes of the store reserved for its outputs.
    pub reserve: u64,
    /// What its operators say of themselves (a model's inputs, outputs
    /// and opset: [`BatchUdf::describe`](crate::udf::BatchUdf::describe)).
    pub details: Vec<String>,
}

impl Explain {
    /// The explanation of `plan` (from `logical`) on a store of `capacity`
    /// bytes with partitions of `target` bytes.
    pub fn new(logical: &[LogicalOp], plan: &ExecPlan, target: u64, capacity: u64) -> Self {
        let (partition_bytes, reserve) = plan.sizing(target, capacity);
        let stages = plan
            .stages
            .iter()
            .zip(&reserve)
            .map(|(s, reserve)| StageExplain {
                name: s.name.clone(),
                kind: match s.kind {
                    StageKind::Source { .. } => "source",
                    StageKind::Map { .. } => "map",
                    StageKind::Limit(_) => "limit",
                    StageKind::Repartition(_) => "repartition",
                    StageKind::Exchange(_) => "exchange",
                },
                cut: s.cut.as_ref().map(|(cut, n)| match cut {
                    crate::exchange::Cut::Hash { keys } => {
                        format!("by hash of {} into {n}", keys.join(", "))
                    }
                    crate::exchange::Cut::Random { .. } => format!("at random into {n}"),
                    crate::exchange::Cut::Join { left, right } => format!(
                        "by hash of {} (left) and {} (right) into {n}",
                        left.join(", "),
                        right.join(", ")
                    ),
                    crate::exchange::Cut::Range { keys, .. } => {
                        let keys = keys.join(", ");
                        format!(
                            "sorted, by ranges of {keys} sampled as it streams, into at most {n}"
                        )
                    }
                }),
                ops: s.op_names.clone(),
                resources: s.options.resources,
                batch_rows: s.options.batch_rows,
                pool: s.options.pool,
                reserve: *reserve,
                details: match &s.kind {
                    StageKind::Source { ops, .. } | StageKind::Map { ops } => ops
                        .iter()
                        .flat_map(|(_, op)| match &op.kind {
                            crate::logical::ops::OpKind::MapBatches(udf) => udf.describe(),
                            _ => Vec::new(),
                        })
                        .collect(),
                    _ => Vec::new(),
                },
            })
            .collect();
        Self {
            logical: logical.iter().map(describe).collect(),
            stages,
            store_capacity: capacity,
            partition_bytes,
            shared_pool: capacity.saturating_sub(reserve.iter().sum()),
        }
    }

    /// The stages' names, source first.
    pub fn stage_names(&self) -> Vec<String> {
        self.stages.iter().map(|s| s.name.clone()).collect()
    }
}

fn describe(op: &LogicalOp) -> String {
    match op {
        LogicalOp::Source { name, splits, .. } => format!("{name} ({} splits)", splits.len()),
        LogicalOp::Op(spec) => spec.name.clone(),
        LogicalOp::Limit(n) => format!("limit {n}"),
        LogicalOp::Repartition(n) => format!("repartition {n}"),
        LogicalOp::Exchange(e) => format!("{} ({} partitions)", e.reduce.name(), e.partitions),
    }
}

impl fmt::Display for Explain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "logical plan: {}", self.logical.join(" -> "))?;
        writeln!(f, "stages (operators with equal resources fuse):")?;
        for (i, s) in self.stages.iter().enumerate() {
            let r = &s.resources;
            let mut holds = Vec::new();
            if r.cpus > 0.0 {
                holds.push(format!("{} cpu", r.cpus));
            }
            if r.gpus > 0.0 {
                holds.push(format!("{} gpu", r.gpus));
            }
            if holds.is_empty() {
                holds.push("no slot".into());
            }
            let mut line = format!("  {i}. {} [{}] {}", s.name, s.kind, holds.join(" + "));
            if let Some(rows) = s.batch_rows {
                line += &format!(", {rows} rows per call");
            }
            if let Some(pool) = s.pool {
                line += &format!(", pool {}..{} workers", pool.min, pool.max);
            }
            if let Some(cut) = &s.cut {
                line += &format!(", outputs cut {cut}");
            }
            if s.reserve > 0 {
                line += &format!(", outputs reserved {}", format_bytes(s.reserve));
            }
            writeln!(f, "{line}")?;
            for detail in &s.details {
                writeln!(f, "       {detail}")?;
            }
        }
        write!(
            f,
            "memory: store {}, partitions up to {}, shared pool {} beyond the reserves",
            format_bytes(self.store_capacity),
            format_bytes(self.partition_bytes),
            format_bytes(self.shared_pool)
        )
    }
}
