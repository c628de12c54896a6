//! The investigation state: every field of seed 004's `InvestigationState`, typed.
//!
//! All of it serializes (JSON for the API and the audit store, bincode for checkpoints);
//! timestamps are ISO 8601 strings. Lists that record what happened (completed steps, planner
//! decisions, tool executions, evidence, hypotheses) are append-only: a node returns the new
//! entries and the merge rule appends them, so nothing recorded can be overwritten.

use ferrograph::prelude::*;
use serde::{Deserialize, Serialize};

/// Investigation status.
pub mod status {
    /// Created, not started.
    pub const PENDING: &str = "PENDING";
    /// Running.
    pub const IN_PROGRESS: &str = "IN_PROGRESS";
    /// Finished normally.
    pub const COMPLETED: &str = "COMPLETED";
    /// Finished with an error.
    pub const FAILED: &str = "FAILED";
    /// Stopped by the whole-run time limit; the state is saved and can be resumed.
    pub const TIMED_OUT: &str = "TIMED_OUT";
}

/// The planner's choice that ends the investigation.
pub const COMPLETE: &str = "COMPLETE";

/// Record of one tool execution.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolExecution {
    /// Tool name.
    pub tool_name: String,
    /// What went in, summarised.
    pub input_summary: Json,
    /// What came out, summarised.
    pub output_summary: Json,
    /// Wall time.
    pub execution_time_ms: u64,
    /// `SUCCESS`, `FAILED` or `TIMED_OUT`.
    pub status: String,
    /// Why it failed.
    pub error_message: Option<String>,
    /// When it ended, ISO 8601.
    pub timestamp: String,
}

/// Record of one planner decision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PlannerDecision {
    /// Step number (1-based).
    pub step: u32,
    /// Tool chosen, or `COMPLETE`.
    pub selected_tool: String,
    /// Why.
    pub reason: String,
    /// Planner confidence, 0..1.
    pub confidence: f64,
    /// Whether the deterministic sequence chose (LLM off, failed, timed out, or its choice
    /// was rejected by a safety rule).
    pub used_fallback: bool,
    /// What the LLM proposed when it was overruled, and why.
    pub rejected: Option<String>,
    /// Whether the safety rules allowed only this step, so no model was asked.
    #[serde(default)]
    pub forced: bool,
    /// When, ISO 8601.
    pub timestamp: String,
}

/// Runtime switches, persisted for the audit trail.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FeatureFlags {
    /// The planner asks the LLM (otherwise: the deterministic sequence).
    pub planner_llm_enabled: bool,
    /// The reasoning tool asks the LLM (otherwise: rule-based reasoning).
    pub reasoning_llm_enabled: bool,
    /// The similarity tool uses the HNSW index (otherwise: exact search).
    pub vector_search_enabled: bool,
    /// Free-text fields are sanitised before they reach a prompt.
    pub prompt_guard_enabled: bool,
}

impl Default for FeatureFlags {
    fn default() -> Self {
        FeatureFlags {
            planner_llm_enabled: true,
            reasoning_llm_enabled: true,
            vector_search_enabled: true,
            prompt_guard_enabled: true,
        }
    }
}

/// Hard limits, persisted for the audit trail.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Safeguards {
    /// Most planner steps.
    pub max_steps: u32,
    /// Whole-run limit.
    pub investigation_timeout_seconds: f64,
    /// Per-tool limit.
    pub tool_timeout_seconds: f64,
    /// Per-planner-call limit.
    pub planner_timeout_seconds: f64,
}

impl Default for Safeguards {
    fn default() -> Self {
        Safeguards {
            max_steps: 20,
            investigation_timeout_seconds: 120.0,
            tool_timeout_seconds: 30.0,
            planner_timeout_seconds: 20.0,
        }
    }
}

/// The state of one investigation (seed 004's `InvestigationState`).
#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
pub struct Investigation {
    // Identity
    /// Investigation id.
    pub investigation_id: String,
    /// The transaction under investigation.
    pub transaction_id: String,
    /// Dataset folder (empty: the default under the data directory).
    pub data_dir: String,

    // Context (context tool)
    /// Transaction, account, merchant and history summary.
    pub context: Json,

    // Evidence (analysis tools)
    /// Rules that fired (pattern tool).
    pub pattern_results: Json,
    /// Nearest historical transactions (similarity tool).
    pub similarity_results: Json,
    /// Hypotheses, appended by the tools that form them.
    #[reducer(append)]
    pub hypotheses: Vec<String>,
    /// Evidence items.
    #[reducer(append)]
    pub evidence: Vec<Json>,

    // Reasoning
    /// The reasoning tool's assessment.
    pub reasoning: Json,

    // Outputs
    /// Recommended actions.
    pub recommendations: Vec<Json>,
    /// A detection rule drafted from this case.
    pub rule_draft: Option<Json>,

    // Scoring
    /// Final confidence that the transaction is fraud, 0..1.
    pub confidence_score: f64,
    /// `CRITICAL`, `HIGH`, `MEDIUM` or `LOW`.
    pub severity: String,

    // Execution control
    /// See [`status`].
    pub status: String,
    /// Tools run (successfully or not), in order.
    #[reducer(append)]
    pub completed_steps: Vec<String>,
    /// Tool chosen by the planner, or `COMPLETE`.
    pub next_action: String,
    /// Planner steps taken.
    pub step_count: u32,
    /// Step limit.
    pub max_steps: u32,
    /// When it started, ISO 8601.
    pub started_at: String,
    /// When it ended, ISO 8601.
    pub completed_at: Option<String>,

    // Flags and limits
    /// Feature flags.
    pub feature_flags: FeatureFlags,
    /// Limits.
    pub safeguards: Safeguards,

    // Audit trail
    /// Every planner decision.
    #[reducer(append)]
    pub planner_decisions: Vec<PlannerDecision>,
    /// Every tool execution.
    #[reducer(append)]
    pub tool_executions: Vec<ToolExecution>,
    /// What went wrong, if anything.
    pub error: Option<String>,
}

impl Investigation {
    /// Whether the context tool produced a context.
    pub fn has_context(&self) -> bool {
        self.context.0.is_object()
    }

    /// Whether `tool` already ran.
    pub fn ran(&self, tool: &str) -> bool {
        self.completed_steps.iter().any(|s| s == tool)
    }
}
