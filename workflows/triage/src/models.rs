//! The triage agents' inputs and outputs as Rust types (seed 001's models), and the
//! translations between them.
//!
//! Each agent's model answer is a `…Output` type: the fields the LLM fills, with bounds
//! (lengths, ranges, enums) that constrained decoding enforces. The agent node turns it into
//! the agent's finding (`…Finding`, seed 001's `AgentFindingBase` subclasses: `agent_name`,
//! `summary`, `confidence`, `reasoning`, `error`, plus the agent's own fields), and
//! [`to_agent_finding`] translates a finding into the common [`AgentFinding`] that the state
//! accumulates.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The common finding type kept in the state (seed 001's `AgentFinding`), tagged with the
/// investigation round it belongs to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentFinding {
    /// Which agent.
    pub agent_name: String,
    /// One-line summary.
    pub summary: String,
    /// The agent's confidence, 0..1.
    pub confidence: f64,
    /// Agent-specific detail (hypothesis, root-cause location, …).
    pub details: String,
    /// Files, areas, sources or gaps the finding points at.
    pub relevant_files: Vec<String>,
    /// Investigation round (1-based; a critic rejection starts the next).
    pub round: u32,
}

/// What every agent's finding carries (seed 001's `AgentFindingBase`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FindingBase {
    /// Which agent.
    pub agent_name: String,
    /// One-line summary.
    pub summary: String,
    /// Confidence, 0..1.
    pub confidence: f64,
    /// Why.
    pub reasoning: String,
    /// Set when the agent could not produce a finding: the finding is then not appended and
    /// the supervisor re-routes.
    pub error: Option<String>,
}

impl FindingBase {
    /// A base for `agent` that failed with `error`.
    pub fn failed(agent: &str, error: impl Into<String>) -> Self {
        FindingBase {
            agent_name: agent.to_string(),
            error: Some(error.into()),
            ..FindingBase::default()
        }
    }
}

/// Translates an agent's finding into the common [`AgentFinding`] (seed 001's
/// `_to_agent_finding`): `details` and `relevant_files` come from the agent-specific fields.
pub fn to_agent_finding(
    base: &FindingBase,
    details: String,
    relevant_files: Vec<String>,
    round: u32,
) -> AgentFinding {
    AgentFinding {
        agent_name: base.agent_name.clone(),
        summary: base.summary.clone(),
        confidence: base.confidence,
        details,
        relevant_files,
        round,
    }
}

// ---------------------------------------------------------------------------------------
// Investigator

/// The investigator's model answer: one sentence and a choice. Error messages, stack
/// frames, identifiers and keywords are extracted from the report in code (see
/// [`super::evidence`]), not asked for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InvestigatorOutput {
    /// One sentence: which code does what wrong.
    #[schemars(length(min = 20, max = 220))]
    pub hypothesis: String,
    /// The code names most involved (constrained to the report's identifiers and the
    /// repository's modules).
    #[schemars(length(min = 1, max = 3))]
    pub affected_areas: Vec<String>,
}

/// The investigator's finding (seed 001's `InvestigatorFinding`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InvestigatorFinding {
    /// Base fields.
    pub base: FindingBase,
    /// Root-cause hypothesis.
    pub hypothesis: String,
    /// Module or subsystem names.
    pub affected_areas: Vec<String>,
    /// Keywords for the searches.
    pub keywords_for_search: Vec<String>,
    /// Verbatim error strings from the issue.
    pub error_messages: Vec<String>,
}

// ---------------------------------------------------------------------------------------
// Web search (offline docs)

/// The docs-search synthesis answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WebSearchOutput {
    /// One sentence: what the passages say about the bug (or that they say nothing).
    #[schemars(length(min = 20, max = 200))]
    pub summary: String,
    /// The sources that matter (constrained to the sources the search returned).
    #[schemars(length(max = 2))]
    pub relevant_sources: Vec<String>,
}

/// One search result the web-search agent kept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WebResult {
    /// Source (document path or URL).
    pub url: String,
    /// Where in it.
    pub location: Option<String>,
    /// Similarity score of the search hit.
    pub score: f32,
    /// The start of the passage.
    pub snippet: String,
}

/// The web-search agent's finding (seed 001's `WebSearchFinding`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WebSearchFinding {
    /// Base fields.
    pub base: FindingBase,
    /// External root cause, if any.
    pub external_root_cause: Option<String>,
    /// Results that matter.
    pub relevant_results: Vec<WebResult>,
    /// The queries the model asked for.
    pub queries: Vec<String>,
}

// ---------------------------------------------------------------------------------------
// Codebase search

