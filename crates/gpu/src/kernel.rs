//! `GpuKernel`: a WGSL compute shader as a batch operator.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::{
    Array, ArrayRef, FixedSizeListArray, Float32Array, Int32Array, RecordBatch, UInt32Array,
};
use arrow_buffer::ScalarBuffer;
use arrow_schema::{DataType, Field, Schema};
use naga::{AddressSpace, ScalarKind, StorageAccess, TypeInner};
use streambatch_plan::{BatchFn, BatchUdf, UdfError};
use wgpu::util::DeviceExt;

use crate::pool::GpuDevice;
use crate::{GpuError, GpuPool};

/// The element type of a storage array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Element {
    F32,
    I32,
    U32,
}

#[derive(Clone, Debug)]
enum Role {
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
struct Binding {
    binding: u32,
    name: String,
    role: Role,
    element: Element,
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

#[derive(Clone)]
struct Spec {
    name: String,
    source: String,
    entry: String,
    workgroup: [u32; 3],
    bindings: Vec<Binding>,
    widths: HashMap<String, usize>,
    constants: HashMap<String, Arc<Vec<u8>>>,
    params: Vec<u8>,
    dispatch: Option<Arc<dyn Fn(usize) -> [u32; 3] + Send + Sync>>,
    timings: Arc<Mutex<KernelTimings>>,
    device_label: Arc<Mutex<Option<String>>>,
}

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

/// A device buffer grown as batches need, reused across calls.
struct Reusable {
    buffer: Option<wgpu::Buffer>,
    usage: wgpu::BufferUsages,
}

impl Reusable {
    fn new(usage: wgpu::BufferUsages) -> Self {
        Self {
            buffer: None,
            usage,
        }
    }

    fn at_least(&mut self, device: &wgpu::Device, bytes: usize) -> &wgpu::Buffer {
        let bytes = (bytes.max(4) as u64).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        if self.buffer.as_ref().is_none_or(|b| b.size() < bytes) {
            let size = bytes.next_power_of_two();
            self.buffer = Some(device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size,
                usage: self.usage,
                mapped_at_creation: false,
            }));
        }
        self.buffer.as_ref().expect("set above")
    }
}

/// One worker's instance: a device, the compiled pipeline, constant buffers
/// and reusable input, output and readback buffers.
struct Instance {
    spec: Arc<Spec>,
    device: Arc<GpuDevice>,
    pipeline: wgpu::ComputePipeline,
    constants: HashMap<u32, wgpu::Buffer>,
    buffers: HashMap<u32, Reusable>,
    readback: Reusable,
}

impl Instance {
    fn new(spec: Arc<Spec>, gpu: Arc<GpuDevice>) -> Result<Self, GpuError> {
        let (device, _) = gpu.open()?;
        *spec.device_label.lock().unwrap_or_else(|p| p.into_inner()) = Some(gpu.label.clone());
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(&spec.name),
            source: wgpu::ShaderSource::Wgsl(spec.source.as_str().into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&spec.name),
            layout: None,
            module: &module,
            entry_point: Some(&spec.entry),
            compilation_options: Default::default(),
            cache: None,
        });
        let mut constants = HashMap::new();
        let mut buffers = HashMap::new();
        for b in &spec.bindings {
            match (&b.role, spec.constants.get(&b.name)) {
                (Role::Input, Some(bytes)) => {
                    let buffer = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                        label: Some(&b.name),
                        contents: bytes,
                        usage: wgpu::BufferUsages::STORAGE,
                    });
                    constants.insert(b.binding, buffer);
                }
                (Role::Input, None) => {
                    buffers.insert(
                        b.binding,
                        Reusable::new(wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST),
                    );
                }
                (Role::Output, _) => {
                    buffers.insert(
                        b.binding,
                        Reusable::new(wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC),
                    );
                }
                (Role::Uniform { .. }, _) => {
                    buffers.insert(
                        b.binding,
                        Reusable::new(wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST),
                    );
                }
            }
        }
        let readback = Reusable::new(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
        Ok(Self {
            spec,
            device: gpu,
            pipeline,
            constants,
            buffers,
            readback,
        })
    }

    fn fail(&self, message: impl Into<String>) -> UdfError {
        GpuError::Binding {
            kernel: self.spec.name.clone(),
            message: message.into(),
        }
        .into()
    }

    fn device_error(&self, message: impl ToString) -> UdfError {
        GpuError::Device {
            device: self.device.label.clone(),
            message: message.to_string(),
        }
        .into()
    }
}

