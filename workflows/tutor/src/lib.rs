//! The `tutor` workflow: seed 002's tutoring chatbot, offline. One thread per student; each run
//! is one turn of the conversation.
//!
//! ```text
//! START → think ─┬─ rag_search ───→ think   (search the subject's notes)
//!                ├─ get_guia ─────→ think   (the subject's course guide)
//!                ├─ tool_error ───→ think   (a tool name nobody handles)
//!                ├─ test_session ─→ END     (the quiz subgraph, one interrupt per question)
//!                └─ END                     (an answer)
//! ```
//!
//! - `think` classifies the question (basic / intermediate / advanced; unclassified is
//!   intermediate) and calls the model with that level's prompt, which names the subject, and
//!   the three tools bound. The first round of a turn must pick a tool; later rounds may answer
//!   or call again, up to [`TutorSettings::max_tool_rounds`], after which the tools are
//!   unbound. An advanced answer's `<thinking>` section goes to the `thinking` field, not into
//!   the answer. An answer a person would reject (empty, repetitive) is replaced by the notes'
//!   passages, said as such.
//! - Routing follows the first tool call's name. Every tool call of the message gets its tool
//!   message with its call id, also those the routed node does not run; an unknown name is a
//!   tool error message, not a failure.
//! - Per-thread memory: the messages rule appends; the turn's `context` and `tool_rounds` are
//!   reset by each turn's input; the subject overwrites. When the history grows past
//!   [`TutorSettings::keep_chars`], the oldest turns are removed with the message-removal rule
//!   and a one-line note of each is kept in `earlier_turns`, which the prompt carries.

pub mod clean;
pub mod course;
pub mod prompts;
pub mod quiz;
pub mod state;
pub mod text;

use async_trait::async_trait;
use course::CourseIndex;
use ferrograph::chat::{ChatModel, GenerateOptions, TokenSink, ToolChoice};
use ferrograph::core::{MessageOp, MessagesUpdate, Role, ToolCall, ToolStatus};
use ferrograph::prelude::*;
use ferrograph::runtime::{JsonInput, JsonOutcome, JsonRun, JsonSnapshot, Workflow, WorkflowInfo};
use ferrograph::{CheckpointSaver, CompileError, MappedSubgraph, WorkflowSettings};
use prompts::{GENERATE_TEST, GET_GUIA, RAG_SEARCH};
use serde_json::{json, Value};
pub use state::{QuizRecord, QuizState, TutorState, TutorStateUpdate};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use text::{clip, split_thinking, unusable, Difficulty};

/// Limits and parts of the tutor.
#[derive(Clone)]
pub struct TutorSettings {
    /// The course folder (one subfolder per subject).
    pub course_dir: PathBuf,
    /// Where the course index is kept.
    pub index_dir: PathBuf,
    /// The chat model.
    pub llm: Option<Arc<dyn ChatModel>>,
    /// Tool rounds per turn; at the limit the model must answer. The first round must call a
    /// tool; later ones may (a model of 135M parameters answers better with no tools bound,
    /// hence 1 by default).
    pub max_tool_rounds: u32,
    /// Decides the first round's tool from the student's words instead of asking the model
    /// (see [`route_by_words`]). On by default: SmolLM2-135M chose the course guide for
    /// questions about the subject and for quiz requests alike, and its routing call cost about
    /// a second per turn. Turn it off for a model that routes well.
    pub routing_guard: bool,
    /// Per search of the notes (the seed's RAG timeout).
    pub rag_timeout: Duration,
    /// Passages per search.
    pub rag_k: usize,
    /// Tokens of an answer.
    pub answer_tokens: usize,
    /// The model's context window used for a prompt.
    pub max_context: usize,
    /// Characters of earlier turns kept in the thread before the oldest are trimmed.
    pub keep_chars: usize,
    /// Characters of earlier turns put into a prompt.
    pub prompt_history_chars: usize,
}

impl TutorSettings {
    /// Settings from the shared workflow settings: the course under
    /// `<data dir>/tutor/course` (the built-in one, written on first use).
    pub fn from_workflow_settings(w: &WorkflowSettings) -> Self {
        TutorSettings {
            course_dir: w.data_dir.join("tutor").join("course"),
            index_dir: w.data_dir.join("tutor").join("index"),
            llm: w.llm_for("tutor"),
            max_tool_rounds: 1,
            routing_guard: true,
            rag_timeout: w.tool_timeout.unwrap_or(Duration::from_secs(20)),
            rag_k: 2,
            answer_tokens: 200,
            max_context: 2048,
            keep_chars: 6000,
            prompt_history_chars: 600,
        }
    }
}

