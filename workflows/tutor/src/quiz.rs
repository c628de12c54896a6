//! The quiz subgraph (seed 002's test session):
//!
//! ```text
//! START → plan → retrieve → write → ask ─┬─ ask (next question, or the same one again when
//!                                        │       the answer could not be read)
//!                                        └─ END (every question answered)
//! ```
//!
//! - `plan` asks the model for search queries about the topic; when its answer is unusable the
//!   topic itself is the query (the seed's fallback).
//! - `retrieve` searches the subject's notes (subject filter) with each query.
//! - `write` makes exactly N questions, each from one retrieved passage. The model writes a
//!   question as JSON (constrained to the schema on local models); code checks it: four
//!   distinct options, a valid letter, and the right option's words found in the passage. A
//!   question that fails is replaced by one built from a term the passage defines (a **bold**
//!   term of the notes and the sentence that defines it, the other options being terms of the
//!   same notes), so a quiz never has fewer questions or an answer the notes do not support.
//! - `ask` interrupts once per question with `{action, question_num, total_questions,
//!   question_text, options, feedback}`; the resume value is the answer. The letter is checked
//!   in code; the model writes one sentence of explanation, which is kept only when it is
//!   usable, and otherwise the notes' own sentence is the explanation. The feedback is shown
//!   with the next question and in the summary.

use crate::course::CourseIndex;
use crate::state::{ContextChunk, GradedAnswer, Question, QuizState, QuizStateUpdate};
use crate::text::{clip, key_terms, read_answer, sentences, unusable};
use ferrograph::chat::{ChatModel, GenerateOptions};
use ferrograph::core::Message;
use ferrograph::prelude::*;
use ferrograph::CompileError;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// What the quiz's nodes use.
pub struct QuizDeps {
    /// The model (questions, queries, explanations).
    pub llm: Arc<dyn ChatModel>,
    /// The course notes.
    pub course: Arc<CourseIndex>,
    /// Passages retrieved per query.
    pub per_query: usize,
}

/// The compiled quiz subgraph.
pub fn graph(deps: Arc<QuizDeps>) -> Result<CompiledGraph<QuizState>, CompileError> {
    let (d1, d2, d3, d4) = (deps.clone(), deps.clone(), deps.clone(), deps);
    StateGraph::<QuizState>::new("quiz")
        .add_node("plan", move |s: Arc<QuizState>, _ctx: NodeContext| {
            let d = d1.clone();
            async move { plan(&d, &s).await }
        })
        .add_node("retrieve", move |s: Arc<QuizState>, _ctx: NodeContext| {
            let d = d2.clone();
            async move { retrieve(&d, &s).await }
        })
        .add_node("write", move |s: Arc<QuizState>, _ctx: NodeContext| {
            let d = d3.clone();
            async move { write(&d, &s).await }
        })
        .add_node("ask", move |s: Arc<QuizState>, ctx: NodeContext| {
            let d = d4.clone();
            async move { ask(&d, &s, &ctx).await }
        })
        .add_edge(START, "plan")
        .add_edge("plan", "retrieve")
        .add_edge("retrieve", "write")
        .add_edge("write", "ask")
        .add_conditional_edges_map(
            "ask",
            |s: &QuizState| {
                if s.answers.len() < s.questions.len() {
                    "next"
                } else {
                    "done"
                }
            },
            [("next", "ask"), ("done", END)],
        )
        .compile()
}

#[derive(Deserialize)]
struct Queries {
    queries: Vec<String>,
}