/// The bytes of a kernel input column: its values, no copy.
fn column_bytes(column: &ArrayRef, element: Element) -> Result<&[u8], String> {
    let values: &ArrayRef = match column.data_type() {
        DataType::FixedSizeList(_, _) => column.as_fixed_size_list().values(),
        _ => column,
    };
    let offset_items = match column.data_type() {
        DataType::FixedSizeList(_, width) => column.offset() * *width as usize,
        _ => 0,
    };
    let items = match column.data_type() {
        DataType::FixedSizeList(_, width) => column.len() * *width as usize,
        _ => column.len(),
    };
    let bytes: &[u8] = match (values.data_type(), element) {
        (DataType::Float32, Element::F32) => bytemuck::cast_slice(
            values
                .as_primitive::<arrow_array::types::Float32Type>()
                .values(),
        ),
        (DataType::Int32, Element::I32) => bytemuck::cast_slice(
            values
                .as_primitive::<arrow_array::types::Int32Type>()
                .values(),
        ),
        (DataType::UInt32, Element::U32) => bytemuck::cast_slice(
            values
                .as_primitive::<arrow_array::types::UInt32Type>()
                .values(),
        ),
        (found, _) => return Err(format!("has type {found}, the kernel reads {element:?}")),
    };
    Ok(&bytes[offset_items * 4..(offset_items + items) * 4])
}

impl BatchFn for Instance {
    fn call(&mut self, batch: RecordBatch) -> Result<RecordBatch, UdfError> {
        let rows = batch.num_rows();
        let (device, queue) = self.device.open()?;
        let spec = self.spec.clone();

        // Upload inputs and parameters.
        let started = Instant::now();
        let mut inputs = Vec::new();
        for b in &spec.bindings {
            match &b.role {
                Role::Input if !self.constants.contains_key(&b.binding) => {
                    let column = batch.column_by_name(&b.name).ok_or_else(|| {
                        self.fail(format!("the batch has no column `{}`", b.name))
                    })?;
                    let bytes = column_bytes(column, b.element)
                        .map_err(|m| self.fail(format!("column `{}` {m}", b.name)))?;
                    let buffer = self
                        .buffers
                        .get_mut(&b.binding)
                        .expect("made per binding")
                        .at_least(device, bytes.len());
                    if !bytes.is_empty() {
                        queue.write_buffer(buffer, 0, bytes);
                    }
                    inputs.push(b.name.clone());
                }
                Role::Uniform { size, rows_offset } => {
                    let mut bytes = spec.params.clone();
                    bytes.resize((*size).max(bytes.len()), 0);
                    if let Some(at) = rows_offset {
                        bytes[*at..*at + 4].copy_from_slice(&(rows as u32).to_le_bytes());
                    }
                    let buffer = self
                        .buffers
                        .get_mut(&b.binding)
                        .expect("made per binding")
                        .at_least(device, bytes.len());
                    queue.write_buffer(buffer, 0, &bytes);
                }
                _ => {}
            }
        }
        let outputs: Vec<(Binding, usize)> = spec
            .bindings
            .iter()
            .filter(|b| matches!(b.role, Role::Output))
            .map(|b| {
                (
                    b.clone(),
                    rows * spec.widths.get(&b.name).copied().unwrap_or(1) * 4,
                )
            })
            .collect();
        for (b, bytes) in &outputs {
            self.buffers
                .get_mut(&b.binding)
                .expect("made per binding")
                .at_least(device, *bytes);
        }
        queue.submit([]);
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| self.device_error(e))?;
        let uploaded = Instant::now();

