//! Implementation context: the engineer writes the code and tests, runs them for real, and
//! retries with the failure in hand (three failures escalate); the tech lead reviews the
//! code.

use super::*;
use crate::brief::is_test_file;
use crate::domain::{Blocker, CodeArtifact, ModuleCode, TestResults};
use crate::events::agent::{PM, SSE, TL};
use crate::lifecycle::MAX_ATTEMPTS;
use crate::prompts;
use crate::sandbox;
use crate::state::{Compensation, SagaStep};
use crate::workspace;
use std::collections::BTreeMap;

/// The model's code without Markdown fences.
fn clean_code(code: &str) -> String {
    let t = code.trim();
    let t = t
        .strip_prefix("```python")
        .or_else(|| t.strip_prefix("```"))
        .unwrap_or(t);
    let t = t.strip_suffix("```").unwrap_or(t);
    format!("{}\n", t.trim_matches('\n').trim_end())
}

/// Whether the model's code is worth running: two lines or more, not one line repeated.
fn code_ok(code: &str) -> bool {
    let lines: Vec<&str> = code
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.len() < 2 {
        return false;
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for l in &lines {
        *counts.entry(l).or_default() += 1;
    }
    let worst = counts.values().copied().max().unwrap_or(0);
    !(worst > 5 && worst * 3 > lines.len())
}

/// Files the model's answer for `path` (whatever it wrote, unless empty: bad code is run so
/// that its failure is real and recorded), or notes it as missing.
fn keep_code(
    t: &mut Turn,
    path: &str,
    answer: Option<ModuleCode>,
    files: &mut BTreeMap<String, String>,
    missing: &mut Vec<String>,
) {
    match answer.map(|c| clean_code(&c.code)) {
        Some(code) if !code.trim().is_empty() => {
            if !code_ok(&code) {
                t.audit(
                    "model",
                    format!("`{path}` from the model is one line or one line repeated; it is run anyway"),
                    Value::Null,
                );
            }
            files.insert(path.to_string(), code);
        }
        _ => missing.push(path.to_string()),
    }
}

fn summary(r: &TestResults) -> String {
    if r.failed_test_ids.first().is_some_and(|f| f == "<no code>") {
        return r.output.clone();
    }
    if r.timed_out {
        return "the tests ran past their time limit".into();
    }
    if r.total_tests == 0 {
        return "no test ran (the tests did not load)".into();
    }
    format!(
        "{} of {} tests passed, {} failed{}; coverage {:.1}%",
        r.passed,
        r.total_tests,
        r.failed,
        if r.failed_test_ids.is_empty() {
            String::new()
        } else {
            format!(" ({})", r.failed_test_ids.join(", "))
        },
        r.coverage_percent
    )
}

fn feedback_of(r: &TestResults) -> String {
    let tail: String = {
        let o = r.output.trim();
        let start = o.len().saturating_sub(1200);
        let mut s = start;
        while !o.is_char_boundary(s) {
            s += 1;
        }
        o[s..].to_string()
    };
    format!("{}\n{tail}", summary(r))
}

fn tests_audit(t: &mut Turn, label: &str, r: &TestResults) {
    t.audit(
        "tests",
        format!("{label}: {}", summary(r)),
        json!({
            "run_id": r.run_id, "total": r.total_tests, "passed": r.passed, "failed": r.failed_test_ids,
            "coverage_percent": r.coverage_percent, "lint_passed": r.lint_passed, "max_complexity": r.max_complexity,
            "network": r.network, "confinement": r.confinement, "timed_out": r.timed_out, "output": r.output,
        }),
    );
}

/// Runs the suite of `files` (on top of the workspace at `head`) in a fresh sandbox folder.
pub(crate) async fn run_suite(
    d: &Deps,
    repo_dir: &Path,
    head: &str,
    files: &BTreeMap<String, String>,
    dir: &Path,
    run_id: &str,
) -> Result<TestResults, String> {
    let repo = git2::Repository::open(repo_dir).map_err(|e| e.to_string())?;
    let mut all = workspace::files_at(&repo, head).map_err(|e| e.to_string())?;
    all.extend(files.iter().map(|(k, v)| (k.clone(), v.clone())));
    sandbox::stage(dir, &all).map_err(|e| e.to_string())?;
    sandbox::run_tests_guarded(dir, &d.settings.limits, run_id, repo_dir)
        .await
        .map_err(|e| e.to_string())
}

/// The engineer.
pub(crate) async fn sse_agent(
    d: Arc<Deps>,
    s: Arc<TeamState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    crate::agent_step!(SSE, sse(&d, &s, &ctx).await)
}

fn escalate(t: &mut Turn, s: &TeamState, imp: &crate::state::ImplementationDomain) -> Update {
    t.guards.attempts = imp.attempts;
    t.transition(
        ReqState::Escalated,
        "RequirementEscalated",
        format!("{} failed attempts", imp.attempts),
    );
    t.emit(DomainEvent::RequirementEscalated {
        attempts: imp.attempts,
        last_failure: imp.last_failure.chars().take(600).collect(),
    });
    let mut blockers = s.blockers.clone();
    blockers.push(Blocker {
        blocker_id: format!("BLK-{}", blockers.len() + 1),
        description: format!("The engineer failed {} attempts in a row. Last failure: {}", imp.attempts, imp.last_failure.lines().next().unwrap_or_default()),
        blocked_agent: SSE.into(),
        raised_by: SSE.into(),
        raised_at: now(),
        route: "the project manager (a human): grant more attempts with a hint, or abandon the requirement".into(),
        resolved: false,
        resolution: None,
    });
    t.say(format!("escalated after {} failed attempts", imp.attempts));
    Update::new()
        .implementation(imp.clone())
        .blockers(blockers)
        .status(status::ESCALATED.to_string())
}

async fn sse(d: &Deps, s: &TeamState, ctx: &NodeContext) -> Result<Update, String> {
    let mut t = Turn::begin(d, s, ctx, SSE)?;
    let mut imp = s.implementation.clone();
    if imp.attempts >= MAX_ATTEMPTS {
        let u = escalate(&mut t, s, &imp);
        return t.finish(s, u);
    }
    let ws_dir = t.run_dir.join("workspace");
    let readme = s
        .requirement
        .doc
        .as_ref()
        .map(artifacts::requirements_md)
        .unwrap_or_default();
    let repo = workspace::open_or_init(&ws_dir, &readme).map_err(|e| e.to_string())?;
    let mut u = Update::new();
    let head = if s.workspace_head.is_empty() {
        let h = workspace::head(&repo).map_err(|e| e.to_string())?;
        imp.base_commit = h.clone();
        imp.workspace = rel(&ws_dir);
        h
    } else {
        s.workspace_head.clone()
    };
    u = u.workspace_head(head.clone());
    // What to fix: the last failure, what QC and the tech lead sent, the manager's hints.
    let mut feedback = imp.last_failure.clone();
    if let Some(DomainEvent::TestsFailed {
        failure_summary, ..
    }) = t.received("TestsFailed").last()
    {
        if !feedback.contains(failure_summary.as_str()) {
            feedback = format!("QC: {failure_summary}\n{feedback}");
        }
    }
    if let Some(DomainEvent::CodeReviewFailed { notes, .. }) = t.received("CodeReviewFailed").last()
    {
        feedback = format!("Code review: {}\n{feedback}", notes.join("; "));
    }
    if let Some(h) = imp.manager_hints.last() {
        feedback = format!("Manager's hint: {h}\n{feedback}");
    }
    imp.total_attempts += 1;
    let attempt = imp.total_attempts;
    let stories: Vec<_> = s
        .requirement
        .stories
        .iter()
        .filter(|st| st.status == "approved")
        .cloned()
        .collect();
    let test_task = imp
        .plan
        .iter()
        .find(|p| is_test_file(&p.file_path))
        .cloned();
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    let mut missing: Vec<String> = Vec::new();
    for task in imp.plan.iter().filter(|p| !is_test_file(&p.file_path)) {
        let previous = imp
            .artifacts
            .iter()
            .find(|a| a.file_path == task.file_path)
            .map(|a| a.content.clone());
        let ans: Option<ModuleCode> = t
            .ask(
                d,
                "code",
                prompts::SSE.into(),
                prompts::module(task, &stories, &feedback, previous.as_deref()),
                900,
                |_| {},
            )
            .await?;
        keep_code(&mut t, &task.file_path, ans, &mut files, &mut missing);
    }
    if let Some(tt) = &test_task {
        let sources: Vec<(String, String)> =
            files.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let ans: Option<ModuleCode> = t
            .ask(
                d,
                "tests",
                prompts::SSE.into(),
                prompts::tests(&tt.file_path, &sources, &stories),
                900,
                |_| {},
            )
            .await?;
        keep_code(&mut t, &tt.file_path, ans, &mut files, &mut missing);
    }
    let sandbox_root = t.run_dir.join("sandbox");
    let mut results = if missing.is_empty() {
        run_suite(
            d,
            &ws_dir,
            &head,
            &files,
            &sandbox_root.join(format!("attempt-{attempt}")),
            &format!("RUN-{attempt}"),
        )
        .await?
    } else {
        TestResults {
            run_id: format!("RUN-{attempt}"),
            failed: 1,
            failed_test_ids: vec!["<no code>".into()],
            output: format!("the model gave no usable code for {}", missing.join(", ")),
            run_at: now(),
            ..TestResults::default()
        }
    };
    tests_audit(
        &mut t,
        &format!("attempt {attempt}, the model's code"),
        &results,
    );
    let mut written_by = "model".to_string();
    let model_summary = summary(&results);
    if !results.passing() && !s.requirement.reference.is_empty() {
        let why = model_summary.clone();
        let fb = run_suite(
            d,
            &ws_dir,
            &head,
            &s.requirement.reference,
            &sandbox_root.join(format!("attempt-{attempt}-fallback")),
            &format!("RUN-{attempt}F"),
        )
        .await?;
        t.audit(
            "fallback",
            format!("deterministic fallback: the brief's reference implementation replaces the model's code, which failed ({why})"),
            json!({"files": s.requirement.reference.keys().collect::<Vec<_>>()}),
        );
        tests_audit(
            &mut t,
            &format!("attempt {attempt}, the reference implementation"),
            &fb,
        );
        if fb.passing() {
            // The model's attempt failed: it counts.
            imp.count_failure();
            files = s.requirement.reference.clone();
            results = fb;
            written_by = "fallback".into();
        }
    }
    if results.passing() {
        let message = format!(
            "feat: implement {} (attempt {attempt}, {written_by})",
            files.keys().cloned().collect::<Vec<_>>().join(", ")
        );
        let commit = workspace::commit(&repo, &head, &files, &message, "senior_engineer")
            .map_err(|e| e.to_string())?;
        d.crash_point("after_commit:sse_agent");
        let mut saga = s.saga.clone();
        if commit != head {
            saga.push(SagaStep {
                scope: "implementation".into(),
                action: format!("commit {} on {}", &commit[..10], workspace::BRANCH),
                agent: SSE.into(),
                compensation: Compensation::ResetBranch { to: head.clone() },
                compensated: false,
            });
        }
        imp.artifacts = files
            .iter()
            .enumerate()
            .map(|(i, (p, c))| CodeArtifact {
                artifact_id: format!("ART-{attempt}-{}", i + 1),
                task_id: imp
                    .plan
                    .iter()
                    .find(|t| &t.file_path == p)
                    .map(|t| t.task_id.clone())
                    .unwrap_or_default(),
                language: "python".into(),
                file_path: p.clone(),
                content: c.clone(),
                written_by: written_by.clone(),
                commit_hash: Some(commit.clone()),
            })
            .collect();
        for task in &mut imp.plan {
            task.status = "done".into();
        }
        imp.self_tests = Some(results.clone());
        imp.commit = Some(commit.clone());
        imp.last_failure.clear();
        t.guards.self_tests_passing = true;
        t.transition(ReqState::InReview, "CodeArtifactReady", summary(&results));
        t.emit(DomainEvent::CodeArtifactReady {
            artifact_id: format!("ART-{attempt}"),
            story_ids: stories.iter().map(|s| s.story_id.clone()).collect(),
            test_coverage: results.coverage_percent,
            self_tests_passing: true,
        });
        if written_by == "fallback" {
            t.say(format!("attempt {attempt}: the model's code failed ({model_summary}); the brief's reference implementation: {}; committed {}", summary(&results), &commit[..10]));
        } else {
            t.say(format!(
                "attempt {attempt}: the model's code: {}; committed {}",
                summary(&results),
                &commit[..10]
            ));
        }
        u = u.saga(saga).workspace_head(commit);
    } else {
        imp.count_failure();
        imp.last_failure = feedback_of(&results);
        imp.self_tests = Some(results.clone());
        t.guards.attempts = imp.attempts;
        t.say(format!("attempt {attempt} failed: {}", summary(&results)));
        if imp.attempts >= MAX_ATTEMPTS {
            let e = escalate(&mut t, s, &imp);
            return t.finish(s, e.workspace_head(head));
        }
        t.transition(
            ReqState::InDevelopment,
            "ImplementationFailed",
            summary(&results),
        );
        t.command(PM, "ReportProgress", json!({"attempts": imp.attempts}));
    }
    t.finish(s, u.implementation(imp))
}

/// The tech lead's code review.
pub(crate) async fn tl_code_review(
    d: Arc<Deps>,
    s: Arc<TeamState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    crate::agent_step!(TL, review(&d, &s, &ctx).await)
}

async fn review(d: &Deps, s: &TeamState, ctx: &NodeContext) -> Result<Update, String> {
    let mut t = Turn::begin(d, s, ctx, TL)?;
    let mut imp = s.implementation.clone();
    let artifact = match t.received("CodeArtifactReady").last() {
        Some(DomainEvent::CodeArtifactReady { artifact_id, .. }) => artifact_id.clone(),
        _ => return Err("the tech lead received no CodeArtifactReady event".into()),
    };
    let gates = &s.quality.gates;
    let mut notes = Vec::new();
    for task in &imp.plan {
        if !imp.artifacts.iter().any(|a| a.file_path == task.file_path) {
            notes.push(format!(
                "`{}` of task {} is missing",
                task.file_path, task.task_id
            ));
        }
    }
    for a in imp.artifacts.iter().filter(|a| !is_test_file(&a.file_path)) {
        if !a.content.contains("def ") && !a.content.contains("class ") {
            notes.push(format!("`{}` defines no function or class", a.file_path));
        }
        if a.content.contains("NotImplementedError") || a.content.contains("TODO") {
            notes.push(format!(
                "`{}` is unfinished (NotImplementedError or TODO)",
                a.file_path
            ));
        }
    }
    if let Some(r) = &imp.self_tests {
        if r.max_complexity > gates.max_cyclomatic_complexity {
            notes.push(format!(
                "{} has cyclomatic complexity {} (at most {})",
                r.most_complex, r.max_complexity, gates.max_cyclomatic_complexity
            ));
        }
    }
    if notes.is_empty() {
        t.transition(
            ReqState::TestPending,
            "CodeReviewPassed",
            format!("{artifact} reviewed"),
        );
        t.say(format!("code review of {artifact} passed"));
        return t.finish(s, Update::new());
    }
    imp.count_failure();
    imp.last_failure = format!("Code review: {}", notes.join("; "));
    t.transition(
        ReqState::InDevelopment,
        "CodeReviewFailed",
        notes.join("; "),
    );
    t.emit(DomainEvent::CodeReviewFailed {
        artifact_id: artifact,
        notes: notes.clone(),
    });
    t.say(format!("code review failed: {}", notes.join("; ")));
    let mut q = s.quality.clone();
    q.notes
        .extend(notes.iter().map(|n| format!("code review: {n}")));
    t.finish(s, Update::new().implementation(imp).quality(q))
}