async fn plan(d: &QuizDeps, s: &QuizState) -> Result<QuizStateUpdate, NodeError> {
    let prompt = format!(
        "Write up to 3 short search queries to find course notes about: {}",
        s.topic
    );
    let opts = GenerateOptions::greedy().max_tokens(80).json_schema(
        "queries",
        json!({
            "type": "object",
            "properties": {"queries": {"type": "array", "items": {"type": "string"},
                           "minItems": 1, "maxItems": 3}},
            "required": ["queries"]
        }),
    );
    let parsed = match d.llm.invoke(&[Message::human(prompt)], &opts, None).await {
        Ok(m) => ferrograph::chat::parse_structured::<Queries>(&m.content).ok(),
        Err(e) => {
            tracing::warn!(error = %e, "quiz query generation failed; searching for the topic");
            None
        }
    };
    let mut queries: Vec<String> = parsed
        .map(|q| q.queries)
        .unwrap_or_default()
        .into_iter()
        .map(|q| q.trim().to_string())
        .filter(|q| !q.is_empty() && q.len() <= 200)
        .collect();
    queries.dedup();
    let fell_back = queries.is_empty();
    if fell_back {
        queries.push(s.topic.clone());
    }
    Ok(QuizStateUpdate::new()
        .queries(queries)
        .queries_fell_back(fell_back))
}

async fn retrieve(d: &QuizDeps, s: &QuizState) -> Result<QuizStateUpdate, NodeError> {
    // The topic is always searched too: the model's queries may drift from it.
    let mut queries = vec![s.topic.clone()];
    queries.extend(s.queries.iter().cloned());
    let mut found: Vec<ContextChunk> = Vec::new();
    for q in &queries {
        let hits = d
            .course
            .search(&s.subject, q, d.per_query)
            .await
            .map_err(|e| NodeError::failed(e.to_string()))?;
        for h in hits {
            match found
                .iter_mut()
                .find(|f| f.path == h.path && f.text == h.text)
            {
                Some(f) => f.score = f.score.max(h.score),
                None => found.push(h),
            }
        }
    }
    found.sort_by(|a, b| b.score.total_cmp(&a.score));
    // A note named after the topic: its opening first.
    if let Some(l) = d.course.lead(&s.subject, &s.topic, 900) {
        found.retain(|h| h.text.trim() != l.text.trim());
        found.insert(0, l);
    }
    if found.is_empty() {
        return Err(NodeError::fatal(format!(
            "the notes of `{}` are empty: there is nothing to ask about",
            s.subject
        )));
    }
    Ok(QuizStateUpdate::new().context(found))
}

#[derive(Deserialize)]
struct Drafted {
    question: String,
    options: Vec<String>,
    answer: String,
}

/// Lowercase words of four letters or more (the words that carry meaning).
fn content_words(s: &str) -> Vec<String> {
    norm(s)
        .split(' ')
        .filter(|w| w.len() >= 4)
        .map(str::to_string)
        .collect()
}

use crate::text::norm_words as norm;

/// Checks a drafted question against its passage; the reason when it is rejected.
fn check_draft(d: &Drafted, passage: &str, earlier: &[Question]) -> Result<Question, String> {
    let text = d.question.trim();
    if let Some(why) = unusable(text) {
        return Err(format!("question {why}"));
    }
    if d.options.len() != 4 {
        return Err(format!("{} options instead of 4", d.options.len()));
    }
    let opts: Vec<String> = d.options.iter().map(|o| o.trim().to_string()).collect();
    for (i, o) in opts.iter().enumerate() {
        if o.is_empty() || o.chars().count() > 100 {
            return Err(format!("option {} is empty or too long", i + 1));
        }
        if opts[..i].iter().any(|p| norm(p) == norm(o)) {
            return Err("two options are the same".into());
        }
    }
    let letter = d
        .answer
        .trim()
        .chars()
        .next()
        .map(|c| c.to_ascii_uppercase())
        .filter(|c| ('A'..='D').contains(c))
        .ok_or_else(|| format!("answer `{}` is not a letter A-D", d.answer))?;
    let right = &opts[(letter as u8 - b'A') as usize];
    let passage_n = norm(passage);
    if !passage_n.contains(&norm(right)) {
        return Err(format!(
            "the right option \"{right}\" is not in the passage"
        ));
    }
    if earlier.iter().any(|q| norm(&q.text) == norm(text)) {
        return Err("the same question was already asked".into());
    }
    if text.contains(",?") || text.contains("??") || opts.iter().any(|o| o.contains('_')) {
        return Err("stray punctuation or identifiers".into());
    }
    // The question must not give its answer away.
    let q_words = content_words(text);
    let r_words = content_words(right);
    let given_away = r_words.iter().filter(|w| q_words.contains(*w)).count();
    if !r_words.is_empty() && given_away * 2 >= r_words.len() {
        return Err(format!("the question gives away \"{right}\""));
    }
    let evidence = sentences(passage)
        .into_iter()
        .find(|s| norm(s).contains(&norm(right)))
        .unwrap_or_default();
    // The sentence that holds the answer must be about what the question asks.
    let shared = content_words(&evidence)
        .iter()
        .filter(|w| q_words.contains(*w) && !r_words.contains(*w))
        .count();
    if shared == 0 {
        return Err("the question and the sentence holding its answer share no words".into());
    }
    let mut text = text.to_string();
    if !text.ends_with('?') {
        text.push('?');
    }
    Ok(Question {
        text,
        options: opts,
        answer: letter,
        source: String::new(),
        evidence,
        origin: "model".into(),
    })
}

