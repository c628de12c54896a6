//! The five agents and the supervisor of the triage graph. Each is a graph node, so each
//! runs in its own supervised actor of the runtime and returns a typed state update.
//!
//! An agent whose model calls fail (after the retries and the one fallback) sets its error
//! field: it records the failed run, appends no finding, and the supervisor re-routes.

use super::llm::{constrain_to, AgentLlm};
use super::models::*;
use super::retrieval::{Retrieval, RetrievedChunk};
use super::state::{agent, AgentRun, LlmCall, Routing, TriageState, TriageStateUpdate};
use ferrograph::prelude::*;
use ferrograph_llm::TokenSink;
use ferrograph_tools::builtin::{SearchHit, SearchTool};
use ferrograph_tools::{ToolExecutor, ToolRegistry};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument as _;

/// Failed runs of one agent in one round before the supervisor moves on without it.
pub const MAX_AGENT_ATTEMPTS: usize = 2;

/// What the agents share.
pub struct Agents {
    /// The model calls (`None`: no model is configured; every agent reports that as its
    /// error).
    pub llm: Option<AgentLlm>,
    /// Indexes of repositories and docs.
    pub retrieval: Retrieval,
    /// Per docs-search call.
    pub tool_timeout: Duration,
}

/// What an agent returns before the bookkeeping: its update and the run record.
struct Outcome {
    update: TriageStateUpdate,
    calls: Vec<LlmCall>,
    tool_calls: u32,
    error: Option<String>,
}

impl Outcome {
    fn ok(update: TriageStateUpdate, calls: Vec<LlmCall>) -> Self {
        Outcome {
            update,
            calls,
            tool_calls: 0,
            error: None,
        }
    }

    fn failed(error: impl Into<String>, calls: Vec<LlmCall>) -> Self {
        Outcome {
            update: TriageStateUpdate::new(),
            calls,
            tool_calls: 0,
            error: Some(error.into()),
        }
    }
}

impl Agents {
    fn llm(&self) -> Result<&AgentLlm, String> {
        self.llm
            .as_ref()
            .ok_or_else(|| "no chat model is configured (see `ferrograph models`)".to_string())
    }

