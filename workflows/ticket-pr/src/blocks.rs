//! Search/replace edit blocks: how a code model (0.5B and up) changes a file. The model
//! quotes the lines to change and writes them as they should be:
//!
//! ```text
//! src/app/service.py
//! <<<<<<< SEARCH
//!     if due < today:
//! =======
//!     if due is not None and due < today:
//! >>>>>>> REPLACE
//! ```
//!
//! Blocks are matched against the file exactly, then ignoring trailing whitespace, then
//! ignoring indentation (the replacement is re-indented by the same amount); a block that
//! matches nowhere, or in more than one place, is an error the model is told about. A block
//! with an empty SEARCH part writes a new file. The result of each file is checked to parse
//! ([`parse_check`]) before it goes any further.

use std::path::Path;

/// One search/replace block of a model's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EditBlock {
    /// The file the block changes, as the model named it (see [`resolve_path`]).
    pub path: String,
    /// The lines to find (empty: the block writes a new file).
    pub search: String,
    /// The lines to put in their place.
    pub replace: String,
}

const SEARCH: &str = "<<<<<<< SEARCH";
const DIVIDER: &str = "=======";
const REPLACE: &str = ">>>>>>> REPLACE";

fn is_marker(line: &str, marker: &str) -> bool {
    let t = line.trim();
    // Models write 5 to 9 marker characters; the word matters, not the count.
    let (lead, word) = marker.split_at(marker.find(' ').unwrap_or(marker.len()));
    let c = lead.chars().next().unwrap_or('=');
    let stripped = t.trim_start_matches(c);
    t.len() - stripped.len() >= 5 && stripped.trim() == word.trim()
}

/// The file a block names: the last non-empty line before its SEARCH marker that is not a
/// code fence, with fences, backticks, `File:` and `#` prefixes taken off.
fn path_line(line: &str) -> Option<String> {
    let mut t = line.trim();
    if t.starts_with("```") {
        t = t.trim_start_matches('`');
        // ```python path/to/file.py
        t = t.split_whitespace().nth(1).unwrap_or("");
    }
    let t = t
        .trim_start_matches('#')
        .trim()
        .trim_start_matches("File:")
        .trim_start_matches("FILE:")
        .trim_start_matches("file:")
        .trim()
        .trim_matches(|c| c == '`' || c == '*' || c == '"' || c == '\'')
        .trim_end_matches(':')
        .trim();
    let plausible =
        !t.is_empty() && !t.contains(char::is_whitespace) && (t.contains('.') || t.contains('/'));
    plausible.then(|| t.to_string())
}

/// The blocks of `answer`, in order. A block without a file name takes the previous block's,
/// or `default_path` (the only file offered). Unclosed blocks are an error naming the
/// marker that is missing.
pub fn parse_blocks(answer: &str, default_path: Option<&str>) -> Result<Vec<EditBlock>, String> {
    let lines: Vec<&str> = answer.lines().collect();
    let mut out: Vec<EditBlock> = Vec::new();
    let mut i = 0;
    let mut last_path: Option<String> = None;
    while i < lines.len() {
        if !is_marker(lines[i], SEARCH) {
            i += 1;
            continue;
        }
        let named = lines[..i]
            .iter()
            .rev()
            .take(3)
            .map(|l| l.trim())
            .filter(|l| !l.is_empty() && *l != "```")
            .find_map(path_line);
        let path = named
            .or_else(|| last_path.clone())
            .or_else(|| default_path.map(str::to_string))
            .ok_or("a SEARCH block names no file: write the file's path on the line before it")?;
        let start = i + 1;
        let divider = (start..lines.len())
            .find(|&j| is_marker(lines[j], DIVIDER))
            .ok_or_else(|| format!("the block for {path} has no `{DIVIDER}` line"))?;
        let end = (divider + 1..lines.len())
            .find(|&j| is_marker(lines[j], REPLACE))
            .ok_or_else(|| format!("the block for {path} has no `{REPLACE}` line"))?;
        out.push(EditBlock {
            path: path.clone(),
            search: lines[start..divider].join("\n"),
            replace: lines[divider + 1..end].join("\n"),
        });
        last_path = Some(path);
        i = end + 1;
    }
    Ok(out)
}

/// The path of `named` among `offered` (the files the model may change): the same path, or
/// the only offered path that ends with it (a model often drops the leading folders).
pub fn resolve_path(named: &str, offered: &[String]) -> Option<String> {
    let named = named.trim_start_matches("./").trim_start_matches('/');
    if let Some(p) = offered.iter().find(|p| p.as_str() == named) {
        return Some(p.clone());
    }
    let tail: Vec<&String> = offered
        .iter()
        .filter(|p| p.ends_with(&format!("/{named}")))
        .collect();
    match tail.as_slice() {
        [one] => Some((*one).clone()),
        _ => None,
    }
}

