//! Running the proposed tests before the gate: a copy of the repository at the base commit
//! with the tests only (they should fail: they show the ticket's behaviour), and one with
//! the change too (they should pass), each in the sandbox ([`ferrograph_sandbox`]).
//!
//! Python test files are run by our own runner (`run_tests.py`: unittest cases and plain
//! `test_*` functions; no pytest needed). Test files in other languages are not run: their
//! build tools (Maven, Gradle, cargo) would need the network or a prepared cache.

use crate::repo::{self, FileChange};
use crate::TicketPrError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

const RUNNER: &str = include_str!("run_tests.py");
const RUNNER_NAME: &str = "_ferrograph_tests.py";
const MARK: &str = "@@FERROGRAPH_TESTS@@";

/// Largest file copied into a test run's tree.
const MAX_FILE_BYTES: usize = 2 << 20;
/// Largest tree (text files together) copied into a test run.
const MAX_TREE_BYTES: usize = 64 << 20;
/// Characters of a run's output kept for the gate and the model.
const OUTPUT_CHARS: usize = 3000;

/// One test's result.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TestCase {
    /// `path::function` or unittest's id.
    pub id: String,
    /// `passed`, `failed`, `error` or `skipped`.
    pub outcome: String,
    /// The traceback (failures and errors).
    #[serde(default)]
    pub detail: String,
}

/// What one tree's run gave.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TestOutcome {
    /// Every test.
    pub tests: Vec<TestCase>,
    /// Whether the time limit killed it.
    pub timed_out: bool,
    /// What the run printed besides the result (the tail), or why it reported nothing.
    pub output: String,
}

impl TestOutcome {
    /// Tests that passed.
    pub fn passed(&self) -> usize {
        self.count("passed")
    }

    /// Tests that failed or errored.
    pub fn failing(&self) -> Vec<&TestCase> {
        self.tests
            .iter()
            .filter(|t| t.outcome == "failed" || t.outcome == "error")
            .collect()
    }

    fn count(&self, outcome: &str) -> usize {
        self.tests.iter().filter(|t| t.outcome == outcome).count()
    }

    /// Whether every test passed and at least one ran.
    pub fn all_passed(&self) -> bool {
        !self.timed_out && self.passed() > 0 && self.failing().is_empty()
    }

    /// `3 passed, 1 failed (tests/test_x.py::test_y)`.
    pub fn line(&self) -> String {
        let failing = self.failing();
        let mut line = format!("{} passed, {} failing", self.passed(), failing.len());
        if !failing.is_empty() {
            let ids: Vec<&str> = failing.iter().take(4).map(|t| t.id.as_str()).collect();
            line.push_str(&format!(" ({})", ids.join(", ")));
        }
        if self.timed_out {
            line.push_str(", killed at the time limit");
        }
        line
    }

    /// The failures' tracebacks (or the output when no test reported), for the model.
    pub fn report(&self) -> String {
        let failing = self.failing();
        let text = if failing.is_empty() {
            self.output.clone()
        } else {
            failing
                .iter()
                .map(|t| {
                    format!(
                        "{} {}:\n{}",
                        t.id,
                        t.outcome.to_uppercase(),
                        t.detail.trim_end()
                    )
                })
                .collect::<Vec<_>>()
                .join("\n\n")
        };
        ferrograph_sandbox::tail(&text, OUTPUT_CHARS)
    }
}

/// One run of the proposed tests, on the base tree and on the changed tree.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TestRun {
    /// The generation of the change it ran.
    pub generation: u32,
    /// Corrections made from earlier runs before this one.
    pub correction: u32,
    /// What was run (`python3 -I _ferrograph_tests.py tests/test_x.py`).
    pub command: String,
    /// How the network was cut (`namespace`, or `python` inside the runner).
    pub network: String,
    /// How the runs were fenced in (`confined (uid 4242420, cgroup v1)`, or `UNCONFINED …`
    /// where the user allowed it).
    #[serde(default)]
    pub confinement: String,
    /// The tests on the base commit (they should fail).
    pub before: TestOutcome,
    /// The tests with the change (they should pass).
    pub after: TestOutcome,
}

impl TestRun {
    /// What is wrong with this run, for the model to correct; `None` when the tests fail
    /// without the change and pass with it.
    pub fn problem(&self) -> Option<String> {
        if !self.after.all_passed() {
            return Some(format!(
                "With your change the tests do not pass ({}):\n{}",
                self.after.line(),
                self.after.report()
            ));
        }
        if self.before.all_passed() {
            return Some(
                "The tests also pass on the code without your change, so they do not show what the ticket describes: make the test check the behaviour the ticket asks for, so that it fails without the change."
                    .into(),
            );
        }
        None
    }

