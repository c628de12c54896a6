//! Seed 003 on ferrograph: **an eight-agent software team**, offline, with the architecture
//! the seed describes made real.
//!
//! ```text
//! po_agent ─▶ ba_agent ─▶ stories_gate ─(approve)─▶ ta_agent ─▶ tl_agent ─▶ sse_agent ◀──┐ (≤ 3 failures)
//!  │  ▲                       │ reject                                  │ self-tests pass   │
//!  │  └───────────────────────┘                                         ▼                   │
//!  │ vague                                                        tl_code_review ─(fail)────┤
//!  ▼                                                                    ▼                   │
//! pm_agent ─▶ END        pm_escalation ◀─(3 failures)─ sse_agent      qc_agent ─(fail)──────┘
//!                         │ retry → sse_agent; abandon → END            ▼
//!                                              deploy ◀─(approve)─ deploy_gate ◀─ devops_agent
//!                                                │                    └─(reject)─▶ qc_agent
//!                                                ▼
//!                                               END (deployed, or rolled back)
//! ```
//!
//! - The requirement moves through the guarded lifecycle of [`lifecycle`]; every accepted
//!   transition is recorded, a refused one changes nothing.
//! - Agents talk in typed envelopes ([`events`]); events wait in the checkpointed outbox and
//!   are dispatched before each agent step, at least once and deduplicated by id ([`bus`]).
//! - The engineer's code and tests run for real in a sandbox ([`sandbox`]) in a git
//!   workspace ([`workspace`]); QC runs them again and checks the gates.
//! - Forward actions with effects register compensations (the saga); a failed release or an
//!   abandoned requirement runs them in reverse.
//!
//! Run it with `ferrograph run team --brief DIR_OR_FILE`.

pub mod artifacts;
pub mod brief;
pub mod bus;
pub mod domain;
pub mod error;
pub mod events;
pub mod fixture;
pub mod lifecycle;
mod nodes;
pub mod prompts;
pub mod sandbox;
pub mod state;
#[cfg(feature = "testing")]
pub mod testing;
pub mod translate;
pub mod workspace;

pub use error::TeamError;
pub use nodes::{EscalationAnswer, GateAnswer};
pub use state::{TeamState, TeamStateUpdate};

use ferrograph::chat::agent::AgentLlm;
use ferrograph::prelude::*;
use ferrograph::{CheckpointSaver, CompileError, WorkflowSettings};
use lifecycle::ReqState;
use nodes::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The workflow's name in the registry.
pub const NAME: &str = "team";

/// The environment variable that names a crash point (tests only): when the run reaches
/// it, the process kills itself with SIGKILL.
pub const CRASH_ENV: &str = "FERROGRAPH_TEAM_CRASH_AT";

/// What the workflow needs besides its state.
#[derive(Clone)]
pub struct TeamSettings {
    /// `<data>/team`: the event bus and conversations, and the runs' folders.
    pub data_dir: PathBuf,
    /// The agents' model; `None` ends a run at the first model call with a clear error.
    pub llm: Option<AgentLlm>,
    /// A crash point ([`CRASH_ENV`]).
    pub crash_at: Option<String>,
    /// Limits of the sandboxed test runs.
    pub limits: sandbox::Limits,
}

impl TeamSettings {
    /// From the shared settings: the workflow's model and `FERROGRAPH_TEAM_CRASH_AT`.
    pub fn from_workflow_settings(w: &WorkflowSettings) -> Self {
        TeamSettings {
            data_dir: w.data_dir.join(NAME),
            llm: w.llm_for(NAME).map(|m| team_llm(m, w.fallback_llm.clone())),
            crash_at: std::env::var(CRASH_ENV).ok().filter(|v| !v.is_empty()),
            limits: sandbox::Limits::default(),
        }
    }

    /// The event bus and conversation store.
    pub fn store(&self) -> bus::TeamStore {
        bus::TeamStore::new(self.data_dir.join("bus"))
    }

    /// The default folder of a run.
    pub fn run_dir(&self, run: &str) -> PathBuf {
        self.data_dir.join("runs").join(run)
    }
}

