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
//! ## Backends
//!
//! The pool asks wgpu for every backend compiled in
//! ([`compiled_backends`]):
//!
//! | platform | backends |
//! |---|---|
//! | Linux, Android | Vulkan; GL with the `gl` feature |
//! | Windows | Vulkan, DX12, GL |
//! | macOS, iOS | Metal |
//!
//! GL on Linux is opt-in (the `gl` feature), not default: every current
//! Linux GPU driver (Mesa's for AMD and Intel, NVIDIA's) and Mesa's software
//! lavapipe speak Vulkan, so GL would only serve old GPUs, and it adds EGL
//! and glow to every build. GL's compute support is also the weakest
//! (no storage buffers before GLES 3.1). On Windows, GL is the fallback for
//! GPUs whose drivers offer neither DX12 nor Vulkan, so it is always in.
//! A GPU reachable through several backends gives one slot, on the first
//! backend of [`BACKEND_PREFERENCE`] with an adapter; an [`AdapterChoice`]
//! with a backend picks another.
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
pub use pool::{AdapterChoice, BACKEND_PREFERENCE, GpuDevice, GpuPool, compiled_backends};
pub use spec::KernelTimings;
