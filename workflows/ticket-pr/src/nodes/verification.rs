//! Step 6½: the proposed tests run in the sandbox before the gate, without the change and
//! with it ([`crate::verify`]); when they do not show the fix, the output goes back to the
//! model for up to [`MAX_TEST_CORRECTIONS`] corrections of the change or the tests.

use super::*;
use crate::verify;
use crate::MAX_TEST_CORRECTIONS;

/// Whether the last test run asks for a correction: it ran this generation's tests, it
/// does not show the fix, and corrections are left.
pub(crate) fn needs_test_correction(s: &TicketPrState) -> bool {
    s.tests_not_run.is_empty()
        && s.test_corrections < MAX_TEST_CORRECTIONS
        && s.test_runs.last().is_some_and(|r| {
            r.generation == s.generations
                && r.correction == s.test_corrections
                && r.problem().is_some()
        })
}

/// Node: runs the proposed tests on the base tree and on the changed tree.
pub(crate) async fn run_proposed_tests(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    _ctx: NodeContext,
) -> Result<Update, NodeError> {
    let not_run = |why: String| {
        Update::new()
            .tests_not_run(why.clone())
            .messages(vec![format!("Tests not run: {why}")])
    };
    let Some(limits) = d.settings.test_limits.clone() else {
        return Ok(not_run(
            "test runs are off (FERROGRAPH_TICKET_RUN_TESTS=0)".into(),
        ));
    };
    if let Some(why) = verify::not_runnable(&s.proposed_tests) {
        return Ok(not_run(why));
    }
    let base = match repo::open(Path::new(&s.repo))
        .and_then(|repo| verify::base_tree(&repo, &s.base_commit))
    {
        Ok(b) => b,
        Err(e @ TicketPrError::TreeTooLarge { .. }) => return Ok(not_run(e.to_string())),
        Err(e) => return Ok(failed(e.to_string())),
    };
    // The tests' own paths win over a change of the same path.
    let changes: Vec<FileChange> = s
        .proposed_changes
        .iter()
        .filter(|c| !s.proposed_tests.iter().any(|t| t.file_path == c.file_path))
        .cloned()
        .collect();
    let dir = d.settings.data_dir.join("sandbox").join(format!(
        "{}-g{}-c{}-{}",
        repo::branch_name(&s.ticket.key, "")
            .trim_start_matches("ticket/")
            .trim_end_matches('-'),
        s.generations,
        s.test_corrections,
        now_ms()
    ));
    // The runs see a copy of the base tree only; the user's `.git` is checked all the same
    // (it is the fence left when unconfined runs are allowed).
    let snapshot = ferrograph_sandbox::GitSnapshot::take(Path::new(&s.repo));
    let run = verify::run(&base, &changes, &s.proposed_tests, &dir, &limits).await;
    let tampering = snapshot.map(|g| g.restore_changes()).filter(|t| t.any());
    match run {
        Ok(mut r) => {
            r.generation = s.generations;
            r.correction = s.test_corrections;
            let mut line = format!("Tests run ({}): {}", r.command, r.line());
            if let Some(t) = tampering {
                line.push_str(&format!(
                    " — the run changed the repository's .git, {}",
                    t.describe()
                ));
            }
            Ok(Update::new()
                .tests_not_run(String::new())
                .test_runs(vec![r])
                .messages(vec![line]))
        }
        // A tree too large to copy, or a sandbox that cannot start: the gate says so.
        Err(e) => Ok(not_run(e.to_string())),
    }
}

/// Node: the last run's problem goes back to the model, with the changed files and the
/// tests as they are now; its blocks replace those files.
pub(crate) async fn correct_from_tests(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    let llm = match d.llm() {
        Ok(l) => l,
        Err(e) => return Ok(failed(e)),
    };
    let Some(problem) = s.test_runs.last().and_then(verify::TestRun::problem) else {
        return Ok(Update::new());
    };
    let offered: Vec<(String, String)> = s
        .all_changes()
        .into_iter()
        .map(|c| (c.file_path, c.new_content))
        .collect();
    let command = s
        .test_runs
        .last()
        .map(|r| r.command.clone())
        .unwrap_or_default();
    let shown = super::by_blocks::shown_files(&offered, &s.retrieved_chunks);
    let task = prompts::test_correction(&s, &shown, &command, &problem);
    let (res, calls) = super::by_blocks::ask_blocks(
        llm,
        &s,
        super::by_blocks::BlockTask {
            purpose: "correct_from_tests",
            task,
            offered: &offered,
            new_paths: &[],
            max_tokens: super::by_blocks::MAX_BLOCK_TOKENS,
            example: prompts::ExampleKind::Change,
        },
        &ctx,
    )
    .await;
    let attempt = s.test_corrections + 1;
    let answer = match res {
        Ok(a) => a,
        Err(problems) => {
            return Ok(Update::new().llm_calls(calls).messages(vec![format!(
                "Correction {attempt} from the tests not usable: {}",
                problems.join(" / ")
            )]));
        }
    };
    let fixed = match super::by_blocks::to_changes(&s, &answer) {
        Ok(c) => c,
        Err(e) => return Ok(failed(format!("the corrected files: {e}")).llm_calls(calls)),
    };
    let replace = |list: &[FileChange]| -> Vec<FileChange> {
        list.iter()
            .map(
                |c| match fixed.iter().find(|f| f.file_path == c.file_path) {
                    Some(f) => FileChange {
                        file_path: c.file_path.clone(),
                        description: c.description.clone(),
                        new_content: f.new_content.clone(),
                    },
                    None => c.clone(),
                },
            )
            .collect()
    };
    let changes = replace(&s.proposed_changes);
    let tests = replace(&s.proposed_tests);
    let paths: Vec<&str> = fixed.iter().map(|f| f.file_path.as_str()).collect();
    let line = answer.progress_line(&format!(
        "Correction {attempt} from the tests: {}",
        paths.join(", ")
    ));
    Ok(Update::new()
        .proposed_changes(changes)
        .proposed_tests(tests)
        .test_corrections(attempt)
        .llm_calls(calls)
        .messages(vec![line]))
}