/// The agents' model calls: code repeats itself legitimately, so the repetition guard
/// allows longer repeats; the context is the model's 8K.
pub fn team_llm(
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

macro_rules! node {
    ($deps:expr, $f:ident) => {{
        let d = $deps.clone();
        move |s: Arc<TeamState>, ctx: NodeContext| $f(d.clone(), s, ctx)
    }};
}

fn ended(s: &TeamState) -> bool {
    s.error.is_some()
}

/// The graph, with `settings`. Installs the state's migration from version 1.
///
/// Mended from the seed's builder: `pm_agent` was unreachable (it now takes blocked briefs),
/// `pm_escalation` had no way out (retry or end), the stories router returned a label its
/// map lacked, and the quality router sent every failure back to the engineer before it
/// looked at the attempts (failures now count, and the third escalates).
pub fn graph(settings: TeamSettings) -> Result<CompiledGraph<TeamState>, CompileError> {
    if let Err(e) = state::install_migrations() {
        tracing::warn!(error = %e, "the team state's migration was not installed");
    }
    let d = Arc::new(Deps { settings });
    StateGraph::<TeamState>::new(NAME)
        .add_node("po_agent", node!(d, po_agent))
        .add_node("ba_agent", node!(d, ba_agent))
        .add_node("stories_gate", node!(d, stories_gate))
        .add_node("ta_agent", node!(d, ta_agent))
        .add_node("tl_agent", node!(d, tl_agent))
        .add_node("sse_agent", node!(d, sse_agent))
        .add_node("tl_code_review", node!(d, tl_code_review))
        .add_node("qc_agent", node!(d, qc_agent))
        .add_node("devops_agent", node!(d, devops_agent))
        .add_node("deploy_gate", node!(d, deploy_gate))
        .add_node("deploy", node!(d, deploy))
        .add_node("pm_agent", node!(d, pm_agent))
        .add_node("pm_escalation", node!(d, pm_escalation))
        .add_edge(START, "po_agent")
        .add_conditional_edges(
            "po_agent",
            |s: &TeamState| match s.lifecycle {
                _ if ended(s) => END,
                ReqState::Blocked => "pm_agent",
                _ => "ba_agent",
            },
            ["ba_agent", "pm_agent", END],
        )
        .add_conditional_edges(
            "ba_agent",
            |s: &TeamState| if ended(s) { END } else { "stories_gate" },
            ["stories_gate", END],
        )
        .add_conditional_edges(
            "stories_gate",
            |s: &TeamState| match s.lifecycle {
                _ if ended(s) => END,
                ReqState::DesignReady => "ta_agent",
                _ => "po_agent",
            },
            ["ta_agent", "po_agent", END],
        )
        .add_conditional_edges(
            "ta_agent",
            |s: &TeamState| if ended(s) { END } else { "tl_agent" },
            ["tl_agent", END],
        )
        .add_conditional_edges(
            "tl_agent",
            |s: &TeamState| if ended(s) { END } else { "sse_agent" },
            ["sse_agent", END],
        )
        .add_conditional_edges(
            "sse_agent",
            |s: &TeamState| match s.lifecycle {
                _ if ended(s) => END,
                ReqState::InReview => "tl_code_review",
                ReqState::Escalated => "pm_escalation",
                _ => "sse_agent",
            },
            ["tl_code_review", "pm_escalation", "sse_agent", END],
        )
        .add_conditional_edges(
            "tl_code_review",
            |s: &TeamState| match s.lifecycle {
                _ if ended(s) => END,
                ReqState::TestPending => "qc_agent",
                _ => "sse_agent",
            },
            ["qc_agent", "sse_agent", END],
        )
        .add_conditional_edges(
            "qc_agent",
            |s: &TeamState| match s.lifecycle {
                _ if ended(s) => END,
                ReqState::ReadyToDeploy => "devops_agent",
                _ => "sse_agent",
            },
            ["devops_agent", "sse_agent", END],
        )
        .add_conditional_edges(
            "devops_agent",
            |s: &TeamState| if ended(s) { END } else { "deploy_gate" },
            ["deploy_gate", END],
        )
        .add_conditional_edges(
            "deploy_gate",
            |s: &TeamState| match s.lifecycle {
                _ if ended(s) => END,
                ReqState::TestPending => "qc_agent",
                _ if s.deployment.approved => "deploy",
                _ => END,
            },
            ["deploy", "qc_agent", END],
        )
        .add_edge("deploy", END)
        .add_edge("pm_agent", END)
        .add_conditional_edges(
            "pm_escalation",
            |s: &TeamState| match s.lifecycle {
                _ if ended(s) => END,
                ReqState::InDevelopment => "sse_agent",
                _ => END,
            },
            ["sse_agent", END],
        )
        .compile()
}

/// Reads the input: a JSON object (`{"brief"|"brief_text", "out", "deploy_to"}`), a path
/// to a brief, or the brief's text itself.
pub fn parse_input(text: &str) -> Value {
    match serde_json::from_str::<Value>(text) {
        Ok(v) if v.is_object() => v,
        _ if Path::new(text.trim()).exists() => json!({ "brief": absolute(text.trim()) }),
        _ => json!({ "brief_text": text.trim() }),
    }
}

/// The input when none is given: the fixture brief under `./teamwork`
/// (`ferrograph team fixture teamwork` makes it).
pub fn sample_input() -> Value {
    json!({ "brief": "teamwork/wordstats" })
}

fn absolute(p: &str) -> String {
    std::path::absolute(p)
        .map(|a| a.display().to_string())
        .unwrap_or_else(|_| p.to_string())
}

/// `--brief PATH [--out DIR] [--deploy-to DIR]`.
pub fn parse_args(args: &[String]) -> Result<Value, String> {
    let mut input = serde_json::Map::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let field = match a.as_str() {
            "--brief" => "brief",
            "--out" => "out",
            "--deploy-to" => "deploy_to",
            other => return Err(format!("unknown argument `{other}` (team takes --brief DIR_OR_FILE [--out DIR] [--deploy-to DIR])")),
        };
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        input.insert(field.into(), json!(absolute(v)));
    }
    if !input.contains_key("brief") {
        return Err(
            "team needs --brief DIR_OR_FILE (`ferrograph team fixture teamwork` writes one)".into(),
        );
    }
    Ok(Value::Object(input))
}

