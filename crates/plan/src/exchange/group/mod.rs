//! A group-by's reducer: aggregates over groups of equal keys
//! (`aggregate`), with short string keys packed into one integer a row
//! (`packed_keys`).

pub(crate) mod aggregate;
pub(crate) mod packed_keys;
