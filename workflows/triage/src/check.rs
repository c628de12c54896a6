//! Checks on every free-text field a model writes: no degenerate repetition, a minimum of
//! real content, no template placeholders, no echo of the issue title, and no names (code
//! identifiers, paths, labels, people) that are not in the evidence.
//!
//! A field that fails is asked again once, then composed from the evidence in code; the
//! report says which (see [`FieldCheck`]).

use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// Why a text was refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "problem", content = "detail", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Problem {
    /// Nothing but whitespace or punctuation.
    Empty,
    /// Fewer real words than the field needs.
    TooShort {
        /// Words found.
        words: usize,
        /// Words needed.
        needed: usize,
    },
    /// A phrase repeated: the model looped.
    Repetition(String),
    /// A template placeholder (`[bug_name]`, `<file>`, `TODO`).
    Placeholder(String),
    /// A name, path or identifier that appears nowhere in the evidence.
    UnknownName(String),
    /// The text repeats the issue title instead of saying something new.
    EchoesTitle,
    /// The text names none of the code the evidence points at (a file, a function, an
    /// identifier): it could be about any bug.
    Ungrounded,
    /// A suggested fix that describes a change instead of asking for one: its history ("was
    /// implemented"), its benefits ("user-friendly") or what kind of thing it is ("a feature
    /// of"), none of which anyone here can know and none of which says what to change.
    NotAnInstruction(String),
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Empty => write!(f, "empty"),
            Problem::TooShort { words, needed } => {
                write!(f, "too short ({words} words, {needed} needed)")
            }
            Problem::Repetition(p) => write!(f, "repeats \"{p}\""),
            Problem::Placeholder(p) => write!(f, "placeholder {p}"),
            Problem::UnknownName(n) => write!(f, "names `{n}`, which is not in the evidence"),
            Problem::EchoesTitle => write!(f, "repeats the issue title"),
            Problem::Ungrounded => {
                write!(f, "names none of the files or functions in the evidence")
            }
            Problem::NotAnInstruction(p) => write!(
                f,
                "says \"{p}\": describe what to change in the code, not the change's history or benefits"
            ),
        }
    }
}

/// Where a field's final text came from, and what was wrong with the model's tries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldCheck {
    /// Agent.
    pub agent: String,
    /// Field.
    pub field: String,
    /// Round.
    pub round: u32,
    /// `model` (first answer passed), `model_retry` (the second try passed) or `composed`
    /// (both failed or no model: composed in code from the evidence).
    pub source: String,
    /// What the refused tries had wrong.
    pub problems: Vec<String>,
}

/// What a text is checked against.
#[derive(Clone, Debug, Default)]
pub struct CheckContext {
    /// Lowercased evidence: the issue, the retrieved code, file paths, configured
    /// vocabularies. A name in a text must occur in it.
    evidence: String,
    /// Lowercased words of the evidence.
    words: HashSet<String>,
    /// The issue title's content words.
    title_words: Vec<String>,
}

impl CheckContext {
    /// Checks against `evidence` (every text a name may legitimately come from) and the
    /// issue `title`.
    pub fn new(evidence: &str, title: &str) -> Self {
        let lower = evidence.to_lowercase();
        let words = lower
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect();
        CheckContext {
            evidence: lower,
            words,
            title_words: content_words(title),
        }
    }

    /// Adds more evidence (retrieved code, a vocabulary).
    pub fn extend(&mut self, more: &str) {
        let lower = more.to_lowercase();
        self.words.extend(
            lower
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .filter(|w| !w.is_empty())
                .map(str::to_string),
        );
        self.evidence.push('\n');
        self.evidence.push_str(&lower);
    }

    /// Whether `name` occurs in the evidence (case-insensitive).
    pub fn knows(&self, name: &str) -> bool {
        let n = name.to_lowercase();
        if self.words.contains(&n) || self.evidence.contains(&n) {
            return true;
        }
        // A location `path:12-40` is known when its path is.
        match n.rsplit_once(':') {
            Some((path, lines))
                if !path.is_empty()
                    && !lines.is_empty()
                    && lines.chars().all(|c| c.is_ascii_digit() || c == '-') =>
            {
                self.words.contains(path) || self.evidence.contains(path)
            }
            _ => false,
        }
    }

