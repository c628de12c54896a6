//! What code can extract from a bug report, code extracts: error and warning lines, stack
//! frames (Python tracebacks, Rust panics and backtraces), the source lines a traceback
//! quotes, code identifiers, file names and versions.
//!
//! The agents quote this evidence into their prompts instead of asking a small model to find
//! it, the codebase search turns it into exact-match boosts, and the text checks accept only
//! names that appear in it.

use regex::Regex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::LazyLock;

/// One stack frame quoted in the report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// The file as the report shows it (often an absolute path on the reporter's machine).
    pub file: String,
    /// Line number, when shown.
    pub line: Option<u32>,
    /// Function, when shown.
    pub function: Option<String>,
    /// The source line the traceback quotes under the frame, when it does.
    pub code: Option<String>,
}

/// Everything extracted from one report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// Error and warning lines, verbatim (at most 8).
    pub error_lines: Vec<String>,
    /// Stack frames, outermost first.
    pub frames: Vec<Frame>,
    /// Source lines the report quotes as the offending code (traceback and warning lines).
    pub code_lines: Vec<String>,
    /// Code identifiers, most telling first (at most 16).
    pub identifiers: Vec<String>,
    /// File names the report mentions.
    pub files: Vec<String>,
    /// Versions the report mentions.
    pub versions: Vec<String>,
}

static PY_FRAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"File "([^"]+)", line (\d+)(?:, in ([\w<>.]+))?"#).unwrap_or_else(|_| never())
});
static RUST_AT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?:at |panicked at |--> )([\w./\\-]+\.rs):(\d+)(?::\d+)?")
        .unwrap_or_else(|_| never())
});
static RUST_FN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\s*\d+:\s+(?:0x[0-9a-f]+ - )?([A-Za-z_][\w:<>]*::[A-Za-z_]\w*)")
        .unwrap_or_else(|_| never())
});
static PY_WARNING: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(\S+\.py):(\d+): ([A-Za-z]*Warning): ").unwrap_or_else(|_| never())
});
static ERROR_LINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Warning|Fault|Exit|Interrupt)\b(?::|$)|(?:error|warning)(?:\[E\d+\])?:|Error:|thread '.*' panicked|.*panicked at )",
    )
    .unwrap_or_else(|_| never())
});
static IDENT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[A-Za-z_][A-Za-z0-9_]*(?:(?:\.|::)[A-Za-z_][A-Za-z0-9_]*)*(\()?")
        .unwrap_or_else(|_| never())
});
static BACKTICK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"`([^`\n]{1,80})`").unwrap_or_else(|_| never()));
static FILE_NAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?:[\w.-]+/)*[\w-]+\.(?:py|pyi|rs|js|ts|go|java|c|h|cpp|toml|cfg|ini|json|yaml|yml)\b",
    )
    .unwrap_or_else(|_| never())
});
static VERSION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?:\bv|==\s*|\b)(\d+\.\d+\.\d+(?:[.-]?(?:post|dev|rc|a|b)\d*)?)\b")
        .unwrap_or_else(|_| never())
});

/// The patterns above are literals that compile; this is never reached.
fn never() -> Regex {
    #[allow(clippy::unwrap_used)]
    Regex::new("$^").unwrap()
}

/// Words that look like identifiers but tell nothing about where a bug is.
const NOISE: &[&str] = &[
    "self",
    "cls",
    "None",
    "True",
    "False",
    "print",
    "return",
    "import",
    "from",
    "def",
    "class",
    "lambda",
    "async",
    "await",
    "yield",
    "pass",
    "raise",
    "assert",
    "with",
    "for",
    "while",
    "if",
    "else",
    "elif",
    "try",
    "except",
    "finally",
    "in",
    "is",
    "not",
    "and",
    "or",
    "fn",
    "let",
    "mut",
    "pub",
    "use",
    "impl",
    "struct",
    "enum",
    "mod",
    "crate",
    "super",
    "Self",
    "Some",
    "Ok",
    "Err",
    "unwrap",
    "expect",
    "main",
    "len",
    "str",
    "int",
    "float",
    "list",
    "dict",
    "set",
    "tuple",
    "bool",
    "bytes",
    "object",
    "type",
    "range",
    "open",
    "Traceback",
    "most",
    "recent",
    "call",
    "last",
    "line",
    "File",
    "ValueError",
    "TypeError",
    "KeyError",
    "IndexError",
    "AttributeError",
    "RuntimeError",
    "Exception",
    "AssertionError",
    "NotImplementedError",
    "OSError",
    "IOError",
    "RuntimeWarning",
    "UserWarning",
    "DeprecationWarning",
    "FutureWarning",
    "ImportError",
    "ModuleNotFoundError",
    "StopIteration",
    "ZeroDivisionError",
    "OverflowError",
    "RecursionError",
    "UnicodeDecodeError",
    "UnicodeEncodeError",
    "FileNotFoundError",
    "PermissionError",
    "String",
    "Vec",
    "Option",
    "Result",
    "Box",
    "std",
    "core",
    "alloc",
    "python",
    "python3",
    "pip",
    "install",
    "venv",
    "site",
    "packages",
    "site-packages",
    "usr",
    "lib",
    "home",
    "http",
    "https",
    "www",
    "com",
    "github",
    "org",
    "e.g",
    "i.e",
    "etc",
];

