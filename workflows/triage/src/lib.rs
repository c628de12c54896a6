//! The `triage` workflow: seed 001's five-agent bug triage, offline.
//!
//! ```text
//!            ┌──────────── supervisor ◄──────────────┐
//! START ───► │ routes on findings and the critic's    │
//!            │ gate, with an iteration cap            │
//!            └─┬──────┬───────────┬────────┬──────┬──┘
//!      investigator web_search codebase_search critic writer ──► (supervisor) ──► publish ──► END
//! ```
//!
//! - **investigator**: hypothesis, affected areas, search keywords, and the issue's error
//!   messages verbatim (constrained to the issue's own lines).
//! - **web_search**: a tool-calling model asks for `docs_search` calls over the offline docs
//!   corpus, the tool executor runs them (tool events), a separate structured call
//!   synthesises the finding.
//! - **codebase_search**: the retriever over the repository's index (built on first use,
//!   reused after) answers several queries; the model picks files and the root-cause region
//!   among what was retrieved.
//! - **critic**: CONFIRMED / UNCERTAIN / CHALLENGED, gaps, confidence adjustment; mapped in
//!   code to the APPROVED / REJECTED gate the supervisor routes on.
//! - **writer**: report, Markdown comment and ticket fields from three parallel sub-calls,
//!   merged.
//! - **publish**: writes `triage-report.json` and `triage-report.md` to the output folder;
//!   the workflow writes the full event trace to `events.jsonl` beside them.
//!
//! Every model call is structured (constrained on local models), retried only on retryable
//! errors, then given one fallback (see [`llm`], the chat crate's `agent` module). Run it with
//! `ferrograph run triage --issue FILE --repo DIR [--docs DIR] [--out DIR]`.

pub mod agents;
pub mod check;
pub mod eval;
pub mod evidence;
/// The agents' model calls: the chat crate's [`ferrograph::chat::agent`], shared with the
/// other workflows.
pub mod llm {
    pub use ferrograph::chat::agent::{constrain_to, AgentLlm};
}
pub mod models;
pub mod report;
pub mod retrieval;
pub mod state;

use async_trait::async_trait;
use ferrograph::core::stream::StreamMode;
use ferrograph::prelude::*;
use ferrograph::runtime::{JsonInput, JsonOutcome, JsonRun, JsonSnapshot, Workflow, WorkflowInfo};
use ferrograph::WorkflowSettings;
use ferrograph::{CheckpointSaver, CompileError};
use serde_json::{json, Value};
use state::agent;
pub use state::{TriageState, TriageStateUpdate};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Settings of the triage workflow.
#[derive(Clone)]
pub struct TriageSettings {
    /// Data directory: indexes under `triage/indexes`, default outputs under `triage/runs`.
    pub data_dir: PathBuf,
    /// The model calls (`None`: every agent reports that no model is configured).
    pub llm: Option<llm::AgentLlm>,
    /// Most agent iterations.
    pub max_iterations: u32,
    /// Most investigation rounds (a critic rejection starts the next).
    pub max_rounds: u32,
    /// Per docs-search tool call.
    pub tool_timeout: Duration,
    /// Makes the embedder of the indexes.
    pub embedder: retrieval::EmbedderFactory,
    /// People a ticket may be assigned to (`FERROGRAPH_TRIAGE_TEAM`, comma-separated; empty:
    /// no assignee is suggested).
    pub team: Vec<String>,
    /// Labels a ticket may carry (`FERROGRAPH_TRIAGE_LABELS`, comma-separated; default
    /// [`agents::DEFAULT_LABELS`]).
    pub labels: Vec<String>,
}

