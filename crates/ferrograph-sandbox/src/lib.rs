//! Running code ferrograph did not write: the team's engineer's module and tests, the tests a
//! ticket-to-PR run writes, anything a model proposes that must run to be judged.
//!
//! What one [`run`] gives the program, where the machine allows it ([`confinement`]):
//! - **its own filesystem**: new mount namespace whose root is read-only and holds only the
//!   system's programs and libraries and the Python interpreter; the run's staged folder
//!   ([`stage`]) is *copied* into a tmpfs capped at [`Limits::disk_bytes`], and `/tmp` is
//!   another; nothing the program writes reaches the host, and no host file outside those
//!   read-only binds (the data directory, `/etc/shadow`, other repositories, sockets) exists
//!   for it;
//! - **its own identity**: as root, ferrograph starts the code as uid/gid
//!   [`DEFAULT_SANDBOX_UID`] (or `FERROGRAPH_SANDBOX_UID`), which owns nothing on the host; as a
//!   normal user, as root of a user namespace mapped to that user. Either way with no
//!   capabilities and `no_new_privs`;
//! - **its own pid, network, IPC and UTS namespaces**: no interface but loopback, no host
//!   process visible or signalable, and when the program ends *everything* it started dies
//!   with it (the pid namespace's init is the program);
//! - **limits for the whole run** through a cgroup ([`cgroup`]'s v2 or v1): memory (all its
//!   processes together), the number of processes, CPU seconds; plus `prlimit` per process
//!   and a wall-clock limit;
//! - a cleared environment (`PATH`, `HOME`, `LANG` and what the caller passes); output capped.
//!
//! Where the machine cannot confine code (no namespaces for this user), [`run`] **refuses**
//! with [`SandboxError::Unconfined`] unless [`Limits::allow_unconfined`] is set (the CLI's
//! `--unconfined`, or `FERROGRAPH_SANDBOX=unconfined`); such a run then has only the old
//! fences (a cleared environment, rlimits, a network namespace where one can be made, the
//! process group killed) and [`Output::confinement`] says so, for the run's record.
//!
//! The confinement is util-linux (`unshare`, `mount`, `pivot_root`, `setpriv`), present on
//! every Linux machine; see `confine.rs` for why not bubblewrap.

mod cgroup;
mod confine;
mod git_guard;
#[cfg(feature = "testing")]
pub mod testing;

pub use cgroup::{CgroupVersion, Usage};
pub use confine::DEFAULT_SANDBOX_UID;
pub use git_guard::{GitSnapshot, GitTampering};

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
    /// This machine cannot confine the code, and unconfined runs were not allowed.
    #[error("refused to run code ferrograph did not write without a sandbox: {why}. Run it anyway, as yourself and with your files in reach, only with `--unconfined` (or FERROGRAPH_SANDBOX=unconfined)")]
    Unconfined {
        /// Why the machine cannot confine it.
        why: String,
    },
    /// The sandbox could not be set up for this run (for example, the staged files do not
    /// fit [`Limits::disk_bytes`]).
    #[error("the sandbox could not be set up: {0}")]
    Setup(String),
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
    /// CPU seconds: of the whole run where a cgroup measures it, and of each process.
    pub cpu_seconds: u64,
    /// Memory (bytes): of all the run's processes together where a cgroup limits it, and the
    /// address space of each process.
    pub memory_bytes: u64,
    /// Processes and threads of the run together (a cgroup's `pids.max`).
    pub processes: u64,
    /// Size of the run's folder, and separately of its `/tmp` (tmpfs; charged to its memory).
    pub disk_bytes: u64,
    /// Largest file it may write (bytes).
    pub file_bytes: u64,
    /// Bytes kept of each of stdout and stderr (the rest is read and dropped).
    pub output_bytes: usize,
    /// Run even where the machine cannot confine code (see the crate docs). Default: the
    /// environment's `FERROGRAPH_SANDBOX=unconfined`, else refused.
    pub allow_unconfined: bool,
    /// More host folders or files the program may read (bound read-only at the same path).
    pub read_only: Vec<PathBuf>,
}

