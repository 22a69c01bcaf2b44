//! A hash join's reducer: the join of a destination's left and right rows
//! (`hash`, also a small right side broadcast into the left's tasks) and
//! the reducer that spills both sides to scratch files by hash when they do
//! not fit (`spill`).

pub(crate) mod hash;
pub(crate) mod spill;
