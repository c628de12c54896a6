//! Text rules the tutor checks in code: question difficulty, the thinking/answer split, answers
//! a person would reject (empty, repetitive), and reading a student's quiz answer.

use serde_json::Value;

/// How hard a question is (seed 002's `DifficultyLevel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Difficulty {
    /// A definition or a fact.
    Basic,
    /// An explanation.
    Intermediate,
    /// Reasoning: comparisons, causes, designs, consequences.
    Advanced,
}

impl Difficulty {
    /// `basic`, `intermediate` or `advanced`.
    pub fn as_str(self) -> &'static str {
        match self {
            Difficulty::Basic => "basic",
            Difficulty::Intermediate => "intermediate",
            Difficulty::Advanced => "advanced",
        }
    }

    /// Reads a level's name; anything else is `None`.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "basic" | "easy" => Some(Difficulty::Basic),
            "intermediate" | "medium" => Some(Difficulty::Intermediate),
            "advanced" | "hard" => Some(Difficulty::Advanced),
            _ => None,
        }
    }
}

const ADVANCED_CUES: &[&str] = &[
    "why ",
    "compare",
    "difference between",
    "differences between",
    "trade-off",
    "tradeoff",
    "what would happen",
    "what happens if",
    "prove",
    "justify",
    "design ",
    "analyse",
    "analyze",
    "advantages and disadvantages",
    "pros and cons",
    "step by step",
];

const BASIC_CUES: &[&str] = &[
    "what is ",
    "what's ",
    "what are ",
    "define ",
    "definition of",
    "who ",
    "when ",
    "what does ",
    "stand for",
    "name the",
    "list ",
];

/// Classifies a question by its wording. `None` when no rule applies (the seed then uses the
/// intermediate prompt).
pub fn classify(question: &str) -> Option<Difficulty> {
    let q = format!(" {} ", question.to_lowercase());
    let words = question.split_whitespace().count();
    if ADVANCED_CUES.iter().any(|c| q.contains(c)) || words > 30 {
        return Some(Difficulty::Advanced);
    }
    if q.contains("explain") || q.contains("how does") || q.contains("how do") {
        return Some(Difficulty::Intermediate);
    }
    if BASIC_CUES.iter().any(|c| q.contains(c)) {
        return Some(Difficulty::Basic);
    }
    None
}

/// Splits an answer into its `<thinking>` section and the answer proper. Tagged output gives
/// `(Some(thinking), answer)` where the answer is the `<answer>` section, or the text after the
/// thinking when there is no `<answer>` tag; untagged output stays as it is.
pub fn split_thinking(content: &str) -> (Option<String>, String) {
    let thinking = between(content, "<thinking>", "</thinking>");
    let answer = between(content, "<answer>", "</answer>");
    match (thinking, answer) {
        (None, None) => (None, content.trim().to_string()),
        (t, Some(a)) => (t.map(|(_, s)| s), a.1),
        (Some((end, t)), None) => {
            let rest = content[end..].trim();
            // An unclosed <answer> tag: everything after it.
            let rest = rest.strip_prefix("<answer>").unwrap_or(rest).trim();
            (Some(t), rest.to_string())
        }
    }
}

/// The trimmed text between `open` and `close` (or to the end when `close` is missing), with
/// the index just past it.
fn between(s: &str, open: &str, close: &str) -> Option<(usize, String)> {
    let start = s.find(open)? + open.len();
    match s[start..].find(close) {
        Some(n) => Some((
            start + n + close.len(),
            s[start..start + n].trim().to_string(),
        )),
        None => Some((s.len(), s[start..].trim().to_string())),
    }
}

/// Why a text is not something to show a student, if it is not: empty, too short, the same
/// words over and over, or not prose.
pub fn unusable(text: &str) -> Option<String> {
    let t = text.trim();
    let words: Vec<String> = t
        .split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect();
    if words.len() < 3 {
        return Some(format!("too short ({} words)", words.len()));
    }
    let letters = t.chars().filter(|c| c.is_alphabetic()).count();
    if letters * 2 < t.chars().count() {
        return Some("mostly not letters".into());
    }
    let distinct: std::collections::HashSet<&String> = words.iter().collect();
    if words.len() >= 12 && distinct.len() * 3 < words.len() {
        return Some(format!(
            "repetitive ({} distinct words of {})",
            distinct.len(),
            words.len()
        ));
    }
    // A phrase of four words that comes back three times or more.
    let mut seen = std::collections::HashMap::new();
    for w in words.windows(4) {
        let n = seen.entry(w.join(" ")).or_insert(0);
        *n += 1;
        if *n >= 3 {
            return Some(format!("repeats \"{}\"", w.join(" ")));
        }
    }
    None
}

