//! The errors of GPU operators ([`GpuError`]) and what the device reported
//! when a kernel failed on it ([`DeviceFailure`]).

/// Errors of GPU operators; each names the kernel or the adapter, and keeps
/// wgpu's or Arrow's error as its [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The WGSL source does not compile.
    #[error("kernel `{kernel}` does not compile: line {line}, column {column}: {message}")]
    Compile {
        /// The kernel.
        kernel: String,
        /// 1-based line of the first error.
        line: u32,
        /// 1-based column.
        column: u32,
        /// The compiler's message.
        message: String,
    },
    /// The kernel's bindings do not match what it is given.
    #[error("kernel `{kernel}`: {message}")]
    Binding {
        /// The kernel.
        kernel: String,
        /// What does not match.
        message: String,
    },
    /// No GPU adapter is available (or none matches the node's choice).
    #[error(
        "no GPU adapter found{choice} with the backends built in ({backends}): install a GPU driver \
         (on Linux without a GPU, lavapipe: mesa-vulkan-drivers) or run the stage on the CPU"
    )]
    NoAdapter {
        /// The node's adapter choice, if any.
        choice: String,
        /// The wgpu backends this build can use, e.g. "Vulkan".
        backends: String,
    },
    /// The adapter could not be opened as a device.
    #[error("GPU device {device} could not be opened")]
    Device {
        /// The adapter's label, "name (backend)".
        device: String,
        /// wgpu's error (boxed: it is large, and errors travel in `Result`s).
        #[source]
        source: Box<wgpu::RequestDeviceError>,
    },
    /// The device failed while a kernel ran on it.
    #[error("kernel `{kernel}` on GPU device {device}: {step} failed")]
    Run {
        /// The kernel.
        kernel: String,
        /// The adapter's label, "name (backend)".
        device: String,
        /// What the kernel was doing: "opening the device", "uploading
        /// the inputs", "running the shader", "reading back the outputs".
        step: &'static str,
        /// What the device reported.
        #[source]
        source: DeviceFailure,
    },
    /// The kernel's outputs do not form a batch with the columns it keeps.
    #[error("kernel `{kernel}`: its outputs do not form a batch")]
    Output {
        /// The kernel.
        kernel: String,
        /// Arrow's error.
        #[source]
        source: arrow_schema::ArrowError,
    },
}

/// What the device reported when a kernel failed on it: wgpu's own error
/// types, kept so that callers can inspect them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceFailure {
    /// The adapter would not open as a device.
    #[error(transparent)]
    Open(Box<wgpu::RequestDeviceError>),
    /// Waiting for submitted work failed.
    #[error(transparent)]
    Poll(#[from] wgpu::PollError),
    /// Mapping the readback buffer failed.
    #[error(transparent)]
    Map(#[from] wgpu::BufferAsyncError),
    /// The mapped range could not be viewed.
    #[error(transparent)]
    MapRange(#[from] wgpu::MapRangeError),
    /// wgpu dropped the mapping callback without calling it.
    #[error("the buffer mapping was dropped without an answer")]
    MapDropped,
}

impl From<wgpu::RequestDeviceError> for DeviceFailure {
    fn from(e: wgpu::RequestDeviceError) -> Self {
        Self::Open(Box::new(e))
    }
}
