//! The `demo` workflow: turns commit subjects into release notes. Each commit is classified by
//! its own task (a `SendTo` fan-out), the results are merged with the append rule, a join
//! waits for all of them, and a final node writes Markdown. No model is needed.

use ferrograph::prelude::*;
use ferrograph::CompileError;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::Arc;

/// One classified commit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// `feature`, `fix`, `docs` or `chore`.
    pub kind: String,
    /// The subject without its prefix.
    pub text: String,
}

/// State of the demo.
#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
pub struct Notes {
    /// Commit subjects.
    pub commits: Vec<String>,
    /// The commit a classifier task was sent.
    pub commit: String,
    /// Classified commits (append rule: every classifier adds one).
    #[reducer(append)]
    pub entries: Vec<Entry>,
    /// Commits classified (add rule).
    #[reducer(add)]
    pub classified: u64,
    /// The release notes.
    pub markdown: String,
}

const SAMPLE: &str = "feat: stream tokens from local models\n\
fix: resume after a crash no longer repeats a step\n\
docs: explain durability modes\n\
feat(server): approvals in the web console\n\
chore: bump dependencies\n\
fix(index): filtered search never leaks excluded ids\n";

fn classify(subject: &str) -> Entry {
    let (head, text) = subject.split_once(':').unwrap_or(("", subject));
    let head = head.split('(').next().unwrap_or("").trim().to_lowercase();
    let kind = match head.as_str() {
        "feat" | "feature" => "feature",
        "fix" | "bugfix" => "fix",
        "docs" | "doc" => "docs",
        _ => "chore",
    };
    Entry {
        kind: kind.to_string(),
        text: text.trim().to_string(),
    }
}

fn build() -> Result<CompiledGraph<Notes>, CompileError> {
    StateGraph::<Notes>::new("demo")
        .add_node("split", |s: Arc<Notes>, _c: NodeContext| async move {
            let n = s.commits.len();
            Ok::<_, NodeError>(NotesUpdate::new().markdown(format!("{n} commits")))
        })
        .add_node("classify", |s: Arc<Notes>, _c: NodeContext| async move {
            Ok::<_, NodeError>(
                NotesUpdate::new()
                    .entries(vec![classify(&s.commit)])
                    .classified(1u64),
            )
        })
        .add_node("write", |s: Arc<Notes>, _c: NodeContext| async move {
            let mut md = String::from("# Release notes\n");
            for (kind, title) in [
                ("feature", "Features"),
                ("fix", "Fixes"),
                ("docs", "Documentation"),
                ("chore", "Maintenance"),
            ] {
                let items: Vec<&Entry> = s.entries.iter().filter(|e| e.kind == kind).collect();
                if !items.is_empty() {
                    md.push_str(&format!("\n## {title}\n"));
                    for e in items {
                        md.push_str(&format!("- {}\n", e.text));
                    }
                }
            }
            Ok::<_, NodeError>(NotesUpdate::new().markdown(md))
        })
        .add_edge(START, "split")
        .add_conditional_edges(
            "split",
            |s: &Notes| {
                s.commits
                    .iter()
                    .map(|c| {
                        SendTo::new(
                            "classify",
                            Notes {
                                commit: c.clone(),
                                ..Notes::default()
                            },
                        )
                    })
                    .collect::<Vec<_>>()
            },
            ["classify"],
        )
        .add_edge("classify", "write")
        .add_edge("write", END)
        .compile()
}

/// The demo graph.
pub fn graph() -> Result<CompiledGraph<Notes>, CompileError> {
    build()
}

/// Parses plain text (commit subjects, one per line) or JSON (`{"commits": [...]}`) into the
/// demo's input.
pub fn parse_input(text: &str) -> Value {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        if v.is_object() {
            return v;
        }
    }
    let commits: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    json!({ "commits": commits })
}

/// The sample input used when none is given.
pub fn sample_input() -> Value {
    parse_input(SAMPLE)
}
