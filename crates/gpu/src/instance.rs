//! One worker's instance of a kernel: the compiled pipeline on one device,
//! and a call per batch in four steps: upload the inputs, run the shader,
//! read the outputs back, assemble the output batch.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{Field, Schema};
use streambatch_plan::{BatchFn, UdfError};
use wgpu::util::DeviceExt;

use crate::GpuError;
use crate::columns::{column_bytes, output_array};
use crate::error::DeviceFailure;
use crate::pool::GpuDevice;
use crate::spec::{Binding, Role, Spec};

// The steps of a call, as errors name them.
const UPLOAD: &str = "uploading the inputs";
const COMPUTE: &str = "running the shader";
const READ_BACK: &str = "reading back the outputs";

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

    /// The buffer, replaced by one of the next power of two when smaller
    /// than `bytes`, so a stream of growing batches reallocates rarely.
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

/// An output column of one call and its size in bytes for that batch.
struct OutputSlot<'a> {
    binding: &'a Binding,
    bytes: usize,
}

impl OutputSlot<'_> {
    /// Its size in the readback buffer, where copies must be aligned.
    fn aligned(&self) -> usize {
        self.bytes
            .next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT as usize)
    }
}

/// One worker's instance: a device, the compiled pipeline, constant buffers
/// and reusable input, output and readback buffers.
pub(crate) struct Instance {
    spec: Arc<Spec>,
    gpu: Arc<GpuDevice>,
    // Handles to the pool's device, kept so that the steps of a call can
    // borrow them alongside `&mut self`'s buffers.
    device: wgpu::Device,
    queue: wgpu::Queue,
    pipeline: wgpu::ComputePipeline,
    /// Constant inputs (weights), uploaded once.
    constants: HashMap<u32, wgpu::Buffer>,
    /// Per-batch inputs, outputs and parameters, by binding.
    buffers: HashMap<u32, Reusable>,
    readback: Reusable,
}