    /// The gate's line: `Tests run: before 0 passed, 1 failing; after 1 passed, 0 failing —
    /// they show the fix`.
    pub fn line(&self) -> String {
        let verdict = if self.problem().is_none() {
            "the tests fail without the change and pass with it"
        } else if !self.after.all_passed() {
            "the tests do not pass with the change"
        } else {
            "the tests pass without the change too: they do not show the ticket's behaviour"
        };
        format!(
            "without the change: {}; with it: {} — {verdict} (sandbox: {})",
            self.before.line(),
            self.after.line(),
            if self.confinement.is_empty() {
                format!("network {}", self.network)
            } else {
                self.confinement.clone()
            }
        )
    }
}

/// Why `tests` cannot be run here, or `None` when they can.
pub fn not_runnable(tests: &[FileChange]) -> Option<String> {
    if tests.is_empty() {
        return Some("no test was proposed".into());
    }
    let other: Vec<&str> = tests
        .iter()
        .filter(|t| !t.file_path.ends_with(".py"))
        .map(|t| t.file_path.as_str())
        .collect();
    if !other.is_empty() {
        return Some(format!(
            "only Python tests are run here ({} would need its build tool)",
            other.join(", ")
        ));
    }
    if let Err(e) = ferrograph_sandbox::python() {
        return Some(e.to_string());
    }
    None
}

