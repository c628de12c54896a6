//! Workflows that ship with ferrograph, and the registry that serves them by name to the CLI
//! and the HTTP server.
//!
//! - `demo`: release notes from commit subjects (fan-out, join; no model).
//! - `review`: a draft reviewed by a person: approve, reject or feedback, at most three
//!   revisions (interrupts and resume; no model).
//! - `fraud`: seed 004's fraud investigation planner: an LLM planner checked by safety rules
//!   in code, six tools in a registry, deterministic fallback, limits, audit trail, metrics.
//! - `triage`: seed 001's five-agent bug triage: investigator, docs search with tool calls,
//!   codebase retrieval, critic gate, writer with three parallel sub-calls; a supervisor
//!   routes between them.

pub mod demo;
pub mod fraud;
pub mod review;
pub mod triage;

use ferrograph::runtime::Workflow;
use ferrograph::{CheckpointSaver, CompileError, RunError, Runtime};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A workflow with how to read its input.
#[derive(Clone)]
pub struct Entry {
    /// The runnable graph, behind JSON.
    pub workflow: Arc<dyn Workflow>,
    /// One line about what it does.
    pub description: &'static str,
    /// Turns the text of an input file into the JSON input.
    pub parse_input: fn(&str) -> Value,
    /// The input used when none is given.
    pub sample_input: fn() -> Value,
    /// Reads workflow-specific command-line arguments (`ferrograph run NAME ARGS…`) into the
    /// input; `None` when the workflow takes none.
    pub parse_args: Option<ParseArgs>,
}

/// Reads workflow-specific command-line arguments into the input.
pub type ParseArgs = fn(&[String]) -> Result<Value, String>;

/// What the built-in workflows share: where data lives, limits, and the model.
#[derive(Clone, Default)]
pub struct WorkflowSettings {
    /// Data directory (datasets, indexes and stores live under it).
    pub data_dir: std::path::PathBuf,
    /// Step limit of agent loops (`FERROGRAPH_MAX_STEPS`).
    pub max_steps: Option<u32>,
    /// Whole-run limit (`FERROGRAPH_MAX_RUNTIME_SECONDS`).
    pub run_timeout: Option<std::time::Duration>,
    /// Per-tool limit (`FERROGRAPH_TOOL_TIMEOUT_SECONDS`).
    pub tool_timeout: Option<std::time::Duration>,
    /// The chat model (local or remote); `None` runs the deterministic paths only.
    pub llm: Option<Arc<dyn ferrograph_llm::ChatModel>>,
    /// A second model to fall back to once the first one's retries are exhausted.
    pub fallback_llm: Option<Arc<dyn ferrograph_llm::ChatModel>>,
}

/// Renders a workflow's own Prometheus metrics.
pub type MetricsFn = Arc<dyn Fn() -> String + Send + Sync>;

/// Workflows by name.
#[derive(Clone, Default)]
pub struct Registry {
    entries: BTreeMap<String, Entry>,
    metrics: Vec<MetricsFn>,
}

/// Why the registry could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// A graph did not compile.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// The runtime refused to load a graph.
    #[error(transparent)]
    Run(#[from] RunError),
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a workflow.
    pub fn insert(&mut self, name: impl Into<String>, entry: Entry) {
        self.entries.insert(name.into(), entry);
    }

    /// A workflow by name.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    /// Names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    /// Adds a source of workflow metrics (served at `/metrics`).
    pub fn add_metrics(&mut self, f: MetricsFn) {
        self.metrics.push(f);
    }

    /// The workflows' own metrics, in the Prometheus text format.
    pub fn render_metrics(&self) -> String {
        self.metrics.iter().map(|f| f()).collect()
    }

    /// Every entry, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Entry)> {
        self.entries.iter()
    }
}

/// The built-in workflows that need no data or model (`demo`, `review`), loaded into
/// `runtime` with `saver` as their checkpointer.
pub async fn builtin(
    runtime: &Runtime,
    saver: Arc<dyn CheckpointSaver>,
) -> Result<Registry, RegistryError> {
    let mut r = Registry::new();
    let demo = runtime
        .load(demo::graph()?)
        .await?
        .with_checkpointer(saver.clone());
    r.insert(
        "demo",
        Entry {
            workflow: Arc::new(demo),
            description: "release notes from commit subjects (fan-out, join)",
            parse_input: demo::parse_input,
            sample_input: demo::sample_input,
            parse_args: None,
        },
    );
    let review = runtime
        .load(review::graph()?)
        .await?
        .with_checkpointer(saver);
    r.insert(
        "review",
        Entry {
            workflow: Arc::new(review),
            description: "a draft reviewed by a person: approve, reject or feedback (interrupts)",
            parse_input: review::parse_input,
            sample_input: review::sample_input,
            parse_args: None,
        },
    );
    Ok(r)
}

