//! A sort as an exchange: a sample of each map output's keys (`sample`),
//! the ranges every reducer takes, found from the samples (`range`), a map
//! output sorted in chunks (`sorted`) and the reducer that merges its
//! range's runs, spilling them to scratch files when they do not fit
//! (`runs`).

pub mod range;
pub(crate) mod runs;
pub(crate) mod sample;
pub(crate) mod sorted;
