//! The prompts, short enough for a 135M model: the system message is the same for every
//! call (so its prefill is cached once), each task says what to produce and shows only what
//! it needs; the JSON shape is appended by the structured call.

use crate::repo::Module;
use crate::state::{Chunk, TicketPrState};
use crate::ticket::TicketType;

/// The system message of every call.
pub fn system(repo_name: &str) -> String {
    format!(
        "You are a careful software engineer on the {repo_name} repository. You make the smallest change that does what the ticket asks, in the style of the existing code, and you answer with JSON only."
    )
}

fn ticket_lines(s: &TicketPrState) -> String {
    let t = &s.ticket;
    let kind = match t.ticket_type {
        TicketType::Bug => "Bug",
        TicketType::Story => "Story",
    };
    format!(
        "Ticket {}: {}\nType: {kind}\nDescription: {}",
        t.key,
        t.summary,
        t.description.trim()
    )
}

/// Classify the ticket (seed node 2).
pub fn classify(s: &TicketPrState) -> String {
    format!(
        "Classify this ticket. Bug: something that worked is broken. Story: something new is asked for.\n\n{}",
        ticket_lines(s)
    )
}

/// Pick the modules (seed node 3). `named` lists the files whose names the ticket mentions,
/// with their modules.
pub fn identify_modules(
    s: &TicketPrState,
    modules: &[Module],
    named: &[(String, String)],
) -> String {
    let list: String = modules
        .iter()
        .map(|m| format!("- {}: {}\n", m.name, m.description))
        .collect();
    let named: String = if named.is_empty() {
        String::new()
    } else {
        let items: Vec<String> = named.iter().map(|(f, m)| format!("{f} (in {m})")).collect();
        format!("\nThe ticket names: {}.\n", items.join(", "))
    };
    format!(
        "Which modules of the repository must change for this ticket?\n\n{}\n{named}\nModules:\n{list}\nRules:\n1. A bug in the service layer: only the module with the service (and its tests).\n2. A story that adds a field: every module that carries the field (domain, API, end-to-end tests).\n3. Never include a module that does not need to change.",
        ticket_lines(s)
    )
}

/// Files shown whole to the code generator (each after the lines that use names from
/// `ticket`), and excerpts of the rest, within `budget` characters.
pub fn code_context(
    files: &[(String, String)],
    chunks: &[Chunk],
    budget: usize,
    ticket: &str,
) -> String {
    let mut out = String::new();
    for (path, text) in files {
        if out.len() + text.len() > budget && !out.is_empty() {
            break;
        }
        let pointed = crate::edit::pointed_lines(text, ticket);
        if !pointed.is_empty() {
            out.push_str(&format!(
                "// Lines of {path} that use names from the ticket:\n// {}\n",
                pointed.join("\n// ")
            ));
        }
        out.push_str(&format!("// FILE: {path}\n{}\n\n", text.trim_end()));
    }
    for c in chunks {
        if files.iter().any(|(p, _)| *p == c.file_path) {
            continue;
        }
        if out.len() + c.text.len() > budget {
            break;
        }
        out.push_str(&format!(
            "// EXCERPT: {} lines {}-{}\n{}\n\n",
            c.file_path,
            c.start_line,
            c.end_line,
            c.text.trim_end()
        ));
    }
    out
}

/// The ticket's acceptance criteria, one `- ` line each.
fn acceptance_list(s: &TicketPrState) -> String {
    s.ticket
        .acceptance_criteria
        .iter()
        .map(|a| format!("- {a}\n"))
        .collect()
}

/// Retrieved excerpts of files other than `files`, within `budget` characters: context for
/// a block answer, which sees the files it may change whole (see [`code_context`] for the
/// line edits' context).
pub fn excerpts_outside(files: &[(String, String)], chunks: &[Chunk], budget: usize) -> String {
    let mut out = String::new();
    for c in chunks {
        if files.iter().any(|(p, _)| *p == c.file_path) || out.len() + c.text.len() > budget {
            continue;
        }
        let f = fence_for(&c.text);
        out.push_str(&format!(
            "{} lines {}-{}:\n{f}\n{}\n{f}\n",
            c.file_path,
            c.start_line,
            c.end_line,
            c.text.trim_end()
        ));
    }
    out
}