/// The codebase-search answer: which of the retrieved regions holds the root cause, and
/// what is wrong there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CodebaseOutput {
    /// The retrieved code region most likely holding the root cause (`path:start-end`,
    /// constrained to the regions shown).
    pub root_cause_location: String,
    /// One or two sentences: what that code does wrong.
    #[schemars(length(min = 20, max = 240))]
    pub explanation: String,
}

/// A file the codebase search points at (seed 001's `RelevantFile`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RelevantFile {
    /// Path in the repository.
    pub path: String,
    /// Why it is relevant.
    pub relevance_reason: String,
    /// `model` (the model chose it among the retrieved files) or `retrieval` (retrieved,
    /// not chosen).
    pub source: String,
    /// Best retrieval score of its chunks.
    pub score: f32,
}

/// The codebase-search agent's finding (seed 001's `CodebaseFinding`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CodebaseFinding {
    /// Base fields.
    pub base: FindingBase,
    /// Files, the model's choices first, then the other retrieved files by score.
    pub relevant_files: Vec<RelevantFile>,
    /// `path:start-end` of the likely root cause.
    pub root_cause_location: Option<String>,
    /// The retrieved regions the model saw (`path:start-end (score)`).
    pub evidence: Vec<String>,
}

// ---------------------------------------------------------------------------------------
// Critic

/// The critic's three-way verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Critique {
    /// Coherent, evidenced, enough for a report.
    Confirmed,
    /// Plausible but lacking direct evidence.
    Uncertain,
    /// Speculative or contradictory: investigate more.
    Challenged,
}

/// The critic's model answer: a verdict, and the gaps it sees among the checks that failed
/// (constrained to those).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CritiqueOutput {
    /// The verdict.
    pub verdict: Critique,
    /// Gaps, chosen among the failed checks.
    #[schemars(length(max = 2))]
    pub gaps: Vec<String>,
    /// One sentence on why.
    #[schemars(length(min = 15, max = 200))]
    pub summary: String,
}

/// The critic's finding (seed 001's `CritiqueFinding`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CritiqueFinding {
    /// Base fields.
    pub base: FindingBase,
    /// The three-way verdict.
    pub verdict: Critique,
    /// Confidence delta.
    pub confidence_adjustment: f64,
    /// Gaps.
    pub gaps: Vec<String>,
    /// Revised hypothesis.
    pub revised_hypothesis: Option<String>,
    /// Ready for the writer.
    pub ready_for_report: bool,
}

/// The binary gate the supervisor routes on (seed 001's `CriticVerdict`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Gate {
    /// The writer may proceed.
    Approved,
    /// Re-investigate.
    Rejected,
}

/// The critic's routing verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CriticVerdict {
    /// Approved or rejected.
    pub verdict: Gate,
    /// Gaps (empty when approved).
    pub gaps: Vec<String>,
    /// What evidence would change the verdict (empty when approved).
    pub required_evidence: Vec<String>,
    /// Confidence in the verdict, 0..1.
    pub confidence: f64,
    /// The round it judged.
    pub round: u32,
}

/// The deterministic mapping from the critic's review to the routing gate: approved when
/// the review is CONFIRMED and ready for a report (the critic's code sets readiness from its
/// checks and a verdict that names no gap); a rejection carries its gaps, and the search
/// terms that would close them as the required evidence; the confidence is 0.5 moved by the
/// adjustment, clamped to 0..1.
pub fn map_critique_to_verdict(
    c: &CritiqueFinding,
    required_evidence: Vec<String>,
    round: u32,
) -> CriticVerdict {
    let approved = c.verdict == Critique::Confirmed && c.ready_for_report;
    CriticVerdict {
        verdict: if approved {
            Gate::Approved
        } else {
            Gate::Rejected
        },
        gaps: if approved { Vec::new() } else { c.gaps.clone() },
        required_evidence: if approved {
            Vec::new()
        } else {
            required_evidence
        },
        confidence: (0.5 + c.confidence_adjustment).clamp(0.0, 1.0),
        round,
    }
}

// ---------------------------------------------------------------------------------------
// Writer

/// Severity of the bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Severity {
    /// Data loss, security, outage.
    Critical,
    /// Wrong results for common use.
    High,
    /// Wrong results in some cases.
    Medium,
    /// Cosmetic or rare.
    Low,
}

