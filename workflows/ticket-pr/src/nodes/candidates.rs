//! Which source files the generator is offered, ranked by the evidence for each: the
//! functions and classes the ticket names (a file that *defines* `dotenv_values` outranks
//! one that mentions it), the retrieved chunks' similarity, the files the ticket names, and
//! the module picker's files.

use super::*;

/// Points for defining a symbol the ticket names.
const DEFINES: u32 = 6;
/// Points for a file whose name the ticket spells exactly (`TaskService`).
const NAMED_EXACTLY: u32 = 5;
/// Points for a file the ticket names loosely (`tasks` names `Task.java`).
const NAMED_LOOSELY: u32 = 2;
/// Points for a file the module picker chose.
const PICKED: u32 = 2;
/// Points for the file of the best retrieved chunk, decreasing by one per rank.
const RETRIEVED_BEST: u32 = 4;
/// Files read to find definitions, at most (larger repositories rank without them).
const MAX_SCANNED: usize = 400;
/// Bytes of a file scanned for definitions.
const MAX_SCANNED_BYTES: usize = 400_000;

/// Source files the generator may rewrite, in the selected modules and not tests, best
/// evidence first, at most `n`, and none with under half the best file's points.
pub(crate) fn candidate_sources(s: &TicketPrState, n: usize) -> Vec<String> {
    let selected = s.selected_modules();
    let in_scope = |p: &String| {
        !repo::is_test_path(p)
            && selected.iter().any(|m| m.files.contains(p))
            && ferrograph_index::chunk::language_for_path(p).is_some_and(|l| l != "markdown")
    };
    let mut scores: Vec<(String, u32)> = Vec::new();
    let mut add = |p: &String, points: u32| {
        if !in_scope(p) {
            return;
        }
        match scores.iter_mut().find(|(q, _)| q == p) {
            Some((_, sc)) => *sc += points,
            None => scores.push((p.clone(), points)),
        }
    };
    let exactly = named_files_exactly(s, &selected);
    for p in named_files(s, &selected) {
        add(
            &p,
            if exactly.contains(&p) {
                NAMED_EXACTLY
            } else {
                NAMED_LOOSELY
            },
        );
    }
    for p in &s.affected_files {
        add(p, PICKED);
    }
    let mut seen: Vec<&String> = Vec::new();
    for c in &s.retrieved_chunks {
        if !seen.contains(&&c.file_path) {
            seen.push(&c.file_path);
        }
    }
    for (rank, p) in seen.iter().enumerate() {
        add(p, RETRIEVED_BEST.saturating_sub(rank as u32).max(1));
    }
    let symbols = ticket_symbols(&format!("{} {}", s.ticket.summary, s.ticket.description));
    if !symbols.is_empty() {
        for (p, count) in definitions(s, &selected, &symbols) {
            add(&p, DEFINES * count.min(2));
        }
    }
    // A package's `__init__.py` that only re-exports is rarely where a fix goes: it keeps
    // its points but loses ties.
    let reexport = |p: &str| p.ends_with("__init__.py");
    scores.sort_by(|a, b| b.1.cmp(&a.1).then(reexport(&a.0).cmp(&reexport(&b.0))));
    // Only files with at least half the best file's evidence: a small model offered a large
    // unrelated file edits it.
    let best = scores.first().map_or(0, |(_, sc)| *sc);
    scores
        .into_iter()
        .filter(|(_, sc)| *sc * 2 >= best)
        .take(n)
        .map(|(p, _)| p)
        .collect()
}

/// The code symbols a ticket names: words in backticks, words called (`parse(`), and
/// words shaped like code (`snake_case`, `camelCase`); English words alone are left out.
pub(crate) fn ticket_symbols(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut push = |w: &str| {
        let w = w.trim_matches(|c: char| !c.is_alphanumeric() && c != '_');
        if w.len() >= 3
            && w.chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
            && w.chars().all(|c| c.is_alphanumeric() || c == '_')
            && !out.iter().any(|o| o == w)
        {
            out.push(w.to_string());
        }
    };
    // In backticks: every identifier of the span (`dotenv_values()`, `a.b.c`).
    for (i, span) in text.split('`').enumerate() {
        if i % 2 == 1 {
            for w in span.split(|c: char| !c.is_alphanumeric() && c != '_') {
                push(w);
            }
        }
    }
    let words: Vec<&str> = text
        .split(|c: char| !c.is_alphanumeric() && c != '_' && c != '(')
        .collect();
    for w in words {
        let (word, called) = match w.split_once('(') {
            Some((a, _)) => (a, true),
            None => (w, false),
        };
        let shaped = word.contains('_') && word.chars().any(char::is_alphabetic)
            || word.chars().skip(1).any(char::is_uppercase) && word.chars().any(char::is_lowercase);
        if called || shaped {
            push(word);
        }
    }
    out
}