struct Shared {
    settings: TutorSettings,
    course: Arc<CourseIndex>,
}

impl Shared {
    fn llm(&self) -> Result<Arc<dyn ChatModel>, NodeError> {
        self.settings.llm.clone().ok_or_else(|| {
            NodeError::fatal(
                "the tutor needs a chat model (FERROGRAPH_MODEL=none turned it off; fetch the default with `ferrograph models fetch`)",
            )
        })
    }
}

/// The last human message's position and text.
fn current_question(messages: &[Message]) -> Option<(usize, &str)> {
    messages
        .iter()
        .rposition(|m| m.role == Role::Human)
        .map(|i| (i, messages[i].content.as_str()))
}

/// The message whose tool calls are being answered: the last AI message.
fn last_ai(messages: &[Message]) -> Option<&Message> {
    messages.iter().rev().find(|m| m.role == Role::Ai)
}

/// A tool message for a call that the routed node does not run.
fn not_run(tc: &ToolCall, routed: &str) -> Message {
    let known = [RAG_SEARCH, GET_GUIA, GENERATE_TEST];
    if known.contains(&tc.name.as_str()) {
        Message::tool(
            tc,
            ToolStatus::Error,
            format!(
                "Not run: this round ran {routed}. Call {} again if it is still needed.",
                tc.name
            ),
        )
    } else {
        Message::tool(
            tc,
            ToolStatus::Error,
            format!(
                "Unknown tool `{}`: the tools are {}.",
                tc.name,
                known.join(", ")
            ),
        )
    }
}

/// Earlier turns (human message to the next one), oldest first.
fn turns(messages: &[Message]) -> Vec<&[Message]> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, m) in messages.iter().enumerate() {
        if m.role == Role::Human && i > start {
            out.push(&messages[start..i]);
            start = i;
        }
    }
    if start < messages.len() {
        out.push(&messages[start..]);
    }
    out
}

fn turn_chars(t: &[Message]) -> usize {
    t.iter().map(|m| m.content.len()).sum()
}

/// A turn's question and final answer (tool traffic left out).
fn turn_pair(t: &[Message]) -> (Option<&Message>, Option<&Message>) {
    let q = t.iter().find(|m| m.role == Role::Human);
    let a = t
        .iter()
        .rev()
        .find(|m| m.role == Role::Ai && m.tool_calls.is_empty() && !m.content.is_empty());
    (q, a)
}

/// The first round's tool call decided by the student's words, without asking the model: a
/// message that asks for a quiz starts one (topic and number of questions read from the
/// words), one about exams, grades or the schedule reads the guide, anything else searches the
/// notes with the message as the query. Used when [`TutorSettings::routing_guard`] is on.
pub fn route_by_words(question: &str) -> ToolCall {
    match text::intent(question) {
        Some(text::Intent::Quiz) => {
            let (topic, n) = text::quiz_request(question);
            ToolCall::new(
                GENERATE_TEST,
                json!({ "topic": topic, "num_questions": n.unwrap_or(3) }),
            )
        }
        Some(text::Intent::Guide) => ToolCall::new(GET_GUIA, json!({})),
        None => ToolCall::new(RAG_SEARCH, json!({ "query": question })),
    }
}