impl Instance {
    pub(crate) fn new(spec: Arc<Spec>, gpu: Arc<GpuDevice>) -> Result<Self, GpuError> {
        let (device, queue) = gpu
            .open_or_wgpu_error()
            .map(|(d, q)| (d.clone(), q.clone()))
            .map_err(|e| GpuError::Run {
                kernel: spec.name.clone(),
                device: gpu.label.clone(),
                step: "opening the device",
                source: e.into(),
            })?;
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
            gpu,
            device,
            queue,
            pipeline,
            constants,
            buffers,
            readback,
        })
    }

    fn fail(&self, message: impl Into<String>) -> GpuError {
        GpuError::Binding {
            kernel: self.spec.name.clone(),
            message: message.into(),
        }
    }

    /// The device failed at `step` of a call.
    fn device_error(&self, step: &'static str, source: impl Into<DeviceFailure>) -> GpuError {
        GpuError::Run {
            kernel: self.spec.name.clone(),
            device: self.gpu.label.clone(),
            step,
            source: source.into(),
        }
    }

    /// The reusable buffer of `binding`, at least `bytes` long.
    fn buffer(&mut self, binding: u32, bytes: usize) -> &wgpu::Buffer {
        self.buffers
            .get_mut(&binding)
            .expect("made per binding")
            .at_least(&self.device, bytes)
    }

    /// Blocks until the device has done all work submitted so far.
    fn wait(&self, step: &'static str) -> Result<(), GpuError> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(drop)
            .map_err(|e| self.device_error(step, e))
    }

    /// Step 1: writes the batch's input columns and the parameters to the
    /// device and makes room for the outputs. Returns the names of the
    /// columns the kernel consumed (they are left out of the result).
    fn upload(
        &mut self,
        spec: &Spec,
        batch: &RecordBatch,
        outputs: &[OutputSlot],
    ) -> Result<Vec<String>, GpuError> {
        let mut inputs = Vec::new();
        for b in &spec.bindings {
            match &b.role {
                Role::Input if !self.constants.contains_key(&b.binding) => {
                    self.write_column(b, batch)?;
                    inputs.push(b.name.clone());
                }
                Role::Uniform { size, rows_offset } => {
                    let bytes = params_bytes(spec, *size, *rows_offset, batch.num_rows());
                    let buffer = self.buffer(b.binding, bytes.len()).clone();
                    self.queue.write_buffer(&buffer, 0, &bytes);
                }
                _ => {}
            }
        }
        for slot in outputs {
            self.buffer(slot.binding.binding, slot.bytes);
        }
        // `write_buffer` only stages the data; an empty submit flushes it,
        // so that the upload's time is measured apart from the compute's.
        self.queue.submit([]);
        self.wait(UPLOAD)?;
        Ok(inputs)
    }

    /// Copies one input column's values (no conversion) into its buffer.
    fn write_column(&mut self, b: &Binding, batch: &RecordBatch) -> Result<(), GpuError> {
        let column = batch
            .column_by_name(&b.name)
            .ok_or_else(|| self.fail(format!("the batch has no column `{}`", b.name)))?;
        let bytes = column_bytes(column, b.element)
            .map_err(|m| self.fail(format!("column `{}` {m}", b.name)))?;
        let buffer = self.buffer(b.binding, bytes.len()).clone();
        // wgpu rejects an empty write; an empty batch leaves the buffer as is.
        if !bytes.is_empty() {
            self.queue.write_buffer(&buffer, 0, bytes);
        }
        Ok(())
    }

    /// Binds every buffer to its binding number, as the shader declares.
    fn bind_group(&self, spec: &Spec) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry> = spec
            .bindings
            .iter()
            .map(|b| {
                let buffer = self
                    .constants
                    .get(&b.binding)
                    .or_else(|| self.buffers[&b.binding].buffer.as_ref())
                    .expect("allocated by upload");
                wgpu::BindGroupEntry {
                    binding: b.binding,
                    resource: buffer.as_entire_binding(),
                }
            })
            .collect();
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &self.pipeline.get_bind_group_layout(0),
            entries: &entries,
        })
    }

    /// Step 2: runs the shader over the batch and waits for it.
    fn compute(&self, spec: &Spec, rows: usize) -> Result<(), GpuError> {
        let group = self.bind_group(spec);
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: None,
            });
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &group, &[]);
            // A dispatch of zero workgroups is invalid on some backends.
            if rows > 0 {
                let [x, y, z] = workgroups(spec, rows);
                pass.dispatch_workgroups(x, y, z);
            }
        }
        self.queue.submit([encoder.finish()]);
        self.wait(COMPUTE)
    }

    /// Step 3: copies the outputs into one mappable buffer, maps it and
    /// turns each output's bytes into an Arrow array.
    fn read_back(
        &mut self,
        spec: &Spec,
        outputs: &[OutputSlot],
    ) -> Result<Vec<ArrayRef>, GpuError> {
        let total: usize = outputs.iter().map(OutputSlot::aligned).sum();
        if total == 0 {
            // Nothing to map (no rows): wgpu refuses to map an empty range.
            return Ok(outputs
                .iter()
                .map(|o| output_array(&[], o.binding.element, spec.width(&o.binding.name)))
                .collect());
        }
        let readback = self.readback.at_least(&self.device, total).clone();
        self.copy_to_readback(outputs, &readback);
        let (tx, rx) = std::sync::mpsc::channel();
        readback.map_async(wgpu::MapMode::Read, ..total as u64, move |r| {
            let _ = tx.send(r);
        });
        self.wait(READ_BACK)?;
        rx.recv()
            .map_err(|_| self.device_error(READ_BACK, DeviceFailure::MapDropped))?
            .map_err(|e| self.device_error(READ_BACK, e))?;
        let arrays = {
            let view = readback
                .get_mapped_range(..total as u64)
                .map_err(|e| self.device_error(READ_BACK, e))?;
            let mut at = 0;
            outputs
                .iter()
                .map(|o| {
                    let bytes = &view[at..at + o.bytes];
                    at += o.aligned();
                    output_array(bytes, o.binding.element, spec.width(&o.binding.name))
                })
                .collect()
        };
        // The view must be dropped before unmapping (wgpu panics otherwise).
        readback.unmap();
        Ok(arrays)
    }

    /// Queues copies of every output buffer into `readback`, one after
    /// another at aligned offsets.
    fn copy_to_readback(&self, outputs: &[OutputSlot], readback: &wgpu::Buffer) {
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let mut at = 0u64;
        for o in outputs {
            let bytes = o.aligned() as u64;
            if bytes > 0 {
                let source = self.buffers[&o.binding.binding]
                    .buffer
                    .as_ref()
                    .expect("allocated by upload");
                encoder.copy_buffer_to_buffer(source, 0, readback, at, bytes);
            }
            at += bytes;
        }
        self.queue.submit([encoder.finish()]);
    }
}