    /// Whether `text` names the reported symptom: it shares a meaningful word (outside file
    /// paths and code names) with the title. "The error is in `x.py`" does not.
    pub fn names_symptom(&self, text: &str) -> bool {
        if self.title_words.is_empty() {
            return true;
        }
        let prose: String = text
            .split_whitespace()
            .filter(|w| !is_code_name(w.trim_matches(|c: char| !c.is_alphanumeric() && c != '_')))
            .collect::<Vec<_>>()
            .join(" ");
        content_words(&prose)
            .iter()
            .any(|w| self.title_words.contains(w))
    }

    /// Whether a figure (see [`numbers_in`]) occurs in the evidence with its sign: `12.50`
    /// is not known when the evidence only has `-12.50`.
    pub fn knows_figure(&self, figure: &str) -> bool {
        let hay = &self.evidence;
        let mut from = 0;
        while let Some(i) = hay[from..].find(figure) {
            let start = from + i;
            let end = start + figure.len();
            let before = hay[..start].chars().next_back();
            let after = hay[end..].chars().next();
            let signed_apart = figure.starts_with('-')
                || before.is_none_or(|c| c != '-' && c != '.' && !c.is_ascii_digit());
            if signed_apart && after.is_none_or(|c| !c.is_ascii_digit()) {
                return true;
            }
            from = end;
        }
        self.words.contains(figure)
    }

    /// The problems of `text` as a field that needs at least `min_words` real words.
    pub fn problems(&self, text: &str, min_words: usize) -> Vec<Problem> {
        let mut out = Vec::new();
        let words = real_words(text);
        if words.is_empty() {
            out.push(Problem::Empty);
            return out;
        }
        if words.len() < min_words {
            out.push(Problem::TooShort {
                words: words.len(),
                needed: min_words,
            });
        }
        if let Some(p) = repetition(text) {
            out.push(Problem::Repetition(p));
        }
        if let Some(p) = placeholder(text) {
            out.push(Problem::Placeholder(p));
        }
        let unknown_name = names_in(text).into_iter().find(|n| !self.knows(n));
        let unknown_figure = || numbers_in(text).into_iter().find(|f| !self.knows_figure(f));
        if let Some(name) = unknown_name.or_else(unknown_figure) {
            out.push(Problem::UnknownName(name));
        }
        if !self.title_words.is_empty() && min_words > 0 {
            let own = content_words(text);
            let shared = own.iter().filter(|w| self.title_words.contains(w)).count();
            let new = own.len().saturating_sub(shared);
            if shared * 10 >= self.title_words.len() * 8 && new < 3 {
                out.push(Problem::EchoesTitle);
            }
        }
        out
    }
}

impl CheckContext {
    /// [`CheckContext::problems`], and the text must name at least one of `anchors` (file
    /// paths, file names, functions, identifiers from the evidence): a statement about the
    /// code that names no code is refused. No anchors: no such requirement.
    pub fn problems_anchored(
        &self,
        text: &str,
        min_words: usize,
        anchors: &[String],
    ) -> Vec<Problem> {
        let mut out = self.problems(text, min_words);
        if !anchors.is_empty() && !mentions_any(text, anchors) {
            out.push(Problem::Ungrounded);
        }
        out
    }
}

/// Phrases by which a suggested fix describes a change rather than asking for one: its history,
/// its benefits, or what kind of thing it is. Matched lowercase, as whole words.
const DESCRIBING_PHRASES: &[&str] = &[
    "was implemented",
    "has been implemented",
    "was introduced",
    "has been introduced",
    "was added",
    "has been added",
    "was fixed",
    "has been fixed",
    "is a feature",
    "is a new feature",
    "user-friendly",
    "user friendly",
    "improve the performance",
    "improves the performance",
    "improve performance",
    "the suggested fix is",
    "this fix is",
];