async fn think(
    sh: &Shared,
    s: &TutorState,
    ctx: &NodeContext,
) -> Result<TutorStateUpdate, NodeError> {
    let llm = sh.llm()?;
    if s.subject.is_empty() {
        let all = course::subjects(sh.course.course_dir()).unwrap_or_default();
        return Err(NodeError::fatal(format!(
            "no subject: start the conversation with one ({})",
            all.join(", ")
        )));
    }
    course::ensure_builtin(sh.course.course_dir())
        .and_then(|()| course::check_subject(sh.course.course_dir(), &s.subject))
        .map_err(|e| NodeError::fatal(e.to_string()))?;
    let Some((turn_start, question)) = current_question(&s.messages) else {
        return Err(NodeError::fatal(
            "no question: the turn has no message from the student",
        ));
    };
    let classified = text::classify(question);
    let level = classified.unwrap_or(Difficulty::Intermediate);
    let upd = TutorStateUpdate::new().query_difficulty(Some(level.as_str().to_string()));
    let mut ops: Vec<MessageOp> = Vec::new();

    // Memory: trim the oldest turns once the thread holds too much, keeping a note of each.
    let earlier = turns(&s.messages[..turn_start]);
    let mut total: usize = earlier.iter().map(|t| turn_chars(t)).sum();
    let mut kept = earlier.as_slice();
    let mut notes = Vec::new();
    if s.tool_rounds == 0 {
        while total > sh.settings.keep_chars && kept.len() > 1 {
            let t = kept[0];
            total -= turn_chars(t);
            let (q, a) = turn_pair(t);
            notes.push(format!(
                "asked \"{}\"; answered \"{}\"",
                clip(q.map(|m| m.content.as_str()).unwrap_or(""), 80),
                clip(a.map(|m| m.content.as_str()).unwrap_or("(no answer)"), 100)
            ));
            ops.extend(t.iter().map(|m| MessageOp::remove(m.id.clone())));
            kept = &kept[1..];
        }
    }

    let rounds = s.tool_rounds;
    let first_round = rounds == 0 && sh.settings.max_tool_rounds > 0;
    if first_round && sh.settings.routing_guard {
        // The route from the words: no model call and no prompt (see `route_by_words`).
        let m = Message::ai_with_tools("", vec![route_by_words(question)])
            .with_metadata("routed_by", "words");
        ops.push(MessageOp::Upsert { message: m });
        return Ok(upd
            .messages(MessagesUpdate(ops))
            .tool_rounds(rounds + 1)
            .earlier_turns(notes));
    }

    // The prompt: the level's system prompt and what earlier turns were about, the last
    // turns that fit, then the notes found in this turn with the question.
    let mut system = prompts::system(&s.subject);
    let all_notes: Vec<&String> = s.earlier_turns.iter().chain(notes.iter()).collect();
    if !all_notes.is_empty() {
        system.push_str("\nEarlier in this conversation the student ");
        let last: Vec<String> = all_notes
            .iter()
            .rev()
            .take(3)
            .rev()
            .map(|n| n.to_string())
            .collect();
        system.push_str(&last.join("; "));
        system.push('.');
    }
    let tool_results: Vec<&Message> = s.messages[turn_start..]
        .iter()
        .filter(|m| m.role == Role::Tool)
        .collect();
    // What the tools found goes with the question, not into the system prompt: the system
    // prompt and the earlier turns then stay the same from turn to turn, and the model's
    // prefix cache serves them (see `Engine::start_state`).
    let mut found = String::new();
    if !tool_results.is_empty() {
        found.push_str("From the course:\n");
        for m in &tool_results {
            found.push_str(&m.content);
            found.push('\n');
        }
        found.push('\n');
    }
    let mut msgs = vec![Message::system(system)];
    let mut history: Vec<Message> = Vec::new();
    let mut budget = sh.settings.prompt_history_chars;
    for t in kept.iter().rev() {
        let (q, a) = turn_pair(t);
        let (Some(q), Some(a)) = (q, a) else { continue };
        let n = q.content.len() + a.content.len();
        if n > budget {
            break;
        }
        budget -= n;
        history.insert(0, Message::ai(a.content.clone()));
        history.insert(0, Message::human(q.content.clone()));
    }
    msgs.extend(history);
    // Loops of the same phrase are the failure a small model falls into most.
    let mut opts = GenerateOptions::greedy()
        .max_tokens(sh.settings.answer_tokens)
        .max_context(sh.settings.max_context)
        .no_repeat_ngram(6)
        // A small model goes on to write the next question of the prompt's format itself.
        .stop("\nQuestion:")
        .stop("\nFrom the course:");
    if first_round {
        msgs.push(Message::human(format!(
            "{question}\n\n({})",
            prompts::route_hint()
        )));
        opts.tools = prompts::tools();
        opts.tool_choice = ToolChoice::Required;
        opts.max_tokens = 96;
    } else {
        msgs.push(Message::human(format!(
            "{found}Question: {question}\n{}",
            prompts::level_instruction(level)
        )));
        if rounds < sh.settings.max_tool_rounds {
            opts.tools = prompts::tools();
            opts.tool_choice = ToolChoice::Auto;
        }
    }
    // The routing call is not shown; the answer is streamed token by token.
    let sink = if first_round {
        None
    } else {
        TokenSink::from_context(ctx)
    };
    let answer = llm
        .invoke(&msgs, &opts, sink)
        .await
        .map_err(|e| NodeError::failed(format!("the chat model failed: {e}")))?;
    if !answer.tool_calls.is_empty() {
        let mut m = Message::ai_with_tools(answer.content.clone(), answer.tool_calls.clone());
        m.usage = answer.usage;
        ops.push(MessageOp::Upsert { message: m });
        return Ok(upd
            .messages(MessagesUpdate(ops))
            .tool_rounds(rounds + 1)
            .earlier_turns(notes));
    }
    let (thinking, mut said) = if level == Difficulty::Advanced {
        split_thinking(&answer.content)
    } else {
        (None, answer.content.trim().to_string())
    };
    // What the checks change is recorded on the message, for whoever shows it; several
    // edits of one kind are listed together.
    let mut edits: Vec<(&str, String)> = Vec::new();
    let mut edit =
        |key: &'static str, value: String| match edits.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => {
                v.push_str("; ");
                v.push_str(&value);
            }
            None => edits.push((key, value)),
        };
    if answer.finish_reason.as_deref() == Some("length") {
        // Cut off by the token limit: end at the last full sentence.
        let whole = text::whole_sentences(&said);
        if whole != said {
            edit("cut", "at the last full sentence".into());
        }
        said = whole;
    }
    // The prompt's own scaffolding echoed back (a source marker, "Question: ...").
    said = text::strip_scaffolding(&said);
    // Headings in a chat answer are the model imitating the notes ("### What is regex?").
    if said.lines().any(|l| l.trim_start().starts_with('#')) {
        said = said
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
            .trim()
            .to_string();
    }
    // A loop or a garbled sentence ends the answer there, when what comes before stands.
    let (before, degenerated) = text::before_degenerate(&said);
    if degenerated && unusable(&before).is_none() {
        edit("cut", "where it started repeating itself".into());
        said = before;
    }
    // What this turn's tools returned: the only sources an answer may state facts from.
    let sources: String = tool_results
        .iter()
        .filter(|m| m.tool_status == Some(ToolStatus::Success))
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    // What the answer may state: this turn's sources and the subject's own material.
    let allowed = if sources.is_empty() {
        String::new()
    } else {
        format!("{sources}\n{}", sh.course.material(&s.subject))
    };
    if !allowed.is_empty() {
        let (kept, dropped) = text::split_invented_names(&said, &allowed);
        if !dropped.is_empty() {
            edit("removed", dropped.join(", "));
        }
        said = kept;
    }
    // Sentences the sources do not back end the answer; when the first is one, the whole
    // answer is replaced below.
    let mut unbacked = None;
    if !allowed.is_empty() {
        if let Some((i, sentence)) = text::unbacked_sentence(&said, &allowed) {
            if i > 0 {
                let kept: String = text::sentence_pieces(&said)[..i].concat();
                edit(
                    "cut",
                    format!(
                        "at a sentence the notes do not back: \"{}\"",
                        clip(&sentence, 80)
                    ),
                );
                said = kept.trim_end().to_string();
            } else {
                unbacked = Some(format!(
                    "\"{}\" is not what the notes say",
                    clip(&sentence, 80)
                ));
            }
        }
    }
    let rejected = unbacked.or_else(|| unusable(&said)).or_else(|| {
        (!allowed.is_empty())
            .then(|| {
                text::unsupported(&said, &allowed)
                    .or_else(|| text::invented_identifier(&said, &allowed))
            })
            .flatten()
    });
    let mut reply = Message::ai(said.clone());
    for (key, value) in edits {
        reply = reply.with_metadata(key, value);
    }
    if let Some(why) = rejected {
        // Not something to show a student: say so, and give what the notes say.
        tracing::info!(reason = %why, "the model's answer was unusable; answering with the notes");
        // A definition asked of a note's subject: the note's own opening sentences.
        let lead: Vec<String> = text::defined_name(question)
            .and_then(|name| sh.course.lead(&s.subject, &name, 450))
            .map(|c| {
                text::sentences(&c.text)
                    .into_iter()
                    .take(2)
                    .map(|l| format!("- {l} (from {})", c.source()))
                    .collect()
            })
            .unwrap_or_default();
        let mut notes_text: Vec<String> = text::relevant_lines(question, &sources, 4)
            .into_iter()
            .map(|l| {
                format!(
                    "- {}",
                    l.trim_start_matches(['-', '*', ' ']).replace("**", "")
                )
            })
            .collect();
        if !lead.is_empty() {
            notes_text = lead;
        }
        if notes_text.is_empty() {
            notes_text = s
                .context
                .iter()
                .take(2)
                .map(|c| {
                    format!(
                        "- {} (from {})",
                        clip(&c.text.replace('\n', " ").replace("**", ""), 300),
                        c.source()
                    )
                })
                .collect();
        }
        if notes_text.is_empty() {
            // The guide, or whatever else this turn's tools returned.
            notes_text = tool_results
                .iter()
                .filter(|m| m.tool_status == Some(ToolStatus::Success))
                .map(|m| format!("- {}", clip(&m.content, 600)))
                .collect();
        }
        let text = if notes_text.is_empty() {
            "I could not write a good answer to that. Try asking about a topic of the course, or ask for the course guide.".to_string()
        } else {
            format!(
                "That answer was not reliable ({why}), so here is what the course material says:\n{}",
                notes_text.join("\n")
            )
        };
        reply = Message::ai(text)
            .with_metadata("fallback", "notes")
            .with_metadata("rejected", why);
    }
    reply.usage = answer.usage;
    ops.push(MessageOp::Upsert { message: reply });
    Ok(upd
        .messages(MessagesUpdate(ops))
        .thinking(thinking)
        .earlier_turns(notes))
}