/// Sections and sentences about the project rather than the subject (thanks, sponsors,
/// contributing, licences, where to get help): nothing to quiz a student on.
fn about_the_project(text: &str) -> bool {
    const MARKS: &[&str] = &[
        "thank",
        "sponsor",
        "contribut",
        "licens",
        "licenc",
        "donat",
        "acknowledg",
        "code of conduct",
        "help wanted",
        "pull request",
        "getting help",
        "discord",
        "gitter",
        "twitter",
        "mailing list",
        "changelog",
        "msrv",
        "rust version",
        "semver",
        "maintainer",
        "funding",
        "coffee",
        "help you",
        "this repo",
        "file a ",
        "open an issue",
        "issue tracker",
        "stackoverflow",
        "subreddit",
        "forum",
        "discourse",
        "zulip",
    ];
    let t = text.to_lowercase();
    MARKS.iter().any(|m| t.contains(m))
        || t.split_whitespace()
            .any(|w| w.len() > 2 && w.starts_with(':') && w.ends_with(':'))
}

/// A section heading of the same kind (also support, community, related projects).
fn project_section(heading: &str) -> bool {
    const MARKS: &[&str] = &[
        "support",
        "chat",
        "community",
        "help",
        "related",
        "see also",
        "resources",
        "faq",
        "credits",
        "authors",
        "status",
        "badges",
    ];
    let h = heading.to_lowercase();
    about_the_project(&h) || h.trim() == "support" || MARKS.iter().any(|m| h.contains(m))
}

/// `sentence` with the first whole-word occurrence of `term` blanked out (inside backticks
/// too), if it has one.
fn blank_whole(sentence: &str, term: &str) -> Option<String> {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    let mut from = 0;
    while let Some(i) = sentence[from..].find(term) {
        let at = from + i;
        let before = sentence[..at].chars().next_back();
        let after = sentence[at + term.len()..].chars().next();
        if !word(before) && !word(after) {
            return Some(format!(
                "{}_____{}",
                &sentence[..at],
                &sentence[at + term.len()..]
            ));
        }
        from = at + term.len();
    }
    None
}

/// Whether a sentence can carry a question: long enough, a statement, about the subject.
fn askable(sentence: &str, min_words: usize) -> bool {
    sentence.split_whitespace().count() >= min_words
        && !sentence.ends_with(':')
        && !sentence.ends_with('?')
        && !about_the_project(sentence)
}

/// A fill-the-blank question: `blanked` (the evidence `sentence` with `answer` blanked), the
/// answer placed among the three `others` at a position that varies with `salt` and the
/// answer. `kind` names what fills the blank (`term`, `word`).
fn cloze(
    kind: &str,
    chunk: &ContextChunk,
    sentence: String,
    blanked: &str,
    answer: &str,
    mut options: Vec<String>,
    salt: usize,
) -> Question {
    let position = ((salt + answer.len()) % 4).min(options.len());
    options.insert(position, answer.to_string());
    Question {
        text: format!("Which {kind} fills the blank? \"{blanked}\""),
        options,
        answer: (b'A' + position as u8) as char,
        source: chunk.source(),
        evidence: sentence,
        origin: "notes".into(),
    }
}

