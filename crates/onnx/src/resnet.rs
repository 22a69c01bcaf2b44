//! A ResNet-50 made in Rust ([`resnet50`]): the architecture of He et al.
//! (v1.5, the stride on the 3x3 convolution), seeded weights, so that the
//! W7 benchmark runs a model of the size and shape users bring without a
//! download or Python.

use rand::{Rng, SeedableRng};

use crate::info::{Dim, ElemType};
use crate::make::{Attr, ModelBuilder};

/// Classes [`resnet50`] scores.
pub const RESNET_CLASSES: usize = 1000;

/// Side of the square images [`resnet50`] takes.
pub const RESNET_SIDE: usize = 224;

/// ResNet-50 with weights drawn from `seed`: input `pixels`,
/// `f32[N, 224, 224, 3]` (normalised images, channels last, as
/// `ops::normalize` makes them), output `scores`, `f32[N, 1000]` (logits).
/// Transposed to channels first; a 7x7 convolution of stride 2, a max
/// pool, then 3, 4, 6 and 3 bottleneck blocks (1x1, 3x3, 1x1 convolutions,
/// each followed by batch normalisation; projection shortcuts where the
/// shape changes), a global average pool and a fully connected layer.
/// 25.6 million weights, about 4.1 billion multiply-adds an image.
///
/// Weights are He-scaled and each block's last normalisation scales by
/// 0.2, so that activations stay of order one through the 16 residual
/// additions and the scores are far from zero and from overflow.
pub fn resnet50(seed: u64) -> Vec<u8> {
    let mut net = Net {
        m: ModelBuilder::new(17),
        rng: rand::rngs::StdRng::seed_from_u64(seed),
        layers: 0,
    };
    let batch = || Dim::Dynamic(Some("N".into()));
    let side = Dim::Fixed(RESNET_SIDE);
    net.m.input(
        "pixels",
        ElemType::F32,
        &[batch(), side.clone(), side, Dim::Fixed(3)],
    );
    net.m.node(
        "Transpose",
        &["pixels"],
        &["nchw"],
        vec![Attr::Ints("perm", vec![0, 3, 1, 2])],
    );
    let stem = net.conv_bn("nchw", 3, 64, 7, 2, 1.0, true);
    net.m.node(
        "MaxPool",
        &[&stem],
        &["pooled"],
        vec![
            Attr::Ints("kernel_shape", vec![3, 3]),
            Attr::Ints("pads", vec![1, 1, 1, 1]),
            Attr::Ints("strides", vec![2, 2]),
        ],
    );
    let mut x = "pooled".to_string();
    let mut channels = 64;
    for (stage, (blocks, width)) in [(3, 64), (4, 128), (6, 256), (3, 512)]
        .into_iter()
        .enumerate()
    {
        for block in 0..blocks {
            let stride = if stage > 0 && block == 0 { 2 } else { 1 };
            x = net.bottleneck(&x, channels, width, stride);
            channels = width * 4;
        }
    }
    net.m.node("GlobalAveragePool", &[&x], &["gap"], vec![]);
    net.m.node(
        "Flatten",
        &["gap"],
        &["features"],
        vec![Attr::Int("axis", 1)],
    );
    let classes = RESNET_CLASSES as i64;
    let w = net.uniform("fc.w", &[classes, channels], channels);
    let b = net.m.weight("fc.b", &[classes], vec![0.0; RESNET_CLASSES]);
    net.m.node(
        "Gemm",
        &["features", &w, &b],
        &["scores"],
        vec![Attr::Int("transB", 1)],
    );
    net.m.output(
        "scores",
        ElemType::F32,
        &[batch(), Dim::Fixed(RESNET_CLASSES)],
    );
    net.m.to_bytes()
}

struct Net {
    m: ModelBuilder,
    rng: rand::rngs::StdRng,
    layers: usize,
}

impl Net {
    /// A weight of `dims`, uniform with the variance 2 / `fan_in` (He).
    fn uniform(&mut self, name: &str, dims: &[i64], fan_in: i64) -> String {
        let n = dims.iter().product::<i64>() as usize;
        let bound = (6.0 / fan_in as f32).sqrt();
        let values = (0..n)
            .map(|_| self.rng.random_range(-bound..bound))
            .collect();
        self.m.weight(name, dims, values)
    }

