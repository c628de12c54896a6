//! The demo workflow: turns commit subjects into release notes. Each commit is classified by
//! its own task (a `SendTo` fan-out), the results are merged with the append rule, a join
//! waits for all of them, and a final node writes Markdown. No model is needed.

use anyhow::Result;
use ferrograph::prelude::*;
use serde::{Deserialize, Serialize};
use std::process::ExitCode;
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

fn graph() -> Result<CompiledGraph<Notes>> {
    Ok(StateGraph::<Notes>::new("demo")
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
        .compile()?)
}

/// Runs the demo on `input` (commit subjects, one per line) or a built-in sample.
pub async fn run(input: Option<String>, thread: Option<String>, stream: bool) -> Result<ExitCode> {
    let text = input.unwrap_or_else(|| SAMPLE.to_string());
    let commits: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    let runtime = Runtime::new().await?;
    let runner = runtime
        .load(graph()?)
        .await?
        .with_checkpointer(Arc::new(MemorySaver::new()));
    let mut config = RunConfig::thread(thread.unwrap_or_else(|| "demo".to_string()));
    if stream {
        config = config.stream(
            StreamModes::NONE
                .with(StreamMode::Tasks)
                .with(StreamMode::Custom),
        );
    }
    let input = RunInput::Update(NotesUpdate::new().commits(commits));
    let outcome = if stream {
        let mut s = runner.stream(input, config).await?;
        while let Some(ev) = s.next_event().await {
            crate::print::event(&ev);
        }
        s.outcome().await?
    } else {
        runner.invoke(input, config).await?
    };
    println!("{}", outcome.state.markdown);
    println!("{}", serde_json::to_string_pretty(&*outcome.state)?);
    Ok(match outcome.status {
        RunStatus::Done => ExitCode::SUCCESS,
        _ => ExitCode::from(2),
    })
}
