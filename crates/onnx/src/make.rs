//! ONNX model files made in Rust, with no Python: a small graph builder
//! ([`ModelBuilder`]) and the main job's network ([`convnet`]), a seeded
//! convolutional embedder, so that the README's main command runs a real
//! model on a machine with only cargo.

use prost::Message;
use rand::{Rng, SeedableRng};

use crate::info::{Dim, ElemType};
use crate::proto::{
    AttributeProto, DimValue, DimensionProto, GraphProto, ModelProto, NodeProto,
    OperatorSetIdProto, TensorProto, TensorShapeProto, TensorTypeProto, TypeProto, ValueInfoProto,
    attribute_type,
};

/// An attribute of a node.
#[derive(Clone, Debug)]
pub enum Attr {
    /// An integer.
    Int(&'static str, i64),
    /// Integers.
    Ints(&'static str, Vec<i64>),
    /// A float.
    Float(&'static str, f32),
}

/// Builds an ONNX model: inputs, weights, nodes, outputs.
///
/// ```
/// use streambatch_onnx::{Dim, ElemType, ModelBuilder, ModelInfo};
///
/// let mut m = ModelBuilder::new(17);
/// m.input("x", ElemType::F32, &[Dim::Dynamic(Some("N".into())), Dim::Fixed(2)]);
/// let w = m.weight("w", &[2, 3], vec![1.0; 6]);
/// m.node("MatMul", &["x", &w], &["y"], vec![]);
/// m.output("y", ElemType::F32, &[Dim::Dynamic(Some("N".into())), Dim::Fixed(3)]);
/// let info = ModelInfo::parse(&m.to_bytes()).unwrap();
/// assert_eq!(info.outputs[0].to_string(), "y: f32[N, 3]");
/// ```
pub struct ModelBuilder {
    graph: GraphProto,
    opset: i64,
}

impl ModelBuilder {
    /// An empty model importing version `opset` of the default operator set.
    pub fn new(opset: i64) -> Self {
        Self {
            graph: GraphProto {
                name: "streambatch".into(),
                ..Default::default()
            },
            opset,
        }
    }

    /// Declares an input.
    pub fn input(&mut self, name: &str, elem: ElemType, shape: &[Dim]) -> &mut Self {
        self.graph.input.push(value_info(name, elem, shape));
        self
    }

    /// Declares an output.
    pub fn output(&mut self, name: &str, elem: ElemType, shape: &[Dim]) -> &mut Self {
        self.graph.output.push(value_info(name, elem, shape));
        self
    }

    /// Adds an `f32` weight of `dims`; returns its name.
    pub fn weight(&mut self, name: &str, dims: &[i64], values: Vec<f32>) -> String {
        assert_eq!(
            values.len() as i64,
            dims.iter().product::<i64>(),
            "weight {name}"
        );
        self.graph.initializer.push(TensorProto {
            dims: dims.to_vec(),
            data_type: ElemType::F32.onnx_code(),
            raw_data: values.iter().flat_map(|x| x.to_le_bytes()).collect(),
            name: name.into(),
            ..Default::default()
        });
        name.into()
    }

    /// Adds an `i64` constant of `dims` (a shape for `Reshape`); returns
    /// its name.
    pub fn weight_i64(&mut self, name: &str, dims: &[i64], values: Vec<i64>) -> String {
        self.graph.initializer.push(TensorProto {
            dims: dims.to_vec(),
            data_type: ElemType::I64.onnx_code(),
            int64_data: values,
            name: name.into(),
            ..Default::default()
        });
        name.into()
    }

    /// Adds a node of `op` from `inputs` to `outputs`.
    pub fn node(
        &mut self,
        op: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<Attr>,
    ) -> &mut Self {
        let n = self.graph.node.len();
        self.graph.node.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            name: format!("{op}_{n}"),
            op_type: op.into(),
            attribute: attrs.into_iter().map(attribute).collect(),
            domain: String::new(),
        });
        self
    }

    /// The model file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        ModelProto {
            ir_version: 8,
            producer_name: "streambatch".into(),
            graph: Some(self.graph.clone()),
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: self.opset,
            }],
        }
        .encode_to_vec()
    }
}

fn attribute(attr: Attr) -> AttributeProto {
    match attr {
        Attr::Int(name, i) => AttributeProto {
            name: name.into(),
            i,
            r#type: attribute_type::INT,
            ..Default::default()
        },
        Attr::Ints(name, ints) => AttributeProto {
            name: name.into(),
            ints,
            r#type: attribute_type::INTS,
            ..Default::default()
        },
        Attr::Float(name, f) => AttributeProto {
            name: name.into(),
            f,
            r#type: attribute_type::FLOAT,
            ..Default::default()
        },
    }
}

