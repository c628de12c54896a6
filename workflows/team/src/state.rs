//! The run's state (the seed's `TeamState`), grouped by bounded context: each agent
//! replaces the group it owns. Version 2; version 1 (the seed's outbox shape) migrates.

use crate::domain::*;
use crate::events::{Envelope, Outbox};
use crate::lifecycle::{ReqState, TransitionRecord};
use ferrograph::chat::agent::LlmCall;
use ferrograph::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Run statuses.
pub mod status {
    /// Waiting at the stories gate.
    pub const AWAITING_STORIES: &str = "awaiting stories approval";
    /// Waiting at the deployment gate.
    pub const AWAITING_DEPLOYMENT: &str = "awaiting deployment approval";
    /// Waiting for the manager after three failed attempts.
    pub const ESCALATED: &str = "escalated to the manager";
    /// Released.
    pub const DEPLOYED: &str = "deployed";
    /// The brief is too vague; a blocker says who must act.
    pub const BLOCKED: &str = "blocked";
    /// The manager abandoned the requirement; its commits were compensated.
    pub const ABANDONED: &str = "abandoned";
    /// The release failed and was rolled back.
    pub const DEPLOYMENT_FAILED: &str = "deployment failed";
    /// Something failed; `error` says what.
    pub const FAILED: &str = "failed";
}

/// The requirement context's data.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequirementDomain {
    /// The brief's text.
    pub brief_text: String,
    /// Reference files that came with the brief (the engineer's deterministic fallback).
    pub reference: BTreeMap<String, String>,
    /// The clarified requirement.
    pub doc: Option<RequirementDoc>,
    /// The stories.
    pub stories: Vec<UserStory>,
    /// A human approved them.
    pub stories_approved: bool,
    /// The last rejection's reason.
    pub rejection_reason: Option<String>,
    /// Rejections so far.
    pub rejections: u32,
}

/// The design context's data.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DesignDomain {
    /// The stories, translated.
    pub functional_requirements: Vec<FunctionalRequirement>,
    /// The specification.
    pub spec: Option<TechnicalSpec>,
    /// Decision records.
    pub decisions: Vec<ArchitectureDecision>,
    /// The tech lead's notes.
    pub review_notes: Vec<String>,
}

/// The implementation context's data.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImplementationDomain {
    /// Tasks in dependency order.
    pub plan: Vec<ImplementationTask>,
    /// The files of the last accepted attempt.
    pub artifacts: Vec<CodeArtifact>,
    /// Failed attempts since the last grant of the manager.
    pub attempts: u32,
    /// Attempts made in all (failed or not).
    pub total_attempts: u32,
    /// The attempt (its `total_attempts` number) whose failure `attempts` last counted: an
    /// attempt that fails several ways (the model's code, then QC on the fallback) counts
    /// once.
    #[serde(default)]
    pub failure_counted_for: u32,
    /// The last run of the engineer's own tests.
    pub self_tests: Option<TestResults>,
    /// What failed last (fed back to the engineer).
    pub last_failure: String,
    /// The manager's hints after escalations.
    pub manager_hints: Vec<String>,
    /// The workspace commit the team started from.
    pub base_commit: String,
    /// The commit of the accepted code.
    pub commit: Option<String>,
    /// The workspace folder.
    pub workspace: String,
}

impl ImplementationDomain {
    /// Counts a failure of the attempt in progress, once per attempt, so that the requirement
    /// escalates after the third failed attempt however many ways each failed.
    pub fn count_failure(&mut self) {
        if self.total_attempts == 0 || self.failure_counted_for != self.total_attempts {
            self.attempts += 1;
            self.failure_counted_for = self.total_attempts;
        }
    }
}

/// The quality context's data.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QualityDomain {
    /// Test cases from the stories.
    pub test_cases: Vec<TestCase>,
    /// The gates.
    pub gates: QualityGates,
    /// QC's own run.
    pub results: Option<TestResults>,
    /// 0 to 100.
    pub score: Option<f64>,
    /// Every gate passed.
    pub passed: bool,
    /// QC's and the code review's notes.
    pub notes: Vec<String>,
    /// QC runs so far.
    pub runs: u32,
}

/// The deployment context's data.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeploymentDomain {
    /// The CI configuration.
    pub cicd: Option<CicdConfig>,
    /// The runbook (Markdown).
    pub runbook: String,
    /// Where it stands.
    pub status: DeploymentStatus,
    /// A human approved it.
    pub approved: bool,
    /// Notes (rejections, failures).
    pub notes: Vec<String>,
    /// The commit that holds the CI configuration and runbook.
    pub commit: Option<String>,
    /// Releases attempted (names the tag).
    pub releases: u32,
}

