//! The triage report files: JSON (everything, for machines) and Markdown (for people).

use super::agents::clip;
use super::state::TriageState;
use serde_json::{json, Value};
use std::fmt::Write as _;

/// The JSON report: the issue, the outcome, the writer's output, every finding, the critic's
/// verdicts, every agent run with its model calls, and the supervisor's routing.
pub fn json(s: &TriageState) -> Value {
    json!({
        "issue": {"title": s.issue_title, "source": s.issue_url},
        "repository": s.repository,
        "docs": s.docs_dir,
        "status": s.status,
        "error": s.error,
        "rounds": s.round,
        "iterations": s.iterations,
        "writer": s.writer,
        "investigator": s.investigator,
        "web_search": s.web_search,
        "codebase_search": s.codebase,
        "critique": s.critique,
        "critic_verdicts": s.critic_history,
        "findings": s.findings,
        "field_checks": s.field_checks,
        "searched_terms": s.searched_terms,
        "agent_runs": s.agent_runs,
        "routing": s.routing,
    })
}

/// The Markdown report.
pub fn markdown(s: &TriageState) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Triage: {}\n", s.issue_title);
    let _ = writeln!(md, "- Status: **{}**", s.status);
    let _ = writeln!(md, "- Repository: `{}`", s.repository);
    let _ = writeln!(
        md,
        "- Rounds: {}, agent iterations: {}",
        s.round, s.iterations
    );
    if let Some(e) = &s.error {
        let _ = writeln!(md, "- Error: {e}");
    }
    if let Some(w) = &s.writer {
        let r = &w.report;
        let _ = writeln!(md, "\n## Report: {}\n", r.title);
        let _ = writeln!(md, "- Severity: **{}**", r.severity.as_str());
        let _ = writeln!(md, "- Confidence: {:.2}", r.confidence);
        let _ = writeln!(md, "\n### Root cause\n\n{}\n", r.root_cause);
        if !r.affected_files.is_empty() {
            let _ = writeln!(md, "### Affected files\n");
            for f in &r.affected_files {
                let _ = writeln!(md, "- `{f}`");
            }
            md.push('\n');
        }
        if !r.reproduction_steps.is_empty() {
            let _ = writeln!(md, "### Reproduction\n");
            for (i, step) in r.reproduction_steps.iter().enumerate() {
                let _ = writeln!(md, "{}. {}", i + 1, step.0);
            }
            md.push('\n');
        }
        let _ = writeln!(md, "### Suggested fix\n\n{}\n", r.suggested_fix);
        let _ = writeln!(md, "### Ticket\n");
        let _ = writeln!(md, "- Title: {}", w.ticket_title);
        let _ = writeln!(md, "- Labels: {}", w.ticket_labels.join(", "));
        let _ = writeln!(md, "- Effort: {:?}", w.ticket_effort_estimate);
        if !w.ticket_assignee_suggestion.is_empty() {
            let _ = writeln!(md, "- Assignee: {}", w.ticket_assignee_suggestion);
        }
        let _ = writeln!(
            md,
            "\n### Issue comment (draft)\n\n{}\n",
            w.github_comment_markdown
        );
    }
    if let Some(c) = &s.codebase {
        let _ = writeln!(md, "## Codebase findings\n");
        if let Some(loc) = &c.root_cause_location {
            let _ = writeln!(md, "Root-cause location: `{loc}`\n");
        }
        let _ = writeln!(md, "| file | source | score | why |\n|---|---|---|---|");
        for f in &c.relevant_files {
            let _ = writeln!(
                md,
                "| `{}` | {} | {:.3} | {} |",
                f.path,
                f.source,
                f.score,
                clip(&f.relevance_reason, 120)
                    .replace('|', "\\|")
                    .replace('\n', " ")
            );
        }
        md.push('\n');
    }
    if !s.critic_history.is_empty() {
        let _ = writeln!(md, "## Critic\n");
        for v in &s.critic_history {
            let _ = writeln!(
                md,
                "- Round {}: {:?} (confidence {:.2}){}",
                v.round,
                v.verdict,
                v.confidence,
                if v.gaps.is_empty() {
                    String::new()
                } else {
                    format!(", gaps: {}", v.gaps.join("; "))
                }
            );
        }
        md.push('\n');
    }
    if !s.field_checks.is_empty() {
        let _ = writeln!(md, "## Where the text comes from\n");
        let _ = writeln!(
            md,
            "Every free-text field is checked (no loops, real content, no names outside the evidence). \
             `model`: the first answer passed; `model_retry`: the second try passed; `composed`: \
             written in code from the evidence after two refused answers (or without a model).\n"
        );
        let _ = writeln!(
            md,
            "| agent | round | field | source | refused because |\n|---|---|---|---|---|"
        );
        for c in &s.field_checks {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                c.agent,
                c.round,
                c.field,
                c.source,
                clip(&c.problems.join("; "), 160)
                    .replace('|', "\\|")
                    .replace('\n', " ")
            );
        }
        md.push('\n');
    }
    let _ = writeln!(md, "## Agent runs\n");
    let _ = writeln!(
        md,
        "| agent | round | ms | model calls | prompt tok | cached | generated | fallback | result |\n|---|---|---|---|---|---|---|---|---|"
    );
    for r in &s.agent_runs {
        let sum = |f: fn(&super::state::LlmCall) -> u32| r.calls.iter().map(f).sum::<u32>();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.agent,
            r.round,
            r.duration_ms,
            r.calls.len(),
            sum(|c| c.prompt_tokens),
            sum(|c| c.cached_prompt_tokens),
            sum(|c| c.completion_tokens),
            r.calls.iter().any(|c| c.used_fallback),
            match &r.error {
                None => "finding".to_string(),
                Some(e) => format!(
                    "error: {}",
                    clip(e, 80).replace('|', "\\|").replace('\n', " ")
                ),
            }
        );
    }
    let _ = writeln!(md, "\n## Routing\n");
    for r in &s.routing {
        let _ = writeln!(
            md,
            "{}. → {} (round {}): {}",
            r.iteration + 1,
            r.next,
            r.round,
            r.reason
        );
    }
    md
}
