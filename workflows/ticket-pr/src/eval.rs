//! The ticket-to-PR evaluation's cases and measures (`ferrograph eval ticket-to-pr` drives
//! it): real bugs of public Python packages (`tests/eval/ticket-pr-cases.toml`), each judged
//! by the test the real fix added, run against the branch the workflow made (FAIL_TO_PASS).
//! No network here: the CLI downloads the releases.

use crate::repo;
use crate::state::TicketPrState;
use crate::TicketPrError;
use git2::{IndexAddOption, Repository, RepositoryInitOptions, Signature};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// One case: a bug, its buggy release, and the test that tells a fix.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct EvalCase {
    /// `package-issue`.
    pub id: String,
    /// The PyPI package.
    pub package: String,
    /// The release with the bug.
    pub buggy_version: String,
    /// The release with the fix.
    pub fixed_version: String,
    /// The buggy release's sdist.
    pub buggy_sdist_url: String,
    /// Its sha256.
    pub buggy_sha256: String,
    /// The public report the ticket was written from.
    pub report_url: String,
    /// The folder the package imports from (`src` or empty).
    #[serde(default)]
    pub src_root: String,
    /// The source files the upstream fix changed.
    pub fixed_files: Vec<String>,
    /// `fix` (from the fix's own tests) or `report` (written by us from the report).
    #[serde(default)]
    pub test_origin: String,
    /// In the smoke set (CI).
    #[serde(default)]
    pub smoke: bool,
    /// The ticket's summary.
    pub title: String,
    /// The ticket's description (our words).
    pub ticket: String,
    /// The judging script (exits 0 when the bug is fixed).
    pub test: String,
}

#[derive(Deserialize)]
struct CaseFile {
    case: Vec<EvalCase>,
}

/// The cases of `path`.
pub fn load_cases(path: &Path) -> Result<Vec<EvalCase>, TicketPrError> {
    let text = std::fs::read_to_string(path).map_err(|e| TicketPrError::io(path, e))?;
    let file: CaseFile = toml::from_str(&text)
        .map_err(|e| TicketPrError::Tickets(format!("{}: {e}", path.display())))?;
    Ok(file.case)
}

/// The ticket every case files (each case has its own tickets folder).
pub const TICKET_KEY: &str = "BUG-1";

/// Writes the case's ticket into `dir` as `BUG-1.json`.
pub fn write_ticket(dir: &Path, case: &EvalCase) -> Result<(), TicketPrError> {
    std::fs::create_dir_all(dir).map_err(|e| TicketPrError::io(dir, e))?;
    let t = serde_json::json!({
        "key": TICKET_KEY,
        "summary": case.title,
        "description": case.ticket.trim(),
        "type": "Bug",
    });
    let path = dir.join(format!("{TICKET_KEY}.json"));
    std::fs::write(&path, t.to_string()).map_err(|e| TicketPrError::io(&path, e))
}

/// Makes `dir` a git repository on `main` with every file in one commit, those its own
/// `.gitignore` names included (an sdist ships generated files such as `_version.py` that
/// its repository ignores; without them the package does not import).
pub fn commit_all(dir: &Path, message: &str) -> Result<String, TicketPrError> {
    let mut opts = RepositoryInitOptions::new();
    opts.initial_head("main");
    let repo = Repository::init_opts(dir, &opts)
        .map_err(TicketPrError::git(format!("creating {}", dir.display())))?;
    let mut index = repo.index().map_err(TicketPrError::git("the index"))?;
    index
        .add_all(["*"], IndexAddOption::FORCE, None)
        .and_then(|()| index.write())
        .map_err(TicketPrError::git("staging every file"))?;
    let tree_id = index.write_tree().map_err(TicketPrError::git("the tree"))?;
    let tree = repo
        .find_tree(tree_id)
        .map_err(TicketPrError::git("the tree"))?;
    let sig = Signature::now("ferrograph eval", "eval@localhost")
        .map_err(TicketPrError::git("a signature"))?;
    let id = repo
        .commit(Some("HEAD"), &sig, &sig, message, &tree, &[])
        .map_err(TicketPrError::git("committing"))?;
    Ok(id.to_string())
}

