// The embedding "model": embedding = pixels x weights, for a batch of rows.
// pixels: rows x k (a fixed-size list column), weights: k x n (a constant),
// embedding: rows x n (an output column of width n).
// One invocation computes one output value; x runs over the n outputs of a
// row (so reads of weights are contiguous across a workgroup), y over rows.

@group(0) @binding(0) var<storage, read> pixels: array<f32>;
@group(0) @binding(1) var<storage, read> weights: array<f32>;
@group(0) @binding(2) var<storage, read_write> embedding: array<f32>;

struct Params {
    rows: u32,
    k: u32,
    n: u32,
    _pad: u32,
}
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let j = id.x;
    let r = id.y;
    if (r >= params.rows || j >= params.n) {
        return;
    }
    var acc = 0.0;
    let row = r * params.k;
    for (var i = 0u; i < params.k; i = i + 1u) {
        acc = acc + pixels[row + i] * weights[i * params.n + j];
    }
    embedding[r * params.n + j] = acc;
}
