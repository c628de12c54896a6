//! Steps 5 and 6: the changes and the tests, as line edits of the files offered (or new
//! files written whole), checked against the repository before they reach the gate.

use super::*;

/// Reads `paths` at the base commit.
pub(crate) fn read_files(
    s: &TicketPrState,
    paths: &[String],
) -> Result<Vec<(String, String)>, String> {
    let repo = repo::open(Path::new(&s.repo)).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for p in paths {
        if let Some(text) = repo::read_at(&repo, &s.base_commit, p).map_err(|e| e.to_string())? {
            out.push((p.clone(), text));
        }
    }
    Ok(out)
}

/// The model's files checked: paths inside the selected modules, edits of the file's own
/// lines (or a new file's content), one entry per path, and no file left as it was. Returns
/// the changes and what was dropped.
pub(crate) fn check_changes(
    s: &TicketPrState,
    proposed: Vec<state::ProposedFile>,
) -> Result<(Vec<FileChange>, Vec<String>), TicketPrError> {
    let repo = repo::open(Path::new(&s.repo))?;
    let selected = s.selected_modules();
    let mut out: Vec<FileChange> = Vec::new();
    let mut dropped = Vec::new();
    for p in proposed {
        let path = repo::check_path(&repo, &s.base_commit, &p.file_path, &selected)?;
        let old = repo::read_at(&repo, &s.base_commit, &path)?;
        let content = match edit::compose(&p, old.as_deref()) {
            Ok(c) => c,
            Err(why) => {
                dropped.push(format!("{path}: {why}"));
                continue;
            }
        };
        if content.trim().is_empty() {
            dropped.push(format!("{path}: empty content"));
            continue;
        }
        // A small model writes a new file's name as its content.
        let name = path.rsplit('/').next().unwrap_or(&path);
        if old.is_none() && !content.trim().contains('\n') && content.trim().ends_with(name) {
            dropped.push(format!("{path}: its content is only its name"));
            continue;
        }
        if old.as_deref() == Some(content.as_str()) {
            dropped.push(format!("{path}: unchanged"));
            continue;
        }
        // No file that fails to parse reaches the gate, whichever way it was written.
        if let Err(why) = crate::blocks::parse_check(&path, &content) {
            dropped.push(format!("{path}: does not parse ({why})"));
            continue;
        }
        if out.iter().any(|c| c.file_path == path) {
            dropped.push(format!("{path}: proposed twice"));
            continue;
        }
        let description = match p.description.trim() {
            // Empty, looping, or cut off at the schema's 160 characters mid-sentence.
            d if d.is_empty()
                || edit::degenerate(d)
                || (d.chars().count() >= 155 && !d.ends_with(['.', ')', '`'])) =>
            {
                describe_edit(&p, &path)
            }
            d => d.to_string(),
        };
        out.push(FileChange {
            file_path: path,
            description,
            new_content: content,
        });
    }
    Ok((out, dropped))
}

/// A description composed from the change itself, for when the model's is empty, loops or
/// is cut off.
pub(crate) fn describe_edit(p: &state::ProposedFile, path: &str) -> String {
    let short = |t: &str| {
        let t = t.trim().replace('\n', " ");
        if t.chars().count() > 60 {
            format!("{}…", t.chars().take(60).collect::<String>())
        } else {
            t
        }
    };
    match p.edits.first() {
        Some(e) if e.replace.trim().is_empty() => format!("remove `{}`", short(&e.find)),
        Some(e) => format!("replace `{}` with `{}`", short(&e.find), short(&e.replace)),
        None => format!("add {path}"),
    }
}

/// The `items` schema of a list of proposed files: one alternative per allowed path, with
/// edits of its own lines when it exists (`files`), else its whole content.
pub(crate) fn files_schema(
    paths: &[String],
    files: &[(String, String)],
    max_len: usize,
    ticket: &str,
) -> Value {
    let alts: Vec<Value> = paths
        .iter()
        .map(|p| {
            let lines = files.iter().find(|(f, _)| f == p).map(|(_, t)| {
                // The lines the ticket points at first.
                let mut l = edit::pointed_lines(t, ticket);
                for x in edit::edit_targets(t) {
                    if !l.contains(&x) {
                        l.push(x);
                    }
                }
                l
            });
            edit::file_schema(p, lines.as_deref(), max_len)
        })
        .collect();
    match alts.as_slice() {
        [one] => one.clone(),
        _ => json!({ "anyOf": alts }),
    }
}