/// What a compensation undoes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compensation {
    /// Move the workspace branch back.
    ResetBranch {
        /// To this commit.
        to: String,
    },
    /// Delete a release tag.
    DeleteTag {
        /// The tag.
        name: String,
    },
    /// Remove a copied release.
    RemoveDir {
        /// The folder.
        path: String,
    },
    /// Point `CURRENT` back at the previous release (or remove it).
    RestoreCurrent {
        /// The file.
        path: String,
        /// Its content before.
        previous: Option<String>,
    },
}

/// A forward action with an effect, and how to undo it (the saga's log).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SagaStep {
    /// `implementation` or `deployment`: which failure undoes it.
    pub scope: String,
    /// What was done.
    pub action: String,
    /// Who did it.
    pub agent: String,
    /// How to undo it.
    pub compensation: Compensation,
    /// Whether it was undone.
    pub compensated: bool,
}

/// One line of the audit trail.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// When.
    pub at: String,
    /// The agent (or `human`).
    pub agent: String,
    /// `transition`, `refused`, `fallback`, `tests`, `compensation`, `gate`, `decision`, …
    pub kind: String,
    /// What happened.
    pub detail: String,
    /// Details (test output, a refused transition, …) as JSON text.
    #[serde(default)]
    pub data: String,
}

/// The state of one requirement's run (schema version 2).
#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
#[state(version = 2)]
pub struct TeamState {
    /// The brief: a Markdown file, or a folder with `brief.md` and an optional `reference/`
    /// (input).
    pub brief: String,
    /// The brief's text, when given inline instead of `brief` (input).
    pub brief_text: String,
    /// The folder under which the run's folder is made (input; default
    /// `<data>/team/runs`).
    pub out: String,
    /// Where releases go (input; default `<run>/deploy`).
    pub deploy_to: String,
    /// This run's folder: artifacts, workspace, sandboxes.
    pub run_dir: String,
    /// The workspace branch's head as the team last left it (every commit starts here).
    pub workspace_head: String,
    /// Where the requirement is.
    pub lifecycle: ReqState,
    /// Requirement context.
    pub requirement: RequirementDomain,
    /// Design context.
    pub design: DesignDomain,
    /// Implementation context.
    pub implementation: ImplementationDomain,
    /// Quality context.
    pub quality: QualityDomain,
    /// Deployment context.
    pub deployment: DeploymentDomain,
    /// Events waiting for dispatch, and those dispatched.
    pub outbox: Outbox,
    /// Commands, queries and responses between agents.
    #[reducer(append)]
    pub agent_messages: Vec<Envelope>,
    /// Blockers.
    pub blockers: Vec<Blocker>,
    /// Forward actions and their compensations.
    pub saga: Vec<SagaStep>,
    /// Accepted lifecycle transitions.
    #[reducer(append)]
    pub transitions: Vec<TransitionRecord>,
    /// The audit trail.
    #[reducer(append)]
    pub audit: Vec<AuditEntry>,
    /// Every model call.
    #[reducer(append)]
    pub llm_calls: Vec<LlmCall>,
    /// Progress, one line per step.
    #[reducer(append)]
    pub messages: Vec<String>,
    /// The agent that ran last.
    pub current_agent: String,
    /// The last answer at a gate (`approve`, `reject`, `retry`, `abandon`).
    pub decision: String,
    /// See [`status`].
    pub status: String,
    /// What went wrong, when something did.
    pub error: Option<String>,
}

/// Version 1 of the state, as the seed stored its outbox.
pub mod v1 {
    use super::*;

