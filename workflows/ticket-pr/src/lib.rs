//! Seed 000 on ferrograph: **ticket to pull request**, offline, on a real local git
//! repository.
//!
//! ```text
//! fetch_ticket ─▶ classify_ticket ─▶ identify_modules ─▶ retrieve_context ─▶ generate_code_changes
//!     │ (unknown ticket, bad repository: no model call)                   ▲              │
//!     ▼                                                     feedback (≤ 3) │              ▼
//! handle_error ─▶ END                                                     │       generate_tests
//!                                                                         │              │
//!   correct_from_tests ◀─ tests fail (≤ 2 corrections) ─ run_proposed_tests ◀────────────┘
//!           └──────────────────────────────────────────▶ │ (sandbox: before and after)
//!                                                         ▼
//!                  human_review_gate ◀─ prepare_diff_summary
//!                   │ approve      │ reject / a 4th generation ─▶ END
//!                   ▼
//!   apply_changes ─▶ create_pull_request ─▶ post_ticket_comment ─▶ END
//! ```
//!
//! - Tickets are files in a folder ([`ticket`]); the comment goes back there.
//! - The repository is any local git repository ([`repo`]): its modules come from its layout
//!   or `ferrograph-modules.toml`; it is indexed on first use and refreshed incrementally.
//! - Every model call is structured and constrained (modules and paths are enums fixed at run
//!   time), retried on retryable errors only, then the fallback, then `error` and a status.
//! - The gate's payload carries a real unified diff of every file against the base commit.
//! - Approval makes a branch with one commit per file (built in memory: the working tree and
//!   current branch are untouched), a pull-request record in sled ([`prs`]) with a
//!   `git format-patch` series, an optional push, and the ticket comment, each exactly once
//!   across crashes.
//!
//! Run it with `ferrograph run ticket-to-pr --ticket KEY --tickets DIR --repo DIR`.

pub mod blocks;
pub mod edit;
pub mod error;
pub mod eval;
pub mod fixture;
pub mod functions;
pub mod metrics;
mod nodes;
pub mod prompts;
pub mod prs;
pub mod repo;
pub mod state;
#[cfg(feature = "testing")]
pub mod testing;
pub mod ticket;
pub mod verify;

pub use error::TicketPrError;
pub use nodes::GateAnswer;
pub use state::{TicketPrState, TicketPrStateUpdate};

use ferrograph::chat::agent::AgentLlm;
use ferrograph::prelude::*;
use ferrograph::{CheckpointSaver, CompileError, WorkflowSettings};
use ferrograph_index::embed::EmbedderFactory;
use serde_json::{json, Value};
use state::status;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nodes::*;

/// The workflow's name in the registry.
pub const NAME: &str = "ticket-to-pr";

/// Most generations of the change (the first and two revisions).
pub const MAX_GENERATIONS: u32 = 3;

/// Most corrections of the change (or its tests) from the tests' run, before the gate.
pub const MAX_TEST_CORRECTIONS: u32 = 2;

/// A proposed file over this many lines is flagged at the gate.
pub const LARGE_FILE_LINES: usize = 300;

/// The environment variable that names a crash point (tests only): when the run reaches it,
/// the process kills itself with SIGKILL.
pub const CRASH_ENV: &str = "FERROGRAPH_TICKET_PR_CRASH_AT";

/// What the workflow needs besides its state.
#[derive(Clone)]
pub struct TicketPrSettings {
    /// `<data>/ticket-to-pr` holds the indexes, the pull requests and the default output.
    pub data_dir: PathBuf,
    /// The model; `None` ends every run before the first model call with a clear error.
    pub llm: Option<AgentLlm>,
    /// Makes the embedder for retrieval.
    pub make_embedder: EmbedderFactory,
    /// A crash point ([`CRASH_ENV`]).
    pub crash_at: Option<String>,
    /// Limits of each run of the proposed tests ([`verify`]); `None` skips the runs (the
    /// gate then says the tests were not run).
    pub test_limits: Option<ferrograph_sandbox::Limits>,
}

