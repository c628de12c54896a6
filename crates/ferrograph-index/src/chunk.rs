//! Splitting documents into chunks.
//!
//! - Source code: at top-level items (Rust `fn`/`struct`/`enum`/`trait`/`impl`/`mod`/...,
//!   Python `def`/`class`, JS/TS `function`/`class`/`export ...`, Go `func`/`type`, ...), with
//!   the attributes, decorators and doc comments right above an item kept with it. Small
//!   neighbouring items are packed together; an item longer than `max_lines` is split at its
//!   nested items (methods) when it has some, else into overlapping line windows.
//! - Unknown languages: overlapping line windows.
//! - Markdown: at headings; long sections by paragraphs, packed up to `max_chars`.
//!   Plain text: by paragraphs.
//!
//! Every chunk keeps its line range (1-based, inclusive).

/// Chunk sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkOptions {
    /// Most lines in a code chunk.
    pub max_lines: usize,
    /// Most characters in a chunk (prose and code).
    pub max_chars: usize,
    /// Lines of overlap between windows.
    pub overlap_lines: usize,
    /// Pack neighbouring small items until a chunk has this many lines.
    pub min_lines: usize,
}

impl Default for ChunkOptions {
    fn default() -> Self {
        ChunkOptions {
            max_lines: 60,
            max_chars: 2400,
            overlap_lines: 8,
            min_lines: 8,
        }
    }
}

/// One piece of a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextChunk {
    /// First line (1-based).
    pub start_line: u32,
    /// Last line (1-based, inclusive).
    pub end_line: u32,
    /// The text.
    pub text: String,
    /// The enclosing heading (Markdown) or the first item's signature line (code).
    pub title: Option<String>,
}

/// The language of a file from its extension (`None` for files not worth indexing).
pub fn language_for_path(path: &str) -> Option<&'static str> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    Some(match ext.as_deref() {
        Some("rs") => "rust",
        Some("py") | Some("pyi") => "python",
        Some("js") | Some("mjs") | Some("cjs") | Some("jsx") => "javascript",
        Some("ts") | Some("tsx") | Some("mts") => "typescript",
        Some("go") => "go",
        Some("java") => "java",
        Some("kt") | Some("kts") => "kotlin",
        Some("c") | Some("h") => "c",
        Some("cc") | Some("cpp") | Some("cxx") | Some("hpp") | Some("hh") => "cpp",
        Some("rb") => "ruby",
        Some("sh") | Some("bash") => "shell",
        Some("toml") => "toml",
        Some("yaml") | Some("yml") => "yaml",
        Some("json") => "json",
        Some("md") | Some("markdown") => "markdown",
        Some("txt") | Some("rst") => "text",
        Some("html") | Some("css") | Some("sql") => "other",
        _ if name.eq_ignore_ascii_case("readme") || name.eq_ignore_ascii_case("license") => "text",
        _ => return None,
    })
}

fn strip_prefixes<'a>(mut s: &'a str, prefixes: &[&str]) -> &'a str {
    loop {
        let before = s;
        for p in prefixes {
            if let Some(rest) = s.strip_prefix(p) {
                s = rest.trim_start();
            }
        }
        if s == before {
            return s;
        }
    }
}

/// Whether a (trimmed) line starts an item in `language`.
fn is_item_start(language: &str, t: &str) -> bool {
    let starts = |ws: &[&str]| ws.iter().any(|w| t.starts_with(w));
    match language {
        "rust" => {
            let s = strip_prefixes(
                t,
                &[
                    "pub(crate)",
                    "pub(super)",
                    "pub(self)",
                    "pub",
                    "async",
                    "unsafe",
                    "const fn",
                    "extern \"C\"",
                    "default",
                ],
            );
            let s = if t.starts_with("const fn") { "fn" } else { s };
            [
                "fn ",
                "struct ",
                "enum ",
                "trait ",
                "impl",
                "mod ",
                "type ",
                "const ",
                "static ",
                "union ",
                "macro_rules!",
                "fn",
            ]
            .iter()
            .any(|w| s.starts_with(w))
                && !s.starts_with("impl Fn")
        }
        "python" => starts(&["def ", "async def ", "class "]),
        "javascript" | "typescript" => {
            let s = strip_prefixes(t, &["export", "default", "async", "declare", "abstract"]);
            [
                "function",
                "class ",
                "interface ",
                "enum ",
                "type ",
                "const ",
                "let ",
                "namespace ",
            ]
            .iter()
            .any(|w| s.starts_with(w))
        }
        "go" => starts(&["func ", "type ", "var (", "const ("]),
        "ruby" => starts(&["def ", "class ", "module "]),
        "java" | "kotlin" => {
            let s = strip_prefixes(
                t,
                &[
                    "public",
                    "private",
                    "protected",
                    "static",
                    "final",
                    "abstract",
                    "data",
                    "open",
                    "internal",
                    "override",
                ],
            );
            [
                "class ",
                "interface ",
                "enum ",
                "record ",
                "fun ",
                "object ",
            ]
            .iter()
            .any(|w| s.starts_with(w))
        }
        _ => false,
    }
}