impl Evidence {
    /// Extracts the evidence from a report.
    pub fn extract(title: &str, body: &str) -> Evidence {
        let mut ev = Evidence::default();
        let lines: Vec<&str> = body.lines().collect();
        for (i, raw) in lines.iter().enumerate() {
            let t = clean(raw);
            if let Some(c) = PY_FRAME.captures(t) {
                let code = lines
                    .get(i + 1)
                    .map(|l| clean(l))
                    .filter(|l| {
                        !l.is_empty()
                            && !l.starts_with("File \"")
                            && !is_caret_line(l)
                            && !ERROR_LINE.is_match(l)
                    })
                    .map(str::to_string);
                if let Some(code) = &code {
                    push_unique(&mut ev.code_lines, code.clone(), 8);
                }
                ev.frames.push(Frame {
                    file: c[1].to_string(),
                    line: c[2].parse().ok(),
                    function: c.get(3).map(|m| m.as_str().to_string()),
                    code,
                });
                continue;
            }
            if let Some(c) = RUST_AT.captures(t) {
                ev.frames.push(Frame {
                    file: c[1].replace('\\', "/"),
                    line: c[2].parse().ok(),
                    function: None,
                    code: None,
                });
            } else if let Some(c) = RUST_FN.captures(t) {
                let f = c[1].to_string();
                if !f.starts_with("std::") && !f.starts_with("core::") && !f.starts_with("alloc::")
                {
                    ev.frames.push(Frame {
                        file: String::new(),
                        line: None,
                        function: Some(f),
                        code: None,
                    });
                }
            }
            if let Some(c) = PY_WARNING.captures(t) {
                // `path:line: SomethingWarning: message`, then the offending source line.
                ev.frames.push(Frame {
                    file: c[1].to_string(),
                    line: c[2].parse().ok(),
                    function: None,
                    code: None,
                });
                let rest = t[c.get(3).map(|m| m.start()).unwrap_or(0)..].to_string();
                push_unique(&mut ev.error_lines, rest, 8);
                if let Some(next) = lines.get(i + 1).map(|l| clean(l)) {
                    if !next.is_empty() {
                        push_unique(&mut ev.code_lines, next.to_string(), 8);
                    }
                }
                continue;
            }
            if t.len() <= 240 && ERROR_LINE.is_match(t) {
                push_unique(&mut ev.error_lines, t.to_string(), 8);
            }
        }
        // Identifiers: backticked spans, traceback code and error lines weigh more than prose.
        let mut score: HashMap<String, (f32, usize)> = HashMap::new();
        let mut order = 0usize;
        let mut add = |text: &str, weight: f32, code_context: bool| {
            for m in IDENT.captures_iter(text) {
                let Some(whole) = m.get(0) else { continue };
                let called = m.get(1).is_some();
                let name = whole.as_str().trim_end_matches('(');
                if !looks_like_code(name, called || code_context) {
                    continue;
                }
                let e = score.entry(name.to_string()).or_insert((0.0, {
                    order += 1;
                    order
                }));
                e.0 += weight;
            }
        };
        for c in BACKTICK.captures_iter(body) {
            add(&c[1], 3.0, true);
        }
        for f in &ev.frames {
            if let Some(func) = &f.function {
                add(func, 3.0, true);
            }
            if let Some(code) = &f.code {
                add(code, 2.0, true);
            }
        }
        for l in &ev.code_lines {
            add(l, 2.0, true);
        }
        for l in &ev.error_lines {
            add(l, 2.0, false);
        }
        let in_fence = code_blocks(body);
        add(&in_fence, 1.0, true);
        add(title, 1.5, false);
        add(body, 0.5, false);
        let mut ids: Vec<(String, f32, usize)> =
            score.into_iter().map(|(k, (s, o))| (k, s, o)).collect();
        ids.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)));
        ev.identifiers = ids.into_iter().take(16).map(|(k, _, _)| k).collect();
        for m in FILE_NAME.find_iter(&format!("{title}\n{body}")) {
            push_unique(&mut ev.files, m.as_str().to_string(), 12);
        }
        for c in VERSION.captures_iter(body) {
            push_unique(&mut ev.versions, c[1].to_string(), 6);
        }
        ev
    }

    /// The frames' files and the mentioned files that exist in the repository (`repo_files`:
    /// paths relative to its root), matched by their longest path suffix: the reporter's
    /// `/home/x/.venv/lib/python3.11/site-packages/pkg/mod.py` is the repository's
    /// `pkg/mod.py` (or `src/pkg/mod.py`). Innermost frames first, each file once.
    pub fn repo_files<'a>(&self, repo_files: &'a [String]) -> Vec<&'a str> {
        let mut out: Vec<&'a str> = Vec::new();
        // Innermost first; but when the innermost frame is a check that only raises
        // (`_check_not_negative`, `validate`), the value it refused was made by its caller:
        // the caller's file comes first.
        let mut frames: Vec<&Frame> = self
            .frames
            .iter()
            .rev()
            .filter(|f| match_repo_path(&f.file, repo_files).is_some())
            .collect();
        if frames.len() >= 2 && Self::frame_is_check(frames[0]) {
            frames.swap(0, 1);
        }
        let named = frames
            .into_iter()
            .map(|f| f.file.as_str())
            .chain(self.files.iter().map(String::as_str));
        for f in named {
            if let Some(p) = match_repo_path(f, repo_files) {
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
        out
    }

    /// Whether the innermost frame in the repository is a check that only raises, called
    /// from another repository frame (see [`Evidence::is_check_function`]).
    pub fn raised_in_check(&self, repo_files: &[String]) -> bool {
        self.raising_check(repo_files).is_some()
    }

    /// The name of the check function the message is raised in, when
    /// [`Evidence::raised_in_check`] holds (`_check_not_negative`).
    pub fn raising_check(&self, repo_files: &[String]) -> Option<&str> {
        let mut frames = self
            .frames
            .iter()
            .rev()
            .filter(|f| match_repo_path(&f.file, repo_files).is_some());
        match (frames.next(), frames.next()) {
            (Some(f), Some(_)) if Self::frame_is_check(f) => f.function.as_deref(),
            _ => None,
        }
    }

    fn frame_is_check(frame: &Frame) -> bool {
        frame
            .function
            .as_deref()
            .is_some_and(Self::is_check_function)
    }

    /// Whether a function name says it only checks and raises (`_check_not_negative`,
    /// `validate_input`, `ensure_positive`, `assert_valid`, `_raise_for_status`).
    pub fn is_check_function(name: &str) -> bool {
        let n = name.trim_start_matches('_').to_lowercase();
        ["check", "validate", "ensure", "assert", "raise", "verify"]
            .iter()
            .any(|p| n.starts_with(p))
    }

    /// The constant words of the error messages (`invoice total cannot be negative` of
    /// `ValueError: invoice total cannot be negative: -12.50`): runs of at least three words
    /// that a search of the source for the message's literal can use.
    pub fn message_phrases(&self) -> Vec<String> {
        let mut out = Vec::new();
        for l in &self.error_lines {
            let msg = l.split_once(": ").map(|(_, m)| m).unwrap_or(l);
            let mut run: Vec<&str> = Vec::new();
            let mut flush = |run: &mut Vec<&str>| {
                if run.len() >= 3 {
                    push_unique(&mut out, run.join(" "), 8);
                }
                run.clear();
            };
            for w in msg.split_whitespace() {
                let word = w.trim_matches(|c: char| c == ',' || c == '.' || c == ';');
                let plain = !word.is_empty()
                    && word
                        .chars()
                        .all(|c| c.is_alphabetic() || c == '\'' || c == '-')
                    && word == w.trim_end_matches([',', '.', ';']);
                if plain {
                    run.push(word);
                } else {
                    // `negative:` ends the run but belongs to it.
                    let bare = word.trim_end_matches(':');
                    if !bare.is_empty() && bare.chars().all(char::is_alphabetic) {
                        run.push(bare);
                    }
                    flush(&mut run);
                }
            }
            flush(&mut run);
        }
        out
    }

    /// Everything a text check accepts a name from: the identifiers, frames, files, error
    /// and code lines, versions.
    pub fn vocabulary_text(&self) -> String {
        let mut t = String::new();
        for s in self
            .error_lines
            .iter()
            .chain(&self.code_lines)
            .chain(&self.identifiers)
            .chain(&self.files)
            .chain(&self.versions)
        {
            t.push_str(s);
            t.push('\n');
        }
        for f in &self.frames {
            t.push_str(&f.file);
            t.push(' ');
            if let Some(func) = &f.function {
                t.push_str(func);
            }
            t.push('\n');
        }
        t
    }
}