impl Severity {
    /// The severity the report's words support: CRITICAL for data loss, corruption,
    /// security or an outage; HIGH for a crash, an exception or a panic (an error line);
    /// LOW for documentation, typos or cosmetic output; MEDIUM otherwise (wrong results).
    pub fn from_evidence(text: &str, has_error_line: bool) -> Severity {
        let t = text.to_lowercase();
        let any = |words: &[&str]| words.iter().any(|w| t.contains(w));
        if any(&[
            "data loss",
            "lost data",
            "corrupt",
            "security",
            "vulnerab",
            "remote code",
            "injection",
            "outage",
        ]) {
            Severity::Critical
        } else if has_error_line || any(&["crash", "panic", "segfault", "traceback", "exception"]) {
            Severity::High
        } else if any(&["typo", "documentation", "docstring", "cosmetic", "deprecat"]) {
            Severity::Low
        } else {
            Severity::Medium
        }
    }

    /// The name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Critical => "CRITICAL",
            Severity::High => "HIGH",
            Severity::Medium => "MEDIUM",
            Severity::Low => "LOW",
        }
    }
}

/// The triage report (the writer's report sub-call).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TriageReport {
    /// Report title.
    #[schemars(length(min = 3, max = 120))]
    pub title: String,
    /// Severity.
    pub severity: Severity,
    /// Root cause, in a few sentences.
    #[schemars(length(min = 3, max = 400))]
    pub root_cause: String,
    /// Files involved (constrained to the files the findings name).
    #[schemars(length(max = 4))]
    pub affected_files: Vec<String>,
    /// Steps to reproduce.
    #[schemars(length(max = 4))]
    pub reproduction_steps: Vec<Step>,
    /// The fix to make.
    #[schemars(length(min = 3, max = 300))]
    pub suggested_fix: String,
    /// Confidence in the report, 0..1.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub confidence: f64,
}

/// One step of a list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct Step(#[schemars(length(min = 1, max = 160))] pub String);

/// Effort estimate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Effort {
    /// Under an hour.
    XS,
    /// A few hours.
    S,
    /// A day or two.
    M,
    /// About a week.
    L,
    /// More.
    XL,
}

impl Effort {
    /// The effort the findings suggest: S when one file stands out, M when the top files
    /// score alike (the change may span them).
    pub fn from_files(scores: &[f32]) -> Effort {
        match scores {
            [] | [_] => Effort::S,
            [a, b, ..] if *b < 0.7 * *a => Effort::S,
            _ => Effort::M,
        }
    }
}

/// The writer's root-cause sub-call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RootCauseOutput {
    /// One or two sentences: what is wrong, where.
    #[schemars(length(min = 30, max = 300))]
    pub root_cause: String,
}

/// The writer's fix sub-call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FixOutput {
    /// One or two sentences: the change to make.
    #[schemars(length(min = 20, max = 240))]
    pub suggested_fix: String,
}

/// The writer's ticket sub-call: the title and the choices from configured lists. Severity
/// and effort are decided in code from the evidence ([`Severity::from_evidence`],
/// [`Effort::from_files`]): a 135M model picks the first enum value, not the right one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TicketOutput {
    /// Ticket title: the symptom and where.
    #[schemars(length(min = 12, max = 90))]
    pub title: String,
    /// Labels (constrained to the configured vocabulary).
    #[schemars(length(min = 1, max = 3))]
    pub labels: Vec<String>,
    /// Assignee (constrained to the configured team; empty when there is none).
    pub assignee: String,
}

/// The writer's merged output (seed 001's `WriterOutput`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WriterOutput {
    /// Base fields.
    pub base: FindingBase,
    /// The report.
    pub report: TriageReport,
    /// The issue comment, Markdown.
    pub github_comment_markdown: String,
    /// Ticket title.
    pub ticket_title: String,
    /// Ticket labels.
    pub ticket_labels: Vec<String>,
    /// Suggested assignee ("" when none).
    pub ticket_assignee_suggestion: String,
    /// Effort estimate.
    pub ticket_effort_estimate: Effort,
}

