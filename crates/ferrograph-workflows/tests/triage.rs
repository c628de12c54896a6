//! The triage workflow end to end: a scripted model that breaks on purpose (the fallback,
//! the error field, the critic's rejection and a second round), and a run on the real
//! SmolLM2 over the fixture repository with its planted bug.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use async_trait::async_trait;
use ferrograph::prelude::*;
use ferrograph::runtime::{JsonInput, JsonOutcome, Workflow};
use ferrograph_index::{Embedder, HashEmbedder};
use ferrograph_llm::{ChatModel, GenerateOptions, LlmError, TokenSink};
use ferrograph_workflows::triage::models::Gate;
use ferrograph_workflows::triage::state::agent;
use ferrograph_workflows::triage::{
    llm::AgentLlm, retrieval, TriageSettings, TriageState, TriageWorkflow,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/triage")
        .join(rel)
}

fn input(out: &Path) -> Value {
    let mut args: Vec<String> = vec![
        "--issue".into(),
        fixture("issue.md").display().to_string(),
        "--repo".into(),
        fixture("repo").display().to_string(),
        "--docs".into(),
        fixture("docs").display().to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    let v = ferrograph_workflows::triage::parse_args(&args).unwrap();
    args.truncate(2);
    assert!(
        ferrograph_workflows::triage::parse_args(&args)
            .unwrap_err()
            .contains("--repo"),
        "a missing repository is refused"
    );
    v
}

/// A model scripted per agent role: each role has a queue of answers (the last one repeats);
/// `None` in a queue is a garbled answer (not JSON).
struct Scripted {
    name: &'static str,
    answers: Mutex<HashMap<&'static str, Vec<Option<Message>>>>,
}

impl Scripted {
    fn new(name: &'static str, script: Vec<(&'static str, Vec<Option<Message>>)>) -> Self {
        Scripted {
            name,
            answers: Mutex::new(script.into_iter().collect()),
        }
    }
}

fn role_of(messages: &[Message], options: &GenerateOptions) -> &'static str {
    let last = &messages.last().unwrap().content;
    if !options.tools.is_empty() {
        "tool_request"
    } else if last.contains("Your role: investigator") {
        "investigator"
    } else if last.contains("Search results:") {
        "synthesis"
    } else if last.contains("Your role: code analyst") {
        "codebase"
    } else if last.contains("Your role: critic") {
        "critic"
    } else if last.contains("triage report") {
        "report"
    } else if last.contains("issue comment") {
        "comment"
    } else {
        "ticket"
    }
}

#[async_trait]
impl ChatModel for Scripted {
    fn model_name(&self) -> String {
        self.name.into()
    }
    async fn invoke(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
        _sink: Option<TokenSink>,
    ) -> Result<Message, LlmError> {
        let role = role_of(messages, options);
        let mut all = self.answers.lock().unwrap();
        let queue = all
            .get_mut(role)
            .unwrap_or_else(|| panic!("{}: no script for {role}", self.name));
        let next = if queue.len() > 1 {
            queue.remove(0)
        } else {
            queue[0].clone()
        };
        Ok(next.unwrap_or_else(|| Message::ai("I think the bug is somewhere")))
    }
}

fn ai(v: Value) -> Option<Message> {
    Some(Message::ai(v.to_string()))
}

fn hypothesis() -> Option<Message> {
    ai(json!({"summary": "stacked percentage discounts overshoot",
        "hypothesis": "apply_discounts sums the percentages of stacked codes",
        "affected_areas": ["discounts"], "keywords_for_search": ["apply_discounts", "percentage"],
        "error_messages": ["ValueError: invoice total cannot be negative: -12.50"],
        "confidence": 0.6, "reasoning": "the traceback passes through apply_discounts"}))
}

fn critique(verdict: &str, ready: bool) -> Option<Message> {
    ai(
        json!({"summary": "review", "verdict": verdict, "confidence_adjustment": 0.2,
        "gaps": ["no failing test"], "revised_hypothesis": null,
        "ready_for_report": ready, "confidence": 0.7}),
    )
}

