//! Prompts and tool schemas. They are short and concrete on purpose: the default model has 135M
//! parameters, and a long instruction costs it both time and accuracy.

use crate::text::Difficulty;
use ferrograph::core::ToolSpec;
use serde_json::json;

/// Tool: search the subject's notes.
pub const RAG_SEARCH: &str = "rag_search";
/// Tool: the subject's course guide.
pub const GET_GUIA: &str = "get_guia";
/// Tool: start a quiz.
pub const GENERATE_TEST: &str = "generate_test";

/// The three tools the model is bound to.
pub fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new(
            RAG_SEARCH,
            "Search the course notes to answer a question about the subject.",
            json!({
                "type": "object",
                "properties": {"query": {"type": "string", "description": "what to look up"}},
                "required": ["query"]
            }),
        ),
        ToolSpec::new(
            GET_GUIA,
            "Read the course guide: units, schedule, exams, grading, office hours.",
            json!({"type": "object", "properties": {}}),
        ),
        ToolSpec::new(
            GENERATE_TEST,
            "Start a multiple-choice quiz when the student asks to be tested or quizzed.",
            json!({
                "type": "object",
                "properties": {
                    "topic": {"type": "string"},
                    "num_questions": {"type": "integer", "minimum": 1, "maximum": 5},
                    "difficulty": {"type": "string", "enum": ["basic", "intermediate", "advanced"]}
                },
                "required": ["topic"]
            }),
        ),
    ]
}

/// The system prompt: the tutor's role, naming the subject. It is the same for every
/// question of a subject, so that it (with the earlier turns after it) is a prefix the
/// model's cache serves from one turn to the next; what depends on the question's level goes
/// with the question ([`level_instruction`]).
pub fn system(subject: &str) -> String {
    format!(
        "You are a patient tutor for the course \"{subject}\". Answer from the course notes \
         given with the question, using their terms."
    )
}

/// How to answer a question of `level` (seed 002's adaptive prompts; the advanced one asks
/// for a thinking section). Sent after the question.
pub fn level_instruction(level: Difficulty) -> &'static str {
    match level {
        Difficulty::Basic => "Answer in one or two short sentences with plain words.",
        Difficulty::Intermediate => "Explain the answer in a short paragraph.",
        Difficulty::Advanced => {
            "Think first inside <thinking></thinking>, then give the answer inside \
             <answer></answer>."
        }
    }
}

/// The instruction of the first round of a turn, when the model picks a tool.
pub fn route_hint() -> &'static str {
    "Pick a tool: rag_search for questions about the subject, get_guia for exams, grades and \
     schedule, generate_test when the student wants a quiz."
}
