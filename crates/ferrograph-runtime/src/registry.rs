//! The workflow registry: workflows by name, behind JSON, with how to read their input, for
//! the CLI and the HTTP server. Workflows register themselves (each workflow crate has a
//! `register` function); the server serves whatever registry it is given and depends on no
//! workflow.

use crate::erased::Workflow;
use crate::error::RunError;
use ferrograph_core::CompileError;
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
    /// The input fields that name paths on the machine that runs the workflow. The HTTP
    /// server confines them to its configured roots ([`crate::PathRoots`]); the CLI, run by
    /// the machine's own user, passes them through.
    pub input_paths: &'static [crate::InputPath],
}

/// Reads workflow-specific command-line arguments into the input.
pub type ParseArgs = fn(&[String]) -> Result<Value, String>;

/// A label value escaped for the text exposition format (backslash, double quote and newline),
/// for exporters whose encoder writes label values as they are (`prometheus-client` 0.23
/// does): a tool or model name with a quote would otherwise break the whole scrape.
pub fn metric_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A source of workflow metrics in the Prometheus text format.
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