/// `maxLength` of a new file's content and the tokens to allow for an answer.
pub(crate) fn content_budget(files: &[(String, String)], new_files: usize) -> (usize, usize) {
    let longest = files.iter().map(|(_, t)| t.len()).max().unwrap_or(1200);
    let max_len = (longest + 400).clamp(1200, 6000);
    // Edits are short; a new file is written whole.
    (max_len, 700 + new_files * (max_len / 3))
}

/// Node 5: the changes, as line edits of the files offered; on a revision with the
/// reviewer's feedback. A first answer that changes nothing is asked again on the alternative
/// configuration once.
pub(crate) async fn generate_code_changes(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    let llm = match d.llm() {
        Ok(l) => l,
        Err(e) => return Ok(failed(e)),
    };
    let by_blocks = super::by_blocks::blocks_for(llm);
    // Blocks are shown whole files (within their budget); line edits list a file's lines in
    // the schema, which two files already fill.
    let paths = candidate_sources(&s, if by_blocks { 3 } else { 2 });
    if paths.is_empty() {
        return Ok(failed(format!(
            "no source file found in the modules {} to change",
            s.affected_modules.join(", ")
        )));
    }
    let files = match read_files(&s, &paths) {
        Ok(f) => f,
        Err(e) => return Ok(failed(e)),
    };
    let ticket_text = format!("{} {}", s.ticket.summary, s.ticket.description);
    let context = prompts::code_context(&files, &s.retrieved_chunks, 9000, &ticket_text);
    let msgs = messages_for(&s, prompts::generate_changes(&s, &context));
    let (max_len, max_tokens) = content_budget(&files, 0);
    let is_bug = s.ticket.ticket_type == TicketType::Bug;
    let items = files_schema(&paths, &files, max_len, &ticket_text);
    let patch = |schema: &mut Value| {
        if let Some(p) = schema.pointer_mut("/properties/changes") {
            p["items"] = items.clone();
            p["maxItems"] = json!(paths.len());
        }
        if !is_bug {
            if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
                props.remove("root_cause");
            }
            if let Some(req) = schema.get_mut("required").and_then(Value::as_array_mut) {
                req.retain(|r| r != "root_cause");
            }
        }
    };
    let mut calls = Vec::new();
    let mut dropped_all = Vec::new();
    if by_blocks {
        let excerpts = prompts::excerpts_outside(&files, &s.retrieved_chunks, 1500);
        let shown = super::by_blocks::shown_files(&files, &s.retrieved_chunks);
        let task = prompts::change_blocks(&s, &shown, &excerpts);
        let (res, block_calls) = super::by_blocks::ask_blocks(
            llm,
            &s,
            super::by_blocks::BlockTask {
                purpose: "generate_code_changes",
                task,
                offered: &files,
                new_paths: &[],
                max_tokens: super::by_blocks::MAX_BLOCK_TOKENS,
                example: prompts::ExampleKind::Change,
            },
            &ctx,
        )
        .await;
        calls.extend(block_calls);
        match res {
            Ok(answer) => {
                let changes = match super::by_blocks::to_changes(&s, &answer) {
                    Ok(c) => c,
                    Err(e) => {
                        return Ok(failed(format!("the proposed changes: {e}")).llm_calls(calls))
                    }
                };
                let line = answer.progress_line(&files_line(
                    &format!(
                        "Generation {}: {} file change(s)",
                        s.generations + 1,
                        changes.len()
                    ),
                    &changes,
                    &[],
                ));
                let explanation = answer.explanation.trim();
                return Ok(Update::new()
                    .root_cause(
                        if is_bug && !explanation.is_empty() && !edit::degenerate(explanation) {
                            explanation.to_string()
                        } else {
                            String::new()
                        },
                    )
                    .proposed_changes(changes)
                    .proposed_tests(Vec::new())
                    .generations(1u32)
                    .test_corrections(0u32)
                    .tests_not_run(String::new())
                    .decision(String::new())
                    .llm_calls(calls)
                    .messages(vec![line]));
            }
            Err(problems) => dropped_all.push(super::by_blocks::refused_note(
                "search/replace blocks",
                &problems,
            )),
        }
    }
    let mut result = None;
    for alternative in [false, true] {
        let (res, call) = llm
            .structured_as::<CodeChanges>(
                alternative,
                "generate_code_changes",
                &msgs,
                max_tokens,
                patch,
                TokenSink::from_context(&ctx),
            )
            .await;
        calls.push(call);
        let answer = match res {
            Ok(a) => a,
            Err(e) => {
                return Ok(failed(format!("generating the changes: {e}")).llm_calls(calls));
            }
        };
        match check_changes(&s, answer.changes.clone()) {
            Ok((changes, dropped)) if !changes.is_empty() => {
                dropped_all.extend(dropped);
                result = Some((answer.root_cause, changes));
                break;
            }
            Ok((_, dropped)) => dropped_all.extend(dropped),
            Err(e) => {
                return Ok(failed(format!("the proposed changes: {e}")).llm_calls(calls));
            }
        }
    }
    let Some((root_cause, changes)) = result else {
        return Ok(failed(format!(
            "the model proposed no change to any file ({})",
            dropped_all.join("; ")
        ))
        .llm_calls(calls));
    };
    let line = files_line(
        &format!(
            "Generation {}: {} file change(s)",
            s.generations + 1,
            changes.len()
        ),
        &changes,
        &dropped_all,
    );
    Ok(Update::new()
        .root_cause(if is_bug && !edit::degenerate(&root_cause) {
            root_cause.trim().to_string()
        } else {
            String::new()
        })
        .proposed_changes(changes)
        .proposed_tests(Vec::new())
        .generations(1u32)
        .test_corrections(0u32)
        .tests_not_run(String::new())
        .decision(String::new())
        .llm_calls(calls)
        .messages(vec![line]))
}