impl TicketPrSettings {
    /// From the shared settings: the workflow's model, MiniLM, `FERROGRAPH_TICKET_PR_CRASH_AT`.
    pub fn from_workflow_settings(w: &WorkflowSettings) -> Self {
        TicketPrSettings {
            data_dir: w.data_dir.join("ticket-to-pr"),
            llm: w.llm_for(NAME).map(|m| code_llm(m, w.fallback_llm.clone())),
            make_embedder: ferrograph_index::embed::minilm(),
            crash_at: std::env::var(CRASH_ENV).ok().filter(|v| !v.is_empty()),
            test_limits: test_limits_from_env(),
        }
    }

    /// The pull-request store.
    pub fn prs(&self) -> prs::PrStore {
        prs::PrStore::new(self.data_dir.join("prs"))
    }
}

/// The test runs' limits: the sandbox's defaults (60 s, 30 CPU seconds, 1 GiB), or none
/// with `FERROGRAPH_TICKET_RUN_TESTS=0`.
fn test_limits_from_env() -> Option<ferrograph_sandbox::Limits> {
    match std::env::var("FERROGRAPH_TICKET_RUN_TESTS")
        .as_deref()
        .map(str::trim)
    {
        Ok("0") | Ok("false") | Ok("no") => None,
        _ => Some(ferrograph_sandbox::Limits::default()),
    }
}

/// The agents' model calls, set for code: the repetition guard allows longer repeats than
/// prose (code repeats itself legitimately) and the context is the model's 8K.
pub fn code_llm(
    primary: Arc<dyn ferrograph::chat::ChatModel>,
    fallback: Option<Arc<dyn ferrograph::chat::ChatModel>>,
) -> AgentLlm {
    let mut llm = AgentLlm::new(primary, fallback);
    for o in [&mut llm.primary_options, &mut llm.fallback_options] {
        o.no_repeat_ngram = Some(32);
        o.max_context = 8192;
    }
    llm
}

fn on_error(next: &'static str) -> impl Fn(&TicketPrState) -> &'static str + Send + Sync + 'static {
    move |s: &TicketPrState| {
        if s.error.is_some() {
            "handle_error"
        } else {
            next
        }
    }
}

macro_rules! node {
    ($deps:expr, $f:ident) => {{
        let d = $deps.clone();
        move |s: Arc<TicketPrState>, ctx: NodeContext| $f(d.clone(), s, ctx)
    }};
}

