//! The team's ubiquitous language (the seed's section 6): value objects and entities of the
//! five bounded contexts, and the shapes the agents answer in.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The current time, RFC 3339.
pub fn now() -> String {
    jiff::Timestamp::now().to_string()
}

// ── Value objects ───────────────────────────────────────────────────────────────────────

/// How urgent a story is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PriorityLevel {
    /// Blocks everything else.
    Critical,
    /// Needed for the release.
    High,
    /// Wanted.
    #[default]
    Medium,
    /// Nice to have.
    Low,
}

/// The quality gates QC enforces (the seed's `QualityGates`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QualityGates {
    /// Lowest line coverage of the program's own modules (0 to 1).
    pub min_test_coverage: f64,
    /// Highest cyclomatic complexity of one function.
    pub max_cyclomatic_complexity: u32,
    /// Every Python file must compile.
    pub lint_must_pass: bool,
    /// A type checker must pass (none is installed with the default toolchain: reported).
    pub type_check_must_pass: bool,
    /// A security scanner must pass (likewise).
    pub security_scan_must_pass: bool,
}

impl Default for QualityGates {
    fn default() -> Self {
        QualityGates {
            min_test_coverage: 0.8,
            max_cyclomatic_complexity: 10,
            lint_must_pass: true,
            type_check_must_pass: false,
            security_scan_must_pass: false,
        }
    }
}

// ── Requirement context ─────────────────────────────────────────────────────────────────

/// The product owner's clarified requirement (the seed's `RequirementDoc`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequirementDoc {
    /// `REQ-…`.
    pub doc_id: String,
    /// The brief as received.
    pub original_brief: String,
    /// What must be achieved.
    pub clarified_objectives: Vec<String>,
    /// What is not part of it.
    pub out_of_scope: Vec<String>,
    /// What the team assumes.
    pub assumptions: Vec<String>,
    /// Limits the solution must respect.
    pub constraints: Vec<String>,
    /// How success is measured.
    pub success_metrics: Vec<String>,
    /// Files the brief asks for (`name.py`), in its order.
    pub deliverables: Vec<String>,
    /// Who clarified it (an agent, or `fallback` when the brief's own text was used).
    pub clarified_by: String,
    /// When.
    pub clarified_at: String,
    /// Revisions after a rejection of the stories.
    pub revision: u32,
}

/// A user story (an entity: its id stays while its content changes).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UserStory {
    /// `US-1`, `US-2`, …
    pub story_id: String,
    /// Short title.
    pub title: String,
    /// "As a …"
    pub as_a: String,
    /// "I want …"
    pub i_want: String,
    /// "So that …"
    pub so_that: String,
    /// Testable statements.
    pub acceptance_criteria: Vec<String>,
    /// How urgent.
    pub priority: PriorityLevel,
    /// 1, 2, 3, 5 or 8.
    pub story_points: u8,
    /// draft, approved, rejected, done.
    pub status: String,
    /// The agent that wrote it.
    pub created_by: String,
}

// ── Design context ──────────────────────────────────────────────────────────────────────

/// A story as the design context sees it (the output of the anti-corruption layer).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionalRequirement {
    /// `FR-1`, …
    pub fr_id: String,
    /// The story it comes from.
    pub story_id: String,
    /// "The system shall …"
    pub statement: String,
    /// The acceptance criteria, as conditions the design must meet.
    pub conditions: Vec<String>,
    /// 1 (highest) to 4.
    pub rank: u8,
}

/// One component of the design.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Component {
    /// Its name.
    #[schemars(length(max = 40))]
    pub name: String,
    /// What it is responsible for.
    #[schemars(length(max = 140))]
    pub responsibility: String,
    /// The file that holds it (one of the brief's deliverables).
    pub file_path: String,
}

/// The architect's specification (the seed's `TechnicalSpec`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TechnicalSpec {
    /// `SPEC-…`.
    pub spec_id: String,
    /// Title.
    pub title: String,
    /// Components; each implements some functional requirements.
    pub components: Vec<Component>,
    /// Which functional requirements each component covers (component name → FR ids).
    pub covers: BTreeMap<String, Vec<String>>,
    /// Language, test framework, …
    pub tech_stack: BTreeMap<String, String>,
    /// Who approved it (the tech lead), when it is approved.
    pub approved_by: Option<String>,
    /// When.
    pub approved_at: Option<String>,
}

