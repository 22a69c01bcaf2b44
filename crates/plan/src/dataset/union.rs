//! `union` and the two inputs of a join: datasets read side by side by one
//! source stage. Each input is a *side*, a pipeline of a source and
//! row-wise operators; the union's source stage holds every side's splits,
//! each wrapped with its side ([`SourceSplit::Side`]), and a task over a
//! split reads it and runs its side's operators before the stage's own.
//!
//! So a union (and a join's two inputs) needs no stage with two inputs:
//! the physical plan stays a chain. The price is that a side must fuse
//! into a source task: an input that ends in a limit, a repartition or an
//! all-to-all operator, or whose operators need other resources than a
//! source task's (a GPU, a pool of actors), is refused, naming the
//! operator, and can be written out and read back first.

use std::sync::Arc;

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::logical::plan::LogicalOp;
use crate::logical::side::{Side, check_op, not_a_side};
use crate::logical::source::SourceSplit;

impl Dataset {
    /// The rows of this dataset and of each of `others`, in no particular
    /// order (a task reads a split of one of them). Each dataset must be
    /// a source and row-wise operators that a source task can run (see
    /// the module's documentation); operators after the union run on the
    /// rows of all. Schemas may differ; a later operator sees each input's
    /// batches as they are.
    ///
    /// ```
    /// # use streambatch_plan::Dataset;
    /// # fn both(a: &Dataset, b: &Dataset) -> streambatch_plan::Result<Dataset> {
    /// a.union(&[b])
    /// # }
    /// ```
    pub fn union(&self, others: &[&Dataset]) -> Result<Dataset> {
        let mut inputs = vec![self];
        inputs.extend_from_slice(others);
        let tags = vec![None; inputs.len()];
        let schema = same_schema(&inputs);
        self.read_sides(&inputs, &tags, "union", schema)
    }

    /// One source stage reading `inputs` side by side, each tagged as
    /// `tags` says, named `name`.
    pub(crate) fn read_sides(
        &self,
        inputs: &[&Dataset],
        tags: &[Option<u8>],
        name: &str,
        schema: Option<arrow_schema::SchemaRef>,
    ) -> Result<Dataset> {
        let mut all = Vec::new();
        let mut names = Vec::new();
        for (input, tag) in inputs.iter().zip(tags) {
            if !Arc::ptr_eq(input.runner(), self.runner()) {
                return Err(Error::Invalid(format!(
                    "{name}: every input must come from the same context"
                )));
            }
            let (splits, side_name) = side_splits(input, *tag, name)?;
            all.extend(splits);
            names.push(side_name);
        }
        Ok(self.with_source(&format!("{name}({})", names.join(", ")), all, schema))
    }
}

/// The schema of `inputs` when every one is known without running and all
/// are equal.
fn same_schema(inputs: &[&Dataset]) -> Option<arrow_schema::SchemaRef> {
    let first = inputs.first()?.known_schema()?;
    inputs[1..]
        .iter()
        .all(|d| d.known_schema().is_some_and(|s| s == first))
        .then_some(first)
}

/// `input`'s source splits, each wrapped with `input`'s operators and
/// `tag`, and a name for the side; or an error naming what cannot run in a
/// source task.
fn side_splits(input: &Dataset, tag: Option<u8>, what: &str) -> Result<(Vec<SourceSplit>, String)> {
    let mut chain = input.plan.chain().into_iter().enumerate();
    let Some((_, LogicalOp::Source { name, splits, .. })) = chain.next() else {
        return Err(Error::Invalid(format!("{what}: an input has no source")));
    };
    let mut ops = Vec::new();
    let mut names = vec![name];
    for (index, op) in chain {
        let op = match op {
            LogicalOp::Op(op) => op,
            LogicalOp::Limit(_) => return Err(not_a_side(what, "limit", "it is not row-wise")),
            LogicalOp::Repartition(_) => {
                return Err(not_a_side(what, "repartition", "it is not row-wise"));
            }
            LogicalOp::Exchange(exchange) => {
                return Err(not_a_side(what, exchange.reduce.name(), "it is all-to-all"));
            }
            LogicalOp::Source { .. } => unreachable!("a chain has one source, first"),
        };
        check_op(&op, what)?;
        names.push(op.name.clone());
        ops.push((index, op));
    }
    // One side for the input's plain splits, and one for each side of a
    // union it reads (its operators first, then these), shared by their
    // splits so that a plan carries each once.
    let plain = Arc::new(Side {
        ops: ops.clone(),
        tag,
    });
    let mut nested: Vec<(Arc<Side>, Arc<Side>)> = Vec::new();
    let splits = splits
        .into_iter()
        .map(|split| match split {
            SourceSplit::Side { inner, side } => {
                let found = nested.iter().find(|(old, _)| Arc::ptr_eq(old, &side));
                let side = match found {
                    Some((_, new)) => new.clone(),
                    None => {
                        let mut all = side.ops.clone();
                        all.extend(ops.iter().cloned());
                        let new = Arc::new(Side { ops: all, tag });
                        nested.push((side, new.clone()));
                        new
                    }
                };
                SourceSplit::Side { inner, side }
            }
            split => SourceSplit::Side {
                inner: Arc::new(split),
                side: plain.clone(),
            },
        })
        .collect();
    Ok((splits, names.join("->")))
}
