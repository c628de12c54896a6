//! Changes and tests written as search/replace blocks (see [`crate::blocks`]): what a code
//! model of 0.5B and up writes well. Each answer is matched against the files and every
//! changed file is parse-checked; what fails goes back to the model for up to
//! [`MAX_CORRECTIONS`] corrections. The line edits of [`super::generation`] stay as the net
//! under it (and the way a 135M model edits).

use super::*;
use crate::blocks::{self, ParseCheck};
use ferrograph::chat::agent::LlmCall;

/// Most corrections of a block answer (blocks that match nowhere, files that do not parse)
/// before the step gives up on blocks.
pub(crate) const MAX_CORRECTIONS: usize = 2;

/// Tokens a change's block answer may take.
pub(crate) const MAX_BLOCK_TOKENS: usize = 1000;

/// Tokens a test's block answer may take: a test that shows a fix is short, and a longer
/// answer is a small model listing asserts until it is cut off.
pub(crate) const MAX_TEST_TOKENS: usize = 600;

/// Characters of the files shown whole to a block answer (about 3,500 tokens of code), so that
/// the task, an answer and a correction fit an 8,192-token context.
pub(crate) const SHOWN_CHARS: usize = 12000;

/// What a block answer is shown of `files`: each whole while they fit [`SHOWN_CHARS`], else
/// the retrieved regions of it (the blocks are still matched against the whole file).
pub(crate) fn shown_files(files: &[(String, String)], chunks: &[Chunk]) -> Vec<(String, String)> {
    let mut used = 0;
    let mut out = Vec::new();
    for (path, text) in files {
        if used + text.len() <= SHOWN_CHARS {
            used += text.len();
            out.push((path.clone(), text.clone()));
            continue;
        }
        let mut part = String::new();
        for c in chunks.iter().filter(|c| c.file_path == *path) {
            if used + part.len() + c.text.len() > SHOWN_CHARS {
                break;
            }
            part.push_str(&format!(
                "# ... lines {}-{}:\n{}\n",
                c.start_line,
                c.end_line,
                c.text.trim_end()
            ));
        }
        if part.is_empty() {
            let room = SHOWN_CHARS.saturating_sub(used).min(text.len());
            let cut = (0..=room)
                .rev()
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(0);
            part = text[..cut].to_string();
        }
        used += part.len();
        out.push((path.clone(), part));
    }
    out
}

/// What a block answer produced.
#[derive(Debug)]
pub(crate) struct BlockAnswer {
    /// New content per file, in the order the blocks named them.
    pub files: Vec<(String, String)>,
    /// The model's words before its first block (its root cause or summary).
    pub explanation: String,
    /// Answers that had to be corrected.
    pub corrections: u32,
    /// How each file was checked (`path: python3 -m py_compile`).
    pub checks: Vec<String>,
    /// How the model wrote it: `search/replace blocks` or `whole functions`.
    pub form: &'static str,
}

impl BlockAnswer {
    /// The gate's progress line for these changes: `head` (the files), then how many
    /// corrections they took and how each file was checked.
    pub(crate) fn progress_line(&self, head: &str) -> String {
        let corrections = match self.corrections {
            0 => String::new(),
            n => format!(" after {n} correction(s)"),
        };
        format!(
            "{head} by {}{corrections}; {}",
            self.form,
            self.checks.join("; ")
        )
    }
}

/// Why `what` fell back to the line edits: the last answer's problems.
pub(crate) fn refused_note(what: &str, problems: &[String]) -> String {
    format!(
        "{what} refused after {} answer(s), line edits instead: {}",
        MAX_CORRECTIONS + 1,
        problems.join(" / ")
    )
}

/// Whether `llm` writes search/replace blocks: `FERROGRAPH_TICKET_EDITS=blocks` or `lines`
/// decides; otherwise every model does except the 135M fast tier (SmolLM2-135M), for which
/// the line edits were designed (it cannot quote a file's lines back reliably).
pub(crate) fn blocks_for(llm: &AgentLlm) -> bool {
    match std::env::var("FERROGRAPH_TICKET_EDITS")
        .map(|v| v.trim().to_ascii_lowercase())
        .as_deref()
    {
        Ok("lines") => false,
        Ok("blocks") => true,
        _ => !is_fast_tier(&llm.primary.model_name()),
    }
}

