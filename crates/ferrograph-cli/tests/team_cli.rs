//! `ferrograph team` and `ferrograph run team` in real processes, without a model: the
//! fixture briefs, a vague brief that ends blocked (exit 3) with its blocker routed, the
//! run's records through `team show|audit|events`, and clear errors for a missing brief, an
//! unknown run and no model. The full flow on the real model is
//! `workflows/team/tests/smollm2.rs`.
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
fn fixture_vague_brief_records_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let fx = dir.path().join("teamwork");
    let out = run(&data, &["team", "fixture", &fx.display().to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("ferrograph run team --brief"));
    assert!(
        fx.join("wordstats/brief.md").is_file()
            && fx.join("wordstats/reference/wordstats.py").is_file()
    );

    // A vague brief is blocked before any model call: no model is needed to see it.
    let out = run(
        &data,
        &[
            "run",
            "team",
            "--brief",
            &fx.join("vague.md").display().to_string(),
        ],
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(3), "{t}");
    assert!(
        t.contains("the brief is too vague") && t.contains("status: blocked"),
        "{t}"
    );
    let thread = t
        .split_whitespace()
        .find(|w| w.starts_with("team-"))
        .unwrap()
        .trim_end_matches(')')
        .to_string();
    let show = text(&run(&data, &["team", "show", &thread]));
    assert!(
        show.contains("lifecycle: blocked") && show.contains("path: received → blocked"),
        "{show}"
    );
    assert!(show.contains("route: the stakeholder"), "{show}");
    let audit = text(&run(&data, &["team", "audit", &thread]));
    assert!(audit.contains("received → blocked"), "{audit}");
    let events = text(&run(&data, &["team", "events", &thread]));
    assert!(
        events.contains("RequirementBlocked") && events.contains("pm_agent"),
        "{events}"
    );

    // Errors.
    let out = run(&data, &["team", "show", "no-such-run"]);
    assert!(
        !out.status.success() && text(&out).contains("no team run `no-such-run`"),
        "{}",
        text(&out)
    );
    let out = run(
        &data,
        &[
            "run",
            "team",
            "--brief",
            &dir.path().join("missing.md").display().to_string(),
        ],
    );
    assert!(!out.status.success());
    assert!(text(&out).contains("no such file"), "{}", text(&out));
    let out = run(
        &data,
        &[
            "run",
            "team",
            "--brief",
            &fx.join("wordstats").display().to_string(),
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains("no model is configured for the team"),
        "{}",
        text(&out)
    );
    let out = run(&data, &["run", "team"]);
    assert!(!out.status.success());
}
