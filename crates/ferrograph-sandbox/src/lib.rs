//! Running code ferrograph did not write: the team's engineer's module and tests, the tests a
//! ticket-to-PR run writes, anything a model proposes that must run to be judged.
//!
//! What one [`run`] gives the program:
//! - a folder of its own ([`stage`] writes the files, refusing absolute paths and `..`), as
//!   its working directory and `HOME`;
//! - a cleared environment (`PATH`, `HOME`, `LANG` and what the caller passes);
//! - `prlimit` limits on address space, CPU seconds and file size ([`Limits`]);
//! - a new user and network namespace through `unshare` where the kernel allows one
//!   ([`network_namespaces`]); where it does not, [`Output::network`] says so and the
//!   caller decides (the Python runners then refuse sockets themselves);
//! - its own process group, killed when the wall-clock limit passes **and** when the
//!   program ends, so that nothing it started outlives the run.
//!
//! It does not yet confine the filesystem beyond the working directory (the program runs
//! as the user who started ferrograph): see the hardening issue in the README.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// What can go wrong around a run (a program that fails is an [`Output`], not an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// A staged path is absolute, has `..`, or is empty.
    #[error("refused path `{path}`: {why}")]
    Path {
        /// The path as given.
        path: String,
        /// Why it is refused.
        why: &'static str,
    },
    /// Reading or writing the run's folder failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The program could not be started.
    #[error("starting {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// No Python interpreter was found.
    #[error("python3 is needed to run this code: {0}")]
    NoPython(String),
    /// An empty command line.
    #[error("nothing to run: the command line is empty")]
    EmptyCommand,
}

impl SandboxError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        SandboxError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

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
    /// Bytes kept of each of stdout and stderr (the rest is read and dropped).
    pub output_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(60),
            cpu_seconds: 30,
            memory_bytes: 1 << 30,
            file_bytes: 64 << 20,
            output_bytes: 4 << 20,
        }
    }
}

/// How the network was cut for a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Network {
    /// A new, empty network namespace: no interface but loopback.
    Namespace,
    /// No namespace was available: the program itself must refuse sockets.
    Unconfined,
}

impl Network {
    /// `namespace` or `python` (the name the team's records have used).
    pub fn as_str(self) -> &'static str {
        match self {
            Network::Namespace => "namespace",
            Network::Unconfined => "python",
        }
    }
}

/// What a run printed and how it ended.
#[derive(Clone, Debug)]
pub struct Output {
    /// Standard output (lossy UTF-8, at most [`Limits::output_bytes`]).
    pub stdout: String,
    /// Standard error (the same).
    pub stderr: String,
    /// The exit code; `None` when killed by a signal or the time limit.
    pub code: Option<i32>,
    /// Whether the wall-clock limit killed it.
    pub timed_out: bool,
    /// How the network was cut.
    pub network: Network,
    /// Wall-clock time.
    pub duration: Duration,
}

impl Output {
    /// Whether it exited 0 in time.
    pub fn success(&self) -> bool {
        self.code == Some(0) && !self.timed_out
    }
}

/// The Python interpreter: `FERROGRAPH_PYTHON` (or the older `FERROGRAPH_TEAM_PYTHON`),
/// else the real executable behind `python3` on the PATH (a version manager's shim needs
/// the environment a run clears).
pub fn python() -> Result<PathBuf, SandboxError> {
    static PY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PY.get_or_init(|| {
        for var in ["FERROGRAPH_PYTHON", "FERROGRAPH_TEAM_PYTHON"] {
            if let Ok(p) = std::env::var(var) {
                if !p.trim().is_empty() {
                    return Ok(PathBuf::from(p));
                }
            }
        }
        let out = std::process::Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .map_err(|e| e.to_string())?;
        let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || p.is_empty() {
            return Err("python3 did not report its executable".into());
        }
        Ok(PathBuf::from(p))
    })
    .clone()
    .map_err(SandboxError::NoPython)
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

/// `path` checked as a plain relative name: not absolute, no `..`, not empty.
pub fn check_relative(path: &str) -> Result<PathBuf, SandboxError> {
    let refuse = |why| SandboxError::Path {
        path: path.to_string(),
        why,
    };
    if path.trim().is_empty() {
        return Err(refuse("empty"));
    }
    let p = Path::new(path);
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err(refuse("`..` is refused")),
            Component::RootDir | Component::Prefix(_) => return Err(refuse("absolute")),
        }
    }
    if out.as_os_str().is_empty() {
        return Err(refuse("empty"));
    }
    Ok(out)
}

/// Writes `files` (relative path → content) into a fresh `dir`, emptied first.
pub fn stage(dir: &Path, files: &BTreeMap<String, String>) -> Result<(), SandboxError> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| SandboxError::io(dir, e))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| SandboxError::io(dir, e))?;
    for (p, text) in files {
        let path = dir.join(check_relative(p)?);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| SandboxError::io(parent, e))?;
        }
        std::fs::write(&path, text).map_err(|e| SandboxError::io(&path, e))?;
    }
    Ok(())
}

