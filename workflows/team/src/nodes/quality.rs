//! Quality context: QC derives its own test cases from the stories, runs the suite again in
//! a fresh sandbox (it does not trust the engineer's report) and checks the gates.

use super::*;
use crate::events::agent::QC;
use crate::translate::{match_tests, story_to_test_cases};

/// The QC engineer.
pub(crate) async fn qc_agent(
    d: Arc<Deps>,
    s: Arc<TeamState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    crate::agent_step!(QC, qc(&d, &s, &ctx).await)
}

async fn qc(d: &Deps, s: &TeamState, ctx: &NodeContext) -> Result<Update, String> {
    let mut t = Turn::begin(d, s, ctx, QC)?;
    let mut q = s.quality.clone();
    let mut imp = s.implementation.clone();
    let artifact = match t.received("CodeArtifactReady").last() {
        Some(DomainEvent::CodeArtifactReady { artifact_id, .. }) => artifact_id.clone(),
        _ => return Err("QC received no CodeArtifactReady event".into()),
    };
    let commit = imp.commit.clone().ok_or("QC has no commit to test")?;
    q.runs += 1;
    let ws = PathBuf::from(&imp.workspace);
    let dir = t.run_dir.join("sandbox").join(format!("qc-{}", q.runs));
    let r = run_suite(
        d,
        &ws,
        &commit,
        &Default::default(),
        &dir,
        &format!("QC-{}", q.runs),
    )
    .await?;
    let gates = q.gates.clone();
    let min_cov = gates.min_test_coverage * 100.0;
    let mut failures = Vec::new();
    if !r.passing() {
        failures.push(format!(
            "tests: {} of {} passed{}{}",
            r.passed,
            r.total_tests,
            if r.failed_test_ids.is_empty() {
                String::new()
            } else {
                format!("; failing: {}", r.failed_test_ids.join(", "))
            },
            if r.timed_out { "; timed out" } else { "" }
        ));
    }
    if r.coverage_percent < min_cov {
        failures.push(format!(
            "coverage {:.1}% is under {:.0}%",
            r.coverage_percent, min_cov
        ));
    }
    if gates.lint_must_pass && !r.lint_passed {
        failures.push("lint: a file does not compile".into());
    }
    if r.max_complexity > gates.max_cyclomatic_complexity {
        failures.push(format!(
            "{} has complexity {} (at most {})",
            r.most_complex, r.max_complexity, gates.max_cyclomatic_complexity
        ));
    }
    let mut notes = vec!["type check and security scan: not run (no checker is installed with the standard toolchain; these gates are not required)".to_string()];
    // QC's own cases, from the stories, matched to the suite's tests by name.
    let mut cases = Vec::new();
    for st in s
        .requirement
        .stories
        .iter()
        .filter(|st| st.status == "approved")
    {
        for mut c in story_to_test_cases(st) {
            c.matched_tests = match_tests(&c, &r.test_ids);
            let failing: Vec<&String> = c
                .matched_tests
                .iter()
                .filter(|m| r.failed_test_ids.contains(m))
                .collect();
            c.status = if c.matched_tests.is_empty() {
                "uncovered".into()
            } else if failing.is_empty() && !r.timed_out {
                "passed".into()
            } else {
                c.failure_reason = Some(format!(
                    "failing: {}",
                    failing
                        .iter()
                        .map(|f| f.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                "failed".into()
            };
            cases.push(c);
        }
    }
    let uncovered = cases.iter().filter(|c| c.status == "uncovered").count();
    if uncovered > 0 {
        notes.push(format!(
            "{uncovered} of {} test cases have no test named after them",
            cases.len()
        ));
    }
    let ratio = if r.total_tests == 0 {
        0.0
    } else {
        f64::from(r.passed) / f64::from(r.total_tests)
    };
    let score = 40.0 * ratio
        + 30.0 * (r.coverage_percent / min_cov.max(1.0)).min(1.0)
        + if r.lint_passed { 15.0 } else { 0.0 }
        + if r.max_complexity <= gates.max_cyclomatic_complexity {
            15.0
        } else {
            0.0
        };
    let score = (score * 10.0).round() / 10.0;
    t.audit(
        "tests",
        format!("QC run {}: {} of {} passed, coverage {:.1}%, complexity {} ({}), lint {}", q.runs, r.passed, r.total_tests, r.coverage_percent, r.max_complexity, r.most_complex, if r.lint_passed { "passed" } else { "failed" }),
        json!({"run_id": r.run_id, "failed": r.failed_test_ids, "output": r.output, "network": r.network, "cases": cases.iter().map(|c| json!({"id": c.test_id, "status": c.status, "tests": c.matched_tests})).collect::<Vec<_>>()}),
    );
    q.test_cases = cases;
    q.results = Some(r.clone());
    q.score = Some(score);
    q.notes = notes;
    if failures.is_empty() {
        q.passed = true;
        t.transition(
            ReqState::ReadyToDeploy,
            "QualityGatePassed",
            format!("score {score}"),
        );
        t.emit(DomainEvent::QualityGatePassed {
            artifact_id: artifact,
            quality_score: score,
            passed: r.passed,
            coverage_percent: r.coverage_percent,
        });
        t.say(format!(
            "quality gates passed: score {score}, {} tests, coverage {:.1}%",
            r.passed, r.coverage_percent
        ));
        return t.finish(s, Update::new().quality(q));
    }
    q.passed = false;
    let summary = failures.join("; ");
    imp.count_failure();
    imp.last_failure = format!(
        "QC: {summary}\n{}",
        r.output
            .chars()
            .rev()
            .take(1000)
            .collect::<String>()
            .chars()
            .rev()
            .collect::<String>()
    );
    t.transition(ReqState::InDevelopment, "TestsFailed", summary.clone());
    t.emit(DomainEvent::TestsFailed {
        artifact_id: artifact,
        failure_summary: summary.clone(),
        failed_test_ids: r.failed_test_ids.clone(),
    });
    t.say(format!("quality gates failed: {summary}"));
    t.finish(s, Update::new().quality(q).implementation(imp))
}
