//! What every node of a cluster can run, and one binary in two roles.
//!
//! A closure cannot travel to another process; an operator made from a
//! [`Registry`] can, as its name and parameters. [`registry`] holds the
//! built-in operators that every stock `streambatch node` rebuilds. A
//! program with operators of its own registers them too and calls [`main`]
//! first thing: started as `PROGRAM node --config FILE` it serves as a node
//! with its registry; started otherwise it goes on as a driver.

use std::path::PathBuf;

use streambatch_core::NodeConfig;
use streambatch_plan::{Registry, Stateful, UdfError};

use crate::{ops, resolve_gpu_slots};

/// The built-in operators, by name, with their parameters:
///
/// | name | parameters | what |
/// |---|---|---|
/// | `preprocess` | none | 64x64x3 image bytes to normalised f32 `pixels` |
/// | `cpu_embedder` | the seed, 8 bytes little-endian | [`ops::CpuEmbedder`], one per worker |
/// | `gpu_embedder` | the seed, 8 bytes little-endian | [`ops::gpu_embedder`] |
/// | `wgsl` | a kernel's settings and WGSL source, as TOML | a kernel of a TOML pipeline |
/// | `onnx` | an [`OnnxSpec`](streambatch_onnx::OnnxSpec), as TOML | an ONNX model, its file checked by hash |
///
/// ```
/// use streambatch::BatchUdf;
/// let registry = streambatch::registry();
/// let op = registry.udf("cpu_embedder", &7u64.to_le_bytes()).unwrap();
/// assert_eq!(op.recipe().unwrap().name, "cpu_embedder");
/// ```
pub fn registry() -> Registry {
    let mut registry = Registry::default();
    registry.register("preprocess", |_| Ok(ops::preprocess));
    registry.register("cpu_embedder", |params| {
        let seed = seed(params)?;
        Ok(Stateful::new("cpu_embedder", move || {
            Ok::<_, UdfError>(ops::CpuEmbedder::new(seed))
        }))
    });
    registry.register("gpu_embedder", |params| {
        ops::gpu_embedder(seed(params)?).map_err(Into::into)
    });
    registry.register("wgsl", crate::pipeline::wgsl_from_recipe);
    registry.register(streambatch_onnx::RECIPE, |params| {
        streambatch_onnx::OnnxModel::from_recipe(params).map_err(Into::into)
    });
    registry
}

fn seed(params: &[u8]) -> Result<u64, UdfError> {
    let bytes: [u8; 8] = params
        .try_into()
        .map_err(|_| format!("expected an 8-byte seed, got {} bytes", params.len()))?;
    Ok(u64::from_le_bytes(bytes))
}

/// Serves as a cluster node when this program was started as
/// `PROGRAM node --config FILE`: runs the node with `registry` until it
/// stops, then exits the process (with status 1 and the error on stderr if
/// it failed). Started any other way, returns at once, and the program goes
/// on as a driver (`Context::connect`). Call it first thing in `main`.
///
/// ```no_run
/// fn main() -> streambatch::Result<()> {
///     let mut registry = streambatch::registry();
///     registry.register("double", |_| {
///         Ok(|b: arrow_array::RecordBatch| Ok::<_, streambatch::UdfError>(b))
///     });
///     streambatch::main(&registry);
///     // The driver:
///     let ctx = streambatch::Context::connect("configs/cluster.toml")?;
///     let n = ctx.range(1000, 10).map_batches(registry.udf("double", b"")?, streambatch::Resources::cpu(1.0)).count()?;
///     println!("{n}");
///     Ok(())
/// }
/// ```
pub fn main(registry: &Registry) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let config = match args.as_slice() {
        [node, flag, file] if node == "node" && flag == "--config" => PathBuf::from(file),
        _ => return,
    };
    let code = match run_node(&config, registry) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    };
    std::process::exit(code);
}

/// Runs the node `config` describes with `registry` until it stops.
/// Prints one line, `node NAME (ROLE) listening on ADDR`, once it serves.
pub fn run_node(
    config: &std::path::Path,
    registry: &Registry,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut settings = NodeConfig::load(Some(config))?;
    if let Some(note) = resolve_gpu_slots(&mut settings) {
        // On stderr, with the node's log: stdout's first line is the start
        // line scripts wait for.
        eprintln!("node {}: {note}", settings.name);
    }
    crate::keep_freed_memory();
    let node = streambatch_sched::ClusterNode::start(&settings, Some(config), registry.clone())?;
    let role = if settings.head.is_some() {
        "worker"
    } else {
        "head"
    };
    println!(
        "node {} ({role}) listening on {}",
        settings.name,
        node.addr()
    );
    node.wait()?;
    Ok(())
}