fn script(name: &'static str, primary: bool) -> Scripted {
    let garbled = None;
    let codebase = ai(
        json!({"summary": "discount stacking", "relevant_paths": ["ledgerlite/discounts.py"],
        "root_cause_location": "nowhere.py:1-2", "explanation": "percentages are summed",
        "confidence": 0.7}),
    );
    Scripted::new(
        name,
        vec![
            // The primary garbles its first hypothesis; the fallback answers.
            (
                "investigator",
                if primary {
                    vec![garbled.clone(), hypothesis()]
                } else {
                    vec![hypothesis()]
                },
            ),
            (
                "tool_request",
                vec![Some(Message::ai_with_tools(
                    "",
                    vec![ToolCall::new(
                        "docs_search",
                        json!({"query": "stacking percentage discounts"}),
                    )],
                ))],
            ),
            (
                "synthesis",
                vec![ai(json!({"summary": "docs describe compounding",
                "external_root_cause": "percentages must compound, not add",
                "relevant_sources": ["stacking-discounts.md"], "confidence": 0.5, "reasoning": "r"}))],
            ),
            // Both models garble the first code analysis: the agent sets its error field.
            ("codebase", vec![garbled.clone(), codebase]),
            // Round 1 is challenged, round 2 confirmed.
            (
                "critic",
                vec![critique("CHALLENGED", false), critique("CONFIRMED", true)],
            ),
            (
                "report",
                vec![ai(
                    json!({"title": "Stacked discounts overshoot", "severity": "HIGH",
                "root_cause": "percentages are summed", "affected_files": ["ledgerlite/discounts.py"],
                "reproduction_steps": ["apply SPRING60 and LOYAL50"], "suggested_fix": "compound them",
                "confidence": 0.8}),
                )],
            ),
            (
                "comment",
                vec![Some(Message::ai("## Root cause\nPercentages are summed."))],
            ),
            (
                "ticket",
                vec![ai(
                    json!({"title": "Fix discount stacking", "labels": ["bug"],
                "assignee": null, "effort": "S"}),
                )],
            ),
        ],
    )
}

fn settings(data: &Path, llm: AgentLlm, embedder: retrieval::EmbedderFactory) -> TriageSettings {
    TriageSettings {
        data_dir: data.to_path_buf(),
        llm: Some(llm),
        max_iterations: 12,
        max_rounds: 2,
        tool_timeout: Duration::from_secs(30),
        embedder,
    }
}

fn hash_embedder() -> retrieval::EmbedderFactory {
    Arc::new(|| Ok(Arc::new(HashEmbedder::new(64)) as Arc<dyn Embedder>))
}

async fn run(wf: &TriageWorkflow, input: Value, thread: &str) -> (JsonOutcome, TriageState) {
    let out = wf
        .invoke(JsonInput::Update(input), RunConfig::thread(thread))
        .await
        .unwrap();
    assert_eq!(out.status, "done");
    let state: TriageState = serde_json::from_value(out.state.clone()).unwrap();
    (out, state)
}

