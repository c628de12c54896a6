//! Every route of the ticket-to-pr graph on the TaskMaster fixture (a real git repository),
//! with the scripted model: approve, reject after feedback, feedback three times, unknown
//! ticket, model failure, a path outside the repository, bad tickets and repositories, and a
//! branch that holds other commits. The real model's run is in `smollm2.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ferrograph::prelude::*;
use ferrograph::runtime::JsonInput;
use ferrograph::Registry;
use ferrograph_chat::ChatModel;
use ferrograph_ticket_pr::fixture::{self, Fixture, BUG_TICKET, STORY_TICKET};
use ferrograph_ticket_pr::testing::{scripted_model, settings, Behaviour};
use ferrograph_ticket_pr::ticket::TicketStore;
use ferrograph_ticket_pr::{register_with, NAME};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;

struct Setup {
    _dir: tempfile::TempDir,
    data: std::path::PathBuf,
    fx: Fixture,
    registry: Registry,
    model: ferrograph_chat::testing::ScriptedModel,
}

async fn setup(behaviour: Behaviour) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let fx = fixture::create(&dir.path().join("fx")).unwrap();
    let data = dir.path().join("data");
    let model = scripted_model(behaviour);
    let rt = Runtime::new().await.unwrap();
    let mut registry = Registry::new();
    let m: Arc<dyn ChatModel> = Arc::new(model.clone());
    register_with(
        &mut registry,
        &rt,
        Arc::new(MemorySaver::new()),
        settings(&data, m),
    )
    .await
    .unwrap();
    Setup {
        _dir: dir,
        data,
        fx,
        registry,
        model,
    }
}

impl Setup {
    fn input(&self, key: &str) -> Value {
        json!({
            "ticket_key": key,
            "tickets": self.fx.tickets.display().to_string(),
            "repo": self.fx.repo.display().to_string(),
            "out": self.data.join("out").display().to_string(),
        })
    }

    async fn start(&self, thread: &str, key: &str) -> ferrograph::runtime::JsonOutcome {
        self.registry
            .get(NAME)
            .unwrap()
            .workflow
            .invoke(
                JsonInput::Update(self.input(key)),
                RunConfig::thread(thread),
            )
            .await
            .unwrap()
    }

    async fn answer(&self, thread: &str, v: Value) -> ferrograph::runtime::JsonOutcome {
        self.registry
            .get(NAME)
            .unwrap()
            .workflow
            .invoke(
                JsonInput::Resume(Resume::value(v)),
                RunConfig::thread(thread),
            )
            .await
            .unwrap()
    }

    fn branches(&self) -> Vec<String> {
        let repo = git2::Repository::open(&self.fx.repo).unwrap();
        let mut out: Vec<String> = repo
            .branches(Some(git2::BranchType::Local))
            .unwrap()
            .map(|b| b.unwrap().0.name().unwrap().unwrap().to_string())
            .collect();
        out.sort();
        out
    }
}

/// The commits of `branch` after `main`, oldest first: (message's first line, changed paths).
fn commits(repo_dir: &Path, branch: &str) -> Vec<(String, Vec<String>)> {
    let repo = git2::Repository::open(repo_dir).unwrap();
    let main = repo.revparse_single("main").unwrap().id();
    let mut walk = repo.revwalk().unwrap();
    walk.push(repo.revparse_single(branch).unwrap().id())
        .unwrap();
    walk.hide(main).unwrap();
    walk.set_sorting(git2::Sort::TOPOLOGICAL | git2::Sort::REVERSE)
        .unwrap();
    walk.map(|id| {
        let c = repo.find_commit(id.unwrap()).unwrap();
        let parent = c.parent(0).unwrap();
        let diff = repo
            .diff_tree_to_tree(
                Some(&parent.tree().unwrap()),
                Some(&c.tree().unwrap()),
                None,
            )
            .unwrap();
        let paths = diff
            .deltas()
            .map(|d| d.new_file().path().unwrap().display().to_string())
            .collect();
        (c.summary().unwrap().to_string(), paths)
    })
    .collect()
}