/// Lines that belong to the item below them (attributes, decorators, doc comments).
fn is_preamble(language: &str, t: &str) -> bool {
    match language {
        "rust" => t.starts_with("#[") || t.starts_with("///") || t.starts_with("//!"),
        "python" => t.starts_with('@'),
        "javascript" | "typescript" | "java" | "kotlin" => {
            t.starts_with('@') || t.starts_with("/**") || t.starts_with("* ") || t == "*/"
        }
        "go" => t.starts_with("//"),
        _ => false,
    }
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Start lines (0-based) of items at indentation `level` within `lines[from..to]`, each moved
/// up over its preamble.
fn item_starts(lines: &[&str], from: usize, to: usize, language: &str, level: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for i in from..to {
        let l = lines[i];
        if indent(l) != level || l.trim().is_empty() {
            continue;
        }
        if is_item_start(language, l.trim_start()) {
            let mut s = i;
            while s > from
                && indent(lines[s - 1]) == level
                && is_preamble(language, lines[s - 1].trim_start())
            {
                s -= 1;
            }
            if out.last() != Some(&s) {
                out.push(s);
            }
        }
    }
    out
}

fn make(lines: &[&str], a: usize, b: usize, title: Option<String>) -> Option<TextChunk> {
    let text = lines[a..b].join("\n");
    if text.trim().is_empty() {
        return None;
    }
    Some(TextChunk {
        start_line: a as u32 + 1,
        end_line: b as u32,
        text,
        title,
    })
}

/// Overlapping line windows over `lines[a..b]`, each within `max_lines` and `max_chars`.
fn windows(lines: &[&str], a: usize, b: usize, o: &ChunkOptions, out: &mut Vec<TextChunk>) {
    let max_lines = o.max_lines.max(1);
    let overlap = o.overlap_lines.min(max_lines / 2);
    let mut s = a;
    while s < b {
        let mut e = s;
        let mut chars = 0;
        while e < b && e - s < max_lines {
            let n = lines[e].chars().count() + 1;
            if e > s && chars + n > o.max_chars {
                break;
            }
            chars += n;
            e += 1;
        }
        if let Some(c) = make(lines, s, e, None) {
            out.push(c);
        }
        if e >= b {
            break;
        }
        s = if e - s > overlap { e - overlap } else { e };
    }
}

fn too_big(lines: &[&str], a: usize, b: usize, o: &ChunkOptions) -> bool {
    b - a > o.max_lines || lines[a..b].iter().map(|l| l.len() + 1).sum::<usize>() > o.max_chars
}

fn title_of(lines: &[&str], a: usize, b: usize, language: &str) -> Option<String> {
    lines[a..b]
        .iter()
        .map(|l| l.trim())
        .find(|t| is_item_start(language, t))
        .map(|t| t.chars().take(120).collect())
}

/// Splits `lines[a..b]` at items of indentation `level`, packing small items and recursing
/// one level deeper into oversized ones.
fn split_items(
    lines: &[&str],
    a: usize,
    b: usize,
    language: &str,
    level: usize,
    o: &ChunkOptions,
    out: &mut Vec<TextChunk>,
) {
    let starts = item_starts(lines, a, b, language, level);
    if starts.is_empty() {
        windows(lines, a, b, o, out);
        return;
    }
    let mut bounds = vec![a];
    bounds.extend(starts.into_iter().filter(|s| *s > a));
    bounds.push(b);
    // Pack consecutive segments while they fit; split oversized ones.
    let flush = |s: usize, e: usize, out: &mut Vec<TextChunk>| {
        if e > s {
            if let Some(c) = make(lines, s, e, title_of(lines, s, e, language)) {
                out.push(c);
            }
        }
    };
    let (mut ps, mut pe) = (a, a);
    for w in bounds.windows(2) {
        let (s, e) = (w[0], w[1]);
        if too_big(lines, s, e, o) {
            flush(ps, pe, out);
            split_big(lines, s, e, language, level, o, out);
            (ps, pe) = (e, e);
            continue;
        }
        if too_big(lines, ps, e, o) {
            flush(ps, pe, out);
            ps = s;
        }
        pe = e;
        if pe - ps >= o.min_lines {
            flush(ps, pe, out);
            ps = pe;
        }
    }
    flush(ps, pe, out);
}

/// An oversized item: split at its nested items (one indentation level deeper) when it has
/// some, else into windows.
fn split_big(
    lines: &[&str],
    a: usize,
    b: usize,
    language: &str,
    level: usize,
    o: &ChunkOptions,
    out: &mut Vec<TextChunk>,
) {
    let inner = lines[a..b]
        .iter()
        .skip(1)
        .map(|l| indent(l))
        .zip(lines[a..b].iter().skip(1))
        .filter(|(i, l)| *i > level && !l.trim().is_empty())
        .map(|(i, _)| i)
        .min();
    match inner {
        Some(inner) if level < 16 && !item_starts(lines, a + 1, b, language, inner).is_empty() => {
            split_items(lines, a, b, language, inner, o, out)
        }
        _ => windows(lines, a, b, o, out),
    }
}

/// Chunks a source file.
pub fn chunk_code(text: &str, language: &str, o: &ChunkOptions) -> Vec<TextChunk> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    if lines.is_empty() {
        return out;
    }
    split_items(&lines, 0, lines.len(), language, 0, o, &mut out);
    out
}

