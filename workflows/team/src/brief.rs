//! The brief: a Markdown file, or a folder with `brief.md` and an optional `reference/`
//! folder of Python files (a reference implementation the engineer falls back to when the
//! model's code fails its tests). What it asks for, and whether it says enough to start.

use crate::error::TeamError;
use std::collections::BTreeMap;
use std::path::Path;

/// Largest brief read (bytes).
pub const MAX_BRIEF_BYTES: u64 = 64 * 1024;

/// A brief as read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Brief {
    /// Its text.
    pub text: String,
    /// Reference files (path → content).
    pub reference: BTreeMap<String, String>,
}

fn read_capped(path: &Path) -> Result<String, TeamError> {
    let meta = std::fs::metadata(path).map_err(|e| TeamError::io(path, e))?;
    if meta.len() > MAX_BRIEF_BYTES {
        return Err(TeamError::Brief {
            path: path.to_path_buf(),
            reason: format!(
                "{} bytes is over the {MAX_BRIEF_BYTES}-byte limit",
                meta.len()
            ),
        });
    }
    std::fs::read_to_string(path).map_err(|e| TeamError::io(path, e))
}

/// Reads the brief at `path`.
pub fn load(path: &Path) -> Result<Brief, TeamError> {
    let (file, dir) = if path.is_dir() {
        (path.join("brief.md"), Some(path))
    } else {
        (path.to_path_buf(), None)
    };
    if !file.is_file() {
        return Err(TeamError::Brief {
            path: file,
            reason: "no such file (a brief is a Markdown file, or a folder with brief.md)".into(),
        });
    }
    let text = read_capped(&file)?;
    let mut reference = BTreeMap::new();
    if let Some(refdir) = dir.map(|d| d.join("reference")).filter(|r| r.is_dir()) {
        let entries = std::fs::read_dir(&refdir).map_err(|e| TeamError::io(&refdir, e))?;
        for e in entries {
            let e = e.map_err(|err| TeamError::io(&refdir, err))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if e.file_type()
                .map_err(|err| TeamError::io(e.path(), err))?
                .is_file()
                && name.ends_with(".py")
            {
                crate::workspace::check_path(&name)?;
                reference.insert(name, read_capped(&e.path())?);
            }
        }
    }
    Ok(Brief { text, reference })
}

/// The Python files the brief names (`name.py`), in order, each once; with none named,
/// `app.py` and `test_app.py`. A test file is added for the first source file if the brief
/// names none.
pub fn deliverables(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for raw in text.split(|c: char| c.is_whitespace() || "`'\"(),;:*".contains(c)) {
        let w = raw.trim_end_matches('.');
        let ok = w.ends_with(".py")
            && w.len() > 3
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
            && crate::workspace::check_path(w).is_ok();
        if ok && !out.iter().any(|o| o == w) {
            out.push(w.to_string());
        }
    }
    if !out.iter().any(|f| !is_test_file(f)) {
        out.insert(0, "app.py".into());
    }
    if !out.iter().any(|f| is_test_file(f)) {
        let first = out
            .iter()
            .find(|f| !is_test_file(f))
            .cloned()
            .unwrap_or_default();
        out.push(format!("test_{first}"));
    }
    out
}

/// Whether `path` is a test file (`test*.py`).
pub fn is_test_file(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|n| n.starts_with("test"))
}

/// Why the brief is too vague to clarify, if it is: under 12 words, or no sentence or
/// bullet of at least 6 words that says what to build.
pub fn vagueness(text: &str) -> Option<String> {
    let words = text.split_whitespace().count();
    if words < 12 {
        return Some(format!("the brief has {words} words: it does not say what to build, for whom, or how to tell it works"));
    }
    let concrete = text
        .split(['.', '\n', ';'])
        .any(|s| s.split_whitespace().count() >= 6);
    if !concrete {
        return Some("no sentence of the brief says what the program must do".into());
    }
    None
}

/// The lines of `text` that are prose: not inside a code fence, not indented code, not a
/// table row, not a line of badges or images (a README's header).
fn prose_lines(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut fenced = false;
    for l in text.lines() {
        let t = l.trim_start();
        if t.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let code = l.starts_with("    ") || l.starts_with('\t');
        let markup =
            t.starts_with('|') || t.starts_with("[!") || t.starts_with("![") || t.starts_with("<");
        if !fenced && !code && !markup {
            out.push(l);
        }
    }
    out
}

