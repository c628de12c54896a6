//! Running the engineer's code for real: a copy of the files in a fresh folder, then
//! `python3 -I` under [`ferrograph_sandbox::run`]: new mount, pid and network namespaces with
//! a read-only root, an unprivileged identity, a cgroup for the whole run, everything killed
//! when it ends. Where the machine cannot confine code the run is refused unless the user
//! allowed unconfined runs (`--unconfined`); the result's `confinement` says which. The
//! staged folder is removed after the run, and the workspace's `.git` (hooks, config) is
//! checked and put back if anything changed it.

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
    let r = run_tests_in(dir, limits, run_id).await;
    let _ = std::fs::remove_dir_all(dir);
    r
}

/// [`run_tests`] with `workspace`'s `.git` checked around the run: anything the run changed
/// there (a planted hook, a rewritten config) is put back and reported in the output.
pub async fn run_tests_guarded(
    dir: &Path,
    limits: &Limits,
    run_id: &str,
    workspace: &Path,
) -> Result<TestResults, TeamError> {
    let snapshot = ferrograph_sandbox::GitSnapshot::take(workspace);
    let mut r = run_tests(dir, limits, run_id).await?;
    if let Some(t) = snapshot.map(|s| s.restore_changes()).filter(|t| t.any()) {
        tracing::warn!(restored = ?t.restored, failed = ?t.failed, "a sandboxed run changed the workspace's .git");
        r.output = format!(
            "[the run changed the workspace's .git; {}]\n{}",
            t.describe(),
            r.output
        );
        r.failed = r.failed.max(1);
        r.failed_test_ids.push("<workspace .git changed>".into());
    }
    Ok(r)
}

async fn run_tests_in(dir: &Path, limits: &Limits, run_id: &str) -> Result<TestResults, TeamError> {
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
    let reached = ran.limits_reached(limits);
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
    let confinement = ran.confinement.describe();
    for line in reached {
        output.push_str(&format!("\n[{line}]"));
    }
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
            confinement,
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
            confinement,
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

    /// The hostile brief of the hardening issue: its tests try each escape the probe found
    /// (the data directory, `/etc/shadow`, the workspace's git hooks, a host socket, a detached
    /// child) and assert that each is refused; the host is checked after the run.
    #[tokio::test]
    async fn a_hostile_suite_is_contained_and_the_host_is_unchanged() {
        if !ferrograph_sandbox::testing::confined_or_skip(
            "a_hostile_suite_is_contained_and_the_host_is_unchanged",
        ) {
            return;
        }
        let host = tempfile::tempdir().unwrap();
        let data = host.path().join("data");
        std::fs::create_dir_all(data.join("store")).unwrap();
        std::fs::write(data.join("store/db"), "the brief's text").unwrap();
        let ws = host.path().join("workspace");
        std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
        std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
        let sock = host.path().join("host.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let test = format!(
            "import os, socket, subprocess, unittest\n\nDATA = {data:?}\nWS = {ws:?}\nSOCK = {sock:?}\n\n\nclass Escapes(unittest.TestCase):\n    def test_data_dir(self):\n        with self.assertRaises(OSError):\n            open(os.path.join(DATA, 'store', 'db')).read()\n        with self.assertRaises(OSError):\n            open(os.path.join(DATA, 'planted'), 'w').write('x')\n\n    def test_shadow(self):\n        with self.assertRaises(OSError):\n            open('/etc/shadow').read()\n\n    def test_hook(self):\n        with self.assertRaises(OSError):\n            open(os.path.join(WS, '.git', 'hooks', 'pre-commit'), 'w').write('#!/bin/sh\\n')\n\n    def test_socket(self):\n        s = socket.socket(socket.AF_UNIX)\n        with self.assertRaises(OSError):\n            s.connect(SOCK)\n\n    def test_detached_child(self):\n        subprocess.Popen(['setsid', 'sleep', '4321.5'], start_new_session=True)\n",
            data = data.display().to_string(),
            ws = ws.display().to_string(),
            sock = sock.display().to_string(),
        );
        let before = ferrograph_sandbox::testing::tree(host.path());
        let d = host.path().join("run");
        stage(&d, &files(&[("test_escapes.py", &test)])).unwrap();
        let r = run_tests_guarded(&d, &Limits::default(), "hostile", &ws)
            .await
            .unwrap();
        assert_eq!(r.total_tests, 5, "{}", r.output);
        assert!(r.passing(), "{}", r.output);
        assert!(r.confinement.starts_with("confined"), "{}", r.confinement);
        // The staged folder is gone, and everything else is as it was.
        assert!(!d.exists());
        assert_eq!(ferrograph_sandbox::testing::tree(host.path()), before);
        let survivors = ferrograph_sandbox::testing::host_processes_with("4321.5");
        assert_eq!(survivors.len(), 0, "{survivors:?}");
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
