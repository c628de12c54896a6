//! The `review` workflow: a draft goes to a person for approval, in the shape of seed 000's
//! human review gate. The person approves, rejects, or sends feedback; feedback triggers a
//! revision, at most three times. No model is needed: the draft is assembled from the request
//! and the feedback, so the loop can be exercised anywhere (terminal, browser, HTTP).

use ferrograph::prelude::*;
use ferrograph::CompileError;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::Arc;

/// Most revisions before the loop stops.
pub const MAX_REVISIONS: u32 = 3;

/// State of the review workflow.
#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
pub struct Review {
    /// What the change is about.
    pub title: String,
    /// Files or areas it touches.
    pub files: Vec<String>,
    /// The current draft, in Markdown.
    pub draft: String,
    /// Drafts written so far.
    #[reducer(add)]
    pub revisions: u32,
    /// Feedback received, oldest first.
    #[reducer(append)]
    pub feedback: Vec<String>,
    /// `approved`, `rejected`, `revision limit reached`, or empty while pending.
    pub decision: String,
    /// Whether the change was published.
    pub published: bool,
}

/// A reviewer's answer, as sent to `resume`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Go ahead.
    Approve,
    /// Stop.
    Reject,
    /// Revise with this feedback.
    Feedback(String),
}

impl Decision {
    /// Reads `"approve"`, `"reject"`, `{"feedback": "..."}` or
    /// `{"decision": "approve|reject|feedback", "feedback": "..."}`.
    pub fn from_json(v: &Value) -> Option<Decision> {
        if let Some(s) = v.as_str() {
            return match s {
                "approve" | "approved" | "yes" => Some(Decision::Approve),
                "reject" | "rejected" | "no" => Some(Decision::Reject),
                _ => None,
            };
        }
        let text = v
            .get("feedback")
            .and_then(Value::as_str)
            .map(str::to_string);
        match v.get("decision").and_then(Value::as_str) {
            Some("approve") => Some(Decision::Approve),
            Some("reject") => Some(Decision::Reject),
            Some("feedback") | None => text.map(Decision::Feedback),
            Some(_) => None,
        }
    }
}

fn write_draft(s: &Review) -> String {
    let mut md = format!("## {}\n\n", s.title.trim());
    md.push_str(&format!("Revision {}.\n\n", s.revisions + 1));
    if !s.files.is_empty() {
        md.push_str("### Files\n");
        for f in &s.files {
            md.push_str(&format!("- `{f}`\n"));
        }
        md.push('\n');
    }
    if !s.feedback.is_empty() {
        md.push_str("### Addressed feedback\n");
        for f in &s.feedback {
            md.push_str(&format!("- {f}\n"));
        }
    }
    md
}

/// The review graph.
pub fn graph() -> Result<CompiledGraph<Review>, CompileError> {
    StateGraph::<Review>::new("review")
        .add_node("draft", |s: Arc<Review>, _c: NodeContext| async move {
            Ok::<_, NodeError>(ReviewUpdate::new().draft(write_draft(&s)).revisions(1u32))
        })
        .add_node("human_review", |s: Arc<Review>, ctx: NodeContext| async move {
            let answer: Value = ctx.interrupt(json!({
                "kind": "review",
                "title": s.title,
                "revision": s.revisions,
                "summary": s.draft,
                "choices": ["approve", "reject", "feedback"],
            }))?;
            let decision = Decision::from_json(&answer).ok_or_else(|| {
                NodeError::fatal(format!(
                    "unrecognized review answer {answer}: use \"approve\", \"reject\" or {{\"feedback\": \"...\"}}"
                ))
            })?;
            Ok(match decision {
                Decision::Approve => ReviewUpdate::new().decision("approved".to_string()),
                Decision::Reject => ReviewUpdate::new().decision("rejected".to_string()),
                Decision::Feedback(text) if s.revisions >= MAX_REVISIONS => ReviewUpdate::new()
                    .feedback(vec![text])
                    .decision("revision limit reached".to_string()),
                Decision::Feedback(text) => ReviewUpdate::new()
                    .feedback(vec![text])
                    .decision(String::new()),
            })
        })
        .add_node("publish", |_s: Arc<Review>, _c: NodeContext| async move {
            Ok::<_, NodeError>(ReviewUpdate::new().published(true))
        })
        .add_edge(START, "draft")
        .add_edge("draft", "human_review")
        .add_conditional_edges(
            "human_review",
            |s: &Review| match s.decision.as_str() {
                "approved" => "publish",
                "" => "draft",
                _ => END,
            },
            ["publish", "draft", END],
        )
        .add_edge("publish", END)
        .compile()
}

/// Parses the input: JSON (`{"title": ..., "files": [...]}`) or plain text (the title).
pub fn parse_input(text: &str) -> Value {
    match serde_json::from_str::<Value>(text) {
        Ok(v) if v.is_object() => v,
        _ => json!({ "title": text.trim() }),
    }
}

/// The sample input used when none is given.
pub fn sample_input() -> Value {
    json!({
        "title": "Retry only on rate limits, then fall back once",
        "files": ["crates/ferrograph-llm/src/retry.rs", "crates/ferrograph-llm/src/fallback.rs"],
    })
}