/// The first phrase by which `text` describes a change instead of asking for one (see
/// [`DESCRIBING_PHRASES`]), if any.
pub fn describes_instead_of_instructs(text: &str) -> Option<String> {
    let lower = text.to_lowercase();
    DESCRIBING_PHRASES
        .iter()
        .find(|p| contains_word(&lower, p))
        .map(|p| (*p).to_string())
}

/// Whether `text` names one of `anchors` as a whole word: the anchor itself, its file name
/// (`a/b/c.py` → `c.py`), or its last dotted or `::` segment of four letters or more (a
/// module's bare word, `discounts`, is an English word too and does not count).
pub fn mentions_any(text: &str, anchors: &[String]) -> bool {
    let lower = text.to_lowercase();
    anchors.iter().filter(|a| is_code_name(a)).any(|a| {
        let a = a.trim().to_lowercase();
        let file = a.rsplit('/').next().unwrap_or(&a).to_string();
        let last = a
            .rsplit(['.', ':'])
            .find(|s| !s.is_empty())
            .unwrap_or(&a)
            .to_string();
        let mut forms = vec![a.clone(), file];
        if last.len() >= 4 && !matches!(last.as_str(), "py" | "rs") {
            forms.push(last);
        }
        forms
            .iter()
            .filter(|f| f.len() >= 3)
            .any(|f| contains_word(&lower, f))
    })
}

/// Whether a name is recognisably code rather than an English word: a path, a dotted or
/// `::` name, a `snake_case` or `CamelCase` identifier (`invoice` and `total` are not).
pub fn is_code_name(name: &str) -> bool {
    let n = name.trim();
    n.contains(['/', '.', ':', '_']) || n.chars().skip(1).any(|c| c.is_ascii_uppercase())
}

/// Whether `needle` occurs in `hay` with no identifier character right before or after it.
fn contains_word(hay: &str, needle: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut from = 0;
    while let Some(i) = hay[from..].find(needle) {
        let start = from + i;
        let end = start + needle.len();
        let before = hay[..start].chars().next_back().is_none_or(|c| !ident(c));
        let after = hay[end..].chars().next().is_none_or(|c| !ident(c));
        if before && after {
            return true;
        }
        from = start + needle.len().max(1);
        while from < hay.len() && !hay.is_char_boundary(from) {
            from += 1;
        }
        if from >= hay.len() {
            break;
        }
    }
    false
}

/// Figures in the text that a reader would take as facts (a decimal, a percentage, a
/// number of three digits or more, a date or a time of day): like names, they must come from
/// the evidence.
pub fn numbers_in(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for raw in text.split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == ',') {
        let t = raw
            .trim_matches(['`', '"', '\''])
            .trim_end_matches(['.', ';', ':', '!', '?']);
        if is_date_or_time(t) {
            if !out.contains(&t.to_string()) {
                out.push(t.to_string());
            }
            continue;
        }
        let signed = t.trim_end_matches('%');
        let digits = signed.strip_prefix('-').unwrap_or(signed);
        let numeric = !digits.is_empty()
            && digits.chars().all(|c| c.is_ascii_digit() || c == '.')
            && digits.chars().filter(|c| *c == '.').count() <= 1
            && !digits.starts_with('.');
        if numeric
            && (t.ends_with('%') || digits.contains('.') || digits.len() >= 3)
            && !out.contains(&signed.to_string())
        {
            out.push(signed.to_string());
        }
    }
    out
}