fn feedback_lines(s: &TicketPrState) -> String {
    if s.feedback.is_empty() {
        return String::new();
    }
    let previous: String = s
        .all_changes()
        .iter()
        .map(|c| format!("- {}: {}\n", c.file_path, c.description))
        .collect();
    let asks: String = s.feedback.iter().map(|f| format!("- {f}\n")).collect();
    format!(
        "\nYour previous proposal:\n{previous}\nThe reviewer's feedback (do what it says):\n{asks}"
    )
}

/// How to write an edit. No worked example: a small model copies an example's code into
/// the file.
const EDITS: &str = "To change a file, pick the line to change as `find` (copied exactly from the file) and write that line as it should be as `replace` (one or more lines). Lines the ticket points at are listed before each file.";

/// Generate the changes (seed node 5): a bug names its root cause, a story carries its
/// acceptance criteria; both see the reviewer's feedback on a revision.
pub fn generate_changes(s: &TicketPrState, context: &str) -> String {
    let modules = s.affected_modules.join(", ");
    match s.ticket.ticket_type {
        TicketType::Bug => format!(
            "Fix this bug.\n\n{}\n\nRELEVANT CODE:\n{context}{}\nInstructions:\n1. Find the exact root cause.\n2. Write the minimal fix; do not refactor unrelated code.\n3. Change only files in the modules {modules}.\n{EDITS}",
            ticket_lines(s),
            feedback_lines(s)
        ),
        TicketType::Story => {
            let ac = acceptance_list(s);
            format!(
                "Implement this story.\n\n{}\nACCEPTANCE CRITERIA:\n{ac}\nRELEVANT CODE:\n{context}{}\nInstructions:\n1. Meet every acceptance criterion.\n2. Follow the existing code's patterns.\n3. Keep it backward compatible.\n4. Change only files in the modules {modules}.\n{EDITS}",
                ticket_lines(s),
                feedback_lines(s)
            )
        }
    }
}

/// Generate the tests (seed node 6), seeing the changes and an existing test file.
pub fn generate_tests(s: &TicketPrState, existing_test: Option<(&str, &str)>) -> String {
    let changes: String = s
        .proposed_changes
        .iter()
        .map(|c| format!("- {}: {}\n", c.file_path, c.description))
        .collect();
    let changed_code: String = s
        .proposed_changes
        .iter()
        .take(1)
        .map(|c| format!("// FILE: {}\n{}\n", c.file_path, c.new_content.trim_end()))
        .collect();
    let test = match existing_test {
        Some((path, text)) => format!("// FILE: {path}\n{}\n", text.trim_end()),
        None => "No test file found.\n".into(),
    };
    format!(
        "Write tests for these changes.\n\n{}\n\nCHANGES MADE:\n{changes}\n{changed_code}\nEXISTING TEST CODE:\n{test}\nAdd a test of the change in the same framework and style, keeping the existing tests. To add a test to the existing file, find its last line `}}` and replace it with the new test followed by `}}`. A new test file is written whole.",
        ticket_lines(s)
    )
}

/// The system message of the calls that answer with search/replace blocks (code models).
pub fn system_blocks(repo_name: &str) -> String {
    format!(
        "You are a careful software engineer on the {repo_name} repository. You make the smallest change that does what the ticket asks, in the style of the existing code. You change files with SEARCH/REPLACE blocks."
    )
}

/// How to write the answer, after the worked example of [`block_example`]: a small model
/// copies a format described with placeholders literally ("the existing lines, copied
/// exactly"), so the format is shown by example and only summarised here. `path` is a file
/// the model may change.
pub fn block_format(path: &str) -> String {
    let mut text = format!(
        "Answer as in the example: one or two sentences first, then one SEARCH/REPLACE block per place that changes: the file's path ({path}) on its own line, `<<<<<<< SEARCH`, the file's lines copied exactly with their indentation (enough to be unique), `=======`, the new lines, `>>>>>>> REPLACE`. To add lines at the end of a file or to write a new file, leave the SEARCH part empty."
    );
    if path.ends_with(".py") {
        text.push_str(
            " Instead of a block you may give a changed or new function whole, in a ```python code block with the file's path on the line before it.",
        );
    }
    text
}

/// What a worked example is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExampleKind {
    /// A change that fixes a ticket.
    Change,
    /// A test of a change.
    Test,
}

