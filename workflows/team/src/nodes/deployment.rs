//! Deployment context: DevOps prepares the pipeline and the runbook, a human approves, and
//! the release runs as a saga: tag, copy, activate, smoke test; a failure compensates what
//! was done, in reverse.

use super::*;
use crate::domain::{CicdConfig, DeploymentStatus, RunbookDraft};
use crate::events::agent::{DEVOPS, PM, QC};
use crate::prompts;
use crate::sandbox;
use crate::state::{Compensation, SagaStep};
use crate::workspace;
use std::collections::BTreeMap;

/// The command that runs the tests, in CI and in the smoke check.
pub const TEST_COMMAND: &str = "python3 -m unittest discover -v";
/// Where the CI configuration goes in the workspace.
pub const CI_PATH: &str = ".github/workflows/ci.yml";

/// The CI configuration (GitHub Actions syntax): check out, set up Python, run the tests.
pub fn ci_yaml() -> String {
    format!(
        "name: ci\non:\n  push:\n    branches: [main]\n  pull_request:\njobs:\n  test:\n    runs-on: ubuntu-latest\n    steps:\n      - uses: actions/checkout@v4\n      - uses: actions/setup-python@v5\n        with:\n          python-version: \"3.11\"\n      - name: Unit tests\n        run: {TEST_COMMAND}\n"
    )
}

/// Checks that `yaml` parses and has a job whose steps run `command`.
pub fn check_ci(yaml: &str, command: &str) -> Result<(), String> {
    let docs = yaml_rust2::YamlLoader::load_from_str(yaml)
        .map_err(|e| format!("the CI configuration does not parse: {e}"))?;
    let doc = docs.first().ok_or("the CI configuration is empty")?;
    let jobs = doc["jobs"]
        .as_hash()
        .ok_or("the CI configuration has no jobs")?;
    let runs = jobs.values().any(|job| {
        job["steps"].as_vec().is_some_and(|steps| {
            steps
                .iter()
                .any(|s| s["run"].as_str().is_some_and(|r| r.trim() == command))
        })
    });
    if !runs {
        return Err(format!("no job of the CI configuration runs `{command}`"));
    }
    if doc["on"].is_badvalue() {
        return Err("the CI configuration has no trigger (`on`)".into());
    }
    Ok(())
}

fn runbook_md(r: &RunbookDraft, tag_hint: &str, target: &str) -> String {
    let mut out = format!("# Runbook\n\n{}\n\nTarget: `{target}` (releases under `releases/`, the live one named in `CURRENT`). Release tag: `{tag_hint}`.\n\n## Roll out\n\n", r.summary.trim());
    for (i, s) in r.rollout_steps.iter().enumerate() {
        out.push_str(&format!("{}. {}\n", i + 1, s.trim()));
    }
    out.push_str("\n## Smoke checks\n\n");
    for s in &r.smoke_checks {
        out.push_str(&format!("- {}\n", s.trim()));
    }
    out.push_str("\n## Roll back\n\n");
    for (i, s) in r.rollback_steps.iter().enumerate() {
        out.push_str(&format!("{}. {}\n", i + 1, s.trim()));
    }
    out
}

/// DevOps: the CI configuration (checked to parse) and the runbook, committed.
pub(crate) async fn devops_agent(
    d: Arc<Deps>,
    s: Arc<TeamState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    crate::agent_step!(DEVOPS, devops(&d, &s, &ctx).await)
}