/// The sentences of a passage (markdown list markers and emphasis removed).
pub fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        let raw = line.trim();
        // Code blocks and table rows are not sentences.
        if raw.starts_with("```") {
            in_code = !in_code;
            out.push(String::new());
            continue;
        }
        if in_code || raw.contains(" | ") {
            out.push(String::new());
            continue;
        }
        // Headings and list items stand alone; other lines join their paragraph.
        let alone = raw.starts_with('#') || raw.starts_with("- ") || raw.starts_with("* ");
        let l = raw.trim_start_matches(['-', '*', '#']).trim();
        if l.is_empty() {
            out.push(String::new());
            continue;
        }
        if alone {
            out.push(String::new());
        }
        out.push(l.replace("**", ""));
        if alone {
            out.push(String::new());
        }
    }
    // Paragraphs joined, then cut after '.', '?' or '!' followed by a space.
    let mut all = Vec::new();
    for para in out.split(|l| l.is_empty()) {
        let p = para.join(" ");
        all.extend(
            sentence_pieces(&p)
                .into_iter()
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        );
    }
    all
}

/// The terms a passage defines: its **bold** words.
pub fn bold_terms(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(a) = rest.find("**") {
        let after = &rest[a + 2..];
        let Some(b) = after.find("**") else { break };
        let term = after[..b].trim().to_string();
        if !term.is_empty()
            && term.len() <= 40
            && !out.iter().any(|t| t.eq_ignore_ascii_case(&term))
        {
            out.push(term);
        }
        rest = &after[b + 2..];
    }
    out
}

/// The terms a passage names, most deliberate first: its **bold** terms, its `code` spans in
/// prose (not code blocks; at most three words), and the names its sentences define (`X is
/// a ...`, `X are the ...`, with X of one to three words and not a pronoun). Code spans are
/// returned without their backticks.
pub fn key_terms(text: &str) -> Vec<String> {
    /// Bold words that label a remark rather than name a term.
    const NOT_TERMS: &[&str] = &[
        "note",
        "notes",
        "warning",
        "important",
        "tip",
        "example",
        "caution",
        "deprecated",
        "todo",
        "nb",
        "update",
        "new",
        "experimental",
        "unstable",
        "required",
        "optional",
    ];
    let mut out: Vec<String> = Vec::new();
    let push = |t: &str, out: &mut Vec<String>| {
        let t = t.trim_end_matches(':');
        let t = t.trim();
        if !t.is_empty()
            && t.chars().count() <= 40
            && t.split_whitespace().count() <= 3
            && t.chars().any(char::is_alphabetic)
            && !NOT_TERMS.contains(&t.to_lowercase().as_str())
            && !out.iter().any(|x| x.eq_ignore_ascii_case(t))
        {
            out.push(t.to_string());
        }
    };
    for t in bold_terms(text) {
        push(&t, &mut out);
    }
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(a) = rest.find('`') {
            let after = &rest[a + 1..];
            let Some(b) = after.find('`') else { break };
            push(&after[..b], &mut out);
            rest = &after[b + 1..];
        }
    }
    const NOT_NAMES: &[&str] = &[
        "it",
        "this",
        "that",
        "there",
        "these",
        "those",
        "which",
        "what",
        "he",
        "she",
        "they",
        "here",
        "one",
        "each",
        "everything",
        "nothing",
        "all",
        "the result",
        "the goal",
    ];
    const QUANTIFIERS: &[&str] = &[
        "many", "some", "most", "all", "both", "few", "each", "every", "no", "other", "such",
        "our", "your", "my", "its", "their", "his", "her", "if", "when", "so",
    ];
    for s in sentences(text) {
        let s = s.replace('`', "");
        for verb in [" is ", " are "] {
            let Some((name, rest)) = s.split_once(verb) else {
                continue;
            };
            let name = name.trim();
            let n = name.split_whitespace().count();
            let defines = ["a ", "an ", "the "].iter().any(|a| rest.starts_with(a));
            if (1..=3).contains(&n)
                && defines
                && !NOT_NAMES.contains(&name.to_lowercase().as_str())
                && !QUANTIFIERS.contains(
                    &name
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .to_lowercase()
                        .as_str(),
                )
                && name.chars().next().is_some_and(char::is_alphanumeric)
                && !name.contains([',', ':', '(', '"'])
            {
                push(name, &mut out);
            }
            break;
        }
    }
    out
}

