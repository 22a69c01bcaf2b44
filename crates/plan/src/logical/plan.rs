//! The logical plan (a chain of operators built by `Dataset`) and its physical
//! form: stages of fused operators that the executor schedules.

use std::sync::Arc;

use arrow_schema::SchemaRef;
use streambatch_core::{Resources, StageOptions};

use crate::error::{Error, Result};
use crate::logical::ops::{OpCounter, OpKind, OpSpec, TaskEnv, apply, counted};
use crate::logical::source::SourceSplit;
use crate::udf::BatchIter;

/// One step of the logical plan (named apart from a cluster's nodes).
#[derive(Clone)]
pub enum LogicalOp {
    /// The source: its splits and, where known before running, its schema.
    Source {
        /// `read_parquet`, `range`, ...
        name: String,
        /// The splits, one per task.
        splits: Vec<SourceSplit>,
        /// The schema, when known.
        schema: Option<SchemaRef>,
    },
    /// An operator.
    Op(OpSpec),
    /// The first n rows.
    Limit(usize),
    /// Rows regrouped into n partitions of equal rows.
    Repartition(usize),
    /// Rows sent across partitions (sort, shuffle, group, join).
    Exchange(crate::exchange::Exchange),
}

/// A logical plan: a chain of steps ending here.
pub struct LogicalPlan {
    /// The plan this step reads from; `None` for the source.
    pub input: Option<Arc<LogicalPlan>>,
    /// What this step does.
    pub op: LogicalOp,
}

impl LogicalPlan {
    /// The chain from the source to this step.
    pub fn chain(self: &Arc<Self>) -> Vec<LogicalOp> {
        let mut ops = Vec::new();
        let mut cur = Some(self.clone());
        while let Some(n) = cur {
            ops.push(n.op.clone());
            cur = n.input.clone();
        }
        ops.reverse();
        ops
    }
}

/// A stage of the physical plan: what one task of it does.
#[derive(Clone)]
pub enum StageKind {
    /// Reads a split and runs the fused operators over it.
    Source {
        /// The source's splits.
        splits: Vec<SourceSplit>,
        /// Operators fused after the read, with their positions in the plan.
        ops: Vec<(usize, OpSpec)>,
    },
    /// Runs fused operators over one input partition.
    Map {
        /// The operators, with their positions in the plan.
        ops: Vec<(usize, OpSpec)>,
    },
    /// Passes on the first n rows and ends every stage before it.
    Limit(usize),
    /// Waits for all input, then regroups it into n equal partitions.
    Repartition(usize),
    /// Waits for every output of the stage before (each cut by
    /// destination, see [`Stage::cut`]), then hands destination `d`'s
    /// rows of all of them to the `d`-th task of the stage after.
    Exchange(usize),
}

/// A stage: one or more fused operators with equal resources.
#[derive(Clone)]
pub struct Stage {
    /// Operator names joined by `->`.
    pub name: String,
    /// What its tasks do.
    pub kind: StageKind,
    /// Resources each task holds; the pool of a stateful operator.
    pub options: StageOptions,
    /// The names of the operators fused in this stage (the source's first).
    pub op_names: Vec<String>,
    /// What flowed out of each of them, in the same order.
    pub counters: Vec<Arc<OpCounter>>,
    /// The map side of an exchange: each output of a task is cut into
    /// this many destinations this way (see [`crate::exchange::Cut`]).
    pub cut: Option<(crate::exchange::Cut, usize)>,
}

/// The input of one task.
pub enum TaskInput {
    /// The i-th split of a source stage.
    Split(usize),
    /// Batches read from the store (slices of upstream partitions), each
    /// read when the task comes to it.
    Batches(BatchIter),
}

impl Stage {
    /// What a task of this stage over split `i` holds outside the store
    /// ([`SourceSplit::held_bytes`]; 0 for other stages).
    pub fn split_held_bytes(&self, i: usize) -> u64 {
        match &self.kind {
            StageKind::Source { splits, .. } => splits.get(i).map_or(0, SourceSplit::held_bytes),
            _ => 0,
        }
    }

