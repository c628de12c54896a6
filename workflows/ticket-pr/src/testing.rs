//! A scripted model and a cheap embedder for the workflow's tests and its crash-test worker
//! (behind the `testing` feature). The script plays a competent engineer on the fixture: it
//! fixes TASK-101's null check, adds a priority for TASK-102 and adds a test, reading the
//! files from the prompt and the allowed paths from the schema. It proves the graph's routes,
//! never that a model is useful; the end-to-end test runs SmolLM2.

use crate::{TicketPrSettings, NAME};
use ferrograph::chat::{ChatModel, LlmError};
use ferrograph::core::message::Message;
use ferrograph_chat::testing::{ScriptCall, ScriptedModel};
use ferrograph_index::embed::EmbedderFactory;
use ferrograph_index::{Embedder, HashEmbedder};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;

/// How the scripted model behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Answers well.
    Good,
    /// Every call fails with a non-retryable error.
    Fails,
    /// Proposes a change to a path outside the repository (as a model that ignores its
    /// schema would).
    PathOutside,
}

/// The file blocks (`// FILE: path` then its text) of a prompt.
fn file_blocks(prompt: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let parts: Vec<&str> = prompt.split("// FILE: ").collect();
    for p in parts.iter().skip(1) {
        let (path, rest) = p.split_once('\n').unwrap_or((p, ""));
        let end = [
            "\n// FILE: ",
            "\n// EXCERPT: ",
            "\n\nEXISTING TEST CODE:",
            "\nYour previous proposal:",
            "\nThe reviewer",
            "\nInstructions:",
            "\nWrite the complete test file",
        ]
        .iter()
        .filter_map(|m| rest.find(m))
        .min()
        .unwrap_or(rest.len());
        out.push((
            path.trim().to_string(),
            format!("{}\n", rest[..end].trim_end()),
        ));
    }
    out
}

/// The paths a list of proposed files may name (one alternative per path, or one).
fn paths_of(schema: &Value, field: &str) -> Vec<String> {
    let items = schema.pointer(&format!("/properties/{field}/items"));
    let alts: Vec<&Value> = match items.and_then(|i| i.get("anyOf")).and_then(Value::as_array) {
        Some(a) => a.iter().collect(),
        None => items.into_iter().collect(),
    };
    alts.iter()
        .filter_map(|a| {
            a.pointer("/properties/file_path/enum/0")
                .and_then(Value::as_str)
        })
        .map(str::to_string)
        .collect()
}

fn answer(call: &ScriptCall<'_>, behaviour: Behaviour) -> Result<Message, LlmError> {
    if behaviour == Behaviour::Fails {
        return Err(LlmError::Schema {
            message: "scripted failure".into(),
            output: "not json".into(),
        });
    }
    let (title, schema) = call.json_schema();
    let prompt = call.last_prompt();
    if title.is_empty() && prompt.contains("SEARCH/REPLACE") {
        return Ok(Message::ai(block_answer(&prompt, behaviour)));
    }
    let story = prompt.contains("Type: Story");
    let revisions = prompt.matches("\n- ").count();
    let feedback = prompt.contains("The reviewer's feedback");
    let v = match title {
        "Classification" => json!({
            "confirmed_type": if story { "Story" } else { "Bug" },
            "technical_summary": if story { "Tasks get a priority field" } else { "findOverdue dereferences a missing due date" },
            "affected_components": [if story { "Task" } else { "TaskService" }],
            "complexity": "low",
        }),
        "ModuleChoice" => {
            let names: Vec<Value> = schema
                .pointer("/properties/affected_modules/items/enum")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let chosen: Vec<Value> = if story {
                names
            } else {
                names
                    .into_iter()
                    .filter(|n| n.as_str().is_some_and(|s| s.ends_with("core")))
                    .collect()
            };
            json!({"affected_modules": chosen, "reasoning": "where the code lives", "files_likely_to_change": []})
        }
        "CodeChanges" => {
            let paths = paths_of(&schema, "changes");
            let blocks = file_blocks(&prompt);
            // The file that needs the change, as a competent engineer would pick it.
            let needle = if story {
                "private LocalDate dueDate;"
            } else {
                ".filter(task -> task.getDueDate().isBefore(today))"
            };
            let wanted = |p: &String| blocks.iter().any(|(b, t)| b == p && t.contains(needle));
            let path = if behaviour == Behaviour::PathOutside {
                "../outside/Evil.java".to_string()
            } else {
                paths
                    .iter()
                    .find(|p| wanted(p))
                    .or(paths.first())
                    .cloned()
                    .unwrap_or_default()
            };
            let replace = if story {
                "private LocalDate dueDate;\nprivate String priority = \"MEDIUM\";"
            } else {
                ".filter(task -> task.getDueDate() != null && task.getDueDate().isBefore(today))"
            };
            let mut edits = vec![json!({"find": needle, "replace": replace})];
            if feedback {
                let package = blocks
                    .iter()
                    .find(|(b, _)| *b == path)
                    .and_then(|(_, t)| t.lines().next())
                    .unwrap_or("")
                    .to_string();
                edits.push(json!({"find": package, "replace": format!("{package}\n// revised after feedback ({revisions})")}));
            }
            json!({
                "changes": [{"file_path": path, "edits": edits, "description": "skip tasks without a due date"}],
                "root_cause": "findOverdue calls isBefore on a null due date",
            })
        }
        "TestChanges" => {
            let paths = paths_of(&schema, "tests");
            let path = paths.first().cloned().unwrap_or_default();
            let test = "    @Test\n    void tasksWithoutDueDateAreNotOverdue() {\n        service.create(4, \"someday\", null);\n        assertThat(service.findOverdue(LocalDate.of(2024, 5, 10))).isEmpty();\n    }\n}";
            let exists = file_blocks(&prompt).iter().any(|(b, _)| *b == path);
            let file = if exists {
                json!({"file_path": path, "edits": [{"find": "}", "replace": test}], "description": "a task without a due date is not overdue"})
            } else {
                json!({"file_path": path, "new_content": format!("class GeneratedTest {{\n{test}\n"), "description": "a task without a due date is not overdue"})
            };
            json!({"tests": [file]})
        }
        other => {
            return Err(LlmError::Schema {
                message: format!("the script has no answer for `{other}`"),
                output: String::new(),
            })
        }
    };
    Ok(Message::ai(v.to_string()))
}

