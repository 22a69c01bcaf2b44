/// Errors of GPU operators; each names the kernel or the adapter.
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
        "no GPU adapter found{choice}: install a Vulkan driver (lavapipe: mesa-vulkan-drivers) or run the stage on the CPU"
    )]
    NoAdapter {
        /// The node's adapter choice, if any.
        choice: String,
    },
    /// The device failed.
    #[error("GPU device {device}: {message}")]
    Device {
        /// The adapter's name.
        device: String,
        /// What failed.
        message: String,
    },
}