/// The right options of `earlier` questions, normalised: no answer is asked for twice.
fn right_answers(earlier: &[Question]) -> Vec<String> {
    earlier
        .iter()
        .map(|q| norm(&q.options[(q.answer as u8 - b'A') as usize]))
        .collect()
}

/// The words of `s` as [`word_counts`] counts them: letters and inner hyphens.
fn words_of(s: &str) -> impl Iterator<Item = &str> {
    s.split(|c: char| !(c.is_alphabetic() || c == '-'))
        .map(|w| w.trim_matches('-'))
}

/// A question built from the notes of `chunk`: a term blanked if it names one, else a word.
fn question_built(
    chunk: &ContextChunk,
    terms: &[String],
    counts: &std::collections::HashMap<String, usize>,
    earlier: &[Question],
) -> Option<Question> {
    question_from_notes(chunk, terms, earlier, earlier.len())
        .or_else(|| question_from_words(chunk, counts, earlier, earlier.len()))
}

/// Adds the key terms of `texts` to `terms`, each once.
fn add_terms<'a>(terms: &mut Vec<String>, texts: impl IntoIterator<Item = &'a str>) {
    for text in texts {
        for t in key_terms(text) {
            if !terms.iter().any(|x| norm(x) == norm(&t)) {
                terms.push(t);
            }
        }
    }
}

/// A question built from a term the notes define: the defining sentence with the term blanked
/// out; the other options are other terms of the same notes.
fn question_from_notes(
    chunk: &ContextChunk,
    all_terms: &[String],
    earlier: &[Question],
    salt: usize,
) -> Option<Question> {
    let used = right_answers(earlier);
    let chunk_sentences = sentences(&chunk.text);
    for term in key_terms(&chunk.text) {
        if used.contains(&norm(&term)) {
            continue;
        }
        let Some((sentence, blanked)) = chunk_sentences
            .iter()
            .filter(|s| askable(s, 6))
            .filter_map(|s| blank_whole(s, &term).map(|b| (s.clone(), b)))
            .max_by_key(|(s, _)| usize::from(s.starts_with(&term)))
        else {
            continue;
        };
        let mut distractors: Vec<&String> = all_terms
            .iter()
            .filter(|t| norm(t) != norm(&term) && !sentence.contains(t.as_str()))
            .collect();
        // Spread the choice of distractors, deterministically.
        let n = distractors.len();
        if n < 3 {
            continue;
        }
        distractors.rotate_left((salt * 7 + term.len()) % n);
        let others = distractors.into_iter().take(3).cloned().collect();
        return Some(cloze(
            "term", chunk, sentence, &blanked, &term, others, salt,
        ));
    }
    None
}

/// Long words too common in any English text to test anything.
const PLAIN_WORDS: &[&str] = &[
    "because",
    "should",
    "without",
    "another",
    "through",
    "between",
    "before",
    "always",
    "instead",
    "rather",
    "things",
    "little",
    "people",
    "really",
    "something",
    "anything",
    "however",
    "whether",
    "example",
    "examples",
    "already",
    "during",
    "within",
    "around",
    "against",
    "number",
    "different",
    "several",
    "usually",
    "actually",
    "following",
    "simply",
    "possible",
    "important",
    "available",
    "directly",
    "certain",
    "across",
    "itself",
    "called",
];

/// How often each word of six letters or more occurs in `material`'s prose (lowercase).
pub fn word_counts(material: &str) -> std::collections::HashMap<String, usize> {
    let mut counts = std::collections::HashMap::new();
    for s in sentences(material) {
        for w in words_of(&s) {
            let w = w.to_lowercase();
            if w.chars().count() >= 6 && !PLAIN_WORDS.contains(&w.as_str()) {
                *counts.entry(w).or_insert(0) += 1;
            }
        }
    }
    counts
}