const INPUT_PATHS: &[ferrograph::runtime::InputPath] = &[
    ferrograph::runtime::InputPath::read("brief"),
    ferrograph::runtime::InputPath::output("out"),
    ferrograph::runtime::InputPath::output("deploy_to"),
];

/// Loads the workflow into `runtime` with `saver` and adds it to `registry`.
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
        TeamSettings::from_workflow_settings(settings),
    )
    .await
}

/// [`register`] with the workflow's own settings (tests swap the model).
pub async fn register_with(
    registry: &mut ferrograph::Registry,
    runtime: &Runtime,
    saver: Arc<dyn CheckpointSaver>,
    settings: TeamSettings,
) -> Result<(), ferrograph::RegistryError> {
    let wf = runtime
        .load(graph(settings)?)
        .await?
        .with_checkpointer(saver);
    registry.insert(
        NAME,
        ferrograph::Entry {
            workflow: Arc::new(wf),
            description: "an eight-agent software team on a brief: stories (human gate), design, code and tests run in a sandbox, QC gates, CI config and runbook, deployment (human gate), with a guarded lifecycle, an outbox and sagas",
            parse_input,
            sample_input,
            parse_args: Some(parse_args),
            input_paths: INPUT_PATHS,
        },
    );
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
            GateAnswer::from_json(&json!({"approved": true})),
            Ok(GateAnswer::Approve)
        );
        assert_eq!(
            GateAnswer::from_json(&json!({"approved": false, "reason": "too big"})),
            Ok(GateAnswer::Reject("too big".into()))
        );
        assert_eq!(
            GateAnswer::from_json(&json!({"feedback": "split US-2"})),
            Ok(GateAnswer::Reject("split US-2".into()))
        );
        assert_eq!(
            GateAnswer::from_json(&json!("reject")),
            Ok(GateAnswer::Reject("No reason provided".into()))
        );
        assert_eq!(
            GateAnswer::from_json(&json!("needs a CSV export")),
            Ok(GateAnswer::Reject("needs a CSV export".into()))
        );
        for bad in [json!(""), json!(3), json!({"decision": "maybe"}), json!({})] {
            assert!(GateAnswer::from_json(&bad).is_err(), "{bad}");
        }
        assert_eq!(
            EscalationAnswer::from_json(&json!("approve")),
            Ok(EscalationAnswer::Retry(None))
        );
        assert_eq!(
            EscalationAnswer::from_json(&json!({"feedback": "use Counter"})),
            Ok(EscalationAnswer::Retry(Some("use Counter".into())))
        );
        assert_eq!(
            EscalationAnswer::from_json(&json!("reject")),
            Ok(EscalationAnswer::Abandon)
        );
        assert!(EscalationAnswer::from_json(&json!({})).is_err());
    }

    #[test]
    fn args_need_a_brief() {
        let a = |v: &[&str]| parse_args(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(a(&[]).unwrap_err().contains("--brief"));
        assert!(a(&["--bogus", "x"])
            .unwrap_err()
            .contains("unknown argument"));
        let v = a(&["--brief", "b"]).unwrap();
        assert!(Path::new(v["brief"].as_str().unwrap()).is_absolute());
        assert_eq!(parse_input("Build a tool")["brief_text"], "Build a tool");
    }

    #[test]
    fn ci_config_parses_and_runs_the_tests() {
        nodes::check_ci(&nodes::ci_yaml(), nodes::TEST_COMMAND).unwrap();
        assert!(nodes::check_ci("jobs: [", nodes::TEST_COMMAND).is_err());
        assert!(nodes::check_ci(
            "on: push\njobs:\n  a:\n    steps:\n      - run: make\n",
            nodes::TEST_COMMAND
        )
        .is_err());
    }
}