/// Whether a model's name is the 135M fast tier's.
fn is_fast_tier(name: &str) -> bool {
    name.to_ascii_lowercase().contains("135m")
}

/// The words before the first block, without a trailing path line or fence.
fn explanation_of(answer: &str) -> String {
    let head: Vec<&str> = answer
        .lines()
        .take_while(|l| {
            let t = l.trim_start();
            !t.starts_with("<<<<<") && !t.starts_with("```")
        })
        .collect();
    let mut head: Vec<&str> = head.into_iter().map(str::trim_end).collect();
    while let Some(last) = head.last() {
        let t = last.trim();
        if t.is_empty() || t.starts_with("```") || (!t.contains(' ') && t.contains('.')) {
            head.pop();
        } else {
            break;
        }
    }
    head.join("\n").trim().to_string()
}

/// Applies `answer` to `offered` (path, current text) and `new_paths` (files that may be
/// created): its search/replace blocks, or, when it has none, the whole Python functions of
/// its code fences ([`crate::functions`]); then parse-checks each changed file. `Err` lists
/// what the model must fix.
pub(crate) fn use_answer(
    answer: &str,
    offered: &[(String, String)],
    new_paths: &[String],
) -> Result<BlockAnswer, Vec<String>> {
    let by_blocks = use_blocks(answer, offered, new_paths);
    match by_blocks {
        Err(problems) if !answer.contains("<<<<<") => {
            match use_functions(answer, offered, new_paths) {
                Some(Ok(done)) => Ok(done),
                Some(Err(more)) => Err(more),
                None => Err(problems),
            }
        }
        other => other,
    }
}

/// The Python functions of `answer`'s code fences put into the files; `None` when it has no
/// Python fence.
fn use_functions(
    answer: &str,
    offered: &[(String, String)],
    new_paths: &[String],
) -> Option<Result<BlockAnswer, Vec<String>>> {
    use crate::functions;
    let fences: Vec<functions::Fence> = functions::fences(answer)
        .into_iter()
        .filter(|f| functions::is_python(f) && !f.text.trim().is_empty())
        .collect();
    if fences.is_empty() {
        return None;
    }
    let all_paths: Vec<String> = offered
        .iter()
        .map(|(p, _)| p.clone())
        .chain(new_paths.iter().cloned())
        .filter(|p| p.ends_with(".py"))
        .collect();
    let mut texts: Vec<(String, String)> = Vec::new();
    let mut problems = Vec::new();
    for f in &fences {
        let names = functions::defined_names(&f.text);
        let current_of = |p: &str, texts: &[(String, String)]| {
            texts
                .iter()
                .find(|(q, _)| q == p)
                .map(|(_, t)| t.clone())
                .or_else(|| offered.iter().find(|(q, _)| q == p).map(|(_, t)| t.clone()))
        };
        let target = f
            .path
            .as_deref()
            .and_then(|p| blocks::resolve_path(p, &all_paths))
            .or_else(|| {
                offered
                    .iter()
                    .find(|(p, t)| {
                        p.ends_with(".py") && names.iter().any(|n| super::candidates::defines(t, n))
                    })
                    .map(|(p, _)| p.clone())
            })
            .or_else(|| match all_paths.as_slice() {
                [one] => Some(one.clone()),
                _ => None,
            });
        let Some(path) = target else {
            problems.push(format!(
                "a code block does not say which file it is for (write the path on the line before it; you may change: {})",
                all_paths.join(", ")
            ));
            continue;
        };
        // A new file is its first fence (a second one is a small model repeating itself).
        if texts.iter().any(|(q, _)| *q == path) && !offered.iter().any(|(q, _)| *q == path) {
            continue;
        }
        let new_text = match current_of(&path, &texts) {
            Some(text) => match functions::apply_fence(&text, &f.text) {
                Ok(a) => a.text,
                Err(e) => {
                    problems.push(format!("{path}: {e}"));
                    continue;
                }
            },
            None => format!("{}\n", f.text.trim_end()),
        };
        match texts.iter_mut().find(|(q, _)| *q == path) {
            Some(slot) => slot.1 = new_text,
            None => texts.push((path, new_text)),
        }
    }
    let (files, checks) = changed_and_checked(texts, offered, &mut problems);
    if files.is_empty() && problems.is_empty() {
        problems.push("the code blocks change nothing".into());
    }
    if !problems.is_empty() {
        return Some(Err(problems));
    }
    Some(Ok(BlockAnswer {
        files,
        explanation: explanation_of(answer),
        corrections: 0,
        checks,
        form: "whole functions",
    }))
}

