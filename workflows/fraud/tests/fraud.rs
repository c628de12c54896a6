//! The fraud workflow end to end: deterministic mode, the LLM fallback, tool time-outs, the
//! step limit, the whole-run limit and resume, every safety rule broken on purpose by a
//! scripted planner, and a run on the real SmolLM2.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use async_trait::async_trait;
use ferrograph::prelude::*;
use ferrograph::runtime::{JsonInput, Workflow};
use ferrograph_chat::testing::ScriptedModel;
use ferrograph_fraud as fraud;
use ferrograph_fraud::dataset::Dataset;
use ferrograph_fraud::store::FraudStore;
use ferrograph_fraud::{
    self, standard_tools, FeatureFlags, FraudSettings, FraudWorkflow, ToolFactory,
};
use ferrograph_llm::{ChatModel, GenerateOptions, LlmError};
use ferrograph_tools::{Tool, ToolContext, ToolError, ToolRegistry};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// One generated dataset for the whole test binary (the data cache is per folder).
fn data_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        Dataset::load_or_generate(d.path(), fraud::dataset::DEFAULT_SEED).unwrap();
        d
    })
    .path()
}

fn case(planted: &str) -> String {
    let ds = Dataset::load(data_dir()).unwrap();
    ds.cases
        .iter()
        .find(|c| c.planted == planted)
        .unwrap()
        .transaction_id
        .clone()
}

fn settings(store: &Path, llm: Option<Arc<dyn ChatModel>>) -> FraudSettings {
    FraudSettings {
        data_dir: data_dir().to_path_buf(),
        store_dir: store.to_path_buf(),
        max_steps: 20,
        max_runtime: Duration::from_secs(120),
        tool_timeout: Duration::from_secs(30),
        planner_timeout: Duration::from_secs(60),
        llm_options: GenerateOptions::greedy().max_tokens(64),
        flags: FeatureFlags {
            planner_llm_enabled: llm.is_some(),
            reasoning_llm_enabled: llm.is_some(),
            ..FeatureFlags::default()
        },
        llm,
    }
}

async fn workflow(settings: FraudSettings, tools: Option<ToolFactory>) -> FraudWorkflow {
    let rt = Runtime::new().await.unwrap();
    let tools = tools.unwrap_or_else(|| standard_tools(&settings));
    FraudWorkflow::load(&rt, Arc::new(MemorySaver::new()), settings, tools)
        .await
        .map_err(|e| e.to_string())
        .unwrap()
}

/// The shared scripted model answering from a queue (`Err` strings as backend errors).
fn scripted(answers: Vec<Result<&str, &str>>) -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::queue(
        "scripted",
        answers
            .into_iter()
            .map(|a| {
                a.map(str::to_string)
                    .map_err(|e| LlmError::Backend(e.into()))
            })
            .collect(),
    ))
}

