//! What a trainer reads from a dataset: batches of a given size, collated
//! and prefetched (`batching`), a local shuffle window (`shuffle_window`),
//! and one running job shared by several consumers, epoch after epoch
//! (`split`).
//!
//! The top floor: it consumes a [`Dataset`](crate::Dataset) and imports
//! any floor below.

pub(crate) mod batching;
pub(crate) mod shuffle_window;
pub(crate) mod split;