/// The files of `texts` that differ from `offered`, each parse-checked: the files, how each
/// was checked, and (into `problems`) those that do not parse.
fn changed_and_checked(
    texts: impl IntoIterator<Item = (String, String)>,
    offered: &[(String, String)],
    problems: &mut Vec<String>,
) -> (Vec<(String, String)>, Vec<String>) {
    let mut files = Vec::new();
    let mut checks = Vec::new();
    for (path, text) in texts {
        if offered.iter().any(|(p, t)| *p == path && *t == text) {
            continue;
        }
        match blocks::parse_check(&path, &text) {
            Ok(ParseCheck::Parses(how)) => checks.push(format!("{path}: parses ({how})")),
            Ok(ParseCheck::NotChecked(why)) => {
                checks.push(format!("{path}: not parse-checked ({why})"))
            }
            Err(e) => problems.push(format!("after your change {path} does not parse:\n{e}")),
        }
        files.push((path, text));
    }
    (files, checks)
}

/// Applies `answer`'s search/replace blocks (see [`use_answer`]).
fn use_blocks(
    answer: &str,
    offered: &[(String, String)],
    new_paths: &[String],
) -> Result<BlockAnswer, Vec<String>> {
    let all_paths: Vec<String> = offered
        .iter()
        .map(|(p, _)| p.clone())
        .chain(new_paths.iter().cloned())
        .collect();
    let default = match all_paths.as_slice() {
        [one] => Some(one.as_str()),
        _ => None,
    };
    let parsed = blocks::parse_blocks(answer, default).map_err(|e| vec![e])?;
    if parsed.is_empty() {
        return Err(vec![
            "the answer has no SEARCH/REPLACE block: write each change as a block".into(),
        ]);
    }
    let mut problems = Vec::new();
    // Current text per file (None: a new file not written yet).
    let mut texts: Vec<(String, Option<String>)> = Vec::new();
    for b in &parsed {
        // A path that is not offered (a small model copies the worked example's) whose
        // SEARCH lines match exactly one offered file: that file. Only offered files can be
        // chosen this way, so the fence holds.
        let by_content = || {
            // A hostile path (`..`, absolute, `.git`) is refused, never redirected.
            if b.search.trim().is_empty() || crate::repo::normalize(&b.path).is_err() {
                return None;
            }
            let hits: Vec<&String> = offered
                .iter()
                .filter(|(_, t)| blocks::apply_block(t, b).is_ok())
                .map(|(p, _)| p)
                .collect();
            match hits.as_slice() {
                [one] => Some((*one).clone()),
                _ => None,
            }
        };
        let Some(path) = blocks::resolve_path(&b.path, &all_paths).or_else(by_content) else {
            problems.push(format!(
                "`{}` is not a file you may change (you may change: {})",
                b.path,
                all_paths.join(", ")
            ));
            continue;
        };
        let slot = match texts.iter().position(|(p, _)| *p == path) {
            Some(i) => i,
            None => {
                let current = offered
                    .iter()
                    .find(|(p, _)| *p == path)
                    .map(|(_, t)| t.clone());
                texts.push((path.clone(), current));
                texts.len() - 1
            }
        };
        let current = texts[slot].1.clone();
        let result = if b.search.trim().is_empty() {
            // An empty SEARCH part: a new file, or lines added at the end of one.
            let base = current.unwrap_or_default();
            let sep = if base.is_empty() || base.ends_with("\n\n") {
                ""
            } else if base.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            };
            Ok(format!("{base}{sep}{}\n", b.replace.trim_end()))
        } else {
            match current {
                Some(text) => blocks::apply_block(&text, b),
                None => Err(format!(
                    "{path} does not exist yet: leave the SEARCH part empty to write it"
                )),
            }
        };
        match result {
            Ok(t) => texts[slot].1 = Some(t),
            Err(e) => problems.push(e),
        }
    }
    let written = texts
        .into_iter()
        .filter_map(|(path, text)| text.map(|t| (path, t)));
    let (files, checks) = changed_and_checked(written, offered, &mut problems);
    if files.is_empty() && problems.is_empty() {
        problems.push(
            "the blocks change nothing: the REPLACE part must differ from the SEARCH part".into(),
        );
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(BlockAnswer {
        files,
        explanation: explanation_of(answer),
        corrections: 0,
        checks,
        form: "search/replace blocks",
    })
}