async fn rag_search(sh: &Shared, s: &TutorState) -> Result<TutorStateUpdate, NodeError> {
    let Some(ai) = last_ai(&s.messages) else {
        return Ok(TutorStateUpdate::new());
    };
    let question = current_question(&s.messages).map(|(_, q)| q).unwrap_or("");
    let mut context = s.context.clone();
    let mut out = Vec::new();
    // The index is built (or refreshed) before the clock starts: the timeout is the search's.
    let ready = sh.course.retriever().await;
    // "What is X?" where a note is named X: that note's opening comes first.
    let lead = text::defined_name(question).and_then(|name| sh.course.lead(&s.subject, &name, 450));
    for tc in &ai.tool_calls {
        if tc.name != RAG_SEARCH {
            out.push(not_run(tc, RAG_SEARCH));
            continue;
        }
        let query = tc
            .args
            .0
            .get("query")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|q| !q.is_empty())
            .unwrap_or(question)
            .to_string();
        if let Err(e) = &ready {
            out.push(Message::tool(
                tc,
                ToolStatus::Error,
                format!("The notes could not be searched: {e}"),
            ));
            continue;
        }
        let limit = sh.settings.rag_timeout;
        let found = tokio::time::timeout(
            limit,
            sh.course.search(&s.subject, &query, sh.settings.rag_k),
        )
        .await
        .map(|r| {
            r.map(|mut hits| {
                if let Some(l) = &lead {
                    hits.retain(|h| h.text.trim() != l.text.trim());
                    hits.insert(0, l.clone());
                }
                hits
            })
        });
        let msg = match found {
            Err(_) => Message::tool(
                tc,
                ToolStatus::Timeout,
                format!(
                    "The search of the notes timed out after {} s: answer from what you know and say that the notes could not be searched.",
                    limit.as_secs_f64()
                ),
            ),
            Ok(Err(e)) => Message::tool(tc, ToolStatus::Error, format!("The search failed: {e}")),
            Ok(Ok(hits)) if hits.is_empty() => {
                Message::tool(tc, ToolStatus::Success, "The notes have nothing on that.")
            }
            Ok(Ok(hits)) => {
                let lines: Vec<String> = hits
                    .iter()
                    .map(|h| format!("[{}] {}", h.source(), clip(&h.text, 450)))
                    .collect();
                for h in hits {
                    if !context.iter().any(|c| c.path == h.path && c.text == h.text) {
                        context.push(h);
                    }
                }
                Message::tool(tc, ToolStatus::Success, lines.join("\n"))
            }
        };
        out.push(msg);
    }
    Ok(TutorStateUpdate::new().messages(out).context(context))
}