/// The text files of `branch` in the repository at `dir`, and the paths it changed against
/// `main`.
pub fn branch_files(
    dir: &Path,
    branch: &str,
) -> Result<(BTreeMap<String, String>, Vec<String>), TicketPrError> {
    let repo = repo::open(dir)?;
    let commit = repo
        .revparse_single(branch)
        .and_then(|o| o.peel_to_commit())
        .map_err(TicketPrError::git(format!("branch {branch}")))?;
    let main = repo
        .revparse_single("main")
        .and_then(|o| o.peel_to_commit())
        .map_err(TicketPrError::git("branch main"))?;
    let diff = repo
        .diff_tree_to_tree(
            Some(&main.tree().map_err(TicketPrError::git("main's tree"))?),
            Some(
                &commit
                    .tree()
                    .map_err(TicketPrError::git("the branch's tree"))?,
            ),
            None,
        )
        .map_err(TicketPrError::git("the branch's diff"))?;
    let changed: Vec<String> = diff
        .deltas()
        .filter_map(|d| d.new_file().path().map(|p| p.display().to_string()))
        .collect();
    let files = repo::text_tree(&repo, &commit.id().to_string(), 8 << 20, 256 << 20)?;
    Ok((files, changed))
}

/// What one case gave with one model.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CaseResult {
    /// The case.
    pub case: String,
    /// The model.
    pub model: String,
    /// The run reached the review gate.
    pub gate: bool,
    /// The approved branch changed a file.
    pub edits_applied: bool,
    /// Every changed Python file parses (`None`: none changed).
    pub files_parse: Option<bool>,
    /// The branch changed a file the upstream fix changed.
    pub fixed_file_touched: bool,
    /// The case's test passes on the branch.
    pub fixed: bool,
    /// Seconds from the start to the gate.
    pub seconds_to_gate: f64,
    /// The workflow's own tests failed without its change and passed with it.
    pub own_tests_show_fix: bool,
    /// The workflow's own tests were run before the gate.
    pub own_tests_ran: bool,
    /// Corrections from the workflow's test runs.
    pub test_corrections: u32,
    /// Search/replace answers that had to be corrected (blocks that matched nowhere,
    /// files that did not parse).
    pub block_corrections: u32,
    /// The line edits were used after the blocks were refused.
    pub fell_back_to_lines: bool,
    /// Files the change was written to.
    pub changed: Vec<String>,
    /// The last lines of the judging test's output.
    pub test_output: String,
    /// Where it stopped, when it did before the end.
    pub note: String,
}

impl CaseResult {
    /// What the run's state says (to the gate).
    pub fn record_run(&mut self, s: &TicketPrState) {
        self.own_tests_ran = s.test_runs.iter().any(|r| r.generation == s.generations);
        self.own_tests_show_fix = s
            .test_runs
            .last()
            .is_some_and(|r| r.generation == s.generations && r.problem().is_none());
        self.test_corrections = s.test_corrections;
        self.block_corrections = s
            .llm_calls
            .iter()
            .filter(|c| c.purpose.contains("(correction"))
            .count() as u32;
        self.fell_back_to_lines = s.messages.iter().any(|m| m.contains("line edits instead"));
    }

    /// The workflow's own tests in a word: `not run`, `show the fix`, `do not show it`.
    pub fn own_tests_label(&self) -> &'static str {
        if !self.own_tests_ran {
            "not run"
        } else if self.own_tests_show_fix {
            "show the fix"
        } else {
            "do not show it"
        }
    }

    /// What the approved branch says.
    pub fn record_branch(
        &mut self,
        case: &EvalCase,
        changed: &[String],
        files: &BTreeMap<String, String>,
    ) {
        self.changed = changed.to_vec();
        self.edits_applied = !changed.is_empty();
        self.fixed_file_touched = case.fixed_files.iter().any(|f| changed.contains(f));
        let py: Vec<&String> = changed.iter().filter(|p| p.ends_with(".py")).collect();
        self.files_parse = if py.is_empty() {
            None
        } else {
            Some(py.iter().all(|p| {
                files
                    .get(*p)
                    .is_some_and(|t| crate::blocks::parse_check(p, t).is_ok())
            }))
        };
    }
}