/// The lines of `t` without its leading and trailing blank lines: noise around the lines
/// that matter.
fn trim_blank(t: &str) -> Vec<&str> {
    let v = lines_of(t);
    let a = v
        .iter()
        .position(|l| !l.trim().is_empty())
        .unwrap_or(v.len());
    let b = v
        .iter()
        .rposition(|l| !l.trim().is_empty())
        .map_or(a, |b| b + 1);
    v[a..b.max(a)].to_vec()
}

fn indent_of(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// The lines of `text`, with `\r` taken off.
fn lines_of(text: &str) -> Vec<&str> {
    text.lines()
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect()
}

/// The windows of `file` whose lines equal `search`'s under `same`.
fn windows(file: &[&str], search: &[&str], same: impl Fn(&str, &str) -> bool) -> Vec<usize> {
    if search.is_empty() || search.len() > file.len() {
        return Vec::new();
    }
    (0..=file.len() - search.len())
        .filter(|&i| search.iter().enumerate().all(|(k, s)| same(file[i + k], s)))
        .collect()
}

/// `content` with `block` applied: its SEARCH lines found once (exactly, then ignoring
/// trailing whitespace, then ignoring indentation) and replaced. Errors say what to fix.
pub fn apply_block(content: &str, block: &EditBlock) -> Result<String, String> {
    let search = trim_blank(&block.search);
    let replace = trim_blank(&block.replace);
    if search.is_empty() {
        return Err(format!(
            "the SEARCH part for {} is empty: quote the lines to change",
            block.path
        ));
    }
    let file = lines_of(content);
    let exact = windows(&file, &search, |a, b| a == b);
    let trailing = || windows(&file, &search, |a, b| a.trim_end() == b.trim_end());
    let loose = || windows(&file, &search, |a, b| a.trim() == b.trim());
    let (at, reindent) = match (exact.as_slice(), trailing(), loose()) {
        ([one], _, _) => (*one, false),
        ([], t, _) if t.len() == 1 => (t[0], false),
        ([], t, l) if t.is_empty() && l.len() == 1 => (l[0], true),
        (e, t, l) if e.len() > 1 || t.len() > 1 || l.len() > 1 => {
            return Err(format!(
                "the SEARCH lines for {} match {} places: quote more lines around the change so that they match one",
                block.path,
                e.len().max(t.len()).max(l.len())
            ))
        }
        _ => {
            let first = search.first().map(|l| l.trim()).unwrap_or_default();
            let near = file
                .iter()
                .enumerate()
                .find(|(_, l)| !first.is_empty() && l.trim() == first)
                .map(|(n, _)| format!(" (its first line is line {} of the file; a later line differs)", n + 1))
                .unwrap_or_default();
            return Err(format!(
                "the SEARCH lines for {} are not in the file{near}: copy them exactly from the file",
                block.path
            ));
        }
    };
    let new_lines: Vec<String> = if reindent {
        // Shift the replacement by the difference between the file's indentation and the
        // block's at the first line.
        let file_indent = indent_of(file[at]);
        let block_indent = indent_of(search[0]);
        replace
            .iter()
            .map(|l| {
                if l.trim().is_empty() {
                    String::new()
                } else if let Some(rest) = l.strip_prefix(block_indent) {
                    format!("{file_indent}{rest}")
                } else {
                    format!("{file_indent}{}", l.trim_start())
                }
            })
            .collect()
    } else {
        replace.iter().map(|l| l.to_string()).collect()
    };
    let mut out: Vec<String> = file[..at].iter().map(|l| l.to_string()).collect();
    out.extend(new_lines);
    out.extend(file[at + search.len()..].iter().map(|l| l.to_string()));
    let mut text = out.join("\n");
    if content.ends_with('\n') || content.is_empty() {
        text.push('\n');
    }
    Ok(text)
}

/// How a file's new content was checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseCheck {
    /// It parses (`python3 -m py_compile`; `syn` for Rust).
    Parses(&'static str),
    /// No parser for this language here (the reason).
    NotChecked(String),
}

/// Checks that `content`, the new text of `path`, parses: Python with Python's own compiler (as `python3 -m
/// py_compile` does, in a temporary folder; no code runs), Rust with `syn`,
/// Java and others by their brackets balancing. `Err` carries the parser's message.
pub fn parse_check(path: &str, content: &str) -> Result<ParseCheck, String> {
    match Path::new(path).extension().and_then(|e| e.to_str()) {
        Some("py") => python_compiles(path, content),
        Some("rs") => syn::parse_file(content)
            .map(|_| ParseCheck::Parses("syn"))
            .map_err(|e| format!("{path}: {e}")),
        Some("java" | "js" | "ts" | "c" | "cpp" | "go" | "kt") => {
            brackets_balance(content).map_err(|e| format!("{path}: {e}"))?;
            Ok(ParseCheck::Parses("bracket balance"))
        }
        _ => Ok(ParseCheck::NotChecked(format!("no parser for {path}"))),
    }
}

/// Compiles `argv[1]` as Python source named `argv[2]`; on a syntax error prints
/// `path:line:column: message` and the line, and exits 1.
const PY_CHECK: &str = r#"import sys
src = open(sys.argv[1], encoding="utf-8", errors="surrogateescape").read()
try:
    compile(src, sys.argv[2], "exec", dont_inherit=True)
except SyntaxError as e:
    print(f"{sys.argv[2]}:{e.lineno}:{e.offset}: {e.msg}\n    {(e.text or '').rstrip()}", file=sys.stderr)
    sys.exit(1)
except (ValueError, UnicodeError) as e:
    print(f"{sys.argv[2]}: {e}", file=sys.stderr)
    sys.exit(1)
"#;

fn python_compiles(path: &str, content: &str) -> Result<ParseCheck, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary folder: {e}"))?;
    let name = Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file.py".into());
    let file = dir.path().join(&name);
    std::fs::write(&file, content).map_err(|e| format!("writing {}: {e}", file.display()))?;
    // `compile` only compiles (what `python3 -m py_compile` does): no code of the file runs,
    // and nothing is written.
    let out = std::process::Command::new("python3")
        .arg("-I")
        .arg("-c")
        .arg(PY_CHECK)
        .arg(&file)
        .arg(path)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(dir.path())
        .output();
    match out {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ParseCheck::NotChecked(
            "python3 is not installed: Python files are not parse-checked".into(),
        )),
        Err(e) => Err(format!("running python3: {e}")),
        Ok(o) if o.status.success() => Ok(ParseCheck::Parses("python3 compile")),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim_end().to_string()),
    }
}