/// Files of `modules` that define one of `symbols` (`def x`, `class x`, `fn x`,
/// `function x`, `struct x`, `interface x`, or a Java/Kotlin-style `x(` declaration line),
/// with how many they define.
fn definitions(
    s: &TicketPrState,
    modules: &[repo::Module],
    symbols: &[String],
) -> Vec<(String, u32)> {
    let Ok(repo) = repo::open(Path::new(&s.repo)) else {
        return Vec::new();
    };
    let files: Vec<&String> = modules
        .iter()
        .flat_map(|m| m.files.iter())
        .filter(|p| {
            !repo::is_test_path(p)
                && ferrograph_index::chunk::language_for_path(p).is_some_and(|l| l != "markdown")
        })
        .take(MAX_SCANNED)
        .collect();
    let mut out = Vec::new();
    for p in files {
        let Ok(Some(text)) = repo::read_at(&repo, &s.base_commit, p) else {
            continue;
        };
        let text = &text[..floor_boundary(&text, MAX_SCANNED_BYTES)];
        let count = symbols.iter().filter(|sym| defines(text, sym)).count() as u32;
        if count > 0 {
            out.push((p.clone(), count));
        }
    }
    out
}

/// The largest char boundary of `text` at or below `at`.
fn floor_boundary(text: &str, at: usize) -> usize {
    (0..=at.min(text.len()))
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0)
}

/// Whether `text` defines `sym`.
pub(crate) fn defines(text: &str, sym: &str) -> bool {
    const KEYWORDS: [&str; 9] = [
        "def ",
        "async def ",
        "class ",
        "fn ",
        "function ",
        "struct ",
        "interface ",
        "enum ",
        "trait ",
    ];
    text.lines().any(|line| {
        let t = line.trim_start();
        let declared = KEYWORDS.iter().any(|k| {
            t.strip_prefix(k)
                .or_else(|| {
                    [
                        "pub ",
                        "export ",
                        "public ",
                        "private ",
                        "protected ",
                        "static ",
                    ]
                    .iter()
                    .find_map(|m| t.strip_prefix(m))
                    .and_then(|r| r.trim_start().strip_prefix(k))
                })
                .is_some_and(|rest| starts_with_word(rest, sym))
        });
        // `public List<Task> findOverdue(LocalDate today) {`: a typed declaration.
        let java_like = !declared
            && t.ends_with('{')
            && t.split_once('(').is_some_and(|(head, _)| {
                let mut parts = head.split_whitespace().rev();
                parts.next() == Some(sym)
                    && parts.next().is_some_and(|ty| {
                        !matches!(ty, "new" | "return" | "if" | "while" | "for" | "=")
                    })
            });
        declared || java_like
    })
}

/// Whether `rest` begins with the word `sym` (followed by a non-identifier character).
fn starts_with_word(rest: &str, sym: &str) -> bool {
    rest.strip_prefix(sym).is_some_and(|after| {
        after
            .chars()
            .next()
            .is_none_or(|c| !c.is_alphanumeric() && c != '_')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_are_the_code_words_of_a_ticket() {
        let t = "When a `.env` file is saved, `load_dotenv()` / `dotenv_values()` lose the \
                 first key:\n    >>> dotenv_values(\".env\")\nI expected the TaskService to \
                 call findOverdue. Nothing is reported.";
        let syms = ticket_symbols(t);
        for s in [
            "env",
            "load_dotenv",
            "dotenv_values",
            "TaskService",
            "findOverdue",
        ] {
            assert!(syms.contains(&s.to_string()), "{s} missing from {syms:?}");
        }
        for s in ["Nothing", "reported", "expected", "first"] {
            assert!(!syms.contains(&s.to_string()), "{s} in {syms:?}");
        }
    }

    #[test]
    fn definitions_are_told_from_uses() {
        let py = "from .main import dotenv_values\n\ndef load_dotenv(path=None):\n    return dotenv_values(path)\n";
        assert!(defines(py, "load_dotenv"));
        assert!(!defines(py, "dotenv_values"));
        assert!(!defines(py, "load"));
        let java = "public class TaskService {\n    public List<Task> findOverdue(LocalDate today) {\n        return findAll(today);\n    }\n}\n";
        assert!(defines(java, "TaskService"));
        assert!(defines(java, "findOverdue"));
        assert!(!defines(java, "findAll"));
        let rs = "pub fn parse(s: &str) -> u32 {\n    helper(s)\n}\n";
        assert!(defines(rs, "parse"));
        assert!(!defines(rs, "helper"));
    }
}