async fn devops(d: &Deps, s: &TeamState, ctx: &NodeContext) -> Result<Update, String> {
    let mut t = Turn::begin(d, s, ctx, DEVOPS)?;
    let passed = t.received("QualityGatePassed");
    if passed.is_empty() {
        return Err("DevOps received no QualityGatePassed event".into());
    }
    let q = &s.quality;
    t.query(QC, "QualityReport", json!({"artifact": s.implementation.commit}), json!({"score": q.score, "passed": q.passed, "coverage_percent": q.results.as_ref().map(|r| r.coverage_percent)}));
    let target = deploy_target(s, &t.run_dir);
    let files: Vec<String> = s
        .implementation
        .artifacts
        .iter()
        .filter(|a| !crate::brief::is_test_file(&a.file_path))
        .map(|a| a.file_path.clone())
        .collect();
    let program = s
        .requirement
        .doc
        .as_ref()
        .and_then(|d| d.clarified_objectives.first().cloned())
        .unwrap_or_default();
    let draft: Option<RunbookDraft> = t
        .ask(
            d,
            "runbook",
            prompts::DEVOPS.into(),
            prompts::runbook(
                &program,
                &files,
                TEST_COMMAND,
                &target.display().to_string(),
            ),
            400,
            |_| {},
        )
        .await?;
    let draft = draft.filter(|r| {
        usable(&r.summary)
            && r.rollout_steps.iter().all(|x| usable(x))
            && r.rollback_steps.iter().all(|x| usable(x))
            && !r.rollout_steps.is_empty()
            && !r.rollback_steps.is_empty()
    });
    let draft = match draft {
        Some(r) => r,
        None => {
            t.audit("fallback", "the runbook from the model was not usable: the standard runbook of a folder release is written", Value::Null);
            RunbookDraft {
                summary: format!("Release {} as a folder release.", files.join(", ")),
                rollout_steps: vec![
                    "Tag the approved commit of the workspace as the release".into(),
                    "Copy the tagged tree to releases/<tag> in the target folder".into(),
                    "Write the tag to CURRENT".into(),
                ],
                smoke_checks: vec![format!(
                    "Run `{TEST_COMMAND}` in the release folder: every test passes"
                )],
                rollback_steps: vec![
                    "Write the previous tag back to CURRENT (or remove CURRENT if there was none)"
                        .into(),
                    "Remove the release folder".into(),
                    "Delete the release tag".into(),
                ],
            }
        }
    };
    let tag_hint = format!("release-{}", s.deployment.releases + 1);
    let runbook = runbook_md(&draft, &tag_hint, &target.display().to_string());
    let yaml = ci_yaml();
    check_ci(&yaml, TEST_COMMAND)?;
    let repo = git2::Repository::open(&s.implementation.workspace).map_err(|e| e.to_string())?;
    let head = s.workspace_head.clone();
    let mut add = BTreeMap::new();
    add.insert(CI_PATH.to_string(), yaml.clone());
    add.insert("RUNBOOK.md".to_string(), runbook.clone());
    let commit = workspace::commit(
        &repo,
        &head,
        &add,
        "ci: pipeline and runbook",
        "devops_engineer",
    )
    .map_err(|e| e.to_string())?;
    let mut saga = s.saga.clone();
    if commit != head
        && !saga
            .iter()
            .any(|st| matches!(&st.compensation, Compensation::ResetBranch { to } if *to == head))
    {
        saga.push(SagaStep {
            scope: "implementation".into(),
            action: format!("commit {} (CI configuration and runbook)", &commit[..10]),
            agent: DEVOPS.into(),
            compensation: Compensation::ResetBranch { to: head.clone() },
            compensated: false,
        });
    }
    artifacts::write_text(&t.run_dir.join("ci.yml"), &yaml).map_err(|e| e.to_string())?;
    artifacts::write_text(&t.run_dir.join("runbook.md"), &runbook).map_err(|e| e.to_string())?;
    let config = CicdConfig {
        config_id: format!("CI-{}", &commit[..8]),
        pipeline_tool: "github_actions".into(),
        pipeline_yaml: yaml,
        environments: vec!["production".into()],
        test_commands: vec![TEST_COMMAND.into()],
        deploy_commands: vec![format!("ferrograph resume {} --approve", t.run)],
        rollback_procedure: draft.rollback_steps.join("; "),
        generated_by: DEVOPS.into(),
        generated_at: now(),
    };
    t.emit(DomainEvent::DeploymentPrepared {
        config_id: config.config_id.clone(),
    });
    t.say(format!(
        "prepared {CI_PATH} and RUNBOOK.md (commit {})",
        &commit[..10]
    ));
    let mut dep = s.deployment.clone();
    dep.cicd = Some(config);
    dep.runbook = runbook;
    dep.commit = Some(commit.clone());
    dep.approved = false;
    dep.status = DeploymentStatus {
        status: "pending".into(),
        environment: "production".into(),
        deployment_path: Some(target.display().to_string()),
        ..DeploymentStatus::default()
    };
    t.finish(
        s,
        Update::new()
            .deployment(dep)
            .saga(saga)
            .workspace_head(commit)
            .status(status::AWAITING_DEPLOYMENT.to_string()),
    )
}

fn deploy_target(s: &TeamState, run_dir: &Path) -> PathBuf {
    if s.deploy_to.is_empty() {
        run_dir.join("deploy")
    } else {
        PathBuf::from(&s.deploy_to)
    }
}

