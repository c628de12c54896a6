//! Each agent's prompt: short, concrete, in the brief's words, for a small model.

use crate::domain::{
    FunctionalRequirement, ImplementationTask, RequirementDoc, TechnicalSpec, UserStory,
};
use std::fmt::Write as _;

/// The product owner.
pub const PO: &str = "You are the product owner of a small software team. You read a stakeholder's brief and state what the program must do, in the brief's own words.";
/// The business analyst.
pub const BA: &str = "You are the business analyst of a small software team. You write user stories with testable acceptance criteria.";
/// The architect.
pub const TA: &str = "You are the software architect of a small Python team. You split a program into components, one file each, and record the main design decision.";
/// The tech lead.
pub const TL: &str = "You are the tech lead of a small Python team. You review designs for gaps before coding starts.";
/// The engineer.
pub const SSE: &str = "You are a senior Python engineer. You write small, correct, standard-library Python 3 modules and unittest tests.";
/// DevOps.
pub const DEVOPS: &str = "You are the DevOps engineer of a small Python team. You write short, concrete release runbooks.";

/// The product owner's task.
pub fn clarify(brief: &str, rejection: Option<&str>, previous: Option<&str>) -> String {
    let mut t = format!("Brief:\n{}\n", brief.trim());
    if let (Some(r), Some(p)) = (rejection, previous) {
        let _ = write!(t, "\nYour previous answer was: {p}\nThe stakeholder rejected the stories built from it: \"{r}\". Revise the objectives to address that.\n");
    }
    t.push_str("\nList the program's objectives (what it must do), what is out of scope, assumptions, and how success is measured. Use the brief's words.");
    t
}

/// The analyst's task.
pub fn stories(doc: &RequirementDoc, rejection: Option<&str>) -> String {
    let mut t = String::from("Objectives:\n");
    for o in &doc.clarified_objectives {
        let _ = writeln!(t, "- {o}");
    }
    if !doc.constraints.is_empty() {
        let _ = writeln!(t, "Constraints: {}", doc.constraints.join("; "));
    }
    if let Some(r) = rejection {
        let _ = writeln!(t, "The stakeholder rejected the previous stories: \"{r}\".");
    }
    t.push_str("\nWrite one user story per objective. Each has a title, the user's role (as_a), what they want (i_want), why (so_that), one to three testable acceptance criteria, a priority and story points (1, 2, 3, 5 or 8).");
    t
}

/// The architect's task.
pub fn design(frs: &[FunctionalRequirement], files: &[String]) -> String {
    let mut t = String::from("Functional requirements:\n");
    for f in frs {
        let _ = writeln!(t, "- {}: {}", f.fr_id, f.statement);
    }
    let _ = write!(
        t,
        "\nThe program's source files are: {}. Name one component per file: its name, its responsibility and its file_path. Then record the main design decision: title, context, decision, consequences, alternatives.",
        files.join(", ")
    );
    t
}

/// The tech lead's task.
pub fn review_design(spec: &TechnicalSpec, frs: &[FunctionalRequirement]) -> String {
    let mut t = String::from("Design:\n");
    for c in &spec.components {
        let _ = writeln!(t, "- {} ({}): {}", c.name, c.file_path, c.responsibility);
    }
    t.push_str("Requirements:\n");
    for f in frs {
        let _ = writeln!(t, "- {}: {}", f.fr_id, f.statement);
    }
    t.push_str("\nCan the engineer build this design as it is? Answer approved true or false, with up to three short notes for the engineer.");
    t
}

/// The engineer's task for one source file.
pub fn module(
    task: &ImplementationTask,
    stories: &[UserStory],
    feedback: &str,
    previous: Option<&str>,
) -> String {
    let mut t = format!(
        "Write the Python module `{}`.\nTask: {}\n",
        task.file_path, task.description
    );
    for s in stories {
        let _ = writeln!(
            t,
            "Story {}: {} — {}",
            s.story_id,
            s.title,
            s.acceptance_criteria.join("; ")
        );
    }
    if let Some(p) = previous {
        let _ = writeln!(t, "\nYour previous code:\n{}", cut(p, 1500));
    }
    if !feedback.is_empty() {
        let _ = writeln!(t, "\nIt failed:\n{}\nFix it.", cut(feedback, 1200));
    }
    t.push_str("\nUse only the standard library. Answer with the whole file as `code`.");
    t
}

/// The engineer's task for the tests.
pub fn tests(test_file: &str, sources: &[(String, String)], stories: &[UserStory]) -> String {
    let mut t = format!("Write `{test_file}`: unittest tests of this code, one test per acceptance criterion, with test method names that say what they check.\n");
    for (p, code) in sources {
        let _ = writeln!(t, "\n# {p}\n{}", cut(code, 2500));
    }
    for s in stories {
        for c in &s.acceptance_criteria {
            let _ = writeln!(t, "- {c}");
        }
    }
    t.push_str("\nImport the module by its file name. Answer with the whole file as `code`.");
    t
}

/// DevOps' task.
pub fn runbook(program: &str, files: &[String], tests: &str, target: &str) -> String {
    format!(
        "Program: {program}\nFiles: {}\nTests: {tests}\nRelease target: a folder, {target}, with a CURRENT file naming the live release.\n\nWrite the runbook: a one-sentence summary, the rollout steps, smoke checks after the release, and the rollback steps.",
        files.join(", ")
    )
}

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n…", &s[..end])
}