/// A date or a time of day: three or more groups of digits joined by `-`, `/` or `:`
/// (`2023-05-22`, `21:24:51.126`), the last one perhaps with a decimal part. A line range
/// (`73-99`, two groups) is not one. SmolLM2 has put an invented timestamp in a ticket title
/// ("Bug Report to striptags() (2023-05-22 21:24:51.126)") that no figure rule caught.
fn is_date_or_time(t: &str) -> bool {
    let groups: Vec<&str> = t.split(['-', '/', ':']).collect();
    let Some((last, head)) = groups.split_last() else {
        return false;
    };
    let digits = |g: &str| !g.is_empty() && g.chars().all(|c| c.is_ascii_digit());
    let last_ok = match last.split_once('.') {
        Some((whole, frac)) => digits(whole) && digits(frac),
        None => digits(last),
    };
    groups.len() >= 3 && head.iter().all(|g| digits(g)) && last_ok
}

/// Words of at least two letters.
fn real_words(text: &str) -> Vec<&str> {
    text.split(|c: char| !c.is_alphanumeric() && c != '_' && c != '\'')
        .filter(|w| w.chars().filter(|c| c.is_alphabetic()).count() >= 2)
        .collect()
}

/// Lowercased words of three letters or more that carry meaning.
fn content_words(text: &str) -> Vec<String> {
    const STOP: &[&str] = &[
        "the", "and", "for", "with", "when", "that", "this", "from", "are", "was", "not", "but",
        "into", "its", "has", "have", "after", "before", "does", "only", "than", "then", "which",
    ];
    let mut v: Vec<String> = Vec::new();
    for w in real_words(text) {
        let w = w.to_lowercase();
        if w.len() >= 3 && !STOP.contains(&w.as_str()) && !v.contains(&w) {
            v.push(w);
        }
    }
    v
}

/// A phrase the text loops on: a sequence of 3+ words seen three times, a 6+ word sequence
/// seen twice, or one word four times in a row.
pub fn repetition(text: &str) -> Option<String> {
    let words: Vec<String> = text
        .split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect();
    for w in words.windows(4) {
        if w.iter().all(|x| x == &w[0]) {
            return Some(w[0].clone());
        }
    }
    // A short cycle repeated back to back: "a | b | a | b | a | b", "to 0.1 to 0.1 to 0.1".
    for p in 2..=4 {
        let cycle = (0..(words.len() + 1).saturating_sub(3 * p)).find(|&i| {
            words[i..i + p] == words[i + p..i + 2 * p]
                && words[i..i + p] == words[i + 2 * p..i + 3 * p]
        });
        if let Some(i) = cycle {
            return Some(words[i..i + p].join(" "));
        }
    }
    for (n, most) in [(6usize, 1usize), (3, 2)] {
        let mut seen: HashMap<&[String], usize> = HashMap::new();
        for g in words.windows(n) {
            let c = seen.entry(g).or_insert(0);
            *c += 1;
            if *c > most {
                return Some(g.join(" "));
            }
        }
    }
    None
}

/// The lines of a Markdown comment that carry words, without bold markers: the unit in
/// which a comment is judged (it restates the report's fields, and its file list repeats one
/// form per file, so the whole comment repeats itself by design).
pub fn comment_lines(markdown: &str) -> Vec<String> {
    markdown
        .lines()
        .map(|l| l.replace("**", ""))
        .filter(|l| l.chars().any(char::is_alphanumeric))
        .collect()
}

/// A template placeholder in the text, if any.
pub fn placeholder(text: &str) -> Option<String> {
    let lower = text.to_lowercase();
    for marker in [
        "todo",
        "tbd",
        "lorem ipsum",
        "n/a",
        "xxx",
        "insert ",
        "your_",
    ] {
        if let Some(i) = lower.find(marker) {
            let before_ok = i == 0 || !lower.as_bytes()[i - 1].is_ascii_alphanumeric();
            let end = i + marker.len();
            let after_ok = end >= lower.len()
                || marker.ends_with(' ')
                || !lower.as_bytes()[end].is_ascii_alphanumeric();
            if before_ok && after_ok {
                return Some(marker.trim().to_string());
            }
        }
    }
    for (open, close) in [('[', ']'), ('<', '>'), ('{', '}')] {
        let mut rest = text;
        while let Some(s) = rest.find(open) {
            let Some(len) = rest[s + 1..].find(close) else {
                break;
            };
            let inner = &rest[s + 1..s + 1 + len];
            // `list[i]`, `dict{x}`, `Vec<T>`: a bracket right after a name is code.
            let after_name = rest[..s]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_');
            let snake = !after_name
                && !inner.is_empty()
                && inner.len() <= 40
                && inner
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c == ' ')
                && (inner.contains('_')
                    || inner.contains(' ')
                    || (open != '[' && inner.len() >= 3));
            let caps = !after_name
                && !inner.is_empty()
                && inner.len() <= 40
                && inner
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_' || c == ' ')
                && inner.len() > 2;
            if snake || caps {
                return Some(format!("{open}{inner}{close}"));
            }
            rest = &rest[s + 1 + len..];
        }
    }
    None
}

