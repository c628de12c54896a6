//! The tutor's state (one thread per student) and the quiz subgraph's state.
//!
//! Seed 002 keeps the quiz's fields in the main state. Here the quiz is a subgraph with its own
//! state ([`QuizState`]): the parent keeps only what a conversation needs after a quiz (its
//! messages and a [`QuizRecord`]), so the next turn's prompt is not crowded by quiz internals.

use ferrograph::prelude::*;
use serde::{Deserialize, Serialize};

/// One retrieved passage of the course notes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ContextChunk {
    /// File, relative to the course folder (`networks/transport.md`).
    pub path: String,
    /// The section heading, when the notes have one.
    pub heading: String,
    /// The passage.
    pub text: String,
    /// Similarity to the query.
    pub score: f32,
}

impl ContextChunk {
    /// `path` and heading, for citing.
    pub fn source(&self) -> String {
        if self.heading.is_empty() {
            self.path.clone()
        } else {
            format!("{} ({})", self.path, self.heading)
        }
    }
}

/// The outcome of a quiz, kept in the conversation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QuizRecord {
    /// What the quiz was about.
    pub topic: String,
    /// Number of questions.
    pub total: u32,
    /// Correct answers.
    pub correct: u32,
    /// `finished`, or `ended` when a new message closed it early.
    pub status: String,
}

/// The conversation of one student (seed 002's `SubjectState`).
#[derive(State, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TutorState {
    /// The conversation (the messages rule: appended by id; old turns removed when trimmed).
    #[reducer(messages)]
    pub messages: Vec<Message>,
    /// The course (`networks`, `databases`): overwritten by each turn that names one.
    pub subject: String,
    /// Passages retrieved during the current turn (every turn's input resets it).
    pub context: Vec<ContextChunk>,
    /// The reasoning of the last advanced answer, kept out of the answer itself.
    pub thinking: Option<String>,
    /// `basic`, `intermediate` or `advanced`: the last question's classification.
    pub query_difficulty: Option<String>,
    /// Tool rounds taken in the current turn (every turn's input resets it).
    pub tool_rounds: u32,
    /// One line per turn that was trimmed from `messages` to keep prompts within the model's
    /// context, oldest first.
    #[reducer(append)]
    pub earlier_turns: Vec<String>,
    /// Quizzes taken in this conversation.
    #[reducer(append)]
    pub quizzes: Vec<QuizRecord>,
}

/// A multiple-choice question.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Question {
    /// The question.
    pub text: String,
    /// Four options, shown as A) to D).
    pub options: Vec<String>,
    /// The correct option's letter.
    pub answer: char,
    /// The passage it was written from (`path (heading)`).
    pub source: String,
    /// The sentence of the notes that holds the answer: the explanation of last resort.
    pub evidence: String,
    /// `model` (written by the model and checked) or `notes` (built from a term the notes
    /// define, when the model's question failed the checks).
    pub origin: String,
}

impl Question {
    /// `B) text` for a letter.
    pub fn option(&self, letter: char) -> String {
        let i = (letter as u8).wrapping_sub(b'A') as usize;
        match self.options.get(i) {
            Some(t) => format!("{letter}) {t}"),
            None => letter.to_string(),
        }
    }

    /// The question with its options, one per line.
    pub fn render(&self) -> String {
        let mut s = self.text.clone();
        for (i, o) in self.options.iter().enumerate() {
            s.push_str(&format!("\n  {}) {o}", (b'A' + i as u8) as char));
        }
        s
    }
}

/// One graded answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GradedAnswer {
    /// The letter given.
    pub given: char,
    /// Whether it was the right one (checked in code).
    pub correct: bool,
    /// What the student is told.
    pub feedback: String,
}

/// The quiz subgraph's state (seed 002's `TestSessionState`).
#[derive(State, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QuizState {
    /// The course.
    pub subject: String,
    /// What the quiz is about.
    pub topic: String,
    /// How many questions.
    pub num_questions: u32,
    /// `basic`, `intermediate` or `advanced`.
    pub difficulty: String,
    /// The `generate_test` call this quiz answers.
    pub call_id: String,
    /// Search queries for the notes.
    pub queries: Vec<String>,
    /// Whether the queries came from the topic alone (the model's were unusable).
    pub queries_fell_back: bool,
    /// Passages the questions are written from.
    pub context: Vec<ContextChunk>,
    /// The questions.
    pub questions: Vec<Question>,
    /// Graded answers, in order.
    #[reducer(append)]
    pub answers: Vec<GradedAnswer>,
    /// Why the last answer could not be read (asked again with this note).
    pub invalid_answer: Option<String>,
}

impl QuizState {
    /// Correct answers so far.
    pub fn correct(&self) -> u32 {
        self.answers.iter().filter(|a| a.correct).count() as u32
    }
}
