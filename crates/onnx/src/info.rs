//! What a model file declares, read before any job runs: its inputs' and
//! outputs' names, element types and shapes, its opset, and the operators
//! its graph uses, so that a plan can be checked (and `explain()` shown)
//! without an engine.

use std::fmt;
use std::path::Path;

use prost::Message;
use sha2::{Digest, Sha256};

use crate::error::{OnnxError, Result};
use crate::proto::{DimValue, ModelProto, ValueInfoProto};

/// The element types the operator maps to Arrow columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ElemType {
    /// `float`, Arrow `Float32`.
    F32,
    /// `float16`, Arrow `Float16`.
    F16,
    /// `int64`, Arrow `Int64`.
    I64,
    /// `int32`, Arrow `Int32`.
    I32,
    /// `uint8`, Arrow `UInt8`.
    U8,
}

impl ElemType {
    /// The type of ONNX's `TensorProto.DataType` code, if one of these.
    pub fn from_onnx(code: i32) -> Option<Self> {
        Some(match code {
            1 => Self::F32,
            2 => Self::U8,
            6 => Self::I32,
            7 => Self::I64,
            10 => Self::F16,
            _ => return None,
        })
    }

    /// ONNX's `TensorProto.DataType` code.
    pub fn onnx_code(self) -> i32 {
        match self {
            Self::F32 => 1,
            Self::U8 => 2,
            Self::I32 => 6,
            Self::I64 => 7,
            Self::F16 => 10,
        }
    }

    /// The Arrow type of a column's values of this type.
    pub fn arrow(self) -> arrow_schema::DataType {
        use arrow_schema::DataType;
        match self {
            Self::F32 => DataType::Float32,
            Self::F16 => DataType::Float16,
            Self::I64 => DataType::Int64,
            Self::I32 => DataType::Int32,
            Self::U8 => DataType::UInt8,
        }
    }
}

impl fmt::Display for ElemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::I64 => "i64",
            Self::I32 => "i32",
            Self::U8 => "u8",
        })
    }
}

/// One dimension of a declared shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    /// A fixed size.
    Fixed(usize),
    /// A size known only when the model runs (a batch, a sequence), by
    /// name where the model names it.
    Dynamic(Option<String>),
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fixed(n) => write!(f, "{n}"),
            Self::Dynamic(Some(name)) => f.write_str(name),
            Self::Dynamic(None) => f.write_str("?"),
        }
    }
}

/// A model input or output as the file declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Its name in the graph.
    pub name: String,
    /// Its element type.
    pub elem: ElemType,
    /// Its shape; the first dimension is the batch's.
    pub shape: Vec<Dim>,
}

impl fmt::Display for TensorInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.shape.iter().map(Dim::to_string).collect();
        write!(f, "{}: {}[{}]", self.name, self.elem, dims.join(", "))
    }
}

/// What a model file declares (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelInfo {
    /// Its graph's inputs (weights excluded).
    pub inputs: Vec<TensorInfo>,
    /// Its graph's outputs.
    pub outputs: Vec<TensorInfo>,
    /// The version of the default operator set it imports.
    pub opset: i64,
    /// The operator types its graph uses, each once, in first use order.
    pub ops: Vec<String>,
    /// The file's SHA-256, lower-case hex: what nodes check their copy by.
    pub sha256: String,
}

impl ModelInfo {
    /// Reads the declarations of the model file at `path`.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| OnnxError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&bytes).map_err(|reason| OnnxError::NotOnnx {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Reads the declarations of a model file's bytes; the error says what
    /// is wrong with them.
    pub fn parse(bytes: &[u8]) -> std::result::Result<Self, String> {
        let model = ModelProto::decode(bytes).map_err(|e| format!("not an ONNX model: {e}"))?;
        let graph = model
            .graph
            .as_ref()
            .ok_or("not an ONNX model: it has no graph")?;
        if graph.node.is_empty() {
            return Err("not an ONNX model: its graph has no node".into());
        }
        let opset = model
            .opset_import
            .iter()
            .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
            .map(|o| o.version)
            .ok_or("it imports no version of the default operator set")?;
        // Older files list their weights among the inputs too.
        let weights: std::collections::HashSet<&str> =
            graph.initializer.iter().map(|t| t.name.as_str()).collect();
        let inputs = graph
            .input
            .iter()
            .filter(|i| !weights.contains(i.name.as_str()))
            .map(|i| tensor_info(i, "input"))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let outputs = graph
            .output
            .iter()
            .map(|o| tensor_info(o, "output"))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if inputs.is_empty() || outputs.is_empty() {
            return Err("the graph declares no input or no output".into());
        }
        let mut ops: Vec<String> = Vec::new();
        for node in &graph.node {
            if !ops.contains(&node.op_type) {
                ops.push(node.op_type.clone());
            }
        }
        Ok(Self {
            inputs,
            outputs,
            opset,
            ops,
            sha256: sha256_hex(bytes),
        })
    }

    /// The declared input named `name`.
    pub fn input(&self, name: &str) -> Option<&TensorInfo> {
        self.inputs.iter().find(|i| i.name == name)
    }

    /// The declared output named `name`.
    pub fn output(&self, name: &str) -> Option<&TensorInfo> {
        self.outputs.iter().find(|o| o.name == name)
    }
}

impl fmt::Display for ModelInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |ts: &[TensorInfo]| ts.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        write!(
            f,
            "opset {}; inputs {}; outputs {}; {} op types; sha256 {}",
            self.opset,
            list(&self.inputs).join(", "),
            list(&self.outputs).join(", "),
            self.ops.len(),
            &self.sha256[..12],
        )
    }
}

/// The SHA-256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn tensor_info(value: &ValueInfoProto, what: &str) -> std::result::Result<TensorInfo, String> {
    let tensor = value
        .r#type
        .as_ref()
        .and_then(|t| t.tensor_type.as_ref())
        .ok_or_else(|| format!("{what} `{}` is not a tensor", value.name))?;
    let elem = ElemType::from_onnx(tensor.elem_type).ok_or_else(|| {
        format!(
            "{what} `{}` has ONNX element type {}: supported are f32, f16, i64, i32 and u8",
            value.name, tensor.elem_type
        )
    })?;
    let shape = tensor
        .shape
        .as_ref()
        .ok_or_else(|| format!("{what} `{}` declares no shape", value.name))?
        .dim
        .iter()
        .map(|d| match &d.value {
            Some(DimValue::DimValue(n)) if *n > 0 => Dim::Fixed(*n as usize),
            Some(DimValue::DimParam(name)) if !name.is_empty() => Dim::Dynamic(Some(name.clone())),
            _ => Dim::Dynamic(None),
        })
        .collect::<Vec<_>>();
    if shape.is_empty() {
        return Err(format!(
            "{what} `{}` is a scalar: an input or output needs a batch dimension",
            value.name
        ));
    }
    Ok(TensorInfo {
        name: value.name.clone(),
        elem,
        shape,
    })
}