#[tokio::test]
async fn bug_ticket_to_gate_then_approve_makes_branch_commits_pr_and_comment() {
    let s = setup(Behaviour::Good).await;
    let out = s.start("t-approve", BUG_TICKET).await;
    assert_eq!(out.status, "interrupted", "{:#}", out.state);
    let gate = &out.interrupts[0].value.0;
    assert_eq!(gate["kind"], "review");
    assert_eq!(gate["ticket_key"], BUG_TICKET);
    assert_eq!(gate["choices"], json!(["approve", "reject", "feedback"]));
    let diff = gate["diff"].as_str().unwrap();
    let service = "taskmaster-core/src/main/java/com/taskmaster/core/TaskService.java";
    let test = "taskmaster-core/src/test/java/com/taskmaster/core/TaskServiceTest.java";
    assert!(diff.contains(&format!("--- a/{service}")), "{diff}");
    assert!(
        diff.contains("-                .filter(task -> task.getDueDate().isBefore(today))"),
        "{diff}"
    );
    assert!(
        diff.contains("+                .filter(task -> task.getDueDate() != null && task.getDueDate().isBefore(today))"),
        "{diff}"
    );
    assert!(diff.contains(&format!("+++ b/{test}")), "{diff}");
    let summary = gate["summary"].as_str().unwrap();
    assert!(summary.contains("**Root cause:**"), "{summary}");
    assert!(summary.contains(service), "{summary}");
    assert_eq!(out.state["affected_modules"], json!(["taskmaster-core"]));
    assert_eq!(out.state["generations"], 1);
    // The bug touches one module: no multi-module warning.
    assert_eq!(gate["warnings"], json!([]));
    assert!(
        s.branches() == ["main"],
        "nothing is applied before approval"
    );

    let out = s.answer("t-approve", json!("approve")).await;
    assert_eq!(out.status, "done", "{:#}", out.state);
    assert_eq!(out.state["status"], "pr opened", "{:#}", out.state);
    let branch = out.state["branch"].as_str().unwrap().to_string();
    assert!(branch.starts_with("ticket/task-101-"), "{branch}");
    let log = commits(&s.fx.repo, &branch);
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[0].0, "fix(TASK-101): skip tasks without a due date");
    assert_eq!(log[0].1, [service]);
    assert_eq!(log[1].1, [test]);
    // The user's working tree and branch are untouched.
    let repo = git2::Repository::open(&s.fx.repo).unwrap();
    assert_eq!(repo.head().unwrap().shorthand(), Some("main"));
    assert!(std::fs::read_to_string(s.fx.repo.join(service))
        .unwrap()
        .contains("task.getDueDate().isBefore(today)"));
    assert!(repo.statuses(None).unwrap().is_empty());
    // One PR, its patch, one comment.
    let prs = ferrograph_ticket_pr::prs::PrStore::new(s.data.join(NAME).join("prs"))
        .list()
        .unwrap();
    assert_eq!(prs.len(), 1);
    assert_eq!(prs[0].title, format!("[{BUG_TICKET}] Overdue list fails with NullPointerException for tasks without a due date"));
    let patch = std::fs::read_to_string(prs[0].patch_path.as_ref().unwrap()).unwrap();
    assert!(
        patch.contains("Subject: [PATCH 1/2] fix(TASK-101):"),
        "{patch}"
    );
    let comments = TicketStore::open(&s.fx.tickets)
        .unwrap()
        .comments(BUG_TICKET)
        .unwrap();
    assert_eq!(comments.len(), 1);
    assert!(
        comments[0].body.contains("Pull request #1"),
        "{}",
        comments[0].body
    );
}

