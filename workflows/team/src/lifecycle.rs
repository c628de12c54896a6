//! The requirement lifecycle (the seed's section 4): nine states, two error states, the
//! transition table and its guards. A refused transition changes nothing; an accepted one
//! yields a [`TransitionRecord`] for the audit trail.
//!
//! Mended from the seed: `blocked` and `escalated` had no way out. A blocked requirement
//! goes back to `received` when the brief is clarified; an escalated one goes back to
//! `in_development` when the manager grants more attempts. The retry loop of
//! `in_development` is guarded (at most [`MAX_ATTEMPTS`] failures), not only commented.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Failed implementation attempts before the requirement escalates.
pub const MAX_ATTEMPTS: u32 = 3;

/// Where a requirement is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReqState {
    /// The brief arrived.
    #[default]
    Received,
    /// The product owner clarified it.
    Clarified,
    /// The analyst wrote stories (they wait for a human).
    UserStoriesCreated,
    /// Stories approved: design can start.
    DesignReady,
    /// The engineer is at work.
    InDevelopment,
    /// Self-tests pass; the tech lead reviews the code.
    InReview,
    /// Review passed; QC tests it.
    TestPending,
    /// Quality gates passed; waits for the deployment gate.
    ReadyToDeploy,
    /// Released (terminal).
    Deployed,
    /// Cannot go on until someone acts.
    Blocked,
    /// Too many failures: with the manager.
    Escalated,
}

impl ReqState {
    /// Every state, in lifecycle order.
    pub const ALL: [ReqState; 11] = [
        ReqState::Received,
        ReqState::Clarified,
        ReqState::UserStoriesCreated,
        ReqState::DesignReady,
        ReqState::InDevelopment,
        ReqState::InReview,
        ReqState::TestPending,
        ReqState::ReadyToDeploy,
        ReqState::Deployed,
        ReqState::Blocked,
        ReqState::Escalated,
    ];

    /// The states it may go to.
    pub fn next(self) -> &'static [ReqState] {
        use ReqState::*;
        match self {
            Received => &[Clarified, Blocked],
            Clarified => &[UserStoriesCreated, Received],
            UserStoriesCreated => &[DesignReady, Clarified],
            DesignReady => &[InDevelopment, UserStoriesCreated],
            InDevelopment => &[InReview, InDevelopment, Escalated],
            InReview => &[TestPending, InDevelopment],
            TestPending => &[ReadyToDeploy, InDevelopment],
            ReadyToDeploy => &[Deployed, TestPending],
            Deployed => &[],
            Blocked => &[Received],
            Escalated => &[InDevelopment],
        }
    }

    /// Its name as stored (`user_stories_created`, …).
    pub fn as_str(self) -> &'static str {
        use ReqState::*;
        match self {
            Received => "received",
            Clarified => "clarified",
            UserStoriesCreated => "user_stories_created",
            DesignReady => "design_ready",
            InDevelopment => "in_development",
            InReview => "in_review",
            TestPending => "test_pending",
            ReadyToDeploy => "ready_to_deploy",
            Deployed => "deployed",
            Blocked => "blocked",
            Escalated => "escalated",
        }
    }
}

impl fmt::Display for ReqState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the guards look at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardContext {
    /// A human approved the stories.
    pub stories_approved: bool,
    /// The engineer's own tests pass.
    pub self_tests_passing: bool,
    /// A human approved the deployment.
    pub deployment_approved: bool,
    /// Failed implementation attempts so far.
    pub attempts: u32,
    /// The manager granted more attempts.
    pub manager_retry: bool,
}

/// One accepted transition (the seed's `StateTransition`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TransitionRecord {
    /// From.
    pub from_state: ReqState,
    /// To.
    pub to_state: ReqState,
    /// The agent (or `human`).
    pub triggered_by: String,
    /// The domain event that goes with it.
    pub event_name: String,
    /// The guard that held, if the transition has one.
    pub guard: Option<String>,
    /// When.
    pub timestamp: String,
    /// Why (review notes, a rejection reason, …).
    pub note: String,
}

/// A refused transition: nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("transition {from} → {to} refused: {reason}")]
pub struct Refused {
    /// From.
    pub from: ReqState,
    /// To.
    pub to: ReqState,
    /// Why.
    pub reason: String,
}