    /// Starts fetching, for `job`, what a task of this stage over split
    /// `i` reads first, where that can be ([`SourceSplit::read_ahead`]).
    pub fn read_ahead(&self, i: usize, job: crate::object::read_ahead::ReadAheadOwner) {
        if let StageKind::Source { splits, .. } = &self.kind
            && let Some(split) = splits.get(i)
        {
            split.read_ahead(job);
        }
    }

    /// Opens a task of this stage over `input`: the returned stream yields the
    /// task's output as it is computed.
    pub fn open(&self, input: TaskInput, env: &mut TaskEnv<'_>) -> Result<BatchIter> {
        let mut counters = self.counters.iter().cloned();
        let (mut stream, ops): (BatchIter, &[(usize, OpSpec)]) = match (&self.kind, input) {
            (StageKind::Source { splits, ops }, TaskInput::Split(i)) => {
                let split = splits
                    .get(i)
                    .ok_or_else(|| Error::Invalid(format!("no split {i} in {}", self.name)))?;
                let mut read = counted(
                    split.open()?,
                    counters.next().expect("a counter per operator"),
                );
                if let SourceSplit::Side { side, .. } = split {
                    read = side.run(read, env)?;
                }
                (read, ops)
            }
            (StageKind::Map { ops }, TaskInput::Batches(batches)) => (batches, ops),
            _ => {
                return Err(Error::Invalid(format!(
                    "stage {} cannot run this input",
                    self.name
                )));
            }
        };
        for ((index, op), counter) in ops.iter().zip(counters) {
            stream = counted(apply(op, *index, stream, env)?, counter);
        }
        Ok(stream)
    }

    fn in_executor(name: String, kind: StageKind) -> Self {
        Self {
            name,
            kind,
            options: Resources::cpu(0.0).into(),
            op_names: Vec::new(),
            counters: Vec::new(),
            cut: None,
        }
    }

    /// Rows, bytes, own time and reported metrics of each fused operator so far.
    pub fn op_stats(&self) -> Vec<crate::stats::OpStats> {
        let mut stats = self.counted_op_stats();
        let ops = match &self.kind {
            StageKind::Source { ops, .. } => &ops[..],
            StageKind::Map { ops } => &ops[..],
            _ => &[],
        };
        // The source (when there is one) comes first in the counters.
        let skip = stats.len() - ops.len();
        for (stat, (_, op)) in stats.iter_mut().skip(skip).zip(ops) {
            if let OpKind::MapBatches(udf) = &op.kind {
                stat.metrics = udf.metrics();
            }
        }
        stats
    }

    fn counted_op_stats(&self) -> Vec<crate::stats::OpStats> {
        let mut before = std::time::Duration::ZERO;
        self.op_names
            .iter()
            .zip(&self.counters)
            .map(|(name, counter)| {
                let (rows, bytes, inclusive) = counter.read();
                let busy = inclusive.saturating_sub(before);
                before = inclusive;
                crate::stats::OpStats {
                    name: name.clone(),
                    rows,
                    bytes,
                    busy,
                    metrics: Vec::new(),
                }
            })
            .collect()
    }

    /// The stateful operators of this stage.
    pub fn stateful_ops(&self) -> Vec<(usize, OpSpec)> {
        match &self.kind {
            StageKind::Source { ops, .. } | StageKind::Map { ops } => ops
                .iter()
                .filter(|(_, op)| op.is_stateful())
                .cloned()
                .collect(),
            _ => Vec::new(),
        }
    }

    /// True when this stage reduces a sort or a join, whose tasks may write
    /// scratch files (see [`crate::exchange::scratch::Scratch`]).
    pub fn writes_scratch(&self) -> bool {
        use crate::exchange::Reduce::{Join, Sort};
        match &self.kind {
            StageKind::Map { ops } => ops
                .iter()
                .any(|(_, op)| matches!(op.kind, OpKind::Reduce(Sort { .. } | Join(_)))),
            _ => false,
        }
    }

