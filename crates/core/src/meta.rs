//! [`PartitionMeta`]: what the executor knows of a stored partition without
//! reading it (its id, rows, bytes, schema and the node that holds it).

use arrow_schema::SchemaRef;

use crate::{NodeId, PartitionId};

/// What the executor knows of a partition without reading it.
#[derive(Clone, Debug)]
pub struct PartitionMeta {
    /// The partition's id in the store that holds it.
    pub id: PartitionId,
    /// Number of rows.
    pub rows: usize,
    /// Bytes the partition occupies in the store.
    pub bytes: u64,
    /// The Arrow schema of its rows.
    pub schema: SchemaRef,
    /// The node whose store holds it.
    pub location: NodeId,
}
