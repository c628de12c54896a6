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

/// The investigator's model answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InvestigatorOutput {
    /// One-line summary of the bug.
    #[schemars(length(min = 3, max = 160))]
    pub summary: String,
    /// Concise root-cause hypothesis.
    #[schemars(length(min = 3, max = 300))]
    pub hypothesis: String,
    /// Modules, classes or subsystems involved.
    #[schemars(length(min = 1, max = 4))]
    pub affected_areas: Vec<Short>,
    /// Search-ready keywords for the code and docs searches.
    #[schemars(length(min = 1, max = 6))]
    pub keywords_for_search: Vec<Short>,
    /// Error messages from the issue, verbatim (constrained to the issue's own lines).
    #[schemars(length(max = 3))]
    pub error_messages: Vec<String>,
    /// How clearly the issue points to a root cause, 0..1.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub confidence: f64,
    /// Why.
    #[schemars(length(max = 300))]
    pub reasoning: String,
}

/// A short string (a keyword, an area name).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct Short(#[schemars(length(min = 1, max = 48))] pub String);

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

impl InvestigatorFinding {
    /// From the model's answer.
    pub fn from_output(o: InvestigatorOutput) -> Self {
        InvestigatorFinding {
            base: FindingBase {
                agent_name: "investigator".into(),
                summary: o.summary,
                confidence: o.confidence.clamp(0.0, 1.0),
                reasoning: o.reasoning,
                error: None,
            },
            hypothesis: o.hypothesis,
            affected_areas: o.affected_areas.into_iter().map(|s| s.0).collect(),
            keywords_for_search: o.keywords_for_search.into_iter().map(|s| s.0).collect(),
            error_messages: o.error_messages,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Web search (offline docs)

/// The docs-search synthesis answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WebSearchOutput {
    /// One-line summary of what the docs say about the bug.
    #[schemars(length(min = 3, max = 160))]
    pub summary: String,
    /// A known external cause (library behaviour, documented pitfall), if the docs show one.
    #[schemars(length(max = 300))]
    pub external_root_cause: String,
    /// The sources that matter (constrained to the sources the search returned).
    #[schemars(length(max = 3))]
    pub relevant_sources: Vec<String>,
    /// Confidence, 0..1.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub confidence: f64,
    /// Why.
    #[schemars(length(max = 300))]
    pub reasoning: String,
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

/// The codebase-search answer. Paths and the location are constrained to what retrieval
/// returned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CodebaseOutput {
    /// One-line summary.
    #[schemars(length(min = 3, max = 160))]
    pub summary: String,
    /// The retrieved files most likely involved, most likely first.
    #[schemars(length(min = 1, max = 3))]
    pub relevant_paths: Vec<String>,
    /// The retrieved code region most likely holding the root cause (`path:start-end`).
    pub root_cause_location: String,
    /// What is wrong there.
    #[schemars(length(max = 300))]
    pub explanation: String,
    /// Confidence, 0..1.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub confidence: f64,
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

/// The critic's model answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CritiqueOutput {
    /// One-line summary of the review.
    #[schemars(length(min = 3, max = 160))]
    pub summary: String,
    /// The verdict.
    pub verdict: Critique,
    /// Delta applied to the overall confidence.
    #[schemars(range(min = -0.5, max = 0.5))]
    pub confidence_adjustment: f64,
    /// Specific gaps or unsupported claims.
    #[schemars(length(max = 3))]
    pub gaps: Vec<Short>,
    /// A better hypothesis, if the critic has one.
    #[schemars(length(max = 300))]
    pub revised_hypothesis: Option<String>,
    /// Whether a report can be written now.
    pub ready_for_report: bool,
    /// Confidence in the review, 0..1.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub confidence: f64,
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

/// The deterministic mapping from the critic's review to the routing gate: approved only
/// when the review is CONFIRMED *and* ready for a report; the gaps double as the required
/// evidence; the confidence is 0.5 moved by the adjustment, clamped to 0..1.
pub fn map_critique_to_verdict(c: &CritiqueFinding, round: u32) -> CriticVerdict {
    let approved = c.verdict == Critique::Confirmed && c.ready_for_report;
    CriticVerdict {
        verdict: if approved {
            Gate::Approved
        } else {
            Gate::Rejected
        },
        gaps: if approved { Vec::new() } else { c.gaps.clone() },
        required_evidence: if approved { Vec::new() } else { c.gaps.clone() },
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

/// Ticket fields (the writer's ticket sub-call).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TicketFields {
    /// Ticket title.
    #[schemars(length(min = 3, max = 100))]
    pub title: String,
    /// Labels.
    #[schemars(length(min = 1, max = 4))]
    pub labels: Vec<Short>,
    /// Suggested owner, if one is apparent.
    pub assignee: Option<Short>,
    /// Effort.
    pub effort: Effort,
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

/// Merges the writer's three parallel sub-results (seed 001's `merge_writer_outputs`): the
/// report's confidence becomes the writer's, a missing assignee becomes "".
pub fn merge_writer_outputs(
    report: TriageReport,
    comment: String,
    ticket: TicketFields,
) -> WriterOutput {
    WriterOutput {
        base: FindingBase {
            agent_name: "writer".into(),
            summary: format!("Triage complete: {} severity", report.severity.as_str()),
            confidence: report.confidence.clamp(0.0, 1.0),
            reasoning: "Final report generated from accumulated findings.".into(),
            error: None,
        },
        github_comment_markdown: comment,
        ticket_title: ticket.title,
        ticket_labels: ticket.labels.into_iter().map(|l| l.0).collect(),
        ticket_assignee_suggestion: ticket.assignee.map(|a| a.0).unwrap_or_default(),
        ticket_effort_estimate: ticket.effort,
        report,
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
        let v = map_critique_to_verdict(&critique(Critique::Confirmed, true, 0.2), 1);
        assert_eq!(v.verdict, Gate::Approved);
        assert!(v.gaps.is_empty() && v.required_evidence.is_empty());
        assert!((v.confidence - 0.7).abs() < 1e-9);
        for (c, ready) in [
            (Critique::Confirmed, false),
            (Critique::Uncertain, true),
            (Critique::Challenged, true),
        ] {
            let v = map_critique_to_verdict(&critique(c, ready, -0.9), 2);
            assert_eq!(v.verdict, Gate::Rejected, "{c:?} ready={ready}");
            assert_eq!(v.required_evidence, v.gaps);
            assert_eq!(v.confidence, 0.0);
            assert_eq!(v.round, 2);
        }
    }

    #[test]
    fn writer_merge_maps_every_field() {
        let report = TriageReport {
            title: "t".into(),
            severity: Severity::High,
            root_cause: "rc".into(),
            affected_files: vec!["a.py".into()],
            reproduction_steps: vec![Step("run".into())],
            suggested_fix: "fix".into(),
            confidence: 0.8,
        };
        let ticket = TicketFields {
            title: "T".into(),
            labels: vec![Short("bug".into())],
            assignee: None,
            effort: Effort::S,
        };
        let w = merge_writer_outputs(report.clone(), "## c".into(), ticket);
        assert_eq!(w.base.agent_name, "writer");
        assert_eq!(w.base.summary, "Triage complete: HIGH severity");
        assert_eq!(w.base.confidence, 0.8);
        assert_eq!(w.ticket_assignee_suggestion, "");
        assert_eq!(w.ticket_labels, vec!["bug"]);
        assert_eq!(w.report, report);
        assert_eq!(w.ticket_effort_estimate, Effort::S);
    }

    #[test]
    fn output_schemas_are_bounded() {
        let s = serde_json::to_value(schemars::schema_for!(InvestigatorOutput)).unwrap();
        let p = &s["properties"];
        assert_eq!(p["summary"]["maxLength"], 160);
        assert_eq!(p["keywords_for_search"]["maxItems"], 6);
        assert_eq!(p["confidence"]["maximum"], 1.0);
        let c = serde_json::to_value(schemars::schema_for!(CritiqueOutput)).unwrap();
        let verdict = serde_json::to_string(&c).unwrap();
        assert!(verdict.contains("CONFIRMED") && verdict.contains("CHALLENGED"));
    }
}
