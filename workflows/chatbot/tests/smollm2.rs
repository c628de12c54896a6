//! The chatbot on the real SmolLM2-135M-Instruct: two turns of one conversation, each answer
//! judged as a person would judge it (prose, no loop, the fact asked for), the second asked
//! with the first turn in its prompt.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use ferrograph::chat::ChatModel;
use ferrograph::core::Role;
use ferrograph::prelude::*;
use ferrograph::runtime::{JsonInput, Workflow};
use ferrograph_chatbot::{graph, question, ChatbotSettings, ChatbotState, SYSTEM};
use std::sync::Arc;

fn model() -> Option<Arc<dyn ChatModel>> {
    match ferrograph_llm::manifest::ensure_model(ferrograph_llm::manifest::DEFAULT_CHAT_MODEL) {
        Ok(p) => Some(Arc::new(ferrograph_llm::LocalChatModel::new(p))),
        Err(e) => {
            if std::env::var_os("CI").is_some() {
                panic!("cannot fetch the chat model in CI: {e}");
            }
            eprintln!(
                "\n!!!!!! SKIPPING the SmolLM2 chatbot test: {e}; run scripts/fetch-models.sh\n"
            );
            None
        }
    }
}

/// Why `text` is not an answer a person would accept (`needle` is the fact asked for).
fn unusable(text: &str, needle: &str) -> Option<String> {
    let lower = text.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .filter(|w| !w.is_empty())
        .collect();
    if words.len() < 3 {
        return Some(format!("too short: {text:?}"));
    }
    let mut seen = std::collections::HashSet::new();
    for gram in words.windows(6) {
        if !seen.insert(gram.join(" ")) {
            return Some(format!("repeats {:?}: {text:?}", gram.join(" ")));
        }
    }
    if !words.contains(&needle) {
        return Some(format!("does not say {needle}: {text:?}"));
    }
    None
}

#[tokio::test]
async fn two_turns_answered_with_the_facts_asked_for() {
    let Some(llm) = model() else { return };
    let settings = ChatbotSettings {
        llm: Some(llm),
        system: SYSTEM.into(),
        answer_tokens: 120,
        max_context: 2048,
        history_chars: 1500,
    };
    let rt = Runtime::new().await.unwrap();
    let wf = rt
        .load(graph(settings).unwrap())
        .await
        .unwrap()
        .with_checkpointer(Arc::new(MemorySaver::new()));
    let turns = [
        ("What color is the sky on a clear day?", "blue"),
        ("How many days are there in a week?", "seven"),
    ];
    for (i, (q, needle)) in turns.iter().enumerate() {
        let out = Workflow::invoke(&wf, JsonInput::Update(question(q)), RunConfig::thread("c"))
            .await
            .unwrap();
        let state: ChatbotState = serde_json::from_value(out.state).unwrap();
        assert_eq!(state.messages.len(), 2 * (i + 1));
        let answer = state.messages.last().unwrap();
        assert_eq!(answer.role, Role::Ai);
        eprintln!("{q} → {:?}", answer.content);
        // "7" is as good as "seven".
        let text = answer.content.replace('7', "seven");
        if let Some(why) = unusable(&text, needle) {
            panic!("turn {}: {why}", i + 1);
        }
        assert!(answer.usage.is_some_and(|u| u.completion_tokens > 0));
    }
}