/// The names a text uses: code spans, paths and file names, identifiers (snake_case,
/// camelCase, dotted or `::` paths, calls) and capitalised words inside a sentence that are
/// not ordinary words (people, products).
pub fn names_in(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut push = |s: &str| {
        let s = s
            .trim_matches(|c: char| !c.is_alphanumeric() && c != '_')
            .to_string();
        if s.len() >= 3 && !out.contains(&s) {
            out.push(s);
        }
    };
    let mut rest = text;
    while let Some(s) = rest.find('`') {
        let Some(len) = rest[s + 1..].find('`') else {
            break;
        };
        let span = &rest[s + 1..s + 1 + len];
        for part in span.split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == ',') {
            if part.chars().any(char::is_alphabetic) {
                push(part.trim_end_matches(['(', ')']));
            }
        }
        rest = &rest[s + 1 + len + 1..];
    }
    let tokens: Vec<&str> = text.split_whitespace().collect();
    for (i, raw) in tokens.iter().enumerate() {
        let t = raw
            .trim_matches(|c: char| !c.is_alphanumeric() && c != '_' && c != '/' && c != '.')
            .trim_end_matches('.')
            .trim_start_matches('`');
        if t.is_empty() || t.contains('`') {
            continue;
        }
        let is_path = t.contains('/')
            || [
                ".py", ".rs", ".js", ".ts", ".go", ".toml", ".md", ".json", ".cfg",
            ]
            .iter()
            .any(|e| t.ends_with(e));
        let is_ident = (t.contains('_') && t.chars().any(|c| c.is_ascii_lowercase()))
            || t.contains("::")
            || t.chars()
                .zip(t.chars().skip(1))
                .any(|(a, b)| a.is_ascii_lowercase() && b.is_ascii_uppercase())
            || (t.contains('.')
                && t.split('.').count() >= 2
                && t.split('.')
                    .all(|p| !p.is_empty() && p.chars().all(|c| c.is_alphanumeric() || c == '_'))
                && t.chars().any(char::is_alphabetic)
                && !t.split('.').all(|p| p.chars().all(|c| c.is_ascii_digit())));
        let sentence_start = i == 0
            || tokens[i - 1].ends_with(['.', ':', '!', '?', '\n'])
            || tokens[i - 1].starts_with('#')
            || tokens[i - 1] == "-"
            || tokens[i - 1] == "*";
        let capitalised = !sentence_start
            && t.len() >= 3
            && t.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            && t.chars().skip(1).all(|c| c.is_ascii_lowercase())
            && !COMMON_CAPITALISED.contains(&t);
        if is_path || is_ident || capitalised {
            push(t);
        }
    }
    out
}