/// One request for blocks: what it is for, the task, the files it may change, the files it
/// may create, how long the answer may be and which worked example goes before it.
pub(crate) struct BlockTask<'a> {
    /// The call's purpose (`generate_code_changes`).
    pub purpose: &'a str,
    /// The task's text.
    pub task: String,
    /// The files it may change (path, current text).
    pub offered: &'a [(String, String)],
    /// The files it may create.
    pub new_paths: &'a [String],
    /// Tokens an answer may take.
    pub max_tokens: usize,
    /// The worked example shown first.
    pub example: prompts::ExampleKind,
}

/// Asks for blocks for `t`, correcting up to [`MAX_CORRECTIONS`] times. A worked example
/// goes before the task as an earlier exchange (a small model follows an example where it
/// copies a described format literally). `Err` holds the last answer's problems (or the
/// model's error).
pub(crate) async fn ask_blocks(
    llm: &AgentLlm,
    s: &TicketPrState,
    t: BlockTask<'_>,
    ctx: &NodeContext,
) -> (Result<BlockAnswer, Vec<String>>, Vec<LlmCall>) {
    let BlockTask {
        purpose,
        task,
        offered,
        new_paths,
        max_tokens,
        example,
    } = t;
    let first_path = offered
        .first()
        .map(|(p, _)| p.as_str())
        .or(new_paths.first().map(String::as_str))
        .unwrap_or("");
    let (ex_task, ex_answer) = prompts::block_example(example, first_path);
    let mut msgs = vec![
        Message::system(prompts::system_blocks(&repo_name(s))),
        Message::human(ex_task),
        Message::ai(ex_answer),
        Message::human(task),
    ];
    let kept = msgs.len();
    let mut calls = Vec::new();
    let mut last = Vec::new();
    for attempt in 0..=MAX_CORRECTIONS {
        let name = if attempt == 0 {
            purpose.to_string()
        } else {
            format!("{purpose} (correction {attempt})")
        };
        let (res, call) = llm
            .text_with(
                &name,
                &msgs,
                max_tokens,
                |o| {
                    // A block quotes the lines it changes: repeats are the format.
                    o.no_repeat_ngram = None;
                    o.max_context = o.max_context.max(8192);
                    // A greedy model asked again gives the same answer: a correction is
                    // sampled (low temperature, a fixed seed per attempt, so runs repeat).
                    if attempt > 0 && o.temperature == 0.0 {
                        o.temperature = 0.5;
                        o.top_p = Some(0.9);
                        o.seed = Some(attempt as u64);
                    }
                },
                TokenSink::from_context(ctx),
            )
            .await;
        calls.push(call);
        let answer = match res {
            Ok(a) => a,
            Err(e) => return (Err(vec![format!("the model failed: {e}")]), calls),
        };
        dump_exchange(&name, &msgs, &answer);
        match use_answer(&answer, offered, new_paths) {
            Ok(mut done) => {
                done.corrections = attempt as u32;
                return (Ok(done), calls);
            }
            Err(problems) => {
                tracing::info!(
                    purpose,
                    attempt,
                    ?problems,
                    answer = %answer.chars().take(1500).collect::<String>(),
                    "blocks refused; asking for a correction"
                );
                // Only the last answer and what was wrong with it: the context stays the
                // task's size (within 8,192 tokens) however many corrections there are.
                msgs.truncate(kept);
                msgs.push(Message::ai(answer));
                msgs.push(Message::human(prompts::correction(&problems)));
                last = problems;
            }
        }
    }
    (Err(last), calls)
}

