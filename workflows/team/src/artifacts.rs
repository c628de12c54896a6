//! The run's files: requirements, stories, specification, decision records, runbook, the
//! event log, the transitions and the audit trail, written atomically (a temporary file,
//! then a rename) so that a crash never leaves half a file.

use crate::domain::{
    ArchitectureDecision, FunctionalRequirement, RequirementDoc, TechnicalSpec, UserStory,
};
use crate::error::TeamError;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// Writes `text` to `path` atomically.
pub fn write_text(path: &Path, text: &str) -> Result<(), TeamError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| TeamError::io(parent, e))?;
    }
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).map_err(|e| TeamError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| TeamError::io(path, e))
}

/// Writes `items` as JSON lines.
pub fn write_jsonl<T: Serialize>(path: &Path, items: &[T]) -> Result<(), TeamError> {
    let mut out = String::new();
    for i in items {
        out.push_str(&serde_json::to_string(i)?);
        out.push('\n');
    }
    write_text(path, &out)
}

fn list(out: &mut String, title: &str, items: &[String]) {
    if items.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n## {title}\n");
    for i in items {
        let _ = writeln!(out, "- {i}");
    }
}

/// `requirements.md`.
pub fn requirements_md(d: &RequirementDoc) -> String {
    let mut out = format!(
        "# {} — clarified requirement (revision {})\n\nClarified by {} at {}.\n\n## Brief\n\n{}\n",
        d.doc_id,
        d.revision,
        d.clarified_by,
        d.clarified_at,
        d.original_brief.trim()
    );
    list(&mut out, "Objectives", &d.clarified_objectives);
    list(&mut out, "Out of scope", &d.out_of_scope);
    list(&mut out, "Assumptions", &d.assumptions);
    list(&mut out, "Constraints", &d.constraints);
    list(&mut out, "Success metrics", &d.success_metrics);
    list(&mut out, "Deliverables", &d.deliverables);
    out
}

/// `stories.md` (also the stories gate's summary).
pub fn stories_md(stories: &[UserStory]) -> String {
    let mut out = String::from("# User stories\n");
    for s in stories {
        let _ = writeln!(
            out,
            "\n## {} — {} ({:?}, {} points, {})\n\nAs {}, I want {}, so that {}.\n\nAcceptance criteria:",
            s.story_id,
            s.title,
            s.priority,
            s.story_points,
            s.status,
            s.as_a.trim().trim_end_matches('.'),
            s.i_want.trim().trim_end_matches('.'),
            s.so_that.trim().trim_end_matches('.')
        );
        for c in &s.acceptance_criteria {
            let _ = writeln!(out, "- {c}");
        }
    }
    out
}

/// `spec.md`.
pub fn spec_md(spec: &TechnicalSpec, frs: &[FunctionalRequirement]) -> String {
    let mut out = format!(
        "# {} — {}\n\n## Functional requirements\n\n",
        spec.spec_id, spec.title
    );
    for f in frs {
        let _ = writeln!(out, "- **{}** ({}): {}", f.fr_id, f.story_id, f.statement);
    }
    out.push_str(
        "\n## Components\n\n| component | file | responsibility | covers |\n|---|---|---|---|\n",
    );
    for c in &spec.components {
        let covers = spec
            .covers
            .get(&c.name)
            .map(|v| v.join(", "))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "| {} | `{}` | {} | {} |",
            c.name, c.file_path, c.responsibility, covers
        );
    }
    out.push_str("\n## Tech stack\n\n");
    for (k, v) in &spec.tech_stack {
        let _ = writeln!(out, "- {k}: {v}");
    }
    if let Some(by) = &spec.approved_by {
        let _ = writeln!(
            out,
            "\nApproved by {by} at {}.",
            spec.approved_at.clone().unwrap_or_default()
        );
    }
    out
}

/// `adr/ADR-n.md`.
pub fn adr_md(a: &ArchitectureDecision) -> String {
    let mut out = format!(
        "# {}: {}\n\nStatus: {} ({} at {})\n\n## Context\n\n{}\n\n## Decision\n\n{}\n",
        a.adr_id, a.title, a.status, a.decided_by, a.decided_at, a.context, a.decision
    );
    list(&mut out, "Consequences", &a.consequences);
    list(
        &mut out,
        "Alternatives considered",
        &a.alternatives_considered,
    );
    out
}