/// Human gate 2: the deployment.
pub(crate) async fn deploy_gate(
    d: Arc<Deps>,
    s: Arc<TeamState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    let mut t = match Turn::begin(&d, &s, &ctx, PM) {
        Ok(t) => t,
        Err(e) => return Ok(failed(PM, e)),
    };
    let r = s.quality.results.clone().unwrap_or_default();
    let target = s
        .deployment
        .status
        .deployment_path
        .clone()
        .unwrap_or_default();
    let summary = format!(
        "## Ready to deploy\n\nQuality score **{}**; {} of {} tests passed; coverage {:.1}%; most complex function {} ({}).\n\nTarget: `{target}`\n\n### CI configuration (`{CI_PATH}`)\n\n```yaml\n{}```\n\n{}",
        s.quality.score.unwrap_or_default(),
        r.passed,
        r.total_tests,
        r.coverage_percent,
        r.most_complex,
        r.max_complexity,
        s.deployment.cicd.as_ref().map(|c| c.pipeline_yaml.clone()).unwrap_or_default(),
        s.deployment.runbook
    );
    let answer: Value = ctx.interrupt(json!({
        "kind": "review",
        "checkpoint_type": "deployment_approval",
        "title": "Approve the deployment",
        "message": "Ready to deploy. Please review and approve.",
        "summary": summary,
        "cicd_config": s.deployment.cicd,
        "quality_score": s.quality.score,
        "test_results": s.quality.results,
        "deployment_target": s.deployment.status.environment,
        "deployment_path": target,
        "choices": ["approve", "reject", "feedback"],
        "feedback_placeholder": "why the deployment is rejected (back to QC)",
    }))?;
    let answer = GateAnswer::from_json(&answer).map_err(NodeError::fatal)?;
    let mut dep = s.deployment.clone();
    let u = match answer {
        GateAnswer::Approve => {
            dep.approved = true;
            t.guards.deployment_approved = true;
            t.audit("gate", "deployment approved", Value::Null);
            t.command(DEVOPS, "Deploy", json!({"target": target}));
            t.say("a human approved the deployment");
            Update::new()
                .deployment(dep)
                .decision("approve".to_string())
                .status(String::new())
        }
        GateAnswer::Reject(reason) => {
            dep.approved = false;
            dep.notes
                .push(format!("Deployment rejected by human: {reason}"));
            t.transition(ReqState::TestPending, "DeploymentRejected", reason.clone());
            t.audit(
                "gate",
                format!("deployment rejected: {reason}"),
                Value::Null,
            );
            t.emit(DomainEvent::DeploymentRejected {
                reason: reason.clone(),
            });
            t.say(format!("a human rejected the deployment: {reason}"));
            Update::new()
                .deployment(dep)
                .decision("reject".to_string())
                .status(String::new())
        }
    };
    Ok(settle(PM, t.finish(&s, u)))
}

/// Undoes one saga step.
pub(crate) fn compensate(repo: Option<&git2::Repository>, c: &Compensation) -> Result<(), String> {
    match c {
        Compensation::ResetBranch { to } => match repo {
            Some(r) => workspace::reset_branch(r, to).map_err(|e| e.to_string()),
            None => Err("no workspace".into()),
        },
        Compensation::DeleteTag { name } => match repo {
            Some(r) => workspace::delete_tag(r, name).map_err(|e| e.to_string()),
            None => Err("no workspace".into()),
        },
        Compensation::RemoveDir { path } => match std::fs::remove_dir_all(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("{path}: {e}")),
        },
        Compensation::RestoreCurrent { path, previous } => match previous {
            Some(p) => artifacts::write_text(Path::new(path), p).map_err(|e| e.to_string()),
            None => match std::fs::remove_file(path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(format!("{path}: {e}")),
            },
        },
    }
}

/// Runs the compensations of `scope` not yet run, newest first; each is audited.
pub(crate) fn run_compensations(
    t: &mut Turn,
    repo: Option<&git2::Repository>,
    saga: &mut [SagaStep],
    scope: &str,
) -> Vec<String> {
    let mut done = Vec::new();
    for st in saga
        .iter_mut()
        .rev()
        .filter(|st| st.scope == scope && !st.compensated)
    {
        match compensate(repo, &st.compensation) {
            Ok(()) => {
                st.compensated = true;
                t.audit(
                    "compensation",
                    format!("undid: {}", st.action),
                    serde_json::to_value(&st.compensation).unwrap_or(Value::Null),
                );
                done.push(st.action.clone());
            }
            Err(e) => t.audit(
                "compensation",
                format!("could not undo {}: {e}", st.action),
                Value::Null,
            ),
        }
    }
    done
}

/// The release saga.
pub(crate) async fn deploy(
    d: Arc<Deps>,
    s: Arc<TeamState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    crate::agent_step!(DEVOPS, release(&d, &s, &ctx).await)
}

fn copy_release(files: &BTreeMap<String, String>, dir: &Path) -> Result<(), String> {
    let tmp = dir.with_extension("partial");
    let _ = std::fs::remove_dir_all(&tmp);
    sandbox::stage(&tmp, files).map_err(|e| e.to_string())?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::rename(&tmp, dir).map_err(|e| format!("{}: {e}", dir.display()))
}