    /// The seed's outbox entry.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    pub struct OutboxEntry {
        /// The event.
        pub event: Option<Envelope>,
        /// Whether it was delivered.
        pub delivered: bool,
        /// Attempts.
        pub delivery_attempts: u32,
        /// When it was written.
        pub created_at: String,
    }

    /// The seed's outbox: two lists of entries.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    pub struct EventOutbox {
        /// Entries written.
        pub pending: Vec<OutboxEntry>,
        /// Entries moved after delivery.
        pub delivered: Vec<OutboxEntry>,
    }

    /// Version 1 of [`TeamState`]: the outbox in the seed's shape, the schema version as
    /// text.
    #[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
    #[state(version = 1)]
    #[allow(missing_docs)]
    pub struct TeamStateV1 {
        pub brief: String,
        pub brief_text: String,
        pub out: String,
        pub deploy_to: String,
        pub run_dir: String,
        pub schema_version: String,
        pub workspace_head: String,
        pub lifecycle: ReqState,
        pub requirement: RequirementDomain,
        pub design: DesignDomain,
        pub implementation: ImplementationDomain,
        pub quality: QualityDomain,
        pub deployment: DeploymentDomain,
        pub event_outbox: EventOutbox,
        #[reducer(append)]
        pub agent_messages: Vec<Envelope>,
        pub blockers: Vec<Blocker>,
        pub saga: Vec<SagaStep>,
        #[reducer(append)]
        pub transitions: Vec<TransitionRecord>,
        #[reducer(append)]
        pub audit: Vec<AuditEntry>,
        #[reducer(append)]
        pub llm_calls: Vec<LlmCall>,
        #[reducer(append)]
        pub messages: Vec<String>,
        pub current_agent: String,
        pub decision: String,
        pub status: String,
        pub error: Option<String>,
    }

    /// The seed's outbox as version 2's: an entry not delivered is pending, whichever list
    /// the seed's swapped dispatch left it in; a delivered one is recorded by id.
    pub fn outbox(o: EventOutbox) -> Outbox {
        let mut out = Outbox::default();
        for e in o.pending.into_iter().chain(o.delivered) {
            let Some(ev) = e.event else { continue };
            if e.delivered {
                if !out.delivered.iter().any(|d| d == ev.id()) {
                    out.delivered.push(ev.id().to_string());
                }
            } else if !out.pending.iter().any(|p| p.id() == ev.id()) {
                out.pending.push(ev);
            }
        }
        out.pending
            .retain(|p| !out.delivered.iter().any(|d| d == p.id()));
        out
    }

    /// Version 1 → 2, whole states.
    pub fn state(o: TeamStateV1) -> TeamState {
        TeamState {
            brief: o.brief,
            brief_text: o.brief_text,
            out: o.out,
            deploy_to: o.deploy_to,
            run_dir: o.run_dir,
            workspace_head: o.workspace_head,
            lifecycle: o.lifecycle,
            requirement: o.requirement,
            design: o.design,
            implementation: o.implementation,
            quality: o.quality,
            deployment: o.deployment,
            outbox: outbox(o.event_outbox),
            agent_messages: o.agent_messages,
            blockers: o.blockers,
            saga: o.saga,
            transitions: o.transitions,
            audit: o.audit,
            llm_calls: o.llm_calls,
            messages: o.messages,
            current_agent: o.current_agent,
            decision: o.decision,
            status: o.status,
            error: o.error,
        }
    }

    /// Version 1 → 2, updates.
    pub fn update(o: TeamStateV1Update) -> TeamStateUpdate {
        TeamStateUpdate {
            brief: o.brief,
            brief_text: o.brief_text,
            out: o.out,
            deploy_to: o.deploy_to,
            run_dir: o.run_dir,
            workspace_head: o.workspace_head,
            lifecycle: o.lifecycle,
            requirement: o.requirement,
            design: o.design,
            implementation: o.implementation,
            quality: o.quality,
            deployment: o.deployment,
            outbox: o.event_outbox.map(outbox),
            agent_messages: o.agent_messages,
            blockers: o.blockers,
            saga: o.saga,
            transitions: o.transitions,
            audit: o.audit,
            llm_calls: o.llm_calls,
            messages: o.messages,
            current_agent: o.current_agent,
            decision: o.decision,
            status: o.status,
            error: o.error,
        }
    }
}

/// Installs the migration from version 1 (once per process; later calls do nothing).
pub fn install_migrations() -> Result<(), ferrograph::core::migrate::MigrationError> {
    static DONE: std::sync::OnceLock<Result<(), ferrograph::core::migrate::MigrationError>> =
        std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        ferrograph::core::migrate::Migrations::<TeamState>::new()
            .step::<v1::TeamStateV1, TeamState>(v1::state, v1::update)
            .install()
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_that_fails_twice_counts_once() {
        // Attempt 1: the model's code fails (the fallback passes), then QC fails it.
        let mut imp = ImplementationDomain {
            total_attempts: 1,
            ..ImplementationDomain::default()
        };
        imp.count_failure();
        imp.count_failure();
        assert_eq!(imp.attempts, 1);
        // Attempt 2: review fails it.
        imp.total_attempts = 2;
        imp.count_failure();
        assert_eq!(imp.attempts, 2);
        // Attempt 3: the third failure, which escalates.
        imp.total_attempts = 3;
        imp.count_failure();
        imp.count_failure();
        assert_eq!(imp.attempts, crate::lifecycle::MAX_ATTEMPTS);
        // The manager grants more: the next attempt's failure counts from zero.
        imp.attempts = 0;
        imp.count_failure();
        assert_eq!(imp.attempts, 0, "no new attempt was made yet");
        imp.total_attempts = 4;
        imp.count_failure();
        assert_eq!(imp.attempts, 1);
    }
}