/// Every built-in workflow: [`builtin`] plus the ones that use data and models (`fraud`),
/// configured by `settings`.
pub async fn builtin_with(
    runtime: &Runtime,
    saver: Arc<dyn CheckpointSaver>,
    settings: &WorkflowSettings,
) -> Result<Registry, RegistryError> {
    let mut r = builtin(runtime, saver.clone()).await?;
    let fs = fraud::FraudSettings::from_workflow_settings(settings);
    let tools = fraud::standard_tools(&fs);
    let wf = fraud::FraudWorkflow::load(runtime, saver.clone(), fs, tools).await?;
    r.insert(
        "fraud",
        Entry {
            workflow: Arc::new(wf),
            description: "fraud investigation: LLM planner checked in code, six tools, audit trail",
            parse_input: fraud::parse_input,
            sample_input: fraud::sample_input,
            parse_args: Some(fraud::parse_args),
        },
    );
    r.metrics.push(Arc::new(fraud::metrics::render));
    let ts = triage::TriageSettings::from_workflow_settings(settings);
    let wf = triage::TriageWorkflow::load(runtime, saver, &ts).await?;
    r.insert(
        "triage",
        Entry {
            workflow: Arc::new(wf),
            description:
                "bug triage: investigator, docs search, codebase retrieval, critic, writer",
            parse_input: triage::parse_input,
            sample_input: triage::sample_input,
            parse_args: Some(triage::parse_args),
        },
    );
    Ok(r)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ferrograph::prelude::*;
    use ferrograph::runtime::JsonInput;

    #[tokio::test]
    async fn review_loop_revises_on_feedback_and_publishes_on_approval() {
        let rt = Runtime::new().await.unwrap();
        let reg = builtin(&rt, Arc::new(MemorySaver::new())).await.unwrap();
        let wf = &reg.get("review").unwrap().workflow;
        let cfg = || RunConfig::thread("r1");
        let out = wf
            .invoke(JsonInput::Update(review::sample_input()), cfg())
            .await
            .unwrap();
        assert_eq!(out.status, "interrupted");
        assert_eq!(out.interrupts[0].value.0["kind"], "review");
        let out = wf
            .invoke(
                JsonInput::Resume(Resume::value(serde_json::json!({"feedback": "add tests"}))),
                cfg(),
            )
            .await
            .unwrap();
        assert_eq!(out.status, "interrupted");
        assert_eq!(out.state["revisions"], 2);
        assert!(out.state["draft"].as_str().unwrap().contains("add tests"));
        let out = wf
            .invoke(JsonInput::Resume(Resume::value("approve".into())), cfg())
            .await
            .unwrap();
        assert_eq!(out.status, "done");
        assert_eq!(out.state["published"], true);
        assert_eq!(out.state["decision"], "approved");
    }

    #[tokio::test]
    async fn review_stops_after_three_revisions_and_rejects_nonsense() {
        let rt = Runtime::new().await.unwrap();
        let reg = builtin(&rt, Arc::new(MemorySaver::new())).await.unwrap();
        let wf = &reg.get("review").unwrap().workflow;
        let cfg = || RunConfig::thread("r2");
        wf.invoke(JsonInput::Update(serde_json::json!({"title": "x"})), cfg())
            .await
            .unwrap();
        let bad = wf
            .invoke(JsonInput::Resume(Resume::value("maybe".into())), cfg())
            .await
            .unwrap_err();
        assert!(
            bad.to_string().contains("unrecognized review answer"),
            "{bad}"
        );
        let mut last = None;
        for i in 0..3 {
            last = Some(
                wf.invoke(
                    JsonInput::Resume(Resume::value(
                        serde_json::json!({ "feedback": format!("f{i}") }),
                    )),
                    cfg(),
                )
                .await
                .unwrap(),
            );
        }
        let out = last.unwrap();
        assert_eq!(out.status, "done");
        assert_eq!(out.state["decision"], "revision limit reached");
        assert_eq!(out.state["published"], false);
        assert_eq!(out.state["revisions"], 3);
    }

    #[tokio::test]
    async fn demo_classifies_every_commit() {
        let rt = Runtime::new().await.unwrap();
        let reg = builtin(&rt, Arc::new(MemorySaver::new())).await.unwrap();
        let wf = &reg.get("demo").unwrap().workflow;
        let out = wf
            .invoke(
                JsonInput::Update(demo::parse_input("feat: a\nfix: b\nmisc")),
                RunConfig::thread("d"),
            )
            .await
            .unwrap();
        assert_eq!(out.state["classified"], 3);
        let md = out.state["markdown"].as_str().unwrap();
        assert!(
            md.contains("## Features\n- a") && md.contains("## Fixes\n- b"),
            "{md}"
        );
    }
}
