//! The `fraud` workflow: seed 004's fraud investigation planner, offline.
//!
//! ```text
//! START → planner ─┬─ tool_executor → planner → …
//!                  └─ completion → END   (COMPLETE, or step_count ≥ max_steps)
//! ```
//!
//! - The planner asks the LLM for `{tool, reason, confidence}` (constrained to the registered
//!   tools), checks the seed's safety rules in code, and falls back to the deterministic
//!   sequence when the LLM is off, fails, times out or breaks a rule. Every decision is
//!   recorded with `used_fallback`.
//! - The tool executor runs the chosen tool from the [`ToolRegistry`](ferrograph_tools::ToolRegistry)
//!   under the per-tool timeout; failures and timeouts are recorded, not fatal.
//! - Completion computes the final confidence and severity and persists the investigation,
//!   the tool log, insights, recommendations and an audit entry in the [`store`].
//! - The whole run is limited by `max_runtime`: on expiry the state is saved with status
//!   `TIMED_OUT` (and can be resumed).
//!
//! Run it with `ferrograph run fraud --transaction TX-… [--data DIR]`.

pub mod data;
pub mod dataset;
pub mod features;
pub mod metrics;
pub mod planner;
pub mod similarity;
pub mod state;
pub mod store;
pub mod time;
pub mod tools;

use async_trait::async_trait;
use ferrograph::chat::{ChatModel, GenerateOptions};
use ferrograph::core::stream::NodeEventKind;
use ferrograph::prelude::*;
use ferrograph::runtime::{JsonInput, JsonOutcome, JsonRun, JsonSnapshot, Workflow, WorkflowInfo};
use ferrograph::WorkflowSettings;
use ferrograph::{CheckpointSaver, CompileError};
use ferrograph_tools::{ToolContext, ToolRegistry};
use serde_json::{json, Value};
use state::{status, ToolExecution, COMPLETE};
pub use state::{FeatureFlags, Investigation, InvestigationUpdate, Safeguards};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument as _;

/// Limits and switches of the fraud workflow.
#[derive(Clone)]
pub struct FraudSettings {
    /// Dataset folder used when the input names none.
    pub data_dir: PathBuf,
    /// Where finished investigations are stored.
    pub store_dir: PathBuf,
    /// Most planner steps (`FERROGRAPH_MAX_STEPS`).
    pub max_steps: u32,
    /// Whole-run limit (`FERROGRAPH_MAX_RUNTIME_SECONDS`).
    pub max_runtime: Duration,
    /// Per-tool limit (`FERROGRAPH_TOOL_TIMEOUT_SECONDS`).
    pub tool_timeout: Duration,
    /// Per planner LLM call.
    pub planner_timeout: Duration,
    /// The planner's and the reasoning tool's model (`None`: deterministic only).
    pub llm: Option<Arc<dyn ChatModel>>,
    /// Generation options for both.
    pub llm_options: GenerateOptions,
    /// Default feature flags (the input may override them).
    pub flags: FeatureFlags,
}

impl FraudSettings {
    /// Settings from the shared workflow settings.
    pub fn from_workflow_settings(w: &WorkflowSettings) -> Self {
        let d = Safeguards::default();
        FraudSettings {
            data_dir: w.data_dir.join("fraud").join("data"),
            store_dir: w.data_dir.join("fraud").join("store"),
            max_steps: w.max_steps.unwrap_or(d.max_steps),
            max_runtime: w
                .run_timeout
                .unwrap_or(Duration::from_secs_f64(d.investigation_timeout_seconds)),
            tool_timeout: w
                .tool_timeout
                .unwrap_or(Duration::from_secs_f64(d.tool_timeout_seconds)),
            planner_timeout: Duration::from_secs_f64(d.planner_timeout_seconds),
            llm: w.llm_for("fraud"),
            llm_options: GenerateOptions::greedy().max_tokens(96).max_context(1536),
            flags: FeatureFlags {
                planner_llm_enabled: w.llm_for("fraud").is_some(),
                reasoning_llm_enabled: w.llm_for("fraud").is_some(),
                ..FeatureFlags::default()
            },
        }
    }
}

