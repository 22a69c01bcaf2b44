//! The `streambatch` command: `streambatch bench <w1|w3> [--store-cap SIZE]`.

use clap::{Parser, Subcommand, ValueEnum};
use streambatch::{NodeConfig, parse_size, workloads};

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
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Workload {
    W1,
    W3,
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
        Command::Bench {
            workload,
            store_cap,
            config,
        } => {
            let base = NodeConfig::load(config.as_deref())?;
            let results = match workload {
                Workload::W1 => vec![workloads::w1(store_cap.unwrap_or(300 << 20), &base)?],
                Workload::W3 => {
                    let base = NodeConfig {
                        store_capacity: store_cap.unwrap_or(base.store_capacity),
                        ..base
                    };
                    vec![
                        workloads::w3(200_000, 200, &base)?,
                        workloads::w3(20_000, 2_000, &base)?,
                    ]
                }
            };
            for r in results {
                println!("{}", r.to_json());
            }
            Ok(())
        }
    }
}