    /// Runs agent `name`: the bookkeeping every agent shares (span, timing, iteration count,
    /// run record, error field) around `body`.
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
            let sink = TokenSink::from_context(&ctx);
            let out = match name {
                agent::INVESTIGATOR => self.investigator(&s, sink).await,
                agent::WEB_SEARCH => self.web_search(&s, &ctx, sink).await,
                agent::CODEBASE_SEARCH => self.codebase_search(&s, sink).await,
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
                .emit_custom(&serde_json::json!({"event": "agent_run", "run": run}))
                .await;
            Ok(out
                .update
                .current_node(name.to_string())
                .iterations(s.iterations + 1)
                .agent_runs(vec![run]))
        }
        .instrument(span)
        .await
    }

    async fn investigator(&self, s: &TriageState, sink: Option<TokenSink>) -> Outcome {
        let llm = match self.llm() {
            Ok(l) => l,
            Err(e) => return Outcome::failed(e, vec![]),
        };
        let candidates = error_lines(&s.issue_body);
        let msgs = agent_messages(
            s,
            "investigator. State a precise hypothesis of the bug's root cause. Name concrete \
             modules or functions as affected areas. Keywords must be short terms likely to \
             appear in the source code. Copy error messages exactly as the report shows them. \
             Lower your confidence when the report is vague.",
            format!(
                "## Prior findings\n{}\n\nGive your hypothesis.",
                prior_findings(s)
            ),
        );
        let (res, call) = llm
            .structured::<InvestigatorOutput>(
                "hypothesis",
                &msgs,
                320,
                |schema| constrain_to(schema, "error_messages", &candidates),
                sink,
            )
            .await;
        match res {
            Ok(o) => {
                let f = InvestigatorFinding::from_output(o);
                let common = to_agent_finding(
                    &f.base,
                    f.hypothesis.clone(),
                    f.affected_areas.clone(),
                    s.round,
                );
                Outcome::ok(
                    TriageStateUpdate::new()
                        .investigator(Some(f))
                        .findings(vec![common]),
                    vec![call],
                )
            }
            Err(e) => Outcome::failed(e.to_string(), vec![call]),
        }
    }

    async fn web_search(
        &self,
        s: &TriageState,
        ctx: &NodeContext,
        sink: Option<TokenSink>,
    ) -> Outcome {
        let llm = match self.llm() {
            Ok(l) => l,
            Err(e) => return Outcome::failed(e, vec![]),
        };
        let docs = match self.retrieval.retriever(&s.docs_dir).await {
            Ok(r) => r,
            Err(e) => return Outcome::failed(format!("docs index: {e}"), vec![]),
        };
        let mut registry = ToolRegistry::new();
        if let Err(e) = registry
            .register(SearchTool::docs_search("offline docs", Arc::new(docs)).limits(5, 900))
        {
            return Outcome::failed(e.to_string(), vec![]);
        }
        let specs = registry.specs();
        let executor = ToolExecutor::new(registry).timeout(self.tool_timeout);
        let inv = s.investigator.as_ref();
        // Step 1: the model asks for searches.
        let ask = agent_messages(
            s,
            "docs researcher. Search the offline documentation corpus (library docs, \
             changelogs, known issues): call the docs_search tool with a short query that would \
             find documentation of the bug's cause or of its error message.",
            format!(
                "Hypothesis: {}\nKeywords: {}\nErrors: {}",
                inv.map(|i| i.hypothesis.as_str()).unwrap_or("none yet"),
                inv.map(|i| i.keywords_for_search.join(", "))
                    .unwrap_or_default(),
                inv.map(|i| i.error_messages.join(" | "))
                    .unwrap_or_default(),
            ),
        );
        let (req, call1) = llm
            .tool_request("tool_request", &ask, specs, 96, sink.clone())
            .await;
        let ai = match req {
            Ok(m) => m,
            Err(e) => return Outcome::failed(e.to_string(), vec![call1]),
        };
        let queries: Vec<String> = ai
            .tool_calls
            .iter()
            .filter_map(|c| {
                c.args
                    .0
                    .get("query")
                    .and_then(|q| q.as_str())
                    .map(str::to_string)
            })
            .collect();
        // Step 2: the tool node runs them (tool_start / tool_end events).
        let results = executor.execute(&ai.tool_calls, Some(ctx)).await;
        let tool_calls = ai.tool_calls.len() as u32;
        let mut hits: Vec<SearchHit> = Vec::new();
        let mut tool_errors = Vec::new();
        for m in &results {
            match serde_json::from_str::<Vec<SearchHit>>(&m.content) {
                Ok(h) => hits.extend(h),
                Err(_) => tool_errors.push(clip(&m.content, 200)),
            }
        }
        if hits.is_empty() {
            let mut out = Outcome::failed(
                format!(
                    "docs search found nothing{}",
                    if tool_errors.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", tool_errors.join("; "))
                    }
                ),
                vec![call1],
            );
            out.tool_calls = tool_calls;
            return out;
        }
        hits.sort_by(|a, b| b.score.total_cmp(&a.score));
        let mut sources: Vec<String> = Vec::new();
        for h in &hits {
            if !sources.contains(&h.source) {
                sources.push(h.source.clone());
            }
        }
        let context: String = hits
            .iter()
            .take(4)
            .map(|h| {
                format!(
                    "### {} ({:.2})\n{}\n",
                    h.source,
                    h.score,
                    clip(&h.text, 500)
                )
            })
            .collect();
        // Step 3: a separate structured call synthesises the finding.
        let synth = agent_messages(
            s,
            "docs researcher. Read the documentation passages found for this bug and state \
             what they say about its cause: a documented pitfall, a known issue, or nothing \
             relevant. Cite only the sources listed.",
            format!(
                "Hypothesis: {}\n\nSearch results:\n{context}",
                inv.map(|i| i.hypothesis.as_str()).unwrap_or("none yet"),
            ),
        );
        let (res, call2) = llm
            .structured::<WebSearchOutput>(
                "synthesis",
                &synth,
                320,
                |schema| constrain_to(schema, "relevant_sources", &sources),
                sink,
            )
            .await;
        let calls = vec![call1, call2];
        let o = match res {
            Ok(o) => o,
            Err(e) => {
                let mut out = Outcome::failed(e.to_string(), calls);
                out.tool_calls = tool_calls;
                return out;
            }
        };
        let relevant_results: Vec<WebResult> = o
            .relevant_sources
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
                summary: o.summary,
                confidence: o.confidence.clamp(0.0, 1.0),
                reasoning: o.reasoning,
                error: None,
            },
            external_root_cause: Some(o.external_root_cause).filter(|c| !c.trim().is_empty()),
            relevant_results,
            queries,
        };
        let common = to_agent_finding(
            &f.base,
            f.external_root_cause
                .clone()
                .unwrap_or_else(|| "No external root cause identified.".into()),
            f.relevant_results.iter().map(|r| r.url.clone()).collect(),
            s.round,
        );
        let mut out = Outcome::ok(
            TriageStateUpdate::new()
                .web_search(Some(f))
                .findings(vec![common]),
            calls,
        );
        out.tool_calls = tool_calls;
        out
    }

    async fn codebase_search(&self, s: &TriageState, sink: Option<TokenSink>) -> Outcome {
        let llm = match self.llm() {
            Ok(l) => l,
            Err(e) => return Outcome::failed(e, vec![]),
        };
        let inv = s.investigator.as_ref();
        let mut queries = vec![s.issue_title.clone()];
        if let Some(i) = inv {
            queries.push(i.hypothesis.clone());
            if !i.keywords_for_search.is_empty() {
                queries.push(i.keywords_for_search.join(" "));
            }
            queries.extend(i.error_messages.iter().cloned());
        }
        queries.extend(error_lines(&s.issue_body).into_iter().take(2));
        if let Some(c) = &s.critique {
            queries.extend(c.revised_hypothesis.iter().cloned());
            queries.extend(c.gaps.iter().take(2).cloned());
        }
        let chunks = match self
            .retrieval
            .search_repo(&s.repository, &queries, 10)
            .await
        {
            Ok(c) => c,
            Err(e) => return Outcome::failed(format!("repository index: {e}"), vec![]),
        };
        if chunks.is_empty() {
            return Outcome::failed("retrieval found no code in the repository", vec![]);
        }
        let mut files: Vec<(String, f32)> = Vec::new();
        for c in &chunks {
            if !files.iter().any(|(p, _)| p == &c.path) {
                files.push((c.path.clone(), c.score));
            }
        }
        let shown: Vec<&RetrievedChunk> = chunks.iter().take(5).collect();
        let locations: Vec<String> = shown.iter().map(|c| c.location()).collect();
        let paths: Vec<String> = files.iter().take(6).map(|(p, _)| p.clone()).collect();
        let context: String = shown
            .iter()
            .map(|c| {
                format!(
                    "### {} (score {:.2})\n{}\n",
                    c.location(),
                    c.score,
                    clip(&c.text, 600)
                )
            })
            .collect();
        let msgs = agent_messages(
            s,
            "code analyst. Given code retrieved from the repository by semantic search, say \
             which files are involved in the bug and which code region most likely holds the \
             root cause, and explain what is wrong there.",
            format!(
                "Hypothesis: {}\nKeywords: {}\n\nRetrieved code:\n{context}",
                inv.map(|i| i.hypothesis.as_str()).unwrap_or(&s.issue_title),
                inv.map(|i| i.keywords_for_search.join(", "))
                    .unwrap_or_default(),
            ),
        );
        let (res, call) = llm
            .structured::<CodebaseOutput>(
                "root_cause",
                &msgs,
                320,
                |schema| {
                    constrain_to(schema, "relevant_paths", &paths);
                    constrain_to(schema, "root_cause_location", &locations);
                },
                sink,
            )
            .await;
        let o = match res {
            Ok(o) => o,
            Err(e) => return Outcome::failed(e.to_string(), vec![call]),
        };
        // Local models are constrained to the retrieved paths and regions; a remote model
        // may ignore the constraint, so anything else is dropped here.
        let chosen: Vec<&String> = o
            .relevant_paths
            .iter()
            .filter(|p| paths.contains(p))
            .collect();
        let root_cause = Some(o.root_cause_location.clone()).filter(|l| locations.contains(l));
        let mut relevant: Vec<RelevantFile> = Vec::new();
        for (i, p) in chosen.into_iter().enumerate() {
            if relevant.iter().any(|r| &r.path == p) {
                continue;
            }
            let score = files
                .iter()
                .find(|(f, _)| f == p)
                .map(|(_, s)| *s)
                .unwrap_or(0.0);
            relevant.push(RelevantFile {
                path: p.clone(),
                relevance_reason: if i == 0 {
                    o.explanation.clone()
                } else {
                    "chosen by the model among the retrieved files".into()
                },
                source: "model".into(),
                score,
            });
        }
        for (p, score) in &files {
            if !relevant.iter().any(|r| &r.path == p) {
                let lines: Vec<String> = chunks
                    .iter()
                    .filter(|c| &c.path == p)
                    .map(|c| format!("{}-{}", c.start_line, c.end_line))
                    .collect();
                relevant.push(RelevantFile {
                    path: p.clone(),
                    relevance_reason: format!("retrieved (lines {})", lines.join(", ")),
                    source: "retrieval".into(),
                    score: *score,
                });
            }
        }
        let f = CodebaseFinding {
            base: FindingBase {
                agent_name: agent::CODEBASE_SEARCH.into(),
                summary: o.summary,
                confidence: o.confidence.clamp(0.0, 1.0),
                reasoning: o.explanation,
                error: None,
            },
            relevant_files: relevant,
            root_cause_location: root_cause,
            evidence: chunks
                .iter()
                .map(|c| format!("{} ({:.3})", c.location(), c.score))
                .collect(),
        };
        let common = to_agent_finding(
            &f.base,
            f.root_cause_location
                .clone()
                .unwrap_or_else(|| "Root cause location not identified.".into()),
            f.relevant_files.iter().map(|r| r.path.clone()).collect(),
            s.round,
        );
        Outcome::ok(
            TriageStateUpdate::new()
                .codebase(Some(f))
                .findings(vec![common]),
            vec![call],
        )
    }

    async fn critic(&self, s: &TriageState, sink: Option<TokenSink>) -> Outcome {
        let llm = match self.llm() {
            Ok(l) => l,
            Err(e) => return Outcome::failed(e, vec![]),
        };
        let hypothesis = s
            .critique
            .as_ref()
            .and_then(|c| c.revised_hypothesis.clone())
            .or_else(|| s.investigator.as_ref().map(|i| i.hypothesis.clone()))
            .unwrap_or_else(|| s.issue_title.clone());
        let evidence = s
            .codebase
            .as_ref()
            .map(|c| {
                c.evidence
                    .iter()
                    .take(5)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_else(|| "none".into());
        let msgs = agent_messages(
            s,
            "critic. Challenge the findings strictly: CONFIRMED means coherent, backed by code \
             evidence and enough to file a ticket; UNCERTAIN means plausible but without direct \
             evidence; CHALLENGED means speculative or contradictory. List the gaps you see.",
            format!(
                "## Hypothesis\n{hypothesis}\n\n## Findings\n{}\n\n## Code evidence\n{evidence}\n\nGive your verdict.",
                findings_text(s, 6)
            ),
        );
        let (res, call) = llm
            .structured::<CritiqueOutput>("critique", &msgs, 320, |_| {}, sink)
            .await;
        let o = match res {
            Ok(o) => o,
            Err(e) => return Outcome::failed(e.to_string(), vec![call]),
        };
        let f = CritiqueFinding {
            base: FindingBase {
                agent_name: agent::CRITIC.into(),
                summary: o.summary,
                confidence: o.confidence.clamp(0.0, 1.0),
                reasoning: format!("verdict {:?}", o.verdict),
                error: None,
            },
            verdict: o.verdict,
            confidence_adjustment: o.confidence_adjustment.clamp(-1.0, 1.0),
            gaps: o.gaps.into_iter().map(|g| g.0).collect(),
            revised_hypothesis: o.revised_hypothesis.filter(|h| !h.trim().is_empty()),
            ready_for_report: o.ready_for_report,
        };
        let verdict = map_critique_to_verdict(&f, s.round);
        let details = f
            .revised_hypothesis
            .clone()
            .unwrap_or_else(|| format!("Verdict: {:?}. Gaps: {}", f.verdict, f.gaps.join("; ")));
        let common = to_agent_finding(&f.base, details, f.gaps.clone(), s.round);
        Outcome::ok(
            TriageStateUpdate::new()
                .critique(Some(f))
                .critic_feedback(Some(verdict.clone()))
                .critic_history(vec![verdict])
                .findings(vec![common]),
            vec![call],
        )
    }

    async fn writer(&self, s: &TriageState, sink: Option<TokenSink>) -> Outcome {
        let llm = match self.llm() {
            Ok(l) => l,
            Err(e) => return Outcome::failed(e, vec![]),
        };
        let files: Vec<String> = s
            .codebase
            .as_ref()
            .map(|c| {
                c.relevant_files
                    .iter()
                    .take(4)
                    .map(|f| f.path.clone())
                    .collect()
            })
            .unwrap_or_default();
        let findings = findings_text(s, 8);
        let gate = match &s.critic_feedback {
            Some(v) => format!("{:?} (confidence {:.2})", v.verdict, v.confidence),
            None => "no verdict".into(),
        };
        let header = format!(
            "Issue source: {}\nRepository: {}\nCritic: {gate}\n\nFindings:\n{findings}",
            s.issue_url, s.repository
        );
        let report_msgs = agent_messages(
            s,
            "writer. Write a concise, factual triage report from the findings. Severity is \
             CRITICAL, HIGH, MEDIUM or LOW.",
            header.clone(),
        );
        let comment_msgs = agent_messages(
            s,
            "writer. Write the issue comment of the triage: professional and short, in \
             Markdown, with a root-cause summary, the affected files and next steps.",
            header.clone(),
        );
        let ticket_msgs = agent_messages(
            s,
            "writer. Fill in the bug-ticket fields: a short title, a few labels, the likely \
             owner if the findings name one, and an effort estimate (XS, S, M, L or XL).",
            header,
        );
        // Three sub-calls at once; the model actor serves them in turn (fair queue).
        let ((report, c1), (comment, c2), (ticket, c3)) = tokio::join!(
            llm.structured::<TriageReport>(
                "report",
                &report_msgs,
                400,
                |schema| constrain_to(schema, "affected_files", &files),
                sink.clone()
            ),
            llm.text("comment", &comment_msgs, 200, sink.clone()),
            llm.structured::<TicketFields>("ticket", &ticket_msgs, 160, |_| {}, sink),
        );
        let calls = vec![c1, c2, c3];
        match (report, comment, ticket) {
            (Ok(r), Ok(c), Ok(t)) => {
                let w = merge_writer_outputs(r, c, t);
                let common = to_agent_finding(&w.base, w.base.summary.clone(), vec![], s.round);
                Outcome::ok(
                    TriageStateUpdate::new()
                        .writer(Some(w))
                        .findings(vec![common]),
                    calls,
                )
            }
            (r, c, t) => {
                let errs: Vec<String> = [
                    r.err().map(|e| format!("report: {e}")),
                    c.err().map(|e| format!("comment: {e}")),
                    t.err().map(|e| format!("ticket: {e}")),
                ]
                .into_iter()
                .flatten()
                .collect();
                Outcome::failed(errs.join("; "), calls)
            }
        }
    }
}

/// The supervisor's routing: the pipeline order within a round, agents that failed
/// [`MAX_AGENT_ATTEMPTS`] times skipped, the critic's gate deciding between the writer and a
/// new round, the iteration cap sending the run to the writer.
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
        Some(v) if s.round < s.max_rounds => Routing {
            round: s.round + 1,
            ..decide(
                agent::INVESTIGATOR,
                format!(
                    "the critic rejected the findings (gaps: {}); starting round {}",
                    if v.gaps.is_empty() { "none named".into() } else { v.gaps.join("; ") },
                    s.round + 1
                ),
            )
        },
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
/// role and material.
fn agent_messages(s: &TriageState, role: &str, material: String) -> Vec<Message> {
    vec![
        Message::system(format!(
            "You are one agent of an automated bug-triage team: an investigator, a docs \
             researcher, a code analyst, a critic and a writer. The bug report under triage:\n\n\
             Title: {}\n\n{}",
            s.issue_title,
            clip(&s.issue_body, 2400)
        )),
        Message::human(format!("Your role: {role}\n\n{material}")),
    ]
}

/// Lines of an issue body that look like error messages (for verbatim extraction).
pub fn error_lines(body: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in body.lines() {
        let t = line.trim().trim_start_matches('>').trim();
        let looks = t.contains("Error:")
            || t.contains("Exception:")
            || t.starts_with("error:")
            || t.starts_with("error[")
            || t.contains("panicked at");
        if looks && t.len() <= 240 && !out.iter().any(|o| o == t) {
            out.push(t.to_string());
        }
        if out.len() == 8 {
            break;
        }
    }
    out
}

fn prior_findings(s: &TriageState) -> String {
    let mut text = findings_text(s, 6);
    if let Some(v) = &s.critic_feedback {
        if !v.gaps.is_empty() {
            text.push_str(&format!("\nThe reviewer asked for: {}", v.gaps.join("; ")));
        }
    }
    text
}

fn findings_text(s: &TriageState, most: usize) -> String {
    if s.findings.is_empty() {
        return "none".into();
    }
    let skip = s.findings.len().saturating_sub(most);
    s.findings[skip..]
        .iter()
        .map(|f| {
            format!(
                "- {} (round {}, confidence {:.2}): {} | {} | {}",
                f.agent_name,
                f.round,
                f.confidence,
                clip(&f.summary, 160),
                clip(&f.details, 200),
                f.relevant_files
                    .iter()
                    .take(4)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
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

    fn verdict(gate: Gate, round: u32) -> CriticVerdict {
        CriticVerdict {
            verdict: gate,
            gaps: vec!["no repro".into()],
            required_evidence: vec![],
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
        assert_eq!(route(&s).next, agent::CRITIC);
        s.agent_runs.push(run(agent::CRITIC, 1, true));
        s.critic_feedback = Some(verdict(Gate::Rejected, 1));
        let r = route(&s);
        assert_eq!((r.next.as_str(), r.round), (agent::INVESTIGATOR, 2));
        assert!(r.reason.contains("no repro"));
        s.round = 2;
        assert_eq!(route(&s).next, agent::INVESTIGATOR);
        s.agent_runs.push(run(agent::INVESTIGATOR, 2, true));
        // No docs search in later rounds.
        assert_eq!(route(&s).next, agent::CODEBASE_SEARCH);
        s.agent_runs.push(run(agent::CODEBASE_SEARCH, 2, true));
        assert_eq!(route(&s).next, agent::CRITIC);
        s.agent_runs.push(run(agent::CRITIC, 2, true));
        s.critic_feedback = Some(verdict(Gate::Rejected, 2));
        // Rounds used up: the writer reports with the gaps.
        assert_eq!(route(&s).next, agent::WRITER);
        s.critic_feedback = Some(verdict(Gate::Approved, 2));
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
}
