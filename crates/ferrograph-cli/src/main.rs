//! The `ferrograph` command-line tool.

mod demo;

/// Graph runs allocate many small, short-lived objects; mimalloc handles them several times
/// faster than the system allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
mod print;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;

/// Agent graphs on supervised actors, on one machine.
#[derive(Parser, Debug)]
#[command(name = "ferrograph", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs a workflow and prints its events and final state.
    Run {
        /// Workflow name (`demo`).
        workflow: String,
        /// Input file (`-` for standard input). The demo reads commit subjects, one per line.
        #[arg(long)]
        input: Option<String>,
        /// Thread id.
        #[arg(long)]
        thread: Option<String>,
        /// Print events as they happen.
        #[arg(long)]
        stream: bool,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Graph overhead: a 10-node chain and a 100-way fan-out with a join.
    Graph {
        /// Print JSON (the format `benches/peers/compare_graph.py` reads).
        #[arg(long)]
        json: bool,
        /// Shorter measurement (about 0.3 s per configuration instead of 2.5 s).
        #[arg(long)]
        quick: bool,
        /// Measure exactly this many runs per configuration (for instruction-count profiling).
        #[arg(long)]
        runs: Option<usize>,
    },
}

fn read_input(path: Option<&str>) -> Result<Option<String>> {
    match path {
        None => Ok(None),
        Some("-") => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading standard input")?;
            Ok(Some(s))
        }
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("reading input file {p}"))
            .map(Some),
    }
}

async fn run(
    workflow: &str,
    input: Option<String>,
    thread: Option<String>,
    stream: bool,
) -> Result<ExitCode> {
    match workflow {
        "demo" => demo::run(input, thread, stream).await,
        other => anyhow::bail!("unknown workflow `{other}` (available: demo)"),
    }
}

async fn bench_graph(json: bool, quick: bool, runs: Option<usize>) -> Result<()> {
    let budget = match runs {
        Some(n) => ferrograph_benches::Budget::Runs(n),
        None if quick => ferrograph_benches::Budget::Time(Duration::from_millis(300)),
        None => ferrograph_benches::Budget::Time(Duration::from_millis(2500)),
    };
    let results = ferrograph_benches::measure_all(budget).await?;
    if json {
        let doc = serde_json::json!({
            "engine": "ferrograph",
            "version": env!("CARGO_PKG_VERSION"),
            "results": results,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!(
            "| graph | checkpointer | µs/node step | µs/run | p50 µs/run | p99 µs/run | runs |"
        );
        println!("|---|---|---:|---:|---:|---:|---:|");
        for r in results {
            println!(
                "| {} | {} | {:.2} | {:.1} | {:.1} | {:.1} | {} |",
                r.graph,
                r.checkpointer,
                r.us_per_node_step,
                r.us_per_run,
                r.p50_us_per_run,
                r.p99_us_per_run,
                r.runs
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FERROGRAPH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut builder = match std::env::var("FERROGRAPH_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(0) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = rt.block_on(async {
        match cli.command {
            Command::Run {
                workflow,
                input,
                thread,
                stream,
            } => {
                let input = read_input(input.as_deref())?;
                run(&workflow, input, thread, stream).await
            }
            Command::Bench {
                what: BenchCommand::Graph { json, quick, runs },
            } => bench_graph(json, quick, runs)
                .await
                .map(|_| ExitCode::SUCCESS),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