async fn get_guia(sh: &Shared, s: &TutorState) -> Result<TutorStateUpdate, NodeError> {
    let Some(ai) = last_ai(&s.messages) else {
        return Ok(TutorStateUpdate::new());
    };
    let mut out = Vec::new();
    for tc in &ai.tool_calls {
        if tc.name != GET_GUIA {
            out.push(not_run(tc, GET_GUIA));
            continue;
        }
        // The subject is the thread's, whatever the model put in the arguments.
        out.push(match course::guide(sh.course.course_dir(), &s.subject) {
            Ok(text) => Message::tool(tc, ToolStatus::Success, clip(&text, 1500)),
            Err(e) => Message::tool(tc, ToolStatus::Error, format!("No course guide: {e}")),
        });
    }
    Ok(TutorStateUpdate::new().messages(out))
}

async fn tool_error(s: &TutorState) -> Result<TutorStateUpdate, NodeError> {
    let Some(ai) = last_ai(&s.messages) else {
        return Ok(TutorStateUpdate::new());
    };
    let out: Vec<Message> = ai
        .tool_calls
        .iter()
        .map(|tc| not_run(tc, "no tool (the first call named an unknown tool)"))
        .collect();
    Ok(TutorStateUpdate::new().messages(out))
}

/// The quiz's input from the conversation: the first `generate_test` call's arguments.
fn quiz_input(p: &TutorState) -> QuizState {
    let question = current_question(&p.messages)
        .map(|(_, q)| q.to_string())
        .unwrap_or_default();
    let call =
        last_ai(&p.messages).and_then(|m| m.tool_calls.iter().find(|c| c.name == GENERATE_TEST));
    let args = call.map(|c| c.args.0.clone()).unwrap_or(Value::Null);
    let topic = args
        .get("topic")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .unwrap_or(question);
    let n = args
        .get("num_questions")
        .and_then(Value::as_u64)
        .unwrap_or(3)
        .clamp(1, 5) as u32;
    let difficulty = args
        .get("difficulty")
        .and_then(Value::as_str)
        .and_then(Difficulty::parse)
        .unwrap_or(Difficulty::Intermediate);
    QuizState {
        subject: p.subject.clone(),
        topic,
        num_questions: n,
        difficulty: difficulty.as_str().to_string(),
        call_id: call.map(|c| c.id.clone()).unwrap_or_default(),
        ..QuizState::default()
    }
}