/// The repository path that `reported` names: the longest suffix of its components that is
/// a repository path (at least the file name; a bare file name only when it is unique).
pub fn match_repo_path<'a>(reported: &str, repo_files: &'a [String]) -> Option<&'a str> {
    let parts: Vec<&str> = reported
        .split(['/', '\\'])
        .filter(|p| !p.is_empty())
        .collect();
    for start in 0..parts.len() {
        let suffix = parts[start..].join("/");
        let matches: Vec<&'a String> = repo_files
            .iter()
            .filter(|f| f.as_str() == suffix || f.ends_with(&format!("/{suffix}")))
            .collect();
        if matches.len() == 1 || (matches.len() > 1 && start + 1 < parts.len()) {
            return matches.first().map(|s| s.as_str());
        }
        if matches.len() > 1 {
            return None;
        }
    }
    None
}

fn clean(line: &str) -> &str {
    line.trim()
        .trim_start_matches('>')
        .trim()
        .trim_matches('`')
        .trim()
}

fn is_caret_line(l: &str) -> bool {
    !l.is_empty() && l.chars().all(|c| c == '^' || c == '~' || c == ' ')
}

fn push_unique(v: &mut Vec<String>, s: String, most: usize) {
    if v.len() < most && !s.is_empty() && !v.contains(&s) {
        v.push(s);
    }
}