/// The judging test of `case` against `files` (a branch's tree), in the sandbox: `true`
/// when it exits 0, and the tail of its output.
pub async fn judge(
    case: &EvalCase,
    files: &BTreeMap<String, String>,
    dir: &Path,
    limits: &ferrograph_sandbox::Limits,
) -> Result<(bool, String), TicketPrError> {
    let tree = dir.join("tree");
    let mut staged = files.clone();
    staged.insert("_ferrograph_case_test.py".into(), case.test.clone());
    ferrograph_sandbox::stage(&tree, &staged)?;
    let python = ferrograph_sandbox::python()?;
    let root = if case.src_root.is_empty() {
        tree.clone()
    } else {
        tree.join(&case.src_root)
    };
    let argv = vec![
        python.display().to_string(),
        "-B".into(),
        "_ferrograph_case_test.py".into(),
    ];
    let env = [
        ("PYTHONPATH".to_string(), root.display().to_string()),
        ("PYTHONDONTWRITEBYTECODE".to_string(), "1".to_string()),
    ];
    let ran = ferrograph_sandbox::run(&tree, &argv, &env, limits).await;
    let _ = std::fs::remove_dir_all(&tree);
    let ran = ran?;
    let output = ferrograph_sandbox::tail(&format!("{}{}", ran.stdout, ran.stderr), 1500);
    Ok((ran.success(), output))
}

/// One model's figures over its cases.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Summary {
    /// The model.
    pub model: String,
    /// Cases run.
    pub cases: usize,
    /// Fixed (the case's test passes on the branch).
    pub fix_rate: f64,
    /// Reached the review gate.
    pub reached_gate: f64,
    /// The approved branch changed a file.
    pub edits_applied: f64,
    /// Of the cases that changed Python files, those whose files all parse.
    pub files_parse: Option<f64>,
    /// The upstream fix's file was changed.
    pub fixed_file_touched: f64,
    /// The workflow's own tests showed its fix before the gate.
    pub own_tests_show_fix: f64,
    /// Corrections from test runs, per case.
    pub test_corrections_per_case: f64,
    /// Cases where the line edits replaced refused blocks.
    pub fell_back_to_lines: f64,
    /// Mean seconds to the gate.
    pub mean_seconds_to_gate: f64,
    /// Slowest case to the gate.
    pub max_seconds_to_gate: f64,
}

/// The figures of `results` (one model's).
pub fn summarize(model: &str, results: &[CaseResult]) -> Summary {
    let n = results.len().max(1) as f64;
    let share =
        |f: &dyn Fn(&CaseResult) -> bool| results.iter().filter(|r| f(r)).count() as f64 / n;
    let parsed: Vec<bool> = results.iter().filter_map(|r| r.files_parse).collect();
    let gate: Vec<f64> = results
        .iter()
        .filter(|r| r.gate)
        .map(|r| r.seconds_to_gate)
        .collect();
    Summary {
        model: model.to_string(),
        cases: results.len(),
        fix_rate: share(&|r| r.fixed),
        reached_gate: share(&|r| r.gate),
        edits_applied: share(&|r| r.edits_applied),
        files_parse: (!parsed.is_empty())
            .then(|| parsed.iter().filter(|p| **p).count() as f64 / parsed.len() as f64),
        fixed_file_touched: share(&|r| r.fixed_file_touched),
        own_tests_show_fix: share(&|r| r.own_tests_show_fix),
        test_corrections_per_case: results
            .iter()
            .map(|r| r.test_corrections as f64)
            .sum::<f64>()
            / n,
        fell_back_to_lines: share(&|r| r.fell_back_to_lines),
        mean_seconds_to_gate: if gate.is_empty() {
            0.0
        } else {
            gate.iter().sum::<f64>() / gate.len() as f64
        },
        max_seconds_to_gate: gate.iter().copied().fold(0.0, f64::max),
    }
}