/// The files shown to a block answer (`path`, a fence, the text, a fence).
fn fenced_files(prompt: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = prompt.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 1 < lines.len() {
        if lines[i + 1] == "```" && lines[i].contains('.') && !lines[i].contains(' ') {
            let end = (i + 2..lines.len())
                .find(|&j| lines[j] == "```")
                .unwrap_or(lines.len());
            out.push((lines[i].to_string(), lines[i + 2..end].join("\n")));
            i = end;
        }
        i += 1;
    }
    out
}

/// A search/replace answer: the same fix and test as the JSON answers, as blocks.
fn block_answer(prompt: &str, behaviour: Behaviour) -> String {
    let files = fenced_files(prompt);
    let story = prompt.contains("Type: Story");
    if prompt.starts_with("Write a test") {
        let test = "    @Test\n    void tasksWithoutDueDateAreNotOverdue() {\n        service.create(4, \"someday\", null);\n        assertThat(service.findOverdue(LocalDate.of(2024, 5, 10))).isEmpty();\n    }";
        return match files.first() {
            Some((path, text)) => {
                let last = text.lines().rev().find(|l| l.trim() == "}").unwrap_or("}");
                format!("A task without a due date is not overdue.\n\n{path}\n<<<<<<< SEARCH\n{last}\n=======\n{test}\n{last}\n>>>>>>> REPLACE\n")
            }
            None => {
                let path = prompt
                    .split("Write a new test file ")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .unwrap_or("GeneratedTest.java");
                format!("{path}\n<<<<<<< SEARCH\n=======\nclass GeneratedTest {{\n{test}\n}}\n>>>>>>> REPLACE\n")
            }
        };
    }
    let (needle, replace) = if story {
        (
            "    private LocalDate dueDate;",
            "    private LocalDate dueDate;\n    private String priority = \"MEDIUM\";",
        )
    } else {
        (
            "                .filter(task -> task.getDueDate().isBefore(today))",
            "                .filter(task -> task.getDueDate() != null && task.getDueDate().isBefore(today))",
        )
    };
    let path = if behaviour == Behaviour::PathOutside {
        "../outside/Evil.java".to_string()
    } else {
        files
            .iter()
            .find(|(_, t)| t.contains(needle.trim()))
            .or(files.first())
            .map(|(p, _)| p.clone())
            .unwrap_or_default()
    };
    // The file's own indentation of the line (the block may quote it loosely).
    let mut out = format!("skip tasks without a due date. The root cause: findOverdue calls isBefore on a null due date.\n\n{path}\n<<<<<<< SEARCH\n{needle}\n=======\n{replace}\n>>>>>>> REPLACE\n");
    if prompt.contains("The reviewer's feedback") {
        let revisions = prompt.matches("\n- ").count();
        if let Some(first) = files
            .iter()
            .find(|(p, _)| *p == path)
            .and_then(|(_, t)| t.lines().next())
        {
            out.push_str(&format!("\n{path}\n<<<<<<< SEARCH\n{first}\n=======\n{first}\n// revised after feedback ({revisions})\n>>>>>>> REPLACE\n"));
        }
    }
    out
}

/// The scripted model.
pub fn scripted_model(behaviour: Behaviour) -> ScriptedModel {
    ScriptedModel::new("scripted-engineer", move |call| answer(&call, behaviour))
}

/// A hashing embedder (no model files).
pub fn hash_embedder() -> EmbedderFactory {
    Arc::new(|| Ok(Arc::new(HashEmbedder::new(64)) as Arc<dyn Embedder>))
}

/// Settings with `model` (as primary and its own fallback) and the hashing embedder.
pub fn settings(data_dir: &Path, model: Arc<dyn ChatModel>) -> TicketPrSettings {
    TicketPrSettings {
        data_dir: data_dir.join(NAME),
        llm: Some(crate::code_llm(model, None)),
        make_embedder: hash_embedder(),
        crash_at: std::env::var(crate::CRASH_ENV)
            .ok()
            .filter(|v| !v.is_empty()),
        test_limits: Some(Default::default()),
    }
}