/// Whether `FERROGRAPH_SANDBOX=unconfined` is set (the documented switch; the CLI's
/// `--unconfined` sets it).
pub fn unconfined_allowed_by_env() -> bool {
    std::env::var("FERROGRAPH_SANDBOX").is_ok_and(|v| v.trim().eq_ignore_ascii_case("unconfined"))
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(60),
            cpu_seconds: 30,
            memory_bytes: 1 << 30,
            processes: 128,
            disk_bytes: 256 << 20,
            file_bytes: 64 << 20,
            output_bytes: 4 << 20,
            allow_unconfined: unconfined_allowed_by_env(),
            read_only: Vec::new(),
        }
    }
}

/// How a run was fenced in, for its record.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Confinement {
    /// Namespaces, a new read-only root, an unprivileged identity (see the crate docs).
    Confined {
        /// The uid inside (mapped to the invoking user where `user_namespace`).
        uid: u32,
        /// Whether a user namespace was made (ferrograph was not root).
        user_namespace: bool,
        /// The cgroup interface that limited the whole run, if any.
        cgroup: Option<CgroupVersion>,
    },
    /// Allowed to run without confinement; why the machine could not give it.
    Unconfined {
        /// Why.
        why: String,
    },
}

impl Confinement {
    /// Whether the run was confined.
    pub fn is_confined(&self) -> bool {
        matches!(self, Confinement::Confined { .. })
    }

    /// One line for a run's record: `confined (uid 4242420, cgroup v1)` or
    /// `UNCONFINED (--unconfined): why`.
    pub fn describe(&self) -> String {
        match self {
            Confinement::Confined {
                uid,
                user_namespace,
                cgroup,
            } => format!(
                "confined ({}, {})",
                if *user_namespace {
                    "user namespace, no capabilities".to_string()
                } else {
                    format!("uid {uid}")
                },
                match cgroup {
                    Some(v) => format!("cgroup {}", v.as_str()),
                    None => "no cgroup: per-process limits only".to_string(),
                }
            ),
            Confinement::Unconfined { why } => {
                format!("UNCONFINED (allowed by --unconfined): {why}")
            }
        }
    }
}

/// Whether this machine can confine runs, or why not (probed once per process).
pub fn confinement() -> Result<(), String> {
    confine::mode().map(|_| ())
}

impl Output {
    /// A line for each whole-run limit the run reached (memory, processes, CPU), for its
    /// record; empty when it reached none.
    pub fn limits_reached(&self, limits: &Limits) -> Vec<String> {
        let mut out = Vec::new();
        if self.usage.memory_limit_hit {
            out.push(format!(
                "the run reached its memory limit of {} MiB",
                limits.memory_bytes >> 20
            ));
        }
        if self.usage.process_limit_hit {
            out.push(format!(
                "the run reached its limit of {} processes",
                limits.processes
            ));
        }
        if self.cpu_limit_hit {
            out.push(format!(
                "killed after {} CPU seconds: the run's CPU limit",
                limits.cpu_seconds
            ));
        }
        out
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
    /// How the run was fenced in.
    pub confinement: Confinement,
    /// What the run's cgroup measured (empty without one).
    pub usage: Usage,
    /// Whether the whole run's CPU time passed [`Limits::cpu_seconds`] and it was killed.
    pub cpu_limit_hit: bool,
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

/// Whether an unprivileged user and network namespace can be made (the unconfined runs'
/// network fence); probed once per process.
fn user_net_namespace() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| works("unshare", &["--user", "--net", "--map-root-user", "true"]))
}