/// A progress line: `head: path, path (dropped: why; why)`.
fn files_line(head: &str, files: &[FileChange], dropped: &[String]) -> String {
    let mut line = head.to_string();
    if !files.is_empty() {
        let paths: Vec<&str> = files.iter().map(|c| c.file_path.as_str()).collect();
        line.push_str(&format!(": {}", paths.join(", ")));
    }
    if !dropped.is_empty() {
        line.push_str(&format!(" (dropped: {})", dropped.join("; ")));
    }
    line
}

/// `src/main/.../X.java` → `src/test/.../XTest.java` (and the like for other layouts).
pub(crate) fn test_path_for(path: &str) -> Option<String> {
    let p = Path::new(path);
    let stem = p.file_stem()?.to_string_lossy().into_owned();
    let ext = p.extension()?.to_string_lossy().into_owned();
    let dir = p.parent()?.to_string_lossy().into_owned();
    let dir = if dir.contains("/src/main/") {
        dir.replacen("/src/main/", "/src/test/", 1)
    } else if let Some(rest) = dir.strip_suffix("/src") {
        format!("{rest}/tests")
    } else {
        dir
    };
    Some(match ext.as_str() {
        // Rust's unit tests live in the file they test; no test file is derived.
        "rs" => return None,
        "py" => format!("{dir}/test_{stem}.{ext}"),
        "ts" | "js" => format!("{dir}/{stem}.test.{ext}"),
        _ => format!("{dir}/{stem}Test.{ext}"),
    })
}

