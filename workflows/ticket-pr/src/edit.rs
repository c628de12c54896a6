//! Line edits: how the model changes an existing file. Rewriting a whole file is beyond a
//! 135M model (it writes the file's name, or loops); picking a line of the file, constrained
//! to the file's own lines, and writing its replacement is not. The whole new content is
//! then composed here, so the rest of the workflow (diff, commits) sees whole files.

use crate::state::{LineEdit, ProposedFile};
use serde_json::{json, Value};

/// Longest line offered as an edit target.
const MAX_LINE: usize = 200;
/// Most lines offered per file.
const MAX_LINES: usize = 300;

/// Identifiers of `text` (letters, digits, `_`, at least 3 characters, with a capital or
/// lower-case start), for matching a ticket's words to code.
pub fn identifiers(text: &str) -> std::collections::HashSet<String> {
    text.split(|c: char| !c.is_alphanumeric() && c != '_')
        .filter(|w| w.len() >= 3 && w.chars().next().is_some_and(char::is_alphabetic))
        .map(str::to_string)
        .collect()
}

/// The lines of `text` that use an identifier of `ticket` that is not an English word
/// (camelCase or with a digit or `_`: `getDueDate`, `isBefore`), trimmed: where the ticket
/// points.
pub fn pointed_lines(text: &str, ticket: &str) -> Vec<String> {
    let names: Vec<String> = identifiers(ticket)
        .into_iter()
        .filter(|w| {
            w.chars().skip(1).any(char::is_uppercase)
                || w.chars().any(|c| c.is_ascii_digit() || c == '_')
        })
        .collect();
    edit_targets(text)
        .into_iter()
        .filter(|l| {
            let ids = identifiers(l);
            names.iter().any(|n| ids.contains(n))
        })
        .collect()
}

pub use ferrograph::chat::agent::degenerate;

/// The lines of `text` a model may pick: trimmed, not empty, each once, in file order.
pub fn edit_targets(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for l in text.lines() {
        let t = l.trim();
        if t.is_empty() || t.len() > MAX_LINE || out.iter().any(|o| o == t) {
            continue;
        }
        out.push(t.to_string());
        if out.len() == MAX_LINES {
            break;
        }
    }
    out
}

fn is_closing(t: &str) -> bool {
    !t.is_empty() && t.chars().all(|c| matches!(c, '}' | ')' | ']' | ';'))
}

/// `old` with `edits` applied (a second edit of the same line is ignored). Each edit replaces
/// the first line whose trimmed text is
/// `find` (a line of only closing brackets: the last such line, the end of the enclosing
/// block, where additions go). A replacement line without indentation takes the replaced
/// line's. An edit whose replacement equals its line changes nothing.
pub fn apply_edits(old: &str, edits: &[LineEdit]) -> Result<String, String> {
    let mut lines: Vec<String> = old.lines().map(str::to_string).collect();
    let mut done: Vec<&str> = Vec::new();
    for e in edits {
        let find = e.find.trim();
        if find.is_empty() {
            return Err("an edit names an empty line".into());
        }
        // A line already edited is not edited again (a small model repeats its edit).
        if done.contains(&find) {
            continue;
        }
        done.push(find);
        if e.replace.trim_end() == find || e.replace.trim() == find && !e.replace.contains('\n') {
            continue;
        }
        let pos = if is_closing(find) {
            lines.iter().rposition(|l| l.trim() == find)
        } else {
            lines.iter().position(|l| l.trim() == find)
        };
        let Some(i) = pos else {
            return Err(format!("the line `{find}` is not in the file"));
        };
        let indent: String = lines[i].chars().take_while(|c| c.is_whitespace()).collect();
        let replacement: Vec<String> = if e.replace.trim().is_empty() {
            Vec::new()
        } else {
            e.replace
                .trim_end()
                .lines()
                .map(|l| {
                    if l.starts_with(char::is_whitespace) || l.is_empty() {
                        l.to_string()
                    } else {
                        format!("{indent}{l}")
                    }
                })
                .collect()
        };
        lines.splice(i..=i, replacement);
    }
    let mut text = lines.join("\n");
    if old.ends_with('\n') || old.is_empty() {
        text.push('\n');
    }
    Ok(text)
}