        // Run.
        let layout = self.pipeline.get_bind_group_layout(0);
        let entries: Vec<wgpu::BindGroupEntry> = spec
            .bindings
            .iter()
            .map(|b| {
                let buffer = self
                    .constants
                    .get(&b.binding)
                    .or_else(|| self.buffers[&b.binding].buffer.as_ref())
                    .expect("allocated above");
                wgpu::BindGroupEntry {
                    binding: b.binding,
                    resource: buffer.as_entire_binding(),
                }
            })
            .collect();
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout,
            entries: &entries,
        });
        let [x, y, z] = match &spec.dispatch {
            Some(f) => f(rows),
            None => [(rows as u32).div_ceil(spec.workgroup[0].max(1)), 1, 1],
        };
        let mut encoder =
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: None,
            });
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &group, &[]);
            if rows > 0 {
                pass.dispatch_workgroups(x, y, z);
            }
        }
        queue.submit([encoder.finish()]);
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| self.device_error(e))?;
        let computed = Instant::now();

        // Read back.
        let total: usize = outputs
            .iter()
            .map(|(_, n)| n.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT as usize))
            .sum();
        let readback = self.readback.at_least(device, total).clone();
        let mut encoder =
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let mut at = 0u64;
        for (b, bytes) in &outputs {
            let bytes = (*bytes as u64).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
            if bytes > 0 {
                let source = self.buffers[&b.binding]
                    .buffer
                    .as_ref()
                    .expect("allocated above");
                encoder.copy_buffer_to_buffer(source, 0, &readback, at, bytes);
            }
            at += bytes;
        }
        queue.submit([encoder.finish()]);
        let mut columns: Vec<(Field, ArrayRef)> = batch
            .schema()
            .fields()
            .iter()
            .zip(batch.columns())
            .filter(|(f, _)| !inputs.contains(f.name()))
            .map(|(f, c)| (f.as_ref().clone(), c.clone()))
            .collect();
        if total > 0 {
            let (tx, rx) = std::sync::mpsc::channel();
            readback.map_async(wgpu::MapMode::Read, ..total as u64, move |r| {
                let _ = tx.send(r);
            });
            device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| self.device_error(e))?;
            rx.recv()
                .map_err(|e| self.device_error(e))?
                .map_err(|e| self.device_error(e))?;
            {
                let view = readback
                    .get_mapped_range(..total as u64)
                    .map_err(|e| self.device_error(e))?;
                let mut at = 0;
                for (b, bytes) in &outputs {
                    let width = spec.widths.get(&b.name).copied().unwrap_or(1);
                    let array = output_array(&view[at..at + bytes], b.element, width);
                    let field = Field::new(&b.name, array.data_type().clone(), false);
                    columns.push((field, array));
                    at += bytes.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT as usize);
                }
            }
            readback.unmap();
        } else {
            for (b, _) in &outputs {
                let width = spec.widths.get(&b.name).copied().unwrap_or(1);
                let array = output_array(&[], b.element, width);
                columns.push((Field::new(&b.name, array.data_type().clone(), false), array));
            }
        }
        let read = Instant::now();
        {
            let mut t = spec.timings.lock().unwrap_or_else(|p| p.into_inner());
            t.calls += 1;
            t.upload += uploaded - started;
            t.compute += computed - uploaded;
            t.readback += read - computed;
        }
        let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = columns.into_iter().unzip();
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
    }
}

fn output_array(bytes: &[u8], element: Element, width: usize) -> ArrayRef {
    let values: ArrayRef = match element {
        Element::F32 => Arc::new(Float32Array::new(
            ScalarBuffer::from(bytemuck::pod_collect_to_vec::<u8, f32>(bytes)),
            None,
        )),
        Element::I32 => Arc::new(Int32Array::new(
            ScalarBuffer::from(bytemuck::pod_collect_to_vec::<u8, i32>(bytes)),
            None,
        )),
        Element::U32 => Arc::new(UInt32Array::new(
            ScalarBuffer::from(bytemuck::pod_collect_to_vec::<u8, u32>(bytes)),
            None,
        )),
    };
    if width == 1 {
        return values;
    }
    let field = Arc::new(Field::new("item", values.data_type().clone(), false));
    Arc::new(FixedSizeListArray::new(field, width as i32, values, None))
}