/// The brief's requirements, read without a model: its bullet lines, else its sentences
/// (headings and the out-of-scope line aside).
pub fn objectives(text: &str) -> Vec<String> {
    let clean = |s: &str| plain_text(s.trim().trim_start_matches(['-', '*', '+']).trim());
    let bullets: Vec<String> = text
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            (t.starts_with("- ") || t.starts_with("* "))
                && !t.to_lowercase().contains("out of scope")
        })
        .map(clean)
        .filter(|l| l.split_whitespace().count() >= 3)
        .collect();
    if !bullets.is_empty() {
        return bullets.into_iter().take(6).collect();
    }
    prose_lines(text)
        .into_iter()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join(" ")
        .split(". ")
        .map(clean)
        .filter(|s| {
            s.split_whitespace().count() >= 5 && !s.to_lowercase().starts_with("out of scope")
        })
        .take(4)
        .collect()
}

/// A line of Markdown as plain text: links as their text, emphasis and code marks dropped
/// (a README's `**bold**` and `[name](url)` otherwise end up in story titles).
fn plain_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        match after.find("](").and_then(|close| {
            let url = &after[close + 2..];
            url.find(')').map(|end| (close, close + 2 + end + 1))
        }) {
            Some((close, skip)) => {
                out.push_str(&rest[..open]);
                out.push_str(&after[..close]);
                rest = &after[skip..];
            }
            None => {
                out.push_str(&rest[..=open]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    let out = out.replace("**", "").replace("__", "").replace('`', "");
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What the brief puts out of scope (`Out of scope: a, b`).
pub fn out_of_scope(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let lower = l.to_lowercase();
            let at = lower.find("out of scope")?;
            let rest = &l[at + "out of scope".len()..];
            Some(rest.trim_start_matches([':', ' ']).to_string())
        })
        .flat_map(|rest| {
            rest.split([',', ';'])
                .map(|s| s.trim().trim_end_matches('.').to_string())
                .collect::<Vec<_>>()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn objectives_are_plain_text() {
        let readme = "**A Python slugify application that handles unicode**. This module, by default installs and uses [text-unidecode](https://github.com/kmike/text-unidecode) _(GPL)_ for its decoding needs.";
        let o = objectives(readme);
        assert_eq!(o[0], "A Python slugify application that handles unicode");
        assert_eq!(
            o[1],
            "This module, by default installs and uses text-unidecode _(GPL)_ for its decoding needs."
        );
        assert_eq!(plain_text("[a] b [c](d"), "[a] b [c](d");
    }

    #[test]
    fn reads_what_the_brief_asks_for() {
        let b = "Build `wordstats.py`:\n- counts words in a text ignoring case\n- prints the top N words\nTests go in test_wordstats.py.\nOut of scope: stemming, other languages.";
        assert_eq!(deliverables(b), vec!["wordstats.py", "test_wordstats.py"]);
        assert_eq!(deliverables("make a tool"), vec!["app.py", "test_app.py"]);
        assert_eq!(
            deliverables("write calc.py please"),
            vec!["calc.py", "test_calc.py"]
        );
        assert_eq!(
            deliverables("fix ../../etc/x.py"),
            vec!["app.py", "test_app.py"]
        );
        assert_eq!(
            objectives(b),
            vec![
                "counts words in a text ignoring case",
                "prints the top N words"
            ]
        );
        assert_eq!(out_of_scope(b), vec!["stemming", "other languages"]);
        assert!(vagueness("Make it better.").is_some());
        assert!(vagueness("We want an app that is good and fast and nice and cool, ok").is_none());
        assert!(vagueness(b).is_none());
        // A README's badges, code and tables are not requirements.
        let readme = "# Slugify\n\n[![status-image]][status-link]\n\nCreates slugs from unicode strings for web addresses.\n\n```python\ndef slugify(text, separator='-'):\n```\n\n    pip install it now please ok\n| a | b | c | d | e |\n";
        assert_eq!(
            objectives(readme),
            vec!["Creates slugs from unicode strings for web addresses"]
        );
    }
}