/// A question from a sentence of the passage with one of the subject's words blanked out
/// (a word the material uses at least twice; the longest such word of the sentence); the
/// other options are other such words, preferring ones with the same ending. For material
/// that defines no terms (most READMEs).
fn question_from_words(
    chunk: &ContextChunk,
    counts: &std::collections::HashMap<String, usize>,
    earlier: &[Question],
    salt: usize,
) -> Option<Question> {
    let used = right_answers(earlier);
    let used_evidence: Vec<String> = earlier.iter().map(|q| norm(&q.evidence)).collect();
    for sentence in sentences(&chunk.text) {
        let sentence = sentence.replace('`', "");
        if !askable(&sentence, 8) || used_evidence.contains(&norm(&sentence)) {
            continue;
        }
        let words: Vec<&str> = words_of(&sentence).collect();
        let Some(blank) = words
            .iter()
            .filter(|w| {
                let l = w.to_lowercase();
                counts.get(&l).is_some_and(|n| *n >= 2) && !used.contains(&l)
            })
            .max_by_key(|w| (w.chars().count(), counts.get(&w.to_lowercase()).copied()))
            .map(|w| w.to_string())
        else {
            continue;
        };
        let lower = blank.to_lowercase();
        let in_sentence: Vec<String> = words.iter().map(|w| w.to_lowercase()).collect();
        let ending = |w: &str, n: usize| {
            let c: Vec<char> = w.chars().collect();
            c[c.len().saturating_sub(n)..].iter().collect::<String>()
        };
        let mut others: Vec<(&String, usize)> = counts
            .iter()
            .filter(|(w, n)| **n >= 2 && !in_sentence.contains(*w) && **w != lower)
            .map(|(w, n)| {
                let kin = if ending(w, 3) == ending(&lower, 3) {
                    2
                } else {
                    usize::from(ending(w, 2) == ending(&lower, 2))
                };
                (w, kin * 1000 + (*n).min(999))
            })
            .collect();
        if others.len() < 3 {
            continue;
        }
        others.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let mut pool: Vec<&String> = others.iter().take(8).map(|(w, _)| *w).collect();
        let n = pool.len();
        pool.rotate_left((salt * 5 + blank.len()) % n);
        let Some(blanked) = blank_whole(&sentence, &blank) else {
            continue;
        };
        let others = pool.into_iter().take(3).cloned().collect();
        return Some(cloze(
            "word", chunk, sentence, &blanked, &lower, others, salt,
        ));
    }
    None
}

