//! The run's state (seed 000's `AgentState`) and the shapes the model answers in.

use crate::repo::{FileChange, Module};
use crate::ticket::{Ticket, TicketType};
use ferrograph::chat::agent::LlmCall;
use ferrograph::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How big the change is, as the model judges it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Complexity {
    /// A few lines.
    #[default]
    Low,
    /// A few places.
    Medium,
    /// Many places.
    High,
}

/// The classifier's answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "Classification")]
pub struct Classification {
    /// Bug or Story.
    pub confirmed_type: TicketType,
    /// One sentence.
    #[schemars(length(max = 200))]
    pub technical_summary: String,
    /// Classes or modules it is about.
    #[schemars(length(max = 4))]
    pub affected_components: Vec<String>,
    /// How big.
    pub complexity: Complexity,
}

/// The module picker's answer (modules and files are fixed to the repository's at run time).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "ModuleChoice")]
pub struct ModuleChoice {
    /// Modules to change.
    #[schemars(length(min = 1, max = 3))]
    pub affected_modules: Vec<String>,
    /// Why each is included.
    #[schemars(length(max = 300))]
    pub reasoning: String,
    /// Files likely to change.
    #[schemars(length(max = 4))]
    pub files_likely_to_change: Vec<String>,
}

/// One edit of a file: a line of it, and what replaces that line.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LineEdit {
    /// A line of the file, copied exactly (constrained to the file's own lines).
    pub find: String,
    /// The line or lines that replace it (empty: the line is removed).
    pub replace: String,
}

/// One proposed file, as the model writes it: edits of an existing file, or the whole
/// content of a new one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProposedFile {
    /// Path from the repository root.
    pub file_path: String,
    /// Edits of an existing file.
    #[serde(default)]
    pub edits: Vec<LineEdit>,
    /// The whole content of a new file.
    #[serde(default)]
    pub new_content: Option<String>,
    /// What changed and why.
    #[schemars(length(max = 160))]
    pub description: String,
}

/// The code generator's answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "CodeChanges")]
pub struct CodeChanges {
    /// The files.
    #[schemars(length(min = 1, max = 2))]
    pub changes: Vec<ProposedFile>,
    /// What causes the bug (bugs only).
    #[serde(default)]
    #[schemars(length(max = 300))]
    pub root_cause: String,
}

/// The test generator's answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "TestChanges")]
pub struct TestChanges {
    /// The test files.
    #[schemars(length(min = 1, max = 1))]
    pub tests: Vec<ProposedFile>,
}

/// One retrieved chunk of the repository.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    /// Path from the repository root.
    pub file_path: String,
    /// The module it belongs to.
    pub module: String,
    /// First line.
    pub start_line: u32,
    /// Last line.
    pub end_line: u32,
    /// Cosine similarity to the ticket.
    pub similarity: f32,
    /// The text.
    pub text: String,
}

/// The pull request as the run knows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PrRef {
    /// Its number in the local store.
    pub number: u64,
    /// `[KEY] summary`.
    pub title: String,
    /// The `git format-patch` series.
    pub patch_path: String,
    /// Where the branch was pushed, if anywhere.
    pub pushed_to: Option<String>,
}

/// Run statuses.
pub mod status {
    /// Waiting at the review gate.
    pub const AWAITING_REVIEW: &str = "awaiting review";
    /// Approved: branch, commits, pull request and comment made.
    pub const PR_OPENED: &str = "pr opened";
    /// The reviewer rejected the change; nothing was applied.
    pub const REJECTED: &str = "rejected";
    /// A fourth generation was asked for; nothing was applied.
    pub const REVISION_LIMIT: &str = "revision limit reached";
    /// The ticket does not exist; no model was called.
    pub const UNKNOWN_TICKET: &str = "unknown ticket";
    /// Something failed; `error` says what.
    pub const FAILED: &str = "failed";
}

/// The state of one ticket's run.
#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
pub struct TicketPrState {
    /// The ticket's key (input).
    pub ticket_key: String,
    /// The ticket folder or file (input).
    pub tickets: String,
    /// The repository's working tree (input).
    pub repo: String,
    /// Where the branch is pushed after approval: a remote's name, a path or a URL (input,
    /// optional).
    pub remote: Option<String>,
    /// Where the patch series is written (input; default `<data>/ticket-to-pr/out`).
    pub out: String,
    /// The ticket as fetched.
    pub ticket: Ticket,
    /// The branch the change is based on and its commit, fixed when the ticket is fetched.
    pub base_branch: String,
    /// The base commit.
    pub base_commit: String,
    /// The repository's modules at the base commit.
    pub modules: Vec<Module>,
    /// The classifier's answer.
    pub classification: Option<Classification>,
    /// The modules to change.
    pub affected_modules: Vec<String>,
    /// Why.
    pub module_reasoning: String,
    /// Files the module picker expects to change.
    pub affected_files: Vec<String>,
    /// The retrieved chunks, best first (at most 10).
    pub retrieved_chunks: Vec<Chunk>,
    /// A bug's root cause, as the model explains it.
    pub root_cause: String,
    /// Proposed source changes.
    pub proposed_changes: Vec<FileChange>,
    /// Proposed tests.
    pub proposed_tests: Vec<FileChange>,
    /// The proposed tests' runs in the sandbox, oldest first.
    #[reducer(append)]
    pub test_runs: Vec<crate::verify::TestRun>,
    /// Why the proposed tests were not run this generation (empty when they were).
    pub tests_not_run: String,
    /// Corrections made from test runs in this generation (at most
    /// [`crate::MAX_TEST_CORRECTIONS`]).
    pub test_corrections: u32,
    /// The reviewer's summary (Markdown).
    pub diff_summary: String,
    /// The unified diff of every proposed file against the base commit.
    pub diff: String,
    /// Scope warnings shown at the gate.
    pub warnings: Vec<String>,
    /// Generations so far (1 to 3).
    #[reducer(add)]
    pub generations: u32,
    /// Feedback from the reviewer, oldest first.
    #[reducer(append)]
    pub feedback: Vec<String>,
    /// The last answer at the gate: `approve`, `reject`, `feedback`, or empty.
    pub decision: String,
    /// When the gate opened (milliseconds since the Unix epoch).
    pub gate_opened_ms: u64,
    /// The change's branch.
    pub branch: String,
    /// Its commits, oldest first.
    pub commits: Vec<String>,
    /// The pull request.
    pub pr: Option<PrRef>,
    /// The id of the comment posted on the ticket.
    pub comment_id: String,
    /// See [`status`].
    pub status: String,
    /// What went wrong, when something did.
    pub error: Option<String>,
    /// Every model call.
    #[reducer(append)]
    pub llm_calls: Vec<LlmCall>,
    /// Progress, one line per step (the seed's `messages`).
    #[reducer(append)]
    pub messages: Vec<String>,
}

impl TicketPrState {
    /// Proposed changes and tests, one entry per path (a test entry for a path already
    /// changed replaces it), in order.
    pub fn all_changes(&self) -> Vec<FileChange> {
        let mut out: Vec<FileChange> = Vec::new();
        for c in self.proposed_changes.iter().chain(&self.proposed_tests) {
            match out.iter_mut().find(|o| o.file_path == c.file_path) {
                Some(o) => *o = c.clone(),
                None => out.push(c.clone()),
            }
        }
        out
    }

    /// The selected modules.
    pub fn selected_modules(&self) -> Vec<Module> {
        self.modules
            .iter()
            .filter(|m| self.affected_modules.contains(&m.name))
            .cloned()
            .collect()
    }
}
