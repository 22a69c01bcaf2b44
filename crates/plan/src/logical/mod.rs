//! The logical plan and its physical form: the chain of operators a
//! [`Dataset`](crate::Dataset) builds (`plan`), each operator's kind and how
//! a task applies it (`ops`), what a source task reads (`source`: the
//! split of every format, and the sides of a union or join, `side`), and a
//! plan described before it runs (`explain`).
//!
//! This is the dispatcher: it names every family of the floors below it
//! (`read`, `exchange`, `sink`, `stats`, `udf`, `object`) and is named
//! by `dataset` and `train` above it.

pub(crate) mod explain;
pub mod ops;
pub(crate) mod plan;
pub(crate) mod side;
pub(crate) mod source;