/// With `FERROGRAPH_TICKET_PROMPTS=DIR`, writes each block request and its answer to
/// `DIR/<purpose>.txt` (turns separated by `=== user ===` and `=== assistant ===` lines, the
/// format of `ferrograph-llm`'s `prompt_file` example, which replays them).
fn dump_exchange(name: &str, msgs: &[Message], answer: &str) {
    let Some(dir) = std::env::var_os("FERROGRAPH_TICKET_PROMPTS") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let mut text = String::new();
    for m in msgs {
        match m.role {
            ferrograph::core::Role::System => continue,
            ferrograph::core::Role::Ai => text.push_str("=== assistant ===\n"),
            _ => text.push_str("=== user ===\n"),
        }
        text.push_str(&m.content);
        text.push('\n');
    }
    text.push_str("=== answer ===\n");
    text.push_str(answer);
    let file: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let path = dir.join(format!("{file}.txt"));
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, text)) {
        tracing::warn!(path = %path.display(), error = %e, "writing the prompt dump failed");
    }
}

/// A description of a change: the explanation's first sentence, else what changed.
pub(crate) fn describe(explanation: &str, path: &str) -> String {
    let first = explanation
        .split_inclusive(['.', '\n'])
        .map(str::trim)
        .find(|t| t.len() > 12)
        .unwrap_or("")
        .trim()
        .trim_end_matches('.');
    // "The root cause: X" says what was wrong; the description keeps X.
    let lower = first.to_ascii_lowercase();
    let first = ["the root cause:", "root cause:", "the root cause is"]
        .iter()
        .find(|p| lower.starts_with(**p))
        .map_or(first, |p| first[p.len()..].trim());
    if first.is_empty() || edit::degenerate(first) {
        format!("edit of {path}")
    } else if first.chars().count() > 200 {
        format!("{}…", first.chars().take(200).collect::<String>())
    } else {
        first.to_string()
    }
}

