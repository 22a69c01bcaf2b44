//! The benchmark workloads of `docs/workloads.md` (W1 to W7, the store
//! and network benchmarks, the binary-files benchmark), their checks and the JSON line they print: what
//! `streambatch bench` runs, and what the examples and tests use to make
//! and check the main job's data. Not published: benchmarks stay out of the
//! library users link (`streambatch`), whose built-in operators
//! (`streambatch::ops`) the workloads use.

mod check;
mod files;
pub mod flight_trainer;
mod g1;
mod j1;
mod model_check;
mod net;
mod nodes;
mod result;
mod rows;
mod s1;
mod s3;
mod shaped;
mod skip;
mod store;
mod w4;
mod w5;
mod w6;
mod w7;
mod workloads;

pub use check::{IdSet, checksum, checksum_filled};
pub use files::{FilesApi, FilesExpected, PIECE_BYTES, binary_files, binary_files_input};
pub use g1::{G1_ROWS, g1};
pub use j1::j1;
pub use model_check::check_model_outputs;
pub use net::net_bench;
pub use result::{BenchResult, ProgressLines, peak_rss_mib};
pub use s1::{s1, s1_cluster};
pub use s3::{Fault, FaultProxy, S3Server, Throttle};
pub use shaped::{Shape, registry, w1_pipeline};
pub use skip::{SKIP_LOG, skip_test, under_ci};
pub use store::store_bench;
pub use w4::{
    Device, EmbeddingCheck, W4_IMAGES, check_embeddings, embedding_matches, make_images,
    reference_embedding, reference_embeddings, w4, w4_input, w4_on,
};
pub use w5::{w5, w5_kill_one};
pub use w6::{
    W6A_IMAGES, W6A_STEP_MS, W6A_STORE_CAP, W6B_IMAGES, augmented, make_jpegs, w6_trainer, w6a, w6b,
};
pub use w7::{W7_BATCH_ROWS, W7_IMAGES, W7_STORE_CAP, W7Input, w7, w7_input};
pub use workloads::{W3_WARM_UP, w1, w2, w3};

// Helpers the workload modules share, at the paths they use.
pub(crate) use check::check_ids;
pub(crate) use result::round;
pub(crate) use rows::{Rows, W1_ROW_BYTES, check_rows, filled_rows, taking, w1_byte};