/// An architecture decision record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ArchitectureDecision {
    /// `ADR-1`, …
    pub adr_id: String,
    /// Title.
    pub title: String,
    /// proposed, accepted.
    pub status: String,
    /// Why a decision was needed.
    pub context: String,
    /// What was decided.
    pub decision: String,
    /// What follows from it.
    pub consequences: Vec<String>,
    /// What else was considered.
    pub alternatives_considered: Vec<String>,
    /// Who decided.
    pub decided_by: String,
    /// When.
    pub decided_at: String,
}

// ── Implementation context ──────────────────────────────────────────────────────────────

/// One task of the implementation plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImplementationTask {
    /// `T-1`, …
    pub task_id: String,
    /// The story it serves (the first of the component's).
    pub story_id: String,
    /// Title.
    pub title: String,
    /// What to build, and the definition of done.
    pub description: String,
    /// The file it produces.
    pub file_path: String,
    /// Tasks that must be done first.
    pub dependencies: Vec<String>,
    /// pending, done, failed.
    pub status: String,
}

/// A file the engineer produced, at a commit of the workspace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CodeArtifact {
    /// `ART-<attempt>-<n>`.
    pub artifact_id: String,
    /// The task.
    pub task_id: String,
    /// `python`.
    pub language: String,
    /// Path in the workspace.
    pub file_path: String,
    /// The source.
    pub content: String,
    /// Who wrote it: the model, or `fallback` (the brief's reference implementation).
    pub written_by: String,
    /// The workspace commit that holds it.
    pub commit_hash: Option<String>,
}

/// The outcome of one run of the tests (the seed's `TestResults`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TestResults {
    /// `RUN-…`.
    pub run_id: String,
    /// Tests found.
    pub total_tests: u32,
    /// Passed.
    pub passed: u32,
    /// Failed or errored.
    pub failed: u32,
    /// Skipped.
    pub skipped: u32,
    /// Line coverage of the program's modules (percent).
    pub coverage_percent: f64,
    /// Wall time.
    pub duration_seconds: f64,
    /// Ids of the failing tests.
    pub failed_test_ids: Vec<String>,
    /// Ids of every test that ran.
    pub test_ids: Vec<String>,
    /// Coverage per module (percent).
    pub coverage_report: BTreeMap<String, f64>,
    /// Whether every file compiled.
    pub lint_passed: bool,
    /// Highest cyclomatic complexity, and the function.
    pub max_complexity: u32,
    /// The function with the highest complexity.
    pub most_complex: String,
    /// The runner's output (unittest's report, tracebacks), cut to 6,000 characters.
    pub output: String,
    /// How the network was cut off: `namespace` or `python` (socket creation refused).
    pub network: String,
    /// How the run was fenced in (`confined (uid 4242420, cgroup v1)`, or `UNCONFINED …`
    /// where the user allowed it); empty in records older than the confinement.
    #[serde(default)]
    pub confinement: String,
    /// Whether the run hit its time limit.
    pub timed_out: bool,
    /// When.
    pub run_at: String,
}

impl TestResults {
    /// Whether tests ran and none failed.
    pub fn passing(&self) -> bool {
        self.total_tests > 0 && self.failed == 0 && !self.timed_out && self.lint_passed
    }
}

// ── Quality context ─────────────────────────────────────────────────────────────────────

/// A test case QC derives from a story (not from the engineer's code).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TestCase {
    /// `TC-US-1-1`, …
    pub test_id: String,
    /// The story.
    pub story_id: String,
    /// Title.
    pub title: String,
    /// unit, integration, e2e.
    pub test_type: String,
    /// Preconditions.
    pub preconditions: Vec<String>,
    /// Steps.
    pub steps: Vec<String>,
    /// Expected result.
    pub expected_result: String,
    /// pending, passed, failed, uncovered (no test of the suite exercises it by name).
    pub status: String,
    /// The suite's tests matched to it.
    pub matched_tests: Vec<String>,
    /// Why it failed.
    pub failure_reason: Option<String>,
}

// ── Deployment context ──────────────────────────────────────────────────────────────────

/// The CI configuration DevOps prepares.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CicdConfig {
    /// `CI-…`.
    pub config_id: String,
    /// `github_actions`.
    pub pipeline_tool: String,
    /// The YAML (checked to parse, with a job that runs the tests).
    pub pipeline_yaml: String,
    /// Environments.
    pub environments: Vec<String>,
    /// Commands that run the tests.
    pub test_commands: Vec<String>,
    /// Commands that deploy.
    pub deploy_commands: Vec<String>,
    /// How to roll back.
    pub rollback_procedure: String,
    /// Who wrote it.
    pub generated_by: String,
    /// When.
    pub generated_at: String,
}