/// Node 6: the tests, seeing the changes and the existing test of the changed class.
pub(crate) async fn generate_tests(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    let llm = match d.llm() {
        Ok(l) => l,
        Err(e) => return Ok(failed(e)),
    };
    let selected = s.selected_modules();
    let tests: Vec<String> = selected
        .iter()
        .flat_map(|m| m.files.iter())
        .filter(|f| {
            let name = f.rsplit('/').next().unwrap_or(f);
            // A package marker or shared fixtures are not where a test goes.
            repo::is_test_path(f)
                && ferrograph_index::chunk::language_for_path(f).is_some()
                && name != "__init__.py"
                && name != "conftest.py"
        })
        .cloned()
        .collect();
    let stems: Vec<String> = s
        .proposed_changes
        .iter()
        .filter_map(|c| Path::new(&c.file_path).file_stem())
        .map(|x| x.to_string_lossy().to_lowercase())
        .collect();
    let stem_of = |p: &String| {
        Path::new(p)
            .file_stem()
            .map(|x| x.to_string_lossy().to_lowercase())
            .unwrap_or_default()
    };
    let existing = tests
        .iter()
        .find(|t| stems.iter().any(|st| stem_of(t).contains(st.as_str())))
        .or_else(|| {
            s.retrieved_chunks
                .iter()
                .map(|c| &c.file_path)
                .find(|p| tests.contains(p))
        })
        .or_else(|| tests.first())
        .cloned();
    let mut paths: Vec<String> = existing.iter().cloned().collect();
    for c in &s.proposed_changes {
        if let Some(t) = test_path_for(&c.file_path) {
            if !paths.contains(&t)
                && existing.as_ref().is_none_or(|e| stem_of(e) != stem_of(&t))
                && selected.iter().any(|m| m.holds(&t))
            {
                paths.push(t);
            }
        }
    }
    if paths.is_empty() {
        return Ok(Update::new().messages(vec![
            "No test file to write: the selected modules have no tests and no test path could be derived".into(),
        ]));
    }
    let mut files = match existing
        .as_ref()
        .map(|e| read_files(&s, std::slice::from_ref(e)))
    {
        Some(Ok(f)) => f,
        Some(Err(e)) => return Ok(failed(e)),
        None => Vec::new(),
    };
    // A Python test file our runner cannot run here (it needs pytest, which is not
    // installed): the test goes to a new file beside it, so that it can run before the gate.
    if let Some((path, text)) = files.first() {
        if path.ends_with(".py") && !crate::verify::runnable_test_file(text) {
            let dir = Path::new(path)
                .parent()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            let slug: String = s
                .ticket
                .key
                .to_lowercase()
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            let name = format!("test_{}.py", slug.trim_matches('_'));
            let new = if dir.is_empty() {
                name
            } else {
                format!("{dir}/{name}")
            };
            tracing::info!(existing = %path, new = %new, "the test file needs pytest: a new file instead");
            paths = vec![new];
            files = Vec::new();
        }
    }
    let mut block_calls = Vec::new();
    let mut block_note = None;
    if super::by_blocks::blocks_for(llm) {
        match tests_by_blocks(llm, &s, &paths, &files, &ctx).await {
            (Ok(Some(update)), calls) => return Ok(update.llm_calls(calls)),
            (Ok(None), calls) => block_calls = calls,
            (Err(note), calls) => {
                block_calls = calls;
                block_note = Some(note);
            }
        }
    }
    let shown = files.first().map(|(p, t)| (p.as_str(), t.as_str()));
    let msgs = messages_for(&s, prompts::generate_tests(&s, shown));
    let new_files = paths
        .iter()
        .filter(|p| !files.iter().any(|(f, _)| f == *p))
        .count();
    let (max_len, max_tokens) = content_budget(&files, new_files.min(1));
    let ticket_text = format!("{} {}", s.ticket.summary, s.ticket.description);
    let items = files_schema(&paths, &files, max_len, &ticket_text);
    let (res, call) = llm
        .structured::<TestChanges>(
            "generate_tests",
            &msgs,
            max_tokens,
            |schema| {
                if let Some(p) = schema.pointer_mut("/properties/tests") {
                    p["items"] = items.clone();
                }
            },
            TokenSink::from_context(&ctx),
        )
        .await;
    let mut calls = block_calls;
    calls.push(call);
    let answer = match res {
        Ok(a) => a,
        Err(e) => return Ok(failed(format!("generating the tests: {e}")).llm_calls(calls)),
    };
    let (tests, mut dropped) = match check_changes(&s, answer.tests) {
        Ok(x) => x,
        Err(e) => return Ok(failed(format!("the proposed tests: {e}")).llm_calls(calls)),
    };
    if let Some(note) = block_note {
        dropped.insert(0, note);
    }
    let line = if tests.is_empty() {
        files_line("No test change proposed", &tests, &dropped)
    } else {
        files_line(&format!("{} test file(s)", tests.len()), &tests, &dropped)
    };
    Ok(Update::new()
        .proposed_tests(tests)
        .llm_calls(calls)
        .messages(vec![line]))
}

