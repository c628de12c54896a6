//! `ferrograph chat WORKFLOW`: a conversation in the terminal with a workflow that takes
//! `{"message", "subject"}` turns (the tutor). Line editing and history come from `rustyline`;
//! the answer is printed token by token as the model writes it (an advanced answer's
//! `<thinking>` section is not shown); a quiz question is answered on the next line; Ctrl-C
//! stops the turn in progress (the run is cancelled, the conversation goes on), Ctrl-D or
//! `/quit` leaves.

use crate::App;
use anyhow::{Context, Result};
use ferrograph::runtime::{JsonInput, JsonOutcome};
use ferrograph::{CancelHandle, Resume, RunConfig, RunError, StreamMode, StreamModes};
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;
use serde_json::{json, Value};
use std::io::Write as _;
use std::process::ExitCode;

/// Hides `<thinking>…</thinking>` and drops `<answer>` tags from streamed text, whose pieces
/// may split a tag anywhere.
#[derive(Default)]
pub(crate) struct ThinkingFilter {
    buf: String,
    inside: bool,
}

const TAGS: [&str; 4] = ["<thinking>", "</thinking>", "<answer>", "</answer>"];

impl ThinkingFilter {
    /// Takes a piece, returns what can be shown now.
    pub(crate) fn push(&mut self, piece: &str) -> String {
        self.buf.push_str(piece);
        let mut out = String::new();
        loop {
            let Some(lt) = self.buf.find('<') else {
                if !self.inside {
                    out.push_str(&self.buf);
                }
                self.buf.clear();
                return out;
            };
            let (before, rest) = self.buf.split_at(lt);
            if !self.inside {
                out.push_str(before);
            }
            let rest = rest.to_string();
            if let Some(tag) = TAGS.iter().find(|t| rest.starts_with(**t)) {
                self.inside = match *tag {
                    "<thinking>" => true,
                    "</thinking>" => false,
                    _ => self.inside,
                };
                self.buf = rest[tag.len()..].to_string();
                continue;
            }
            if TAGS.iter().any(|t| t.starts_with(rest.as_str())) {
                // Maybe the start of a tag: wait for more.
                self.buf = rest;
                return out;
            }
            // A '<' that starts no tag.
            if !self.inside {
                out.push('<');
            }
            self.buf = rest[1..].to_string();
        }
    }

    /// What is left at the end.
    pub(crate) fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.buf);
        if self.inside {
            String::new()
        } else {
            rest
        }
    }
}

/// Prints a quiz question (and the feedback on the previous answer).
fn show_question(payload: &Value) {
    if let Some(f) = payload["feedback"].as_str() {
        println!("{f}\n");
    }
    if let Some(why) = payload["invalid_answer"].as_str() {
        println!("({why})");
    }
    println!(
        "Question {}/{}: {}",
        payload["question_num"],
        payload["total_questions"],
        payload["question_text"].as_str().unwrap_or("")
    );
    if let Some(opts) = payload["options"].as_array() {
        for o in opts {
            println!("  {}", o.as_str().unwrap_or(""));
        }
    }
    println!("(answer with a letter)");
}

fn status_line(node: &str, resuming: bool) -> Option<&'static str> {
    match node {
        "rag_search" => Some("searching the course notes"),
        "get_guia" => Some("reading the course guide"),
        "test_session" if resuming => Some("checking the answer"),
        "test_session" => Some("writing the quiz"),
        _ => None,
    }
}

/// Reads one line without blocking the runtime's workers.
async fn read_line(
    rl: DefaultEditor,
    prompt: String,
) -> Result<(DefaultEditor, rustyline::Result<String>)> {
    let mut rl = rl;
    tokio::task::spawn_blocking(move || {
        let line = rl.readline(&prompt);
        (rl, line)
    })
    .await
    .context("the line editor stopped")
}

/// What one turn ended with.
enum Turn {
    Answered,
    Question(Value),
    Stopped,
}

pub(crate) async fn chat(
    app: &App,
    workflow: &str,
    subject: Option<String>,
    thread: Option<String>,
) -> Result<ExitCode> {
    let entry = app.entry(workflow)?;
    let thread = thread
        .unwrap_or_else(|| format!("{workflow}-{}", &ferrograph::core::id::random_id()[..10]));
    // An existing conversation: its subject, and a quiz question that waits for an answer.
    let mut pending: Option<Value> = None;
    let mut known_subject = None;
    if let Ok(snap) = entry.workflow.get_state(&thread, None).await {
        known_subject = snap.values["subject"].as_str().map(str::to_string);
        pending = snap.interrupts.first().map(|i| i.value.0.clone());
    }
    let mut send_subject = subject.clone();
    let shown = match (&subject, &known_subject) {
        (Some(s), _) => s.clone(),
        (None, Some(s)) if !s.is_empty() => s.clone(),
        _ => anyhow::bail!("a new conversation needs --subject (for example --subject networks)"),
    };
    eprintln!(
        "thread {thread} · subject {shown} · Ctrl-C stops an answer, Ctrl-D or /quit leaves\n(continue later with: ferrograph chat {workflow} --thread {thread})"
    );
    if let Some(p) = &pending {
        show_question(p);
    }
    let mut rl = DefaultEditor::new().context("starting the line editor")?;
    loop {
        let prompt = if pending.is_some() {
            "answer> "
        } else {
            "you> "
        };
        let (back, line) = read_line(rl, prompt.to_string()).await?;
        rl = back;
        let line = match line {
            Ok(l) => l,
            Err(ReadlineError::Interrupted) => {
                eprintln!("(Ctrl-D or /quit leaves the conversation)");
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e).context("reading the terminal"),
        };
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if text == "/quit" || text == "/exit" {
            break;
        }
        let _ = rl.add_history_entry(text);
        let mut carries_subject = false;
        let input = match pending.take() {
            Some(_) if !text.starts_with('/') => JsonInput::Resume(Resume::value(json!(text))),
            _ => {
                let text = text.strip_prefix("/ask ").unwrap_or(text);
                let mut v = json!({ "message": text });
                if let Some(s) = send_subject.take() {
                    v["subject"] = json!(s);
                    carries_subject = true;
                }
                JsonInput::Update(v)
            }
        };
        match turn(app, workflow, &thread, input).await {
            Ok(Turn::Question(p)) => {
                show_question(&p);
                pending = Some(p);
            }
            Ok(Turn::Answered) => {}
            Ok(Turn::Stopped) => {
                eprintln!("(stopped)");
                // The thread may still hold the question asked before.
                if let Ok(snap) = entry.workflow.get_state(&thread, None).await {
                    pending = snap.interrupts.first().map(|i| i.value.0.clone());
                }
            }
            // The subject refused (one the course does not have): no turn of this
            // conversation can run, so it ends with the error (and a non-zero exit).
            Err(e)
                if carries_subject
                    && matches!(
                        e.downcast_ref::<RunError>(),
                        Some(RunError::InvalidInput(_))
                    ) =>
            {
                return Err(e);
            }
            Err(e) => eprintln!("error: {e:#}"),
        }
    }
    app.saver.flush().await?;
    Ok(ExitCode::SUCCESS)
}