async fn write(d: &QuizDeps, s: &QuizState) -> Result<QuizStateUpdate, NodeError> {
    let n = s.num_questions.max(1) as usize;
    let mut all_terms: Vec<String> = Vec::new();
    add_terms(&mut all_terms, s.context.iter().map(|c| c.text.as_str()));
    // Too few terms in the retrieved passages for distractors: take the subject's other notes.
    if all_terms.len() < 4 {
        if let Ok(more) = d.course.search(&s.subject, "terms", 8).await {
            add_terms(&mut all_terms, more.iter().map(|c| c.text.as_str()));
        }
    }
    // The subject's words, for questions from material that defines no terms.
    let counts = word_counts(&d.course.material(&s.subject));
    let schema = json!({
        "type": "object",
        "properties": {
            "question": {"type": "string"},
            "options": {"type": "array", "items": {"type": "string"}, "minItems": 4, "maxItems": 4},
            "answer": {"type": "string", "enum": ["A", "B", "C", "D"]}
        },
        "required": ["question", "options", "answer"]
    });
    let opts = GenerateOptions::greedy()
        .max_tokens(160)
        .json_schema("question", schema);
    // The topic's words; three letters count here: TCP, UDP, DNS.
    let topic_words: Vec<String> = norm(&s.topic)
        .split(' ')
        .filter(|w| w.len() >= 3)
        .map(str::to_string)
        .collect();
    // Passages about the topic (by their text, heading or file name), when there are any,
    // and not about the project behind the notes (thanks, contributing, licences).
    let names_topic = |c: &ContextChunk| {
        let t = norm(&format!("{} {} {}", c.path, c.heading, c.text));
        topic_words.iter().any(|w| t.contains(w.as_str()))
    };
    let mut chunks: Vec<&ContextChunk> = s
        .context
        .iter()
        .filter(|c| !project_section(&c.heading))
        .collect();
    if chunks.is_empty() {
        chunks = s.context.iter().collect();
    }
    // A note named after the topic: its passages only (another note may mention the topic
    // in passing); otherwise the passages that name it.
    let topic_sections = d.course.sections(&s.subject, &s.topic);
    let topic_note = topic_sections.first().map(|c| c.path.clone());
    if let Some(note) = &topic_note {
        if chunks.iter().any(|c| &c.path == note) {
            chunks.retain(|c| &c.path == note);
        }
    } else if chunks.iter().any(|c| names_topic(c)) {
        chunks.retain(|c| names_topic(c));
    }
    let mut questions: Vec<Question> = Vec::new();
    let mut attempt = 0usize;
    while questions.len() < n && attempt < n + chunks.len() {
        let chunk = chunks[attempt % chunks.len()];
        attempt += 1;
        let passage = clip(&chunk.text, 900);
        let prompt = format!(
            "Passage from the course notes:\n{passage}\n\nWrite one {} multiple-choice question about {} that this passage answers. \
             Give four options; the right one must be words from the passage.",
            s.difficulty, s.topic
        );
        let drafted = match d.llm.invoke(&[Message::human(prompt)], &opts, None).await {
            Ok(m) => ferrograph::chat::parse_structured::<Drafted>(&m.content)
                .map_err(|e| e.to_string())
                .and_then(|dr| check_draft(&dr, &chunk.text, &questions)),
            Err(e) => Err(e.to_string()),
        };
        match drafted {
            Ok(mut q) => {
                q.source = chunk.source();
                questions.push(q);
            }
            Err(why) => {
                tracing::info!(reason = %why, "model's quiz question rejected; building one from the notes");
                if let Some(q) = question_built(chunk, &all_terms, &counts, &questions) {
                    questions.push(q);
                }
            }
        }
    }
    // Short of questions: more of the topic's passages, for questions built from the notes.
    if questions.len() < n {
        // The sections of a note named after the topic, then what a search finds.
        let mut more = topic_sections.clone();
        more.extend(
            d.course
                .search(&s.subject, &s.topic, 8)
                .await
                .unwrap_or_default(),
        );
        for chunk in more.iter().filter(|c| {
            topic_note
                .as_ref()
                .map_or_else(|| names_topic(c), |n| &c.path == n)
                && !project_section(&c.heading)
        }) {
            while questions.len() < n {
                match question_built(chunk, &all_terms, &counts, &questions) {
                    Some(q) => questions.push(q),
                    None => break,
                }
            }
        }
    }
    if questions.len() < n {
        return Err(NodeError::fatal(format!(
            "could write only {} of {n} questions about \"{}\" from the notes of `{}`: the model's \
             questions failed the checks, and the passages found have too few terms and sentences \
             to build questions from; ask for fewer questions or another topic",
            questions.len(),
            s.topic,
            s.subject
        )));
    }
    Ok(QuizStateUpdate::new().questions(questions))
}

/// The interrupt's payload for question `idx`.
pub fn question_payload(s: &QuizState, idx: usize) -> Value {
    let q = &s.questions[idx];
    let options: Vec<String> = (0..q.options.len())
        .map(|i| q.option((b'A' + i as u8) as char))
        .collect();
    json!({
        "action": "answer_question",
        "question_num": idx + 1,
        "total_questions": s.questions.len(),
        "question_text": q.text,
        "options": options,
        "feedback": idx.checked_sub(1).and_then(|p| s.answers.get(p)).map(|a| a.feedback.clone()),
        "invalid_answer": s.invalid_answer,
    })
}