/// The tests as search/replace blocks against the test file of `paths` (the existing one,
/// read into `files`, or the first new path). `Ok(None)`: nothing to ask; `Err`: the blocks
/// were refused (the note says why) and the line edits take over.
async fn tests_by_blocks(
    llm: &AgentLlm,
    s: &TicketPrState,
    paths: &[String],
    files: &[(String, String)],
    ctx: &NodeContext,
) -> (
    Result<Option<Update>, String>,
    Vec<ferrograph::chat::agent::LlmCall>,
) {
    let Some(target) = paths.first() else {
        return (Ok(None), Vec::new());
    };
    let existing = files
        .iter()
        .find(|(p, _)| p == target)
        .map(|(_, t)| t.clone());
    let changed: Vec<String> = s
        .proposed_changes
        .iter()
        .map(|c| c.file_path.clone())
        .collect();
    let olds = match read_files(s, &changed) {
        Ok(o) => o,
        Err(e) => return (Err(e), Vec::new()),
    };
    let mut diff = String::new();
    for c in &s.proposed_changes {
        let old = olds
            .iter()
            .find(|(p, _)| *p == c.file_path)
            .map(|(_, t)| t.as_str());
        match repo::unified_diff(&c.file_path, old, &c.new_content) {
            Ok(d) => diff.push_str(&d),
            Err(e) => return (Err(e.to_string()), Vec::new()),
        }
    }
    let shown_test = existing.as_ref().map(|t| {
        super::by_blocks::shown_files(&[(target.clone(), t.clone())], &[])
            .into_iter()
            .map(|(_, t)| t)
            .next()
            .unwrap_or_default()
    });
    let task = prompts::test_blocks(s, &diff, &(target.clone(), shown_test));
    let offered: Vec<(String, String)> = existing
        .map(|t| vec![(target.clone(), t)])
        .unwrap_or_default();
    let new_paths: Vec<String> = if offered.is_empty() {
        vec![target.clone()]
    } else {
        Vec::new()
    };
    let (res, calls) = super::by_blocks::ask_blocks(
        llm,
        s,
        super::by_blocks::BlockTask {
            purpose: "generate_tests",
            task,
            offered: &offered,
            new_paths: &new_paths,
            max_tokens: super::by_blocks::MAX_TEST_TOKENS,
            example: prompts::ExampleKind::Test,
        },
        ctx,
    )
    .await;
    match res {
        Ok(answer) => match super::by_blocks::to_changes(s, &answer) {
            Ok(tests) => {
                let line = answer.progress_line(&files_line(
                    &format!("{} test file(s)", tests.len()),
                    &tests,
                    &[],
                ));
                (
                    Ok(Some(
                        Update::new().proposed_tests(tests).messages(vec![line]),
                    )),
                    calls,
                )
            }
            Err(e) => (Err(format!("the proposed tests: {e}")), calls),
        },
        Err(problems) => (
            Err(super::by_blocks::refused_note("test blocks", &problems)),
            calls,
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn test_paths_follow_the_layout() {
        assert_eq!(
            test_path_for("core/src/main/java/a/TaskService.java").unwrap(),
            "core/src/test/java/a/TaskServiceTest.java"
        );
        assert_eq!(
            test_path_for("pkg/src/util.py").unwrap(),
            "pkg/tests/test_util.py"
        );
        assert_eq!(test_path_for("benches/bench.rs"), None);
    }
}