/// Where the deployment stands.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeploymentStatus {
    /// pending, deployed, failed, rolled_back.
    pub status: String,
    /// `production` (a local folder).
    pub environment: String,
    /// When.
    pub deployed_at: Option<String>,
    /// Who approved it.
    pub deployed_by: String,
    /// The folder of the release.
    pub deployment_path: Option<String>,
    /// The release tag.
    pub version: Option<String>,
}

// ── Coordination ────────────────────────────────────────────────────────────────────────

/// Something that stops the work until someone acts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Blocker {
    /// `BLK-…`.
    pub blocker_id: String,
    /// What is wrong.
    pub description: String,
    /// The agent that cannot go on.
    pub blocked_agent: String,
    /// The agent that raised it.
    pub raised_by: String,
    /// When.
    pub raised_at: String,
    /// Who must act, and how (the route).
    pub route: String,
    /// Whether it is resolved.
    pub resolved: bool,
    /// How.
    pub resolution: Option<String>,
}

// ── What the agents answer (constrained JSON for a small model) ────────────────────────

/// The product owner's answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "Clarification")]
pub struct Clarification {
    /// What must be achieved, one short sentence each.
    #[schemars(length(min = 1, max = 4))]
    pub objectives: Vec<String>,
    /// What is not part of it.
    #[schemars(length(max = 3))]
    pub out_of_scope: Vec<String>,
    /// Assumptions.
    #[schemars(length(max = 3))]
    pub assumptions: Vec<String>,
    /// How success is measured.
    #[schemars(length(max = 3))]
    pub success_metrics: Vec<String>,
}

/// One story as the analyst writes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StoryDraft {
    /// Short title.
    #[schemars(length(max = 80))]
    pub title: String,
    /// The user's role.
    #[schemars(length(max = 40))]
    pub as_a: String,
    /// What they want.
    #[schemars(length(max = 140))]
    pub i_want: String,
    /// Why.
    #[schemars(length(max = 140))]
    pub so_that: String,
    /// Testable statements.
    #[schemars(length(min = 1, max = 3))]
    pub acceptance_criteria: Vec<String>,
    /// How urgent.
    pub priority: PriorityLevel,
    /// Size: 1, 2, 3, 5 or 8.
    #[schemars(range(min = 1, max = 8))]
    pub story_points: u8,
}

/// The analyst's answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "UserStories")]
pub struct StoryDrafts {
    /// The stories.
    #[schemars(length(min = 1, max = 4))]
    pub stories: Vec<StoryDraft>,
}

/// The architect's decision, as written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DecisionDraft {
    /// Title.
    #[schemars(length(max = 80))]
    pub title: String,
    /// Why a decision was needed.
    #[schemars(length(max = 200))]
    pub context: String,
    /// What was decided.
    #[schemars(length(max = 200))]
    pub decision: String,
    /// What follows.
    #[schemars(length(max = 2))]
    pub consequences: Vec<String>,
    /// What else was considered.
    #[schemars(length(max = 2))]
    pub alternatives: Vec<String>,
}

/// The architect's answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "TechnicalDesign")]
pub struct DesignDraft {
    /// Components (file paths are the brief's deliverables).
    #[schemars(length(min = 1, max = 3))]
    pub components: Vec<Component>,
    /// The main decision.
    pub decision: DecisionDraft,
}

/// The tech lead's review of the design.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "DesignReview")]
pub struct DesignReview {
    /// Whether the design can be built as is.
    pub approved: bool,
    /// Notes for the engineer.
    #[schemars(length(max = 3))]
    pub notes: Vec<String>,
}

/// A Python module, as the engineer writes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "PythonModule")]
pub struct ModuleCode {
    /// The whole file.
    pub code: String,
}

/// The runbook, as DevOps writes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "Runbook")]
pub struct RunbookDraft {
    /// One sentence on what is released.
    #[schemars(length(max = 200))]
    pub summary: String,
    /// Steps to release.
    #[schemars(length(min = 1, max = 5))]
    pub rollout_steps: Vec<String>,
    /// Checks after the release.
    #[schemars(length(max = 3))]
    pub smoke_checks: Vec<String>,
    /// Steps to roll back.
    #[schemars(length(min = 1, max = 4))]
    pub rollback_steps: Vec<String>,
}
