//! The device pool: the adapters this process can use, one GPU slot each.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::GpuError;

/// Which adapters a node uses: all, or those whose name contains `name`
/// and whose backend is `backend` (e.g. "vulkan", "gl").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdapterChoice {
    /// A substring of the adapter's name.
    pub name: Option<String>,
    /// The backend's name, case-insensitive.
    pub backend: Option<String>,
}

impl AdapterChoice {
    fn matches(&self, info: &wgpu::AdapterInfo) -> bool {
        let name_ok = self
            .name
            .as_ref()
            .is_none_or(|n| info.name.contains(n.as_str()));
        let backend_ok = self
            .backend
            .as_ref()
            .is_none_or(|b| format!("{:?}", info.backend).eq_ignore_ascii_case(b));
        name_ok && backend_ok
    }

    fn describe(&self) -> String {
        match (&self.name, &self.backend) {
            (None, None) => String::new(),
            (name, backend) => format!(
                " matching name {:?} and backend {:?}",
                name.as_deref().unwrap_or("*"),
                backend.as_deref().unwrap_or("*")
            ),
        }
    }
}

/// One adapter, opened as a device on first use.
pub struct GpuDevice {
    /// "adapter name (backend)".
    pub label: String,
    /// A software rasterizer (Mesa's lavapipe, llvmpipe) running on the CPU.
    pub software: bool,
    adapter: wgpu::Adapter,
    opened: OnceLock<Result<(wgpu::Device, wgpu::Queue), wgpu::RequestDeviceError>>,
}

impl GpuDevice {
    /// The device and its queue.
    pub fn open(&self) -> Result<(&wgpu::Device, &wgpu::Queue), GpuError> {
        self.open_or_wgpu_error()
            .map_err(|source| GpuError::Device {
                device: self.label.clone(),
                source: Box::new(source),
            })
    }

    /// The device and its queue, or wgpu's error, for callers that name
    /// more (the kernel) in the error they return.
    pub(crate) fn open_or_wgpu_error(
        &self,
    ) -> Result<(&wgpu::Device, &wgpu::Queue), wgpu::RequestDeviceError> {
        // Opened once and kept, failure included: a device that failed to
        // open is not retried by every worker.
        let opened = self.opened.get_or_init(|| {
            let desc = wgpu::DeviceDescriptor {
                label: Some("streambatch"),
                required_limits: self.adapter.limits(),
                ..Default::default()
            };
            pollster::block_on(self.adapter.request_device(&desc))
        });
        match opened {
            Ok((device, queue)) => Ok((device, queue)),
            Err(e) => Err(e.clone()),
        }
    }
}

static GLOBAL: OnceLock<GpuPool> = OnceLock::new();

/// The GPU adapters of this process.
pub struct GpuPool {
    devices: Vec<Arc<GpuDevice>>,
    choice: AdapterChoice,
    next: AtomicUsize,
}

impl GpuPool {
    /// Finds the adapters matching `choice` on the backends this build has
    /// ([`compiled_backends`]). When one GPU shows up on several backends,
    /// only the first backend of [`BACKEND_PREFERENCE`] is used.
    pub fn discover(choice: &AdapterChoice) -> Self {
        let backends = compiled_backends();
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapters = pollster::block_on(instance.enumerate_adapters(backends));
        let matching: Vec<(wgpu::Adapter, wgpu::AdapterInfo)> = adapters
            .into_iter()
            .map(|adapter| {
                let info = adapter.get_info();
                (adapter, info)
            })
            .filter(|(_, info)| choice.matches(info))
            .collect();
        let chosen = preferred_backend(matching.iter().map(|(_, info)| info.backend));
        let devices = matching
            .into_iter()
            .filter(|(_, info)| Some(info.backend) == chosen)
            .map(|(adapter, info)| {
                Arc::new(GpuDevice {
                    label: format!("{} ({:?})", info.name, info.backend),
                    software: info.device_type == wgpu::DeviceType::Cpu,
                    adapter,
                    opened: OnceLock::new(),
                })
            })
            .collect();
        Self {
            devices,
            choice: choice.clone(),
            next: AtomicUsize::new(0),
        }
    }

