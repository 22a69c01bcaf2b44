//! An input of a union or a join as a source task runs it: its operators
//! after the read of each of its splits, and for a join its tag (see
//! `union.rs` for why inputs are read this way).

use std::sync::Arc;

use streambatch_core::Resources;

use crate::error::{Error, Result};
use crate::exchange::join::hash::SIDE_TAG;
use crate::logical::ops::{OpKind, OpSpec};

/// What a task over one side's split runs after the read: the side's
/// operators and, for a join, which input the rows are.
#[derive(Clone)]
pub struct Side {
    /// The side's operators, with their positions in its own plan.
    pub ops: Vec<(usize, OpSpec)>,
    /// For a join's inputs, the side's tag (0 left, 1 right), set on every
    /// output batch's schema metadata under [`SIDE_TAG`].
    pub tag: Option<u8>,
}

impl std::fmt::Debug for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ops: Vec<&str> = self.ops.iter().map(|(_, op)| op.name.as_str()).collect();
        f.debug_struct("Side")
            .field("ops", &ops)
            .field("tag", &self.tag)
            .finish()
    }
}

impl Side {
    /// An input of a union or a join running `ops` (each checked as the
    /// union checks its inputs: a plan from a peer is refused, naming the
    /// operator, where it would run one that a source task cannot), tagged
    /// `tag`.
    pub fn new(ops: Vec<(usize, OpSpec)>, tag: Option<u8>) -> Result<Self> {
        for (_, op) in &ops {
            check_op(op, "union")?;
        }
        Ok(Self { ops, tag })
    }

    /// `input`, a split's rows, through the side's operators, tagged.
    pub(crate) fn run(
        &self,
        mut input: crate::udf::BatchIter,
        env: &mut crate::logical::ops::TaskEnv<'_>,
    ) -> Result<crate::udf::BatchIter> {
        for (index, op) in &self.ops {
            input = crate::logical::ops::apply(op, *index, input, env)?;
        }
        let Some(tag) = self.tag else {
            return Ok(input);
        };
        let mut tagged: Option<arrow_schema::SchemaRef> = None;
        Ok(Box::new(input.map(move |batch| {
            let batch = batch?;
            let schema = match &tagged {
                Some(s) if s.fields() == batch.schema().fields() => s.clone(),
                _ => {
                    let mut metadata = batch.schema().metadata().clone();
                    metadata.insert(SIDE_TAG.to_string(), tag.to_string());
                    let s = Arc::new(batch.schema().as_ref().clone().with_metadata(metadata));
                    tagged = Some(s.clone());
                    s
                }
            };
            batch
                .with_schema(schema)
                .map_err(|e| Error::arrow("tagging a join's input", e))
        })))
    }
}

/// Refuses an operator a source task cannot run for an input of `what`.
pub(crate) fn check_op(op: &OpSpec, what: &str) -> Result<()> {
    if op.is_stateful() || op.options.resources != Resources::cpu(1.0) {
        return Err(not_a_side(
            what,
            &op.name,
            "it needs other resources than a source task (one CPU)",
        ));
    }
    if matches!(op.kind, OpKind::WriteFiles(_) | OpKind::Reduce(_)) {
        return Err(not_a_side(what, &op.name, "it writes files or reduces"));
    }
    Ok(())
}

pub(crate) fn not_a_side(what: &str, op: &str, why: &str) -> Error {
    Error::Invalid(format!(
        "{what}: an input's operator `{op}` cannot run in the {what}'s source tasks ({why}); \
         write that input out and read it back, or apply `{op}` after the {what}"
    ))
}