struct Shared {
    settings: FraudSettings,
    tools: ToolFactory,
    /// Registries already made, by dataset folder: every planner and executor step needs one.
    registries: std::sync::Mutex<std::collections::HashMap<PathBuf, ToolRegistry>>,
}

impl Shared {
    fn data_dir(&self, s: &Investigation) -> PathBuf {
        if s.data_dir.is_empty() {
            self.settings.data_dir.clone()
        } else {
            PathBuf::from(&s.data_dir)
        }
    }

    fn registry(&self, s: &Investigation) -> Result<ToolRegistry, NodeError> {
        let dir = self.data_dir(s);
        // Only the default folder is generated on first use; a folder the input names must
        // hold a dataset already.
        if !s.data_dir.is_empty() && !dir.is_dir() {
            return Err(NodeError::fatal(format!(
                "the data folder {} does not exist (write a dataset there with `ferrograph fraud gen-data --out DIR`)",
                dir.display()
            )));
        }
        if let Some(r) = self
            .registries
            .lock()
            .ok()
            .and_then(|m| m.get(&dir).cloned())
        {
            return Ok(r);
        }
        let r = (self.tools)(&dir).map_err(NodeError::failed)?;
        if let Ok(mut m) = self.registries.lock() {
            m.insert(dir, r.clone());
        }
        Ok(r)
    }
}

/// How the tool registry is made for a dataset folder (tests swap tools in).
pub type ToolFactory = Arc<dyn Fn(&Path) -> Result<ToolRegistry, String> + Send + Sync>;

/// The standard factory: the six tools over the folder's dataset.
pub fn standard_tools(settings: &FraudSettings) -> ToolFactory {
    let llm = settings.llm.clone();
    let opts = settings.llm_options.clone();
    Arc::new(move |dir: &Path| {
        let data = data::FraudData::open(dir).map_err(|e| e.to_string())?;
        tools::registry(data, llm.clone(), opts.clone()).map_err(|e| e.to_string())
    })
}

fn severity_of(confidence: f64) -> &'static str {
    if confidence >= 0.85 {
        "CRITICAL"
    } else if confidence >= 0.65 {
        "HIGH"
    } else if confidence >= 0.4 {
        "MEDIUM"
    } else {
        "LOW"
    }
}

/// The graph, with `tools` making the registry.
pub fn graph_with(
    settings: FraudSettings,
    tools: ToolFactory,
) -> Result<CompiledGraph<Investigation>, CompileError> {
    let shared = Arc::new(Shared {
        settings,
        tools,
        registries: Default::default(),
    });
    let (p, e, c) = (shared.clone(), shared.clone(), shared);
    StateGraph::<Investigation>::new("fraud")
        .add_node("planner", move |s: Arc<Investigation>, ctx: NodeContext| {
            let sh = p.clone();
            async move { planner_node(&sh, s, ctx).await }
        })
        .add_node(
            "tool_executor",
            move |s: Arc<Investigation>, ctx: NodeContext| {
                let sh = e.clone();
                async move { executor_node(&sh, s, ctx).await }
            },
        )
        .add_node(
            "completion",
            move |s: Arc<Investigation>, _ctx: NodeContext| {
                let sh = c.clone();
                async move { completion_node(&sh, s).await }
            },
        )
        .add_edge(START, "planner")
        .add_conditional_edges(
            "planner",
            |s: &Investigation| {
                if s.next_action == COMPLETE || s.step_count >= s.max_steps {
                    "completion"
                } else {
                    "tool_executor"
                }
            },
            ["tool_executor", "completion"],
        )
        .add_edge("tool_executor", "planner")
        .add_edge("completion", END)
        .compile()
}