    /// A `k` x `k` convolution from `input` (`from` channels) to `to`
    /// channels, then batch normalisation scaling by about `gamma`, then
    /// ReLU where `relu`; returns the output's name.
    #[allow(clippy::too_many_arguments)]
    fn conv_bn(
        &mut self,
        input: &str,
        from: i64,
        to: i64,
        k: i64,
        stride: i64,
        gamma: f32,
        relu: bool,
    ) -> String {
        let i = self.layers;
        self.layers += 1;
        let w = self.uniform(&format!("conv{i}.w"), &[to, from, k, k], from * k * k);
        let conv = format!("conv{i}");
        let pad = k / 2;
        self.m.node(
            "Conv",
            &[input, &w],
            &[&conv],
            vec![
                Attr::Ints("kernel_shape", vec![k, k]),
                Attr::Ints("pads", vec![pad; 4]),
                Attr::Ints("strides", vec![stride, stride]),
            ],
        );
        let n = to as usize;
        let mut around = |centre: f32, spread: f32| -> Vec<f32> {
            (0..n)
                .map(|_| centre + self.rng.random_range(-spread..spread))
                .collect()
        };
        let (scale, bias, mean, var) = (
            around(gamma, 0.1 * gamma),
            around(0.0, 0.1),
            around(0.0, 0.1),
            around(1.0, 0.2),
        );
        let scale = self.m.weight(&format!("bn{i}.scale"), &[to], scale);
        let bias = self.m.weight(&format!("bn{i}.bias"), &[to], bias);
        let mean = self.m.weight(&format!("bn{i}.mean"), &[to], mean);
        let var = self.m.weight(&format!("bn{i}.var"), &[to], var);
        let bn = format!("bn{i}");
        self.m.node(
            "BatchNormalization",
            &[&conv, &scale, &bias, &mean, &var],
            &[&bn],
            vec![Attr::Float("epsilon", 1e-5)],
        );
        if !relu {
            return bn;
        }
        let out = format!("relu{i}");
        self.m.node("Relu", &[&bn], &[&out], vec![]);
        out
    }

    /// A bottleneck block from `input` (`from` channels) through `width`
    /// to `4 * width` channels, the 3x3 convolution of `stride`.
    fn bottleneck(&mut self, input: &str, from: i64, width: i64, stride: i64) -> String {
        let to = width * 4;
        let a = self.conv_bn(input, from, width, 1, 1, 1.0, true);
        let b = self.conv_bn(&a, width, width, 3, stride, 1.0, true);
        let c = self.conv_bn(&b, width, to, 1, 1, 0.2, false);
        let shortcut = if from != to || stride != 1 {
            self.conv_bn(input, from, to, 1, stride, 1.0, false)
        } else {
            input.to_string()
        };
        let i = self.layers;
        let (sum, out) = (format!("add{i}"), format!("block{i}"));
        self.m.node("Add", &[&c, &shortcut], &[&sum], vec![]);
        self.m.node("Relu", &[&sum], &[&out], vec![]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::info::ModelInfo;

    #[test]
    fn resnet50_has_the_weights_and_interface_of_resnet50() {
        let info = ModelInfo::parse(&resnet50(1)).unwrap();
        assert_eq!(info.inputs[0].to_string(), "pixels: f32[N, 224, 224, 3]");
        assert_eq!(info.outputs[0].to_string(), "scores: f32[N, 1000]");
        let model = <crate::proto::ModelProto as prost::Message>::decode(&resnet50(1)[..]).unwrap();
        let graph = model.graph.unwrap();
        let count = |op: &str| graph.node.iter().filter(|n| n.op_type == op).count();
        // 49 convolutions, 4 projections; 16 residual additions.
        assert_eq!((count("Conv"), count("Add"), count("Gemm")), (53, 16, 1));
        let weights: usize = graph
            .initializer
            .iter()
            .map(|t| t.dims.iter().product::<i64>() as usize)
            .sum();
        // ResNet-50's 25.56 million, with its normalisations' statistics.
        assert!((25_500_000..25_700_000).contains(&weights), "{weights}");
        assert!(info.ops.contains(&"BatchNormalization".to_string()));
    }
}