/// Brackets balance outside strings and comments (a cheap check for C-like languages).
fn brackets_balance(text: &str) -> Result<(), String> {
    let mut stack: Vec<(char, usize)> = Vec::new();
    let mut line = 1;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' => line += 1,
            '/' if chars.peek() == Some(&'/') => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        line += 1;
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut prev = ' ';
                for n in chars.by_ref() {
                    if n == '\n' {
                        line += 1;
                    }
                    if prev == '*' && n == '/' {
                        break;
                    }
                    prev = n;
                }
            }
            '"' | '\'' => {
                let mut escaped = false;
                for n in chars.by_ref() {
                    if n == '\n' {
                        line += 1;
                    }
                    if escaped {
                        escaped = false;
                    } else if n == '\\' {
                        escaped = true;
                    } else if n == c {
                        break;
                    }
                }
            }
            '(' | '[' | '{' => stack.push((c, line)),
            ')' | ']' | '}' => {
                let want = match c {
                    ')' => '(',
                    ']' => '[',
                    _ => '{',
                };
                match stack.pop() {
                    Some((open, _)) if open == want => {}
                    Some((open, at)) => {
                        return Err(format!(
                            "line {line}: `{c}` closes the `{open}` opened at line {at}"
                        ))
                    }
                    None => return Err(format!("line {line}: `{c}` closes nothing")),
                }
            }
            _ => {}
        }
    }
    match stack.pop() {
        Some((open, at)) => Err(format!("the `{open}` opened at line {at} is never closed")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const FILE: &str = "def overdue(tasks, today):\n    out = []\n    for t in tasks:\n        if t.due < today:\n            out.append(t)\n    return out\n";

    #[test]
    fn blocks_are_parsed_with_their_paths() {
        let answer = "The bug is the missing None check.\n\napp/tasks.py\n```python\n<<<<<<< SEARCH\n        if t.due < today:\n=======\n        if t.due is not None and t.due < today:\n>>>>>>> REPLACE\n```\n\n```\n<<<<<<< SEARCH\n    return out\n=======\n    return sorted(out)\n>>>>>>> REPLACE\n```";
        let blocks = parse_blocks(answer, None).unwrap();
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].path, "app/tasks.py");
        assert_eq!(
            blocks[1].path, "app/tasks.py",
            "a block without a name takes the last one"
        );
        assert_eq!(blocks[0].search, "        if t.due < today:");
        assert_eq!(
            blocks[0].replace,
            "        if t.due is not None and t.due < today:"
        );
        assert!(
            parse_blocks("<<<<<<< SEARCH\nx\n=======\ny\n", Some("a.py"))
                .unwrap_err()
                .contains("REPLACE")
        );
        assert!(parse_blocks("no blocks here", None).unwrap().is_empty());
        // A fenced name and a `File:` prefix.
        let b = parse_blocks(
            "File: `src/x.rs`\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE",
            None,
        )
        .unwrap();
        assert_eq!(b[0].path, "src/x.rs");
    }

    #[test]
    fn paths_resolve_among_the_offered_files() {
        let offered = vec![
            "pkg/app/tasks.py".to_string(),
            "pkg/app/util.py".to_string(),
        ];
        assert_eq!(
            resolve_path("pkg/app/tasks.py", &offered).unwrap(),
            "pkg/app/tasks.py"
        );
        assert_eq!(
            resolve_path("tasks.py", &offered).unwrap(),
            "pkg/app/tasks.py"
        );
        assert_eq!(
            resolve_path("./app/util.py", &offered).unwrap(),
            "pkg/app/util.py"
        );
        assert_eq!(resolve_path("other.py", &offered), None);
        assert_eq!(resolve_path("../../etc/passwd", &offered), None);
    }

    fn block(search: &str, replace: &str) -> EditBlock {
        EditBlock {
            path: "app/tasks.py".into(),
            search: search.into(),
            replace: replace.into(),
        }
    }

    #[test]
    fn blocks_apply_exactly_then_loosely() {
        let exact = apply_block(
            FILE,
            &block(
                "        if t.due < today:",
                "        if t.due is not None and t.due < today:",
            ),
        )
        .unwrap();
        assert!(exact
            .contains("        if t.due is not None and t.due < today:\n            out.append"));
        assert!(exact.ends_with("return out\n"));
        // The model lost the indentation: the replacement takes the file's.
        let loose = apply_block(
            FILE,
            &block(
                "if t.due < today:\n    out.append(t)",
                "if t.due and t.due < today:\n    out.append(t)",
            ),
        )
        .unwrap();
        assert!(
            loose.contains("\n        if t.due and t.due < today:\n            out.append(t)\n"),
            "{loose}"
        );
        // Blank lines around a block do not matter.
        assert!(
            apply_block(FILE, &block("\n    return out\n\n", "    return list(out)"))
                .unwrap()
                .contains("return list(out)")
        );
    }

    #[test]
    fn blocks_that_match_nowhere_or_twice_are_errors_that_say_what_to_do() {
        let missing = apply_block(FILE, &block("if t.due <= today:", "x")).unwrap_err();
        assert!(missing.contains("not in the file"), "{missing}");
        let near = apply_block(FILE, &block("for t in tasks:\n    if t.late:", "x")).unwrap_err();
        assert!(near.contains("line 3"), "{near}");
        let twice = apply_block("a = 1\nb = 2\na = 1\n", &block("a = 1", "a = 3")).unwrap_err();
        assert!(twice.contains("2 places"), "{twice}");
        assert!(apply_block(FILE, &block("", "x"))
            .unwrap_err()
            .contains("empty"));
    }

    #[test]
    fn python_that_does_not_compile_is_refused_with_the_line() {
        match parse_check("app/tasks.py", FILE) {
            Ok(ParseCheck::Parses(_)) => {}
            Ok(ParseCheck::NotChecked(why)) => {
                eprintln!("python3 missing: {why}");
                return;
            }
            Err(e) => panic!("{e}"),
        }
        let broken = FILE.replace("if t.due < today:", "if t.due < today");
        let err = parse_check("app/tasks.py", &broken).unwrap_err();
        assert!(err.contains("app/tasks.py"), "{err}");
        assert!(err.contains("app/tasks.py:4:"), "names the line: {err}");
    }

    #[test]
    fn rust_and_java_are_parse_checked() {
        assert!(matches!(
            parse_check("src/lib.rs", "fn a() -> u32 { 1 }"),
            Ok(ParseCheck::Parses("syn"))
        ));
        assert!(parse_check("src/lib.rs", "fn a() -> u32 { 1 ").is_err());
        let java = "class A { String s = \"}\"; // }\n void f() { if (x) { y(); } } }";
        assert!(parse_check("A.java", java).is_ok());
        let err = parse_check("A.java", "class A { void f() { }").unwrap_err();
        assert!(err.contains("never closed"), "{err}");
        assert!(matches!(
            parse_check("README.md", "#"),
            Ok(ParseCheck::NotChecked(_))
        ));
    }
}