async fn planner_node(
    sh: &Shared,
    s: Arc<Investigation>,
    ctx: NodeContext,
) -> Result<InvestigationUpdate, NodeError> {
    let span = tracing::info_span!("agent.planner", investigation_id = %s.investigation_id, step_count = s.step_count);
    async move {
        let mut upd = InvestigationUpdate::new();
        // First entry (or a resume after a time-out): fill in identity, limits and flags.
        let mut view = (*s).clone();
        if s.investigation_id.is_empty() {
            let id = ctx
                .thread_id()
                .map(str::to_string)
                .unwrap_or_else(|| format!("inv-{}", &ferrograph::core::id::random_id()[..12]));
            view.investigation_id = id.clone();
            upd = upd.investigation_id(id);
        }
        // Also refuses a named data folder that does not exist.
        let registry = sh.registry(&view)?;
        if s.started_at.is_empty() {
            // An investigation of a transaction the dataset does not hold would "complete"
            // with an audit entry about nothing: refuse it before any step. (The dataset is
            // loaded once per folder and process; the registry above opened it.)
            let dir = sh.data_dir(&view);
            let data = data::FraudData::open(&dir).map_err(|e| NodeError::fatal(e.to_string()))?;
            if data.dataset.transaction(&s.transaction_id).is_none() {
                return Err(NodeError::fatal(format!(
                    "unknown transaction `{}`: the dataset in {} has no such id (`ferrograph fraud cases` lists some)",
                    s.transaction_id,
                    dir.display()
                )));
            }
            view.started_at = time::now_iso();
            upd = upd.started_at(view.started_at.clone());
        }
        if s.max_steps == 0 {
            view.max_steps = sh.settings.max_steps;
            view.safeguards = Safeguards {
                max_steps: sh.settings.max_steps,
                investigation_timeout_seconds: sh.settings.max_runtime.as_secs_f64(),
                tool_timeout_seconds: sh.settings.tool_timeout.as_secs_f64(),
                planner_timeout_seconds: sh.settings.planner_timeout.as_secs_f64(),
            };
            let f = &sh.settings.flags;
            view.feature_flags.planner_llm_enabled &= f.planner_llm_enabled;
            view.feature_flags.reasoning_llm_enabled &= f.reasoning_llm_enabled;
            view.feature_flags.vector_search_enabled &= f.vector_search_enabled;
            view.feature_flags.prompt_guard_enabled |= f.prompt_guard_enabled;
            upd = upd
                .max_steps(view.max_steps)
                .safeguards(view.safeguards.clone())
                .feature_flags(view.feature_flags.clone());
        }
        if s.severity.is_empty() {
            upd = upd.severity("LOW".to_string());
        }
        if s.status != status::IN_PROGRESS {
            upd = upd.status(status::IN_PROGRESS.to_string());
        }
        let tools: Vec<(String, String)> = registry
            .list()
            .into_iter()
            .map(|t| (t.name, t.description))
            .collect();
        let decision = planner::decide(
            &view,
            sh.settings.llm.as_deref(),
            &sh.settings.llm_options,
            &tools,
            sh.settings.planner_timeout,
        )
        .await;
        metrics::planner_decision(&decision.selected_tool, decision.used_fallback);
        tracing::info!(selected_tool = %decision.selected_tool, used_fallback = decision.used_fallback, "planner decision");
        let _ = ctx.emit_custom(&json!({"event": "planner_decision", "decision": decision})).await;
        Ok(upd
            .next_action(decision.selected_tool.clone())
            .step_count(decision.step)
            .planner_decisions(vec![decision]))
    }
    .instrument(span)
    .await
}

fn summarize_output(v: &Value) -> Value {
    let mut out = serde_json::Map::new();
    if let Some(obj) = v.as_object() {
        for (k, val) in obj {
            let short = match val {
                Value::Null => continue,
                Value::Array(a) if a.is_empty() => continue,
                Value::Array(a) => json!(format!("{} item(s)", a.len())),
                Value::Object(o) => {
                    let keys: Vec<&String> = o.keys().take(6).collect();
                    json!(keys)
                }
                other => other.clone(),
            };
            out.insert(k.clone(), short);
        }
    }
    Value::Object(out)
}

