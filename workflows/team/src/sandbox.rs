//! Running the engineer's code for real: a copy of the files in a fresh folder, then
//! `python3 -I` under [`ferrograph_sandbox::run`] (a cleared environment, rlimits, a new user
//! and network namespace where the kernel allows one, the whole process group killed at the
//! end or at the time limit). Without a namespace, socket creation is refused inside Python
//! and the result says which.

use crate::domain::TestResults;
use crate::error::TeamError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use ferrograph_sandbox::Limits;

const RUNNER: &str = include_str!("runner.py");
const RUNNER_NAME: &str = "_ferrograph_runner.py";
const MARK: &str = "@@FERROGRAPH_RESULT@@";

/// The Python interpreter the code runs under (see [`ferrograph_sandbox::python`]).
pub fn python() -> Result<PathBuf, TeamError> {
    ferrograph_sandbox::python().map_err(|e| TeamError::Sandbox(e.to_string()))
}

/// Whether unprivileged user and network namespaces are available.
pub fn network_namespaces() -> bool {
    ferrograph_sandbox::network_namespaces()
}

#[derive(Deserialize)]
struct RunnerOut {
    total: u32,
    failed: Vec<String>,
    skipped: u32,
    test_ids: Vec<String>,
    coverage: BTreeMap<String, f64>,
    coverage_percent: f64,
    lint_errors: Vec<String>,
    max_complexity: u32,
    most_complex: String,
    duration: f64,
}

/// Writes `files` (workspace path → content) into a fresh `dir` (emptied first). Paths are
/// checked: plain relative names only.
pub fn stage(dir: &Path, files: &BTreeMap<String, String>) -> Result<(), TeamError> {
    for p in files.keys() {
        crate::workspace::check_path(p)?;
    }
    ferrograph_sandbox::stage(dir, files).map_err(|e| TeamError::Sandbox(e.to_string()))
}

/// Runs the suite of the files in `dir` (staged with [`stage`]) and reports.
pub async fn run_tests(
    dir: &Path,
    limits: &Limits,
    run_id: &str,
) -> Result<TestResults, TeamError> {
    let python = python()?;
    let runner = dir.join(RUNNER_NAME);
    std::fs::write(&runner, RUNNER).map_err(|e| TeamError::io(&runner, e))?;
    let netns = network_namespaces();
    let mut argv: Vec<String> = vec![python.display().to_string()];
    argv.extend(["-I", "-B", RUNNER_NAME].map(String::from));
    if !netns {
        argv.push("--block-network".into());
    }
    let started = std::time::Instant::now();
    let env = [("PYTHONDONTWRITEBYTECODE".to_string(), "1".to_string())];
    let ran = ferrograph_sandbox::run(dir, &argv, &env, limits)
        .await
        .map_err(|e| TeamError::Sandbox(e.to_string()))?;
    let timed_out = ran.timed_out;
    let _ = std::fs::remove_file(&runner);
    let (stdout, stderr) = (ran.stdout, ran.stderr);
    let parsed: Option<RunnerOut> = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(MARK))
        .and_then(|j| serde_json::from_str(j).ok());
    let mut output = stderr.clone();
    let program_out: String = stdout
        .lines()
        .filter(|l| !l.starts_with(MARK))
        .collect::<Vec<_>>()
        .join("\n");
    if !program_out.trim().is_empty() {
        output = format!("{program_out}\n{output}");
    }
    if timed_out {
        output.push_str(&format!(
            "\n[killed after {} s: the time limit]",
            limits.timeout.as_secs()
        ));
    }
    let network = ran.network.as_str().to_string();
    Ok(match parsed {
        Some(r) => TestResults {
            run_id: run_id.to_string(),
            total_tests: r.total,
            passed: r.total.saturating_sub(r.failed.len() as u32 + r.skipped),
            failed: r.failed.len() as u32,
            skipped: r.skipped,
            coverage_percent: r.coverage_percent,
            duration_seconds: r.duration,
            failed_test_ids: r.failed,
            test_ids: r.test_ids,
            coverage_report: r.coverage,
            lint_passed: r.lint_errors.is_empty(),
            max_complexity: r.max_complexity,
            most_complex: r.most_complex,
            output: ferrograph_sandbox::tail(
                &if r.lint_errors.is_empty() {
                    output
                } else {
                    format!("{}\n{output}", r.lint_errors.join("\n"))
                },
                6000,
            ),
            network,
            timed_out,
            run_at: crate::domain::now(),
        },
        None => TestResults {
            run_id: run_id.to_string(),
            duration_seconds: started.elapsed().as_secs_f64(),
            output: ferrograph_sandbox::tail(
                &format!(
                    "the test runner reported nothing{}\n{output}",
                    if timed_out { " (timed out)" } else { "" }
                ),
                6000,
            ),
            network,
            timed_out,
            failed: 1,
            failed_test_ids: vec!["<runner>".into()],
            run_at: crate::domain::now(),
            ..TestResults::default()
        },
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    fn files(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[tokio::test]
    async fn runs_tests_measures_coverage_and_cuts_the_network() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("s");
        stage(&d, &files(&[
            ("calc.py", "def add(a, b):\n    return a + b\n\n\ndef unused(x):\n    if x:\n        return 1\n    return 2\n"),
            ("test_calc.py", "import socket\nimport unittest\nimport calc\n\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(calc.add(2, 3), 5)\n\n    def test_network_is_cut(self):\n        with self.assertRaises(OSError):\n            socket.create_connection((\"1.1.1.1\", 53), timeout=2)\n\n    def test_wrong(self):\n        self.assertEqual(calc.add(2, 2), 5)\n"),
        ])).unwrap();
        let r = run_tests(&d, &Limits::default(), "r1").await.unwrap();
        assert_eq!(r.total_tests, 3, "{}", r.output);
        assert_eq!(
            r.failed_test_ids,
            vec!["test_calc.T.test_wrong"],
            "{}",
            r.output
        );
        assert_eq!(r.passed, 2);
        assert!(
            r.coverage_percent > 30.0 && r.coverage_percent < 90.0,
            "{}",
            r.coverage_percent
        );
        assert_eq!(r.max_complexity, 2);
        assert!(r.lint_passed);
        assert!(r.output.contains("test_wrong"), "{}", r.output);
        assert!(!r.passing());
    }

    #[tokio::test]
    async fn a_runaway_test_is_killed_and_a_syntax_error_fails_lint() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("s");
        stage(&d, &files(&[("test_loop.py", "import unittest\n\nclass T(unittest.TestCase):\n    def test_forever(self):\n        while True:\n            pass\n"), ("bad.py", "def f(:\n")])).unwrap();
        let limits = Limits {
            timeout: Duration::from_secs(3),
            ..Limits::default()
        };
        let started = std::time::Instant::now();
        let r = run_tests(&d, &limits, "r2").await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(20));
        assert!(r.timed_out, "{}", r.output);
        assert!(!r.passing());
        assert!(stage(&d, &files(&[("../escape.py", "")])).is_err());
    }
}