/// Whether runs here get a network namespace (confined, or unconfined where an unprivileged
/// user and network namespace can still be made).
pub fn network_namespaces() -> bool {
    confinement().is_ok() || user_net_namespace()
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

fn prlimit_wrapper(limits: &Limits, nproc: Option<u64>) -> Vec<String> {
    if !prlimit_available() {
        return Vec::new();
    }
    let mut v = vec![
        "prlimit".to_string(),
        format!("--as={}", limits.memory_bytes),
        format!("--cpu={}", limits.cpu_seconds),
        format!("--fsize={}", limits.file_bytes),
    ];
    if let Some(n) = nproc {
        v.push(format!("--nproc={n}"));
    }
    v.push("--".to_string());
    v
}

/// A name no other run of any ferrograph process on this machine has: `prefix-pid-n`.
pub(crate) fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The setup script's own exit status and message prefix, for a failure before the program.
const SETUP_FAILED: i32 = 125;
const SETUP_MARK: &str = "ferrograph-sandbox: setup failed";

/// Runs `argv` in a copy of `dir` under `limits`, with `env` added to the cleared environment.
/// See the crate docs for what fences it; `dir` itself is never written by a confined run.
pub async fn run(
    dir: &Path,
    argv: &[String],
    env: &[(String, String)],
    limits: &Limits,
) -> Result<Output, SandboxError> {
    run_with(confine::mode(), dir, argv, env, limits).await
}

/// [`run`] with the machine's confinement given (the refusal path is tested with one that
/// failed).
async fn run_with(
    mode: Result<confine::Mode, String>,
    dir: &Path,
    argv: &[String],
    env: &[(String, String)],
    limits: &Limits,
) -> Result<Output, SandboxError> {
    let Some(program) = argv.first() else {
        return Err(SandboxError::EmptyCommand);
    };
    let mode = match mode {
        Ok(m) => m,
        Err(why) if limits.allow_unconfined => {
            tracing::warn!("running code unconfined, as allowed: {why}");
            return run_unconfined(dir, argv, env, limits, why).await;
        }
        Err(why) => return Err(SandboxError::Unconfined { why }),
    };
    let group =
        cgroup::RunGroup::create(&unique_name("run"), limits.memory_bytes, limits.processes);
    let new_root =
        confine::new_root_dir().map_err(|e| SandboxError::io(&std::env::temp_dir(), e))?;
    let mut read_only = limits.read_only.clone();
    if let Ok(py) = python() {
        read_only.extend(confine::python_roots(&py));
    }
    // Where no cgroup counts processes, the per-uid process limit does (only for the
    // sandbox's own uid: a user namespace shares the user's count with everything else).
    let nproc = (group.is_none() && !mode.user_namespace).then_some(limits.processes);
    let mut inner = prlimit_wrapper(limits, nproc);
    inner.extend(argv.iter().cloned());
    let plan = confine::Plan {
        mode: &mode,
        new_root: &new_root,
        run_dir: dir,
        disk_bytes: limits.disk_bytes,
        procs: group.as_ref().map(|g| g.procs_files()).unwrap_or_default(),
        read_only,
    };
    let full = confine::command_line(&plan, &inner);
    let confinement = Confinement::Confined {
        uid: mode.uid,
        user_namespace: mode.user_namespace,
        cgroup: group.as_ref().map(|g| g.version()),
    };
    let ran = spawn_and_wait(
        program,
        &full,
        dir,
        env,
        limits,
        group.as_ref(),
        confinement,
    )
    .await;
    if let Some(g) = group {
        let _ = tokio::task::spawn_blocking(move || g.remove()).await;
    }
    let _ = std::fs::remove_dir_all(&new_root);
    let out = ran?;
    if out.code == Some(SETUP_FAILED) && out.stderr.contains(SETUP_MARK) {
        return Err(SandboxError::Setup(tail(out.stderr.trim(), 2000)));
    }
    Ok(out)
}

/// The old fences only (see [`Limits::allow_unconfined`]).
/// Makes this process non-dumpable before unconfined code runs as the same user: its
/// `/proc/<pid>/environ` (API keys, `FERROGRAPH_CHECKPOINT_KEY`), memory and fds then belong
/// to root, and the code cannot ptrace it. (Against code running as root nothing unconfined
/// helps; that is what confinement is for.)
fn hide_our_environment() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        tracing::warn!(error = %e, "could not make this process non-dumpable");
    }
}

