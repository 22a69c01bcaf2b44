//! The `streambatch` command: `streambatch infer [--cluster FILE] [--model FILE]` (the
//! main job, `infer.rs`); `streambatch run pipeline.toml`;
//! `streambatch bench <WORKLOAD> [--store-cap SIZE]` (W1 to W6b, G1 and the
//! others of docs/workloads.md; the workloads live in
//! `streambatch-bench`); `streambatch node --config
//! FILE` (a cluster node); `streambatch timeline trace.json -o job.html`
//! (a trace drawn as a page); `streambatch cluster init DIR` and
//! `streambatch cluster status --config FILE`.

use clap::{Parser, Subcommand, ValueEnum};
use streambatch::{NodeConfig, parse_size};
use streambatch_bench as workloads;

mod infer;

#[derive(Parser)]
#[command(
    name = "streambatch",
    version,
    about = "Streaming batch execution of CPU/GPU data pipelines"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The main job: reads 64,000 synthetic images (made in data/images on
    /// the first run), preprocesses them and runs an ONNX model over them
    /// (the project's own convnet, made in data/models on the first run,
    /// or --model), writes out/embeddings and checks every output against
    /// the reference engine's answer, computed directly.
    Infer {
        /// Run it on this cluster (a driver's config naming the head, as
        /// configs/cluster.toml) instead of on an embedded node.
        #[arg(long)]
        cluster: Option<std::path::PathBuf>,
        /// Your own model: an ONNX file of one input taking the images'
        /// normalised pixels (12,288 f32 a row, 64 x 64 x 3 channels last).
        #[arg(long)]
        model: Option<std::path::PathBuf>,
    },
    /// Runs a pipeline of built-in operators and WGSL kernels written in TOML.
    Run {
        /// The pipeline file (see examples/pipelines/embed.toml).
        pipeline: std::path::PathBuf,
        /// Run it on this cluster (a driver's config naming the head, as
        /// configs/cluster.toml) instead of on an embedded node.
        #[arg(long)]
        cluster: Option<std::path::PathBuf>,
        /// Write the job's timeline here, in the Chrome trace format
        /// (Perfetto, chrome://tracing).
        #[arg(long)]
        timeline: Option<std::path::PathBuf>,
        /// Print the plan (logical plan, fused stages with their resources
        /// and pools, memory reserves) instead of running it.
        #[arg(long, conflicts_with = "timeline")]
        explain: bool,
        /// Resume a `write_parquet` sink's write that was killed part way:
        /// run only the source splits whose output it had not recorded
        /// (the plan and input must be unchanged; a first run with it is
        /// resumable too).
        #[arg(long, conflicts_with = "explain")]
        resume: bool,
    },
    /// Runs a cluster node configured by a TOML file (configs/head.toml,
    /// configs/worker.toml), until it is stopped (Ctrl-C, SIGTERM).
    Node {
        /// The node's config.
        #[arg(long)]
        config: std::path::PathBuf,
    },
    /// Draws a timeline written by `run --timeline` as a self-contained
    /// HTML page: slots busy per operator, store memory, pauses, lanes.
    Timeline {
        /// The Chrome trace (JSON).
        trace: std::path::PathBuf,
        /// The page to write.
        #[arg(short, long, default_value = "timeline.html")]
        output: std::path::PathBuf,
    },
    /// Sets up or inspects a cluster.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Runs one benchmark workload (docs/workloads.md) and prints its JSON line last.
    Bench {
        /// The workload.
        workload: Workload,
        /// The object store's capacity, as 300MiB, 4GiB or bytes.
        #[arg(long, value_parser = parse_size)]
        store_cap: Option<u64>,
        /// A node config file (TOML) for settings the workload does not fix.
        #[arg(long)]
        config: Option<std::path::PathBuf>,
        /// W4 only: run the embedding on the CPU, the GPU, or both.
        #[arg(long, value_enum, default_value_t = W4Devices::Both)]
        device: W4Devices,
        /// W4 only: the images to read, a directory (made with W4's 2,000
        /// images when absent) or an object store URL such as
        /// `s3://bucket/w4-images/` (read as it is; see the README for the
        /// credentials).
        #[arg(long, default_value = "data/w4-images")]
        input: String,
        /// W1, W2: print a JSON progress line each second (for tools/bench).
        #[arg(long)]
        progress_lines: bool,
        /// W3 only: rows of the one shape to run (with --partitions);
        /// without both, W3 runs its two shapes.
        #[arg(long, requires = "partitions")]
        rows: Option<u64>,
        /// W3 only: partitions of the one shape to run (with --rows).
        #[arg(long, requires = "rows")]
        partitions: Option<usize>,
        /// binary-files only: cut the files with `ops::chunk_binary` (a
        /// batch operator) or a row-level `flat_map`, a row per piece.
        #[arg(long, value_enum, default_value_t = FilesApi::Chunk)]
        api: FilesApi,
        /// W5, W6b: the numbers of CPU nodes to run with, one run each.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
        nodes: Vec<usize>,
        /// W5 only: at each N, a clean run and a run with one CPU node
        /// killed half-way; prints both times and the bound it must meet.
        #[arg(long)]
        kill_one: bool,
        /// W5 --kill-one only: every node's `node_timeout_ms` (how soon a
        /// silent node is lost; default 5000).
        #[arg(long, requires = "kill_one")]
        node_timeout_ms: Option<u32>,
        /// W6a only: each trainer's step per batch of 64, in milliseconds
        /// (a logical GPU; the default makes the trainers the bound on 2
        /// cores).
        #[arg(long, default_value_t = workloads::W6A_STEP_MS)]
        step_ms: u64,
        /// W6a, W6b: run as one of the workload's trainer processes, with
        /// the spec its driver gave (the driver starts them).
        #[arg(long, hide = true)]
        trainer: Option<String>,
        /// W7 only: the engine that runs the model (auto: ONNX Runtime
        /// where its library is found, else rten).
        #[arg(long, value_enum, default_value_t = EngineArg::Auto)]
        engine: EngineArg,
        /// W7 only: CPU slots the model's stage asks for, its sessions'
        /// threads (default: all the node's).
        #[arg(long)]
        model_cpus: Option<f64>,
        /// W1, W2, W3, S1: record the timed job's timeline and write it here
        /// (W3's second shape to PATH with `-2` before its extension).
        /// Without it the workloads run with `record_timeline = false`, so
        /// the two runs measure what recording costs.
        #[arg(long)]
        timeline: Option<std::path::PathBuf>,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Writes a new cluster CA and a certificate and key per node into DIR
    /// (keys readable by their owner only).
    Init {
        /// The directory (made 0700).
        dir: std::path::PathBuf,
        /// The nodes' names, comma-separated; each gets NAME.pem and NAME.key.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "head,worker-1,worker-2,worker-3,driver"
        )]
        nodes: Vec<String>,
    },
    /// Lists the cluster's nodes with their slots and stores.
    Status {
        /// A config naming the head and this driver's TLS files
        /// (configs/cluster.toml).
        #[arg(long)]
        config: std::path::PathBuf,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FilesApi {
    Chunk,
    Rows,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EngineArg {
    Auto,
    Onnxruntime,
    Rten,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum W4Devices {
    Cpu,
    Gpu,
    Both,
}

#[derive(Clone, Copy, ValueEnum)]
enum Workload {
    W1,
    W2,
    W3,
    /// Batch inference: the embedding on the CPU and, where an adapter
    /// exists, on the GPU, in one run; the last line gives the ratio.
    W4,
    /// The object store's put and get against memcpy.
    Store,
    /// Scale-out: N CPU nodes feeding a GPU node, each a process (--nodes).
    W5,
    /// Moving a partition between two nodes: over QUIC against a bare quinn
    /// stream, and by shared memory (1 MiB against 1 GiB).
    Net,
    /// 5 files of 200 MiB among 200 small ones read whole and cut into
    /// 64 KiB pieces on 2 CPU slots (data/binary-files, made if absent);
    /// the figure is peak RSS against the store cap (default 256 MiB).
    BinaryFiles,
    /// The H2O db-benchmark's groupby questions 1-5 on its 10-million-row
    /// table (data/g1: `tools/bench/g1.py make data/g1`).
    G1,
    /// TPC-H-shaped lineitem (6M rows) joined with orders (1.5M), revenue
    /// by priority (data/j1: `tools/bench/j1.py make data/j1`).
    J1,
    /// 40M rows of 100 bytes sorted by a 10-byte key through a 512 MiB
    /// store, written as Parquet (data/s1: `tools/bench/s1.py make
    /// data/s1`; `tools/bench/s1.py run streambatch data/s1` checks it).
    S1,
    /// S1 on 3 node processes on 127.0.0.1, clean and then with one node
    /// SIGKILLed mid-exchange (`tools/bench/s1.py run streambatch-cluster
    /// data/s1` checks the second run's output).
    #[value(name = "s1-cluster")]
    S1Cluster,
    /// Training ingest: 8,000 JPEGs decoded, cropped, flipped and
    /// normalised, split equally between two trainer processes, 2 epochs.
    W6a,
    /// Training ingest on a cluster: N CPU-only nodes (--nodes) whose
    /// decode is a fixed sleep per image feeding two trainer processes.
    W6b,
    /// Model batch inference: 2,000 JPEGs decoded, resized to 224 and
    /// normalised, through a ResNet-50 ONNX model (data/w7, made if
    /// absent), the class scores written to out/w7-streambatch.
    W7,
    /// The scheduler alone: the job state machine and policy driven by the
    /// fault simulation on 1,000 virtual nodes (tasks that take no time,
    /// nodes lost, joining and draining), five runs; the figure is tasks
    /// per second (the median run), each run's rows checked exactly once.
    Sched,
}

fn main() {
    // Before anything else (no other thread runs yet): without a runtime
    // directory, Mesa's drivers print an error line whenever the GPU
    // adapters are listed, twice on every node.
    // SAFETY: the first statement of `main`; this process has one thread.
    unsafe { streambatch::use_private_runtime_dir() };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Errors of the cluster commands, which are not a dataset's errors.
type AnyError = Box<dyn std::error::Error + Send + Sync>;

fn run(cli: Cli) -> Result<(), AnyError> {
    match cli.command {
        Command::Node { config } => streambatch::run_node(&config, &workloads::registry()),
        Command::Cluster(ClusterCommand::Init { dir, nodes }) => {
            let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
            streambatch::init_cluster(&dir, &names)?;
            println!(
                "wrote a cluster CA and certificates for {} into {}",
                names.join(", "),
                dir.display()
            );
            Ok(())
        }
        Command::Cluster(ClusterCommand::Status { config }) => {
            let settings = NodeConfig::load(Some(&config))?;
            let client = streambatch::ClusterClient::connect(&settings, Some(&config))?;
            let members = client.members()?;
            println!(
                "{:<12} {:>6} {:>6} {:>10}  address",
                "node", "cpus", "gpus", "store"
            );
            for n in &members.nodes {
                println!(
                    "{:<12} {:>6} {:>6} {:>10}  {}",
                    n.name,
                    n.cpus,
                    n.gpus,
                    streambatch::format_bytes(n.store_capacity),
                    n.addr
                );
            }
            Ok(())
        }
        Command::Timeline { trace, output } => {
            streambatch::timeline::write_page(&trace, &output)?;
            println!("wrote {}", output.display());
            Ok(())
        }
        other => Ok(run_job(other)?),
    }
}

fn run_job(command: Command) -> streambatch::Result<()> {
    match command {
        Command::Infer { cluster, model } => infer::run(cluster.as_deref(), model.as_deref()),
        Command::Run {
            pipeline,
            cluster,
            timeline,
            explain,
            resume,
        } => {
            if explain {
                let plan = streambatch::pipeline::explain_pipeline(&pipeline, cluster.as_deref())?;
                println!("{plan}");
                return Ok(());
            }
            let pipeline = streambatch::pipeline::Pipeline::load(&pipeline, cluster.as_deref())?;
            // On a cluster the GPU nodes' adapters run the kernels.
            if cluster.is_none() && !pipeline.kernels().is_empty() {
                say_where_kernels_run(pipeline.kernels());
            }
            let run = match resume {
                true => pipeline.run_resuming()?,
                false => pipeline.run()?,
            };
            if let Some(stats) = run.stats {
                if let Some(path) = &timeline {
                    streambatch::timeline::write(&stats, path)?;
                    println!("timeline: {}", path.display());
                }
                println!("{stats}");
            }
            println!("{}", run.summary);
            Ok(())
        }
        Command::Bench {
            workload,
            store_cap,
            config,
            device,
            input,
            api,
            progress_lines,
            rows,
            partitions,
            nodes,
            kill_one,
            node_timeout_ms,
            timeline,
            step_ms,
            trainer,
            engine,
            model_cpus,
        } => {
            if let Some(spec) = trainer {
                return workloads::w6_trainer(&spec);
            }
            let base = NodeConfig {
                record_timeline: timeline.is_some(),
                ..NodeConfig::load(config.as_deref())?
            };
            let mut progress = workloads::ProgressLines::new(progress_lines);
            let results = match workload {
                Workload::W1 => vec![workloads::w1(
                    store_cap.unwrap_or(300 << 20),
                    &base,
                    &mut progress,
                )?],
                Workload::W2 => vec![workloads::w2(
                    store_cap.unwrap_or(512 << 20),
                    &base,
                    &mut progress,
                )?],
                Workload::W4 => {
                    let data = std::path::Path::new(&input);
                    let run = |d, out: &str| match streambatch::object_url(data) {
                        Some(_) => workloads::w4_on(d, data, std::path::Path::new(out), &base),
                        None => workloads::w4(d, data, std::path::Path::new(out), &base),
                    };
                    if device == W4Devices::Gpu && streambatch::GpuPool::global().is_empty() {
                        return Err(streambatch::Error::Invalid(
                            "no GPU adapter found for `--device gpu`".into(),
                        ));
                    }
                    let cpu = if device == W4Devices::Gpu {
                        None
                    } else {
                        Some(run(workloads::Device::Cpu, "out/w4-cpu")?)
                    };
                    if let Some(cpu) = &cpu {
                        println!("{}", cpu.to_json());
                    }
                    if device == W4Devices::Cpu {
                        return Ok(());
                    }
                    if streambatch::GpuPool::global().is_empty() {
                        eprintln!("no GPU adapter: W4 ran on the CPU only");
                        return Ok(());
                    }
                    let gpu = run(workloads::Device::Gpu, "out/w4-gpu")?;
                    println!("{}", gpu.to_json());
                    let Some(cpu) = cpu else { return Ok(()) };
                    let rate = |r: &workloads::BenchResult| r.rows as f64 / r.wall.as_secs_f64();
                    let summary = serde_json::json!({
                        "workload": "w4",
                        "system": "streambatch",
                        "config": "gpu_vs_cpu",
                        "gpu_rows_per_s": rate(&gpu),
                        "cpu_rows_per_s": rate(&cpu),
                        "gpu_to_cpu": rate(&gpu) / rate(&cpu),
                        "correct": gpu.correct && cpu.correct,
                    });
                    println!("{summary}");
                    return Ok(());
                }
                Workload::W5 => {
                    let dir = base.spill_dir.join("w5");
                    for n in nodes {
                        if kill_one {
                            let r =
                                workloads::w5_kill_one(n, &dir, &mut progress, node_timeout_ms)?;
                            println!("{r}");
                            continue;
                        }
                        let r = workloads::w5(n, &dir, &mut progress)?;
                        println!("{}", r.to_json());
                        progress = workloads::ProgressLines::new(progress_lines);
                    }
                    return Ok(());
                }
                Workload::W6a => {
                    let base = NodeConfig {
                        store_capacity: store_cap.unwrap_or(workloads::W6A_STORE_CAP),
                        ..base.clone()
                    };
                    let step = std::time::Duration::from_millis(step_ms);
                    let data = std::path::Path::new("data/w6-images");
                    vec![workloads::w6a(data, step, &base)?]
                }
                Workload::W7 => {
                    let engine = match engine {
                        EngineArg::Auto => streambatch::onnx::Engine::Auto,
                        EngineArg::Onnxruntime => streambatch::onnx::Engine::OnnxRuntime,
                        EngineArg::Rten => streambatch::onnx::Engine::Rten,
                    };
                    let cpus = model_cpus.unwrap_or(base.cpus);
                    let base = NodeConfig {
                        store_capacity: store_cap.unwrap_or(workloads::W7_STORE_CAP),
                        ..base.clone()
                    };
                    let (data, out) = ("data/w7", "out/w7-streambatch");
                    let (data, out) = (std::path::Path::new(data), std::path::Path::new(out));
                    vec![workloads::w7(data, out, engine, cpus, &base)?]
                }
                Workload::G1 => {
                    let base = NodeConfig {
                        store_capacity: store_cap.unwrap_or(1 << 30),
                        ..base.clone()
                    };
                    vec![workloads::g1(std::path::Path::new("data/g1"), &base)?]
                }
                Workload::J1 => {
                    let base = NodeConfig {
                        store_capacity: store_cap.unwrap_or(1 << 30),
                        ..base.clone()
                    };
                    vec![workloads::j1(std::path::Path::new("data/j1"), &base)?]
                }
                Workload::S1 => {
                    let base = NodeConfig {
                        store_capacity: store_cap.unwrap_or(512 << 20),
                        ..base.clone()
                    };
                    let data = std::path::Path::new("data/s1");
                    let (input, output) = (data.join("input"), data.join("out-streambatch"));
                    vec![workloads::s1(&input, &output, &base, timeline.as_deref())?]
                }
                Workload::S1Cluster => {
                    let data = std::path::Path::new("data/s1");
                    let (input, output) =
                        (data.join("input"), data.join("out-streambatch-cluster"));
                    let dir = base.spill_dir.join("s1");
                    vec![workloads::s1_cluster(&input, &output, &dir)?]
                }
                Workload::W6b => {
                    let dir = base.spill_dir.join("w6b");
                    for n in nodes {
                        println!("{}", workloads::w6b(n, &dir)?.to_json());
                    }
                    return Ok(());
                }
                Workload::BinaryFiles => vec![workloads::binary_files(
                    std::path::Path::new("data/binary-files"),
                    store_cap.unwrap_or(256 << 20),
                    match api {
                        FilesApi::Chunk => workloads::FilesApi::Chunk,
                        FilesApi::Rows => workloads::FilesApi::Rows,
                    },
                    &base,
                    &mut progress,
                )?],
                Workload::Sched => {
                    println!("{}", sched_bench()?);
                    return Ok(());
                }
                Workload::Net => {
                    std::fs::create_dir_all(&base.spill_dir)
                        .map_err(|e| streambatch::Error::io("creating", &base.spill_dir, e))?;
                    println!("{}", workloads::net_bench(&base.spill_dir)?);
                    return Ok(());
                }
                Workload::Store => {
                    std::fs::create_dir_all(&base.spill_dir)
                        .map_err(|e| streambatch::Error::io("creating", &base.spill_dir, e))?;
                    let line = workloads::store_bench(64 << 20, 1 << 30, &base.spill_dir)?;
                    println!("{line}");
                    return Ok(());
                }
                Workload::W3 => {
                    let base = NodeConfig {
                        store_capacity: store_cap.unwrap_or(base.store_capacity),
                        ..base
                    };
                    match rows.zip(partitions) {
                        Some((rows, partitions)) => vec![workloads::w3(rows, partitions, &base)?],
                        None => vec![
                            workloads::w3(200_000, 200, &base)?,
                            workloads::w3(20_000, 2_000, &base)?,
                        ],
                    }
                }
            };
            for (i, r) in results.iter().enumerate() {
                if let Some(path) = &timeline {
                    let path = numbered(path, i);
                    streambatch::timeline::write(&r.stats, &path)?;
                    eprintln!("timeline: {}", path.display());
                }
                println!("{}", r.to_json());
            }
            Ok(())
        }
        Command::Node { .. } | Command::Cluster(_) | Command::Timeline { .. } => {
            unreachable!("handled by run")
        }
    }
}

/// `bench sched`: the 1,000-node fault simulation five times (after one
/// untimed run), as one JSON line: the median run's tasks/s, and `correct`
/// when every run ended with each source row read exactly once.
fn sched_bench() -> streambatch::Result<String> {
    use streambatch_sched::sim;
    let scenario = sim::Scenario::wide(1_000, 40_000);
    let run = || {
        sim::run(&scenario)
            .map_err(|e| streambatch::Error::Invalid(format!("the simulated job failed: {e}")))
    };
    run()?;
    let mut runs = Vec::new();
    let mut correct = true;
    for _ in 0..5 {
        let run = run()?;
        correct &= run.check_exactly_once().is_ok();
        runs.push(run);
    }
    let mut rates: Vec<f64> = runs.iter().map(|r| r.tasks_per_s()).collect();
    rates.sort_by(f64::total_cmp);
    let median = rates[rates.len() / 2];
    Ok(serde_json::json!({
        "workload": "sched",
        "system": "streambatch",
        "config": "1,000 virtual nodes",
        "tasks": runs[0].tasks,
        "tasks_per_s": median.round(),
        "tasks_per_s_runs": rates.iter().map(|r| r.round()).collect::<Vec<_>>(),
        "correct": correct,
    })
    .to_string())
}

/// Before a pipeline with WGSL kernels runs on this process's adapters:
/// which adapter runs them, and a warning where it is a software one (Mesa's
/// lavapipe runs the kernel on the CPU, thousands of times slower than a
/// GPU: a large input takes minutes).
fn say_where_kernels_run(kernels: &[String]) {
    let names = kernels.join(", ");
    let pool = streambatch::GpuPool::global();
    let adapters = pool.labels();
    if adapters.is_empty() {
        eprintln!("warning: no GPU adapter found: kernel {names} cannot run");
        return;
    }
    println!("kernel {names} runs on {}", adapters.join(", "));
    if !pool.has_hardware() {
        eprintln!(
            "warning: {} is a software adapter: it runs the kernel on the CPU, \
             at about {LAVAPIPE_ROWS_PER_S} rows/s for the shipped embedding on 2 cores \
             (examples/pipelines/embed.toml: 1,000 images in {LAVAPIPE_EMBED_S} s); \
             a hardware GPU runs it in well under a second. For larger inputs on this \
             machine, the CPU embedder (cargo run --release -- infer) \
             is faster.",
            adapters.join(", ")
        );
    }
}

/// lavapipe's rate for the shipped embedding kernel, measured on 2 cores:
/// 53 and 42 rows/s (release build), 34 (debug build), 1,000 images; 28
/// on a 2-core AMD EPYC machine (LLVM 15, 2026-12-03).
const LAVAPIPE_ROWS_PER_S: &str = "30 to 50";
/// `streambatch run examples/pipelines/embed.toml` on lavapipe, 2 cores:
/// 19.7 and 24.3 s wall (release build, other builds running; 240 MiB peak
/// RSS), 8.8 s with nothing beside it, 30.2 s (debug); 34.6 and 36.2 s on
/// the EPYC machine above.
const LAVAPIPE_EMBED_S: &str = "10 to 40";

/// `path` for the first of several outputs; `name-2.ext` for the second.
fn numbered(path: &std::path::Path, i: usize) -> std::path::PathBuf {
    if i == 0 {
        return path.to_path_buf();
    }
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = match path.extension() {
        Some(ext) => format!("{stem}-{}.{}", i + 1, ext.to_string_lossy()),
        None => format!("{stem}-{}", i + 1),
    };
    path.with_file_name(name)
}
