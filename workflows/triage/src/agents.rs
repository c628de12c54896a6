//! The five agents and the supervisor of the triage graph. Each is a graph node, so each
//! runs in its own supervised actor of the runtime and returns a typed state update.
//!
//! The agents are designed for a small model: code extracts the evidence (error lines,
//! stack frames, identifiers; see [`super::evidence`]), retrieval ranks the files (hybrid
//! lexical and vector search, see [`super::retrieval`]), and each model call asks one
//! question about evidence quoted into its prompt, answering with short bounded fields,
//! enums and choices among retrieved values. Every free-text field passes the checks of
//! [`super::check`]; a field that fails is asked again once (sampled instead of greedy),
//! then composed in code from the evidence, and the report says which.
//!
//! Without a chat model every agent still does its part: retrieval ranks the files, and the
//! fields are composed from the evidence.

use super::check::{CheckContext, FieldCheck};
use super::evidence::{Evidence, Frame};
use super::llm::{constrain_to, AgentLlm};
use super::models::*;
use super::retrieval::{is_secondary, IndexProgressHook, Retrieval, RetrievedChunk, SearchPlan};
use super::state::{agent, AgentRun, LlmCall, Routing, TriageState, TriageStateUpdate};
use ferrograph::chat::TokenSink;
use ferrograph::prelude::*;
use ferrograph_index::BuildProgress;
use ferrograph_tools::builtin::{SearchHit, SearchTool};
use ferrograph_tools::{ToolExecutor, ToolRegistry};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument as _;

/// Failed runs of one agent in one round before the supervisor moves on without it.
pub const MAX_AGENT_ATTEMPTS: usize = 2;

/// Labels a ticket may carry when none are configured.
pub const DEFAULT_LABELS: &[&str] = &[
    "bug",
    "crash",
    "regression",
    "wrong-result",
    "performance",
    "documentation",
    "needs-repro",
];

/// [`DEFAULT_LABELS`] as owned strings.
pub fn default_labels() -> Vec<String> {
    DEFAULT_LABELS.iter().map(|s| s.to_string()).collect()
}

/// What the agents share.
pub struct Agents {
    /// The model calls (`None`: no model; the agents compose every field from the evidence).
    pub llm: Option<AgentLlm>,
    /// Indexes of repositories and docs.
    pub retrieval: Retrieval,
    /// Per docs-search call.
    pub tool_timeout: Duration,
    /// People a ticket may be assigned to (empty: no assignee is suggested).
    pub team: Vec<String>,
    /// Labels a ticket may carry.
    pub labels: Vec<String>,
}

/// What an agent returns before the bookkeeping: its update and the run record.
struct Outcome {
    update: TriageStateUpdate,
    calls: Vec<LlmCall>,
    tool_calls: u32,
    checks: Vec<FieldCheck>,
    error: Option<String>,
}

impl Outcome {
    fn ok(update: TriageStateUpdate, calls: Vec<LlmCall>, checks: Vec<FieldCheck>) -> Self {
        Outcome {
            update,
            calls,
            tool_calls: 0,
            checks,
            error: None,
        }
    }

    fn failed(error: impl Into<String>, calls: Vec<LlmCall>) -> Self {
        Outcome {
            update: TriageStateUpdate::new(),
            calls,
            tool_calls: 0,
            checks: Vec::new(),
            error: Some(error.into()),
        }
    }
}

/// A model answer that passed its checks (or `None`: compose it), with its calls and the
/// record of where it came from.
struct Asked<T> {
    value: Option<T>,
    calls: Vec<LlmCall>,
    check: FieldCheck,
}

impl<T> Asked<T> {
    /// Marks the field as composed in code (the caller fills it).
    fn composed(&mut self) {
        self.check.source = "composed".into();
    }
}

/// Asks `llm` for a `T` whose texts `validate` accepts: the primary configuration first,
/// then once more on the alternative one (sampled) with the refusal's reasons in the prompt.
/// No model, or two refused answers: `value` is `None` and the check says `composed`.
#[allow(clippy::too_many_arguments)]
async fn ask_checked<T: JsonSchema + DeserializeOwned>(
    llm: Option<&AgentLlm>,
    agent: &str,
    field: &str,
    round: u32,
    msgs: &[Message],
    max_tokens: usize,
    patch: impl Fn(&mut Value),
    sink: Option<TokenSink>,
    validate: impl Fn(&T) -> Vec<String>,
) -> Asked<T> {
    let mut asked = Asked {
        value: None,
        calls: Vec::new(),
        check: FieldCheck {
            agent: agent.to_string(),
            field: field.to_string(),
            round,
            source: "composed".into(),
            problems: Vec::new(),
        },
    };
    let Some(llm) = llm else {
        asked.check.problems.push("no chat model".into());
        return asked;
    };
    for second in [false, true] {
        let msgs = if second {
            let mut m = msgs.to_vec();
            if let Some(last) = m.last_mut() {
                last.content.push_str(&format!(
                    "\n\nA previous answer was refused ({}). Answer again in your own words, \
                     using only names that appear above.",
                    asked.check.problems.join("; ")
                ));
            }
            m
        } else {
            msgs.to_vec()
        };
        let (res, call) = llm
            .structured_as::<T>(second, field, &msgs, max_tokens, &patch, sink.clone())
            .await;
        asked.calls.push(call);
        match res {
            Ok(v) => {
                let problems = validate(&v);
                if problems.is_empty() {
                    asked.check.source = if second { "model_retry" } else { "model" }.into();
                    asked.value = Some(v);
                    return asked;
                }
                asked.check.problems.extend(problems);
            }
            Err(e) => asked
                .check
                .problems
                .push(format!("answer unusable: {}", clip(&e.to_string(), 160))),
        }
    }
    asked
}

/// Runs `work` with an index-progress hook whose reports become `index_progress` custom
/// events of the node.
async fn with_index_progress<F, O>(
    ctx: &NodeContext,
    work: impl FnOnce(IndexProgressHook) -> F,
) -> O
where
    F: Future<Output = O>,
{
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let hook: IndexProgressHook = Arc::new(move |dir: &Path, p: &BuildProgress, secs: f64| {
        let _ = tx.send(json!({
            "event": "index_progress",
            "folder": dir.display().to_string(),
            "files_total": p.files_total,
            "files_done": p.files_done,
            "chunks_embedded": p.chunks_embedded,
            "seconds": secs,
        }));
    });
    let fut = work(hook);
    tokio::pin!(fut);
    loop {
        tokio::select! {
            out = &mut fut => {
                while let Ok(v) = rx.try_recv() {
                    let _ = ctx.emit_custom(&v).await;
                }
                return out;
            }
            Some(v) = rx.recv() => {
                let _ = ctx.emit_custom(&v).await;
            }
        }
    }
}

impl Agents {
    /// Runs agent `name`: the bookkeeping every agent shares (span, timing, iteration count,
    /// run record, field checks, error field) around its body.
    pub async fn run(
        &self,
        name: &'static str,
        s: Arc<TriageState>,
        ctx: NodeContext,
    ) -> Result<TriageStateUpdate, NodeError> {
        let span = tracing::info_span!(
            "agent",
            agent = name,
            round = s.round,
            iteration = s.iterations
        );
        async move {
            let started = Instant::now();
            let _ = ctx
                .emit_custom(&json!({"event": "agent_start", "agent": name, "round": s.round}))
                .await;
            let sink = TokenSink::from_context(&ctx);
            let out = match name {
                agent::INVESTIGATOR => self.investigator(&s, &ctx, sink).await,
                agent::WEB_SEARCH => self.web_search(&s, &ctx, sink).await,
                agent::CODEBASE_SEARCH => self.codebase_search(&s, &ctx, sink).await,
                agent::CRITIC => self.critic(&s, sink).await,
                _ => self.writer(&s, sink).await,
            };
            let run = AgentRun {
                agent: name.to_string(),
                round: s.round,
                duration_ms: started.elapsed().as_millis() as u64,
                calls: out.calls,
                tool_calls: out.tool_calls,
                ok: out.error.is_none(),
                error: out.error.clone(),
            };
            match &out.error {
                Some(e) => tracing::warn!(agent = name, error = %e, "agent set its error field; no finding appended"),
                None => tracing::info!(agent = name, ms = run.duration_ms, "agent finished"),
            }
            let _ = ctx
                .emit_custom(&json!({"event": "agent_run", "run": run, "checks": out.checks}))
                .await;
            Ok(out
                .update
                .current_node(name.to_string())
                .iterations(s.iterations + 1)
                .agent_runs(vec![run])
                .field_checks(out.checks))
        }
        .instrument(span)
        .await
    }