/// Reads a student's answer to a question with `options`: a letter (`b`, `B)`, `answer: B`)
/// or an option's text. The error says what is accepted.
pub fn read_answer(value: &Value, options: &[String]) -> Result<char, String> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Object(o) => match o.get("answer") {
            Some(Value::String(s)) => s.clone(),
            _ => return Err("expected a letter or {\"answer\": \"B\"}".into()),
        },
        other => other.to_string(),
    };
    let letters: Vec<char> = (0..options.len())
        .map(|i| (b'A' + i as u8) as char)
        .collect();
    let t = text.trim();
    let lowered = t.to_lowercase();
    let t = lowered
        .strip_prefix("answer")
        .map(|r| r.trim_start_matches([':', ' ', '=']))
        .unwrap_or(&lowered)
        .trim();
    let mut chars = t.chars();
    if let Some(first) = chars.next() {
        let up = first.to_ascii_uppercase();
        let rest: String = chars.collect();
        let rest = rest.trim_start();
        let ends = rest.is_empty() || rest.starts_with([')', '.', ':', ' ']);
        if letters.contains(&up) && ends {
            return Ok(up);
        }
    }
    for (i, o) in options.iter().enumerate() {
        if o.trim().eq_ignore_ascii_case(t) {
            return Ok(letters[i]);
        }
    }
    Err(format!(
        "\"{}\" is not one of the options: answer with {}",
        text.trim(),
        letters
            .iter()
            .map(char::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// What the student's words clearly ask for, if anything: a quiz, or the course guide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intent {
    /// "quiz me", "test me", "ask me questions".
    Quiz,
    /// Exams, grading, schedule, office hours.
    Guide,
}

const QUIZ_CUES: &[&str] = &[
    "quiz",
    "test me",
    "examine me",
    "ask me questions",
    "ask me some questions",
    "practice questions",
    "multiple choice",
    "multiple-choice",
];

const GUIDE_CUES: &[&str] = &[
    "exam",
    "grade",
    "grading",
    "assessment",
    "office hour",
    "schedule",
    "syllabus",
    "course guide",
    "units of the course",
    "deadline",
    "how many weeks",
    "reading list",
];

/// Reads the student's words for a clear request.
pub fn intent(message: &str) -> Option<Intent> {
    let m = message.to_lowercase();
    if QUIZ_CUES.iter().any(|c| m.contains(c)) {
        return Some(Intent::Quiz);
    }
    if GUIDE_CUES.iter().any(|c| m.contains(c)) {
        return Some(Intent::Guide);
    }
    None
}

/// A quiz request's topic and number of questions, read from the words: "quiz me on TCP with
/// 2 questions" is ("TCP", Some(2)).
pub fn quiz_request(message: &str) -> (String, Option<u32>) {
    let words: Vec<&str> = message.split_whitespace().collect();
    let number = |w: &str| -> Option<u32> {
        let w = w
            .trim_matches(|c: char| !c.is_alphanumeric())
            .to_lowercase();
        match w.as_str() {
            "one" | "a" => Some(1),
            "two" | "couple" => Some(2),
            "three" => Some(3),
            "four" => Some(4),
            "five" => Some(5),
            _ => w.parse().ok(),
        }
    };
    let mut n = None;
    for (i, w) in words.iter().enumerate() {
        let next = words
            .get(i + 1)
            .map(|x| x.to_lowercase())
            .unwrap_or_default();
        if next.starts_with("question") {
            n = number(w);
        }
    }
    let lower = message.to_lowercase();
    let topic = [" on ", " about ", " of "]
        .iter()
        .filter_map(|k| lower.find(k).map(|i| i + k.len()))
        .min()
        .map(|start| {
            let rest = &message[start..];
            let end = [" with ", " using ", ",", "?", "."]
                .iter()
                .filter_map(|k| rest.to_lowercase().find(k))
                .min()
                .unwrap_or(rest.len());
            rest[..end].trim().to_string()
        })
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| message.trim().to_string());
    (topic, n)
}

/// The text up to its last full sentence (all of it when no sentence ends).
pub fn whole_sentences(s: &str) -> String {
    let t = s.trim_end();
    let end = t
        .char_indices()
        .rev()
        .find(|(i, c)| {
            matches!(c, '.' | '!' | '?')
                && t[i + c.len_utf8()..]
                    .chars()
                    .next()
                    .is_none_or(char::is_whitespace)
        })
        .map(|(i, c)| i + c.len_utf8());
    match end {
        Some(e) => t[..e].to_string(),
        None => t.to_string(),
    }
}

const CALENDAR: &[&str] = &[
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
    "january",
    "february",
    "march",
    "april",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

/// Why an answer states something its sources do not, if it does: a number (a date, a
/// percentage, a count) or a day or month that none of the sources has. A model of 135M
/// parameters invents exactly these ("the exam is worth 100%").
pub fn unsupported(answer: &str, sources: &str) -> Option<String> {
    let src = sources.to_lowercase();
    // Numbers are compared as whole tokens ("10" is not in "week 10-12" as "10%" and not in
    // "100"), a percentage with its sign.
    let split = |s: &str| -> Vec<String> {
        s.split(|c: char| !(c.is_alphanumeric() || c == '.' || c == '%'))
            .map(|t| t.trim_matches('.').to_string())
            .filter(|t| !t.is_empty())
            .collect()
    };
    let src_tokens: std::collections::HashSet<String> = split(&src).into_iter().collect();
    for token in split(answer) {
        let t = token.as_str();
        if t.chars().any(|c| c.is_ascii_digit()) {
            let number: String = t
                .chars()
                .filter(|c| c.is_ascii_digit() || *c == '.' || *c == '%')
                .collect();
            let bare = number.trim_end_matches('%');
            let found = if number.ends_with('%') {
                src_tokens.contains(&number)
            } else {
                src_tokens.contains(bare)
                    || src_tokens.contains(&format!("{bare}%"))
                    || src_tokens
                        .iter()
                        .any(|s| s.trim_end_matches(char::is_alphabetic) == bare)
            };
            if !found {
                return Some(format!("\"{t}\" is in no source"));
            }
        }
        let w = t.to_lowercase();
        if CALENDAR.contains(&w.as_str()) && !src.contains(&w) {
            return Some(format!("\"{t}\" is in no source"));
        }
    }
    None
}

/// The first identifier-like token of `answer` that no source has: a dotted or `::` path, a
/// name with an underscore, an inner capital (`camelCase`) or an acronym of three capitals or
/// more. A small model invents these ("a Rust implementation of the linode.crust").
pub fn invented_identifier(answer: &str, sources: &str) -> Option<String> {
    let src = sources.to_lowercase();
    for raw in answer.split_whitespace() {
        let t = raw.trim_matches(|c: char| !c.is_alphanumeric());
        if t.chars().any(|c| c.is_ascii_digit()) || t.chars().count() < 3 {
            continue;
        }
        let chars: Vec<char> = t.chars().collect();
        let dotted = t.contains("::")
            || chars
                .windows(3)
                .any(|w| w[0].is_alphabetic() && w[1] == '.' && w[2].is_alphabetic());
        let underscore = t.contains('_');
        let inner_capital = chars
            .windows(2)
            .any(|w| w[0].is_lowercase() && w[1].is_uppercase());
        let acronym = chars.len() >= 3 && chars.iter().all(|c| c.is_ascii_uppercase());
        if (dotted || underscore || inner_capital || acronym) && !src.contains(&t.to_lowercase()) {
            return Some(format!("\"{t}\" is in no source"));
        }
    }
    None
}

/// Words too common in explanations to show that a sentence comes from its sources (besides
/// [`QUESTION_WORDS`], which are left out too).
const EXPLAINING_WORDS: &[&str] = &[
    "also",
    "allows",
    "allow",
    "provides",
    "provide",
    "make",
    "makes",
    "such",
    "other",
    "more",
    "most",
    "many",
    "some",
    "than",
    "then",
    "very",
    "well",
    "only",
    "just",
    "like",
    "because",
    "while",
    "each",
    "including",
    "include",
    "includes",
    "different",
    "various",
    "using",
    "uses",
    "able",
    "based",
    "help",
    "helps",
    "designed",
    "called",
    "known",
    "typically",
    "often",
    "usually",
    "between",
    "within",
    "without",
    "these",
    "those",
    "being",
    "has",
    "been",
    "type",
    "kind",
    "thing",
    "things",
    "example",
    "simple",
    "easy",
    "important",
    "specific",
    "need",
    "needs",
];

/// The first sentence of `answer` (its index and text) that its sources do not back: of its
/// meaning words (four letters or more, not common explaining words) fewer than half are in
/// the sources (a word counts when the sources have a word with its first five letters, so
/// `serializing` is backed by `serialization`). Sentences of fewer than three such words are
/// not judged. A small model states plausible falsehoods ("regex is a programming
/// language"): this is where they are caught.
pub fn unbacked_sentence(answer: &str, sources: &str) -> Option<(usize, String)> {
    let src_words: std::collections::HashSet<String> = norm_words(sources)
        .split(' ')
        .map(|w| w.chars().take(5).collect::<String>())
        .collect();
    for (i, sentence) in sentence_pieces(answer).into_iter().enumerate() {
        let words: Vec<String> = norm_words(sentence)
            .split(' ')
            .filter(|w| {
                w.len() >= 4 && !EXPLAINING_WORDS.contains(w) && !QUESTION_WORDS.contains(w)
            })
            .filter(|w| !w.chars().all(|c| c.is_ascii_digit()))
            .map(str::to_string)
            .collect();
        if words.len() < 3 {
            continue;
        }
        let backed = words
            .iter()
            .filter(|w| src_words.contains(&w.chars().take(5).collect::<String>()))
            .count();
        if backed * 2 < words.len() {
            return Some((i, sentence.trim().to_string()));
        }
    }
    None
}

/// `text` cut into sentences as written (after '.', '?' or '!' and a space), each piece
/// keeping what follows it up to the next sentence (spaces, line breaks, list markers).
pub fn sentence_pieces(text: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut pieces = Vec::new();
    let mut start = 0;
    for (k, &(i, c)) in chars.iter().enumerate() {
        let end =
            matches!(c, '.' | '?' | '!') && chars.get(k + 1).is_none_or(|(_, n)| n.is_whitespace());
        if end {
            pieces.push(&text[start..i + c.len_utf8()]);
            start = i + c.len_utf8();
        }
    }
    if start < text.len() && !text[start..].trim().is_empty() {
        pieces.push(&text[start..]);
    }
    pieces
}

/// `answer` without the prompt's scaffolding that a small model echoes: a leading
/// `Answer:`, source markers (`[crates/clap.md (clap)] `) at the start of a line, and
/// everything from a line that starts the prompt's format again (`Question:`, `From the
/// course:`).
pub fn strip_scaffolding(answer: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for line in answer.lines() {
        let t = line.trim_start();
        if t.starts_with("Question:") || t.starts_with("From the course:") {
            break;
        }
        let t = match t.strip_prefix('[').and_then(|r| r.split_once(']')) {
            Some((inside, rest)) if inside.contains('/') && inside.contains('.') => {
                rest.trim_start()
            }
            _ => line,
        };
        let t = t.strip_prefix("Answer:").map(str::trim_start).unwrap_or(t);
        out.push(t);
    }
    out.join("\n").trim().to_string()
}

/// The answer up to where it degenerates: whole sentences, stopping at the first that loops
/// by itself (a word of four letters or more three times), repeats a phrase of four words
/// from an earlier sentence, or is not prose. The flag says something was cut.
pub fn before_degenerate(answer: &str) -> (String, bool) {
    let mut kept = String::new();
    let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut seen_pieces: std::collections::HashSet<String> = std::collections::HashSet::new();
    for piece in sentence_pieces(answer) {
        let words: Vec<String> = norm_words(piece)
            .split(' ')
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect();
        let mut counts = std::collections::HashMap::new();
        for w in words.iter().filter(|w| w.len() >= 4) {
            *counts.entry(w.as_str()).or_insert(0) += 1;
        }
        // Three times, and a fifth of the sentence: "protocol" four times in a sentence of
        // thirty words comparing TCP and UDP is prose.
        let loops = counts.values().any(|n| *n >= 3 && n * 5 >= words.len());
        let grams: Vec<String> = words.windows(4).map(|w| w.join(" ")).collect();
        // `insert` is false for a sentence seen before.
        let again = !seen_pieces.insert(words.join(" ")) && !words.is_empty();
        let repeats = again || grams.iter().any(|g| seen.contains(g));
        let junk = words.len() >= 3 && unusable(piece).is_some_and(|w| !w.starts_with("too short"));
        if loops || repeats || junk {
            let cut = kept.trim_end().to_string();
            return (cut, true);
        }
        seen.extend(grams);
        kept.push_str(piece);
    }
    (kept.trim_end().to_string(), false)
}

/// What a question asks the definition of ("What is sled?", "what does tokio do"), if it
/// asks one: the name, lowercase.
pub fn defined_name(question: &str) -> Option<String> {
    let q = norm_words(question);
    let rest = [
        "what is ",
        "what are ",
        "what s ",
        "what does ",
        "what do ",
        "tell me about ",
        "explain ",
    ]
    .iter()
    .find_map(|p| q.strip_prefix(p))?;
    let rest = rest
        .strip_suffix(" do")
        .or_else(|| rest.strip_suffix(" for"))
        .unwrap_or(rest);
    let rest = rest
        .strip_prefix("a ")
        .or_else(|| rest.strip_prefix("an "))
        .or_else(|| rest.strip_prefix("the "))
        .unwrap_or(rest)
        .trim();
    (!rest.is_empty() && rest.split(' ').count() <= 3).then(|| rest.to_string())
}

/// Removes parenthesised names that the sources do not have ("UDP (Unnumbered Transfer
/// Protocol)" when the notes say "User Datagram Protocol").
pub fn drop_invented_names(answer: &str, sources: &str) -> String {
    split_invented_names(answer, sources).0
}

/// [`drop_invented_names`], with the parenthesised names it removed.
pub fn split_invented_names(answer: &str, sources: &str) -> (String, Vec<String>) {
    let src = norm_words(sources);
    let mut dropped = Vec::new();
    let mut out = String::new();
    let mut rest = answer;
    while let Some(open) = rest.find(" (") {
        let Some(close) = rest[open..].find(')') else {
            break;
        };
        let inner = &rest[open + 2..open + close];
        let capitals = inner
            .split_whitespace()
            .filter(|w| w.chars().next().is_some_and(char::is_uppercase))
            .count();
        out.push_str(&rest[..open]);
        if capitals >= 2 && !src.contains(&norm_words(inner)) {
            let name = format!("({inner})");
            if !dropped.contains(&name) {
                dropped.push(name);
            }
        } else {
            out.push_str(&rest[open..open + close + 1]);
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    (out, dropped)
}

/// Lowercase words joined by single spaces, punctuation dropped: the form texts are compared
/// in.
pub fn norm_words(s: &str) -> String {
    s.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Words that say how a question is asked, not what it is about.
const QUESTION_WORDS: &[&str] = &[
    "what", "which", "when", "where", "does", "have", "that", "this", "with", "from", "about",
    "there", "their", "they", "them", "your", "into", "will", "would", "should", "could",
    "explain", "tell", "please", "describe", "mean", "means", "work", "works", "used",
];

/// The words of `s` that carry its meaning: four letters or more, not a question's own words.
pub fn meaning_words(s: &str) -> Vec<String> {
    norm_words(s)
        .split(' ')
        .filter(|w| w.len() >= 4 && !QUESTION_WORDS.contains(w))
        .map(str::to_string)
        .collect()
}

/// The `n` pieces of `sources` that share the most meaning words with `question`, in their
/// order: list items and table rows whole, paragraphs one sentence at a time (code blocks
/// are skipped). A sentence that starts with a word of the question (a definition) comes
/// first among equals.
pub fn relevant_lines(question: &str, sources: &str, n: usize) -> Vec<String> {
    let q: std::collections::HashSet<String> = meaning_words(question)
        .into_iter()
        // Also the short names people ask about (TCP, DNS, sled).
        .chain(
            norm_words(question)
                .split(' ')
                .filter(|w| {
                    w.len() == 3
                        && !["the", "and", "how", "why", "are", "for", "can", "its"].contains(w)
                })
                .map(str::to_string),
        )
        .collect();
    let mut pieces: Vec<String> = Vec::new();
    let mut in_code = false;
    for line in sources.lines().map(str::trim) {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        // A search hit starts with its source in brackets: `[dns.md › Records] text`.
        let line = match line.strip_prefix('[').and_then(|r| r.split_once("] ")) {
            Some((_, rest)) => rest.trim(),
            None => line,
        };
        if in_code || line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with("- ") || line.starts_with("* ") || line.contains(" | ") {
            pieces.push(line.to_string());
        } else {
            pieces.extend(sentences(line));
        }
    }
    let mut scored: Vec<(usize, usize, String)> = pieces
        .into_iter()
        .enumerate()
        .filter(|(_, l)| l.split_whitespace().count() >= 3)
        .map(|(i, l)| {
            let words = norm_words(&l);
            let hits = words.split(' ').filter(|w| q.contains(*w)).count();
            let first = words.split(' ').next().is_some_and(|w| q.contains(w));
            (hits * 2 + usize::from(first && hits > 0), i, l)
        })
        .filter(|(h, _, _)| *h > 0)
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.truncate(n);
    scored.sort_by_key(|x| x.1);
    scored.into_iter().map(|x| x.2).collect()
}

/// At most `n` characters of `s`, cut at a word boundary, with `…` when cut.
pub fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_string();
    }
    let cut: String = s.chars().take(n).collect();
    let at = cut.rfind(char::is_whitespace).unwrap_or(cut.len());
    format!("{}…", cut[..at].trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn difficulty_rules() {
        assert_eq!(classify("What is a subnet?"), Some(Difficulty::Basic));
        assert_eq!(
            classify("Why does TCP slow down when packets are lost?"),
            Some(Difficulty::Advanced)
        );
        assert_eq!(
            classify("Compare TCP and UDP for video calls"),
            Some(Difficulty::Advanced)
        );
        assert_eq!(
            classify("Explain the three-way handshake"),
            Some(Difficulty::Intermediate)
        );
        assert_eq!(classify("tcp handshake"), None);
    }

    #[test]
    fn thinking_is_split_out_and_untagged_text_stays() {
        let (t, a) = split_thinking(
            "<thinking>loss means congestion</thinking>\n<answer>It backs off.</answer>",
        );
        assert_eq!(t.as_deref(), Some("loss means congestion"));
        assert_eq!(a, "It backs off.");
        let (t, a) = split_thinking("<thinking>steps</thinking> The answer.");
        assert_eq!(t.as_deref(), Some("steps"));
        assert_eq!(a, "The answer.");
        let (t, a) = split_thinking("Just an answer.");
        assert_eq!(t, None);
        assert_eq!(a, "Just an answer.");
    }

    #[test]
    fn unusable_text_is_caught() {
        assert!(unusable("").is_some());
        assert!(unusable("TCP TCP").is_some());
        assert!(unusable(&"the packet is lost ".repeat(5)).is_some());
        assert!(unusable("{} [] {} [] {} []").is_some());
        assert_eq!(
            unusable("TCP retransmits data whose acknowledgement does not arrive."),
            None
        );
    }

    #[test]
    fn answers_are_read_as_letters_or_option_text() {
        let opts: Vec<String> = ["TCP", "UDP", "IP", "DNS"].map(String::from).to_vec();
        assert_eq!(read_answer(&json!("b"), &opts), Ok('B'));
        assert_eq!(read_answer(&json!(" C) IP"), &opts), Ok('C'));
        assert_eq!(read_answer(&json!("Answer: d"), &opts), Ok('D'));
        assert_eq!(read_answer(&json!({"answer": "A"}), &opts), Ok('A'));
        assert_eq!(read_answer(&json!("udp"), &opts), Ok('B'));
        assert!(read_answer(&json!("E"), &opts).is_err());
        assert!(read_answer(&json!("banana"), &opts).is_err());
        assert!(read_answer(&json!(3), &opts).is_err());
    }

    #[test]
    fn invented_facts_are_caught() {
        let guide =
            "- Final exam: 50%. The exam is closed book.\nTuesdays and Thursdays, 14:00-16:00";
        assert!(unsupported("The final exam is worth 100% of the grade.", guide).is_some());
        assert!(unsupported("The final exam is on Friday.", guide).is_some());
        assert_eq!(unsupported("The final exam is worth 50%.", guide), None);
        assert_eq!(
            unsupported("Office hours are on Tuesdays at 14:00.", guide),
            None
        );
        let notes = "UDP (User Datagram Protocol) is connectionless.";
        assert_eq!(
            drop_invented_names(
                "UDP (Unnumbered Transfer Protocol) is fast (really).",
                notes
            ),
            "UDP is fast (really)."
        );
        assert_eq!(
            drop_invented_names("UDP (User Datagram Protocol) is fast.", notes),
            "UDP (User Datagram Protocol) is fast."
        );
        assert_eq!(
            relevant_lines("how much is the final exam worth", "# Guide\n- Weekly quizzes: 20% of the final grade.\n- Final exam: 50%. The exam is closed book.\nOffice: B-204 on Tuesdays", 1),
            vec!["- Final exam: 50%. The exam is closed book."]
        );
    }

    #[test]
    fn cut_answers_end_at_a_full_sentence() {
        assert_eq!(
            whole_sentences("TCP is reliable. UDP is not. In other words, TCP is a"),
            "TCP is reliable. UDP is not."
        );
        assert_eq!(whole_sentences("no end at all"), "no end at all");
        assert_eq!(
            whole_sentences("Version 1.5 is out. Next"),
            "Version 1.5 is out."
        );
    }

    #[test]
    fn intents_and_quiz_requests() {
        assert_eq!(
            intent("Quiz me on TCP with 2 questions"),
            Some(Intent::Quiz)
        );
        assert_eq!(intent("can you test me on subnets?"), Some(Intent::Quiz));
        assert_eq!(intent("How is the exam graded?"), Some(Intent::Guide));
        assert_eq!(intent("What is a subnet?"), None);
        assert_eq!(
            quiz_request("Quiz me on TCP with 2 questions"),
            ("TCP".to_string(), Some(2))
        );
        assert_eq!(
            quiz_request("give me three questions about routing tables, please"),
            ("routing tables".to_string(), Some(3))
        );
        assert_eq!(quiz_request("quiz"), ("quiz".to_string(), None));
    }

    #[test]
    fn sentences_and_terms() {
        let p = "## TCP\n**TCP** is reliable. It numbers bytes.\n- **UDP**: no handshake.";
        assert_eq!(
            sentences(p),
            vec![
                "TCP",
                "TCP is reliable.",
                "It numbers bytes.",
                "UDP: no handshake."
            ]
        );
        assert_eq!(bold_terms(p), vec!["TCP", "UDP"]);
        let readme = "sled is an embedded database. Call `Db::open` first.\n\n```rust\nlet `x` = 1;\n```\n\nThis is a note. The `compression` feature is off. Many things are a mess.";
        assert_eq!(key_terms(readme), vec!["Db::open", "compression", "sled"]);
    }

    #[test]
    fn answers_end_where_they_degenerate() {
        let (kept, cut) = before_degenerate(
            "Tokio is a runtime for asynchronous applications. It is a work-stealing, work-sharing, work-sharing, and work-sharing-based system.",
        );
        assert!(cut);
        assert_eq!(kept, "Tokio is a runtime for asynchronous applications.");
        let (kept, cut) = before_degenerate(
            "sled is a database that is designed to be fast. It is a store that is designed to be small.",
        );
        assert!(cut);
        assert_eq!(kept, "sled is a database that is designed to be fast.");
        assert_eq!(
            before_degenerate("TCP is reliable. UDP is not. TCP is reliable."),
            ("TCP is reliable. UDP is not.".to_string(), true)
        );
        let fine = "TCP is reliable. UDP is not.";
        assert_eq!(before_degenerate(fine), (fine.to_string(), false));
    }

    #[test]
    fn invented_identifiers_are_caught() {
        let src = "Rustyline, a readline implementation based on Antirez's Linenoise. Use `Editor::readline`.";
        assert_eq!(
            invented_identifier(
                "rustyline is a Rust implementation of the linode.crust.",
                src
            ),
            Some("\"linode.crust\" is in no source".into())
        );
        assert_eq!(
            invented_identifier("Call Editor::readline to read a line.", src),
            None
        );
        assert!(invented_identifier("It is a work-stealing (WBW) system.", src).is_some());
        assert_eq!(invented_identifier("It is based on Linenoise.", src), None);
    }

    #[test]
    fn definition_questions() {
        assert_eq!(defined_name("What is sled?"), Some("sled".into()));
        assert_eq!(defined_name("what does tokio do"), Some("tokio".into()));
        assert_eq!(
            defined_name("What is a subnet mask?"),
            Some("subnet mask".into())
        );
        assert_eq!(defined_name("Why does TCP slow down?"), None);
    }

    #[test]
    fn sentences_the_sources_do_not_back_are_found() {
        let src = "This crate provides routines for searching strings for matches of a regular expression (aka regex). All regex searches have worst case linear time.";
        assert_eq!(
            unbacked_sentence("regex searches strings for matches of a regular expression. It is a programming language used to manipulate text.", src),
            Some((1, "It is a programming language used to manipulate text.".into()))
        );
        assert_eq!(
            unbacked_sentence("Regex searching takes linear time.", src),
            None
        );
    }

    #[test]
    fn echoed_prompt_scaffolding_goes() {
        assert_eq!(
            strip_scaffolding("[crates/clap.md (clap)] # clap\n\nThe command-line parser for Rust.\n\nQuestion: What is clap?\nAnswer: The parser."),
            "# clap\n\nThe command-line parser for Rust."
        );
        assert_eq!(
            strip_scaffolding("Answer: TCP is reliable."),
            "TCP is reliable."
        );
        assert_eq!(
            strip_scaffolding("See [RFC 793] for TCP."),
            "See [RFC 793] for TCP."
        );
    }

    #[test]
    fn numbers_are_checked_as_whole_tokens() {
        let guide = "- Final exam: 50%. Units: week 10-12. Room B-204, 14:00-16:00. RFC 793. 2 working days.";
        assert_eq!(
            unsupported("The final exam is worth 10% of the grade.", guide),
            Some("\"10%\" is in no source".into())
        );
        assert_eq!(unsupported("The final exam is worth 50%.", guide), None);
        assert_eq!(
            unsupported("Unit 4 ends in week 12.", guide).as_deref(),
            Some("\"4\" is in no source")
        );
        assert_eq!(
            unsupported("See RFC 793, room B-204 at 14:00.", guide),
            None
        );
        assert!(unsupported("It has 100 ports.", "10 ports").is_some());
    }
}