    /// True when tasks of this stage run on workers (limit and repartition
    /// run inside the executor).
    pub fn runs_tasks(&self) -> bool {
        matches!(self.kind, StageKind::Source { .. } | StageKind::Map { .. })
    }
}

/// The most bytes of a partition in a plan with an exchange, in a store of
/// `capacity` bytes: `target`, or a sixteenth of the store if that is less.
/// An exchange larger than the store spills every map output and reads
/// them back, and its tasks' copies on the heap grow with the partition (a
/// map task holds its input gathered and cut by destination, a reducer its
/// range, its keys and a row group being written): partitions of a
/// sixteenth keep the copies of two tasks per core within the store's size.
pub fn exchange_target(target: u64, capacity: u64) -> u64 {
    target.min(capacity / 16).max(1)
}

/// A physical plan: stages from source to sink.
#[derive(Clone)]
pub struct ExecPlan {
    /// The stages in order; stage 0 is the source.
    pub stages: Vec<Stage>,
}

impl ExecPlan {
    /// Partition size and each stage's memory reserve in a store of
    /// `capacity` bytes: partitions of at most `target` bytes, small enough
    /// that every stage that runs tasks has one partition reserved and the
    /// reserves take at most half the store, and in a plan with an
    /// exchange at most [`exchange_target`].
    pub fn sizing(&self, target: u64, capacity: u64) -> (u64, Vec<u64>) {
        let task_stages = self.stages.iter().filter(|s| s.runs_tasks()).count().max(1) as u64;
        let mut target_bytes = target.min(capacity / (2 * task_stages));
        if self.stages.iter().any(|s| s.cut.is_some()) {
            target_bytes = target_bytes.min(exchange_target(target, capacity));
        }
        let target_bytes = target_bytes.max(1);
        let reserve = self
            .stages
            .iter()
            .map(|s| if s.runs_tasks() { target_bytes } else { 0 })
            .collect();
        (target_bytes, reserve)
    }

    /// Fuses the logical chain into stages: consecutive operators with equal
    /// resources run in one task (a stage has at most one worker pool).
    pub fn from_ops(ops: Vec<LogicalOp>) -> Result<Self> {
        let mut stages: Vec<Stage> = Vec::new();
        for (index, op) in ops.into_iter().enumerate() {
            match op {
                LogicalOp::Source { name, splits, .. } => stages.push(Stage {
                    name: name.clone(),
                    kind: StageKind::Source {
                        splits,
                        ops: Vec::new(),
                    },
                    options: Resources::cpu(1.0).into(),
                    op_names: vec![name],
                    counters: vec![Default::default()],
                    cut: None,
                }),
                LogicalOp::Op(op) => {
                    let fusable = stages.last().is_some_and(|s| {
                        s.runs_tasks()
                            && !s.options.no_fuse
                            && !op.options.no_fuse
                            && s.options.resources == op.options.resources
                            && !(s.options.pool.is_some() && op.options.pool.is_some())
                    });
                    if fusable {
                        let stage = stages.last_mut().expect("checked above");
                        stage.name = format!("{}->{}", stage.name, op.name);
                        stage.options.pool = stage.options.pool.or(op.options.pool);
                        stage.op_names.push(op.name.clone());
                        stage.counters.push(Default::default());
                        match &mut stage.kind {
                            StageKind::Source { ops, .. } | StageKind::Map { ops } => {
                                ops.push((index, op))
                            }
                            _ => unreachable!("runs_tasks() checked"),
                        }
                    } else {
                        let options = StageOptions {
                            batch_rows: None,
                            ..op.options
                        };
                        stages.push(Stage {
                            name: op.name.clone(),
                            op_names: vec![op.name.clone()],
                            counters: vec![Default::default()],
                            kind: StageKind::Map {
                                ops: vec![(index, op)],
                            },
                            options,
                            cut: None,
                        });
                    }
                }
                LogicalOp::Limit(n) => stages.push(Stage::in_executor(
                    format!("limit({n})"),
                    StageKind::Limit(n),
                )),
                LogicalOp::Repartition(n) => stages.push(Stage::in_executor(
                    format!("repartition({n})"),
                    StageKind::Repartition(n.max(1)),
                )),
                LogicalOp::Exchange(exchange) => push_exchange(&mut stages, index, exchange),
            }
        }
        if stages
            .first()
            .is_none_or(|s| !matches!(s.kind, StageKind::Source { .. }))
        {
            return Err(Error::Invalid("a plan must start with a source".into()));
        }
        // A repartition's groups are joined into partitions by a task.
        if matches!(
            stages.last().map(|s| &s.kind),
            Some(StageKind::Repartition(_))
        ) {
            stages.push(Stage {
                name: "concat".into(),
                kind: StageKind::Map { ops: Vec::new() },
                options: Resources::cpu(1.0).into(),
                op_names: Vec::new(),
                counters: Vec::new(),
                cut: None,
            });
        }
        Ok(Self { stages })
    }