    /// The evidence checks accept names from: the report, its extracted evidence, the
    /// repository's paths, the configured team and labels.
    fn check_context(&self, s: &TriageState, ev: &Evidence, repo_files: &[String]) -> CheckContext {
        let mut c = CheckContext::new(
            &format!("{}\n{}", s.issue_title, s.issue_body),
            &s.issue_title,
        );
        c.extend(&ev.vocabulary_text());
        c.extend(&repo_files.join("\n"));
        c.extend(&self.team.join("\n"));
        c.extend(&self.labels.join("\n"));
        c
    }

    async fn investigator(
        &self,
        s: &TriageState,
        ctx: &NodeContext,
        sink: Option<TokenSink>,
    ) -> Outcome {
        let ev = Evidence::extract(&s.issue_title, &s.issue_body);
        // The repository's index is built here (the codebase search reuses it): its file
        // list maps the report's frames to repository files.
        let repo_files = match with_index_progress(ctx, |hook| {
            self.retrieval.repo_files_with(&s.repository, Some(hook))
        })
        .await
        {
            Ok(f) => f,
            Err(e) => return Outcome::failed(format!("repository index: {e}"), vec![]),
        };
        let frames_in_repo: Vec<String> = ev
            .repo_files(&repo_files)
            .into_iter()
            .map(str::to_string)
            .collect();
        let mut areas: Vec<String> = ev.identifiers.iter().take(10).cloned().collect();
        for f in frames_in_repo.iter().chain(
            repo_files
                .iter()
                .filter(|f| !is_secondary(f) && mentions_stem(&s.issue_body, f)),
        ) {
            if areas.len() < 16 && !areas.contains(f) {
                areas.push(f.clone());
            }
        }
        let checks = self.check_context(s, &ev, &repo_files);
        let hypothesis_anchors: Vec<String> = areas
            .iter()
            .filter(|a| !is_exception_name(a))
            .cloned()
            .collect();
        let mut material = evidence_block(&ev, &frames_in_repo);
        if let Some(v) = s.critic_feedback.as_ref().filter(|v| !v.gaps.is_empty()) {
            material.push_str(&format!(
                "Open questions from the review: {}\n",
                v.gaps.join("; ")
            ));
        }
        let msgs = agent_messages(
            s,
            "investigator",
            &material,
            "In one sentence, which code most likely does what wrong? Name the function or \
             file from the evidence above.",
        );
        let mut asked = ask_checked::<InvestigatorOutput>(
            self.llm.as_ref(),
            agent::INVESTIGATOR,
            "hypothesis",
            s.round,
            &msgs,
            120,
            |schema| {
                if areas.is_empty() {
                    constrain_to(
                        schema,
                        "affected_areas",
                        std::slice::from_ref(&s.issue_title),
                    );
                } else {
                    constrain_to(schema, "affected_areas", &areas);
                }
            },
            sink,
            |o: &InvestigatorOutput| {
                checks
                    .problems_anchored(&o.hypothesis, 6, &hypothesis_anchors)
                    .iter()
                    .map(ToString::to_string)
                    .collect()
            },
        )
        .await;
        let (hypothesis, affected) = match asked.value.take() {
            Some(o) => {
                let mut a: Vec<String> = Vec::new();
                for x in o.affected_areas {
                    if (areas.contains(&x) || x == s.issue_title) && !a.contains(&x) {
                        a.push(x);
                    }
                }
                (whole_sentences(&o.hypothesis, 220), a)
            }
            None => {
                asked.composed();
                let mut a: Vec<String> = frames_in_repo.iter().take(2).cloned().collect();
                a.extend(ev.identifiers.iter().take(3 - a.len().min(3)).cloned());
                (compose_hypothesis(s, &ev, &frames_in_repo), a)
            }
        };
        let mut keywords: Vec<String> = ev.identifiers.iter().take(6).cloned().collect();
        if keywords.len() < 3 {
            for w in title_terms(&s.issue_title) {
                if keywords.len() < 6 && !keywords.contains(&w) {
                    keywords.push(w);
                }
            }
        }
        let confidence = evidence_strength(&ev, &frames_in_repo);
        let f = InvestigatorFinding {
            base: FindingBase {
                agent_name: agent::INVESTIGATOR.into(),
                summary: match ev.error_lines.first() {
                    Some(e) => format!("Reported failure: {}", clip(e, 140)),
                    None => format!("Reported symptom: {}", clip(&s.issue_title, 140)),
                },
                confidence,
                reasoning: format!(
                    "{} error line(s), {} stack frame(s) ({} in the repository), {} identifier(s) extracted from the report",
                    ev.error_lines.len(),
                    ev.frames.len(),
                    frames_in_repo.len(),
                    ev.identifiers.len()
                ),
                error: None,
            },
            hypothesis: hypothesis.clone(),
            affected_areas: affected.clone(),
            keywords_for_search: keywords,
            error_messages: ev.error_lines.iter().take(3).cloned().collect(),
        };
        let common = to_agent_finding(&f.base, hypothesis, affected, s.round);
        Outcome::ok(
            TriageStateUpdate::new()
                .investigator(Some(f))
                .findings(vec![common]),
            asked.calls,
            vec![asked.check],
        )
    }