/// The block answer's files as changes, each path checked against the selected modules (a
/// model's path is hostile: the same fence as the line edits).
pub(crate) fn to_changes(
    s: &TicketPrState,
    answer: &BlockAnswer,
) -> Result<Vec<FileChange>, TicketPrError> {
    let repo = repo::open(Path::new(&s.repo))?;
    let selected = s.selected_modules();
    let mut out = Vec::new();
    for (path, text) in &answer.files {
        let path = repo::check_path(&repo, &s.base_commit, path, &selected)?;
        out.push(FileChange {
            description: describe(&answer.explanation, &path),
            file_path: path,
            new_content: text.clone(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn offered() -> Vec<(String, String)> {
        vec![(
            "pkg/tasks.py".to_string(),
            "def late(tasks, today):\n    return [t for t in tasks if t.due < today]\n".to_string(),
        )]
    }

    #[test]
    fn the_fast_tier_keeps_line_edits() {
        assert!(is_fast_tier("SmolLM2-135M-Instruct.Q4_1"));
        assert!(!is_fast_tier("qwen2.5-coder-1.5b-instruct-q4_k_m"));
    }

    #[test]
    fn an_answer_becomes_checked_files_and_its_explanation() {
        let answer = "The root cause: `late` compares a missing due date.\n\npkg/tasks.py\n<<<<<<< SEARCH\n    return [t for t in tasks if t.due < today]\n=======\n    return [t for t in tasks if t.due is not None and t.due < today]\n>>>>>>> REPLACE\n";
        let done = use_answer(answer, &offered(), &[]).unwrap();
        assert_eq!(done.files.len(), 1);
        assert!(done.files[0].1.contains("is not None"));
        assert_eq!(
            done.explanation,
            "The root cause: `late` compares a missing due date."
        );
        assert_eq!(
            describe(&done.explanation, "pkg/tasks.py"),
            "`late` compares a missing due date"
        );
    }

    #[test]
    fn problems_are_listed_for_the_model_to_correct() {
        let no_blocks = use_answer("I would add a check.", &offered(), &[]).unwrap_err();
        assert!(no_blocks[0].contains("no SEARCH/REPLACE block"));
        // A wrong path whose SEARCH lines are in one offered file is that file; other
        // paths are refused.
        let misnamed = "stats/mean.py\n<<<<<<< SEARCH\n    return [t for t in tasks if t.due < today]\n=======\n    return []\n>>>>>>> REPLACE";
        assert_eq!(
            use_answer(misnamed, &offered(), &[]).unwrap().files[0].0,
            "pkg/tasks.py"
        );
        let elsewhere = "/etc/passwd\n<<<<<<< SEARCH\nroot\n=======\nx\n>>>>>>> REPLACE";
        let err = use_answer(elsewhere, &offered(), &[]).unwrap_err();
        assert!(err[0].contains("not a file you may change"), "{err:?}");
        let unchanged = "pkg/tasks.py\n<<<<<<< SEARCH\ndef late(tasks, today):\n=======\ndef late(tasks, today):\n>>>>>>> REPLACE";
        assert!(use_answer(unchanged, &offered(), &[]).unwrap_err()[0].contains("change nothing"));
        let broken = "pkg/tasks.py\n<<<<<<< SEARCH\n    return [t for t in tasks if t.due < today]\n=======\n    return [t for t in tasks if t.due < today\n>>>>>>> REPLACE";
        if matches!(
            blocks::parse_check("x.py", "x = 1\n"),
            Ok(ParseCheck::Parses(_))
        ) {
            let err = use_answer(broken, &offered(), &[]).unwrap_err();
            assert!(err[0].contains("does not parse"), "{err:?}");
        }
    }

    #[test]
    fn a_whole_function_in_a_code_block_is_used_when_there_is_no_block() {
        let answer = "The root cause: `late` compares a missing due date.\n\n```python\ndef late(tasks, today):\n    return [t for t in tasks if t.due is not None and t.due < today]\n```\n";
        let done = use_answer(answer, &offered(), &[]).unwrap();
        assert_eq!(done.form, "whole functions");
        assert!(done.files[0].1.contains("t.due is not None"));
        assert_eq!(
            done.explanation,
            "The root cause: `late` compares a missing due date."
        );
        // A new test file from a fence, and a fence that breaks the file is sent back.
        let test = "tests/test_late.py\n```python\nfrom pkg.tasks import late\n\ndef test_none():\n    assert late([], 1) == []\n```";
        let done = use_answer(test, &offered(), &["tests/test_late.py".into()]).unwrap();
        assert_eq!(done.files[0].0, "tests/test_late.py");
        if matches!(
            blocks::parse_check("x.py", "x = 1\n"),
            Ok(ParseCheck::Parses(_))
        ) {
            let broken =
                "```python\ndef late(tasks, today):\n    return [t for t in tasks if (\n```";
            let err = use_answer(broken, &offered(), &[]).unwrap_err();
            assert!(err[0].contains("does not parse"), "{err:?}");
        }
    }

    #[test]
    fn a_new_test_file_is_written_from_an_empty_search() {
        let answer = "pkg/test_tasks.py\n<<<<<<< SEARCH\n=======\nfrom pkg.tasks import late\n\ndef test_none():\n    assert late([], 1) == []\n>>>>>>> REPLACE";
        let done = use_answer(answer, &offered(), &["pkg/test_tasks.py".into()]).unwrap();
        assert_eq!(done.files[0].0, "pkg/test_tasks.py");
        assert!(done.files[0].1.starts_with("from pkg.tasks import late\n"));
        // A SEARCH against a file that does not exist says how to write it.
        let wrong =
            "pkg/test_tasks.py\n<<<<<<< SEARCH\nimport x\n=======\nimport y\n>>>>>>> REPLACE";
        let err = use_answer(wrong, &offered(), &["pkg/test_tasks.py".into()]).unwrap_err();
        assert!(err[0].contains("leave the SEARCH part empty"), "{err:?}");
    }
}