async fn turn(app: &App, workflow: &str, thread: &str, input: JsonInput) -> Result<Turn> {
    let entry = app.entry(workflow)?;
    let cancel = CancelHandle::new();
    let mut config = RunConfig::thread(thread)
        .max_steps(app.config.max_steps)
        .stream(
            StreamModes::NONE
                .with(StreamMode::Tokens)
                .with(StreamMode::Tasks),
        )
        .cancel(cancel.clone());
    if let Some(t) = app.config.run_timeout {
        config = config.timeout(t);
    }
    let resuming = matches!(input, JsonInput::Resume(_));
    let mut run = entry.workflow.start(input, config).await?;
    let mut filter = ThinkingFilter::default();
    let mut streamed = String::new();
    let mut out = std::io::stdout();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut stopping = false;
    loop {
        tokio::select! {
            ev = run.next_event() => {
                let Some(ev) = ev else { break };
                match ev.kind {
                    "token" => {
                        if streamed.is_empty() {
                            print!("tutor> ");
                        }
                        let shown = filter.push(ev.data["text"].as_str().unwrap_or(""));
                        streamed.push_str(&shown);
                        print!("{shown}");
                        let _ = out.flush();
                    }
                    "task_start" if ev.namespace.is_empty() => {
                        if let Some(what) = ev.data["node"].as_str().and_then(|n| status_line(n, resuming)) {
                            eprintln!("· {what}…");
                        }
                    }
                    _ => {}
                }
            }
            _ = &mut ctrl_c, if !stopping => {
                stopping = true;
                cancel.cancel();
            }
        }
    }
    let rest = filter.finish();
    if !rest.is_empty() {
        print!("{rest}");
        streamed.push_str(&rest);
    }
    if !streamed.is_empty() {
        println!();
    }
    let outcome = run.outcome().await;
    match outcome {
        Err(RunError::Cancelled) => Ok(Turn::Stopped),
        Err(e) => Err(e.into()),
        Ok(o) if o.status == "interrupted" => Ok(match o.interrupts.first() {
            Some(i) => Turn::Question(i.value.0.clone()),
            None => Turn::Answered,
        }),
        Ok(o) => {
            let Some(last) = final_answer(&o) else {
                return Ok(Turn::Answered);
            };
            let answer = last["content"].as_str().unwrap_or("");
            let meta = &last["metadata"];
            if meta.get("fallback").is_some() || streamed.is_empty() {
                // Replaced by the course material, or not streamed (a quiz summary).
                println!("tutor> {answer}");
            } else {
                // The streamed answer, checked: say what the checks took out.
                let mut notes = Vec::new();
                if let Some(removed) = meta["removed"].as_str() {
                    notes.push(format!("removed, not in the course material: {removed}"));
                }
                if let Some(cut) = meta["cut"].as_str() {
                    notes.push(format!("cut {cut}"));
                }
                if !notes.is_empty() {
                    eprintln!("({})", notes.join("; "));
                }
                // What the checks left differs from what was streamed: show it.
                if answer.trim() != streamed.trim() {
                    println!("tutor> {answer}");
                }
            }
            Ok(Turn::Answered)
        }
    }
}

/// The turn's answer (its last message, when the AI wrote it).
fn final_answer(o: &JsonOutcome) -> Option<&Value> {
    o.state["messages"]
        .as_array()
        .and_then(|m| m.last())
        .filter(|m| m["role"] == "ai")
}

#[cfg(test)]
mod tests {
    use super::ThinkingFilter;

    fn run(pieces: &[&str]) -> String {
        let mut f = ThinkingFilter::default();
        let mut s: String = pieces.iter().map(|p| f.push(p)).collect();
        s.push_str(&f.finish());
        s
    }

    #[test]
    fn thinking_is_hidden_even_when_tags_are_split() {
        assert_eq!(
            run(&[
                "<thin",
                "king>secret</thi",
                "nking>\n<ans",
                "wer>It backs off.</answer>"
            ]),
            "\nIt backs off."
        );
        assert_eq!(run(&["a < b and ", "<b>bold</b>"]), "a < b and <b>bold</b>");
        assert_eq!(run(&["plain answer"]), "plain answer");
        assert_eq!(run(&["<thinking>never closed"]), "");
    }
}