/// The guard of `from → to`, as text, and whether it holds.
fn guard(from: ReqState, to: ReqState, c: &GuardContext) -> Option<(&'static str, bool)> {
    use ReqState::*;
    Some(match (from, to) {
        (UserStoriesCreated, DesignReady) => ("human_approved_stories", c.stories_approved),
        (InDevelopment, InReview) => ("self_tests_passing", c.self_tests_passing),
        (InDevelopment, InDevelopment) => ("attempts < 3", c.attempts < MAX_ATTEMPTS),
        (InDevelopment, Escalated) => ("attempts >= 3", c.attempts >= MAX_ATTEMPTS),
        (ReadyToDeploy, Deployed) => ("human_approved_deployment", c.deployment_approved),
        (Escalated, InDevelopment) => ("manager_granted_retry", c.manager_retry),
        _ => return None,
    })
}

/// Checks `from → to` against the table and its guard (the seed's `validate_transition`).
pub fn validate(
    from: ReqState,
    to: ReqState,
    c: &GuardContext,
) -> Result<Option<&'static str>, Refused> {
    let refuse = |reason: String| Refused { from, to, reason };
    if !from.next().contains(&to) {
        return Err(refuse("not in the transition table".into()));
    }
    match guard(from, to, c) {
        Some((name, true)) => Ok(Some(name)),
        Some((name, false)) => Err(refuse(format!("guard `{name}` does not hold"))),
        None => Ok(None),
    }
}

/// Validates `from → to` and makes its record.
pub fn transition(
    from: ReqState,
    to: ReqState,
    c: &GuardContext,
    by: &str,
    event: &str,
    note: impl Into<String>,
) -> Result<TransitionRecord, Refused> {
    let guard = validate(from, to, c)?;
    Ok(TransitionRecord {
        from_state: from,
        to_state: to,
        triggered_by: by.to_string(),
        event_name: event.to_string(),
        guard: guard.map(str::to_string),
        timestamp: crate::domain::now(),
        note: note.into(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ReqState::*;

    #[test]
    fn no_state_can_be_skipped() {
        let c = GuardContext {
            stories_approved: true,
            self_tests_passing: true,
            deployment_approved: true,
            ..GuardContext::default()
        };
        assert!(validate(DesignReady, Deployed, &c).is_err());
        assert!(validate(Received, UserStoriesCreated, &c).is_err());
        assert!(
            validate(Deployed, Received, &c).is_err(),
            "deployed is terminal"
        );
        // The happy path, step by step.
        let path = [
            Received,
            Clarified,
            UserStoriesCreated,
            DesignReady,
            InDevelopment,
            InReview,
            TestPending,
            ReadyToDeploy,
            Deployed,
        ];
        for w in path.windows(2) {
            assert!(validate(w[0], w[1], &c).is_ok(), "{} → {}", w[0], w[1]);
        }
    }

    #[test]
    fn guards_refuse_and_say_why() {
        let none = GuardContext::default();
        let e = validate(UserStoriesCreated, DesignReady, &none).unwrap_err();
        assert!(e.reason.contains("human_approved_stories"), "{e}");
        let e = validate(InDevelopment, InReview, &none).unwrap_err();
        assert!(e.reason.contains("self_tests_passing"));
        let e = validate(ReadyToDeploy, Deployed, &none).unwrap_err();
        assert!(e.reason.contains("human_approved_deployment"));
        let three = GuardContext {
            attempts: 3,
            ..none
        };
        assert!(validate(InDevelopment, InDevelopment, &three).is_err());
        assert!(validate(InDevelopment, Escalated, &three).is_ok());
        assert!(validate(InDevelopment, Escalated, &none).is_err());
        assert!(validate(Escalated, InDevelopment, &none).is_err());
    }

    #[test]
    fn rollbacks_are_in_the_table() {
        let c = GuardContext::default();
        for (a, b) in [
            (UserStoriesCreated, Clarified),
            (InReview, InDevelopment),
            (TestPending, InDevelopment),
            (ReadyToDeploy, TestPending),
            (Blocked, Received),
        ] {
            let r = transition(a, b, &c, "x", "E", "").unwrap();
            assert_eq!((r.from_state, r.to_state), (a, b));
        }
    }

    #[test]
    fn names_round_trip_through_serde() {
        for s in ReqState::ALL {
            let j = serde_json::to_value(s).unwrap();
            assert_eq!(j, serde_json::json!(s.as_str()));
        }
    }
}
