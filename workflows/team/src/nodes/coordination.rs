//! Coordination context: the project manager routes blockers and takes escalations (a
//! human decides: more attempts with a hint, or abandon, which compensates the commits).

use super::*;
use crate::events::agent::{PM, SSE};

/// The project manager on a blocked requirement: the blocker gets its route, the run ends.
pub(crate) async fn pm_agent(
    d: Arc<Deps>,
    s: Arc<TeamState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    crate::agent_step!(PM, pm(&d, &s, &ctx).await)
}

/// What the stakeholder is asked when a brief is too vague.
pub const CLARIFYING_QUESTIONS: [&str; 3] = [
    "What must the program do, and for whom?",
    "What goes in and what comes out (files, commands, formats)?",
    "How will you tell that it works (an example input and its expected output)?",
];

async fn pm(d: &Deps, s: &TeamState, ctx: &NodeContext) -> Result<Update, String> {
    let mut t = Turn::begin(d, s, ctx, PM)?;
    let mut blockers = s.blockers.clone();
    let brief = if s.brief.is_empty() {
        "FILE".to_string()
    } else {
        s.brief.clone()
    };
    for b in blockers
        .iter_mut()
        .filter(|b| !b.resolved && b.route.is_empty())
    {
        b.route = format!(
            "the stakeholder: answer these questions in the brief and start a new run with `ferrograph run team --brief {brief}`: {}",
            CLARIFYING_QUESTIONS.join(" ")
        );
        t.audit(
            "decision",
            format!("blocker {} routed to the stakeholder", b.blocker_id),
            json!({"questions": CLARIFYING_QUESTIONS}),
        );
    }
    t.say("the requirement is blocked until the stakeholder clarifies the brief");
    t.finish(
        s,
        Update::new()
            .blockers(blockers)
            .status(status::BLOCKED.to_string()),
    )
}

/// The manager's answer to an escalation.
#[derive(Clone, Debug, PartialEq)]
pub enum EscalationAnswer {
    /// Three more attempts, with an optional hint for the engineer.
    Retry(Option<String>),
    /// Stop; undo the commits.
    Abandon,
}

impl EscalationAnswer {
    /// Reads `"retry"`/`"approve"`, `"abandon"`/`"reject"`, `{"hint"|"feedback": …}`, or any
    /// other text (a retry with that hint).
    pub fn from_json(v: &Value) -> Result<EscalationAnswer, String> {
        let hint = |o: &serde_json::Map<String, Value>| {
            ["hint", "feedback", "reason"]
                .iter()
                .find_map(|k| o.get(*k).and_then(Value::as_str))
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
        };
        match v {
            Value::String(s) => match s.trim().to_lowercase().as_str() {
                "" => Err("an empty answer: use \"retry\", \"abandon\" or {\"hint\": \"what to try\"}".into()),
                "retry" | "approve" | "approved" => Ok(EscalationAnswer::Retry(None)),
                "abandon" | "reject" | "rejected" => Ok(EscalationAnswer::Abandon),
                _ => Ok(EscalationAnswer::Retry(Some(s.trim().to_string()))),
            },
            Value::Object(o) => match o.get("decision").and_then(Value::as_str) {
                Some("abandon") | Some("reject") => Ok(EscalationAnswer::Abandon),
                Some("retry") | Some("approve") | Some("feedback") | None if hint(o).is_some() || o.contains_key("decision") => Ok(EscalationAnswer::Retry(hint(o))),
                _ => Err(format!("unrecognized answer {v}: use \"retry\", \"abandon\" or {{\"hint\": \"what to try\"}}")),
            },
            _ => Err(format!("unrecognized answer {v}: use \"retry\", \"abandon\" or {{\"hint\": \"what to try\"}}")),
        }
    }
}

/// The project manager on an escalation: a human interrupt.
pub(crate) async fn pm_escalation(
    d: Arc<Deps>,
    s: Arc<TeamState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    let mut t = match Turn::begin(&d, &s, &ctx, PM) {
        Ok(t) => t,
        Err(e) => return Ok(failed(PM, e)),
    };
    let imp = &s.implementation;
    let summary = format!(
        "## Escalation: the engineer failed {} attempts\n\nLast failure:\n\n```\n{}\n```\n\nRetry (three more attempts, optionally with a hint for the engineer) or abandon (the requirement's commits are undone).",
        imp.attempts,
        imp.last_failure.trim()
    );
    let answer: Value = ctx.interrupt(json!({
        "kind": "review",
        "checkpoint_type": "escalation",
        "title": "The engineer is stuck",
        "summary": summary,
        "attempts": imp.attempts,
        "last_failure": imp.last_failure,
        "blockers": s.blockers.iter().filter(|b| !b.resolved).collect::<Vec<_>>(),
        "choices": ["approve", "reject", "feedback"],
        "feedback_placeholder": "a hint for the engineer (retry with it)",
        "instructions": "approve: retry; feedback: retry with this hint; reject: abandon",
    }))?;
    let answer = EscalationAnswer::from_json(&answer).map_err(NodeError::fatal)?;
    let mut blockers = s.blockers.clone();
    let mut imp = imp.clone();
    let u = match answer {
        EscalationAnswer::Retry(hint) => {
            t.guards.manager_retry = true;
            t.transition(
                ReqState::InDevelopment,
                "ImplementationRetryGranted",
                hint.clone().unwrap_or_default(),
            );
            for b in blockers
                .iter_mut()
                .filter(|b| !b.resolved && b.blocked_agent == SSE)
            {
                b.resolved = true;
                b.resolution = Some(format!(
                    "the manager granted more attempts{}",
                    hint.as_ref().map(|h| format!(": {h}")).unwrap_or_default()
                ));
            }
            imp.attempts = 0;
            if let Some(h) = &hint {
                imp.manager_hints.push(h.clone());
            }
            t.command(SSE, "RetryImplementation", json!({"hint": hint}));
            t.say("the manager granted three more attempts");
            Update::new()
                .implementation(imp)
                .blockers(blockers)
                .decision("retry".to_string())
                .status(String::new())
        }
        EscalationAnswer::Abandon => {
            let repo = git2::Repository::open(&imp.workspace).ok();
            let mut saga = s.saga.clone();
            let undone =
                super::run_compensations(&mut t, repo.as_ref(), &mut saga, "implementation");
            for b in blockers.iter_mut().filter(|b| !b.resolved) {
                b.resolved = true;
                b.resolution = Some("abandoned by the manager".into());
            }
            t.audit(
                "decision",
                format!(
                    "the manager abandoned the requirement; {} compensation(s) ran",
                    undone.len()
                ),
                Value::Null,
            );
            t.say("the manager abandoned the requirement");
            Update::new()
                .blockers(blockers)
                .saga(saga)
                .decision("abandon".to_string())
                .status(status::ABANDONED.to_string())
        }
    };
    Ok(settle(PM, t.finish(&s, u)))
}