    async fn web_search(
        &self,
        s: &TriageState,
        ctx: &NodeContext,
        sink: Option<TokenSink>,
    ) -> Outcome {
        let docs = match with_index_progress(ctx, |hook| {
            self.retrieval.retriever_with(&s.docs_dir, Some(hook))
        })
        .await
        {
            Ok(r) => r,
            Err(e) => return Outcome::failed(format!("docs index: {e}"), vec![]),
        };
        let ev = Evidence::extract(&s.issue_title, &s.issue_body);
        let mut registry = ToolRegistry::new();
        if let Err(e) = registry
            .register(SearchTool::docs_search("offline docs", Arc::new(docs)).limits(5, 900))
        {
            return Outcome::failed(e.to_string(), vec![]);
        }
        let specs = registry.specs();
        let executor = ToolExecutor::new(registry).timeout(self.tool_timeout);
        let mut calls = Vec::new();
        // Step 1: the model asks for a search (or, without one, the report's own words do).
        let default_query = ev
            .error_lines
            .first()
            .cloned()
            .unwrap_or_else(|| s.issue_title.clone());
        let mut tool_calls = Vec::new();
        if let Some(llm) = &self.llm {
            let ask = agent_messages(
                s,
                "docs researcher",
                &format!(
                    "Error: {}\nHypothesis: {}",
                    default_query,
                    s.investigator
                        .as_ref()
                        .map(|i| i.hypothesis.as_str())
                        .unwrap_or("none yet")
                ),
                "Call the docs_search tool with a short query (a few words) that would find \
                 documentation of this bug's cause.",
            );
            let (req, call1) = llm
                .tool_request("tool_request", &ask, specs, 48, sink.clone())
                .await;
            calls.push(call1);
            if let Ok(m) = req {
                tool_calls = m
                    .tool_calls
                    .into_iter()
                    .filter(|c| {
                        c.args
                            .0
                            .get("query")
                            .and_then(Value::as_str)
                            .is_some_and(|q| {
                                super::check::repetition(q).is_none() && q.trim().len() >= 3
                            })
                    })
                    .take(2)
                    .collect();
            }
        }
        if tool_calls.is_empty() {
            tool_calls.push(ferrograph::core::message::ToolCall::new(
                "docs_search",
                json!({"query": clip(&default_query, 200)}),
            ));
        }
        let queries: Vec<String> = tool_calls
            .iter()
            .filter_map(|c| {
                c.args
                    .0
                    .get("query")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .collect();
        // Step 2: the tool node runs them (tool_start / tool_end events).
        let results = executor.execute(&tool_calls, Some(ctx)).await;
        let n_tool_calls = tool_calls.len() as u32;
        let mut hits: Vec<SearchHit> = Vec::new();
        for m in &results {
            if let Ok(h) = serde_json::from_str::<Vec<SearchHit>>(&m.content) {
                hits.extend(h);
            }
        }
        hits.sort_by(|a, b| b.score.total_cmp(&a.score));
        let mut sources: Vec<String> = Vec::new();
        for h in &hits {
            if !sources.contains(&h.source) {
                sources.push(h.source.clone());
            }
        }
        let top: Vec<&SearchHit> = hits.iter().take(3).collect();
        let context: String = top
            .iter()
            .map(|h| format!("### {}\n{}\n", h.source, clip(&h.text, 450)))
            .collect();
        let mut checks = self.check_context(s, &ev, &[]);
        checks.extend(&context);
        checks.extend(&sources.join("\n"));
        // Step 3: a separate structured call says what the passages say.
        let synth = agent_messages(
            s,
            "docs researcher",
            &format!("Passages found in the documentation:\n{context}"),
            "In one sentence, what do these passages say about the bug? If they say nothing \
             about it, say so.",
        );
        let mut asked = if hits.is_empty() {
            let mut a = Asked::<WebSearchOutput> {
                value: None,
                calls: Vec::new(),
                check: FieldCheck {
                    agent: agent::WEB_SEARCH.into(),
                    field: "summary".into(),
                    round: s.round,
                    source: "composed".into(),
                    problems: vec!["the docs search found nothing".into()],
                },
            };
            a.composed();
            a
        } else {
            ask_checked::<WebSearchOutput>(
                self.llm.as_ref(),
                agent::WEB_SEARCH,
                "summary",
                s.round,
                &synth,
                100,
                |schema| constrain_to(schema, "relevant_sources", &sources),
                sink,
                |o: &WebSearchOutput| {
                    checks
                        .problems(&o.summary, 5)
                        .iter()
                        .map(ToString::to_string)
                        .collect()
                },
            )
            .await
        };
        calls.append(&mut asked.calls);
        let (summary, chosen) = match asked.value.take() {
            Some(o) => (
                o.summary.trim().to_string(),
                o.relevant_sources
                    .into_iter()
                    .filter(|x| sources.contains(x))
                    .collect::<Vec<_>>(),
            ),
            None => {
                asked.composed();
                match top.first() {
                    Some(h) => (
                        format!(
                            "The closest documentation passage is {}: \"{}\"",
                            h.source,
                            clip(first_sentence(&h.text), 160)
                        ),
                        vec![h.source.clone()],
                    ),
                    None => (
                        "The offline documentation has no passage about this bug.".to_string(),
                        Vec::new(),
                    ),
                }
            }
        };
        let relevant_results: Vec<WebResult> = chosen
            .iter()
            .filter_map(|src| hits.iter().find(|h| &h.source == src))
            .map(|h| WebResult {
                url: h.source.clone(),
                location: h.location.clone(),
                score: h.score,
                snippet: clip(&h.text, 200),
            })
            .collect();
        let f = WebSearchFinding {
            base: FindingBase {
                agent_name: agent::WEB_SEARCH.into(),
                summary: summary.clone(),
                confidence: top
                    .first()
                    .map(|h| f64::from(h.score).clamp(0.0, 1.0))
                    .unwrap_or(0.0),
                reasoning: format!(
                    "{} passage(s) found for {} query(ies)",
                    hits.len(),
                    queries.len()
                ),
                error: None,
            },
            external_root_cause: None,
            relevant_results,
            queries,
        };
        let common = to_agent_finding(
            &f.base,
            summary,
            f.relevant_results.iter().map(|r| r.url.clone()).collect(),
            s.round,
        );
        let mut out = Outcome::ok(
            TriageStateUpdate::new()
                .web_search(Some(f))
                .findings(vec![common]),
            calls,
            vec![asked.check],
        );
        out.tool_calls = n_tool_calls;
        out
    }

    async fn codebase_search(
        &self,
        s: &TriageState,
        ctx: &NodeContext,
        sink: Option<TokenSink>,
    ) -> Outcome {
        let ev = Evidence::extract(&s.issue_title, &s.issue_body);
        let repo_files = match with_index_progress(ctx, |hook| {
            self.retrieval.repo_files_with(&s.repository, Some(hook))
        })
        .await
        {
            Ok(f) => f,
            Err(e) => return Outcome::failed(format!("repository index: {e}"), vec![]),
        };
        let plan = plan_for(s, &ev, &repo_files);
        let search = match self.retrieval.code_search(&s.repository, &plan, None).await {
            Ok(c) => c,
            Err(e) => return Outcome::failed(format!("repository search: {e}"), vec![]),
        };
        if search.files.is_empty() {
            return Outcome::failed("retrieval found no code in the repository", vec![]);
        }
        // The regions shown: the best chunk of each of the three best files.
        let mut shown: Vec<&RetrievedChunk> = Vec::new();
        for f in search.files.iter().take(3) {
            if let Some(c) = search.chunks.iter().find(|c| c.path == f.path) {
                shown.push(c);
            }
        }
        let locations: Vec<String> = shown.iter().map(|c| c.location()).collect();
        let context: String = shown
            .iter()
            .map(|c| format!("### {}\n```\n{}\n```\n", c.location(), clip(&c.text, 700)))
            .collect();
        let mut checks = self.check_context(s, &ev, &repo_files);
        checks.extend(&context);
        // The explanation must name the code it explains: a shown file or an identifier of
        // the report that the shown code contains.
        let context_lower = context.to_lowercase();
        let mut anchors: Vec<String> = shown.iter().map(|c| c.path.clone()).collect();
        anchors.extend(
            ev.identifiers
                .iter()
                .filter(|i| !is_exception_name(i))
                .filter(|i| {
                    let last = i.rsplit(['.', ':']).next().unwrap_or(i);
                    last.len() >= 4 && context_lower.contains(&last.to_lowercase())
                })
                .cloned(),
        );
        let msgs = agent_messages(
            s,
            "code analyst",
            &format!(
                "{}Code regions found by searching the repository:\n{context}",
                evidence_block(&ev, &[])
            ),
            "Which region most likely holds the root cause, and what does that code do wrong? \
             One or two sentences.",
        );
        let mut asked = ask_checked::<CodebaseOutput>(
            self.llm.as_ref(),
            agent::CODEBASE_SEARCH,
            "explanation",
            s.round,
            &msgs,
            140,
            |schema| constrain_to(schema, "root_cause_location", &locations),
            sink,
            |o: &CodebaseOutput| {
                checks
                    .problems_anchored(&o.explanation, 6, &anchors)
                    .iter()
                    .map(ToString::to_string)
                    .collect()
            },
        )
        .await;
        let top = &search.files[0];
        let (location, explanation) = match asked.value.take() {
            Some(o) if locations.contains(&o.root_cause_location) => {
                (o.root_cause_location, whole_sentences(&o.explanation, 240))
            }
            _ => {
                asked.composed();
                (
                    locations.first().cloned().unwrap_or_default(),
                    compose_file_reason(top),
                )
            }
        };
        // The model may point at any shown region; the files keep the fused order, and its
        // explanation goes with the file it is about.
        let chosen = shown
            .iter()
            .find(|c| c.location() == location)
            .map(|c| c.path.clone())
            .unwrap_or_else(|| top.path.clone());
        let relevant: Vec<RelevantFile> = search
            .files
            .iter()
            .take(8)
            .map(|f| RelevantFile {
                path: f.path.clone(),
                relevance_reason: if f.path == chosen {
                    explanation.clone()
                } else {
                    compose_file_reason(f)
                },
                source: "retrieval".into(),
                score: f.score,
            })
            .collect();
        let strong = top
            .signals
            .iter()
            .any(|x| x.starts_with("defines") || x.starts_with("contains"));
        let f = CodebaseFinding {
            base: FindingBase {
                agent_name: agent::CODEBASE_SEARCH.into(),
                summary: format!(
                    "Most likely file: {}{}",
                    top.path,
                    if top.signals.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", top.signals.join(", "))
                    }
                ),
                confidence: if strong { 0.7 } else { 0.4 },
                reasoning: explanation.clone(),
                error: None,
            },
            relevant_files: relevant,
            root_cause_location: Some(location.clone()).filter(|l| !l.is_empty()),
            evidence: search
                .chunks
                .iter()
                .take(10)
                .map(|c| format!("{} ({:.4})", c.location(), c.score))
                .collect(),
        };
        let common = to_agent_finding(
            &f.base,
            location,
            f.relevant_files.iter().map(|r| r.path.clone()).collect(),
            s.round,
        );
        Outcome::ok(
            TriageStateUpdate::new()
                .codebase(Some(f))
                .searched_terms(plan.terms())
                .findings(vec![common]),
            asked.calls,
            vec![asked.check],
        )
    }

    async fn critic(&self, s: &TriageState, sink: Option<TokenSink>) -> Outcome {
        let ev = Evidence::extract(&s.issue_title, &s.issue_body);
        let review = review_checks(s, &ev);
        let failed: Vec<&ReviewCheck> = review.iter().filter(|c| !c.passed).collect();
        let gap_texts: Vec<String> = failed.iter().map(|c| c.gap.clone()).collect();
        let hypothesis = s
            .investigator
            .as_ref()
            .map(|i| i.hypothesis.clone())
            .unwrap_or_else(|| s.issue_title.clone());
        let checks_text: String = review
            .iter()
            .map(|c| {
                format!(
                    "- [{}] {}\n",
                    if c.passed { "ok" } else { "FAILED" },
                    c.name
                )
            })
            .collect();
        let mut checks = self.check_context(s, &ev, &[]);
        checks.extend(&checks_text);
        checks.extend(&gap_texts.join("\n"));
        if let Some(c) = &s.codebase {
            checks.extend(
                &c.relevant_files
                    .iter()
                    .map(|f| format!("{} {}", f.path, f.relevance_reason))
                    .collect::<Vec<_>>()
                    .join("\n"),
            );
        }
        let files = s
            .codebase
            .as_ref()
            .map(|c| {
                c.relevant_files
                    .iter()
                    .take(3)
                    .map(|f| format!("- {}: {}\n", f.path, clip(&f.relevance_reason, 160)))
                    .collect::<String>()
            })
            .unwrap_or_else(|| "none\n".into());
        let msgs = agent_messages(
            s,
            "critic",
            &format!(
                "Hypothesis: {hypothesis}\nFiles found:\n{files}Checks of the evidence:\n{checks_text}"
            ),
            "Is the hypothesis backed by the code found? CONFIRMED if the checks support it, \
             UNCERTAIN or CHALLENGED if not; then name the failed checks that matter as gaps \
             and say why in one sentence.",
        );
        let has_gaps = !gap_texts.is_empty();
        let mut asked = ask_checked::<CritiqueOutput>(
            self.llm.as_ref(),
            agent::CRITIC,
            "verdict",
            s.round,
            &msgs,
            120,
            |schema| constrain_to(schema, "gaps", &gap_texts),
            sink,
            |o: &CritiqueOutput| {
                let mut p: Vec<String> = checks
                    .problems(&o.summary, 4)
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                if o.verdict != Critique::Confirmed && !has_gaps {
                    p.push("rejected without a failed check to name as a gap".into());
                }
                p
            },
        )
        .await;
        let (verdict, gaps, summary) = match asked.value.take() {
            Some(o) => {
                let mut gaps: Vec<String> = o
                    .gaps
                    .into_iter()
                    .filter(|g| gap_texts.contains(g))
                    .collect();
                if o.verdict != Critique::Confirmed && gaps.is_empty() {
                    // A rejection names at least one gap: the first failed check.
                    gaps.extend(gap_texts.first().cloned());
                }
                if o.verdict == Critique::Confirmed {
                    gaps.clear();
                }
                (o.verdict, gaps, o.summary.trim().to_string())
            }
            None => {
                asked.composed();
                let passed = review.iter().filter(|c| c.passed).count();
                let summary = if review.is_empty() {
                    "The report quotes no error, frame or identifier to check; the findings rest on retrieval alone.".to_string()
                } else {
                    format!(
                        "{passed} of {} evidence checks pass{}.",
                        review.len(),
                        if failed.is_empty() {
                            String::new()
                        } else {
                            format!("; open: {}", gap_texts.join("; "))
                        }
                    )
                };
                if failed.is_empty() {
                    (Critique::Confirmed, Vec::new(), summary)
                } else {
                    (
                        Critique::Uncertain,
                        gap_texts.iter().take(2).cloned().collect(),
                        summary,
                    )
                }
            }
        };
        let required: Vec<String> = failed
            .iter()
            .filter(|c| gaps.contains(&c.gap))
            .flat_map(|c| c.terms.iter().cloned())
            .collect();
        let f = CritiqueFinding {
            base: FindingBase {
                agent_name: agent::CRITIC.into(),
                summary: summary.clone(),
                confidence: if review.is_empty() {
                    0.5
                } else {
                    review.iter().filter(|c| c.passed).count() as f64 / review.len() as f64
                },
                reasoning: format!("verdict {verdict:?}; checks:\n{checks_text}"),
                error: None,
            },
            verdict,
            confidence_adjustment: if failed.is_empty() {
                0.2
            } else {
                -0.1 * failed.len() as f64
            },
            gaps: gaps.clone(),
            revised_hypothesis: None,
            ready_for_report: verdict == Critique::Confirmed,
        };
        let gate = map_critique_to_verdict(&f, required, s.round);
        let details = format!("Verdict: {verdict:?}. {summary}");
        let common = to_agent_finding(&f.base, details, gaps, s.round);
        Outcome::ok(
            TriageStateUpdate::new()
                .critique(Some(f))
                .critic_feedback(Some(gate.clone()))
                .critic_history(vec![gate])
                .findings(vec![common]),
            asked.calls,
            vec![asked.check],
        )
    }

    async fn writer(&self, s: &TriageState, sink: Option<TokenSink>) -> Outcome {
        let ev = Evidence::extract(&s.issue_title, &s.issue_body);
        let files: Vec<&RelevantFile> = s
            .codebase
            .as_ref()
            .map(|c| c.relevant_files.iter().take(3).collect())
            .unwrap_or_default();
        let location = s
            .codebase
            .as_ref()
            .and_then(|c| c.root_cause_location.clone())
            .unwrap_or_default();
        let hypothesis = s
            .investigator
            .as_ref()
            .map(|i| i.hypothesis.clone())
            .unwrap_or_default();
        let explanation = s
            .codebase
            .as_ref()
            .map(|c| c.base.reasoning.clone())
            .unwrap_or_default();
        let mut checks = self.check_context(s, &ev, &[]);
        for f in &files {
            checks.extend(&f.path);
            checks.extend(&f.relevance_reason);
        }
        checks.extend(&hypothesis);
        let material = format!(
            "{}Most likely location: {}\nWhy: {}\nHypothesis: {}\nOther files: {}\n",
            evidence_block(&ev, &[]),
            if location.is_empty() {
                "unknown"
            } else {
                location.as_str()
            },
            clip(&explanation, 240),
            clip(&hypothesis, 240),
            files
                .iter()
                .skip(1)
                .map(|f| f.path.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        );
        let labels = self.labels.clone();
        let team = self.team.clone();
        let rc_msgs = agent_messages(
            s,
            "writer",
            &material,
            "Write the root cause for the report: one or two sentences saying what is wrong \
             and where.",
        );
        let fix_msgs = agent_messages(
            s,
            "writer",
            &material,
            "Write the suggested fix: one or two sentences saying what to change, and where.",
        );
        let ticket_msgs = agent_messages(
            s,
            "writer",
            &material,
            "Fill in the ticket: a short title naming the symptom and the function or file \
             where it happens, labels from the allowed list, and the assignee from the allowed \
             list.",
        );
        let round = s.round;
        let llm = self.llm.as_ref();
        let checks_rc = &checks;
        // What the report says must name the code: a found file, the location, or an
        // identifier of the report.
        let mut anchors: Vec<String> = files.iter().map(|f| f.path.clone()).collect();
        if let Some((path, _)) = location.split_once(':') {
            anchors.push(path.to_string());
        }
        anchors.extend(
            ev.identifiers
                .iter()
                .filter(|i| !is_exception_name(i))
                .take(8)
                .cloned(),
        );
        let anchors = &anchors;
        let (rc, fix, ticket) = tokio::join!(
            ask_checked::<RootCauseOutput>(
                llm,
                agent::WRITER,
                "root_cause",
                round,
                &rc_msgs,
                120,
                |_| {},
                sink.clone(),
                |o: &RootCauseOutput| checks_rc
                    .problems_anchored(&o.root_cause, 8, anchors)
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
            ),
            ask_checked::<FixOutput>(
                llm,
                agent::WRITER,
                "suggested_fix",
                round,
                &fix_msgs,
                100,
                |_| {},
                sink.clone(),
                |o: &FixOutput| {
                    let mut p = checks_rc.problems_anchored(&o.suggested_fix, 6, anchors);
                    if let Some(phrase) =
                        super::check::describes_instead_of_instructs(&o.suggested_fix)
                    {
                        p.push(super::check::Problem::NotAnInstruction(phrase));
                    }
                    p.iter().map(ToString::to_string).collect()
                },
            ),
            ask_checked::<TicketOutput>(
                llm,
                agent::WRITER,
                "ticket",
                round,
                &ticket_msgs,
                110,
                |schema| {
                    constrain_to(schema, "labels", &labels);
                    let people: Vec<String> = if team.is_empty() {
                        vec![String::new()]
                    } else {
                        let mut t = team.clone();
                        t.push(String::new());
                        t
                    };
                    constrain_to(schema, "assignee", &people);
                },
                sink,
                |o: &TicketOutput| {
                    let mut p: Vec<String> = checks_rc
                        .problems_anchored(&o.title, 3, anchors)
                        .into_iter()
                        .filter(|x| *x != super::check::Problem::EchoesTitle)
                        .map(|x| x.to_string())
                        .collect();
                    if ev
                        .error_lines
                        .iter()
                        .any(|e| e.trim() == o.title.trim() || o.title.contains(e.trim()))
                    {
                        p.push("the title is the error line, not a summary".into());
                    }
                    if !checks_rc.names_symptom(&o.title) {
                        p.push("the title does not name the reported symptom".into());
                    }
                    if !o.assignee.is_empty() && !team.contains(&o.assignee) {
                        p.push(format!("assignee {} is not on the team", o.assignee));
                    }
                    p
                },
            ),
        );
        let (mut rc, mut fix, mut ticket) = (rc, fix, ticket);
        let top = files.first().map(|f| f.path.clone()).unwrap_or_default();
        let root_cause = match rc.value.take() {
            Some(o) => whole_sentences(&o.root_cause, 300),
            None => {
                rc.composed();
                compose_root_cause(
                    &location,
                    &top,
                    &explanation,
                    &hypothesis,
                    s.codebase.as_ref(),
                )
            }
        };
        let suggested_fix = match fix.value.take() {
            // A fix that restates the root cause says nothing to do.
            Some(o) if !same_text(&o.suggested_fix, &root_cause) => {
                whole_sentences(&o.suggested_fix, 240)
            }
            Some(_) => {
                fix.check.problems.push("restates the root cause".into());
                fix.composed();
                compose_fix(&location, &top, &ev)
            }
            None => {
                fix.composed();
                compose_fix(&location, &top, &ev)
            }
        };
        let report_text = format!("{}\n{}", s.issue_title, s.issue_body);
        let has_repro = !reproduction_steps(&s.issue_body).is_empty();
        // Composed labels: `bug`, and each default label the report's words support
        // (`wrong-result` only when it does not crash).
        let supported = |l: &str| {
            self.labels.iter().any(|x| x == l)
                && label_supported(l, &report_text, !ev.error_lines.is_empty(), has_repro)
        };
        let evidence_labels = || -> Vec<String> {
            let crash = supported("crash");
            [
                "bug",
                "crash",
                "wrong-result",
                "regression",
                "performance",
                "needs-repro",
            ]
            .into_iter()
            .filter(|l| supported(l) && !(crash && *l == "wrong-result"))
            .map(String::from)
            .collect()
        };
        let ticket_v = match ticket.value.take() {
            Some(mut o) => {
                // A label must be on the list and supported by the report's words: a crash
                // is not "performance" because the model picked it.
                o.labels.retain(|l| supported(l));
                o.labels.dedup();
                if o.labels.is_empty() {
                    o.labels = evidence_labels();
                }
                o
            }
            None => {
                ticket.composed();
                TicketOutput {
                    title: clip(
                        &if top.is_empty() {
                            s.issue_title.clone()
                        } else {
                            format!("{}: {}", file_stem(&top), s.issue_title)
                        },
                        90,
                    ),
                    labels: evidence_labels(),
                    assignee: String::new(),
                }
            }
        };
        let confidence = s
            .critic_feedback
            .as_ref()
            .map(|v| v.confidence)
            .unwrap_or(0.5);
        let affected: Vec<String> = files.iter().map(|f| f.path.clone()).collect();
        let severity = Severity::from_evidence(
            &format!("{}\n{}", s.issue_title, s.issue_body),
            !ev.error_lines.is_empty(),
        );
        let effort = Effort::from_files(
            &s.codebase
                .as_ref()
                .map(|c| c.relevant_files.iter().map(|f| f.score).collect::<Vec<_>>())
                .unwrap_or_default(),
        );
        let report = TriageReport {
            title: ticket_v.title.clone(),
            severity,
            root_cause: root_cause.clone(),
            affected_files: affected.clone(),
            reproduction_steps: reproduction_steps(&s.issue_body),
            suggested_fix: suggested_fix.clone(),
            confidence,
        };
        let comment = compose_comment(s, &report, &location, &files);
        let w = WriterOutput {
            base: FindingBase {
                agent_name: agent::WRITER.into(),
                summary: format!("Triage complete: {} severity", report.severity.as_str()),
                confidence,
                reasoning:
                    "Report written from the accumulated findings; every text field checked.".into(),
                error: None,
            },
            report,
            github_comment_markdown: comment,
            ticket_title: ticket_v.title,
            ticket_labels: ticket_v.labels,
            ticket_assignee_suggestion: ticket_v.assignee,
            ticket_effort_estimate: effort,
        };
        let common = to_agent_finding(&w.base, w.base.summary.clone(), affected, s.round);
        let mut calls = rc.calls;
        calls.append(&mut fix.calls);
        calls.append(&mut ticket.calls);
        Outcome::ok(
            TriageStateUpdate::new()
                .writer(Some(w))
                .findings(vec![common]),
            calls,
            vec![rc.check, fix.check, ticket.check],
        )
    }
}

/// One check of the critic over the findings.
#[derive(Clone, Debug, PartialEq)]
pub struct ReviewCheck {
    /// What is checked.
    pub name: String,
    /// Whether it holds.
    pub passed: bool,
    /// The gap it names when it fails.
    pub gap: String,
    /// Search terms that would close the gap.
    pub terms: Vec<String>,
}

/// The critic's checks of the findings against the report's evidence. Only checks the
/// evidence allows are made: a report with no error line has no "error raised" check.
pub fn review_checks(s: &TriageState, ev: &Evidence) -> Vec<ReviewCheck> {
    let mut out = Vec::new();
    let Some(code) = &s.codebase else {
        out.push(ReviewCheck {
            name: "the codebase search found files".into(),
            passed: false,
            gap: "no code was retrieved for the report".into(),
            terms: vec![s.issue_title.to_lowercase()],
        });
        return out;
    };
    let top: Vec<&RelevantFile> = code.relevant_files.iter().take(3).collect();
    let reason_has = |prefix: &str| top.iter().any(|f| f.relevance_reason.contains(prefix));
    let names: Vec<&String> = ev
        .identifiers
        .iter()
        .filter(|i| i.rsplit(['.', ':']).next().is_some_and(|n| n.len() >= 4))
        .take(2)
        .collect();
    if !names.is_empty() {
        out.push(ReviewCheck {
            name: format!(
                "a top file defines {}",
                names
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
            passed: reason_has("defines `"),
            gap: format!("no top file defines `{}`", names[0]),
            terms: names
                .iter()
                .map(|n| format!("def {n}").to_lowercase())
                .collect(),
        });
    }
    if let Some(p) = ev.message_phrases().first() {
        out.push(ReviewCheck {
            name: format!("a top file contains the message \"{p}\""),
            passed: reason_has("contains \""),
            gap: format!("where \"{p}\" is raised was not found"),
            terms: vec![format!("raise {p}").to_lowercase()],
        });
    }
    let frames: Vec<String> = ev
        .frames
        .iter()
        .filter_map(|f| f.function.clone())
        .filter(|f| f != "<module>")
        .collect();
    if !frames.is_empty() {
        out.push(ReviewCheck {
            name: "a top file is on the stack trace".into(),
            passed: reason_has("in the stack trace"),
            gap: "no top file is on the stack trace".into(),
            terms: frames
                .iter()
                .rev()
                .take(2)
                .map(|f| f.to_lowercase())
                .collect(),
        });
    }
    out
}

/// The search plan of the codebase search: the report's evidence, the investigator's
/// hypothesis and affected areas, and in a later round the evidence the critic asked for.
fn plan_for(s: &TriageState, ev: &Evidence, repo_files: &[String]) -> SearchPlan {
    let mut plan = SearchPlan::from_evidence(&s.issue_title, ev, repo_files);
    if let Some(i) = &s.investigator {
        // A hypothesis composed in code for a raise inside a check names the check's file,
        // which the plan deliberately weighs down: as a query it would undo that. Otherwise
        // (the model's, or one naming the innermost frame) it is one more query.
        let composed = s.field_checks.iter().any(|c| {
            c.agent == agent::INVESTIGATOR && c.field == "hypothesis" && c.source == "composed"
        });
        if !(composed && plan.raised_in_check) {
            plan.queries
                .insert(1.min(plan.queries.len()), i.hypothesis.clone());
        }
        for a in &i.affected_areas {
            if !plan.identifiers.contains(a) && !a.contains('/') && !a.contains(' ') {
                plan.identifiers.push(a.clone());
            }
        }
    }
    if s.round > 1 {
        if let Some(v) = s
            .critic_feedback
            .as_ref()
            .filter(|v| v.round + 1 == s.round)
        {
            for t in &v.required_evidence {
                plan.queries.push(t.clone());
            }
        }
    }
    plan
}

/// The supervisor's routing: the pipeline order within a round, agents that failed
/// [`MAX_AGENT_ATTEMPTS`] times skipped, the critic's gate deciding between the writer and a
/// new round (only when the gaps it named give the search something new to look for), the
/// iteration cap sending the run to the writer.
pub fn route(s: &TriageState) -> Routing {
    let decide = |next: &str, reason: String| Routing {
        iteration: s.iterations,
        round: s.round,
        next: next.to_string(),
        reason,
    };
    if s.writer.is_some() {
        return decide(agent::PUBLISH, "the writer produced the report".into());
    }
    let writer_failures = s.failures_in_round(agent::WRITER, s.round);
    if writer_failures >= MAX_AGENT_ATTEMPTS {
        return decide(
            agent::PUBLISH,
            format!("the writer failed {writer_failures} times; publishing what there is"),
        );
    }
    if s.iterations >= s.max_iterations {
        return decide(
            agent::WRITER,
            format!("iteration cap of {} reached", s.max_iterations),
        );
    }
    let mut pipeline = vec![agent::INVESTIGATOR];
    if s.round == 1 && !s.docs_dir.is_empty() {
        pipeline.push(agent::WEB_SEARCH);
    }
    pipeline.extend([agent::CODEBASE_SEARCH, agent::CRITIC]);
    for a in pipeline {
        if s.succeeded_in_round(a, s.round) {
            continue;
        }
        let failures = s.failures_in_round(a, s.round);
        if failures == 0 {
            return decide(a, format!("no {a} finding in round {} yet", s.round));
        }
        if failures < MAX_AGENT_ATTEMPTS {
            let last = s
                .runs_in_round(a, s.round)
                .last()
                .and_then(|r| r.error.clone())
                .unwrap_or_default();
            return decide(
                a,
                format!(
                    "{a} set its error field ({}); trying again",
                    clip(&last, 160)
                ),
            );
        }
    }
    match s.critic_feedback.as_ref().filter(|v| v.round == s.round) {
        Some(v) if v.verdict == Gate::Approved => {
            decide(agent::WRITER, "the critic approved the findings".into())
        }
        Some(v) if s.round < s.max_rounds => {
            let searched: Vec<String> = s.searched_terms.iter().map(|t| t.to_lowercase()).collect();
            let new: Vec<&String> = v
                .required_evidence
                .iter()
                .filter(|t| !searched.contains(&t.to_lowercase()))
                .collect();
            if new.is_empty() {
                decide(
                    agent::WRITER,
                    format!(
                        "the critic rejected the findings (gaps: {}), but a new round would search for nothing new; reporting with the open gaps",
                        if v.gaps.is_empty() { "none named".into() } else { v.gaps.join("; ") }
                    ),
                )
            } else {
                Routing {
                    round: s.round + 1,
                    ..decide(
                        agent::INVESTIGATOR,
                        format!(
                            "the critic rejected the findings (gaps: {}); round {} searches for {}",
                            v.gaps.join("; "),
                            s.round + 1,
                            new.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(", ")
                        ),
                    )
                }
            }
        }
        Some(_) => decide(
            agent::WRITER,
            format!("the critic rejected the findings but the {} rounds are used up; reporting with the open gaps", s.max_rounds),
        ),
        None => decide(
            agent::WRITER,
            "the critic gave no verdict this round; reporting what there is".into(),
        ),
    }
}

/// The messages of an agent call: one system message shared by every agent (the team and the
/// bug report, so the model's prefix cache computes it once per triage), then the agent's
/// role, the material, and the question last (calls with the same material share a longer
/// cached prefix).
fn agent_messages(s: &TriageState, role: &str, material: &str, question: &str) -> Vec<Message> {
    vec![
        Message::system(format!(
            "You are one agent of a bug-triage team. Answer only from the evidence given; \
             never invent names, files or people. The bug report under triage:\n\n\
             Title: {}\n\n{}",
            s.issue_title,
            clip(&s.issue_body, 2000)
        )),
        Message::human(format!("Role: {role}.\n\n{material}\nQuestion: {question}")),
    ]
}

/// The report's evidence as prompt material.
fn evidence_block(ev: &Evidence, frames_in_repo: &[String]) -> String {
    let mut t = String::new();
    if !ev.error_lines.is_empty() {
        t.push_str(&format!(
            "Error: {}\n",
            ev.error_lines
                .iter()
                .take(2)
                .cloned()
                .collect::<Vec<_>>()
                .join(" | ")
        ));
    }
    for f in ev.frames.iter().rev().take(3) {
        let func = f.function.as_deref().unwrap_or("?");
        let line = f.line.map(|l| format!(":{l}")).unwrap_or_default();
        let code = f
            .code
            .as_deref()
            .map(|c| format!(": {}", clip(c, 100)))
            .unwrap_or_default();
        t.push_str(&format!(
            "Frame: {func} at {}{line}{code}\n",
            short_path(&f.file)
        ));
    }
    if !frames_in_repo.is_empty() {
        t.push_str(&format!(
            "Repository files on the stack: {}\n",
            frames_in_repo.join(", ")
        ));
    }
    if !ev.identifiers.is_empty() {
        t.push_str(&format!(
            "Code names in the report: {}\n",
            ev.identifiers
                .iter()
                .take(8)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    t
}

/// The last two components of a reported path (`.../site-packages/pkg/mod.py` → `pkg/mod.py`).
fn short_path(p: &str) -> String {
    let parts: Vec<&str> = p.split(['/', '\\']).filter(|x| !x.is_empty()).collect();
    parts[parts.len().saturating_sub(2)..].join("/")
}

fn file_stem(p: &str) -> &str {
    let name = p.rsplit('/').next().unwrap_or(p);
    name.split('.').next().unwrap_or(name)
}

/// Whether the report mentions the file's stem as a word (`discounts` for `pkg/discounts.py`).
fn mentions_stem(body: &str, path: &str) -> bool {
    let stem = file_stem(path).to_lowercase();
    stem.len() >= 4
        && stem != "__init__"
        && body
            .to_lowercase()
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .any(|w| w == stem)
}

/// Content words of the title, as fallback keywords.
fn title_terms(title: &str) -> Vec<String> {
    title
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .filter(|w| w.len() >= 4)
        .map(str::to_lowercase)
        .filter(|w| {
            ![
                "when", "with", "from", "that", "this", "does", "into", "after",
            ]
            .contains(&w.as_str())
        })
        .take(6)
        .collect()
}

/// How strongly the report points at code, 0..1.
fn evidence_strength(ev: &Evidence, frames_in_repo: &[String]) -> f64 {
    let mut c: f64 = 0.3;
    if !ev.error_lines.is_empty() {
        c += 0.2;
    }
    if !frames_in_repo.is_empty() {
        c += 0.2;
    }
    if !ev.identifiers.is_empty() {
        c += 0.1;
    }
    c.min(0.8)
}

fn compose_hypothesis(s: &TriageState, ev: &Evidence, frames_in_repo: &[String]) -> String {
    let error = ev.error_lines.first().map(|e| clip(e, 120));
    let mut in_repo = ev.frames.iter().rev().filter(|f| {
        f.function.as_deref().is_some_and(|x| x != "<module>")
            && frames_in_repo.iter().any(|r| {
                r.ends_with(&short_path(&f.file)) || short_path(&f.file).ends_with(r.as_str())
            })
    });
    let inner = in_repo.next();
    let caller = in_repo.next();
    let at = |f: &Frame| {
        format!(
            "`{}` ({}{})",
            f.function.as_deref().unwrap_or("?"),
            short_path(&f.file),
            f.line.map(|l| format!(", line {l}")).unwrap_or_default()
        )
    };
    // A check that only raises refused a value its caller computed: the caller is the lead.
    if let (Some(check), Some(caller), Some(_)) = (inner, caller, &error) {
        if check
            .function
            .as_deref()
            .is_some_and(Evidence::is_check_function)
        {
            return format!(
                "{} only refuses the value; {}, which computed it, is the first suspect.",
                at(check),
                at(caller)
            );
        }
    }
    match (inner, &error) {
        (Some(f), Some(e)) => format!(
            "`{}` ({}{}) is on the failing path that ends in `{e}`; the values it computes there are the first suspect.",
            f.function.as_deref().unwrap_or("?"),
            short_path(&f.file),
            f.line.map(|l| format!(", line {l}")).unwrap_or_default()
        ),
        (None, Some(e)) => match ev.identifiers.first() {
            Some(id) => format!("The failure `{e}` involves `{id}`; how it handles this input is the first suspect."),
            None => format!("The failure `{e}` is the main lead; the code that raises it is the first suspect."),
        },
        (_, None) => match ev.identifiers.first() {
            Some(id) => format!(
                "The reported behaviour (\"{}\") involves `{id}`; how it handles this case is the first suspect.",
                clip(&s.issue_title, 100)
            ),
            None => format!(
                "The report names no code; the reported behaviour (\"{}\") is the only lead, so retrieval decides where to look.",
                clip(&s.issue_title, 100)
            ),
        },
    }
}

fn compose_file_reason(f: &super::retrieval::RankedFile) -> String {
    if f.signals.is_empty() {
        format!(
            "{} ranks high in the lexical and semantic search for the report",
            f.path
        )
    } else {
        format!("{} {}", f.path, f.signals.join(", "))
    }
}

fn compose_root_cause(
    location: &str,
    top: &str,
    explanation: &str,
    hypothesis: &str,
    code: Option<&CodebaseFinding>,
) -> String {
    let where_ = if location.is_empty() { top } else { location };
    let reason = code
        .and_then(|c| c.relevant_files.first())
        .map(|f| f.relevance_reason.clone())
        .unwrap_or_else(|| explanation.to_string());
    if where_.is_empty() {
        return format!("Not located in the code. Leading hypothesis: {hypothesis}");
    }
    format!(
        "The most likely location is {where_} ({}). Leading hypothesis: {}",
        clip(reason.trim_end_matches('.'), 200),
        whole_sentences(hypothesis, 240)
    )
}

/// Whether two texts say the same thing: most of the shorter one's words are in the other.
fn same_text(a: &str, b: &str) -> bool {
    let words = |t: &str| -> std::collections::HashSet<String> {
        t.split(|c: char| !c.is_alphanumeric() && c != '_')
            .filter(|w| w.len() > 2)
            .map(str::to_lowercase)
            .collect()
    };
    let (wa, wb) = (words(a), words(b));
    let small = wa.len().min(wb.len());
    small > 0 && wa.intersection(&wb).count() * 10 >= small * 8
}

/// An exception or warning class name (`ValueError`, `RuntimeWarning`): it names the
/// symptom, not the code, so it does not anchor a statement about the code.
fn is_exception_name(name: &str) -> bool {
    let last = name.rsplit(['.', ':']).next().unwrap_or(name);
    ["Error", "Exception", "Warning", "Panic"]
        .iter()
        .any(|s| last.ends_with(s))
}

/// At most `max` characters of `text`, cut after a whole sentence when there is one.
fn whole_sentences(text: &str, max: usize) -> String {
    let t = text.trim();
    if t.chars().count() <= max && (t.ends_with('.') || t.ends_with('!') || t.ends_with('?')) {
        return t.to_string();
    }
    let head: String = t.chars().take(max).collect();
    match head
        .rfind(". ")
        .or_else(|| head.ends_with('.').then(|| head.len() - 1))
    {
        Some(i) => head[..=i].to_string(),
        None => clip(t, max),
    }
}

fn compose_fix(location: &str, top: &str, ev: &Evidence) -> String {
    let where_ = if location.is_empty() { top } else { location };
    let what = match ev.error_lines.first() {
        Some(e) => format!(
            "so that the report's input no longer ends in `{}`",
            clip(e, 100)
        ),
        None => "so that it gives the behaviour the report expects".to_string(),
    };
    if where_.is_empty() {
        return format!("Locate the code behind the report first, then change it {what}, with a regression test built from the report.");
    }
    format!("Change the code at {where_} {what}, and add a regression test built from the report's reproduction.")
}

/// Lines of the reporter's reproduction copied into the report; a longer one is cut with a
/// note (the whole is in the issue).
const MAX_REPRO_STEPS: usize = 15;

/// The report's reproduction: the first lines of the code block under a heading or line
/// that mentions reproducing, else of the first code block that is not a traceback.
fn reproduction_steps(body: &str) -> Vec<Step> {
    let mut blocks: Vec<(bool, Vec<String>)> = Vec::new();
    let mut inside = false;
    let mut near_repro = false;
    let mut cur: Vec<String> = Vec::new();
    for l in body.lines() {
        let t = l.trim();
        if t.starts_with("```") {
            if inside {
                blocks.push((near_repro, std::mem::take(&mut cur)));
                near_repro = false;
            }
            inside = !inside;
            continue;
        }
        if inside {
            if !t.is_empty() {
                cur.push(t.to_string());
            }
        } else if t.to_lowercase().contains("reproduc") {
            near_repro = true;
        }
    }
    let pick = blocks
        .iter()
        .find(|(r, b)| *r && !b.is_empty())
        .or_else(|| {
            blocks
                .iter()
                .find(|(_, b)| !b.is_empty() && !b[0].starts_with("Traceback"))
        });
    pick.map(|(_, b)| {
        let lines: Vec<&String> = b.iter().filter(|l| !l.starts_with('#')).collect();
        let mut steps: Vec<Step> = lines
            .iter()
            .take(MAX_REPRO_STEPS)
            .map(|l| Step(clip(l, 150)))
            .collect();
        if lines.len() > MAX_REPRO_STEPS {
            steps.push(Step(format!(
                "… {} more line(s) in the report",
                lines.len() - MAX_REPRO_STEPS
            )));
        }
        steps
    })
    .unwrap_or_default()
}

/// The issue comment, composed from the checked fields.
fn compose_comment(
    s: &TriageState,
    r: &TriageReport,
    location: &str,
    files: &[&RelevantFile],
) -> String {
    let mut md = String::new();
    md.push_str(&format!("### Triage: {}\n\n", r.title));
    md.push_str(&format!("**Severity:** {}  \n", r.severity.as_str()));
    if !location.is_empty() {
        md.push_str(&format!("**Most likely location:** `{location}`\n\n"));
    }
    md.push_str(&format!("**Root cause.** {}\n\n", r.root_cause));
    if !files.is_empty() {
        md.push_str("**Files to look at:**\n");
        for f in files {
            md.push_str(&format!(
                "- `{}`: {}\n",
                f.path,
                clip(&f.relevance_reason, 160)
            ));
        }
        md.push('\n');
    }
    md.push_str(&format!("**Suggested fix.** {}\n", r.suggested_fix));
    if let Some(v) = s.critic_feedback.as_ref().filter(|v| !v.gaps.is_empty()) {
        md.push_str(&format!("\n**Open questions:** {}\n", v.gaps.join("; ")));
    }
    md
}

fn first_sentence(text: &str) -> &str {
    let t = text.trim_start_matches(|c: char| c == '#' || c.is_whitespace());
    let t = t.lines().find(|l| l.trim().len() > 20).unwrap_or(t);
    match t.find(". ") {
        Some(i) => &t[..=i],
        None => t,
    }
}

/// Lines of an issue body that look like error messages (for verbatim extraction).
pub fn error_lines(body: &str) -> Vec<String> {
    Evidence::extract("", body).error_lines
}

/// `text` cut to at most `max` characters (on a character boundary, with an ellipsis).
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        text.chars().take(max).collect::<String>() + "…"
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn run(agent: &str, round: u32, ok: bool) -> AgentRun {
        AgentRun {
            agent: agent.into(),
            round,
            ok,
            error: (!ok).then(|| "boom".to_string()),
            ..AgentRun::default()
        }
    }

    fn state() -> TriageState {
        TriageState {
            round: 1,
            max_rounds: 2,
            max_iterations: 12,
            docs_dir: "docs".into(),
            ..TriageState::default()
        }
    }

    fn verdict(gate: Gate, round: u32, required: &[&str]) -> CriticVerdict {
        CriticVerdict {
            verdict: gate,
            gaps: vec!["no repro".into()],
            required_evidence: required.iter().map(|s| s.to_string()).collect(),
            confidence: 0.5,
            round,
        }
    }

    #[test]
    fn supervisor_follows_the_pipeline_and_the_critics_gate() {
        let mut s = state();
        assert_eq!(route(&s).next, agent::INVESTIGATOR);
        s.agent_runs.push(run(agent::INVESTIGATOR, 1, true));
        assert_eq!(route(&s).next, agent::WEB_SEARCH);
        s.agent_runs.push(run(agent::WEB_SEARCH, 1, true));
        assert_eq!(route(&s).next, agent::CODEBASE_SEARCH);
        s.agent_runs.push(run(agent::CODEBASE_SEARCH, 1, true));
        s.searched_terms = vec!["apply_discounts".into()];
        assert_eq!(route(&s).next, agent::CRITIC);
        s.agent_runs.push(run(agent::CRITIC, 1, true));
        s.critic_feedback = Some(verdict(Gate::Rejected, 1, &["def lookup_code"]));
        let r = route(&s);
        assert_eq!((r.next.as_str(), r.round), (agent::INVESTIGATOR, 2));
        assert!(r.reason.contains("no repro") && r.reason.contains("def lookup_code"));
        s.round = 2;
        assert_eq!(route(&s).next, agent::INVESTIGATOR);
        s.agent_runs.push(run(agent::INVESTIGATOR, 2, true));
        // No docs search in later rounds.
        assert_eq!(route(&s).next, agent::CODEBASE_SEARCH);
        s.agent_runs.push(run(agent::CODEBASE_SEARCH, 2, true));
        assert_eq!(route(&s).next, agent::CRITIC);
        s.agent_runs.push(run(agent::CRITIC, 2, true));
        s.critic_feedback = Some(verdict(Gate::Rejected, 2, &["x"]));
        // Rounds used up: the writer reports with the gaps.
        assert_eq!(route(&s).next, agent::WRITER);
        s.critic_feedback = Some(verdict(Gate::Approved, 2, &[]));
        assert_eq!(route(&s).next, agent::WRITER);
    }

    #[test]
    fn a_round_that_would_search_for_nothing_new_is_not_run() {
        let mut s = state();
        s.docs_dir.clear();
        for a in [agent::INVESTIGATOR, agent::CODEBASE_SEARCH, agent::CRITIC] {
            s.agent_runs.push(run(a, 1, true));
        }
        s.searched_terms = vec!["def apply_discounts".into(), "invoice".into()];
        s.critic_feedback = Some(verdict(Gate::Rejected, 1, &["DEF apply_discounts"]));
        let r = route(&s);
        assert_eq!(r.next, agent::WRITER);
        assert!(r.reason.contains("nothing new"), "{}", r.reason);
        s.critic_feedback = Some(verdict(Gate::Rejected, 1, &[]));
        assert_eq!(route(&s).next, agent::WRITER);
    }

    #[test]
    fn an_agent_error_is_retried_then_skipped() {
        let mut s = state();
        s.docs_dir.clear();
        s.agent_runs.push(run(agent::INVESTIGATOR, 1, true));
        s.agent_runs.push(run(agent::CODEBASE_SEARCH, 1, false));
        let r = route(&s);
        assert_eq!(r.next, agent::CODEBASE_SEARCH);
        assert!(r.reason.contains("error field"));
        s.agent_runs.push(run(agent::CODEBASE_SEARCH, 1, false));
        assert_eq!(route(&s).next, agent::CRITIC);
        s.agent_runs.push(run(agent::CRITIC, 1, false));
        s.agent_runs.push(run(agent::CRITIC, 1, false));
        assert_eq!(route(&s).next, agent::WRITER);
        s.agent_runs.push(run(agent::WRITER, 1, false));
        assert_eq!(route(&s).next, agent::WRITER);
        s.agent_runs.push(run(agent::WRITER, 1, false));
        assert_eq!(route(&s).next, agent::PUBLISH);
    }

    #[test]
    fn the_iteration_cap_sends_the_run_to_the_writer() {
        let mut s = state();
        s.iterations = 12;
        assert_eq!(route(&s).next, agent::WRITER);
    }

    #[test]
    fn error_lines_are_found_verbatim() {
        let body = "It fails:\n```\nTraceback (most recent call last):\n  File \"x.py\", line 1\nValueError: invoice total cannot be negative: -12.50\n```\nerror: something\n";
        assert_eq!(
            error_lines(body),
            vec![
                "ValueError: invoice total cannot be negative: -12.50",
                "error: something"
            ]
        );
    }

    #[test]
    fn reproduction_comes_from_the_repro_block() {
        let body = "### Steps to reproduce\n\n```python\nfrom x import y\n# comment\ny(1)\n```\n\n```\nTraceback (most recent call last):\n```\n";
        let steps = reproduction_steps(body);
        assert_eq!(
            steps,
            vec![Step("from x import y".into()), Step("y(1)".into())]
        );
        // The steps that trigger the bug often come last: none is dropped.
        let fixture = include_str!("../../../tests/fixtures/triage/issue.md");
        let steps = reproduction_steps(fixture);
        assert_eq!(steps.len(), 8, "{steps:?}");
        assert!(steps
            .iter()
            .any(|s| s.0 == "invoice.apply_code(\"LOYAL50\")"));
        let long: String = (0..20).map(|i| format!("step({i})\n")).collect();
        let steps = reproduction_steps(&format!("```\n{long}```\n"));
        assert_eq!(steps.len(), MAX_REPRO_STEPS + 1);
        assert!(steps[MAX_REPRO_STEPS].0.contains("5 more line(s)"));
    }
}