async fn executor_node(
    sh: &Shared,
    s: Arc<Investigation>,
    ctx: NodeContext,
) -> Result<InvestigationUpdate, NodeError> {
    let tool_name = s.next_action.clone();
    let span = tracing::info_span!("agent.tool", tool = %tool_name, investigation_id = %s.investigation_id);
    async move {
        let registry = sh.registry(&s)?;
        let timeout = sh.settings.tool_timeout;
        let call_id = format!("{}-{}", tool_name, s.step_count);
        ctx.emit(NodeEventKind::ToolStart {
            call_id: call_id.clone(),
            tool: tool_name.clone(),
        })
        .await;
        // Demonstration and crash-test knob: slow every tool down by this many milliseconds
        // (outside the tool's own timeout), so a run can be killed between tools.
        if let Some(ms) = std::env::var("FERROGRAPH_FRAUD_TOOL_DELAY_MS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let started = Instant::now();
        let args = json!({ "state": serde_json::to_value(&*s).map_err(NodeError::from)? });
        let tctx = ToolContext {
            call_id: call_id.clone(),
            tool: tool_name.clone(),
            node: "tool_executor".into(),
            thread_id: ctx.thread_id().map(str::to_string),
            timeout: Some(timeout),
            store: ctx.store().cloned(),
        };
        let result = match registry.get(&tool_name) {
            None => Err(("FAILED", format!("unknown tool `{tool_name}`"))),
            Some(tool) => match tokio::time::timeout(timeout, tool.call(args, &tctx)).await {
                Err(_) => Err((
                    "TIMED_OUT",
                    format!("Tool timed out after {}s", timeout.as_secs_f64()),
                )),
                Ok(Err(e)) => Err(("FAILED", e.to_string())),
                Ok(Ok(v)) => tools::findings(v.clone())
                    .map(|f| (f, v))
                    .map_err(|e| ("FAILED", format!("tool returned malformed findings: {e}"))),
            },
        };
        let elapsed = started.elapsed();
        let mut upd = InvestigationUpdate::new().completed_steps(vec![tool_name.clone()]);
        let (status_s, error, output_summary) = match result {
            Ok((f, raw)) => {
                if let Some(v) = f.context {
                    upd = upd.context(Json(v));
                }
                if let Some(v) = f.pattern_results {
                    upd = upd.pattern_results(Json(v));
                }
                if let Some(v) = f.similarity_results {
                    upd = upd.similarity_results(Json(v));
                }
                if let Some(v) = f.reasoning {
                    upd = upd.reasoning(Json(v));
                }
                if let Some(v) = f.recommendations {
                    upd = upd.recommendations(v.into_iter().map(Json).collect::<Vec<_>>());
                }
                if let Some(v) = f.rule_draft {
                    upd = upd.rule_draft(Some(Json(v)));
                }
                if !f.hypotheses.is_empty() {
                    upd = upd.hypotheses(f.hypotheses);
                }
                if !f.evidence.is_empty() {
                    upd = upd.evidence(f.evidence.into_iter().map(Json).collect::<Vec<_>>());
                }
                ("SUCCESS", None, summarize_output(&raw))
            }
            Err((st, msg)) => {
                tracing::warn!(tool = %tool_name, status = st, error = %msg, "tool did not succeed");
                (st, Some(msg), json!({}))
            }
        };
        metrics::tool_latency(&tool_name, status_s, elapsed.as_secs_f64());
        ctx.emit(NodeEventKind::ToolEnd {
            call_id,
            tool: tool_name.clone(),
            status: status_s.to_lowercase(),
            duration: elapsed,
        })
        .await;
        let exec = ToolExecution {
            tool_name: tool_name.clone(),
            input_summary: Json(json!({
                "transaction_id": s.transaction_id,
                "completed_steps": s.completed_steps,
            })),
            output_summary: Json(output_summary),
            execution_time_ms: elapsed.as_millis() as u64,
            status: status_s.to_string(),
            error_message: error,
            timestamp: time::now_iso(),
        };
        Ok(upd.tool_executions(vec![exec]))
    }
    .instrument(span)
    .await
}

async fn completion_node(
    sh: &Shared,
    s: Arc<Investigation>,
) -> Result<InvestigationUpdate, NodeError> {
    let span = tracing::info_span!("agent.completion", investigation_id = %s.investigation_id);
    async move {
        let confidence = (tools::evidence_score(&s) * 1000.0).round() / 1000.0;
        let severity = severity_of(confidence).to_string();
        let error = if s.next_action != COMPLETE && s.step_count >= s.max_steps {
            Some(format!(
                "step limit of {} reached before the planner chose COMPLETE",
                s.max_steps
            ))
        } else {
            s.error.clone()
        };
        let completed_at = time::now_iso();
        let mut fin = (*s).clone();
        fin.status = status::COMPLETED.to_string();
        fin.completed_at = Some(completed_at.clone());
        fin.confidence_score = confidence;
        fin.severity = severity.clone();
        fin.error = error.clone();
        let store = store::FraudStore::open(&sh.settings.store_dir)
            .map_err(|e| NodeError::failed(e.to_string()))?;
        let entry = tokio::task::spawn_blocking(move || store.persist(&fin, "investigation_completed"))
            .await
            .map_err(|e| NodeError::failed(format!("persisting panicked: {e}")))?
            .map_err(|e| NodeError::failed(e.to_string()))?;
        metrics::investigation_completed(status::COMPLETED, &severity, s.step_count);
        tracing::info!(severity = %severity, confidence, audit = ?entry.event, "investigation completed");
        Ok(InvestigationUpdate::new()
            .status(status::COMPLETED.to_string())
            .completed_at(Some(completed_at))
            .confidence_score(confidence)
            .severity(severity)
            .error(error))
    }
    .instrument(span)
    .await
}

/// The fraud workflow behind JSON: the graph plus the whole-run limit (status `TIMED_OUT`
/// with the state saved) and the planner-step limit translated into supersteps.
pub struct FraudWorkflow {
    runner: Arc<GraphRunner<Investigation>>,
    settings: FraudSettings,
}

impl FraudWorkflow {
    /// Loads the graph into `runtime` with `saver`.
    pub async fn load(
        runtime: &Runtime,
        saver: Arc<dyn CheckpointSaver>,
        settings: FraudSettings,
        tools: ToolFactory,
    ) -> Result<Self, ferrograph::RegistryError> {
        let runner = runtime
            .load(graph_with(settings.clone(), tools)?)
            .await?
            .with_checkpointer(saver);
        Ok(FraudWorkflow {
            runner: Arc::new(runner),
            settings,
        })
    }

    /// The typed runner.
    pub fn runner(&self) -> &GraphRunner<Investigation> {
        &self.runner
    }

    fn config(&self, mut config: RunConfig) -> RunConfig {
        // Each planner step is two supersteps (planner, tool executor), plus completion.
        config.max_steps = config
            .max_steps
            .max(2 * u64::from(self.settings.max_steps) + 4);
        config.timeout = Some(match config.timeout {
            Some(t) => t.min(self.settings.max_runtime),
            None => self.settings.max_runtime,
        });
        config
    }
}

/// Marks a thread whose run hit the whole-run limit: status `TIMED_OUT`, saved as if the
/// tool executor had run (so `resume` continues with the planner), audited.
async fn mark_timed_out(
    runner: Arc<GraphRunner<Investigation>>,
    settings: FraudSettings,
    thread: Option<String>,
    limit: Duration,
) -> Result<JsonOutcome, RunError> {
    let thread = thread.ok_or(RunError::NoCheckpointer)?;
    let msg = format!(
        "investigation exceeded its {}s time limit; state saved, continue with `ferrograph resume {thread}`",
        limit.as_secs_f64()
    );
    runner
        .update_state(
            &thread,
            InvestigationUpdate::new()
                .status(status::TIMED_OUT.to_string())
                .error(Some(msg)),
            Some("tool_executor"),
        )
        .await?;
    let snap = runner.get_state(&thread, None).await?;
    let st = (*snap.values).clone();
    let sev = if st.severity.is_empty() {
        "LOW".to_string()
    } else {
        st.severity.clone()
    };
    metrics::investigation_completed(status::TIMED_OUT, &sev, st.step_count);
    if !st.investigation_id.is_empty() {
        let store_dir = settings.store_dir.clone();
        let _ = tokio::task::spawn_blocking(move || {
            store::FraudStore::open(&store_dir)
                .and_then(|s| s.persist(&st, "investigation_timed_out"))
        })
        .await;
    }
    Ok(JsonOutcome {
        status: "timed_out",
        state: serde_json::to_value(&*snap.values).unwrap_or(Value::Null),
        interrupts: Vec::new(),
        checkpoint_id: snap.checkpoint_id.clone(),
        next: snap.next.clone(),
        thread_id: Some(thread),
    })
}

#[async_trait]
impl Workflow for FraudWorkflow {
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

    async fn start(&self, input: JsonInput, config: RunConfig) -> Result<JsonRun, RunError> {
        let config = self.config(config);
        let thread = config.thread_id.clone();
        let limit = config.timeout.unwrap_or(self.settings.max_runtime);
        let run = Workflow::start(&*self.runner, input, config).await?;
        let runner = self.runner.clone();
        let settings = self.settings.clone();
        Ok(run.map_outcome(move |out| async move {
            match out {
                Err(RunError::Timeout(_)) => mark_timed_out(runner, settings, thread, limit).await,
                other => other,
            }
        }))
    }

    async fn invoke(&self, input: JsonInput, config: RunConfig) -> Result<JsonOutcome, RunError> {
        self.start(input, config).await?.outcome().await
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

/// Reads the input: a JSON object (`{"transaction_id": …, "data_dir": …,
/// "feature_flags": {…}}`) or a bare transaction id.
pub fn parse_input(text: &str) -> Value {
    let t = text.trim();
    match serde_json::from_str::<Value>(t) {
        Ok(v) if v.is_object() => v,
        _ => json!({ "transaction_id": t }),
    }
}

/// The first planted case of the default dataset.
pub fn sample_input() -> Value {
    json!({ "transaction_id": "TX-013970" })
}

/// Reads `--transaction ID [--data DIR] [--no-llm]` into the input.
pub fn parse_args(args: &[String]) -> Result<Value, String> {
    let mut input = serde_json::Map::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--transaction" => {
                let v = it.next().ok_or("--transaction needs a transaction id")?;
                input.insert("transaction_id".into(), json!(v));
            }
            "--data" => {
                let v = it.next().ok_or("--data needs a folder")?;
                let p = std::path::absolute(v).unwrap_or_else(|_| PathBuf::from(v));
                // A named folder is read, never made: `--data /missing` used to create and
                // fill it.
                if !p.is_dir() {
                    return Err(format!(
                        "--data {v}: no such folder (write a dataset there with `ferrograph fraud gen-data --out {v}`)"
                    ));
                }
                input.insert("data_dir".into(), json!(p.display().to_string()));
            }
            "--no-llm" => {
                input.insert(
                    "feature_flags".into(),
                    json!({"planner_llm_enabled": false, "reasoning_llm_enabled": false,
                           "vector_search_enabled": true, "prompt_guard_enabled": true}),
                );
            }
            other => {
                return Err(format!(
                "unknown argument `{other}` (fraud takes --transaction ID [--data DIR] [--no-llm])"
            ))
            }
        }
    }
    if !input.contains_key("transaction_id") {
        return Err("fraud needs --transaction ID (see `ferrograph fraud cases`)".into());
    }
    Ok(Value::Object(input))
}

/// The input fields that name paths: the dataset folder, read (it must exist).
pub const INPUT_PATHS: &[ferrograph::runtime::InputPath] =
    &[ferrograph::runtime::InputPath::read("data_dir")];

/// Loads the fraud workflow (configured by `settings`, with the standard tools) into
/// `runtime` with `saver` as its checkpointer, and adds it and its metrics to `registry`.
pub async fn register(
    registry: &mut ferrograph::Registry,
    runtime: &Runtime,
    saver: Arc<dyn CheckpointSaver>,
    settings: &WorkflowSettings,
) -> Result<(), ferrograph::RegistryError> {
    let fs = FraudSettings::from_workflow_settings(settings);
    let tools = standard_tools(&fs);
    let wf = FraudWorkflow::load(runtime, saver, fs, tools).await?;
    registry.insert(
        "fraud",
        ferrograph::Entry {
            workflow: Arc::new(wf),
            description: "fraud investigation: LLM planner checked in code, six tools, audit trail",
            parse_input,
            sample_input,
            parse_args: Some(parse_args),
            input_paths: INPUT_PATHS,
        },
    );
    registry.add_metrics(Arc::new(metrics::render));
    Ok(())
}
