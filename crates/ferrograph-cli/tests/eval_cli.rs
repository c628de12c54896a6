//! `ferrograph eval triage --smoke` in a real process: the three smoke cases of
//! tests/eval/triage-cases.toml are downloaded from PyPI and crates.io (cached under the
//! git-ignored `.cache/`), triaged on the real SmolLM2, and every measure is computed and
//! written (results, table, plots). Values are the full evaluation's business, not this
//! test's: it checks that they exist and are in range.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn repo_root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `ferrograph eval WHAT --smoke --quiet` from the repository root with its own data
/// folder; returns the temporary folder (the report is `report/` in it) and the output.
fn smoke_eval(what: &str) -> (tempfile::TempDir, String) {
    let root = repo_root();
    let out = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_ferrograph"))
        .current_dir(&root)
        .env_remove("FERROGRAPH_CONFIG")
        .env("FERROGRAPH_DATA_DIR", out.path().join("data"))
        .args(["eval", what, "--smoke", "--quiet", "--out"])
        .arg(out.path().join("report"))
        .output()
        .unwrap();
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{log}");
    (out, log)
}

#[test]
fn the_smoke_evaluation_computes_every_measure() {
    let root = repo_root();
    let (out, log) = smoke_eval("triage");
    let report = out.path().join("report");
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(report.join("results.json")).unwrap())
            .unwrap();
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "{log}");
    for r in results {
        assert!(r["seconds"].as_f64().unwrap() > 0.0);
        assert!(r["text"]["fields"].as_array().unwrap().len() >= 6, "{r}");
        assert!(r["ranked"].as_array().unwrap().len() <= 10);
        assert!(r.get("lexical_rank").is_some() && r.get("vector_rank").is_some());
    }
    let s = &doc["summaries"][0];
    for k in [
        "hit1",
        "hit5",
        "lexical_hit1",
        "lexical_hit5",
        "vector_hit1",
        "vector_hit5",
        "degenerate_rate",
        "fallback_rate",
        "retry_rate",
        "schema_valid_rate",
    ] {
        let v = s[k].as_f64().unwrap_or(-1.0);
        assert!((0.0..=1.0).contains(&v), "{k} = {}", s[k]);
    }
    assert!(s["invented_names"].as_u64().is_some());
    assert!(s["mean_seconds"].as_f64().unwrap() > 0.0);
    let table = std::fs::read_to_string(report.join("summary.md")).unwrap();
    assert!(table.contains("| hit@1 |") && table.contains("strsim-41"));
    for plot in [
        "hit_at_1.svg",
        "hit_at_5.svg",
        "text_quality.svg",
        "invented_names.svg",
        "latency.svg",
    ] {
        let svg = std::fs::read_to_string(report.join(plot)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("<rect"), "{plot}");
    }
    // A case file with a hostile path is refused with a clear error.
    let bad = out.path().join("bad.toml");
    let cases = std::fs::read_to_string(root.join("tests/eval/triage-cases.toml")).unwrap();
    std::fs::write(
        &bad,
        cases.replacen("fixed_files = [\"", "fixed_files = [\"../", 1),
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_ferrograph"))
        .current_dir(&root)
        .args(["eval", "triage", "--quiet", "--cases"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a relative path inside the package"));
}

/// `ferrograph eval tutor --smoke`: three crates' READMEs downloaded from crates.io as one
/// subject, "What is NAME?" and a two-question quiz per crate on the real SmolLM2. What the
/// tutor's checks guarantee is asserted (every answer usable, every right answer of a quiz
/// in that crate's README, grading that agrees with the letter); what depends on the model is
/// the full evaluation's business, and is only required to be computed.
#[test]
fn the_tutor_smoke_evaluation_judges_answers_and_quizzes_on_real_readmes() {
    let (out, log) = smoke_eval("tutor");
    let report = out.path().join("report");
    let results: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(report.join("results.json")).unwrap())
            .unwrap();
    assert_eq!(results.len(), 3, "{log}");
    let mut quizzes = 0;
    for r in &results {
        assert_eq!(r["usable"], true, "{r}");
        assert_eq!(
            r["first_hit"], true,
            "the crate's README is found first: {r}"
        );
        assert!(r["on_topic"].is_boolean() && r["answer_s"].as_f64().unwrap() > 0.0);
        let answer = r["answer"].as_str().unwrap();
        assert!(
            !answer.contains("http") && !answer.contains("<img"),
            "{answer}"
        );
        let n = r["quiz_questions"].as_u64().unwrap();
        if n == 2 {
            quizzes += 1;
            assert_eq!(r["quiz_grounded"], 2, "right answers in the README: {r}");
            assert_eq!(r["quiz_grading_agrees"], true, "{r}");
            assert_eq!(r["quiz_well_formed"], true, "{r}");
        } else {
            // A quiz that cannot be written says why.
            assert!(
                r["quiz_error"]
                    .as_str()
                    .unwrap()
                    .contains("could write only"),
                "{r}"
            );
        }
    }
    assert!(quizzes >= 2, "{log}");
    let table = std::fs::read_to_string(report.join("summary.md")).unwrap();
    assert!(
        table.contains("| search: the crate's README is the first hit | 3/3"),
        "{table}"
    );
}