async fn run_unconfined(
    dir: &Path,
    argv: &[String],
    env: &[(String, String)],
    limits: &Limits,
    why: String,
) -> Result<Output, SandboxError> {
    hide_our_environment();
    let mut full: Vec<String> = Vec::new();
    let netns = user_net_namespace();
    if netns {
        full.extend(["unshare", "--user", "--net", "--map-root-user", "--"].map(String::from));
    }
    full.extend(prlimit_wrapper(limits, None));
    full.extend(argv.iter().cloned());
    let mut out = spawn_and_wait(
        &argv[0],
        &full,
        dir,
        env,
        limits,
        None,
        Confinement::Unconfined { why },
    )
    .await?;
    out.network = if netns {
        Network::Namespace
    } else {
        Network::Unconfined
    };
    Ok(out)
}

async fn spawn_and_wait(
    program: &str,
    full: &[String],
    dir: &Path,
    env: &[(String, String)],
    limits: &Limits,
    group: Option<&cgroup::RunGroup>,
    confinement: Confinement,
) -> Result<Output, SandboxError> {
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
        program: program.to_string(),
        source,
    })?;
    let pid = child.id();
    let keep = limits.output_bytes;
    // Both pipes are drained while the program runs (one that fills a pipe would otherwise
    // block until the time limit).
    let (out, out_task) = drain(child.stdout.take(), keep);
    let (err, err_task) = drain(child.stderr.take(), keep);
    let deadline = started + limits.timeout;
    let cpu_limit = Duration::from_secs(limits.cpu_seconds);
    let (mut code, mut timed_out, mut cpu_limit_hit) = (None, false, false);
    loop {
        tokio::select! {
            status = child.wait() => {
                code = status.ok().and_then(|s| s.code());
                break;
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                if Instant::now() >= deadline {
                    timed_out = true;
                    break;
                }
                if group.and_then(|g| g.cpu_time()).is_some_and(|t| t > cpu_limit) {
                    cpu_limit_hit = true;
                    break;
                }
            }
        }
    }
    // Whatever it started dies with it; a child that left the group and holds a pipe open
    // gets a moment, then the pipes are given up.
    kill_group(pid);
    if let Some(g) = group {
        g.kill_all();
    }
    let _ = child.wait().await;
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = out_task.await;
        let _ = err_task.await;
    })
    .await;
    let (out, err) = (taken(&out), taken(&err));
    let usage = group.map(|g| g.usage()).unwrap_or_default();
    tracing::debug!(
        program,
        ?code,
        timed_out,
        cpu_limit_hit,
        ?usage,
        "sandboxed run ended"
    );
    Ok(Output {
        stdout: out,
        stderr: err,
        code,
        timed_out,
        network: Network::Namespace,
        confinement,
        usage,
        cpu_limit_hit,
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

    #[tokio::test]
    async fn refused_without_confinement_unless_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let no = || Err("no namespaces for this user".to_string());
        let refused = run_with(
            no(),
            dir.path(),
            &sh("echo ran"),
            &[],
            &Limits {
                allow_unconfined: false,
                ..Limits::default()
            },
        )
        .await;
        match refused {
            Err(e @ SandboxError::Unconfined { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("no namespaces for this user"), "{msg}");
                assert!(msg.contains("--unconfined"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
        let allowed = run_with(
            no(),
            dir.path(),
            &sh("echo ran"),
            &[],
            &Limits {
                allow_unconfined: true,
                ..Limits::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(allowed.stdout.trim(), "ran");
        assert!(!allowed.confinement.is_confined());
        assert!(allowed.confinement.describe().starts_with("UNCONFINED"));
        // Code let run unconfined as our user cannot read our environment through /proc.
        #[cfg(target_os = "linux")]
        assert!(!nix::sys::prctl::get_dumpable().unwrap());
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
