//! What a compiled kernel is: its bindings and settings, shared by the
//! builder ([`crate::GpuKernel`]) and every worker's instance of it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The element type of a storage array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Element {
    F32,
    I32,
    U32,
}

#[derive(Clone, Debug)]
pub(crate) enum Role {
    /// A batch column or a constant, read-only.
    Input,
    /// An output column, read-write.
    Output,
    /// Parameters; `rows_offset` is where the row count goes.
    Uniform {
        size: usize,
        rows_offset: Option<usize>,
    },
}

#[derive(Clone, Debug)]
pub(crate) struct Binding {
    pub(crate) binding: u32,
    pub(crate) name: String,
    pub(crate) role: Role,
    pub(crate) element: Element,
}

/// Time a kernel spent, summed over its calls on every worker.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KernelTimings {
    /// Batches processed.
    pub calls: u64,
    /// Copying inputs to the device.
    pub upload: Duration,
    /// Running the shader.
    pub compute: Duration,
    /// Copying outputs back.
    pub readback: Duration,
}

/// Workgroups to dispatch for a batch of a given number of rows.
pub(crate) type DispatchFn = dyn Fn(usize) -> [u32; 3] + Send + Sync;

#[derive(Clone)]
pub(crate) struct Spec {
    pub(crate) name: String,
    pub(crate) source: String,
    pub(crate) entry: String,
    pub(crate) workgroup: [u32; 3],
    /// Sorted by binding number.
    pub(crate) bindings: Vec<Binding>,
    pub(crate) widths: HashMap<String, usize>,
    pub(crate) constants: HashMap<String, Arc<Vec<u8>>>,
    pub(crate) params: Vec<u8>,
    pub(crate) dispatch: Option<Arc<DispatchFn>>,
    /// Shared by every instance, so the kernel reports the total.
    pub(crate) timings: Arc<Mutex<KernelTimings>>,
    pub(crate) device_label: Arc<Mutex<Option<String>>>,
}

impl Spec {
    /// Values per row of output `name` (1 unless declared wider).
    pub(crate) fn width(&self, name: &str) -> usize {
        self.widths.get(name).copied().unwrap_or(1)
    }
}
