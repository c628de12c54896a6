//! The triage workflow end to end: a scripted model that breaks on purpose (the fallback,
//! the error field, the critic's rejection and a second round), and a run on the real
//! SmolLM2 over the fixture repository with its planted bug.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use ferrograph::prelude::*;
use ferrograph::runtime::{JsonInput, JsonOutcome, Workflow};
use ferrograph_chat::testing::ScriptedModel;
use ferrograph_index::{Embedder, HashEmbedder};
use ferrograph_llm::{ChatModel, GenerateOptions};
use ferrograph_triage::check::{self, CheckContext, Problem};
use ferrograph_triage::models::Gate;
use ferrograph_triage::state::agent;
use ferrograph_triage::{llm::AgentLlm, retrieval, TriageSettings, TriageState, TriageWorkflow};
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

/// Every file under `root`, relative, with `/` separators.
fn walk(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap();
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out
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
    let v = ferrograph_triage::parse_args(&args).unwrap();
    args.truncate(2);
    assert!(
        ferrograph_triage::parse_args(&args)
            .unwrap_err()
            .contains("--repo"),
        "a missing repository is refused"
    );
    v
}

/// The shared scripted model, answering per agent role: each role has a queue of answers
/// (the last one repeats); `None` in a queue is a garbled answer (not JSON).
fn scripted_roles(
    name: &'static str,
    script: Vec<(&'static str, Vec<Option<Message>>)>,
) -> ScriptedModel {
    let answers: Mutex<HashMap<&'static str, Vec<Option<Message>>>> =
        Mutex::new(script.into_iter().collect());
    ScriptedModel::new(name, move |call| {
        let role = role_of(call.messages, call.options);
        let mut all = answers.lock().unwrap();
        let queue = all
            .get_mut(role)
            .unwrap_or_else(|| panic!("{name}: no script for {role}"));
        let next = if queue.len() > 1 {
            queue.remove(0)
        } else {
            queue[0].clone()
        };
        Ok(next.unwrap_or_else(|| Message::ai("I think the bug is somewhere")))
    })
}

fn role_of(messages: &[Message], options: &GenerateOptions) -> &'static str {
    let last = &messages.last().unwrap().content;
    if !options.tools.is_empty() {
        "tool_request"
    } else if last.contains("Role: investigator") {
        "investigator"
    } else if last.contains("Role: docs researcher") {
        "synthesis"
    } else if last.contains("Role: code analyst") {
        "codebase"
    } else if last.contains("Role: critic") {
        "critic"
    } else if last.contains("Write the root cause") {
        "root_cause"
    } else if last.contains("Write the suggested fix") {
        "fix"
    } else {
        "ticket"
    }
}

fn ai(v: Value) -> Option<Message> {
    Some(Message::ai(v.to_string()))
}

fn hypothesis() -> Option<Message> {
    ai(json!({
        "hypothesis": "apply_discounts in discounts.py sums the percentages of stacked codes",
        "affected_areas": ["apply_discounts"]}))
}

fn critique(verdict: &str) -> Option<Message> {
    ai(json!({"verdict": verdict, "gaps": [],
        "summary": "The discounts module is found but the checks do not all hold."}))
}