/// Chunks Markdown: sections at headings (outside code fences), long sections by
/// paragraphs.
pub fn chunk_markdown(text: &str, o: &ChunkOptions) -> Vec<TextChunk> {
    let lines: Vec<&str> = text.lines().collect();
    let mut sections: Vec<(usize, Option<String>)> = vec![(0, None)];
    let mut fence = false;
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fence = !fence;
        }
        if !fence && t.starts_with('#') && i > 0 {
            sections.push((i, Some(t.trim_start_matches('#').trim().to_string())));
        } else if !fence && t.starts_with('#') && i == 0 {
            sections[0].1 = Some(t.trim_start_matches('#').trim().to_string());
        }
    }
    let mut out = Vec::new();
    for (j, (a, title)) in sections.iter().enumerate() {
        let b = sections.get(j + 1).map_or(lines.len(), |s| s.0);
        paragraphs(&lines, *a, b, title.clone(), o, &mut out);
    }
    out
}

/// Chunks prose by paragraphs (blank-line separated), packed up to `max_chars`.
pub fn chunk_prose(text: &str, o: &ChunkOptions) -> Vec<TextChunk> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    paragraphs(&lines, 0, lines.len(), None, o, &mut out);
    out
}

fn paragraphs(
    lines: &[&str],
    a: usize,
    b: usize,
    title: Option<String>,
    o: &ChunkOptions,
    out: &mut Vec<TextChunk>,
) {
    if !too_big(
        lines,
        a,
        b,
        &ChunkOptions {
            max_lines: usize::MAX,
            ..*o
        },
    ) {
        if let Some(c) = make(lines, a, b, title) {
            out.push(c);
        }
        return;
    }
    // Paragraph boundaries.
    let mut bounds = vec![a];
    for i in a + 1..b {
        if lines[i - 1].trim().is_empty() && !lines[i].trim().is_empty() {
            bounds.push(i);
        }
    }
    bounds.push(b);
    let mut cur = a;
    let mut chars = 0usize;
    for w in bounds.windows(2) {
        let (s, e) = (w[0], w[1]);
        let n: usize = lines[s..e].iter().map(|l| l.len() + 1).sum();
        if chars + n > o.max_chars && s > cur {
            if let Some(c) = make(lines, cur, s, title.clone()) {
                out.push(c);
            }
            cur = s;
            chars = 0;
        }
        if n > o.max_chars {
            // One huge paragraph: windows.
            let before = out.len();
            windows(
                lines,
                s,
                e,
                &ChunkOptions {
                    max_lines: usize::MAX,
                    ..*o
                },
                out,
            );
            for c in &mut out[before..] {
                c.title.clone_from(&title);
            }
            cur = e;
            chars = 0;
            continue;
        }
        chars += n;
    }
    if cur < b {
        if let Some(c) = make(lines, cur, b, title) {
            out.push(c);
        }
    }
}