/// The conversation's update from a finished quiz: the tool message of its call (and of any
/// other call in the same message), the summary as the turn's answer, and the record.
fn quiz_output(c: &QuizState, p: &TutorState) -> TutorStateUpdate {
    let summary = quiz::summary(c);
    let mut msgs = Vec::new();
    if let Some(ai) = last_ai(&p.messages) {
        for tc in &ai.tool_calls {
            if tc.id == c.call_id {
                msgs.push(Message::tool(tc, ToolStatus::Success, summary.clone()));
            } else {
                msgs.push(not_run(tc, GENERATE_TEST));
            }
        }
    }
    msgs.push(Message::ai(summary));
    TutorStateUpdate::new()
        .messages(msgs)
        .quizzes(vec![QuizRecord {
            topic: c.topic.clone(),
            total: c.questions.len() as u32,
            correct: c.correct(),
            status: "finished".into(),
        }])
}

/// The graph, with the course index and quiz dependencies given.
pub fn graph_with(
    settings: TutorSettings,
    course: Arc<CourseIndex>,
) -> Result<CompiledGraph<TutorState>, CompileError> {
    let llm: Arc<dyn ChatModel> = match &settings.llm {
        Some(m) => m.clone(),
        None => Arc::new(NoModel),
    };
    let quiz = quiz::graph(Arc::new(quiz::QuizDeps {
        llm,
        course: course.clone(),
        per_query: 3,
    }))?;
    let shared = Arc::new(Shared { settings, course });
    let (a, b, c) = (shared.clone(), shared.clone(), shared);
    StateGraph::<TutorState>::new("tutor")
        .add_node("think", move |s: Arc<TutorState>, ctx: NodeContext| {
            let sh = a.clone();
            async move { think(&sh, &s, &ctx).await }
        })
        .add_node(
            "rag_search",
            move |s: Arc<TutorState>, _ctx: NodeContext| {
                let sh = b.clone();
                async move { rag_search(&sh, &s).await }
            },
        )
        .add_node("get_guia", move |s: Arc<TutorState>, _ctx: NodeContext| {
            let sh = c.clone();
            async move { get_guia(&sh, &s).await }
        })
        .add_node(
            "tool_error",
            |s: Arc<TutorState>, _ctx: NodeContext| async move { tool_error(&s).await },
        )
        .add_foreign_subgraph(
            "test_session",
            MappedSubgraph::new(quiz, quiz_input, quiz_output),
            NodeOptions::new(),
        )
        .add_edge(START, "think")
        .add_conditional_edges(
            "think",
            |s: &TutorState| {
                let call = s
                    .messages
                    .last()
                    .filter(|m| m.role == Role::Ai)
                    .and_then(|m| m.tool_calls.first());
                match call.map(|c| c.name.as_str()) {
                    None => END,
                    Some(RAG_SEARCH) => "rag_search",
                    Some(GET_GUIA) => "get_guia",
                    Some(GENERATE_TEST) => "test_session",
                    Some(_) => "tool_error",
                }
            },
            ["rag_search", "get_guia", "test_session", "tool_error", END],
        )
        .add_edge("rag_search", "think")
        .add_edge("get_guia", "think")
        .add_edge("tool_error", "think")
        .add_edge("test_session", END)
        .compile()
}

/// Stands in for a missing model inside the quiz (its nodes then fall back to the notes);
/// `think` refuses to run without a model before the quiz can start.
struct NoModel;

#[async_trait]
impl ChatModel for NoModel {
    fn model_name(&self) -> String {
        "none".into()
    }

    async fn invoke(
        &self,
        _messages: &[Message],
        _options: &GenerateOptions,
        _sink: Option<TokenSink>,
    ) -> Result<Message, ferrograph::chat::LlmError> {
        Err(ferrograph::chat::LlmError::Config(
            "no chat model is configured".into(),
        ))
    }
}