/// A comma-separated list from the environment variable `name` (empty when unset).
fn env_list(name: &str) -> Vec<String> {
    std::env::var(name)
        .map(|v| {
            v.split(',')
                .map(|x| x.trim().to_string())
                .filter(|x| !x.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

impl TriageSettings {
    /// From the shared workflow settings: the configured model with the fallback model (or
    /// the same model with another sampling configuration), 12 iterations, 2 rounds.
    pub fn from_workflow_settings(w: &WorkflowSettings) -> Self {
        TriageSettings {
            data_dir: w.data_dir.clone(),
            llm: w
                .llm_for("triage")
                .map(|m| llm::AgentLlm::new(m, w.fallback_llm.clone())),
            max_iterations: w.max_steps.unwrap_or(12),
            max_rounds: 2,
            tool_timeout: w.tool_timeout.unwrap_or(Duration::from_secs(30)),
            embedder: retrieval::minilm(),
            team: env_list("FERROGRAPH_TRIAGE_TEAM"),
            labels: {
                let l = env_list("FERROGRAPH_TRIAGE_LABELS");
                if l.is_empty() {
                    agents::default_labels()
                } else {
                    l
                }
            },
        }
    }
}

/// The graph.
pub fn graph(settings: &TriageSettings) -> Result<CompiledGraph<TriageState>, CompileError> {
    let agents = Arc::new(agents::Agents {
        llm: settings.llm.clone(),
        retrieval: retrieval::Retrieval::new(
            settings.data_dir.join("triage").join("indexes"),
            settings.embedder.clone(),
        ),
        tool_timeout: settings.tool_timeout,
        team: settings.team.clone(),
        labels: settings.labels.clone(),
    });
    let (max_iterations, max_rounds) = (settings.max_iterations, settings.max_rounds);
    let default_out = settings.data_dir.join("triage").join("runs");
    let mut g = StateGraph::<TriageState>::new("triage").add_node(
        "supervisor",
        move |s: Arc<TriageState>, ctx: NodeContext| async move {
            supervisor(&s, &ctx, max_iterations, max_rounds).await
        },
    );
    for name in agent::ALL {
        let a = agents.clone();
        g = g
            .add_node(name, move |s: Arc<TriageState>, ctx: NodeContext| {
                let a = a.clone();
                async move { a.run(name, s, ctx).await }
            })
            .add_edge(name, "supervisor");
    }
    g.add_node(
        agent::PUBLISH,
        move |s: Arc<TriageState>, ctx: NodeContext| {
            let out = default_out.clone();
            async move { publish(&s, &ctx, &out).await }
        },
    )
    .add_edge(START, "supervisor")
    .add_conditional_edges(
        "supervisor",
        |s: &TriageState| s.next.clone(),
        [
            agent::INVESTIGATOR,
            agent::WEB_SEARCH,
            agent::CODEBASE_SEARCH,
            agent::CRITIC,
            agent::WRITER,
            agent::PUBLISH,
        ],
    )
    .add_edge(agent::PUBLISH, END)
    .compile()
}

async fn supervisor(
    s: &TriageState,
    ctx: &NodeContext,
    max_iterations: u32,
    max_rounds: u32,
) -> Result<TriageStateUpdate, NodeError> {
    let mut view = s.clone();
    let mut upd = TriageStateUpdate::new();
    if view.round == 0 {
        view.round = 1;
        view.max_iterations = if view.max_iterations == 0 {
            max_iterations
        } else {
            view.max_iterations
        };
        view.max_rounds = if view.max_rounds == 0 {
            max_rounds
        } else {
            view.max_rounds
        };
        view.status = "RUNNING".into();
        upd = upd
            .round(1u32)
            .max_iterations(view.max_iterations)
            .max_rounds(view.max_rounds)
            .status(view.status.clone());
    }
    let r = agents::route(&view);
    tracing::info!(next = %r.next, round = r.round, reason = %r.reason, "supervisor");
    let _ = ctx
        .emit_custom(&json!({"event": "routing", "routing": r}))
        .await;
    if r.round != view.round {
        upd = upd.round(r.round);
    }
    Ok(upd.next(r.next.clone()).routing(vec![r]))
}

/// The output folder of a run: the one the input named, else `<data>/triage/runs/<thread>`.
fn out_dir_of(s: &TriageState, default_root: &std::path::Path, thread: Option<&str>) -> PathBuf {
    if s.out_dir.is_empty() {
        default_root.join(thread.unwrap_or("run"))
    } else {
        PathBuf::from(&s.out_dir)
    }
}

async fn publish(
    s: &TriageState,
    ctx: &NodeContext,
    default_root: &std::path::Path,
) -> Result<TriageStateUpdate, NodeError> {
    let dir = out_dir_of(s, default_root, ctx.thread_id());
    // A report without a codebase finding would rest on nothing: the run failed.
    let error = if s.writer.is_none() {
        Some(
            s.agent_runs
                .iter()
                .rev()
                .find(|r| r.agent == agent::WRITER)
                .and_then(|r| r.error.clone())
                .map(|e| format!("no report: the writer failed ({e})"))
                .unwrap_or_else(|| "no report was written".into()),
        )
    } else if s.codebase.is_none() {
        Some(
            s.agent_runs
                .iter()
                .rev()
                .find(|r| r.agent == agent::CODEBASE_SEARCH)
                .and_then(|r| r.error.clone())
                .map(|e| format!("the codebase search failed ({e})"))
                .unwrap_or_else(|| "the codebase search produced no finding".into()),
        )
    } else {
        None
    };
    let status = if error.is_none() {
        "COMPLETED"
    } else {
        "FAILED"
    };
    let mut fin = s.clone();
    fin.status = status.into();
    fin.error = error.clone();
    let files = state::ReportFiles {
        out_dir: dir.display().to_string(),
        json: dir.join("triage-report.json").display().to_string(),
        markdown: dir.join("triage-report.md").display().to_string(),
        events: dir.join("events.jsonl").display().to_string(),
    };
    let (json_doc, md) = (report::json(&fin), report::markdown(&fin));
    let f = files.clone();
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        std::fs::create_dir_all(&f.out_dir)?;
        write_atomic(
            &f.json,
            serde_json::to_string_pretty(&json_doc)
                .unwrap_or_default()
                .as_bytes(),
        )?;
        write_atomic(&f.markdown, md.as_bytes())
    })
    .await
    .map_err(|e| NodeError::failed(format!("writing the report panicked: {e}")))?
    .map_err(|e| NodeError::failed(format!("writing the report to {}: {e}", dir.display())))?;
    let _ = ctx
        .emit_custom(&json!({"event": "report_written", "files": files}))
        .await;
    Ok(TriageStateUpdate::new()
        .status(status.to_string())
        .error(error)
        .report_files(Some(files)))
}

fn write_atomic(path: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = format!("{path}.tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

/// The triage workflow behind JSON: the graph, plus the event trace written to
/// `events.jsonl` in the output folder (appended across resumes).
pub struct TriageWorkflow {
    runner: Arc<GraphRunner<TriageState>>,
    default_out: PathBuf,
}

impl TriageWorkflow {
    /// Loads the graph into `runtime` with `saver`.
    pub async fn load(
        runtime: &Runtime,
        saver: Arc<dyn CheckpointSaver>,
        settings: &TriageSettings,
    ) -> Result<Self, ferrograph::RegistryError> {
        let runner = runtime
            .load(graph(settings)?)
            .await?
            .with_checkpointer(saver);
        Ok(TriageWorkflow {
            runner: Arc::new(runner),
            default_out: settings.data_dir.join("triage").join("runs"),
        })
    }

    /// The typed runner.
    pub fn runner(&self) -> &GraphRunner<TriageState> {
        &self.runner
    }
}

fn mode_of(kind: &str) -> Option<StreamMode> {
    Some(match kind {
        "values" => StreamMode::Values,
        "updates" => StreamMode::Updates,
        "custom" | "tool" => StreamMode::Custom,
        "token" => StreamMode::Tokens,
        "task_start" | "task_end" => StreamMode::Tasks,
        "checkpoint" => StreamMode::Debug,
        _ => return None,
    })
}

#[async_trait]
impl Workflow for TriageWorkflow {
    fn info(&self) -> WorkflowInfo {
        Workflow::info(&*self.runner)
    }

    async fn run_task(
        &self,
        task: ferrograph::runtime::placement::RemoteTask,
        events: tokio::sync::mpsc::Sender<ferrograph::runtime::placement::RemoteEvent>,
    ) -> ferrograph::runtime::placement::RemoteOutcome {
        // Tasks placed here by another node's coordinator run on the typed graph.
        Workflow::run_task(&*self.runner, task, events).await
    }

    fn checkpointer(&self) -> Option<Arc<dyn CheckpointSaver>> {
        Workflow::checkpointer(&*self.runner)
    }

    async fn start(&self, input: JsonInput, mut config: RunConfig) -> Result<JsonRun, RunError> {
        let thread = config.thread_id.clone();
        // The thread id names the default output folder: checked before any folder is made
        // (`..` used to write outside the runs folder).
        if let Some(t) = &thread {
            ferrograph::core::id::check_thread_id(t)?;
        }
        // Where the trace goes: the input's output folder, else the saved state's, else the
        // default for this thread.
        let out = match &input {
            JsonInput::Update(v) => v.get("out_dir").and_then(Value::as_str).map(PathBuf::from),
            _ => None,
        };
        let out = match (out, &thread) {
            (Some(o), _) => Some(o),
            (None, Some(t)) => match self.runner.get_state(t, None).await {
                Ok(snap) if !snap.values.out_dir.is_empty() => {
                    Some(PathBuf::from(&snap.values.out_dir))
                }
                _ => Some(self.default_out.join(t)),
            },
            (None, None) => None,
        };
        let asked = config.stream;
        config.stream = asked
            .with(StreamMode::Updates)
            .with(StreamMode::Custom)
            .with(StreamMode::Tasks);
        let run = Workflow::start(&*self.runner, input, config).await?;
        let Some(out) = out else {
            return Ok(run);
        };
        let file = std::fs::create_dir_all(&out).and_then(|_| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(out.join("events.jsonl"))
        });
        let mut file = match file {
            Ok(f) => Some(std::io::BufWriter::new(f)),
            Err(e) => {
                tracing::warn!(folder = %out.display(), error = %e, "cannot write the event trace");
                None
            }
        };
        Ok(run.tee(move |ev| {
            if let Some(f) = file.as_mut() {
                let line = json!({"kind": ev.kind, "namespace": ev.namespace, "data": ev.data});
                let _ = writeln!(f, "{line}");
                let _ = f.flush();
            }
            match mode_of(ev.kind) {
                Some(m) => asked.contains(m),
                None => true,
            }
        }))
    }

    async fn invoke(&self, input: JsonInput, config: RunConfig) -> Result<JsonOutcome, RunError> {
        let mut run = self.start(input, config).await?;
        while run.next_event().await.is_some() {}
        run.outcome().await
    }

    async fn get_state(
        &self,
        thread: &str,
        checkpoint: Option<&str>,
    ) -> Result<JsonSnapshot, RunError> {
        Workflow::get_state(&*self.runner, thread, checkpoint).await
    }

    async fn history(&self, thread: &str) -> Result<Vec<JsonSnapshot>, RunError> {
        Workflow::history(&*self.runner, thread).await
    }

    async fn update_state(
        &self,
        thread: &str,
        update: Value,
        as_node: Option<&str>,
    ) -> Result<String, RunError> {
        Workflow::update_state(&*self.runner, thread, update, as_node).await
    }

    async fn update_state_at(
        &self,
        thread: &str,
        checkpoint: &str,
        update: Value,
        as_node: Option<&str>,
    ) -> Result<String, RunError> {
        Workflow::update_state_at(&*self.runner, thread, checkpoint, update, as_node).await
    }

    async fn fork(
        &self,
        thread: &str,
        checkpoint: &str,
        new_thread: &str,
    ) -> Result<String, RunError> {
        Workflow::fork(&*self.runner, thread, checkpoint, new_thread).await
    }
}

/// The input fields that name paths: the repository and the docs are read, the output folder
/// is written.
pub const INPUT_PATHS: &[ferrograph::runtime::InputPath] = &[
    ferrograph::runtime::InputPath::read("repository"),
    ferrograph::runtime::InputPath::read("docs_dir"),
    ferrograph::runtime::InputPath::output("out_dir"),
];

/// Reads an issue file: the first `# ` heading (or first line) is the title, the rest the
/// body.
pub fn issue_from_text(text: &str) -> (String, String) {
    let mut lines = text.lines();
    let mut title = String::new();
    for l in lines.by_ref() {
        let t = l.trim();
        if !t.is_empty() {
            title = t.trim_start_matches('#').trim().to_string();
            break;
        }
    }
    let body: Vec<&str> = lines.collect();
    (title, body.join("\n").trim().to_string())
}

/// Reads the input: a JSON object with the state's input fields, or an issue text (title and
/// body; the repository must then come from somewhere else).
pub fn parse_input(text: &str) -> Value {
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(v) if v.is_object() => v,
        _ => {
            let (title, body) = issue_from_text(text);
            json!({"issue_title": title, "issue_body": body})
        }
    }
}

/// A small built-in example (no repository: the codebase search reports it).
pub fn sample_input() -> Value {
    json!({
        "issue_title": "Invoice total goes negative with two discount codes",
        "issue_body": "ValueError: invoice total cannot be negative: -12.50",
    })
}

/// Reads `--issue FILE --repo DIR [--docs DIR] [--out DIR]` into the input.
pub fn parse_args(args: &[String]) -> Result<Value, String> {
    let mut input = serde_json::Map::new();
    let mut it = args.iter();
    let abs = |v: &str| {
        std::path::absolute(v)
            .unwrap_or_else(|_| PathBuf::from(v))
            .display()
            .to_string()
    };
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().cloned().ok_or(format!("{flag} needs a value"));
        match a.as_str() {
            "--issue" => {
                let p = value("--issue")?;
                let text = std::fs::read_to_string(&p).map_err(|e| format!("--issue {p}: {e}"))?;
                let (title, body) = issue_from_text(&text);
                if title.is_empty() {
                    return Err(format!("--issue {p}: the file is empty"));
                }
                input.insert("issue_title".into(), json!(title));
                input.insert("issue_body".into(), json!(body));
                input.insert("issue_url".into(), json!(abs(&p)));
            }
            "--repo" => {
                let p = value("--repo")?;
                if !std::path::Path::new(&p).is_dir() {
                    return Err(format!("--repo {p}: not a folder"));
                }
                input.insert("repository".into(), json!(abs(&p)));
            }
            "--docs" => {
                let p = value("--docs")?;
                if !std::path::Path::new(&p).is_dir() {
                    return Err(format!("--docs {p}: not a folder"));
                }
                input.insert("docs_dir".into(), json!(abs(&p)));
            }
            "--out" => {
                let p = value("--out")?;
                input.insert("out_dir".into(), json!(abs(&p)));
            }
            other => {
                return Err(format!(
                    "unknown argument `{other}` (triage takes --issue FILE --repo DIR [--docs DIR] [--out DIR])"
                ))
            }
        }
    }
    for (key, flag) in [
        ("issue_title", "--issue FILE"),
        ("repository", "--repo DIR"),
    ] {
        if !input.contains_key(key) {
            return Err(format!("triage needs {flag}"));
        }
    }
    Ok(Value::Object(input))
}

/// Loads the triage workflow (configured by `settings`) into `runtime` with `saver` as its
/// checkpointer, and adds it to `registry`.
pub async fn register(
    registry: &mut ferrograph::Registry,
    runtime: &Runtime,
    saver: Arc<dyn CheckpointSaver>,
    settings: &WorkflowSettings,
) -> Result<(), ferrograph::RegistryError> {
    let ts = TriageSettings::from_workflow_settings(settings);
    let wf = TriageWorkflow::load(runtime, saver, &ts).await?;
    registry.insert(
        "triage",
        ferrograph::Entry {
            workflow: Arc::new(wf),
            description:
                "bug triage: investigator, docs search, codebase retrieval, critic, writer",
            parse_input,
            sample_input,
            parse_args: Some(parse_args),
            input_paths: INPUT_PATHS,
        },
    );
    Ok(())
}