    /// True when some stage writes files.
    pub fn writes(&self) -> bool {
        self.stages.iter().any(|s| match &s.kind {
            StageKind::Source { ops, .. } | StageKind::Map { ops } => ops
                .iter()
                .any(|(_, op)| matches!(op.kind, OpKind::WriteFiles(_))),
            _ => false,
        })
    }
}

/// The three stages of an exchange: the map side (the last stage, when it
/// runs tasks and cuts nothing yet, else a task passing its input on), the
/// exchange, and the reducers (which later operators may fuse into).
fn push_exchange(stages: &mut Vec<Stage>, index: usize, exchange: crate::exchange::Exchange) {
    let n = exchange.partitions.max(1);
    let name = exchange.reduce.name();
    let map_side = stages.last().is_some_and(|s| {
        s.runs_tasks()
            && s.cut.is_none()
            && (exchange.partial.is_none()
                || (!s.options.no_fuse && s.options.resources == Resources::cpu(1.0)))
    });
    if !map_side {
        stages.push(Stage {
            name: format!("{name}.map"),
            kind: StageKind::Map { ops: Vec::new() },
            options: Resources::cpu(1.0).into(),
            op_names: Vec::new(),
            counters: Vec::new(),
            cut: None,
        });
    }
    let last = stages.last_mut().expect("pushed above");
    if let Some(partial) = exchange.partial {
        let name = partial.name().to_string();
        last.name = match last.op_names.is_empty() {
            true => name.clone(),
            false => format!("{}->{name}", last.name),
        };
        last.op_names.push(name.clone());
        last.counters.push(Default::default());
        let op = OpSpec {
            name,
            kind: OpKind::Reduce(partial),
            options: Resources::cpu(1.0).into(),
        };
        match &mut last.kind {
            StageKind::Source { ops, .. } | StageKind::Map { ops } => ops.push((index, op)),
            _ => unreachable!("the map side runs tasks"),
        }
    }
    last.cut = Some((exchange.cut, n));
    stages.push(Stage::in_executor(
        format!("exchange({n})"),
        StageKind::Exchange(n),
    ));
    let resources = exchange.reduce_resources.unwrap_or(Resources::cpu(1.0));
    let reduce = OpSpec {
        name: name.to_string(),
        kind: OpKind::Reduce(exchange.reduce),
        options: resources.into(),
    };
    stages.push(Stage {
        name: name.to_string(),
        kind: StageKind::Map {
            ops: vec![(index, reduce)],
        },
        options: resources.into(),
        op_names: vec![name.to_string()],
        counters: vec![Default::default()],
        cut: None,
    });
}