/// The graph, with `settings`.
pub fn graph(settings: TicketPrSettings) -> Result<CompiledGraph<TicketPrState>, CompileError> {
    let d = Arc::new(Deps::new(settings));
    StateGraph::<TicketPrState>::new(NAME)
        .add_node("fetch_ticket", node!(d, fetch_ticket))
        .add_node("classify_ticket", node!(d, classify_ticket))
        .add_node("identify_modules", node!(d, identify_modules))
        .add_node("retrieve_context", node!(d, retrieve_context))
        .add_node("generate_code_changes", node!(d, generate_code_changes))
        .add_node("generate_tests", node!(d, generate_tests))
        .add_node("run_proposed_tests", node!(d, run_proposed_tests))
        .add_node("correct_from_tests", node!(d, correct_from_tests))
        .add_node("prepare_diff_summary", node!(d, prepare_diff_summary))
        .add_node("human_review_gate", node!(d, human_review_gate))
        .add_node("apply_changes", node!(d, apply_changes))
        .add_node("create_pull_request", node!(d, create_pull_request))
        .add_node("post_ticket_comment", node!(d, post_ticket_comment))
        .add_node("handle_error", node!(d, handle_error))
        .add_edge(START, "fetch_ticket")
        .add_conditional_edges(
            "fetch_ticket",
            on_error("classify_ticket"),
            ["classify_ticket", "handle_error"],
        )
        .add_conditional_edges(
            "classify_ticket",
            on_error("identify_modules"),
            ["identify_modules", "handle_error"],
        )
        .add_conditional_edges(
            "identify_modules",
            on_error("retrieve_context"),
            ["retrieve_context", "handle_error"],
        )
        .add_conditional_edges(
            "retrieve_context",
            on_error("generate_code_changes"),
            ["generate_code_changes", "handle_error"],
        )
        .add_conditional_edges(
            "generate_code_changes",
            on_error("generate_tests"),
            ["generate_tests", "handle_error"],
        )
        .add_conditional_edges(
            "generate_tests",
            on_error("run_proposed_tests"),
            ["run_proposed_tests", "handle_error"],
        )
        .add_conditional_edges(
            "run_proposed_tests",
            |s: &TicketPrState| {
                if s.error.is_some() {
                    "handle_error"
                } else if needs_test_correction(s) {
                    "correct_from_tests"
                } else {
                    "prepare_diff_summary"
                }
            },
            ["correct_from_tests", "prepare_diff_summary", "handle_error"],
        )
        .add_conditional_edges(
            "correct_from_tests",
            |s: &TicketPrState| {
                if s.error.is_some() {
                    "handle_error"
                } else if s
                    .test_runs
                    .last()
                    .is_some_and(|r| r.correction == s.test_corrections)
                {
                    // No usable correction: the gate shows the last run.
                    "prepare_diff_summary"
                } else {
                    "run_proposed_tests"
                }
            },
            ["run_proposed_tests", "prepare_diff_summary", "handle_error"],
        )
        .add_conditional_edges(
            "prepare_diff_summary",
            on_error("human_review_gate"),
            ["human_review_gate", "handle_error"],
        )
        .add_conditional_edges(
            "human_review_gate",
            |s: &TicketPrState| match (s.decision.as_str(), s.status.as_str()) {
                ("approve", _) => "apply_changes",
                ("feedback", st) if st != status::REVISION_LIMIT => "generate_code_changes",
                _ => END,
            },
            ["apply_changes", "generate_code_changes", END],
        )
        .add_conditional_edges(
            "apply_changes",
            on_error("create_pull_request"),
            ["create_pull_request", "handle_error"],
        )
        .add_conditional_edges(
            "create_pull_request",
            on_error("post_ticket_comment"),
            ["post_ticket_comment", "handle_error"],
        )
        .add_edge("post_ticket_comment", END)
        .add_edge("handle_error", END)
        .compile()
}

/// Reads the input: a JSON object (`{"ticket_key", "tickets", "repo", "remote", "out"}`) or
/// a bare ticket key.
pub fn parse_input(text: &str) -> Value {
    match serde_json::from_str::<Value>(text) {
        Ok(v) if v.is_object() => v,
        _ => json!({ "ticket_key": text.trim() }),
    }
}

/// The input when none is given: the fixture's bug ticket under `./taskmaster`
/// (`ferrograph tickets fixture taskmaster` makes it).
pub fn sample_input() -> Value {
    json!({
        "ticket_key": fixture::BUG_TICKET,
        "tickets": "taskmaster/tickets",
        "repo": "taskmaster/repo",
    })
}

fn absolute(p: &str) -> String {
    std::path::absolute(p)
        .map(|a| a.display().to_string())
        .unwrap_or_else(|_| p.to_string())
}

