//! The `streambatch` command: `streambatch run pipeline.toml`, and
//! `streambatch bench <w1|w2|w3|w4|store> [--store-cap SIZE]` (the
//! workloads live in `streambatch-bench`).

use clap::{Parser, Subcommand, ValueEnum};
use streambatch::{NodeConfig, parse_size};
use streambatch_bench as workloads;

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
    /// Runs a pipeline of built-in operators and WGSL kernels written in TOML.
    Run {
        /// The pipeline file (see examples/pipelines/embed.toml).
        pipeline: std::path::PathBuf,
    },
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
    },
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
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> streambatch::Result<()> {
    match cli.command {
        Command::Run { pipeline } => {
            let run = streambatch::pipeline::run_pipeline(&pipeline)?;
            if let Some(stats) = run.stats {
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
            progress_lines,
            rows,
            partitions,
        } => {
            let base = NodeConfig::load(config.as_deref())?;
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
                    let data = std::path::Path::new("data/w4-images");
                    let run =
                        |d, out: &str| workloads::w4(d, data, std::path::Path::new(out), &base);
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
            for r in results {
                println!("{}", r.to_json());
            }
            Ok(())
        }
    }
}
