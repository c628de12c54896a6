//! `chatbot`: LangGraph's first graph, a chat agent over `MessagesState`.
//!
//! The conversation is the `messages` field under the messages rule (appended by id, like
//! LangGraph's `add_messages`); one node, `chatbot`, answers the last human message with the
//! local model, its tokens streamed. Through the Agent Server API the messages read and write
//! in LangChain's shape, so LangGraph's clients (the SDKs, `useStream`, the agent chat UI)
//! talk to it unchanged: this is the graph their examples call `agent`.
//!
//! A model of 135M parameters answers a short question well and loses the thread of a long
//! conversation, so the prompt keeps the system instruction, the question and as many earlier
//! turns as fit [`ChatbotSettings::history_chars`], newest first.

use ferrograph::chat::{ChatModel, GenerateOptions, TokenSink};
use ferrograph::core::Role;
use ferrograph::prelude::*;
use ferrograph::WorkflowSettings;
use ferrograph::{CheckpointSaver, CompileError, Entry, Registry, RegistryError, Runtime};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::Arc;

/// The conversation.
#[derive(State, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatbotState {
    /// Every message, oldest first (the messages rule).
    #[reducer(messages)]
    pub messages: Vec<Message>,
}

/// How the chatbot answers.
#[derive(Clone)]
pub struct ChatbotSettings {
    /// The chat model (none: every turn fails with a clear error).
    pub llm: Option<Arc<dyn ChatModel>>,
    /// The system instruction.
    pub system: String,
    /// Tokens of an answer.
    pub answer_tokens: usize,
    /// The model's context window used for a prompt.
    pub max_context: usize,
    /// Characters of earlier turns put into a prompt.
    pub history_chars: usize,
}

/// The default instruction: short, plain answers suit a small model best.
pub const SYSTEM: &str = "You are a helpful assistant. Answer the user's question directly \
and briefly, in plain sentences. If you do not know, say so.";

impl ChatbotSettings {
    /// Settings with the workflow settings' model for `chatbot`.
    pub fn from_workflow_settings(w: &WorkflowSettings) -> Self {
        ChatbotSettings {
            llm: w.llm_for("chatbot"),
            system: SYSTEM.to_string(),
            answer_tokens: 200,
            max_context: 2048,
            history_chars: 1500,
        }
    }
}

/// The prompt for the last human message of `messages`: the instruction, earlier turns
/// (human questions and the AI answers without tool calls) newest first while they fit
/// `history_chars`, then the question. `None` when no human message is waiting for an answer.
pub fn prompt(settings: &ChatbotSettings, messages: &[Message]) -> Option<Vec<Message>> {
    let last = messages.last()?;
    if last.role != Role::Human || last.content.trim().is_empty() {
        return None;
    }
    let mut earlier: Vec<Message> = Vec::new();
    let mut budget = settings.history_chars;
    for m in messages[..messages.len() - 1].iter().rev() {
        let keep = match m.role {
            Role::Human => true,
            Role::Ai => m.tool_calls.is_empty() && !m.content.trim().is_empty(),
            Role::System | Role::Tool => false,
        };
        if !keep {
            continue;
        }
        let n = m.content.chars().count();
        if n > budget {
            break;
        }
        budget -= n;
        earlier.push(match m.role {
            Role::Human => Message::human(m.content.trim()),
            _ => Message::ai(m.content.trim()),
        });
    }
    // A turn starts with a question: drop an answer left without its question.
    if earlier.last().is_some_and(|m| m.role == Role::Ai) {
        earlier.pop();
    }
    let mut out = vec![Message::system(settings.system.clone())];
    out.extend(earlier.into_iter().rev());
    out.push(Message::human(last.content.trim()));
    Some(out)
}

async fn answer(
    settings: Arc<ChatbotSettings>,
    s: Arc<ChatbotState>,
    ctx: NodeContext,
) -> Result<ChatbotStateUpdate, NodeError> {
    let Some(msgs) = prompt(&settings, &s.messages) else {
        return Err(NodeError::fatal(
            "nothing to answer: the last message must be a non-empty human message",
        ));
    };
    let llm = settings.llm.clone().ok_or_else(|| {
        NodeError::fatal(
            "the chatbot needs a chat model (FERROGRAPH_MODEL=none turned it off; fetch the default with `ferrograph models fetch`)",
        )
    })?;
    let opts = GenerateOptions::greedy()
        .max_tokens(settings.answer_tokens)
        .max_context(settings.max_context)
        // Loops of one phrase are the failure a small model falls into most.
        .no_repeat_ngram(6)
        // A small model goes on to write the user's next line itself.
        .stop("\nUser:")
        .stop("\nuser:");
    let reply = llm
        .invoke(&msgs, &opts, TokenSink::from_context(&ctx))
        .await
        .map_err(|e| {
            let message = format!("the chat model failed: {e}");
            // Transient failures (a lost cluster node, a busy server) are worth the node's
            // retries; the others would fail the same way again.
            if e.is_retryable() {
                NodeError::failed(message)
            } else {
                NodeError::fatal(message)
            }
        })?;
    let text = reply.content.trim();
    if text.is_empty() {
        return Err(NodeError::fatal("the chat model answered nothing"));
    }
    let mut m = Message::ai(text);
    m.usage = reply.usage;
    m.finish_reason = reply.finish_reason.clone();
    Ok(ChatbotStateUpdate::new().messages(vec![m]))
}

