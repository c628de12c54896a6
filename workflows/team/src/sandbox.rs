//! Running the engineer's code for real: a copy of the files in a fresh folder, `python3 -I`
//! in its own process group under `prlimit` (address space, CPU seconds, file size), in a new
//! user and network namespace through `unshare` when the kernel allows it (else socket
//! creation is refused inside Python, and the result says which), with a cleared environment
//! and a wall-clock timeout that kills the whole group.

use crate::domain::TestResults;
use crate::error::TeamError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::io::AsyncReadExt;

const RUNNER: &str = include_str!("runner.py");
const RUNNER_NAME: &str = "_ferrograph_runner.py";
const MARK: &str = "@@FERROGRAPH_RESULT@@";

/// Limits of one run.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Wall-clock time.
    pub timeout: Duration,
    /// CPU seconds.
    pub cpu_seconds: u64,
    /// Address space (bytes).
    pub memory_bytes: u64,
    /// Largest file it may write (bytes).
    pub file_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(60),
            cpu_seconds: 30,
            memory_bytes: 1 << 30,
            file_bytes: 64 << 20,
        }
    }
}

/// The Python interpreter: `FERROGRAPH_TEAM_PYTHON`, else the real executable behind
/// `python3` on the PATH (a version manager's shim needs the environment we clear).
pub fn python() -> Result<PathBuf, TeamError> {
    static PY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PY.get_or_init(|| {
        if let Ok(p) = std::env::var("FERROGRAPH_TEAM_PYTHON") {
            if !p.trim().is_empty() {
                return Ok(PathBuf::from(p));
            }
        }
        let out = std::process::Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .map_err(|e| format!("python3 is needed to run the team's code and tests: {e}"))?;
        let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || p.is_empty() {
            return Err("python3 did not report its executable".into());
        }
        Ok(PathBuf::from(p))
    })
    .clone()
    .map_err(TeamError::Sandbox)
}

fn works(cmd: &str, args: &[&str]) -> bool {
    std::process::Command::new(cmd)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether unprivileged user and network namespaces are available.
pub fn network_namespaces() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| works("unshare", &["--user", "--net", "--map-root-user", "true"]))
}

fn prlimit_available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| works("prlimit", &["--version"]))
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
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| TeamError::io(dir, e))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| TeamError::io(dir, e))?;
    for (p, text) in files {
        crate::workspace::check_path(p)?;
        let path = dir.join(p);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| TeamError::io(parent, e))?;
        }
        std::fs::write(&path, text).map_err(|e| TeamError::io(&path, e))?;
    }
    Ok(())
}

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &s[start..])
}

/// Everything a pipe gives, up to 4 MiB.
async fn drain<R: tokio::io::AsyncRead + Unpin>(pipe: Option<&mut R>) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(p) = pipe {
        let _ = p.take(4 << 20).read_to_end(&mut buf).await;
    }
    buf
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
    let mut argv: Vec<String> = Vec::new();
    if netns {
        argv.extend(["unshare", "--user", "--net", "--map-root-user", "--"].map(String::from));
    }
    if prlimit_available() {
        argv.extend([
            "prlimit".to_string(),
            format!("--as={}", limits.memory_bytes),
            format!("--cpu={}", limits.cpu_seconds),
            format!("--fsize={}", limits.file_bytes),
            "--".to_string(),
        ]);
    }
    argv.push(python.display().to_string());
    argv.extend(["-I", "-B", RUNNER_NAME].map(String::from));
    if !netns {
        argv.push("--block-network".into());
    }
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", dir)
        .env("LANG", "C.UTF-8")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    #[cfg(unix)]
    cmd.process_group(0);
    let started = std::time::Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| TeamError::Sandbox(format!("starting {}: {e}", argv[0])))?;
    let pid = child.id();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    // Both pipes are drained at once: a child that fills one while we wait on the other
    // would otherwise block until the time limit.
    let read = async {
        let (o, e) = tokio::join!(drain(stdout.as_mut()), drain(stderr.as_mut()));
        let status = child.wait().await;
        (o, e, status)
    };
    let (out, err, timed_out) = match tokio::time::timeout(limits.timeout, read).await {
        Ok((o, e, _)) => (o, e, false),
        Err(_) => {
            #[cfg(unix)]
            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            (Vec::new(), Vec::new(), true)
        }
    };
    let _ = std::fs::remove_file(&runner);
    let stdout = String::from_utf8_lossy(&out).into_owned();
    let stderr = String::from_utf8_lossy(&err).into_owned();
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
    let network = if netns { "namespace" } else { "python" }.to_string();
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
            output: cut(
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
            output: cut(
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