/// `--ticket KEY --tickets DIR --repo DIR [--remote R] [--out DIR]`.
pub fn parse_args(args: &[String]) -> Result<Value, String> {
    let mut input = serde_json::Map::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (field, is_path) = match a.as_str() {
            "--ticket" => ("ticket_key", false),
            "--tickets" => ("tickets", true),
            "--repo" => ("repo", true),
            "--remote" => ("remote", false),
            "--out" => ("out", true),
            other => {
                return Err(format!(
                    "unknown argument `{other}` (ticket-to-pr takes --ticket KEY --tickets DIR --repo DIR [--remote R] [--out DIR])"
                ))
            }
        };
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        let v = if is_path || (field == "remote" && Path::new(v).exists()) {
            absolute(v)
        } else {
            v.clone()
        };
        input.insert(field.into(), json!(v));
    }
    for (field, flag) in [
        ("ticket_key", "--ticket KEY"),
        ("tickets", "--tickets DIR"),
        ("repo", "--repo DIR"),
    ] {
        if !input.contains_key(field) {
            return Err(format!("ticket-to-pr needs {flag}"));
        }
    }
    Ok(Value::Object(input))
}

const INPUT_PATHS: &[ferrograph::runtime::InputPath] = &[
    ferrograph::runtime::InputPath::read("tickets"),
    ferrograph::runtime::InputPath::read("repo"),
    ferrograph::runtime::InputPath::output("out"),
    ferrograph::runtime::InputPath::remote("remote"),
];

/// Loads the workflow into `runtime` with `saver` and adds it and its metrics to `registry`.
pub async fn register(
    registry: &mut ferrograph::Registry,
    runtime: &Runtime,
    saver: Arc<dyn CheckpointSaver>,
    settings: &WorkflowSettings,
) -> Result<(), ferrograph::RegistryError> {
    register_with(
        registry,
        runtime,
        saver,
        TicketPrSettings::from_workflow_settings(settings),
    )
    .await
}

/// [`register`] with the workflow's own settings (tests swap the model and the embedder).
pub async fn register_with(
    registry: &mut ferrograph::Registry,
    runtime: &Runtime,
    saver: Arc<dyn CheckpointSaver>,
    settings: TicketPrSettings,
) -> Result<(), ferrograph::RegistryError> {
    let wf = runtime
        .load(graph(settings)?)
        .await?
        .with_checkpointer(saver);
    registry.insert(
        NAME,
        ferrograph::Entry {
            workflow: Arc::new(wf),
            description: "ticket to pull request on a local git repository: classify, modules, retrieval, changes and tests, a review gate with revisions, then branch, commits, PR record and ticket comment",
            parse_input,
            sample_input,
            parse_args: Some(parse_args),
            input_paths: INPUT_PATHS,
        },
    );
    registry.add_metrics(Arc::new(metrics::render));
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn gate_answers() {
        assert_eq!(
            GateAnswer::from_json(&json!("approve")),
            Ok(GateAnswer::Approve)
        );
        assert_eq!(
            GateAnswer::from_json(&json!(" Reject ")),
            Ok(GateAnswer::Reject)
        );
        assert_eq!(
            GateAnswer::from_json(&json!("use a guard clause")),
            Ok(GateAnswer::Feedback("use a guard clause".into()))
        );
        assert_eq!(
            GateAnswer::from_json(&json!({"feedback": "more tests"})),
            Ok(GateAnswer::Feedback("more tests".into()))
        );
        assert_eq!(
            GateAnswer::from_json(&json!({"decision": "approve"})),
            Ok(GateAnswer::Approve)
        );
        for bad in [
            json!(""),
            json!(3),
            json!({"decision": "maybe"}),
            json!({"feedback": " "}),
        ] {
            assert!(GateAnswer::from_json(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn args_need_ticket_tickets_and_repo() {
        let a = |v: &[&str]| parse_args(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(a(&["--ticket", "T-1"]).unwrap_err().contains("--tickets"));
        assert!(a(&["--bogus", "x"])
            .unwrap_err()
            .contains("unknown argument"));
        let v = a(&["--ticket", "T-1", "--tickets", "t", "--repo", "r"]).unwrap();
        assert!(Path::new(v["repo"].as_str().unwrap()).is_absolute());
    }
}
