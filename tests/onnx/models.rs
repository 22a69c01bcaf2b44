//! The test models of tests/onnx_models.rs, made with the crate's own
//! builder: a transformer encoder block with a dynamic sequence length, a
//! model of two inputs and two outputs, and one of every element type.

use rand::{Rng, SeedableRng};
use streambatch_onnx::{Attr, Dim, ElemType, ModelBuilder};

fn batch() -> Dim {
    Dim::Dynamic(Some("N".into()))
}

fn uniform(rng: &mut rand::rngs::StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// Width of [`encoder_block`]'s tokens.
pub const MODEL_DIM: usize = 16;

/// One transformer encoder block (single-head self-attention, layer
/// norms, a ReLU feed-forward, residuals): `tokens` `f32[N, S, 16]` to
/// `hidden` `f32[N, S, 16]`, `S` dynamic.
pub fn encoder_block(seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let d = MODEL_DIM as i64;
    let seq = || Dim::Dynamic(Some("S".into()));
    let mut m = ModelBuilder::new(17);
    m.input(
        "tokens",
        ElemType::F32,
        &[batch(), seq(), Dim::Fixed(MODEL_DIM)],
    );
    let mut weight = |m: &mut ModelBuilder, name: &str, dims: &[i64], scale: f32| {
        let n = dims.iter().product::<i64>() as usize;
        m.weight(name, dims, uniform(&mut rng, n, scale))
    };
    let ln1_s = weight(&mut m, "ln1.scale", &[d], 0.2);
    let ln1_b = weight(&mut m, "ln1.bias", &[d], 0.2);
    m.node(
        "LayerNormalization",
        &["tokens", &ln1_s, &ln1_b],
        &["n1"],
        vec![Attr::Int("axis", -1), Attr::Float("epsilon", 1e-5)],
    );
    let scale = 0.4;
    for (name, w) in [("q", "wq"), ("k", "wk"), ("v", "wv")] {
        let w = weight(&mut m, w, &[d, d], scale);
        m.node("MatMul", &["n1", &w], &[name], vec![]);
    }
    m.node(
        "Transpose",
        &["k"],
        &["kt"],
        vec![Attr::Ints("perm", vec![0, 2, 1])],
    );
    m.node("MatMul", &["q", "kt"], &["scores"], vec![]);
    let inv_sqrt = m.weight("inv_sqrt_d", &[], vec![1.0 / (MODEL_DIM as f32).sqrt()]);
    m.node("Mul", &["scores", &inv_sqrt], &["scaled"], vec![]);
    m.node(
        "Softmax",
        &["scaled"],
        &["attn"],
        vec![Attr::Int("axis", -1)],
    );
    m.node("MatMul", &["attn", "v"], &["mixed"], vec![]);
    let wo = weight(&mut m, "wo", &[d, d], scale);
    m.node("MatMul", &["mixed", &wo], &["projected"], vec![]);
    m.node("Add", &["tokens", "projected"], &["r1"], vec![]);
    let ln2_s = weight(&mut m, "ln2.scale", &[d], 0.2);
    let ln2_b = weight(&mut m, "ln2.bias", &[d], 0.2);
    m.node(
        "LayerNormalization",
        &["r1", &ln2_s, &ln2_b],
        &["n2"],
        vec![Attr::Int("axis", -1), Attr::Float("epsilon", 1e-5)],
    );
    let w1 = weight(&mut m, "ff.w1", &[d, 4 * d], scale);
    let b1 = weight(&mut m, "ff.b1", &[4 * d], 0.1);
    let w2 = weight(&mut m, "ff.w2", &[4 * d, d], scale);
    m.node("MatMul", &["n2", &w1], &["h1"], vec![]);
    m.node("Add", &["h1", &b1], &["h1b"], vec![]);
    m.node("Relu", &["h1b"], &["h1r"], vec![]);
    m.node("MatMul", &["h1r", &w2], &["h2"], vec![]);
    m.node("Add", &["r1", "h2"], &["hidden"], vec![]);
    m.output(
        "hidden",
        ElemType::F32,
        &[batch(), seq(), Dim::Fixed(MODEL_DIM)],
    );
    m.to_bytes()
}

/// Two inputs, two outputs: `features` `f32[N, 4]` and `ids` `i64[N]`
/// to `scores = features W` (`f32[N, 3]`) and `twice = ids + ids`
/// (`i64[N]`).
pub fn two_in_two_out(seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut m = ModelBuilder::new(17);
    m.input("features", ElemType::F32, &[batch(), Dim::Fixed(4)]);
    m.input("ids", ElemType::I64, &[batch()]);
    let w = m.weight("w", &[4, 3], uniform(&mut rng, 12, 1.0));
    m.node("MatMul", &["features", &w], &["scores"], vec![]);
    m.node("Add", &["ids", "ids"], &["twice"], vec![]);
    m.output("scores", ElemType::F32, &[batch(), Dim::Fixed(3)]);
    m.output("twice", ElemType::I64, &[batch()]);
    m.to_bytes()
}

/// One input of each element type but f32 — `bytes` `u8[N, 4]`, `counts`
/// `i32[N, 2]`, `halves` `f16[N, 2]` — cast to f32, concatenated and
/// projected: `y` `f32[N, 2]`, and `y` again as `y16` `f16[N, 2]`.
pub fn every_type(seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut m = ModelBuilder::new(17);
    m.input("bytes", ElemType::U8, &[batch(), Dim::Fixed(4)]);
    m.input("counts", ElemType::I32, &[batch(), Dim::Fixed(2)]);
    m.input("halves", ElemType::F16, &[batch(), Dim::Fixed(2)]);
    for (from, to) in [("bytes", "b"), ("counts", "c"), ("halves", "h")] {
        m.node("Cast", &[from], &[to], vec![Attr::Int("to", 1)]);
    }
    m.node(
        "Concat",
        &["b", "c", "h"],
        &["all"],
        vec![Attr::Int("axis", 1)],
    );
    let w = m.weight("w", &[8, 2], uniform(&mut rng, 16, 0.1));
    m.node("MatMul", &["all", &w], &["y"], vec![]);
    m.node("Cast", &["y"], &["y16"], vec![Attr::Int("to", 10)]);
    m.output("y", ElemType::F32, &[batch(), Dim::Fixed(2)]);
    m.output("y16", ElemType::F16, &[batch(), Dim::Fixed(2)]);
    m.to_bytes()
}

/// A model whose graph uses an operator no engine has.
pub fn unknown_op() -> Vec<u8> {
    let mut m = ModelBuilder::new(17);
    m.input("x", ElemType::F32, &[batch(), Dim::Fixed(2)]);
    m.node("NoSuchOperator", &["x"], &["y"], vec![]);
    m.output("y", ElemType::F32, &[batch(), Dim::Fixed(2)]);
    m.to_bytes()
}

/// A model that declares `y` `f32[N, 5]` and computes `f32[N, 3]`.
pub fn lying_output() -> Vec<u8> {
    let mut m = ModelBuilder::new(17);
    m.input("x", ElemType::F32, &[batch(), Dim::Fixed(2)]);
    let w = m.weight("w", &[2, 3], vec![1.0; 6]);
    m.node("MatMul", &["x", &w], &["y"], vec![]);
    m.output("y", ElemType::F32, &[batch(), Dim::Fixed(5)]);
    m.to_bytes()
}