async fn release(d: &Deps, s: &TeamState, ctx: &NodeContext) -> Result<Update, String> {
    let mut t = Turn::begin(d, s, ctx, DEVOPS)?;
    let mut dep = s.deployment.clone();
    let mut saga = s.saga.clone();
    dep.releases += 1;
    let tag = format!("release-{}", dep.releases);
    let target = deploy_target(s, &t.run_dir);
    let head = s.workspace_head.clone();
    let ws = s.implementation.workspace.clone();
    let open = || git2::Repository::open(&ws).map_err(|e| e.to_string());
    let release_dir = target.join("releases").join(&tag);
    let current = target.join("CURRENT");
    let step = |saga: &mut Vec<SagaStep>, action: String, c: Compensation| {
        saga.push(SagaStep {
            scope: "deployment".into(),
            action,
            agent: DEVOPS.into(),
            compensation: c,
            compensated: false,
        });
    };
    // Tag, copy, activate (no await while the repository is open: it is not `Sync`).
    let prepared: Result<BTreeMap<String, String>, String> = (|| {
        let repo = open()?;
        workspace::tag(&repo, &tag, &head, &format!("Release {tag}")).map_err(|e| e.to_string())?;
        step(
            &mut saga,
            format!("tag {tag}"),
            Compensation::DeleteTag { name: tag.clone() },
        );
        d.crash_point("after_tag:deploy");
        let files = workspace::files_at(&repo, &head).map_err(|e| e.to_string())?;
        copy_release(&files, &release_dir)?;
        step(
            &mut saga,
            format!("copy the release to {}", release_dir.display()),
            Compensation::RemoveDir {
                path: release_dir.display().to_string(),
            },
        );
        let previous = if current.is_file() {
            std::fs::read_to_string(&current).ok()
        } else {
            None
        };
        artifacts::write_text(&current, &format!("{tag}\n"))
            .map_err(|e| format!("activating the release: {e}"))?;
        step(
            &mut saga,
            format!("point {} at {tag}", current.display()),
            Compensation::RestoreCurrent {
                path: current.display().to_string(),
                previous,
            },
        );
        Ok(files)
    })();
    let outcome: Result<crate::domain::TestResults, String> = match prepared {
        Err(e) => Err(e),
        Ok(files) => {
            let smoke_dir = t.run_dir.join("sandbox").join(format!("smoke-{tag}"));
            match sandbox::stage(&smoke_dir, &files) {
                Err(e) => Err(e.to_string()),
                Ok(()) => match sandbox::run_tests(
                    &smoke_dir,
                    &d.settings.limits,
                    &format!("SMOKE-{tag}"),
                )
                .await
                {
                    Err(e) => Err(e.to_string()),
                    Ok(r) if !r.passing() => Err(format!(
                        "the smoke check failed: {} of {} tests passed",
                        r.passed, r.total_tests
                    )),
                    Ok(r) => Ok(r),
                },
            }
        }
    };
    match outcome {
        Ok(r) => {
            t.audit(
                "tests",
                format!(
                    "smoke check of {tag}: {} of {} passed",
                    r.passed, r.total_tests
                ),
                json!({"output": r.output}),
            );
            t.guards.deployment_approved = dep.approved;
            if !t.transition(ReqState::Deployed, "Deployed", tag.clone()) {
                return Err("the lifecycle refused the deployment (see the audit trail)".into());
            }
            t.emit(DomainEvent::Deployed {
                version: tag.clone(),
                path: release_dir.display().to_string(),
            });
            dep.status = DeploymentStatus {
                status: "deployed".into(),
                environment: "production".into(),
                deployed_at: Some(now()),
                deployed_by: "human approval".into(),
                deployment_path: Some(release_dir.display().to_string()),
                version: Some(tag.clone()),
            };
            t.say(format!("deployed {tag} to {}", release_dir.display()));
            t.finish(
                s,
                Update::new()
                    .deployment(dep)
                    .saga(saga)
                    .status(status::DEPLOYED.to_string()),
            )
        }
        Err(reason) => {
            t.audit(
                "error",
                format!("release {tag} failed: {reason}"),
                Value::Null,
            );
            let repo = open().ok();
            let undone = run_compensations(&mut t, repo.as_ref(), &mut saga, "deployment");
            t.emit(DomainEvent::DeploymentFailed {
                reason: reason.clone(),
                compensated: undone.clone(),
            });
            dep.status.status = "rolled_back".into();
            dep.notes.push(format!(
                "Release {tag} failed and was rolled back: {reason}"
            ));
            t.command(
                PM,
                "InvestigateFailedDeployment",
                json!({"tag": tag, "reason": reason}),
            );
            t.say(format!(
                "release {tag} failed ({reason}); undid {} step(s)",
                undone.len()
            ));
            t.finish(
                s,
                Update::new()
                    .deployment(dep)
                    .saga(saga)
                    .status(status::DEPLOYMENT_FAILED.to_string()),
            )
        }
    }
}