/// Tool calls of AI messages that no tool message answers.
fn open_calls(messages: &[Message]) -> Vec<ToolCall> {
    let answered: std::collections::HashSet<&str> = messages
        .iter()
        .filter_map(|m| m.tool_call_id.as_deref())
        .collect();
    messages
        .iter()
        .filter(|m| m.role == Role::Ai)
        .flat_map(|m| m.tool_calls.iter())
        .filter(|c| !answered.contains(c.id.as_str()))
        .cloned()
        .collect()
}

/// The tutor behind JSON. A turn's input is `{"message": "...", "subject": "..."}` (the
/// subject once per thread, or to change it); a quiz answer is a resume value.
pub struct TutorWorkflow {
    runner: Arc<GraphRunner<TutorState>>,
    course: Arc<CourseIndex>,
}

impl TutorWorkflow {
    /// Loads the graph into `runtime` with `saver`.
    pub async fn load(
        runtime: &Runtime,
        saver: Arc<dyn CheckpointSaver>,
        settings: TutorSettings,
        make_embedder: course::EmbedderFactory,
    ) -> Result<Self, ferrograph::RegistryError> {
        let course = Arc::new(CourseIndex::new(
            settings.course_dir.clone(),
            settings.index_dir.clone(),
            make_embedder,
        ));
        let runner = runtime
            .load(graph_with(settings, course.clone())?)
            .await?
            .with_checkpointer(saver);
        Ok(TutorWorkflow {
            runner: Arc::new(runner),
            course,
        })
    }

    /// The typed runner.
    pub fn runner(&self) -> &GraphRunner<TutorState> {
        &self.runner
    }

    /// The course index (to build it ahead of the first question).
    pub fn course(&self) -> &Arc<CourseIndex> {
        &self.course
    }

    /// Turns `{"message", "subject"}` into the state update of a new turn. When the thread
    /// has a quiz open, its call is closed with a tool message and the quiz recorded as ended:
    /// a new message ends the quiz.
    async fn turn_input(&self, v: Value, thread: Option<&str>) -> Result<Value, RunError> {
        let Some(obj) = v.as_object() else {
            return Ok(v);
        };
        let Some(message) = obj.get("message") else {
            return Ok(v);
        };
        let message = message
            .as_str()
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .ok_or_else(|| RunError::InvalidInput("`message` must be a non-empty string".into()))?;
        for key in obj.keys() {
            if key != "message" && key != "subject" {
                return Err(RunError::InvalidInput(format!(
                    "unknown field `{key}` in a tutor turn (it takes `message` and `subject`)"
                )));
            }
        }
        let mut upd = TutorStateUpdate::new()
            .context(Vec::new())
            .tool_rounds(0u32)
            .thinking(None);
        if let Some(subject) = obj.get("subject") {
            let subject = subject
                .as_str()
                .ok_or_else(|| RunError::InvalidInput("`subject` must be a string".into()))?;
            course::ensure_builtin(self.course.course_dir())
                .map_err(|e| RunError::InvalidInput(e.to_string()))?;
            course::check_subject(self.course.course_dir(), subject)
                .map_err(|e| RunError::InvalidInput(e.to_string()))?;
            upd = upd.subject(subject.to_string());
        }
        let mut msgs = Vec::new();
        if let Some(t) = thread {
            if let Ok(snap) = Workflow::get_state(&*self.runner, t, None).await {
                let state: TutorState = serde_json::from_value(snap.values).unwrap_or_default();
                let open = open_calls(&state.messages);
                for c in &open {
                    msgs.push(Message::tool(
                        c,
                        ToolStatus::Error,
                        "Ended: the student sent a new message before this finished.",
                    ));
                }
                if open.iter().any(|c| c.name == GENERATE_TEST) && !snap.interrupts.is_empty() {
                    let quiz = snap.interrupts.iter().find_map(|i| {
                        let total = i.value.0.get("total_questions")?.as_u64()?;
                        let num = i.value.0.get("question_num")?.as_u64()?;
                        Some((total, num))
                    });
                    let topic = open
                        .iter()
                        .find(|c| c.name == GENERATE_TEST)
                        .and_then(|c| c.args.0.get("topic").and_then(Value::as_str))
                        .unwrap_or("")
                        .to_string();
                    upd = upd.quizzes(vec![QuizRecord {
                        topic,
                        total: quiz.map(|q| q.0 as u32).unwrap_or(0),
                        correct: 0,
                        status: format!("ended at question {}", quiz.map(|q| q.1).unwrap_or(0)),
                    }]);
                }
            }
        }
        msgs.push(Message::human(message));
        upd = upd.messages(msgs);
        serde_json::to_value(upd).map_err(|e| RunError::InvalidInput(e.to_string()))
    }
}