fn trace(state: &TriageState) -> Vec<(String, u32)> {
    state
        .routing
        .iter()
        .map(|r| (r.next.clone(), r.round))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_triage_follows_the_critic_and_handles_agent_errors() {
    let data = tempfile::tempdir().unwrap();
    let out_dir = data.path().join("out");
    let mut llm = AgentLlm::new(
        Arc::new(script("primary", true)),
        Some(Arc::new(script("fallback", false))),
    );
    llm.retry = ferrograph_llm::RetryPolicy::attempts(3).backoff(Duration::ZERO, Duration::ZERO);
    let rt = Runtime::new().await.unwrap();
    let wf = TriageWorkflow::load(
        &rt,
        Arc::new(MemorySaver::new()),
        &settings(data.path(), llm, hash_embedder()),
    )
    .await
    .unwrap();
    let (_, s) = run(&wf, input(&out_dir), "scripted").await;

    let r = |a: &str, round| (a.to_string(), round);
    assert_eq!(
        trace(&s),
        vec![
            r(agent::INVESTIGATOR, 1),
            r(agent::WEB_SEARCH, 1),
            r(agent::CODEBASE_SEARCH, 1),
            r(agent::CODEBASE_SEARCH, 1), // its error field was set: re-routed
            r(agent::CRITIC, 1),
            r(agent::INVESTIGATOR, 2), // CHALLENGED → REJECTED → a second round
            r(agent::CODEBASE_SEARCH, 2),
            r(agent::CRITIC, 2),
            r(agent::WRITER, 2), // CONFIRMED and ready → APPROVED
            r(agent::PUBLISH, 2),
        ]
    );
    // The garbled hypothesis is a schema error: not retried, the fallback answered once.
    let first = &s.agent_runs[0];
    assert!(first.ok);
    assert_eq!(
        (first.calls[0].attempts, first.calls[0].used_fallback),
        (1, true)
    );
    assert_eq!(first.calls[0].model, "fallback");
    // The failed code analysis appended no finding.
    let failed = &s.agent_runs[2];
    assert!(!failed.ok && failed.error.is_some());
    let code_findings: Vec<_> = s
        .findings
        .iter()
        .filter(|f| f.agent_name == agent::CODEBASE_SEARCH)
        .collect();
    assert_eq!(
        code_findings.len(),
        2,
        "one per round, none for the failed run"
    );
    // The scripted location was not retrieved, so it is dropped; the path was kept.
    let cb = s.codebase.as_ref().unwrap();
    assert_eq!(cb.root_cause_location, None);
    assert!(cb.relevant_files.iter().all(|f| !f.path.is_empty()));
    assert_eq!(
        s.critic_history
            .iter()
            .map(|v| (v.verdict, v.round))
            .collect::<Vec<_>>(),
        vec![(Gate::Rejected, 1), (Gate::Approved, 2)]
    );
    assert_eq!(
        s.critic_history[0].required_evidence,
        vec!["no failing test"]
    );
    // The docs search ran as a tool call and its result was kept.
    let web = s.web_search.as_ref().unwrap();
    assert_eq!(web.queries, vec!["stacking percentage discounts"]);
    assert_eq!(s.agent_runs[1].tool_calls, 1);
    // The writer's three sub-calls were merged.
    let w = s.writer.as_ref().unwrap();
    assert_eq!(w.ticket_title, "Fix discount stacking");
    assert_eq!(w.ticket_assignee_suggestion, "");
    assert_eq!(s.agent_runs.last().unwrap().calls.len(), 3);
    assert_eq!(s.status, "COMPLETED");
    // Report files and the trace.
    let files = s.report_files.as_ref().unwrap();
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&files.json).unwrap()).unwrap();
    assert_eq!(report["writer"]["report"]["severity"], "HIGH");
    let md = std::fs::read_to_string(&files.markdown).unwrap();
    assert!(md.contains("Stacked discounts overshoot") && md.contains("## Routing"));
    let events = std::fs::read_to_string(out_dir.join("events.jsonl")).unwrap();
    assert!(events.contains("tool_start") && events.contains("docs_search"));
    assert!(events.contains("\"routing\"") && events.contains("report_written"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_model_every_agent_reports_it_and_no_report_is_claimed() {
    let data = tempfile::tempdir().unwrap();
    let mut st = settings(
        data.path(),
        AgentLlm::new(Arc::new(script("p", false)), None),
        hash_embedder(),
    );
    st.llm = None;
    let rt = Runtime::new().await.unwrap();
    let wf = TriageWorkflow::load(&rt, Arc::new(MemorySaver::new()), &st)
        .await
        .unwrap();
    let (_, s) = run(&wf, input(&data.path().join("out")), "nomodel").await;
    assert_eq!(s.status, "FAILED");
    assert!(s.writer.is_none() && s.findings.is_empty());
    assert!(s.error.as_deref().unwrap().contains("no chat model"));
    assert!(Path::new(&s.report_files.unwrap().markdown).exists());
}

/// The real SmolLM2-135M with MiniLM retrieval on the fixture: structure, not prose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_triages_the_fixture_and_finds_the_planted_file() {
    let path = ferrograph_llm::manifest::ensure_model(ferrograph_llm::manifest::DEFAULT_CHAT_MODEL)
        .expect("the chat model (scripts/fetch-models.sh)");
    let model: Arc<dyn ChatModel> = Arc::new(ferrograph_llm::LocalChatModel::new(path));
    let data = tempfile::tempdir().unwrap();
    let out_dir = data.path().join("out");
    let rt = Runtime::new().await.unwrap();
    let wf = TriageWorkflow::load(
        &rt,
        Arc::new(MemorySaver::new()),
        &settings(data.path(), AgentLlm::new(model, None), retrieval::minilm()),
    )
    .await
    .unwrap();
    let (_, s) = run(&wf, input(&out_dir), "smollm2").await;
    eprintln!(
        "{}",
        std::fs::read_to_string(out_dir.join("triage-report.md")).unwrap()
    );

    // Every agent ran and produced its finding.
    for a in agent::ALL {
        assert!(
            s.agent_runs.iter().any(|r| r.agent == a && r.ok),
            "{a} produced no finding: {:?}",
            s.agent_runs
                .iter()
                .filter(|r| r.agent == a)
                .collect::<Vec<_>>()
        );
    }
    // Every output parsed into its type and stays inside the schema's bounds.
    let inv = s.investigator.as_ref().unwrap();
    assert!((0.0..=1.0).contains(&inv.base.confidence));
    assert!(!inv.keywords_for_search.is_empty() && inv.keywords_for_search.len() <= 6);
    let errors = ferrograph_workflows::triage::agents::error_lines(&s.issue_body);
    assert!(
        inv.error_messages.iter().all(|e| errors.contains(e)),
        "verbatim"
    );
    let cb = s.codebase.as_ref().unwrap();
    assert!(cb.relevant_files.iter().any(|f| f.source == "model"));
    let w = s.writer.as_ref().unwrap();
    assert!((0.0..=1.0).contains(&w.report.confidence));
    assert!(w.report.affected_files.len() <= 4 && !w.ticket_labels.is_empty());
    // The critic's routing was followed.
    for v in &s.critic_history {
        let after_critic = s
            .routing
            .iter()
            .skip_while(|r| !(r.next == agent::CRITIC && r.round == v.round))
            .nth(1)
            .unwrap();
        match v.verdict {
            Gate::Approved => assert_eq!(after_critic.next, agent::WRITER),
            Gate::Rejected if v.round < s.max_rounds => {
                assert_eq!(
                    (after_critic.next.as_str(), after_critic.round),
                    (agent::INVESTIGATOR, v.round + 1)
                )
            }
            Gate::Rejected => assert_eq!(after_critic.next, agent::WRITER),
        }
    }
    // The report was written.
    assert_eq!(s.status, "COMPLETED");
    let files = s.report_files.as_ref().unwrap();
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&files.json).unwrap()).unwrap();
    assert_eq!(report["status"], "COMPLETED");
    assert!(
        std::fs::read_to_string(&files.events)
            .unwrap()
            .lines()
            .count()
            > 10
    );
    // Retrieval found the file with the planted bug.
    assert!(
        cb.relevant_files
            .iter()
            .any(|f| f.path == "ledgerlite/discounts.py"),
        "{:?}",
        cb.relevant_files
    );
    // The shared system prompt was served from the prefix cache.
    let cached: u32 = s
        .agent_runs
        .iter()
        .flat_map(|r| &r.calls)
        .map(|c| c.cached_prompt_tokens)
        .sum();
    assert!(cached > 0);
}