/// Reads a pipe to its end in a task of its own, keeping the first `keep` bytes in `into`.
fn drain<R>(pipe: Option<R>, keep: usize) -> (Arc<Mutex<Vec<u8>>>, tokio::task::JoinHandle<()>)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    let into = Arc::new(Mutex::new(Vec::new()));
    let sink = into.clone();
    let task = tokio::spawn(async move {
        let Some(mut p) = pipe else { return };
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            match p.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if let Ok(mut buf) = sink.lock() {
                        let room = keep.saturating_sub(buf.len());
                        buf.extend_from_slice(&chunk[..n.min(room)]);
                    }
                }
            }
        }
    });
    (into, task)
}

fn taken(buf: &Mutex<Vec<u8>>) -> String {
    buf.lock()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Kills the process group `pid` leads (the program and whatever it started).
fn kill_group(pid: Option<u32>) {
    #[cfg(unix)]
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    #[cfg(not(unix))]
    let _ = pid;
}

/// Runs `argv` in `dir` under `limits`, with `env` added to the cleared environment.
pub async fn run(
    dir: &Path,
    argv: &[String],
    env: &[(String, String)],
    limits: &Limits,
) -> Result<Output, SandboxError> {
    let Some(program) = argv.first() else {
        return Err(SandboxError::EmptyCommand);
    };
    let netns = network_namespaces();
    let mut full: Vec<String> = Vec::new();
    if netns {
        full.extend(["unshare", "--user", "--net", "--map-root-user", "--"].map(String::from));
    }
    if prlimit_available() {
        full.extend([
            "prlimit".to_string(),
            format!("--as={}", limits.memory_bytes),
            format!("--cpu={}", limits.cpu_seconds),
            format!("--fsize={}", limits.file_bytes),
            "--".to_string(),
        ]);
    }
    full.extend(argv.iter().cloned());
    let mut cmd = tokio::process::Command::new(&full[0]);
    cmd.args(&full[1..])
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", dir)
        .env("LANG", "C.UTF-8")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    #[cfg(unix)]
    cmd.process_group(0);
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|source| SandboxError::Spawn {
        program: program.clone(),
        source,
    })?;
    let pid = child.id();
    let keep = limits.output_bytes;
    // Both pipes are drained while the program runs (one that fills a pipe would otherwise
    // block until the time limit).
    let (out, out_task) = drain(child.stdout.take(), keep);
    let (err, err_task) = drain(child.stderr.take(), keep);
    let (code, timed_out) = match tokio::time::timeout(limits.timeout, child.wait()).await {
        Ok(status) => (status.ok().and_then(|s| s.code()), false),
        Err(_) => (None, true),
    };
    // Whatever it started dies with it; a child that left the group and holds a pipe open
    // gets a moment, then the pipes are given up.
    kill_group(pid);
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = out_task.await;
        let _ = err_task.await;
    })
    .await;
    let (out, err) = (taken(&out), taken(&err));
    tracing::debug!(program, ?code, timed_out, "sandboxed run ended");
    Ok(Output {
        stdout: out,
        stderr: err,
        code,
        timed_out,
        network: if netns {
            Network::Namespace
        } else {
            Network::Unconfined
        },
        duration: started.elapsed(),
    })
}

/// The last `max` bytes of `s` (at a char boundary), marked as cut.
pub fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &s[start..])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["/bin/sh".into(), "-c".into(), script.into()]
    }

    #[tokio::test]
    async fn a_run_sees_its_folder_and_a_cleared_environment() {
        let dir = tempfile::tempdir().unwrap();
        let files = BTreeMap::from([("a/b.txt".to_string(), "hello".to_string())]);
        stage(dir.path(), &files).unwrap();
        std::env::set_var("FERROGRAPH_SANDBOX_SECRET", "s3cret");
        let out = run(
            dir.path(),
            &sh("cat a/b.txt; echo \" $FERROGRAPH_SANDBOX_SECRET|$EXTRA\"; exit 3"),
            &[("EXTRA".into(), "x".into())],
            &Limits::default(),
        )
        .await
        .unwrap();
        assert_eq!(out.stdout.trim(), "hello |x");
        assert_eq!(out.code, Some(3));
        assert!(!out.success());
    }

    #[tokio::test]
    async fn the_time_limit_and_the_end_kill_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            timeout: Duration::from_secs(2),
            ..Limits::default()
        };
        let started = Instant::now();
        let out = run(dir.path(), &sh("sleep 30"), &[], &limits)
            .await
            .unwrap();
        assert!(out.timed_out);
        assert!(started.elapsed() < Duration::from_secs(10));
        // A background child that keeps the pipes open dies with the program.
        let started = Instant::now();
        let out = run(
            dir.path(),
            &sh("(sleep 30; touch late) & echo started"),
            &[],
            &Limits::default(),
        )
        .await
        .unwrap();
        assert!(!out.timed_out, "{out:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(out.stdout.contains("started"));
    }

    #[tokio::test]
    async fn output_is_capped() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            output_bytes: 1000,
            ..Limits::default()
        };
        let out = run(dir.path(), &sh("yes | head -c 100000"), &[], &limits)
            .await
            .unwrap();
        assert_eq!(out.stdout.len(), 1000);
        assert!(out.success());
    }

    #[test]
    fn staged_paths_stay_inside() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["../x", "/etc/passwd", "", "a/../../x"] {
            let files = BTreeMap::from([(bad.to_string(), String::new())]);
            assert!(stage(&dir.path().join("s"), &files).is_err(), "{bad}");
        }
        assert_eq!(tail("abcdef", 3), "…def");
    }
}