#[tokio::test]
async fn feedback_regenerates_and_a_later_reject_ends_with_nothing_applied() {
    let s = setup(Behaviour::Good).await;
    s.start("t-rej", BUG_TICKET).await;
    let out = s
        .answer(
            "t-rej",
            json!({"feedback": "mention the ticket in a comment"}),
        )
        .await;
    assert_eq!(out.status, "interrupted");
    assert_eq!(out.state["generations"], 2);
    let gate = &out.interrupts[0].value.0;
    assert_eq!(gate["generation"], 2);
    assert!(
        gate["diff"]
            .as_str()
            .unwrap()
            .contains("revised after feedback"),
        "the second generation saw the feedback"
    );
    // The seed's stale-feedback bug: a reject after feedback must end the run.
    let out = s.answer("t-rej", json!("reject")).await;
    assert_eq!(out.status, "done");
    assert_eq!(out.state["status"], "rejected");
    assert_eq!(s.branches(), ["main"]);
    assert!(TicketStore::open(&s.fx.tickets)
        .unwrap()
        .comments(BUG_TICKET)
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_fourth_generation_is_refused_and_bad_answers_leave_the_gate_open() {
    let s = setup(Behaviour::Good).await;
    s.start("t-limit", BUG_TICKET).await;
    let wf = &s.registry.get(NAME).unwrap().workflow;
    let bad = wf
        .invoke(
            JsonInput::Resume(Resume::value(json!(""))),
            RunConfig::thread("t-limit"),
        )
        .await
        .unwrap_err();
    assert!(
        bad.to_string().contains("unrecognized review answer"),
        "{bad}"
    );
    let calls_before = s.model.calls();
    let mut out = None;
    for i in 0..3 {
        out = Some(s.answer("t-limit", json!(format!("try again ({i})"))).await);
    }
    let out = out.unwrap();
    assert_eq!(out.status, "done");
    assert_eq!(out.state["status"], "revision limit reached");
    assert_eq!(out.state["generations"], 3);
    assert_eq!(out.state["feedback"].as_array().unwrap().len(), 3);
    // Two regenerations (changes and tests each), not three.
    assert_eq!(s.model.calls() - calls_before, 4);
    assert_eq!(s.branches(), ["main"]);
}

#[tokio::test]
async fn story_touches_every_module_and_is_flagged() {
    let s = setup(Behaviour::Good).await;
    let out = s.start("t-story", STORY_TICKET).await;
    assert_eq!(out.status, "interrupted", "{:#}", out.state);
    assert_eq!(out.state["ticket"]["type"], "Story");
    assert_eq!(out.state["affected_modules"].as_array().unwrap().len(), 3);
    let warnings = out.interrupts[0].value.0["warnings"].to_string();
    assert!(warnings.contains("Multi-module change"), "{warnings}");
    assert!(out.state["root_cause"].as_str().unwrap().is_empty());
}

#[tokio::test]
async fn unknown_ticket_ends_without_a_model_call() {
    let s = setup(Behaviour::Good).await;
    let out = s.start("t-unknown", "TASK-999").await;
    assert_eq!(out.status, "done");
    assert_eq!(out.state["status"], "unknown ticket");
    assert!(out.state["error"].as_str().unwrap().contains("TASK-999"));
    assert_eq!(s.model.calls(), 0);
}

#[tokio::test]
async fn model_failure_ends_with_the_error_and_a_status() {
    let s = setup(Behaviour::Fails).await;
    let out = s.start("t-fail", BUG_TICKET).await;
    assert_eq!(out.status, "done");
    assert_eq!(out.state["status"], "failed");
    let err = out.state["error"].as_str().unwrap();
    assert!(
        err.contains("classifying the ticket") && err.contains("scripted failure"),
        "{err}"
    );
    // A schema error is not retried; the fallback is called once.
    assert_eq!(s.model.calls(), 2);
    assert_eq!(out.state["llm_calls"][0]["used_fallback"], true);
}

#[tokio::test]
async fn a_path_outside_the_repository_is_refused() {
    let s = setup(Behaviour::PathOutside).await;
    let out = s.start("t-path", BUG_TICKET).await;
    assert_eq!(out.state["status"], "failed");
    let err = out.state["error"].as_str().unwrap();
    assert!(err.contains("refused path `../outside/Evil.java`"), "{err}");
    assert_eq!(s.branches(), ["main"]);
}

#[tokio::test]
async fn bad_tickets_and_repositories_get_clear_errors_and_change_nothing() {
    let s = setup(Behaviour::Good).await;
    let wf = &s.registry.get(NAME).unwrap().workflow;
    let run = |input: Value, t: &'static str| async move {
        wf.invoke(JsonInput::Update(input), RunConfig::thread(t))
            .await
            .unwrap()
    };
    // A ticket file that is not JSON.
    std::fs::write(s.fx.tickets.join("TASK-103.json"), "{ not json").unwrap();
    let out = run(s.input("TASK-103"), "bad-json").await;
    assert_eq!(out.state["status"], "failed");
    assert!(out.state["error"]
        .as_str()
        .unwrap()
        .contains("not a ticket in JSON"));
    // A folder that is not a git repository.
    let mut input = s.input(BUG_TICKET);
    input["repo"] = json!(s.fx.tickets.display().to_string());
    let out = run(input, "not-git").await;
    assert!(out.state["error"]
        .as_str()
        .unwrap()
        .contains("is not a git repository"));
    // A dirty working tree.
    let readme = s.fx.repo.join("README.md");
    let before = std::fs::read_to_string(&readme).unwrap();
    std::fs::write(&readme, "edited\n").unwrap();
    let out = run(s.input(BUG_TICKET), "dirty").await;
    assert!(
        out.state["error"]
            .as_str()
            .unwrap()
            .contains("uncommitted changes (README.md)"),
        "{:#}",
        out.state
    );
    std::fs::write(&readme, before).unwrap();
    assert_eq!(s.model.calls(), 0, "no model call for bad input");
    assert_eq!(s.branches(), ["main"]);
}

#[tokio::test]
async fn a_branch_holding_other_commits_is_not_overwritten() {
    let s = setup(Behaviour::Good).await;
    let out = s.start("t-conflict", BUG_TICKET).await;
    assert_eq!(out.status, "interrupted");
    // Someone made the branch by hand in the meantime.
    let repo = git2::Repository::open(&s.fx.repo).unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    let name = ferrograph_ticket_pr::repo::branch_name(
        BUG_TICKET,
        "Overdue list fails with NullPointerException for tasks without a due date",
    );
    let sig = git2::Signature::now("someone", "s@x").unwrap();
    let tree = head.tree().unwrap();
    let other = repo
        .commit(None, &sig, &sig, "my own work", &tree, &[&head])
        .unwrap();
    repo.branch(&name, &repo.find_commit(other).unwrap(), false)
        .unwrap();
    let out = s.answer("t-conflict", json!("approve")).await;
    assert_eq!(out.state["status"], "failed");
    let err = out.state["error"].as_str().unwrap();
    assert!(err.contains("already exists with other commits"), "{err}");
    let tip = repo.revparse_single(&name).unwrap().id();
    assert_eq!(tip, other, "the branch was left as it was");
    assert!(
        ferrograph_ticket_pr::prs::PrStore::new(s.data.join(NAME).join("prs"))
            .list()
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn an_approved_branch_is_pushed_to_a_configured_bare_remote() {
    let s = setup(Behaviour::Good).await;
    let bare_dir = s.data.join("remote.git");
    git2::Repository::init_bare(&bare_dir).unwrap();
    let mut input = s.input(BUG_TICKET);
    input["remote"] = json!(bare_dir.display().to_string());
    let wf = &s.registry.get(NAME).unwrap().workflow;
    let out = wf
        .invoke(JsonInput::Update(input), RunConfig::thread("t-push"))
        .await
        .unwrap();
    assert_eq!(out.status, "interrupted");
    let out = s.answer("t-push", json!("approve")).await;
    assert_eq!(out.state["status"], "pr opened", "{:#}", out.state);
    let branch = out.state["branch"].as_str().unwrap();
    let bare = git2::Repository::open_bare(&bare_dir).unwrap();
    let pushed = bare
        .find_reference(&format!("refs/heads/{branch}"))
        .unwrap()
        .target()
        .unwrap();
    let commits = out.state["commits"].as_array().unwrap();
    assert_eq!(
        pushed.to_string(),
        commits.last().unwrap().as_str().unwrap()
    );
    assert_eq!(
        out.state["pr"]["pushed_to"],
        json!(bare_dir.display().to_string())
    );
}