/// The new content of `p`: its edits applied to `old`, or its whole new content.
pub fn compose(p: &ProposedFile, old: Option<&str>) -> Result<String, String> {
    match (old, &p.new_content) {
        (Some(old), _) if !p.edits.is_empty() => apply_edits(old, &p.edits),
        (_, Some(content)) => {
            let mut c = content.clone();
            if !c.ends_with('\n') {
                c.push('\n');
            }
            Ok(c)
        }
        (Some(_), None) => Err("no edits".into()),
        (None, None) => Err("a new file needs its content".into()),
    }
}

/// The schema of one proposed file: `edits` of `path`'s own lines when it exists (`lines`),
/// else its whole `new_content` (at most `max_len` characters).
pub fn file_schema(path: &str, lines: Option<&[String]>, max_len: usize) -> Value {
    let body = match lines {
        Some(lines) => json!({
            "edits": {
                "type": "array", "minItems": 1, "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "find": {"type": "string", "enum": lines, "description": "a line of the file, copied exactly"},
                        "replace": {"type": "string", "maxLength": 600, "description": "the new line or lines"},
                    },
                    "required": ["find", "replace"],
                    "additionalProperties": false,
                },
            }
        }),
        None => json!({
            "new_content": {"type": "string", "maxLength": max_len, "description": "the whole new file"}
        }),
    };
    let mut props = serde_json::Map::new();
    props.insert(
        "file_path".into(),
        json!({"type": "string", "enum": [path]}),
    );
    if let Value::Object(b) = body {
        props.extend(b);
    }
    props.insert(
        "description".into(),
        json!({"type": "string", "maxLength": 160, "description": "what changed and why"}),
    );
    let required: Vec<&String> = props.keys().collect();
    json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn edit(find: &str, replace: &str) -> LineEdit {
        LineEdit {
            find: find.into(),
            replace: replace.into(),
        }
    }

    #[test]
    fn edits_keep_indentation_and_add_before_the_last_closing_brace() {
        let old = "class A {\n    int x = a / b;\n    void f() {\n    }\n}\n";
        let new = apply_edits(
            old,
            &[
                edit("int x = a / b;", "int x = b == 0 ? 0 : a / b;"),
                edit("}", "    void g() {}\n}"),
            ],
        )
        .unwrap();
        assert_eq!(
            new,
            "class A {\n    int x = b == 0 ? 0 : a / b;\n    void f() {\n    }\n    void g() {}\n}\n"
        );
        assert_eq!(
            apply_edits(old, &[edit("int x = a / b;", "int x = a / b;")]).unwrap(),
            old
        );
        assert!(apply_edits(old, &[edit("nope", "x")])
            .unwrap_err()
            .contains("not in the file"));
        let twice = apply_edits(
            old,
            &[
                edit("int x = a / b;", "int x = 1;"),
                edit("int x = a / b;", "int x = 2;"),
            ],
        )
        .unwrap();
        assert!(
            twice.contains("int x = 1;") && !twice.contains("int x = 2;"),
            "{twice}"
        );
        let removed = apply_edits(old, &[edit("int x = a / b;", "")]).unwrap();
        assert!(!removed.contains("int x"));
    }

    #[test]
    fn the_ticket_points_at_lines_and_loops_are_seen() {
        let code = "int a = 1;\nif (task.getDueDate().isBefore(today)) {}\nreturn a;\n";
        let ticket = "It calls getDueDate().isBefore(today) on every task.";
        assert_eq!(
            pointed_lines(code, ticket),
            ["if (task.getDueDate().isBefore(today)) {}"]
        );
        assert!(degenerate(
            "The task is not a task. The task is a task. The task is not a task."
        ));
        assert!(degenerate("a b c d x a b c d y a b c d"));
        assert!(!degenerate(
            "Skip tasks without a due date. They are never overdue."
        ));
    }

    #[test]
    fn targets_are_unique_trimmed_lines() {
        assert_eq!(edit_targets("a {\n  b;\n\n  b;\n}\n"), ["a {", "b;", "}"]);
    }

    #[test]
    fn schemas_offer_edits_of_existing_files_and_content_for_new_ones() {
        let s = file_schema("a/B.java", Some(&["x;".to_string()]), 100);
        assert_eq!(
            s["properties"]["edits"]["items"]["properties"]["find"]["enum"],
            json!(["x;"])
        );
        let keys: Vec<&String> = s["properties"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["file_path", "edits", "description"]);
        let s = file_schema("a/BTest.java", None, 100);
        assert_eq!(s["properties"]["new_content"]["maxLength"], 100);
    }
}
