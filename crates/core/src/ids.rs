//! The typed ids of partitions, nodes, tasks, stages and jobs: newtypes over
//! integers, each displayed with its own prefix (`p7`, `node-2`, `t12`,
//! `stage-1`, `job-3`).

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id_type!(
    /// A partition in an object store; unique within one store.
    PartitionId(u64),
    "p"
);
id_type!(
    /// A node (one OS process) of a cluster.
    NodeId(u32),
    "node-"
);
id_type!(
    /// One task of a job: a fused operator chain over one input.
    TaskId(u64),
    "t"
);
id_type!(
    /// The position of a stage in a job's physical plan.
    StageId(usize),
    "stage-"
);
id_type!(
    /// A job: one consuming call on a dataset; unique within its cluster.
    JobId(u64),
    "job-"
);