/// A worked example (the task, and an answer in the block format) shown before the real
/// task as an earlier exchange, in Python or, for other files, Java.
pub fn block_example(kind: ExampleKind, path: &str) -> (String, String) {
    let python = path.ends_with(".py");
    let ticket = "TICKET EX-1: average() fails on an empty list\nType: Bug\n`average([])` raises ZeroDivisionError. It should return 0.0 for an empty list.";
    let (file, text, before, after) = if python {
        (
            "stats/mean.py",
            "def average(values):\n    total = sum(values)\n    return total / len(values)",
            "    total = sum(values)\n    return total / len(values)",
            "    if not values:\n        return 0.0\n    total = sum(values)\n    return total / len(values)",
        )
    } else {
        (
            "stats/src/main/java/stats/Mean.java",
            "package stats;\n\nimport java.util.List;\n\npublic final class Mean {\n    public static double average(List<Double> values) {\n        double total = values.stream().mapToDouble(Double::doubleValue).sum();\n        return total / values.size();\n    }\n}",
            "        double total = values.stream().mapToDouble(Double::doubleValue).sum();\n        return total / values.size();",
            "        if (values.isEmpty()) {\n            return 0.0;\n        }\n        double total = values.stream().mapToDouble(Double::doubleValue).sum();\n        return total / values.size();",
        )
    };
    match kind {
        ExampleKind::Change => (
            format!(
                "Fix this bug. First say in one or two sentences what the root cause is, then give the blocks.\n\n{ticket}\n\nFILES YOU MAY CHANGE:\n{file}\n```\n{text}\n```"
            ),
            format!(
                "The root cause: `average` divides by the number of values, which is 0 for an empty list.\n\n{file}\n<<<<<<< SEARCH\n{before}\n=======\n{after}\n>>>>>>> REPLACE"
            ),
        ),
        ExampleKind::Test => {
            let (test_path, test) = if python {
                (
                    "tests/test_mean.py",
                    "from stats.mean import average\n\n\ndef test_the_average_of_no_values_is_zero():\n    assert average([]) == 0.0\n\n\ndef test_average():\n    assert average([1, 2, 3]) == 2.0".to_string(),
                )
            } else {
                (
                    "stats/src/test/java/stats/MeanTest.java",
                    "package stats;\n\nimport static org.junit.jupiter.api.Assertions.assertEquals;\n\nimport java.util.List;\nimport org.junit.jupiter.api.Test;\n\nclass MeanTest {\n    @Test\n    void theAverageOfNoValuesIsZero() {\n        assertEquals(0.0, Mean.average(List.of()));\n    }\n}".to_string(),
                )
            };
            (
                format!(
                    "Write a test that fails before this change and passes after it.\n\n{ticket}\n\nTHE CHANGE:\n```diff\n--- a/{file}\n+++ b/{file}\n{}\n```\n\nWrite a new test file {test_path}.",
                    after
                        .lines()
                        .map(|l| if before.contains(l) { format!(" {l}") } else { format!("+{l}") })
                        .collect::<Vec<_>>()
                        .join("\n")
                ),
                if python {
                    format!(
                        "The test checks that the average of no values is 0.0.\n\n{test_path}\n```python\n{test}\n```"
                    )
                } else {
                    format!(
                        "The test checks that the average of no values is 0.0.\n\n{test_path}\n<<<<<<< SEARCH\n=======\n{test}\n>>>>>>> REPLACE"
                    )
                },
            )
        }
    }
}

/// A code fence for `text`: three backticks, or one more than the longest run of backticks
/// starting a line of it (a docstring's own ```pycon example would close a shorter fence).
pub fn fence_for(text: &str) -> String {
    let longest = text
        .lines()
        .map(|l| l.trim_start().chars().take_while(|c| *c == '`').count())
        .max()
        .unwrap_or(0);
    "`".repeat(longest.max(2) + 1)
}