async fn ask(d: &QuizDeps, s: &QuizState, ctx: &NodeContext) -> Result<QuizStateUpdate, NodeError> {
    let idx = s.answers.len();
    let Some(q) = s.questions.get(idx) else {
        return Ok(QuizStateUpdate::new());
    };
    let given: Value = ctx.interrupt(question_payload(s, idx))?;
    let letter = match read_answer(&given, &q.options) {
        Ok(l) => l,
        Err(why) => return Ok(QuizStateUpdate::new().invalid_answer(Some(why))),
    };
    // Crash-test knob: wait this many milliseconds between reading the answer and grading
    // it, so a test can kill the process there (the answer is recorded, the step is not).
    if let Some(ms) = std::env::var("FERROGRAPH_TUTOR_GRADE_DELAY_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
    let correct = letter == q.answer;
    let right = q.option(q.answer);
    let verdict = if correct {
        format!("Correct: {right}.")
    } else {
        format!(
            "Not quite: you chose {}, the answer is {right}.",
            q.option(letter)
        )
    };
    let explanation = explain(d, q).await;
    Ok(QuizStateUpdate::new()
        .answers(vec![GradedAnswer {
            given: letter,
            correct,
            feedback: format!("{verdict} {explanation}"),
        }])
        .invalid_answer(None))
}

/// One sentence on why the right answer is right: the model's when usable (and naming the
/// answer), else the notes' sentence.
async fn explain(d: &QuizDeps, q: &Question) -> String {
    let right = &q.options[(q.answer as u8 - b'A') as usize];
    let fallback = if q.evidence.is_empty() {
        format!("See {}.", q.source)
    } else {
        format!("The notes say: \"{}\"", q.evidence)
    };
    let prompt = format!(
        "Question: {}\nRight answer: {right}\nNotes: {}\nIn one sentence, explain why the right answer is right.",
        q.text, q.evidence
    );
    let opts = GenerateOptions::greedy().max_tokens(60).stop("\n");
    match d.llm.invoke(&[Message::human(prompt)], &opts, None).await {
        Ok(m) => {
            let t = m.content.trim();
            let names_it = norm(t).contains(&norm(right));
            if unusable(t).is_none() && names_it && t.len() <= 400 {
                t.to_string()
            } else {
                fallback
            }
        }
        Err(_) => fallback,
    }
}

/// The quiz's closing message: the score and each question's feedback.
pub fn summary(s: &QuizState) -> String {
    let mut out = format!(
        "Quiz on {}: {}/{} correct.",
        s.topic,
        s.correct(),
        s.questions.len()
    );
    for (i, (q, a)) in s.questions.iter().zip(&s.answers).enumerate() {
        out.push_str(&format!(
            "\n{}. {} {}\n   {}",
            i + 1,
            if a.correct { "✓" } else { "✗" },
            q.text,
            a.feedback
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(text: &str) -> ContextChunk {
        ContextChunk {
            path: "networks/transport.md".into(),
            heading: "TCP".into(),
            text: text.into(),
            score: 1.0,
        }
    }

    #[test]
    fn drafts_are_checked_against_the_passage() {
        let p = "**UDP** is connectionless: each datagram is sent on its own.";
        let good = Drafted {
            question: "Which protocol sends each datagram on its own".into(),
            options: vec!["TCP".into(), "UDP".into(), "IP".into(), "DNS".into()],
            answer: "B".into(),
        };
        let q = check_draft(&good, p, &[]).unwrap();
        assert_eq!(q.answer, 'B');
        assert!(q.text.ends_with('?'));
        assert!(q.evidence.contains("connectionless"));
        let wrong = Drafted {
            answer: "A".into(),
            ..good
        };
        assert!(check_draft(&wrong, p, &[])
            .unwrap_err()
            .contains("not in the passage"));
        let dup = Drafted {
            question: "Which protocol sends each datagram on its own".into(),
            options: vec!["UDP".into(), "udp".into(), "IP".into(), "DNS".into()],
            answer: "A".into(),
        };
        assert!(check_draft(&dup, p, &[]).unwrap_err().contains("same"));
        // Seen from SmolLM2: a question that gives its answer away, and one whose answer's
        // sentence is about something else.
        let p2 = "- **Three-way handshake**: SYN, SYN-ACK, ACK; opens a TCP connection.\n- **TTL**: a hop counter that stops packets from looping forever.";
        let away = Drafted {
            question: "What is the purpose of the TCP handshake".into(),
            options: vec![
                "three-way handshake".into(),
                "SYN".into(),
                "ACK".into(),
                "TTL".into(),
            ],
            answer: "A".into(),
        };
        assert!(check_draft(&away, p2, &[])
            .unwrap_err()
            .contains("gives away"));
        let off = Drafted {
            question: "What is the default route for TCP".into(),
            options: vec!["TTL".into(), "SYN".into(), "ACK".into(), "UDP".into()],
            answer: "A".into(),
        };
        assert!(check_draft(&off, p2, &[])
            .unwrap_err()
            .contains("share no words"));
    }

    #[test]
    fn questions_from_notes_blank_a_defined_term() {
        let c = chunk(
            "- **Flow control**: the receiver limits the sender through the advertised window.",
        );
        let terms: Vec<String> = [
            "Flow control",
            "Congestion control",
            "Sequence number",
            "Port",
        ]
        .map(String::from)
        .to_vec();
        let q = question_from_notes(&c, &terms, &[], 0).unwrap();
        assert_eq!(q.options.len(), 4);
        assert_eq!(q.options[(q.answer as u8 - b'A') as usize], "Flow control");
        assert!(q.text.contains("_____"));
        assert!(!q.text.contains("Flow control"));
        // The same term is not asked twice.
        assert!(question_from_notes(&c, &terms, &[q], 1).is_none());
    }

    #[test]
    fn questions_from_words_when_nothing_is_defined() {
        let material = "sled is a transactional embedded database for Rust. \
            Transactions are serializable. The database keeps a log on disk. \
            An iterator walks the keys in order. Compression is a build feature. \
            The embedded database needs no server. Every iterator is double ended. \
            Compression saves space on disk. Serializable transactions never see \
            half of another one.";
        let counts = word_counts(material);
        let c = chunk("A lightweight pure-rust high-performance transactional embedded database for your programs.");
        let q = question_from_words(&c, &counts, &[], 0).unwrap();
        let right = q.options[(q.answer as u8 - b'A') as usize].clone();
        assert_eq!(right, "database", "{q:?}");
        assert!(q.text.contains("_____"), "{q:?}");
        assert!(!q.text.to_lowercase().contains("database"), "{q:?}");
        let mut opts = q.options.clone();
        opts.dedup();
        assert_eq!(opts.len(), 4);
        // No option is another word of the same sentence.
        for o in &q.options {
            assert!(
                o == &right || !c.text.to_lowercase().contains(o.as_str()),
                "{o}"
            );
        }
        // The same sentence is not asked twice.
        assert!(question_from_words(&c, &counts, &[q], 1).is_none());
    }

    #[test]
    fn blanks_are_whole_words_and_project_text_is_not_asked() {
        assert_eq!(
            blank_whole("For more on demo_app, run `app`.", "app").as_deref(),
            Some("For more on demo_app, run `_____`.")
        );
        assert_eq!(blank_whole("demo_app only", "app"), None);
        assert!(about_the_project(
            "Special thanks to Meili for providing engineering effort."
        ));
        assert!(about_the_project(
            "If you'd like to contribute to Rayon, check the list."
        ));
        assert!(!about_the_project(
            "sled supports compare and swap on single keys."
        ));
        assert!(project_section("Getting Help"));
        assert!(project_section("Supported Rust Versions"));
        assert!(!project_section("Parallel iterators and more"));
        assert!(!askable("For more information on the demo, try:", 3));
    }
}