    /// The process-wide pool, discovered once: with the first choice given
    /// to [`GpuPool::init`], or all adapters.
    pub fn global() -> &'static GpuPool {
        Self::init(&AdapterChoice::default())
    }

    /// The process-wide pool, discovering it with `choice` if this is the
    /// first use. A later, different choice is ignored with a warning: one
    /// process drives its adapters one way.
    pub fn init(choice: &AdapterChoice) -> &'static GpuPool {
        let pool = GLOBAL.get_or_init(|| GpuPool::discover(choice));
        if &pool.choice != choice && choice != &AdapterChoice::default() {
            tracing::warn!(?choice, kept = ?pool.choice, "the GPU pool was already set up; keeping its adapter choice");
        }
        pool
    }

    /// The labels ("name (backend)") of the adapters kernels run on: the
    /// hardware ones where there are any, else the software ones.
    pub fn labels(&self) -> Vec<String> {
        self.usable().map(|d| d.label.clone()).collect()
    }

    /// The adapters kernels run on: a software rasterizer only where no
    /// hardware adapter exists (it is thousands of times slower, so a
    /// kernel instance on it would hold back a job a GPU would finish).
    fn usable(&self) -> impl Iterator<Item = &Arc<GpuDevice>> {
        let hardware = self.has_hardware();
        self.devices
            .iter()
            .filter(move |d| !(hardware && d.software))
    }

    /// Whether some adapter is a real GPU, not a software rasterizer.
    pub fn has_hardware(&self) -> bool {
        self.devices.iter().any(|d| !d.software)
    }

    /// The GPU slots "auto" gives: one per hardware adapter, and one per
    /// software adapter too when `software` is asked for.
    pub fn auto_slots(&self, software: bool) -> usize {
        self.devices
            .iter()
            .filter(|d| software || !d.software)
            .count()
    }

    /// The software adapters' labels.
    pub fn software_labels(&self) -> Vec<String> {
        let software = self.devices.iter().filter(|d| d.software);
        software.map(|d| d.label.clone()).collect()
    }

    /// How many adapters the pool holds.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// True when no adapter was found.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// A device for a new kernel instance, taking the adapters in turn.
    pub fn pick(&self) -> Result<Arc<GpuDevice>, GpuError> {
        if self.devices.is_empty() {
            return Err(GpuError::NoAdapter {
                choice: self.choice.describe(),
                backends: backend_names(compiled_backends()),
            });
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.usable().count();
        Ok(self.usable().nth(i).expect("i is below the count").clone())
    }
}

/// The wgpu backends compiled into this build: Vulkan (not on Apple),
/// Metal on Apple, DX12 and GL on Windows, GL elsewhere with the `gl`
/// feature (see the crate's documentation).
pub fn compiled_backends() -> wgpu::Backends {
    wgpu::Instance::enabled_backend_features()
}

/// The order in which backends are preferred when one GPU is reachable
/// through several: the native, compute-first APIs before GL, which is
/// only a fallback for GPUs without them. Vulkan comes first because the
/// kernels are tested on it (lavapipe in CI).
pub const BACKEND_PREFERENCE: [wgpu::Backend; 4] = [
    wgpu::Backend::Vulkan,
    wgpu::Backend::Metal,
    wgpu::Backend::Dx12,
    wgpu::Backend::Gl,
];

/// The pool's backend: the most preferred among those adapters were found
/// on. A GPU appears once per backend that drives it (Vulkan and DX12 on
/// Windows, say), so taking adapters from every backend would give one GPU
/// several slots.
fn preferred_backend(found: impl IntoIterator<Item = wgpu::Backend>) -> Option<wgpu::Backend> {
    let found: Vec<wgpu::Backend> = found.into_iter().collect();
    BACKEND_PREFERENCE
        .into_iter()
        .find(|b| found.contains(b))
        .or_else(|| found.first().copied())
}

/// "vulkan, gl": the backends' names as [`AdapterChoice::backend`] takes them.
fn backend_names(backends: wgpu::Backends) -> String {
    let names: Vec<String> = backends
        .iter_names()
        .map(|(name, _)| name.to_lowercase())
        .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_prefers_native_backends_to_gl() {
        use wgpu::Backend::{Dx12, Gl, Vulkan};
        assert_eq!(preferred_backend([Gl, Vulkan, Gl]), Some(Vulkan));
        assert_eq!(preferred_backend([Gl, Dx12]), Some(Dx12));
        assert_eq!(preferred_backend([Gl]), Some(Gl));
        assert_eq!(preferred_backend([]), None);
    }

    #[test]
    fn the_build_asks_for_its_platforms_backends() {
        let compiled = compiled_backends();
        if cfg!(target_vendor = "apple") {
            assert!(compiled.contains(wgpu::Backends::METAL));
        } else {
            assert!(compiled.contains(wgpu::Backends::VULKAN));
        }
        if cfg!(windows) {
            assert!(compiled.contains(wgpu::Backends::DX12 | wgpu::Backends::GL));
        }
        if cfg!(all(target_os = "linux", not(feature = "gl"))) {
            assert!(
                !compiled.contains(wgpu::Backends::GL),
                "GL is opt-in on Linux"
            );
        }
        assert_eq!(backend_names(wgpu::Backends::VULKAN), "vulkan");
    }
}