impl BatchFn for Instance {
    fn call(&mut self, batch: RecordBatch) -> Result<RecordBatch, UdfError> {
        // A clone of the `Arc`, so the steps can borrow the spec and
        // `&mut self` at once.
        let spec = self.spec.clone();
        let outputs = output_slots(&spec, batch.num_rows());
        let started = Instant::now();
        let inputs = self.upload(&spec, &batch, &outputs)?;
        let uploaded = Instant::now();
        self.compute(&spec, batch.num_rows())?;
        let computed = Instant::now();
        let arrays = self.read_back(&spec, &outputs)?;
        let read = Instant::now();
        {
            let mut t = spec.timings.lock().unwrap_or_else(|p| p.into_inner());
            t.calls += 1;
            t.upload += uploaded - started;
            t.compute += computed - uploaded;
            t.readback += read - computed;
        }
        let out =
            assemble(&batch, &inputs, &outputs, arrays).map_err(|source| GpuError::Output {
                kernel: spec.name.clone(),
                source,
            })?;
        Ok(out)
    }
}

/// The output columns of a call on `rows` rows, in binding order.
fn output_slots(spec: &Spec, rows: usize) -> Vec<OutputSlot<'_>> {
    spec.bindings
        .iter()
        .filter(|b| matches!(b.role, Role::Output))
        .map(|b| OutputSlot {
            binding: b,
            bytes: rows * spec.width(&b.name) * 4,
        })
        .collect()
}

/// The uniform's bytes: the kernel's parameters, padded to the uniform's
/// size, with the row count written into its `rows` member if it has one.
fn params_bytes(spec: &Spec, size: usize, rows_offset: Option<usize>, rows: usize) -> Vec<u8> {
    let mut bytes = spec.params.clone();
    bytes.resize(size.max(bytes.len()), 0);
    if let Some(at) = rows_offset {
        bytes[at..at + 4].copy_from_slice(&(rows as u32).to_le_bytes());
    }
    bytes
}

/// Workgroups for `rows` rows: the kernel's own dispatch function, or one
/// invocation per row.
fn workgroups(spec: &Spec, rows: usize) -> [u32; 3] {
    match &spec.dispatch {
        Some(f) => f(rows),
        None => [(rows as u32).div_ceil(spec.workgroup[0].max(1)), 1, 1],
    }
}

/// Step 4: the output batch: the batch's columns the kernel did not
/// consume, then the outputs in binding order.
fn assemble(
    batch: &RecordBatch,
    inputs: &[String],
    outputs: &[OutputSlot],
    arrays: Vec<ArrayRef>,
) -> Result<RecordBatch, arrow_schema::ArrowError> {
    let kept = batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .filter(|(f, _)| !inputs.contains(f.name()))
        .map(|(f, c)| (f.as_ref().clone(), c.clone()))
        .collect::<Vec<_>>();
    let produced = outputs.iter().zip(arrays).map(|(o, array)| {
        let field = Field::new(&o.binding.name, array.data_type().clone(), false);
        (field, array)
    });
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = kept.into_iter().chain(produced).unzip();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
}