fn value_info(name: &str, elem: ElemType, shape: &[Dim]) -> ValueInfoProto {
    let dim = shape
        .iter()
        .map(|d| DimensionProto {
            value: Some(match d {
                Dim::Fixed(n) => DimValue::DimValue(*n as i64),
                Dim::Dynamic(Some(name)) => DimValue::DimParam(name.clone()),
                Dim::Dynamic(None) => DimValue::DimParam("?".into()),
            }),
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorTypeProto {
                elem_type: elem.onnx_code(),
                shape: Some(TensorShapeProto { dim }),
            }),
        }),
    }
}

/// Width of [`convnet`]'s embeddings.
pub const CONVNET_DIM: usize = 256;

/// The main job's network, with weights drawn from `seed`: input `pixels`,
/// `f32[N, 64, 64, 3]` (the main job's normalised images, channels last),
/// output `embedding`, `f32[N, 256]`. Transposed to channels first, then
/// three blocks of convolution (3x3), batch normalisation and ReLU (16,
/// 32 and 32 channels, the first two of stride 2), a 2x2 max pool after
/// the second, a global average pool and a projection (`Gemm`) to 256.
/// About 2.2 million multiply-adds an image.
pub fn convnet(seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut uniform = |n: usize, scale: f32| -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-scale..scale)).collect()
    };
    let batch = || Dim::Dynamic(Some("N".into()));
    let mut m = ModelBuilder::new(17);
    m.input(
        "pixels",
        ElemType::F32,
        &[batch(), Dim::Fixed(64), Dim::Fixed(64), Dim::Fixed(3)],
    );
    m.node(
        "Transpose",
        &["pixels"],
        &["x0"],
        vec![Attr::Ints("perm", vec![0, 3, 1, 2])],
    );
    let mut x = "x0".to_string();
    let mut channels = 3;
    for (i, (out, stride, pool)) in [(16, 2, false), (32, 2, true), (32, 1, false)]
        .into_iter()
        .enumerate()
    {
        let fan_in = channels * 9;
        let w = m.weight(
            &format!("conv{i}.w"),
            &[out, channels, 3, 3],
            uniform((out * fan_in) as usize, (3.0 / fan_in as f32).sqrt()),
        );
        let b = m.weight(&format!("conv{i}.b"), &[out], uniform(out as usize, 0.1));
        let conv = format!("conv{i}");
        m.node(
            "Conv",
            &[&x, &w, &b],
            &[&conv],
            vec![
                Attr::Ints("kernel_shape", vec![3, 3]),
                Attr::Ints("pads", vec![1, 1, 1, 1]),
                Attr::Ints("strides", vec![stride, stride]),
            ],
        );
        let n = out as usize;
        let scale = m.weight(
            &format!("bn{i}.scale"),
            &[out],
            uniform(n, 0.5).iter().map(|v| 1.0 + v).collect(),
        );
        let bias = m.weight(&format!("bn{i}.bias"), &[out], uniform(n, 0.1));
        let mean = m.weight(&format!("bn{i}.mean"), &[out], uniform(n, 0.1));
        let var = m.weight(
            &format!("bn{i}.var"),
            &[out],
            uniform(n, 0.5).iter().map(|v| 1.0 + v).collect(),
        );
        let bn = format!("bn{i}");
        m.node(
            "BatchNormalization",
            &[&conv, &scale, &bias, &mean, &var],
            &[&bn],
            vec![Attr::Float("epsilon", 1e-5)],
        );
        let relu = format!("relu{i}");
        m.node("Relu", &[&bn], &[&relu], vec![]);
        x = relu;
        if pool {
            let pooled = format!("pool{i}");
            m.node(
                "MaxPool",
                &[&x],
                &[&pooled],
                vec![
                    Attr::Ints("kernel_shape", vec![2, 2]),
                    Attr::Ints("strides", vec![2, 2]),
                ],
            );
            x = pooled;
        }
        channels = out;
    }
    m.node("GlobalAveragePool", &[&x], &["gap"], vec![]);
    m.node(
        "Flatten",
        &["gap"],
        &["features"],
        vec![Attr::Int("axis", 1)],
    );
    let dim = CONVNET_DIM as i64;
    let w = m.weight(
        "proj.w",
        &[dim, channels],
        uniform((dim * channels) as usize, (3.0 / channels as f32).sqrt()),
    );
    let b = m.weight("proj.b", &[dim], uniform(CONVNET_DIM, 0.1));
    m.node(
        "Gemm",
        &["features", &w, &b],
        &["embedding"],
        vec![Attr::Int("transB", 1)],
    );
    m.output(
        "embedding",
        ElemType::F32,
        &[batch(), Dim::Fixed(CONVNET_DIM)],
    );
    m.to_bytes()
}
