//! What a user writes into a plan: the user-function traits (batch
//! functions for `map_batches`, row functions for `map` and `flat_map`,
//! predicates for `filter`), expressions (`expr`), rows (`row`), and the
//! recipes that rebuild a function on another node (`recipe`) with the
//! bytes they refer to by hash (`blob`).
//!
//! The bottom floor of the crate: it imports nothing of it but `error`.

use std::sync::Arc;

use arrow_array::RecordBatch;

pub(crate) mod blob;
pub(crate) mod expr;
pub(crate) mod recipe;
pub(crate) mod row;

use expr::Expr;
use row::Row;

/// A stream of batches: what sources yield and operators transform.
pub type BatchIter = Box<dyn Iterator<Item = crate::error::Result<RecordBatch>> + Send>;

/// The error a user function returns; any error type converts into it.
pub type UdfError = Box<dyn std::error::Error + Send + Sync>;

/// One instance of a batch operator, owned by one worker at a time. A
/// stateful operator keeps what its set-up loaded (a model) in `self`.
pub trait BatchFn: Send {
    /// Transforms one batch.
    fn call(&mut self, batch: RecordBatch) -> Result<RecordBatch, UdfError>;

    /// Transforms one batch into any number of batches, each with buffers
    /// of its own (an operator that makes large rows one at a time gives
    /// each its own buffer). Defaults to [`BatchFn::call`].
    fn call_many(&mut self, batch: RecordBatch) -> Result<Vec<RecordBatch>, UdfError> {
        Ok(vec![self.call(batch)?])
    }
}

impl<F> BatchFn for F
where
    F: FnMut(RecordBatch) -> Result<RecordBatch, UdfError> + Send,
{
    fn call(&mut self, batch: RecordBatch) -> Result<RecordBatch, UdfError> {
        self(batch)
    }
}

/// How a node rebuilds an operator: a registered name and its parameters
/// (see [`Registry`](crate::Registry)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recipe {
    /// The name the operator is registered under.
    pub name: String,
    /// Its parameters, as the factory reads them.
    pub params: Vec<u8>,
    /// The SHA-256s of the [`Blob`](crate::Blob)s the parameters refer
    /// to: on a cluster the driver sends each to every node, which holds
    /// them while it rebuilds the operator.
    pub blobs: Vec<String>,
}

/// What `map_batches` accepts: a recipe for [`BatchFn`] instances.
///
/// A plain closure is stateless: each task gets its own copy. A [`Stateful`]
/// operator runs its set-up once per worker, and its instances live in a pool
/// of long-lived workers.
pub trait BatchUdf: Send + Sync + 'static {
    /// The name shown in stats and errors.
    fn name(&self) -> String {
        "map_batches".into()
    }
    /// True when instances are expensive to make and are kept per worker.
    fn is_stateful(&self) -> bool {
        false
    }
    /// Makes one instance (for a stateful operator: runs its set-up).
    fn instantiate(&self) -> Result<Box<dyn BatchFn>, UdfError>;

    /// Makes one instance for a worker whose tasks each hold `resources`:
    /// an operator that computes on threads of its own (a model's engine)
    /// starts `resources.cpus` of them, so that it and the stages beside
    /// it share the cores as the scheduler placed them. Defaults to
    /// [`BatchUdf::instantiate`].
    fn instantiate_for(
        &self,
        resources: &streambatch_core::Resources,
    ) -> Result<Box<dyn BatchFn>, UdfError> {
        let _ = resources;
        self.instantiate()
    }

    /// Lines `explain()` shows under the operator (a model's inputs,
    /// outputs and opset), known before the job runs.
    fn describe(&self) -> Vec<String> {
        Vec::new()
    }
    /// Figures the operator reports in stats (a GPU kernel: its device and
    /// its time split into upload, compute and readback).
    fn metrics(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// How another node rebuilds this operator; `None` (a closure) means it
    /// runs only in this process. See [`Registry`](crate::udf::recipe::Registry).
    fn recipe(&self) -> Option<Recipe> {
        None
    }
}

impl<F, E> BatchUdf for F
where
    F: Fn(RecordBatch) -> Result<RecordBatch, E> + Clone + Send + Sync + 'static,
    E: Into<UdfError>,
{
    fn instantiate(&self) -> Result<Box<dyn BatchFn>, UdfError> {
        let f = self.clone();
        Ok(Box::new(move |batch| f(batch).map_err(Into::into)))
    }
}

/// A stateful batch operator: `setup` runs once per worker (to load a model,
/// open a device), and the instance it returns handles every batch that
/// worker receives.
///
/// ```
/// use arrow_array::RecordBatch;
/// use streambatch_plan::{BatchFn, BatchUdf, Stateful, UdfError};
///
/// struct AddBias { bias: f64 }
/// impl BatchFn for AddBias {
///     fn call(&mut self, batch: RecordBatch) -> Result<RecordBatch, UdfError> { Ok(batch) }
/// }
/// let op = Stateful::new("add_bias", || Ok::<_, UdfError>(AddBias { bias: 0.5 }));
/// assert!(op.is_stateful());
/// ```
pub struct Stateful<S> {
    name: String,
    setup: Arc<S>,
}

impl<S, T, E> Stateful<S>
where
    S: Fn() -> Result<T, E> + Send + Sync + 'static,
    T: BatchFn + 'static,
    E: Into<UdfError>,
{
    /// An operator named `name` whose workers each run `setup` once.
    pub fn new(name: &str, setup: S) -> Self {
        Self {
            name: name.to_string(),
            setup: Arc::new(setup),
        }
    }
}

impl<S, T, E> BatchUdf for Stateful<S>
where
    S: Fn() -> Result<T, E> + Send + Sync + 'static,
    T: BatchFn + 'static,
    E: Into<UdfError>,
{
    fn name(&self) -> String {
        self.name.clone()
    }
    fn is_stateful(&self) -> bool {
        true
    }
    fn instantiate(&self) -> Result<Box<dyn BatchFn>, UdfError> {
        Ok(Box::new((self.setup)().map_err(Into::into)?))
    }
}

/// A row-to-row function (`map`).
pub type RowMapFn = Arc<dyn Fn(Row) -> Result<Row, UdfError> + Send + Sync>;
/// A row-to-rows function (`flat_map`).
pub type RowFlatMapFn = Arc<dyn Fn(Row) -> Result<Vec<Row>, UdfError> + Send + Sync>;

/// A batch-to-batches generator (`flat_map_batches`): its output is pulled
/// one batch at a time, so a large expansion never sits in memory whole.
pub type BatchGeneratorFn = Arc<
    dyn Fn(RecordBatch) -> Box<dyn Iterator<Item = Result<RecordBatch, UdfError>> + Send>
        + Send
        + Sync,
>;

/// A `filter` condition: an Arrow expression (evaluated per batch) or a
/// closure over rows.
#[derive(Clone)]
pub enum Predicate {
    /// Rows where the expression is true.
    Expr(Expr),
    /// Rows for which the closure returns true.
    Rows(Arc<dyn Fn(&Row) -> bool + Send + Sync>),
}

impl From<Expr> for Predicate {
    fn from(e: Expr) -> Self {
        Predicate::Expr(e)
    }
}

impl<F> From<F> for Predicate
where
    F: Fn(&Row) -> bool + Send + Sync + 'static,
{
    fn from(f: F) -> Self {
        Predicate::Rows(Arc::new(f))
    }
}