fn choice(tool: &str) -> Result<&'static str, &'static str> {
    let s = format!(r#"{{"tool": "{tool}", "reason": "scripted", "confidence": 0.9}}"#);
    Ok(Box::leak(s.into_boxed_str()))
}

async fn run(wf: &FraudWorkflow, tx: &str, thread: &str) -> ferrograph::runtime::JsonOutcome {
    wf.invoke(
        JsonInput::Update(json!({ "transaction_id": tx })),
        RunConfig::thread(thread),
    )
    .await
    .unwrap()
}

fn steps(out: &Value) -> Vec<String> {
    serde_json::from_value(out["completed_steps"].clone()).unwrap()
}

const ALL: [&str; 6] = [
    "context_tool",
    "pattern_tool",
    "similarity_tool",
    "reasoning_tool",
    "recommendation_tool",
    "rule_draft_tool",
];

#[tokio::test]
async fn deterministic_investigation_finds_planted_fraud_and_clears_legitimate() {
    let store = tempfile::tempdir().unwrap();
    let wf = workflow(settings(store.path(), None), None).await;
    let fraud_tx = case("card_testing");
    let out = run(&wf, &fraud_tx, "det-fraud").await;
    assert_eq!(out.status, "done");
    let s = &out.state;
    assert_eq!(s["status"], "COMPLETED");
    assert_eq!(steps(s), ALL);
    assert_eq!(s["planner_decisions"].as_array().unwrap().len(), 7);
    assert!(s["planner_decisions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["used_fallback"] == true));
    assert!(
        ["HIGH", "CRITICAL"].contains(&s["severity"].as_str().unwrap()),
        "card testing should be severe: {}",
        s["severity"]
    );
    let rules: Vec<String> = s["pattern_results"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rule"].as_str().unwrap().to_string())
        .collect();
    assert!(
        rules.contains(&"card_testing_probes".to_string()),
        "{rules:?}"
    );
    assert_eq!(s["similarity_results"]["search"], "hnsw");
    assert!(s["rule_draft"]["backtest"]["evaluated"].as_u64().unwrap() > 10_000);
    assert!(s["completed_at"].as_str().unwrap().ends_with('Z'));
    assert!(s["started_at"].as_str().unwrap().ends_with('Z'));

    let legit = run(&wf, &case("legitimate"), "det-legit").await;
    assert!(
        ["LOW", "MEDIUM"].contains(&legit.state["severity"].as_str().unwrap()),
        "a legitimate trip should not be severe: {}",
        legit.state
    );
    assert!(
        legit.state["confidence_score"].as_f64().unwrap() < s["confidence_score"].as_f64().unwrap()
    );

    // The audit trail and the stored investigation.
    let st = FraudStore::open(store.path()).unwrap();
    let audit = st.audit(Some("det-fraud")).unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].event, "investigation_completed");
    assert_eq!(audit[0].steps, ALL);
    let full = st.investigation("det-fraud").unwrap().unwrap();
    assert_eq!(full["tool_log"].as_array().unwrap().len(), 6);
    assert!(!full["recommendations"]["recommendations"]
        .as_array()
        .unwrap()
        .is_empty());
    let rendered = fraud::metrics::render();
    assert!(rendered.contains("ops_agent_investigation_completed_total{status=\"COMPLETED\""));
    assert!(rendered.contains(
        "ops_agent_planner_decisions_total{selected_tool=\"context_tool\",used_fallback=\"true\"}"
    ));
}

/// The similarity tool's HNSW answers agree with an exact scan on every planted case (a
/// narrow beam once stopped inside a large cluster of unrelated points and handed back
/// neighbours with similarity 0.54 where the exact scan had 0.9996).
#[test]
fn hnsw_neighbours_match_the_exact_scan_on_every_case() {
    let data = fraud::data::FraudData::open(data_dir()).unwrap();
    for c in &data.dataset.cases {
        let i = data.dataset.position(&c.transaction_id).unwrap();
        let ts = data.dataset.transactions[i].ts_ms;
        let v = data.features[i].vector();
        let approx = data.similar(&v, 10, ts, false).unwrap();
        let exact = data.similar(&v, 10, ts, true).unwrap();
        assert_eq!(approx.len(), exact.len(), "{}", c.planted);
        let kth = exact.last().unwrap().similarity;
        let found = approx.iter().filter(|n| n.similarity >= kth - 1e-5).count();
        let gap = exact[0].similarity - approx[0].similarity;
        assert!(
            found >= 6 && gap < 0.01,
            "{} ({}): {found}/10 of the exact neighbours; best {} vs {}",
            c.planted,
            c.transaction_id,
            approx[0].similarity,
            exact[0].similarity
        );
    }
}

#[tokio::test]
async fn every_planted_pattern_is_rated_above_every_legitimate_case() {
    let store = tempfile::tempdir().unwrap();
    let wf = workflow(settings(store.path(), None), None).await;
    let ds = Dataset::load(data_dir()).unwrap();
    let mut fraud_min = f64::MAX;
    let mut legit_max = f64::MIN;
    for (i, c) in ds.cases.iter().enumerate() {
        let out = run(&wf, &c.transaction_id, &format!("all-{i}")).await;
        let conf = out.state["confidence_score"].as_f64().unwrap();
        if c.planted == "legitimate" {
            legit_max = legit_max.max(conf);
        } else {
            fraud_min = fraud_min.min(conf);
        }
    }
    assert!(
        fraud_min > legit_max,
        "fraud cases must score above legitimate ones: min fraud {fraud_min}, max legit {legit_max}"
    );
}

#[tokio::test]
async fn llm_failure_and_invalid_answers_fall_back_to_the_sequence() {
    let store = tempfile::tempdir().unwrap();
    // The model is asked only where the rules leave a choice: after the context (pattern or
    // similarity first) and after the recommendations (rule draft or COMPLETE).
    let model = scripted(vec![Err("connection refused"), Ok("this is not json")]);
    let mut s = settings(store.path(), Some(model.clone()));
    s.flags.reasoning_llm_enabled = false;
    let wf = workflow(s, None).await;
    let out = run(&wf, &case("account_takeover"), "llm-fail").await;
    assert_eq!(out.state["status"], "COMPLETED");
    assert_eq!(steps(&out.state), ALL);
    let d = out.state["planner_decisions"].as_array().unwrap();
    let forced: Vec<bool> = d.iter().map(|x| x["forced"] == true).collect();
    assert_eq!(forced, [true, false, true, true, true, false, true]);
    assert!(d[1]["used_fallback"].as_bool().unwrap());
    assert!(
        d[1]["rejected"]
            .as_str()
            .unwrap()
            .contains("planner LLM failed"),
        "{}",
        d[1]
    );
    assert!(
        d[5]["rejected"]
            .as_str()
            .unwrap()
            .contains("planner answer invalid"),
        "{}",
        d[5]
    );
    assert_eq!(model.calls(), 2);
}

#[tokio::test]
async fn the_model_chooses_only_among_the_steps_the_rules_allow() {
    let store = tempfile::tempdir().unwrap();
    let model = scripted(vec![choice("similarity_tool"), choice("COMPLETE")]);
    let mut s = settings(store.path(), Some(model.clone()));
    s.flags.reasoning_llm_enabled = false;
    let wf = workflow(s, None).await;
    let out = run(&wf, &case("velocity_burst"), "choices").await;
    let d = out.state["planner_decisions"].as_array().unwrap();
    // Both choices were legal and followed: similarity before pattern, and COMPLETE
    // instead of a rule draft.
    assert_eq!(d[1]["selected_tool"], "similarity_tool");
    assert_eq!(d[1]["used_fallback"], false);
    assert_eq!(d[2]["selected_tool"], "pattern_tool");
    assert_eq!(d.last().unwrap()["selected_tool"], "COMPLETE");
    assert_eq!(d.last().unwrap()["used_fallback"], false);
    assert!(d.iter().all(|x| x["used_fallback"] == false));
    assert!(!steps(&out.state).contains(&"rule_draft_tool".to_string()));
}

#[tokio::test]
async fn a_scripted_planner_breaking_a_safety_rule_is_overruled() {
    let store = tempfile::tempdir().unwrap();
    // A model that ignores its schema: each answer breaks a rule in the state it meets.
    let model = scripted(vec![choice("reasoning_tool"), choice("wire_money")]);
    let mut s = settings(store.path(), Some(model.clone()));
    s.flags.reasoning_llm_enabled = false;
    let wf = workflow(s, None).await;
    let out = run(&wf, &case("velocity_burst"), "rules").await;
    assert_eq!(
        steps(&out.state),
        ALL,
        "the fallback sequence still ran every tool once"
    );
    let d = out.state["planner_decisions"].as_array().unwrap();
    for (i, want) in [
        (
            1,
            "reasoning_tool needs pattern_tool and similarity_tool first",
        ),
        (5, "is not a registered tool"),
    ] {
        assert_eq!(d[i]["used_fallback"], true, "decision {i}: {}", d[i]);
        let why = d[i]["rejected"].as_str().unwrap();
        assert!(
            why.contains(want),
            "decision {i}: expected `{want}` in `{why}`"
        );
    }
    assert_eq!(model.calls(), 2);
}

/// A tool that sleeps, standing in for a hung dependency.
struct Slow {
    name: &'static str,
    sleep: Duration,
}

#[async_trait]
impl Tool for Slow {
    fn name(&self) -> &str {
        self.name
    }
    fn description(&self) -> &str {
        "slow"
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        tokio::time::sleep(self.sleep).await;
        Ok(json!({}))
    }
}

/// The standard tools with `name` replaced by a slow one.
fn with_slow(settings: &FraudSettings, name: &'static str, sleep: Duration) -> ToolFactory {
    let std_tools = standard_tools(settings);
    Arc::new(move |dir: &Path| {
        let full = std_tools(dir)?;
        let mut r = ToolRegistry::new();
        for n in full.names() {
            if n == name {
                r.register(Slow { name, sleep })
                    .map_err(|e| e.to_string())?;
            } else {
                r.register_arc(full.get(&n).unwrap())
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(r)
    })
}

#[tokio::test]
async fn a_tool_timeout_is_recorded_and_the_investigation_goes_on() {
    let store = tempfile::tempdir().unwrap();
    let mut s = settings(store.path(), None);
    s.tool_timeout = Duration::from_millis(200);
    let tools = with_slow(&s, "similarity_tool", Duration::from_secs(5));
    let wf = workflow(s, Some(tools)).await;
    let out = run(&wf, &case("impossible_travel"), "tool-timeout").await;
    assert_eq!(out.state["status"], "COMPLETED");
    let ex = out.state["tool_executions"].as_array().unwrap();
    let sim = ex
        .iter()
        .find(|e| e["tool_name"] == "similarity_tool")
        .unwrap();
    assert_eq!(sim["status"], "TIMED_OUT");
    assert!(sim["error_message"].as_str().unwrap().contains("timed out"));
    assert!(sim["execution_time_ms"].as_u64().unwrap() < 2_000);
    assert_eq!(steps(&out.state), ALL, "marked completed, not retried");
    let audit = FraudStore::open(store.path())
        .unwrap()
        .audit(Some("tool-timeout"))
        .unwrap();
    assert_eq!(
        audit[0].failed_tools,
        vec!["similarity_tool (TIMED_OUT)".to_string()]
    );
}

#[tokio::test]
async fn the_step_limit_ends_in_completion() {
    let store = tempfile::tempdir().unwrap();
    let mut s = settings(store.path(), None);
    s.max_steps = 3;
    let wf = workflow(s, None).await;
    let out = run(&wf, &case("cash_out"), "max-steps").await;
    assert_eq!(out.state["status"], "COMPLETED");
    assert_eq!(out.state["step_count"], 3);
    assert_eq!(out.state["planner_decisions"].as_array().unwrap().len(), 3);
    assert_eq!(steps(&out.state), ["context_tool", "pattern_tool"]);
    assert!(out.state["error"]
        .as_str()
        .unwrap()
        .contains("step limit of 3"));
}

#[tokio::test]
async fn the_whole_run_limit_saves_timed_out_and_resume_finishes_without_rerunning() {
    let store = tempfile::tempdir().unwrap();
    let mut s = settings(store.path(), None);
    s.max_runtime = Duration::from_millis(1500);
    s.tool_timeout = Duration::from_secs(30);
    let tools = with_slow(&s, "reasoning_tool", Duration::from_secs(3));
    let wf = workflow(s.clone(), Some(tools)).await;
    let out = run(&wf, &case("card_testing"), "run-timeout").await;
    assert_eq!(out.status, "timed_out");
    assert_eq!(out.state["status"], "TIMED_OUT");
    assert!(out.state["error"].as_str().unwrap().contains("time limit"));
    assert_eq!(
        steps(&out.state),
        ["context_tool", "pattern_tool", "similarity_tool"]
    );
    // Saved: the checkpoint holds it, and the audit trail says so.
    let snap = wf.get_state("run-timeout", None).await.unwrap();
    assert_eq!(snap.values["status"], "TIMED_OUT");
    assert_eq!(snap.next, vec!["planner".to_string()]);
    let audit = FraudStore::open(store.path())
        .unwrap()
        .audit(Some("run-timeout"))
        .unwrap();
    assert_eq!(audit[0].event, "investigation_timed_out");

    // Resume with a fast reasoning tool and more time: the finished tools do not run again.
    let wf2 = FraudWorkflow::load(
        &Runtime::new().await.unwrap(),
        wf.checkpointer().unwrap(),
        FraudSettings {
            max_runtime: Duration::from_secs(60),
            ..s.clone()
        },
        standard_tools(&s),
    )
    .await
    .map_err(|e| e.to_string())
    .unwrap();
    let done = wf2
        .invoke(JsonInput::Continue, RunConfig::thread("run-timeout"))
        .await
        .unwrap();
    assert_eq!(done.state["status"], "COMPLETED");
    assert_eq!(steps(&done.state), ALL);
    let ex = done.state["tool_executions"].as_array().unwrap();
    assert_eq!(ex.len(), 6, "each tool ran once: {ex:?}");
}

#[test]
fn the_prompt_guard_strips_injected_instructions() {
    let ds = Dataset::load(data_dir()).unwrap();
    let evil = ds
        .merchants
        .iter()
        .find(|m| m.name.contains("ignore previous"))
        .unwrap();
    let clean = fraud::tools::sanitize(&evil.name);
    assert!(!clean.to_lowercase().contains("ignore"), "{clean}");
    assert!(!clean.contains("COMPLETE"), "{clean}");
    assert!(clean.starts_with("GiftHub"), "{clean}");
}

fn model_path() -> Option<PathBuf> {
    match ferrograph_llm::manifest::ensure_model(ferrograph_llm::manifest::DEFAULT_CHAT_MODEL) {
        Ok(p) => Some(p),
        Err(e) => {
            if std::env::var_os("CI").is_some() {
                panic!("cannot fetch the chat model in CI: {e}");
            }
            eprintln!(
                "\n!!!!!! SKIPPING the SmolLM2 fraud test: {e}; run scripts/fetch-models.sh\n"
            );
            None
        }
    }
}

#[tokio::test]
async fn end_to_end_on_the_real_local_model() {
    let Some(path) = model_path() else { return };
    let store = tempfile::tempdir().unwrap();
    let llm: Arc<dyn ChatModel> = Arc::new(ferrograph_llm::LocalChatModel::new(path));
    let mut s = settings(store.path(), Some(llm));
    s.llm_options = GenerateOptions::greedy().max_tokens(80).max_context(1536);
    // Eight model calls on a debug build: the limits here are generous, the time-out paths
    // have their own tests.
    s.max_runtime = Duration::from_secs(1200);
    s.planner_timeout = Duration::from_secs(300);
    let wf = workflow(s, None).await;
    let out = run(&wf, &case("account_takeover"), "smollm2").await;
    let st = &out.state;
    assert_eq!(st["status"], "COMPLETED", "{st}");
    // Whatever the small model proposed, code kept the rules: every tool ran once, in an
    // order that satisfies them, and each decision says whether the fallback chose.
    let done = steps(st);
    let mut sorted = done.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), done.len(), "no repeats: {done:?}");
    assert_eq!(done[0], "context_tool");
    let pos = |t: &str| done.iter().position(|d| d == t);
    if let (Some(r), Some(p), Some(si)) = (
        pos("reasoning_tool"),
        pos("pattern_tool"),
        pos("similarity_tool"),
    ) {
        assert!(r > p && r > si);
    }
    if let (Some(rd), Some(rc)) = (pos("rule_draft_tool"), pos("recommendation_tool")) {
        assert!(rd > rc);
    }
    let decisions = st["planner_decisions"].as_array().unwrap();
    assert!(!decisions.is_empty());
    for d in decisions {
        assert!(d["used_fallback"].is_boolean());
        assert!(d["confidence"].as_f64().unwrap() >= 0.0);
    }
    // The reasoning tool answered through the model (schema-valid), or says why not.
    let method = st["reasoning"]["method"].as_str().unwrap_or("missing");
    assert!(["llm", "rules_fallback"].contains(&method), "{method}");
    if method == "llm" {
        assert!(["LIKELY_FRAUD", "SUSPICIOUS", "LIKELY_LEGITIMATE"]
            .contains(&st["reasoning"]["verdict"].as_str().unwrap()));
    }
}
