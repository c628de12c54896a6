//! `ferrograph tickets`, `ferrograph run ticket-to-pr` and `ferrograph prs` in real processes,
//! without a model: the fixture is a git repository the git CLI's library reads, bad input
//! ends with a clear error and a non-zero exit, and no model means a clear error before any
//! model call. The full flow on the real model is `workflows/ticket-pr/tests/smollm2.rs`.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn run(data: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrograph"))
        .env("FERROGRAPH_DATA_DIR", data)
        .env_remove("FERROGRAPH_CONFIG")
        .env("FERROGRAPH_MODEL", "none")
        .args(args)
        .output()
        .expect("run ferrograph")
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn fixture_tickets_bad_input_and_no_model() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let fx = dir.path().join("tm");
    let fx_s = fx.display().to_string();
    let out = run(&data, &["tickets", "fixture", &fx_s]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("ferrograph run ticket-to-pr --ticket TASK-101"));
    let repo = git2::Repository::open(fx.join("repo")).unwrap();
    assert_eq!(repo.head().unwrap().shorthand(), Some("main"));
    // Twice refuses to overwrite.
    let again = run(&data, &["tickets", "fixture", &fx_s]);
    assert!(!again.status.success());
    assert!(text(&again).contains("exists already"), "{}", text(&again));

    let tickets = fx.join("tickets").display().to_string();
    let repo_s = fx.join("repo").display().to_string();
    let out = run(&data, &["tickets", "list", "--tickets", &tickets]);
    let listed = text(&out);
    assert!(
        listed.contains("TASK-101\tBug") && listed.contains("TASK-102\tStory"),
        "{listed}"
    );
    let out = run(
        &data,
        &["tickets", "show", "TASK-102", "--tickets", &tickets],
    );
    assert!(text(&out).contains("- A task created without a priority gets MEDIUM"));

    let go = |key: &str, repo: &str| {
        run(
            &data,
            &[
                "run",
                "ticket-to-pr",
                "--quiet",
                "--ticket",
                key,
                "--tickets",
                &tickets,
                "--repo",
                repo,
            ],
        )
    };
    let out = go("TASK-999", &repo_s);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains("status: unknown ticket"),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains("unknown ticket TASK-999"),
        "{}",
        text(&out)
    );

    let out = go("TASK-101", &tickets);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out).contains("is not a git repository"),
        "{}",
        text(&out)
    );

    let out = go("TASK-101", &repo_s);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out).contains("no model is configured for ticket-to-pr"),
        "{}",
        text(&out)
    );

    let out = run(&data, &["run", "ticket-to-pr", "--ticket", "TASK-101"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("needs --tickets DIR"), "{}", text(&out));

    let out = run(&data, &["prs", "list"]);
    assert!(
        text(&out).contains("no pull requests yet"),
        "{}",
        text(&out)
    );
    let out = run(&data, &["prs", "show", "1"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("no pull request 1"), "{}", text(&out));
    assert_eq!(
        repo.branches(None).unwrap().count(),
        1,
        "nothing was applied"
    );
}
