//! `GpuKernel`: a WGSL compute shader as a batch operator: compiling and
//! checking it, and the builder that sets its outputs, constants and
//! parameters. Running it is [`crate::instance`]'s job.

use std::collections::HashMap;
use std::sync::Arc;

use naga::{AddressSpace, ScalarKind, StorageAccess, TypeInner};
use streambatch_plan::{BatchFn, BatchUdf, UdfError};

use crate::instance::Instance;
use crate::spec::{Binding, Element, KernelTimings, Role, Spec};
use crate::{GpuError, GpuPool};

/// A WGSL compute kernel over Arrow columns.
///
/// Storage bindings of group 0 are matched by name: a `var<storage, read>`
/// array is an input column of the batch (or a constant given with
/// [`GpuKernel::constant`]); a `var<storage, read_write>` array is an output
/// column, `width` values per row ([`GpuKernel::output`]; a fixed-size list
/// when wider than 1); a `var<uniform>` struct holds [`GpuKernel::params`],
/// with the batch's row count written into a `u32` member named `rows`. The
/// result has the batch's columns that are not kernel inputs, then the
/// outputs. By default one invocation runs per row: the dispatch is
/// `ceil(rows / workgroup_size.x)` workgroups.
#[derive(Clone)]
pub struct GpuKernel {
    spec: Arc<Spec>,
}