/// Whether the sandbox's Python can import pytest (once per process).
pub fn pytest_available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        ferrograph_sandbox::python().is_ok_and(|py| {
            std::process::Command::new(py)
                .args(["-I", "-c", "import pytest"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    })
}

/// Whether our runner can run a Python test file with `text` here (one that imports pytest
/// needs pytest installed).
pub fn runnable_test_file(text: &str) -> bool {
    let needs_pytest = text.lines().any(|l| {
        let t = l.trim_start();
        t.starts_with("import pytest") || t.starts_with("from pytest") || t.starts_with("@pytest")
    });
    !needs_pytest || pytest_available()
}

/// The text files of the repository at `commit`, to stage test runs from.
pub fn base_tree(
    repo: &git2::Repository,
    commit: &str,
) -> Result<BTreeMap<String, String>, TicketPrError> {
    repo::text_tree(repo, commit, MAX_FILE_BYTES, MAX_TREE_BYTES)
}

/// Runs `tests` against `base` (from [`base_tree`]) and against it with `changes`, staged
/// under `dir` (removed afterwards).
pub async fn run(
    base: &BTreeMap<String, String>,
    changes: &[FileChange],
    tests: &[FileChange],
    dir: &Path,
    limits: &ferrograph_sandbox::Limits,
) -> Result<TestRun, TicketPrError> {
    let python = ferrograph_sandbox::python()?;
    let mut argv = vec![
        python.display().to_string(),
        "-I".into(),
        "-B".into(),
        RUNNER_NAME.into(),
    ];
    let netns = ferrograph_sandbox::network_namespaces();
    if !netns {
        argv.push("--block-network".into());
    }
    argv.extend(tests.iter().map(|t| t.file_path.clone()));
    let command = format!(
        "python3 -I {RUNNER_NAME} {}",
        tests
            .iter()
            .map(|t| t.file_path.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut outcomes = Vec::new();
    let mut network = String::new();
    let mut confinement = String::new();
    for (name, with) in [
        ("before", tests.to_vec()),
        ("after", [changes, tests].concat()),
    ] {
        let mut files: BTreeMap<String, String> = base.clone();
        for c in with {
            files.insert(c.file_path, c.new_content);
        }
        files.insert(RUNNER_NAME.into(), RUNNER.into());
        let tree = dir.join(name);
        ferrograph_sandbox::stage(&tree, &files)?;
        let env = [("PYTHONDONTWRITEBYTECODE".to_string(), "1".to_string())];
        let ran = ferrograph_sandbox::run(&tree, &argv, &env, limits).await;
        let _ = std::fs::remove_dir_all(&tree);
        let ran = ran?;
        network = ran.network.as_str().to_string();
        confinement = ran.confinement.describe();
        outcomes.push(outcome(&ran, limits));
    }
    let _ = std::fs::remove_dir_all(dir);
    let after = outcomes.pop().unwrap_or_default();
    let before = outcomes.pop().unwrap_or_default();
    Ok(TestRun {
        generation: 0,
        correction: 0,
        command,
        network,
        confinement,
        before,
        after,
    })
}

#[derive(Deserialize)]
struct RunnerOut {
    tests: Vec<TestCase>,
}

fn outcome(ran: &ferrograph_sandbox::Output, limits: &ferrograph_sandbox::Limits) -> TestOutcome {
    let parsed: Option<RunnerOut> = ran
        .stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(MARK))
        .and_then(|j| serde_json::from_str(j).ok());
    let printed: String = ran
        .stdout
        .lines()
        .filter(|l| !l.starts_with(MARK))
        .chain(ran.stderr.lines())
        .collect::<Vec<_>>()
        .join("\n");
    let mut output = ferrograph_sandbox::tail(&printed, OUTPUT_CHARS);
    if ran.timed_out {
        output.push_str(&format!(
            "\n[killed after {} s: the time limit]",
            limits.timeout.as_secs()
        ));
    }
    match parsed {
        Some(r) => TestOutcome {
            tests: r.tests,
            timed_out: ran.timed_out,
            output,
        },
        None => TestOutcome {
            tests: Vec::new(),
            timed_out: ran.timed_out,
            output: format!("the test runner reported nothing:\n{output}"),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn change(path: &str, text: &str) -> FileChange {
        FileChange {
            file_path: path.into(),
            description: String::new(),
            new_content: text.into(),
        }
    }

    fn repo_with(files: &[(&str, &str)]) -> (tempfile::TempDir, git2::Repository, String) {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        let mut index = repo.index().unwrap();
        for (p, t) in files {
            let full = dir.path().join(p);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(&full, t).unwrap();
            index.add_path(Path::new(p)).unwrap();
        }
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        let sig = git2::Signature::now("t", "t@example.invalid").unwrap();
        let id = repo
            .commit(Some("HEAD"), &sig, &sig, "base", &tree, &[])
            .unwrap();
        drop(tree);
        (dir, repo, id.to_string())
    }

    #[tokio::test]
    async fn a_test_that_shows_the_fix_fails_before_and_passes_after() {
        if ferrograph_sandbox::python().is_err() {
            return;
        }
        let (dir, repo, base) = repo_with(&[
            ("src/pkg/__init__.py", ""),
            (
                "src/pkg/late.py",
                "def late(due, today):\n    return due < today\n",
            ),
        ]);
        let fix = change(
            "src/pkg/late.py",
            "def late(due, today):\n    return due is not None and due < today\n",
        );
        let test = change(
            "tests/test_late.py",
            "from pkg.late import late\n\n\ndef test_no_due_date_is_not_late():\n    assert late(None, 3) is False\n\n\ndef test_past_is_late():\n    assert late(1, 3)\n",
        );
        let run_dir = dir.path().join("run");
        let limits = ferrograph_sandbox::Limits::default();
        let r = run(
            &base_tree(&repo, &base).unwrap(),
            std::slice::from_ref(&fix),
            std::slice::from_ref(&test),
            &run_dir,
            &limits,
        )
        .await
        .unwrap();
        assert_eq!(r.after.passed(), 2, "{:?}", r.after);
        assert_eq!(r.before.failing().len(), 1, "{:?}", r.before);
        assert!(
            r.before.failing()[0].detail.contains("TypeError"),
            "{:?}",
            r.before
        );
        assert_eq!(r.problem(), None);
        assert!(r
            .line()
            .contains("fail without the change and pass with it"));
        assert!(!run_dir.exists(), "the staged trees are removed");

        // A test that passes without the change does not show the bug.
        let weak = change(
            "tests/test_late.py",
            "from pkg.late import late\n\n\ndef test_past_is_late():\n    assert late(1, 3)\n",
        );
        let r = run(
            &base_tree(&repo, &base).unwrap(),
            std::slice::from_ref(&fix),
            &[weak],
            &run_dir,
            &limits,
        )
        .await
        .unwrap();
        assert!(r
            .problem()
            .unwrap()
            .contains("also pass on the code without"));

        // A broken import and a fixture argument are failures the model is told about.
        let broken = change("tests/test_late.py", "from pkg.lateness import late\n");
        let r = run(
            &base_tree(&repo, &base).unwrap(),
            std::slice::from_ref(&fix),
            &[broken],
            &run_dir,
            &limits,
        )
        .await
        .unwrap();
        let p = r.problem().unwrap();
        assert!(p.contains("ModuleNotFoundError"), "{p}");
        let fixture = change(
            "tests/test_late.py",
            "def test_x(tmp_path):\n    assert tmp_path\n",
        );
        let r = run(
            &base_tree(&repo, &base).unwrap(),
            &[fix],
            &[fixture],
            &run_dir,
            &limits,
        )
        .await
        .unwrap();
        assert!(r
            .problem()
            .unwrap()
            .contains("pytest fixtures are not available"));
    }

    #[test]
    fn only_python_tests_run_and_pytest_files_need_pytest() {
        assert!(not_runnable(&[]).unwrap().contains("no test"));
        assert!(not_runnable(&[change("a/BTest.java", "")])
            .unwrap()
            .contains("only Python"));
        assert!(runnable_test_file("import unittest\n"));
        assert_eq!(
            runnable_test_file("import pytest\n\ndef test_x():\n    pass\n"),
            pytest_available()
        );
    }
}
