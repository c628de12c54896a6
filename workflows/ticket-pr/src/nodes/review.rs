//! Steps 7 and 8: the reviewer's summary and diff, and the gate.

use super::*;

/// Node 7: the reviewer's summary, the unified diff and the scope warnings.
pub(crate) async fn prepare_diff_summary(
    _d: Arc<Deps>,
    s: Arc<TicketPrState>,
    _ctx: NodeContext,
) -> Result<Update, NodeError> {
    let all = s.all_changes();
    let repo = match repo::open(Path::new(&s.repo)) {
        Ok(r) => r,
        Err(e) => return Ok(failed(e.to_string())),
    };
    let mut diff = String::new();
    let mut lines = vec![format!(
        "## Proposed changes for {}: {}\n",
        s.ticket.key, s.ticket.summary
    )];
    if !s.root_cause.is_empty() {
        lines.push(format!("**Root cause:** {}\n", s.root_cause));
    } else if s.ticket.ticket_type == TicketType::Bug {
        lines.push(
            "**Root cause:** not stated (the model gave none that reads as an explanation)\n"
                .into(),
        );
    }
    lines.push(format!(
        "Generation {} of at most {MAX_GENERATIONS}; modules: {}.\n",
        s.generations,
        s.affected_modules.join(", ")
    ));
    lines.push("### Files to be changed\n".into());
    let mut warnings = Vec::new();
    for c in &all {
        let old = match repo::read_at(&repo, &s.base_commit, &c.file_path) {
            Ok(o) => o,
            Err(e) => return Ok(failed(e.to_string())),
        };
        let file_diff = match repo::unified_diff(&c.file_path, old.as_deref(), &c.new_content) {
            Ok(d) => d,
            Err(e) => return Ok(failed(e.to_string())),
        };
        let (added, removed) = changed_lines(&file_diff);
        diff.push_str(&file_diff);
        let new_file = if old.is_none() { ", new file" } else { "" };
        lines.push(format!(
            "- `{}` — {} (+{added} −{removed}{new_file})",
            c.file_path, c.description
        ));
        let n = c.new_content.lines().count();
        if n > LARGE_FILE_LINES {
            warnings.push(format!(
                "Large file: `{}` would have {n} lines (over {LARGE_FILE_LINES}). Extra review recommended.",
                c.file_path
            ));
        }
        if let Some(o) = &old {
            let before = o.lines().count();
            if before >= 10 && n * 2 < before {
                warnings.push(format!(
                    "`{}` shrinks from {before} to {n} lines: check that nothing needed was dropped.",
                    c.file_path
                ));
            }
        }
    }
    lines.push("\n### Tests run\n".into());
    match s
        .test_runs
        .last()
        .filter(|r| r.generation == s.generations && s.tests_not_run.is_empty())
    {
        Some(r) => {
            let corrections = match s.test_corrections {
                0 => String::new(),
                n => format!(" after {n} correction(s) from earlier runs"),
            };
            lines.push(format!("`{}`{corrections}: {}", r.command, r.line()));
            if r.problem().is_some() {
                warnings.push(
                    "The proposed tests do not show the fix (see the test run): review the change and the tests with care."
                        .into(),
                );
                let report = r.after.report();
                if !r.after.all_passed() && !report.trim().is_empty() {
                    lines.push(format!("\n```\n{}\n```", report.trim_end()));
                }
            }
        }
        None if !s.tests_not_run.is_empty() => lines.push(format!("Not run: {}.", s.tests_not_run)),
        None => lines.push("Not run.".into()),
    }
    if s.affected_modules.len() > 2 {
        warnings.push(format!(
            "Multi-module change: {}. Verify the scope is appropriate.",
            s.affected_modules.join(", ")
        ));
    }
    for w in &warnings {
        lines.push(format!("\n⚠️ **{w}**"));
    }
    let summary = lines.join("\n");
    Ok(Update::new()
        .diff_summary(summary)
        .diff(diff)
        .warnings(warnings)
        .gate_opened_ms(now_ms())
        .status(status::AWAITING_REVIEW.to_string())
        .messages(vec![format!(
            "Prepared the review of {} file(s)",
            all.len()
        )]))
}

/// Lines added and removed by a unified diff (its `+++`/`---` headers aside).
fn changed_lines(diff: &str) -> (usize, usize) {
    let body = diff
        .lines()
        .filter(|l| !l.starts_with("+++") && !l.starts_with("---"));
    body.fold((0, 0), |(a, r), l| match l.as_bytes().first() {
        Some(b'+') => (a + 1, r),
        Some(b'-') => (a, r + 1),
        _ => (a, r),
    })
}