#[async_trait]
impl Workflow for TutorWorkflow {
    fn info(&self) -> WorkflowInfo {
        Workflow::info(&*self.runner)
    }

    async fn run_task(
        &self,
        task: ferrograph::runtime::placement::RemoteTask,
        events: tokio::sync::mpsc::Sender<ferrograph::runtime::placement::RemoteEvent>,
    ) -> ferrograph::runtime::placement::RemoteOutcome {
        // Tasks placed here by another node's coordinator run on the typed graph.
        Workflow::run_task(&*self.runner, task, events).await
    }

    fn checkpointer(&self) -> Option<Arc<dyn CheckpointSaver>> {
        Workflow::checkpointer(&*self.runner)
    }

    async fn start(&self, input: JsonInput, config: RunConfig) -> Result<JsonRun, RunError> {
        let input = match input {
            JsonInput::Update(v) => {
                JsonInput::Update(self.turn_input(v, config.thread_id.as_deref()).await?)
            }
            other => other,
        };
        Workflow::start(&*self.runner, input, config).await
    }

    async fn invoke(&self, input: JsonInput, config: RunConfig) -> Result<JsonOutcome, RunError> {
        self.start(input, config).await?.outcome().await
    }

    async fn get_state(
        &self,
        thread: &str,
        checkpoint: Option<&str>,
    ) -> Result<JsonSnapshot, RunError> {
        Workflow::get_state(&*self.runner, thread, checkpoint).await
    }

    async fn history(&self, thread: &str) -> Result<Vec<JsonSnapshot>, RunError> {
        Workflow::history(&*self.runner, thread).await
    }

    async fn update_state(
        &self,
        thread: &str,
        update: Value,
        as_node: Option<&str>,
    ) -> Result<String, RunError> {
        Workflow::update_state(&*self.runner, thread, update, as_node).await
    }

    async fn update_state_at(
        &self,
        thread: &str,
        checkpoint: &str,
        update: Value,
        as_node: Option<&str>,
    ) -> Result<String, RunError> {
        Workflow::update_state_at(&*self.runner, thread, checkpoint, update, as_node).await
    }

    async fn fork(
        &self,
        thread: &str,
        checkpoint: &str,
        new_thread: &str,
    ) -> Result<String, RunError> {
        Workflow::fork(&*self.runner, thread, checkpoint, new_thread).await
    }
}

/// Reads an input file: a JSON object, or the text of a question.
pub fn parse_input(text: &str) -> Value {
    let t = text.trim();
    match serde_json::from_str::<Value>(t) {
        Ok(v) if v.is_object() => v,
        _ => json!({ "message": t }),
    }
}

/// A first question.
pub fn sample_input() -> Value {
    json!({ "subject": "networks", "message": "What is the difference between TCP and UDP?" })
}

/// Reads `--subject S --message TEXT` (one turn) into the input.
pub fn parse_args(args: &[String]) -> Result<Value, String> {
    let mut input = serde_json::Map::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--subject" => {
                let v = it.next().ok_or("--subject needs a subject (networks, databases)")?;
                input.insert("subject".into(), json!(v));
            }
            "--message" => {
                let v = it.next().ok_or("--message needs the question")?;
                input.insert("message".into(), json!(v));
            }
            other => {
                return Err(format!(
                    "unknown argument `{other}` (tutor takes --subject S --message TEXT; for a conversation use `ferrograph chat tutor`)"
                ))
            }
        }
    }
    if !input.contains_key("message") {
        return Err("tutor needs --message TEXT (or `ferrograph chat tutor --subject S`)".into());
    }
    Ok(Value::Object(input))
}

/// Loads the tutor into `runtime` with `saver` and adds it to `registry`; the built-in course
/// is written to `<data dir>/tutor/course` on first use.
pub async fn register(
    registry: &mut ferrograph::Registry,
    runtime: &Runtime,
    saver: Arc<dyn CheckpointSaver>,
    settings: &WorkflowSettings,
) -> Result<(), ferrograph::RegistryError> {
    let ts = TutorSettings::from_workflow_settings(settings);
    let wf = TutorWorkflow::load(runtime, saver, ts, course::minilm()).await?;
    registry.insert(
        "tutor",
        ferrograph::Entry {
            workflow: Arc::new(wf),
            description: "tutor chat: difficulty-adaptive answers from the course notes, course guide, quizzes with one interrupt per question",
            parse_input,
            sample_input,
            parse_args: Some(parse_args),
            input_paths: &[],
        },
    );
    Ok(())
}