/// Capitalised words a sentence may use without them being in the evidence.
const COMMON_CAPITALISED: &[&str] = &[
    "Python",
    "Rust",
    "The",
    "This",
    "That",
    "When",
    "If",
    "It",
    "In",
    "On",
    "With",
    "For",
    "Bug",
    "Fix",
    "Error",
    "Errors",
    "Warning",
    "Exception",
    "Root",
    "Cause",
    "Severity",
    "None",
    "True",
    "False",
    "Linux",
    "Windows",
    "macOS",
    "Unicode",
    "UTF",
    "JSON",
    "API",
    "CLI",
    "HTTP",
    "URL",
    "CPU",
    "GPU",
    "Steps",
    "Expected",
    "Actual",
    "Affected",
    "Files",
    "Next",
    "See",
    "Check",
    "Add",
    "Use",
    "Make",
    "Return",
    "Raise",
    "Ensure",
    "Test",
    "Tests",
    "Unit",
    "Regression",
    "High",
    "Medium",
    "Low",
    "Critical",
    "Confirmed",
    "Uncertain",
    "Challenged",
    "Approved",
    "Rejected",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

#[cfg(test)]
mod instruction_tests {
    use super::describes_instead_of_instructs;

    #[test]
    fn a_fix_must_say_what_to_change() {
        // SmolLM2's fix for MarkupSafe's striptags bug (a real public issue).
        let filler = "The suggested fix is a feature of Python 3.9 that allows you to remove tags \
            from a string using Markup.striptags. This fix was implemented to improve the \
            performance of your application and make it more user-friendly.";
        assert_eq!(
            describes_instead_of_instructs(filler).as_deref(),
            Some("was implemented")
        );
        for good in [
            "Change `Markup.striptags` in src/markupsafe/__init__.py to remove comments and tags \
             that span lines before collapsing whitespace.",
            "Clamp the discounted total at zero in apply_discounts (ledgerlite/discounts.py).",
        ] {
            assert_eq!(describes_instead_of_instructs(good), None, "{good}");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ctx() -> CheckContext {
        CheckContext::new(
            "Invoice total goes negative when two percentage discount codes are combined\n\
             ledgerlite/discounts.py apply_discounts _check_not_negative invoice.total\n\
             ValueError: invoice total cannot be negative: -12.50",
            "Invoice total goes negative when two percentage discount codes are combined",
        )
    }

    #[test]
    fn loops_are_refused() {
        let c = ctx();
        let looped = "The total is wrong 2023-09-04 | ledger-changelog.md:2023-09-04 | 2023-09-04 | ledger-changelog.md:2023-09-04 | 2023-09-04 | ledger-changelog.md:2023-09-04 |";
        assert!(c
            .problems(looped, 5)
            .iter()
            .any(|p| matches!(p, Problem::Repetition(_))));
        assert!(repetition("upgrade to 0.10.0 to 0.10.0 to 0.10.0 to 0.10.0").is_some());
        assert!(repetition("the the the the").is_some());
        assert_eq!(
            repetition("apply_discounts sums the percentages instead of applying each one to the remaining amount"),
            None
        );
    }

    #[test]
    fn short_empty_and_placeholder_texts_are_refused() {
        let c = ctx();
        assert_eq!(c.problems("  ", 3), vec![Problem::Empty]);
        assert!(matches!(c.problems("The", 5)[0], Problem::TooShort { .. }));
        assert!(c
            .problems(
                "The [bug_name] breaks the invoice total in apply_discounts",
                3
            )
            .contains(&Problem::Placeholder("[bug_name]".into())));
        assert!(placeholder("Fix: TODO").is_some());
        assert!(placeholder("a list[i] index and a dict{x}").is_none());
    }

    #[test]
    fn invented_names_are_refused_known_ones_pass() {
        let c = ctx();
        let ok = "apply_discounts in ledgerlite/discounts.py sums the two percentages, so the discount exceeds the subtotal.";
        assert_eq!(c.problems(ok, 5), vec![]);
        let invented = "The bug is in ledgerlite/pricing.py where compute_total rounds twice.";
        assert!(c
            .problems(invented, 5)
            .iter()
            .any(|p| matches!(p, Problem::UnknownName(_))));
        let person = "Assign this to Leyla who owns the discount code.";
        assert_eq!(
            c.problems(person, 3),
            vec![Problem::UnknownName("Leyla".into())]
        );
    }

    #[test]
    fn the_title_echoed_is_refused() {
        let c = ctx();
        assert!(c
            .problems(
                "Invoice total goes negative when two percentage discount codes are combined.",
                3
            )
            .contains(&Problem::EchoesTitle));
        assert!(!c
            .problems(
                "apply_discounts adds the two percentage codes together, so the discount exceeds the invoice total.",
                3
            )
            .contains(&Problem::EchoesTitle));
    }

    #[test]
    fn statements_about_code_must_name_code() {
        let c = CheckContext::new(
            "apply_discounts in ledgerlite/discounts.py",
            "Invoice total",
        );
        let anchors = vec![
            "apply_discounts".to_string(),
            "ledgerlite/discounts.py".to_string(),
            "ledgerlite.invoice.Invoice.total".to_string(),
        ];
        let vacuous = "The code that does not work is the one that does not work.";
        assert!(c
            .problems_anchored(vacuous, 5, &anchors)
            .contains(&Problem::Ungrounded));
        for good in [
            "apply_discounts sums the two percentages instead of compounding them.",
            "The discounts.py module adds percentages of stacked codes.",
            "Invoice.total() passes a negative amount to the validator.",
        ] {
            assert!(
                !c.problems_anchored(good, 5, &anchors)
                    .contains(&Problem::Ungrounded),
                "{good}"
            );
        }
        // A module's plain word is not a name of the code.
        assert!(c
            .problems_anchored("In discounts the percentages are added.", 5, &anchors)
            .contains(&Problem::Ungrounded));
        // Plain words are not names of the code.
        assert!(!mentions_any(
            "the invoice total",
            &["invoice".to_string(), "total".to_string()]
        ));
        assert!(mentions_any(
            "a LineItem is made",
            &["LineItem".to_string()]
        ));
        // A name inside a longer word does not count.
        assert!(!mentions_any(
            "my_apply_discounts_v2 is fine",
            &anchors[..1]
        ));
        assert!(mentions_any("see `apply_discounts`.", &anchors[..1]));
    }

    #[test]
    fn a_title_names_the_symptom() {
        let c = CheckContext::new("evidence", "Invoice total goes negative with two codes");
        assert!(!c.names_symptom("The error is in ledgerlite/invoice.py:41-97"));
        assert!(c.names_symptom("apply_discounts makes the invoice total negative"));
    }

    #[test]
    fn figures_must_come_from_the_evidence() {
        let c = CheckContext::new("60 % off, then 50 %; total -12.50", "t");
        assert_eq!(
            numbers_in("a 10.5% discount of 20% on 2 items"),
            ["10.5", "20"]
        );
        assert!(matches!(
            c.problems("There is a 10.5% discount on the invoice total here.", 3)[..],
            [Problem::UnknownName(_)]
        ));
        assert!(c
            .problems("The 60 % and 50 % codes give -12.50 in total.", 3)
            .is_empty());
        // The sign is part of the figure: the evidence has -12.50, not 12.50.
        assert_eq!(numbers_in("it is -12.50, not 12.50"), ["-12.50", "12.50"]);
        assert!(matches!(
            c.problems("The total of the invoice is 12.50 after the codes.", 3)[..],
            [Problem::UnknownName(ref f)] if f == "12.50"
        ));
        assert!(!c.knows_figure("2.50"));
        assert!(c.knows_figure("-12.50"));
    }

    #[test]
    fn invented_dates_and_times_are_refused_and_line_ranges_are_not_figures() {
        let title = "Bug Report to striptags() (2023-05-22 21:24:51.126) - striptags() leaves tags";
        assert_eq!(numbers_in(title), ["2023-05-22", "21:24:51.126"]);
        let c = CheckContext::new(
            "Bug Report: striptags() leaves tags and comments; released 2022-03-15",
            "t",
        );
        assert!(matches!(
            c.problems(title, 3)[..],
            [Problem::UnknownName(ref f)] if f == "2023-05-22"
        ));
        assert!(c
            .problems("striptags() leaves tags since the 2022-03-15 release", 3)
            .is_empty());
        assert!(numbers_in("see lines 73-99 and 12:30").is_empty());
        assert!(numbers_in("version 2.1.1").is_empty());
    }
}