/// A reviewer's answer.
#[derive(Clone, Debug, PartialEq)]
pub enum GateAnswer {
    /// Apply the change.
    Approve,
    /// End without applying anything.
    Reject,
    /// Generate again with this feedback.
    Feedback(String),
}

impl GateAnswer {
    /// Reads `"approve"`, `"reject"`, any other text (feedback, as in the seed),
    /// `{"feedback": "..."}` or `{"decision": "approve|reject|feedback", "feedback": "..."}`.
    pub fn from_json(v: &Value) -> Result<GateAnswer, String> {
        let text = match v {
            Value::String(s) => Some(s.trim().to_string()),
            Value::Object(o) => {
                let fb = o
                    .get("feedback")
                    .and_then(Value::as_str)
                    .map(|f| f.trim().to_string());
                match o.get("decision").and_then(Value::as_str) {
                    Some("approve") => return Ok(GateAnswer::Approve),
                    Some("reject") => return Ok(GateAnswer::Reject),
                    Some("feedback") | None => match fb {
                        Some(f) if !f.is_empty() => return Ok(GateAnswer::Feedback(f)),
                        _ => None,
                    },
                    Some(other) => {
                        return Err(format!(
                            "unknown decision `{other}` (approve, reject or feedback)"
                        ))
                    }
                }
            }
            _ => None,
        };
        match text.as_deref() {
            Some(t) if t.eq_ignore_ascii_case("approve") || t.eq_ignore_ascii_case("approved") => {
                Ok(GateAnswer::Approve)
            }
            Some(t) if t.eq_ignore_ascii_case("reject") || t.eq_ignore_ascii_case("rejected") => {
                Ok(GateAnswer::Reject)
            }
            Some(t) if !t.is_empty() => Ok(GateAnswer::Feedback(t.to_string())),
            _ => Err(format!(
                "unrecognized review answer {v}: use \"approve\", \"reject\" or {{\"feedback\": \"what to change\"}}"
            )),
        }
    }
}

/// Node 8: the gate. Its payload carries the summary, the diff and the choices; the answer
/// approves, rejects, or asks for another generation (at most [`MAX_GENERATIONS`]).
pub(crate) async fn human_review_gate(
    _d: Arc<Deps>,
    s: Arc<TicketPrState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    let files: Vec<Value> = s
        .all_changes()
        .iter()
        .map(|c| json!({"path": c.file_path, "description": c.description}))
        .collect();
    let answer: Value = ctx.interrupt(json!({
        "kind": "review",
        "ticket_key": s.ticket.key,
        "title": format!("{}: {}", s.ticket.key, s.ticket.summary),
        "generation": s.generations,
        "max_generations": MAX_GENERATIONS,
        "prompt": format!("{}\n\n**Do you approve these changes?** (approve, reject, or feedback for a revision)", s.diff_summary),
        "summary": s.diff_summary,
        "diff": s.diff,
        "files": files,
        "warnings": s.warnings,
        "choices": ["approve", "reject", "feedback"],
    }))?;
    let answer = GateAnswer::from_json(&answer).map_err(NodeError::fatal)?;
    metrics::review_answered(now_ms().saturating_sub(s.gate_opened_ms) as f64 / 1000.0);
    Ok(match answer {
        GateAnswer::Approve => Update::new()
            .decision("approve".to_string())
            .messages(vec!["The reviewer approved".into()]),
        GateAnswer::Reject => {
            metrics::run_finished(status::REJECTED, s.generations);
            Update::new()
                .decision("reject".to_string())
                .status(status::REJECTED.to_string())
                .messages(vec![
                    "The reviewer rejected the change: nothing applied".into()
                ])
        }
        GateAnswer::Feedback(f) if s.generations >= MAX_GENERATIONS => {
            metrics::run_finished(status::REVISION_LIMIT, s.generations);
            Update::new()
                .decision("feedback".to_string())
                .feedback(vec![f])
                .status(status::REVISION_LIMIT.to_string())
                .messages(vec![format!(
                    "Feedback after {MAX_GENERATIONS} generations: the revision limit is reached, nothing applied"
                )])
        }
        GateAnswer::Feedback(f) => Update::new()
            .decision("feedback".to_string())
            .messages(vec![format!("Feedback: {f}")])
            .feedback(vec![f]),
    })
}
