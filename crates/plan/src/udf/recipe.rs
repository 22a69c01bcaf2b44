//! Operators that can run on other nodes. A closure cannot travel between
//! processes, so an operator that should run on a cluster is made from a
//! [`Registry`] by name: its [`Recipe`] (the name and its parameters as
//! bytes) travels inside the plan, and each node rebuilds the operator from
//! its own registry. A program serves as driver and node with the same
//! registry (`streambatch::main`), so both sides agree on every name.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::udf::{BatchFn, BatchUdf, Recipe, UdfError};

/// Makes a batch operator from its parameters.
pub type UdfFactory =
    Arc<dyn Fn(&[u8]) -> std::result::Result<Arc<dyn BatchUdf>, UdfError> + Send + Sync>;

/// Batch operators by name.
///
/// ```
/// use arrow_array::RecordBatch;
/// use streambatch_plan::{BatchUdf, Registry, UdfError};
///
/// let mut registry = Registry::default();
/// registry.register("identity", |_params| {
///     Ok(|b: RecordBatch| Ok::<_, UdfError>(b))
/// });
/// let op = registry.udf("identity", b"").unwrap();
/// assert_eq!(op.recipe().unwrap().name, "identity");
/// assert!(registry.udf("missing", b"").is_err());
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    factories: BTreeMap<String, UdfFactory>,
}

impl Registry {
    /// Registers `factory` under `name` (replacing any earlier one).
    pub fn register<F, U>(&mut self, name: &str, factory: F) -> &mut Self
    where
        F: Fn(&[u8]) -> std::result::Result<U, UdfError> + Send + Sync + 'static,
        U: BatchUdf,
    {
        let factory: UdfFactory = Arc::new(move |params| Ok(Arc::new(factory(params)?)));
        self.factories.insert(name.to_string(), factory);
        self
    }

    /// Adds every operator of `other`.
    pub fn extend(&mut self, other: &Registry) -> &mut Self {
        for (name, factory) in &other.factories {
            self.factories.insert(name.clone(), factory.clone());
        }
        self
    }

    /// The registered names.
    pub fn names(&self) -> Vec<String> {
        self.factories.keys().cloned().collect()
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.factories.contains_key(name)
    }

    /// The operator `name` made with `params`, carrying its recipe so that
    /// it can run on any node that registered the same name.
    pub fn udf(&self, name: &str, params: &[u8]) -> Result<Named> {
        let factory = self.factories.get(name).ok_or_else(|| {
            Error::Invalid(format!(
                "no operator `{name}` is registered (registered: {})",
                self.names().join(", ")
            ))
        })?;
        let inner = factory(params).map_err(|source| Error::Udf {
            operator: name.to_string(),
            source,
        })?;
        Ok(Named {
            inner,
            recipe: Recipe {
                name: name.to_string(),
                params: params.to_vec(),
                blobs: Vec::new(),
            },
        })
    }

    /// Rebuilds an operator from its recipe (its blobs, where it names
    /// any, already held by this process: see [`Blob`](crate::Blob)).
    pub fn rebuild(&self, recipe: &Recipe) -> Result<Named> {
        let mut named = self.udf(&recipe.name, &recipe.params)?;
        named.recipe.blobs = recipe.blobs.clone();
        Ok(named)
    }
}

/// A registered operator with its recipe.
#[derive(Clone)]
pub struct Named {
    inner: Arc<dyn BatchUdf>,
    recipe: Recipe,
}

impl BatchUdf for Named {
    fn name(&self) -> String {
        self.recipe.name.clone()
    }
    fn is_stateful(&self) -> bool {
        self.inner.is_stateful()
    }
    fn instantiate(&self) -> std::result::Result<Box<dyn BatchFn>, UdfError> {
        self.inner.instantiate()
    }
    fn instantiate_for(
        &self,
        resources: &streambatch_core::Resources,
    ) -> std::result::Result<Box<dyn BatchFn>, UdfError> {
        self.inner.instantiate_for(resources)
    }
    fn describe(&self) -> Vec<String> {
        self.inner.describe()
    }
    fn metrics(&self) -> Vec<(String, String)> {
        self.inner.metrics()
    }
    fn recipe(&self) -> Option<Recipe> {
        Some(self.recipe.clone())
    }
}
