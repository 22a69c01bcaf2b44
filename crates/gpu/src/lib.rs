//! GPU operators for streambatch through wgpu, so that a GPU of any vendor
//! (or Mesa's software Vulkan, lavapipe, in CI) can take part.
//!
//! - [`GpuPool`]: the adapters this process can use; each is one GPU slot,
//!   named by adapter and backend.
//! - [`GpuKernel`]: a WGSL compute shader usable wherever `map_batches`
//!   takes an operator. Its storage bindings are matched to Arrow columns by
//!   name: read-only arrays are inputs (f32, i32, u32 columns, or fixed-size
//!   lists of f32), read-write arrays are output columns, a uniform carries
//!   parameters (and the row count in a member named `rows`). A kernel that
//!   does not compile is an error naming the kernel and the line.
//!
//! ```
//! use streambatch_gpu::GpuKernel;
//! let err = GpuKernel::from_wgsl("broken", "fn main( {").unwrap_err();
//! assert!(err.to_string().contains("broken") && err.to_string().contains("line 1"));
//! ```

mod columns;
mod error;
mod instance;
mod kernel;
mod pool;
mod spec;

pub use error::{DeviceFailure, GpuError};
pub use kernel::GpuKernel;
pub use pool::{AdapterChoice, GpuDevice, GpuPool};
pub use spec::KernelTimings;