impl GpuKernel {
    /// Compiles `source` (checking it fully, with no device needed); errors
    /// name the kernel and the line.
    pub fn from_wgsl(name: &str, source: &str) -> Result<Self, GpuError> {
        let compile_error = |location: Option<naga::SourceLocation>, message: String| {
            let (line, column) = location.map_or((0, 0), |l| (l.line_number, l.line_position));
            GpuError::Compile {
                kernel: name.to_string(),
                line,
                column,
                message,
            }
        };
        let module = naga::front::wgsl::parse_str(source)
            .map_err(|e| compile_error(e.location(source), e.message().to_string()))?;
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&module)
        .map_err(|e| compile_error(e.location(source), e.as_inner().to_string()))?;
        let binding_error = |message: String| GpuError::Binding {
            kernel: name.to_string(),
            message,
        };
        let entry = module
            .entry_points
            .iter()
            .find(|e| e.stage == naga::ShaderStage::Compute)
            .ok_or_else(|| binding_error("no @compute entry point".into()))?;
        let (entry_name, workgroup) = (entry.name.clone(), entry.workgroup_size);
        let mut bindings = Vec::new();
        for (_, var) in module.global_variables.iter() {
            let Some(rb) = &var.binding else { continue };
            let var_name = var.name.clone().unwrap_or_default();
            if rb.group != 0 {
                return Err(binding_error(format!(
                    "`{var_name}` is in group {}; only group 0 is bound",
                    rb.group
                )));
            }
            let role_and_element = match var.space {
                AddressSpace::Storage { access } => {
                    let element = array_element(&module, var.ty).ok_or_else(|| {
                        binding_error(format!("`{var_name}` must be an array of f32, i32 or u32"))
                    })?;
                    let role = if access.contains(StorageAccess::STORE) {
                        Role::Output
                    } else {
                        Role::Input
                    };
                    (role, element)
                }
                AddressSpace::Uniform => {
                    let layouter = {
                        let mut l = naga::proc::Layouter::default();
                        l.update(module.to_ctx())
                            .map_err(|e| binding_error(e.to_string()))?;
                        l
                    };
                    let size = layouter[var.ty].size as usize;
                    let rows_offset = match &module.types[var.ty].inner {
                        TypeInner::Struct { members, .. } => members
                            .iter()
                            .find(|m| m.name.as_deref() == Some("rows"))
                            .map(|m| m.offset as usize),
                        _ => None,
                    };
                    (Role::Uniform { size, rows_offset }, Element::U32)
                }
                _ => continue,
            };
            let (role, element) = role_and_element;
            bindings.push(Binding {
                binding: rb.binding,
                name: var_name,
                role,
                element,
            });
        }
        bindings.sort_by_key(|b| b.binding);
        let spec = Spec {
            name: name.to_string(),
            source: source.to_string(),
            entry: entry_name,
            workgroup,
            bindings,
            widths: HashMap::new(),
            constants: HashMap::new(),
            params: Vec::new(),
            dispatch: None,
            timings: Default::default(),
            device_label: Default::default(),
        };
        Ok(Self {
            spec: Arc::new(spec),
        })
    }

    fn edit(mut self, f: impl FnOnce(&mut Spec)) -> Self {
        f(Arc::make_mut(&mut self.spec));
        self
    }

    /// Declares output `name` to have `width` values per row.
    pub fn output(self, name: &str, width: usize) -> Self {
        self.edit(|s| {
            s.widths.insert(name.to_string(), width.max(1));
        })
    }

    /// Binds read-only array `name` to constant data, uploaded once per
    /// device (model weights).
    pub fn constant(self, name: &str, values: &[f32]) -> Self {
        let bytes = Arc::new(bytemuck::cast_slice(values).to_vec());
        self.edit(|s| {
            s.constants.insert(name.to_string(), bytes);
        })
    }

    /// The bytes of the uniform parameters (the `rows` member is filled in).
    pub fn params(self, bytes: &[u8]) -> Self {
        self.edit(|s| s.params = bytes.to_vec())
    }

    /// Workgroups to dispatch for a batch of `rows` rows.
    pub fn dispatch(self, f: impl Fn(usize) -> [u32; 3] + Send + Sync + 'static) -> Self {
        self.edit(|s| s.dispatch = Some(Arc::new(f)))
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Time spent so far, over every worker's instance.
    pub fn timings(&self) -> KernelTimings {
        *self.spec.timings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The device the kernel last ran on ("adapter (backend)").
    pub fn device(&self) -> Option<String> {
        self.spec
            .device_label
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl std::fmt::Debug for GpuKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bindings: Vec<String> = self
            .spec
            .bindings
            .iter()
            .map(|b| format!("{}:{}", b.binding, b.name))
            .collect();
        f.debug_struct("GpuKernel")
            .field("name", &self.spec.name)
            .field("bindings", &bindings)
            .finish()
    }
}

fn array_element(module: &naga::Module, ty: naga::Handle<naga::Type>) -> Option<Element> {
    let TypeInner::Array { base, .. } = module.types[ty].inner else {
        return None;
    };
    match module.types[base].inner {
        TypeInner::Scalar(naga::Scalar {
            kind: ScalarKind::Float,
            width: 4,
        }) => Some(Element::F32),
        TypeInner::Scalar(naga::Scalar {
            kind: ScalarKind::Sint,
            width: 4,
        }) => Some(Element::I32),
        TypeInner::Scalar(naga::Scalar {
            kind: ScalarKind::Uint,
            width: 4,
        }) => Some(Element::U32),
        _ => None,
    }
}

impl BatchUdf for GpuKernel {
    fn name(&self) -> String {
        self.spec.name.clone()
    }

    fn is_stateful(&self) -> bool {
        true
    }

    fn instantiate(&self) -> Result<Box<dyn BatchFn>, UdfError> {
        let device = GpuPool::global().pick()?;
        Ok(Box::new(Instance::new(self.spec.clone(), device)?))
    }

    fn metrics(&self) -> Vec<(String, String)> {
        let t = self.timings();
        let mut m = Vec::new();
        if let Some(device) = self.device() {
            m.push(("device".into(), device));
        }
        m.push(("upload_s".into(), format!("{:.3}", t.upload.as_secs_f64())));
        m.push((
            "compute_s".into(),
            format!("{:.3}", t.compute.as_secs_f64()),
        ));
        m.push((
            "readback_s".into(),
            format!("{:.3}", t.readback.as_secs_f64()),
        ));
        m
    }
}
