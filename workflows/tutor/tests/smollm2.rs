//! The tutor on the real local models (SmolLM2-135M-Instruct for the chat, all-MiniLM-L6-v2
//! for the notes): one chat turn and one two-question quiz, judged as a student would judge
//! them. The answer must be prose (not empty, not a loop) and state no number or date that the
//! course material does not have (otherwise the tutor must have replaced it by the material,
//! saying so). The quiz must have exactly two questions of four distinct options, grading must
//! agree with the letter given, and the right answer of each question must be in the notes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use ferrograph::chat::ChatModel;
use ferrograph::core::Role;
use ferrograph::prelude::*;
use ferrograph::runtime::{JsonInput, Workflow};
use ferrograph::Resume;
use ferrograph_tutor::course::{minilm, BUILTIN_COURSE};
use ferrograph_tutor::text::{unsupported, unusable};
use ferrograph_tutor::{TutorSettings, TutorState, TutorWorkflow};
use serde_json::json;
use std::sync::Arc;

fn model() -> Option<Arc<dyn ChatModel>> {
    match ferrograph_llm::manifest::ensure_model(ferrograph_llm::manifest::DEFAULT_CHAT_MODEL) {
        Ok(p) => Some(Arc::new(ferrograph_llm::LocalChatModel::new(p))),
        Err(e) => {
            if std::env::var_os("CI").is_some() {
                panic!("cannot fetch the chat model in CI: {e}");
            }
            eprintln!(
                "\n!!!!!! SKIPPING the SmolLM2 tutor test: {e}; run scripts/fetch-models.sh\n"
            );
            None
        }
    }
}

fn notes() -> String {
    BUILTIN_COURSE
        .iter()
        .filter(|(p, _)| p.starts_with("networks/"))
        .map(|(_, t)| t.replace("**", ""))
        .collect::<Vec<_>>()
        .join("\n")
        .to_lowercase()
}

#[tokio::test]
async fn a_chat_turn_and_a_two_question_quiz_on_the_real_models() {
    let Some(llm) = model() else { return };
    let dir = tempfile::tempdir().unwrap();
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
    let rt = Runtime::new().await.unwrap();
    let wf = TutorWorkflow::load(&rt, Arc::new(MemorySaver::new()), settings, minilm())
        .await
        .unwrap();
    let cfg = || RunConfig::thread("student");

    // One turn: an answer from the notes.
    let o = wf
        .invoke(
            JsonInput::Update(json!({"subject": "networks",
                "message": "What is the difference between TCP and UDP?"})),
            cfg(),
        )
        .await
        .unwrap();
    assert_eq!(o.status, "done");
    let s: TutorState = serde_json::from_value(o.state).unwrap();
    let searched = s
        .messages
        .iter()
        .find(|m| m.role == Role::Tool)
        .expect("a tool ran");
    assert_eq!(searched.name.as_deref(), Some("rag_search"));
    assert!(s.context.iter().all(|c| c.path.starts_with("networks/")));
    let answer = s.messages.last().unwrap();
    assert_eq!(answer.role, Role::Ai);
    eprintln!("answer: {}", answer.content);
    assert_eq!(unusable(&answer.content), None, "{}", answer.content);
    if !answer.metadata.contains_key("fallback") {
        assert_eq!(unsupported(&answer.content, &searched.content), None);
    } else {
        assert!(answer.content.contains("course material says"));
    }

    // A quiz of two questions.
    let mut o = wf
        .invoke(
            JsonInput::Update(json!({"message": "Quiz me on TCP with 2 questions"})),
            cfg(),
        )
        .await
        .unwrap();
    let notes = notes();
    let mut asked = Vec::new();
    for (i, letter) in ["A", "B"].into_iter().enumerate() {
        assert_eq!(o.status, "interrupted", "{:?}", o.state);
        let p = o.interrupts[0].value.0.clone();
        eprintln!("{p}");
        assert_eq!(p["question_num"], i + 1);
        assert_eq!(p["total_questions"], 2);
        let text = p["question_text"].as_str().unwrap().to_string();
        assert_eq!(unusable(&text), None, "{text}");
        assert!(!asked.contains(&text), "asked twice: {text}");
        asked.push(text);
        let opts: Vec<String> = p["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        assert_eq!(opts.len(), 4);
        let mut distinct = opts
            .iter()
            .map(|o| o[3..].to_lowercase())
            .collect::<Vec<_>>();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 4, "{opts:?}");
        if i > 0 {
            assert!(p["feedback"].is_string());
        }
        o = wf
            .invoke(JsonInput::Resume(Resume::value(json!(letter))), cfg())
            .await
            .unwrap();
    }
    assert_eq!(o.status, "done");
    let s: TutorState = serde_json::from_value(o.state).unwrap();
    let summary = &s.messages.last().unwrap().content;
    eprintln!("{summary}");
    let record = s.quizzes.last().unwrap();
    assert_eq!(record.total, 2);
    assert!(summary.starts_with(&format!("Quiz on TCP: {}/2 correct.", record.correct)));
    // Each feedback agrees with the letter given, and names a right answer from the notes.
    for (line, letter) in summary
        .lines()
        .filter(|l| {
            l.trim_start().starts_with("Correct") || l.trim_start().starts_with("Not quite")
        })
        .zip(["A", "B"])
    {
        let line = line.trim();
        let right = if let Some(rest) = line.strip_prefix("Correct: ") {
            assert!(rest.starts_with(&format!("{letter})")), "{line}");
            rest
        } else {
            assert!(
                line.starts_with(&format!("Not quite: you chose {letter})")),
                "{line}"
            );
            line.split("the answer is ").nth(1).unwrap()
        };
        let term = right[3..].split(". ").next().unwrap().trim_end_matches('.');
        assert!(
            notes.contains(&term.to_lowercase()),
            "the right answer \"{term}\" is not in the notes"
        );
    }
}
