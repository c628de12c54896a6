//! The team on the real local model (SmolLM2-135M-Instruct), end to end on the fixture
//! brief: to the stories gate, approve, to the deployment gate, approve, deployed.
//!
//! A 135M model does not write a working Python module, and this test does not pretend it
//! does: what must hold whatever the model writes is checked. The stories are about the brief
//! and do not loop; the model's code and tests ran for real in the sandbox (their output is
//! in the audit trail) before any fallback; every fallback is recorded; the release is a
//! working program (run here on a sample text).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ferrograph::chat::ChatModel;
use ferrograph::prelude::*;
use ferrograph::runtime::JsonInput;
use ferrograph::Registry;
use ferrograph_team::{fixture, register_with, sandbox, team_llm, TeamSettings, NAME};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;

fn model() -> Option<Arc<dyn ChatModel>> {
    match ferrograph_llm::manifest::ensure_model(ferrograph_llm::manifest::DEFAULT_CHAT_MODEL) {
        Ok(p) => Some(Arc::new(ferrograph_llm::LocalChatModel::new(p))),
        Err(e) => {
            if std::env::var_os("CI").is_some() {
                panic!("cannot fetch the chat model in CI: {e}");
            }
            eprintln!(
                "\n!!!!!! SKIPPING the SmolLM2 team test: {e}; run scripts/fetch-models.sh\n"
            );
            None
        }
    }
}

fn words(t: &str) -> std::collections::BTreeSet<String> {
    t.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() >= 4)
        .map(str::to_lowercase)
        .collect()
}

#[tokio::test]
async fn the_fixture_brief_is_deployed_on_the_real_model() {
    let Some(llm) = model() else { return };
    let dir = tempfile::tempdir().unwrap();
    let fx = fixture::create(&dir.path().join("fx")).unwrap();
    let rt = Runtime::new().await.unwrap();
    let mut registry = Registry::new();
    let settings = TeamSettings {
        data_dir: dir.path().join("data").join(NAME),
        llm: Some(team_llm(llm, None)),
        crash_at: None,
        limits: sandbox::Limits::default(),
    };
    register_with(&mut registry, &rt, Arc::new(MemorySaver::new()), settings)
        .await
        .unwrap();
    let wf = &registry.get(NAME).unwrap().workflow;
    let run = |input: JsonInput| wf.invoke(input, RunConfig::thread("real"));

    let o = run(JsonInput::Update(
        json!({"brief": fx.brief.display().to_string()}),
    ))
    .await
    .unwrap();
    assert_eq!(o.status, "interrupted", "{}", o.state["messages"]);
    let brief = std::fs::read_to_string(fx.brief.join("brief.md")).unwrap();
    let brief_words = words(&brief);
    let stories = o.state["requirement"]["stories"].as_array().unwrap();
    assert!(!stories.is_empty());
    for st in stories {
        let text = format!(
            "{} {}",
            st["title"].as_str().unwrap(),
            st["i_want"].as_str().unwrap()
        );
        assert!(!text.trim().is_empty());
        assert!(
            !ferrograph::chat::agent::degenerate(&text),
            "a looping story: {text}"
        );
        assert!(
            !words(&text).is_disjoint(&brief_words),
            "a story not about the brief: {text}"
        );
        for c in st["acceptance_criteria"].as_array().unwrap() {
            assert!(!words(c.as_str().unwrap()).is_disjoint(&brief_words), "{c}");
        }
    }

    let o = run(JsonInput::Resume(Resume::value(json!("approve"))))
        .await
        .unwrap();
    assert_eq!(
        o.interrupts
            .first()
            .map(|i| i.value.0["checkpoint_type"].clone()),
        Some(json!("deployment_approval")),
        "{}",
        o.state["messages"]
    );
    let audit = o.state["audit"].as_array().unwrap();
    let test_runs: Vec<&Value> = audit.iter().filter(|a| a["kind"] == "tests").collect();
    assert!(
        test_runs
            .iter()
            .any(|a| a["detail"].as_str().unwrap().contains("the model's code")),
        "the model's code was tried first"
    );
    for a in &test_runs {
        let data: Value = serde_json::from_str(a["data"].as_str().unwrap()).unwrap();
        let out = data["output"].as_str().unwrap();
        assert!(!out.trim().is_empty(), "a test run without output: {a}");
    }
    let fallbacks: Vec<&str> = audit
        .iter()
        .filter(|a| a["kind"] == "fallback")
        .map(|a| a["detail"].as_str().unwrap())
        .collect();
    eprintln!("fallbacks on SmolLM2: {fallbacks:#?}");
    eprintln!("progress: {:#}", o.state["messages"]);

    let o = run(JsonInput::Resume(Resume::value(json!("approve"))))
        .await
        .unwrap();
    assert_eq!(o.state["status"], "deployed", "{}", o.state["messages"]);
    let release = PathBuf::from(
        o.state["deployment"]["status"]["deployment_path"]
            .as_str()
            .unwrap(),
    );
    // The released program works on a text we did not put in its tests.
    let sample = dir.path().join("day.txt");
    std::fs::write(
        &sample,
        "Refund? The refund did not arrive. Login fails; login again, refund!",
    )
    .unwrap();
    let out = std::process::Command::new("python3")
        .current_dir(&release)
        .args(["wordstats.py", sample.to_str().unwrap(), "--top", "2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .collect::<Vec<_>>(),
        ["refund 3", "login 2"]
    );
}