fn script(name: &'static str, primary: bool) -> ScriptedModel {
    let garbled = None;
    let codebase = ai(json!({"root_cause_location": "nowhere.py:1-2",
        "explanation": "apply_discounts adds the percentages of stacked codes together"}));
    scripted_roles(
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
            // The primary's looping summary is refused by the checks; the retry goes to the
            // alternative model, whose answer is taken.
            (
                "synthesis",
                if primary {
                    vec![ai(
                        json!({"summary": "discount discount discount discount discount discount discount discount",
                        "relevant_sources": []}),
                    )]
                } else {
                    vec![ai(
                        json!({"summary": "The documentation says stacked percentage discounts compound.",
                        "relevant_sources": []}),
                    )]
                },
            ),
            ("codebase", vec![codebase]),
            (
                "critic",
                vec![critique("CHALLENGED"), critique("CONFIRMED")],
            ),
            (
                "root_cause",
                vec![ai(json!({"root_cause":
                    "apply_discounts in ledgerlite/discounts.py adds stacked percentages instead of compounding them."}))],
            ),
            // Both answers invent a name: the fix is composed from the evidence.
            (
                "fix",
                vec![ai(
                    json!({"suggested_fix": "Ask Leyla to rewrite frobnicate_totals in billing/engine.py."}),
                )],
            ),
            (
                "ticket",
                vec![ai(
                    json!({"title": "Stacked discounts overshoot in apply_discounts",
                    "severity": "HIGH", "effort": "S", "labels": ["bug", "made-up-label"],
                    "assignee": "Leyla"}),
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
        team: Vec::new(),
        labels: ferrograph_triage::agents::default_labels(),
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
    eprintln!("{:#?}", trace(&s));
    eprintln!("{:#?}", s.critic_history);
    eprintln!("{:#?}", s.field_checks);

    let r = |a: &str, round| (a.to_string(), round);
    let t = trace(&s);
    assert_eq!(
        t[..4],
        [
            r(agent::INVESTIGATOR, 1),
            r(agent::WEB_SEARCH, 1),
            r(agent::CODEBASE_SEARCH, 1),
            r(agent::CRITIC, 1),
        ]
    );
    assert_eq!(
        t[t.len() - 2..],
        [r(agent::WRITER, s.round), r(agent::PUBLISH, s.round)]
    );
    // The garbled hypothesis is a schema error: not retried, the fallback answered once.
    let first = &s.agent_runs[0];
    assert!(first.ok);
    assert_eq!(
        (first.calls[0].attempts, first.calls[0].used_fallback),
        (1, true)
    );
    assert_eq!(first.calls[0].model, "fallback");
    let inv = s.investigator.as_ref().unwrap();
    assert!(inv.hypothesis.contains("apply_discounts"));
    assert_eq!(
        inv.error_messages,
        vec!["ValueError: invoice total cannot be negative: -12.50"],
        "the error line is extracted by code, verbatim"
    );
    // The last check of the field (the writer writes in the last round).
    let check = |agent: &str, field: &str| {
        s.field_checks
            .iter()
            .rev()
            .find(|c| c.agent == agent && c.field == field)
            .unwrap_or_else(|| panic!("no check of {agent}.{field}"))
            .clone()
    };
    // The looping docs summary was refused and asked again.
    let web = check(agent::WEB_SEARCH, "summary");
    assert_eq!(web.source, "model_retry", "{web:?}");
    assert!(web.problems.iter().any(|p| p.contains("repeat")), "{web:?}");
    // The invented fix was refused twice and composed from the evidence.
    let fix = s
        .field_checks
        .iter()
        .find(|c| c.field == "suggested_fix")
        .unwrap();
    assert_eq!(fix.source, "composed", "{fix:?}");
    let w = s.writer.as_ref().unwrap();
    assert!(!w.report.suggested_fix.contains("Leyla"));
    assert!(!w.report.suggested_fix.contains("frobnicate"));
    assert!(!w.report.suggested_fix.trim().is_empty());
    // The model's root cause passed its checks and was kept.
    assert!(w.report.root_cause.contains("compounding"));
    // Both tickets named an assignee who is not on the team: the ticket is composed in code,
    // its labels from the evidence (an error line makes it a crash), no assignee.
    let ticket = check(agent::WRITER, "ticket");
    assert_eq!(ticket.source, "composed", "{ticket:?}");
    assert!(ticket.problems.iter().any(|p| p.contains("Leyla")));
    assert_eq!(w.ticket_labels, vec!["bug", "crash"]);
    assert_eq!(w.ticket_assignee_suggestion, "");
    // The codebase finding: the scripted location was not retrieved, so it is dropped.
    let cb = s.codebase.as_ref().unwrap();
    assert_ne!(cb.root_cause_location.as_deref(), Some("nowhere.py:1-2"));
    assert!(cb.relevant_files.iter().all(|f| !f.path.is_empty()));
    // A rejection names a gap, and a second round searched for it.
    for v in &s.critic_history {
        if v.verdict == Gate::Rejected {
            assert!(!v.gaps.is_empty(), "{v:?}");
        }
    }
    if s.round == 2 {
        let asked = &s.critic_history[0].required_evidence;
        assert!(asked.iter().all(|t| s.searched_terms.contains(t)));
    }
    // The docs search ran as a tool call and its result was kept.
    let web = s.web_search.as_ref().unwrap();
    assert_eq!(web.queries, vec!["stacking percentage discounts"]);
    assert_eq!(s.agent_runs[1].tool_calls, 1);
    assert_eq!(s.status, "COMPLETED");
    // Report files and the trace.
    let files = s.report_files.as_ref().unwrap();
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&files.json).unwrap()).unwrap();
    assert_eq!(report["writer"]["report"]["severity"], "HIGH");
    let md = std::fs::read_to_string(&files.markdown).unwrap();
    assert!(md.contains("## Routing") && md.contains("composed"));
    let events = std::fs::read_to_string(out_dir.join("events.jsonl")).unwrap();
    assert!(events.contains("tool_start") && events.contains("docs_search"));
    assert!(events.contains("\"routing\"") && events.contains("report_written"));
    assert!(events.contains("agent_start") && events.contains("index_progress"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_model_retrieval_and_evidence_still_make_a_marked_report() {
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
    // Every agent did its part from the evidence and retrieval alone.
    for a in agent::ALL {
        assert!(
            s.agent_runs.iter().any(|r| r.agent == a && r.ok),
            "{a} did not run"
        );
    }
    assert!(s.agent_runs.iter().all(|r| r.calls.is_empty()));
    let cb = s.codebase.as_ref().unwrap();
    assert!(cb
        .relevant_files
        .iter()
        .any(|f| f.path == "ledgerlite/discounts.py"));
    // Every text field says it was composed because there was no model.
    assert!(!s.field_checks.is_empty());
    for c in &s.field_checks {
        assert_eq!(c.source, "composed", "{c:?}");
        assert!(c.problems.iter().any(|p| p == "no chat model"), "{c:?}");
    }
    let w = s.writer.as_ref().unwrap();
    assert!(!w.report.root_cause.is_empty() && !w.report.suggested_fix.is_empty());
    assert_eq!(s.status, "COMPLETED");
    let md = std::fs::read_to_string(&s.report_files.unwrap().markdown).unwrap();
    assert!(md.contains("no chat model"));
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
    // The error line is extracted by code, verbatim.
    let inv = s.investigator.as_ref().unwrap();
    let errors = ferrograph_triage::agents::error_lines(&s.issue_body);
    assert!(!inv.error_messages.is_empty());
    assert!(inv.error_messages.iter().all(|e| errors.contains(e)));
    assert!(!inv.keywords_for_search.is_empty() && inv.keywords_for_search.len() <= 6);
    // Judge the text a maintainer reads: no loops, no placeholders, no invented names, some
    // real content, whichever source (model, retry or composed) it came from.
    let w = s.writer.as_ref().unwrap();
    let repo_files = walk(&fixture("repo"));
    let mut known = CheckContext::new(
        &format!("{}\n{}", s.issue_title, s.issue_body),
        &s.issue_title,
    );
    known.extend(&repo_files.join("\n"));
    known.extend(&ferrograph_triage::agents::default_labels().join("\n"));
    known.extend(&std::fs::read_to_string(fixture("repo/ledgerlite/discounts.py")).unwrap());
    let texts = [
        ("hypothesis", inv.hypothesis.as_str(), 6),
        ("root cause", w.report.root_cause.as_str(), 8),
        ("suggested fix", w.report.suggested_fix.as_str(), 6),
        ("ticket title", w.ticket_title.as_str(), 3),
    ];
    for (what, text, min_words) in texts {
        let problems: Vec<_> = known
            .problems(text, min_words)
            .into_iter()
            .filter(|p| !matches!(p, Problem::EchoesTitle))
            .collect();
        assert!(problems.is_empty(), "{what}: {text:?}: {problems:?}");
    }
    for line in check::comment_lines(&w.github_comment_markdown) {
        assert!(check::repetition(&line).is_none(), "{line:?}");
        assert!(check::placeholder(&line).is_none(), "{line:?}");
    }
    assert!(
        w.ticket_assignee_suggestion.is_empty(),
        "no team is configured"
    );
    assert!(w
        .ticket_labels
        .iter()
        .all(|l| ferrograph_triage::agents::default_labels().contains(l)));
    assert!(w
        .report
        .affected_files
        .iter()
        .all(|f| repo_files.contains(f)));
    // A rejection names at least one gap.
    for v in &s.critic_history {
        if v.verdict == Gate::Rejected {
            assert!(
                !v.gaps.is_empty() && v.gaps.iter().all(|g| g.trim().len() > 5),
                "{v:?}"
            );
        }
    }
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
            Gate::Rejected if after_critic.next == agent::INVESTIGATOR => {
                // A new round runs only to search for what the critic asked for.
                assert_eq!(after_critic.round, v.round + 1);
                assert!(v.round < s.max_rounds && !v.required_evidence.is_empty());
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
    // Retrieval ranks the file with the planted bug in the first two (the error is raised
    // from a check in invoice.py, called by the faulty apply_discounts), and the report
    // names it among the affected files.
    let cb = s.codebase.as_ref().unwrap();
    let top2: Vec<&str> = cb
        .relevant_files
        .iter()
        .take(2)
        .map(|f| f.path.as_str())
        .collect();
    assert!(
        top2.contains(&"ledgerlite/discounts.py"),
        "{:?}",
        cb.relevant_files
    );
    assert!(w
        .report
        .affected_files
        .iter()
        .any(|f| f == "ledgerlite/discounts.py"));
    assert_ne!(w.report.root_cause, w.report.suggested_fix);
    assert!(
        !errors.contains(&w.ticket_title),
        "the ticket title is not the error line"
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