/// Whether the report's words support a ticket label of [`DEFAULT_LABELS`]: `crash` needs an
/// error line or a crash word, `regression` a report that it used to work, `performance`
/// slowness or memory, `wrong-result` an expected/actual contrast, `documentation` docs words,
/// `needs-repro` a report without a reproduction. `bug` and labels outside the default
/// vocabulary (a project's own) are always supported: the model chose them from the
/// configured list.
///
/// [`DEFAULT_LABELS`]: crate::agents::DEFAULT_LABELS
pub fn label_supported(label: &str, text: &str, has_error_line: bool, has_repro: bool) -> bool {
    let t = text.to_lowercase();
    let any = |words: &[&str]| words.iter().any(|w| t.contains(w));
    match label {
        "crash" => has_error_line || any(&["crash", "panic", "segfault", "traceback", "exception"]),
        "regression" => any(&[
            "regression",
            "used to work",
            "worked in",
            "worked fine in",
            "worked before",
            "no longer",
            "since upgrading",
            "after upgrading",
            "since version",
            "broke in",
        ]),
        "performance" => any(&[
            "slow",
            "performance",
            "latency",
            "memory",
            "takes too long",
            "hangs",
            "timeout",
            "quadratic",
        ]),
        "wrong-result" => {
            any(&[
                "expected",
                "should be",
                "should return",
                "incorrect",
                "wrong",
            ]) && any(&["actual", "instead", "but got", "returns", "gives", "prints"])
        }
        "documentation" => any(&["documentation", "docstring", "the docs", "readme", "typo"]),
        "needs-repro" => !has_repro,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn critique(verdict: Critique, ready: bool, adj: f64) -> CritiqueFinding {
        CritiqueFinding {
            base: FindingBase {
                agent_name: "critic".into(),
                ..Default::default()
            },
            verdict,
            confidence_adjustment: adj,
            gaps: vec!["no test reproduces it".into()],
            revised_hypothesis: None,
            ready_for_report: ready,
        }
    }

    #[test]
    fn only_a_confirmed_ready_review_is_approved() {
        let v = map_critique_to_verdict(
            &critique(Critique::Confirmed, true, 0.2),
            vec!["x".into()],
            1,
        );
        assert_eq!(v.verdict, Gate::Approved);
        assert!(v.gaps.is_empty() && v.required_evidence.is_empty());
        assert!((v.confidence - 0.7).abs() < 1e-9);
        for (c, ready) in [
            (Critique::Confirmed, false),
            (Critique::Uncertain, true),
            (Critique::Challenged, true),
        ] {
            let v = map_critique_to_verdict(
                &critique(c, ready, -0.9),
                vec!["apply_discounts".into()],
                2,
            );
            assert_eq!(v.verdict, Gate::Rejected, "{c:?} ready={ready}");
            assert_eq!(v.required_evidence, vec!["apply_discounts"]);
            assert_eq!(v.gaps, vec!["no test reproduces it"]);
            assert_eq!(v.confidence, 0.0);
            assert_eq!(v.round, 2);
        }
    }

    #[test]
    fn output_schemas_are_bounded() {
        let s = serde_json::to_value(schemars::schema_for!(InvestigatorOutput)).unwrap();
        let p = &s["properties"];
        assert_eq!(p["hypothesis"]["maxLength"], 220);
        assert_eq!(p["affected_areas"]["maxItems"], 3);
        let c = serde_json::to_value(schemars::schema_for!(CritiqueOutput)).unwrap();
        let verdict = serde_json::to_string(&c).unwrap();
        assert!(verdict.contains("CONFIRMED") && verdict.contains("CHALLENGED"));
        let t = serde_json::to_value(schemars::schema_for!(TicketOutput)).unwrap();
        assert_eq!(t["properties"]["title"]["maxLength"], 90);
        assert!(t["properties"].get("severity").is_none());
    }

    #[test]
    fn labels_need_support_in_the_report() {
        let fixture = include_str!("../../../tests/fixtures/triage/issue.md");
        assert!(label_supported("bug", fixture, true, true));
        assert!(label_supported("crash", fixture, true, true));
        assert!(label_supported("wrong-result", fixture, true, true));
        assert!(!label_supported("performance", fixture, true, true));
        assert!(!label_supported("regression", fixture, true, true));
        assert!(!label_supported("needs-repro", fixture, true, true));
        assert!(label_supported(
            "regression",
            "It used to work in 1.2",
            false,
            true
        ));
        assert!(label_supported("team-billing", "anything", false, false));
    }

    #[test]
    fn severity_and_effort_follow_the_evidence() {
        assert_eq!(
            Severity::from_evidence("the cache gets corrupted", false),
            Severity::Critical
        );
        assert_eq!(Severity::from_evidence("it fails", true), Severity::High);
        assert_eq!(
            Severity::from_evidence("thread 'main' panicked at", false),
            Severity::High
        );
        assert_eq!(
            Severity::from_evidence("typo in the docstring", false),
            Severity::Low
        );
        assert_eq!(
            Severity::from_evidence("returns 3 instead of 4", false),
            Severity::Medium
        );
        assert_eq!(Effort::from_files(&[0.3, 0.1]), Effort::S);
        assert_eq!(Effort::from_files(&[0.3, 0.28]), Effort::M);
    }
}
