//! `ferrograph bench workflow tutor`: chat turns of the tutor on a local model (prefix cache
//! on, the index built and the model loaded before the clock starts): time to the first
//! streamed token, tokens per second of the answer, and the whole turn; then a two-question
//! quiz: time to the first question and per graded answer.

use anyhow::{Context, Result};
use ferrograph::prelude::*;
use ferrograph::runtime::{JsonInput, Workflow};
use ferrograph::{Resume, StreamMode, StreamModes};
use ferrograph_llm::{ChatModel, LocalChatModel};
use ferrograph_tutor::{course, TutorSettings, TutorState, TutorWorkflow};
use serde::Serialize;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// The questions asked, in order, on one thread.
const TURNS: [(&str, &str); 5] = [
    ("networks", "What is the difference between TCP and UDP?"),
    ("networks", "Explain the three-way handshake"),
    ("networks", "What does a router do with the TTL field?"),
    ("databases", "What is a foreign key?"),
    ("databases", "Why does a deadlock happen?"),
];

/// One measured turn.
#[derive(Debug, Serialize)]
pub struct TurnReport {
    /// The question.
    pub question: String,
    /// The tool the turn used.
    pub tool: String,
    /// From sending the message to the first token of the answer.
    pub first_token_ms: f64,
    /// The whole turn.
    pub total_ms: f64,
    /// Tokens the answer generated.
    pub answer_tokens: u32,
    /// Of the answer's prompt, tokens the prefix cache served.
    pub cached_prompt_tokens: u32,
    /// Answer tokens per second, from the first token to the last.
    pub tokens_per_s: f64,
    /// Whether the answer was replaced by the course material (rejected by the checks).
    pub fell_back: bool,
}

/// The bench.
#[derive(Debug, Serialize)]
pub struct TutorBench {
    /// Model file.
    pub model: String,
    /// Building the course index (MiniLM) before the turns.
    pub index_ms: f64,
    /// Loading the model and the first turn (not in the medians).
    pub warmup_ms: f64,
    /// The turns.
    pub turns: Vec<TurnReport>,
    /// Median time to the first token.
    pub median_first_token_ms: f64,
    /// Median answer tokens per second.
    pub median_tokens_per_s: f64,
    /// From "quiz me" to the first question.
    pub quiz_first_question_ms: f64,
    /// Per answer, to the next question or the summary.
    pub quiz_answer_ms: Vec<f64>,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the bench with the GGUF at `model`.
pub async fn bench_tutor(model: &Path) -> Result<TutorBench> {
    let dir = tempfile::tempdir()?;
    let llm: Arc<dyn ChatModel> = Arc::new(LocalChatModel::new(model));
    let ws = ferrograph::WorkflowSettings {
        data_dir: dir.path().to_path_buf(),
        max_steps: None,
        run_timeout: None,
        tool_timeout: None,
        llm: Some(llm),
        fallback_llm: None,
        ..Default::default()
    };
    let settings = TutorSettings::from_workflow_settings(&ws);
    let rt = Runtime::new().await?;
    let wf = TutorWorkflow::load(
        &rt,
        Arc::new(MemorySaver::new()),
        settings,
        course::minilm(),
    )
    .await?;
    let started = Instant::now();
    wf.course()
        .retriever()
        .await
        .context("building the course index")?;
    let index_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    turn(&wf, "warmup", "networks", "What is a port?").await?;
    let warmup_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut turns = Vec::new();
    for (subject, q) in TURNS {
        turns.push(turn(&wf, "bench", subject, q).await?);
    }
    // The quiz.
    let cfg = || RunConfig::thread("bench-quiz");
    let started = Instant::now();
    let mut o = wf
        .invoke(
            JsonInput::Update(
                json!({"subject": "networks", "message": "Quiz me on TCP with 2 questions"}),
            ),
            cfg(),
        )
        .await?;
    let quiz_first_question_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut quiz_answer_ms = Vec::new();
    while o.status == "interrupted" {
        let started = Instant::now();
        o = wf
            .invoke(JsonInput::Resume(Resume::value(json!("A"))), cfg())
            .await?;
        quiz_answer_ms.push(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok(TutorBench {
        model: model.display().to_string(),
        index_ms,
        warmup_ms,
        median_first_token_ms: median(turns.iter().map(|t| t.first_token_ms).collect()),
        median_tokens_per_s: median(turns.iter().map(|t| t.tokens_per_s).collect()),
        turns,
        quiz_first_question_ms,
        quiz_answer_ms,
    })
}

async fn turn(
    wf: &TutorWorkflow,
    thread: &str,
    subject: &str,
    question: &str,
) -> Result<TurnReport> {
    let started = Instant::now();
    let mut run = wf
        .start(
            JsonInput::Update(json!({ "subject": subject, "message": question })),
            RunConfig::thread(thread).stream(StreamModes::NONE.with(StreamMode::Tokens)),
        )
        .await?;
    let mut first = None;
    let mut last = started;
    while let Some(ev) = run.next_event().await {
        if ev.kind == "token" {
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
        }
    }
    let o = run.outcome().await?;
    let total = started.elapsed();
    let s: TutorState = serde_json::from_value(o.state)?;
    let answer = s.messages.last().context("no answer")?;
    let tool = s
        .messages
        .iter()
        .rev()
        .find(|m| !m.tool_calls.is_empty())
        .and_then(|m| m.tool_calls.first())
        .map(|c| c.name.clone())
        .unwrap_or_default();
    let usage = answer.usage.unwrap_or_default();
    let first = first.unwrap_or(last);
    let gen_s = last.duration_since(first).as_secs_f64();
    Ok(TurnReport {
        question: question.to_string(),
        tool,
        first_token_ms: first.duration_since(started).as_secs_f64() * 1e3,
        total_ms: total.as_secs_f64() * 1e3,
        answer_tokens: usage.completion_tokens,
        cached_prompt_tokens: usage.cached_prompt_tokens,
        tokens_per_s: if gen_s > 0.0 {
            f64::from(usage.completion_tokens.saturating_sub(1)) / gen_s
        } else {
            0.0
        },
        fell_back: answer.metadata.contains_key("fallback"),
    })
}

/// A Markdown summary.
pub fn summary(b: &TutorBench) -> String {
    let mut s = format!(
        "tutor on {} (course index built in {:.0} ms; model load and first turn {:.0} ms, not counted)\n\n",
        b.model, b.index_ms, b.warmup_ms
    );
    s.push_str("| question | tool | first token ms | turn ms | answer tokens | cached prompt tokens | tokens/s | answer |\n|---|---|---:|---:|---:|---:|---:|---|\n");
    for t in &b.turns {
        s.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {} | {} | {:.0} | {} |\n",
            t.question,
            t.tool,
            t.first_token_ms,
            t.total_ms,
            t.answer_tokens,
            t.cached_prompt_tokens,
            t.tokens_per_s,
            if t.fell_back {
                "replaced by the notes"
            } else {
                "model"
            }
        ));
    }
    s.push_str(&format!(
        "\nmedian first token {:.0} ms, median {:.0} tokens/s; quiz: first question after {:.0} ms, answers graded in {} ms\n",
        b.median_first_token_ms,
        b.median_tokens_per_s,
        b.quiz_first_question_ms,
        b.quiz_answer_ms
            .iter()
            .map(|m| format!("{m:.0}"))
            .collect::<Vec<_>>()
            .join(" / ")
    ));
    s
}