/// Chunks a document by its language.
pub fn chunk_document(text: &str, language: &str, o: &ChunkOptions) -> Vec<TextChunk> {
    match language {
        "markdown" => chunk_markdown(text, o),
        "text" => chunk_prose(text, o),
        "rust" | "python" | "javascript" | "typescript" | "go" | "ruby" | "java" | "kotlin" => {
            chunk_code(text, language, o)
        }
        _ => {
            let lines: Vec<&str> = text.lines().collect();
            let mut out = Vec::new();
            windows(&lines, 0, lines.len(), o, &mut out);
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covers(text: &str, chunks: &[TextChunk]) {
        let n = text.lines().count() as u32;
        for c in chunks {
            assert!(c.start_line >= 1 && c.end_line <= n && c.start_line <= c.end_line);
            let expect: Vec<&str> = text
                .lines()
                .skip(c.start_line as usize - 1)
                .take((c.end_line - c.start_line + 1) as usize)
                .collect();
            assert_eq!(c.text, expect.join("\n"));
        }
        // Every non-blank line is in some chunk.
        for (i, l) in text.lines().enumerate() {
            if !l.trim().is_empty() {
                let ln = i as u32 + 1;
                assert!(
                    chunks
                        .iter()
                        .any(|c| c.start_line <= ln && ln <= c.end_line),
                    "line {ln} `{l}` not covered"
                );
            }
        }
    }

    #[test]
    fn rust_items_and_big_impls() {
        let mut src = String::from("//! Crate docs.\nuse std::fmt;\n\n");
        src.push_str("/// A thing.\n#[derive(Debug)]\npub struct Thing {\n    a: u32,\n}\n\n");
        src.push_str("impl Thing {\n");
        for i in 0..12 {
            src.push_str(&format!(
                "    /// Method {i}.\n    pub fn m{i}(&self) -> u32 {{\n"
            ));
            for j in 0..6 {
                src.push_str(&format!("        let x{j} = {j};\n"));
            }
            src.push_str("        self.a\n    }\n\n");
        }
        src.push_str("}\n\nfn free() {}\n");
        let o = ChunkOptions::default();
        let chunks = chunk_code(&src, "rust", &o);
        covers(&src, &chunks);
        assert!(chunks.len() >= 3, "{chunks:#?}");
        assert!(chunks
            .iter()
            .all(|c| (c.end_line - c.start_line) as usize <= o.max_lines));
        // The doc comment and derive stay with the struct.
        let s = chunks
            .iter()
            .find(|c| c.text.contains("pub struct Thing"))
            .unwrap();
        assert!(s.text.contains("#[derive(Debug)]") && s.text.contains("/// A thing."));
        // Methods are split at their own boundaries with their docs.
        assert!(chunks
            .iter()
            .any(|c| c.text.trim_start().starts_with("/// Method")));
    }

    #[test]
    fn python_and_windows() {
        let src = "import os\n\n@dec\ndef f():\n    return 1\n\nclass C:\n    def g(self):\n        pass\n";
        let chunks = chunk_code(
            src,
            "python",
            &ChunkOptions {
                min_lines: 1,
                ..Default::default()
            },
        );
        covers(src, &chunks);
        assert!(chunks.iter().any(|c| c.text.starts_with("@dec\ndef f")));
        let long: String = (0..200).map(|i| format!("line {i}\n")).collect();
        let w = chunk_document(&long, "toml", &ChunkOptions::default());
        covers(&long, &w);
        assert!(w.len() >= 4);
        // Overlap between windows.
        assert!(w[1].start_line < w[0].end_line);
    }

    #[test]
    fn markdown_by_headings_and_paragraphs() {
        let mut md =
            String::from("# Title\n\nIntro.\n\n## Part one\n\n```\n# not a heading\n```\n\n");
        for i in 0..40 {
            md.push_str(&format!(
                "Paragraph {i} with some words in it to take up space.\n\n"
            ));
        }
        md.push_str("## Part two\n\nEnd.\n");
        let o = ChunkOptions {
            max_chars: 500,
            ..Default::default()
        };
        let chunks = chunk_markdown(&md, &o);
        covers(&md, &chunks);
        assert!(chunks.iter().all(|c| c.text.len() <= 500));
        assert!(chunks
            .iter()
            .any(|c| c.title.as_deref() == Some("Part two")));
        assert!(!chunks
            .iter()
            .any(|c| c.title.as_deref() == Some("not a heading")));
    }

    #[test]
    fn languages() {
        assert_eq!(language_for_path("a/b.rs"), Some("rust"));
        assert_eq!(language_for_path("README.md"), Some("markdown"));
        assert_eq!(language_for_path("x.bin"), None);
        assert_eq!(language_for_path("x.tsx"), Some("typescript"));
    }
}