/// The summaries and the cases as Markdown tables.
pub fn markdown(summaries: &[Summary], results: &[CaseResult]) -> String {
    let pct = |x: f64| format!("{:.0}%", x * 100.0);
    let mut out = String::from(
        "| model | cases | fixed | reached gate | edits applied | files parse | fixed file touched | own tests show the fix | test corrections / case | line edits instead | mean s to gate | max s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for s in summaries {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {} | {:.0} | {:.0} |\n",
            s.model,
            s.cases,
            pct(s.fix_rate),
            pct(s.reached_gate),
            pct(s.edits_applied),
            s.files_parse.map_or_else(|| "-".into(), pct),
            pct(s.fixed_file_touched),
            pct(s.own_tests_show_fix),
            s.test_corrections_per_case,
            pct(s.fell_back_to_lines),
            s.mean_seconds_to_gate,
            s.max_seconds_to_gate
        ));
    }
    out.push_str("\n| case | model | fixed | gate | changed | fixed file | parse | own tests | corrections (tests / blocks) | s to gate | note |\n|---|---|---|---|---|---|---|---|---|---:|---|\n");
    let yes = |b: bool| if b { "yes" } else { "no" };
    for r in results {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {:.0} | {} |\n",
            r.case,
            r.model,
            yes(r.fixed),
            yes(r.gate),
            r.changed.join(", "),
            yes(r.fixed_file_touched),
            r.files_parse.map_or("-", yes),
            r.own_tests_label(),
            r.test_corrections,
            r.block_corrections,
            r.seconds_to_gate,
            r.note.replace('|', "/")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_case_file_loads_and_every_case_is_complete() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/eval/ticket-pr-cases.toml");
        let cases = load_cases(&path).unwrap();
        assert!(cases.len() >= 15, "{}", cases.len());
        assert!(cases.iter().any(|c| c.smoke));
        for c in &cases {
            assert!(
                c.buggy_sdist_url
                    .starts_with("https://files.pythonhosted.org/"),
                "{}",
                c.id
            );
            assert_eq!(c.buggy_sha256.len(), 64, "{}", c.id);
            assert!(c.report_url.starts_with("https://"), "{}", c.id);
            assert!(
                !c.fixed_files.is_empty() && !c.test.trim().is_empty(),
                "{}",
                c.id
            );
        }
        let mut ids: Vec<&str> = cases.iter().map(|c| c.id.as_str()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), cases.len(), "ids are unique");
    }

    #[test]
    fn a_case_repository_keeps_the_files_its_gitignore_names() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("src/pkg")).unwrap();
        std::fs::write(dir.path().join(".gitignore"), "src/pkg/_version.py\n").unwrap();
        std::fs::write(
            dir.path().join("src/pkg/_version.py"),
            "__version__ = '1'\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("src/pkg/__init__.py"),
            "from ._version import __version__\n",
        )
        .unwrap();
        let commit = commit_all(dir.path(), "pkg 1").unwrap();
        let repo = repo::open(dir.path()).unwrap();
        let tree = repo::text_tree(&repo, &commit, 1 << 20, 1 << 20).unwrap();
        assert!(
            tree.contains_key("src/pkg/_version.py"),
            "{:?}",
            tree.keys()
        );
        repo::check_clean(&repo).unwrap();
    }

    #[test]
    fn summaries_count_what_happened() {
        let r = |fixed: bool, parse: Option<bool>| CaseResult {
            fixed,
            gate: true,
            files_parse: parse,
            seconds_to_gate: 100.0,
            ..CaseResult::default()
        };
        let s = summarize(
            "m",
            &[r(true, Some(true)), r(false, Some(false)), r(false, None)],
        );
        assert!((s.fix_rate - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(s.files_parse, Some(0.5));
        assert_eq!(s.mean_seconds_to_gate, 100.0);
        assert!(markdown(&[s], &[]).contains("| m | 3 | 33% |"));
    }
}