fn shown_files(files: &[(String, String)]) -> String {
    files
        .iter()
        .map(|(p, t)| {
            let f = fence_for(t);
            format!("{p}\n{f}\n{}\n{f}\n", t.trim_end())
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The changes as search/replace blocks (seed node 5 for code models): the ticket, the
/// files to change shown whole, excerpts of the rest, the reviewer's feedback on a revision.
pub fn change_blocks(s: &TicketPrState, files: &[(String, String)], excerpts: &str) -> String {
    let goal = match s.ticket.ticket_type {
        TicketType::Bug => "Fix this bug. First say in one or two sentences what the root cause is (name the function and what goes wrong), then give the blocks.",
        TicketType::Story => "Implement this story. First say in one or two sentences what you change, then give the blocks.",
    };
    let ac = acceptance_list(s);
    let ac = if ac.is_empty() {
        String::new()
    } else {
        format!("\nACCEPTANCE CRITERIA:\n{ac}")
    };
    let excerpts = if excerpts.trim().is_empty() {
        String::new()
    } else {
        format!("\nOTHER CODE (for reference, do not change):\n{excerpts}")
    };
    let example = files
        .first()
        .map_or("path/to/file.ext", |(p, _)| p.as_str());
    format!(
        "{goal}\n\n{}\n{ac}\nFILES YOU MAY CHANGE:\n{}{excerpts}{}\n{}",
        ticket_lines(s),
        shown_files(files),
        feedback_lines(s),
        block_format(example)
    )
}

/// Tests of the change as search/replace blocks: the ticket, the change's diff, and the
/// test file to extend (or the path of a new one).
pub fn test_blocks(s: &TicketPrState, diff: &str, test_file: &(String, Option<String>)) -> String {
    let (path, text) = test_file;
    let head = format!(
        "Write a test that fails before this change and passes after it: it must exercise what the ticket describes.\n\n{}\n\nTHE CHANGE:\n```diff\n{}\n```\n\n",
        ticket_lines(s),
        diff.trim_end()
    );
    if !path.ends_with(".py") {
        let target = match text {
            Some(t) => format!(
                "Add the test to the existing test file {path}, in its framework and style (keep its tests):\n{}",
                shown_files(&[(path.clone(), t.clone())])
            ),
            None => format!(
                "Write a new test file {path} (leave the SEARCH part empty): import what the test uses, and write tests that the project's test runner finds."
            ),
        };
        return format!("{head}{target}\n{}", block_format(path));
    }
    // Python: the test as code in a fence (what a small model writes reliably), added at the
    // end of an existing file or written as a new one.
    let modules: Vec<String> = s
        .proposed_changes
        .iter()
        .filter_map(|c| python_module(&c.file_path))
        .map(|m| format!("`{m}`"))
        .collect();
    let import = if modules.is_empty() {
        String::new()
    } else {
        format!(
            " Import what you test from {} (the changed code).",
            modules.join(", ")
        )
    };
    let (what, existing) = match text {
        Some(t) => (
            format!("Add tests to the existing test file {path}"),
            format!("\n{}", shown_files(&[(path.clone(), t.clone())])),
        ),
        None => (format!("Write the new test file {path}"), String::new()),
    };
    format!(
        "{head}{what}: one or two test functions (`def test_...():` at module level, no arguments, no class), each with at most three `assert` lines, using the ticket's own examples.{import}{existing}\nAnswer with one sentence on what the test checks, then the path {path} on its own line and the test code in a ```python code block{}.",
        if text.is_some() {
            " (its functions are added at the end of the file)"
        } else {
            ""
        }
    )
}

/// The module a Python file is imported as (`src/humanize/filesize.py` → `humanize.filesize`;
/// a package's `__init__.py` → the package).
pub fn python_module(path: &str) -> Option<String> {
    let p = path.strip_suffix(".py")?;
    let p = p.strip_prefix("src/").unwrap_or(p);
    let p = p.strip_suffix("/__init__").unwrap_or(p);
    if p.is_empty()
        || p.split('/')
            .any(|c| c.is_empty() || c.contains('.') || c.contains('-'))
    {
        return None;
    }
    Some(p.replace('/', "."))
}

/// What was wrong with the last answer, for the model to correct.
pub fn correction(problems: &[String]) -> String {
    let list: String = problems.iter().map(|p| format!("- {p}\n")).collect();
    format!(
        "Your blocks could not be used:\n{list}\nAnswer again with corrected SEARCH/REPLACE blocks (all of them, not only the wrong ones)."
    )
}

/// The tests' run, for the model to correct its change or its tests: the ticket, the files
/// as they are now (the change applied), what was run and what went wrong.
pub fn test_correction(
    s: &TicketPrState,
    files: &[(String, String)],
    command: &str,
    problem: &str,
) -> String {
    let example = files
        .first()
        .map_or("path/to/file.ext", |(p, _)| p.as_str());
    format!(
        "Your change and its tests were run in a copy of the repository with `{command}`.\n\n{}\n\nTHE FILES AS THEY ARE NOW (your change applied):\n{}\nWHAT WENT WRONG:\n```\n{}\n```\n\nFirst say in one sentence whether the change or the test is wrong, and why. Then fix it with SEARCH/REPLACE blocks against the files as they are now. The tests are run with plain Python: module-level `def test_...():` functions with `assert`, or unittest; no pytest fixtures.\n{}",
        ticket_lines(s),
        shown_files(files),
        problem.trim_end(),
        block_format(example)
    )
}