/// The graph: `START → chatbot → END`.
pub fn graph(settings: ChatbotSettings) -> Result<CompiledGraph<ChatbotState>, CompileError> {
    let settings = Arc::new(settings);
    StateGraph::<ChatbotState>::new("chatbot")
        .add_node_with(
            "chatbot",
            move |s: Arc<ChatbotState>, ctx: NodeContext| answer(settings.clone(), s, ctx),
            // Three attempts: a model call lost with its cluster node, or a task lost with
            // the worker running it, runs again (elsewhere).
            NodeOptions::new().retry(RetryPolicy::attempts(3)),
        )
        .add_edge(START, "chatbot")
        .add_edge("chatbot", END)
        .compile()
}

/// Reads an input file: a JSON object (a state update), or the text of a question.
pub fn parse_input(text: &str) -> Value {
    let t = text.trim();
    match serde_json::from_str::<Value>(t) {
        Ok(v) if v.is_object() => v,
        _ => question(t),
    }
}

/// The state update that asks `text`.
pub fn question(text: &str) -> Value {
    serde_json::to_value(ChatbotStateUpdate::new().messages(vec![Message::human(text)]))
        .unwrap_or_else(|_| json!({}))
}

/// A first question.
pub fn sample_input() -> Value {
    question("What color is the sky on a clear day?")
}

/// Reads `--message TEXT`.
pub fn parse_args(args: &[String]) -> Result<Value, String> {
    match args {
        [flag, text] if flag == "--message" && !text.trim().is_empty() => Ok(question(text)),
        _ => Err("chatbot takes --message TEXT".into()),
    }
}

/// Loads `chatbot` into `runtime` with `saver` as its checkpointer and adds it to `registry`.
pub async fn register(
    registry: &mut Registry,
    runtime: &Runtime,
    saver: Arc<dyn CheckpointSaver>,
    settings: &WorkflowSettings,
) -> Result<(), RegistryError> {
    let wf = runtime
        .load(graph(ChatbotSettings::from_workflow_settings(settings))?)
        .await?
        .with_checkpointer(saver);
    registry.insert(
        "chatbot",
        Entry {
            workflow: Arc::new(wf),
            description: "a chat agent over `messages` (LangGraph's MessagesState): the local model answers, tokens streamed",
            parse_input,
            sample_input,
            parse_args: Some(parse_args),
            input_paths: &[],
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use ferrograph::runtime::{JsonInput, Workflow};
    use ferrograph_chat::testing::ScriptedModel;

    fn settings(llm: Option<Arc<dyn ChatModel>>) -> ChatbotSettings {
        ChatbotSettings {
            llm,
            system: SYSTEM.into(),
            answer_tokens: 50,
            max_context: 512,
            history_chars: 40,
        }
    }

    #[test]
    fn the_prompt_keeps_the_newest_whole_turns_that_fit() {
        let s = settings(None);
        let msgs = vec![
            Message::human("an old question that is far too long to keep"),
            Message::ai("an old answer"),
            Message::human("q2"),
            Message::ai_with_tools("", vec![ferrograph::core::ToolCall::new("t", json!({}))]),
            Message::ai("a2"),
            Message::human("  q3  "),
        ];
        let p = prompt(&s, &msgs).unwrap();
        let texts: Vec<(Role, &str)> = p.iter().map(|m| (m.role, m.content.as_str())).collect();
        assert_eq!(
            texts,
            [
                (Role::System, SYSTEM),
                (Role::Human, "q2"),
                (Role::Ai, "a2"),
                (Role::Human, "q3"),
            ]
        );
        assert!(
            prompt(&s, &msgs[..2]).is_none(),
            "the last message is an answer"
        );
        assert!(prompt(&s, &[Message::human("  ")]).is_none());
    }

    #[tokio::test]
    async fn a_turn_appends_one_answer_and_a_second_turn_sees_the_first() {
        let model = ScriptedModel::new("scripted", |call| {
            let n = call.messages.len();
            Ok(Message::ai(format!(
                "  answer to {} (prompt of {n})  ",
                call.last_prompt()
            )))
        });
        let rt = Runtime::new().await.unwrap();
        let wf = rt
            .load(graph(settings(Some(Arc::new(model)))).unwrap())
            .await
            .unwrap()
            .with_checkpointer(Arc::new(MemorySaver::new()));
        let config = RunConfig::thread("t");
        let out = Workflow::invoke(&wf, JsonInput::Update(question("hi")), config.clone())
            .await
            .unwrap();
        let state: ChatbotState = serde_json::from_value(out.state).unwrap();
        assert_eq!(state.messages.len(), 2);
        assert_eq!(state.messages[1].content, "answer to hi (prompt of 2)");
        let out = Workflow::invoke(&wf, JsonInput::Update(question("more")), config)
            .await
            .unwrap();
        let state: ChatbotState = serde_json::from_value(out.state).unwrap();
        assert_eq!(state.messages.len(), 4);
        assert_eq!(state.messages[3].content, "answer to more (prompt of 4)");
    }

    #[tokio::test]
    async fn no_model_and_empty_answers_fail_clearly() {
        let rt = Runtime::new().await.unwrap();
        let wf = rt.load(graph(settings(None)).unwrap()).await.unwrap();
        let e = Workflow::invoke(&wf, JsonInput::Update(question("hi")), RunConfig::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a chat model"), "{e}");
        let silent = ScriptedModel::queue("silent", vec![Ok("   ".into())]);
        let wf = rt
            .load(graph(settings(Some(Arc::new(silent)))).unwrap())
            .await
            .unwrap();
        let e = Workflow::invoke(&wf, JsonInput::Update(question("hi")), RunConfig::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("answered nothing"), "{e}");
        assert!(parse_args(&["--message".into(), " ".into()]).is_err());
        let asked = parse_input("plain words");
        assert_eq!(
            asked["messages"][0]["upsert"]["message"]["content"],
            "plain words"
        );
    }
}
