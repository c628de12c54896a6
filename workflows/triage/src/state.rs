//! The triage state (seed 001's `BugTriageState`), checkpointed after every superstep.
//!
//! Records of what happened (findings, critic verdicts, agent runs, agent errors, routing
//! decisions) are append-only. The latest output of each agent is kept whole beside them so
//! the next agent reads typed fields, not text.

use super::check::FieldCheck;
use super::models::{
    AgentFinding, CodebaseFinding, CriticVerdict, CritiqueFinding, InvestigatorFinding,
    WebSearchFinding, WriterOutput,
};
use ferrograph::prelude::*;
use serde::{Deserialize, Serialize};

/// Agent names, as graph nodes.
pub mod agent {
    /// Reads the issue, forms the hypothesis.
    pub const INVESTIGATOR: &str = "investigator";
    /// Searches the offline docs with tool calls, then synthesises.
    pub const WEB_SEARCH: &str = "web_search";
    /// Retrieves code from the repository index.
    pub const CODEBASE_SEARCH: &str = "codebase_search";
    /// Challenges the findings.
    pub const CRITIC: &str = "critic";
    /// Writes report, comment and ticket.
    pub const WRITER: &str = "writer";
    /// Writes the report files (not an agent).
    pub const PUBLISH: &str = "publish";
    /// Every agent, in pipeline order.
    pub const ALL: [&str; 5] = [INVESTIGATOR, WEB_SEARCH, CODEBASE_SEARCH, CRITIC, WRITER];
}

pub use ferrograph::chat::agent::LlmCall;

/// One run of an agent node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentRun {
    /// Agent name.
    pub agent: String,
    /// Investigation round.
    pub round: u32,
    /// Wall time of the whole agent.
    pub duration_ms: u64,
    /// Its model calls.
    pub calls: Vec<LlmCall>,
    /// Tool calls it made (web search).
    pub tool_calls: u32,
    /// Whether it produced a finding (false: it set its error field).
    pub ok: bool,
    /// The error field, when set.
    pub error: Option<String>,
}

/// One routing decision of the supervisor.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Routing {
    /// Agent iterations so far.
    pub iteration: u32,
    /// Round.
    pub round: u32,
    /// Where to.
    pub next: String,
    /// Why.
    pub reason: String,
}

/// Where the outputs went.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportFiles {
    /// Folder.
    pub out_dir: String,
    /// The JSON report.
    pub json: String,
    /// The Markdown report.
    pub markdown: String,
    /// The event trace (JSON lines).
    pub events: String,
}

/// The state of one triage.
#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
pub struct TriageState {
    // Input
    /// Issue title.
    pub issue_title: String,
    /// Issue body.
    pub issue_body: String,
    /// Where the issue came from (file path or URL).
    pub issue_url: String,
    /// Repository folder.
    pub repository: String,
    /// Offline docs folder (empty: no docs search).
    pub docs_dir: String,
    /// Output folder (empty: under the data directory).
    pub out_dir: String,

    // Control
    /// The supervisor's choice.
    pub next: String,
    /// Agent node that ran last.
    pub current_node: String,
    /// Agent iterations so far.
    pub iterations: u32,
    /// Most agent iterations (the supervisor's cap).
    pub max_iterations: u32,
    /// Investigation round (1-based).
    pub round: u32,
    /// Most rounds (critic rejections start new ones).
    pub max_rounds: u32,
    /// `RUNNING`, `COMPLETED` or `FAILED`.
    pub status: String,
    /// Why the triage ended without a report, if it did.
    pub error: Option<String>,

    // Findings
    /// Every finding, in the common type.
    #[reducer(append)]
    pub findings: Vec<AgentFinding>,
    /// The latest investigator finding.
    pub investigator: Option<InvestigatorFinding>,
    /// The latest docs-search finding.
    pub web_search: Option<WebSearchFinding>,
    /// The latest codebase finding.
    pub codebase: Option<CodebaseFinding>,
    /// The latest critique.
    pub critique: Option<CritiqueFinding>,
    /// The latest routing verdict.
    pub critic_feedback: Option<CriticVerdict>,
    /// Every routing verdict.
    #[reducer(append)]
    pub critic_history: Vec<CriticVerdict>,
    /// The writer's output.
    pub writer: Option<WriterOutput>,

    // Audit trail
    /// Where every checked free-text field came from (model, second try, or composed from
    /// the evidence), with what the refused answers had wrong.
    #[reducer(append)]
    pub field_checks: Vec<FieldCheck>,
    /// Search terms the codebase search has used; a new round runs only to search for more.
    #[reducer(append)]
    pub searched_terms: Vec<String>,
    /// Every agent run.
    #[reducer(append)]
    pub agent_runs: Vec<AgentRun>,
    /// Every routing decision.
    #[reducer(append)]
    pub routing: Vec<Routing>,
    /// The report files, once written.
    pub report_files: Option<ReportFiles>,
}

impl TriageState {
    /// Runs of `agent` in `round`.
    pub fn runs_in_round<'a>(
        &'a self,
        agent: &'a str,
        round: u32,
    ) -> impl Iterator<Item = &'a AgentRun> + 'a {
        self.agent_runs
            .iter()
            .filter(move |r| r.agent == agent && r.round == round)
    }

    /// Whether `agent` produced a finding in `round`.
    pub fn succeeded_in_round(&self, agent: &str, round: u32) -> bool {
        self.runs_in_round(agent, round).any(|r| r.ok)
    }

    /// Failed runs of `agent` in `round`.
    pub fn failures_in_round(&self, agent: &str, round: u32) -> usize {
        self.runs_in_round(agent, round).filter(|r| !r.ok).count()
    }
}