/// The text inside the report's fenced code blocks.
fn code_blocks(body: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for l in body.lines() {
        if l.trim_start().starts_with("```") {
            inside = !inside;
            continue;
        }
        if inside {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// Whether a word is worth treating as a code identifier: snake_case, camelCase or
/// PascalCase with two humps, dotted or `::` paths, a call, or any word in a code context
/// that is not noise.
fn looks_like_code(name: &str, code_context: bool) -> bool {
    if name.len() < 3 || name.len() > 80 || NOISE.contains(&name) {
        return false;
    }
    let last = name.rsplit(['.', ':']).next().unwrap_or(name);
    if NOISE.contains(&last) || last.len() < 2 {
        return false;
    }
    if name.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return false;
    }
    let snake = name.contains('_') && name.chars().any(|c| c.is_ascii_lowercase());
    let humps = name
        .chars()
        .zip(name.chars().skip(1))
        .filter(|(a, b)| a.is_ascii_lowercase() && b.is_ascii_uppercase())
        .count();
    let path = (name.contains('.') || name.contains("::"))
        && !name.ends_with(".md")
        && name
            .split(['.', ':'])
            .all(|p| p.is_empty() || !p.chars().all(|c| c.is_ascii_digit()));
    snake || humps >= 1 || path || (code_context && name.chars().any(|c| c.is_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const PY: &str = r#"Creating the invoice crashed.

```
Traceback (most recent call last):
  File "/home/j/make_invoice.py", line 10, in <module>
    print(invoice.total())
          ^^^^^^^^^^^^^^^
  File "/home/j/.venv/lib/python3.11/site-packages/ledgerlite/invoice.py", line 82, in total
    net = apply_discounts(subtotal, self.codes, validate=_check_not_negative)
  File "/home/j/.venv/lib/python3.11/site-packages/ledgerlite/discounts.py", line 96, in apply_discounts
    validate(amount)
ValueError: invoice total cannot be negative: -12.50
```

The CLI (`ledgerlite total --code SPRING60`) fails the same way. ledgerlite 0.4.1
"#;

    #[test]
    fn python_tracebacks_give_frames_code_lines_and_errors() {
        let ev = Evidence::extract("Invoice total goes negative", PY);
        assert_eq!(
            ev.error_lines,
            vec!["ValueError: invoice total cannot be negative: -12.50"]
        );
        assert_eq!(ev.frames.len(), 3);
        assert_eq!(ev.frames[2].function.as_deref(), Some("apply_discounts"));
        assert_eq!(ev.frames[2].line, Some(96));
        assert_eq!(
            ev.frames[1].code.as_deref(),
            Some("net = apply_discounts(subtotal, self.codes, validate=_check_not_negative)")
        );
        assert!(ev.identifiers.contains(&"apply_discounts".to_string()));
        assert!(ev.identifiers.contains(&"_check_not_negative".to_string()));
        assert!(!ev
            .identifiers
            .iter()
            .any(|i| i == "ValueError" || i == "self"));
        assert_eq!(ev.versions, vec!["0.4.1"]);
        let repo = vec![
            "ledgerlite/invoice.py".to_string(),
            "ledgerlite/discounts.py".to_string(),
            "tests/test_invoice.py".to_string(),
        ];
        assert_eq!(
            ev.repo_files(&repo),
            vec!["ledgerlite/discounts.py", "ledgerlite/invoice.py"]
        );
        assert_eq!(
            ev.message_phrases(),
            vec!["invoice total cannot be negative"]
        );
    }

    #[test]
    fn python_warnings_keep_the_offending_line() {
        let body = "Running it prints\n\n    /x/site-packages/pkg/stats.py:41: RuntimeWarning: invalid value encountered in divide\n      ratio = hits / total\n";
        let ev = Evidence::extract("warning", body);
        assert_eq!(
            ev.error_lines,
            vec!["RuntimeWarning: invalid value encountered in divide"]
        );
        assert_eq!(ev.code_lines, vec!["ratio = hits / total"]);
        assert_eq!(ev.frames[0].file, "/x/site-packages/pkg/stats.py");
        assert_eq!(ev.frames[0].line, Some(41));
    }

    #[test]
    fn rust_panics_give_frames() {
        let body = "thread 'main' panicked at src/parser.rs:120:9:\nindex out of bounds\n   4: mycrate::parser::Parser::next_token\n   5: std::rt::lang_start\n";
        let ev = Evidence::extract("parser panics on empty input", body);
        assert_eq!(ev.frames[0].file, "src/parser.rs");
        assert_eq!(ev.frames[0].line, Some(120));
        assert_eq!(
            ev.frames[1].function.as_deref(),
            Some("mycrate::parser::Parser::next_token")
        );
        assert_eq!(ev.frames.len(), 2);
        assert!(ev.error_lines[0].starts_with("thread 'main' panicked"));
    }

    #[test]
    fn prose_words_are_not_identifiers() {
        let ev = Evidence::extract(
            "Humanize returns wrong value",
            "When I call naturaldelta with a timedelta of months it says years. Expected the value to be right.",
        );
        assert!(ev.identifiers.is_empty(), "{:?}", ev.identifiers);
        let ev = Evidence::extract(
            "x",
            "Calling `naturaldelta(months=True)` or precisedelta() breaks",
        );
        assert!(ev.identifiers.contains(&"naturaldelta".to_string()));
        assert!(ev.identifiers.contains(&"precisedelta".to_string()));
    }

    #[test]
    fn bare_file_names_match_only_when_unique() {
        let repo = vec![
            "a/util.py".to_string(),
            "b/util.py".to_string(),
            "b/x.py".to_string(),
        ];
        assert_eq!(match_repo_path("util.py", &repo), None);
        assert_eq!(
            match_repo_path("/site-packages/b/util.py", &repo),
            Some("b/util.py")
        );
        assert_eq!(match_repo_path("x.py", &repo), Some("b/x.py"));
        assert_eq!(match_repo_path("zzz.py", &repo), None);
    }
}
