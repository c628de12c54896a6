//! The confined command line: util-linux's `unshare` makes new mount, pid, network, IPC and
//! UTS namespaces (and a user namespace when ferrograph is not root), then `setup.sh` builds a
//! new root in which only the run's folder and `/tmp` are writable (each a size-capped tmpfs),
//! and starts the program through `setpriv` as an unprivileged user with no capabilities and
//! `no_new_privs`.
//!
//! Why util-linux and not bubblewrap: it is on every Linux machine ferrograph runs on (no
//! package to install on an air-gapped box), and as root it can drop to a uid that owns
//! nothing on the host, which bubblewrap run by root cannot (it maps the sandbox's user to
//! host root).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The setup script (see the module docs).
const SETUP: &str = include_str!("setup.sh");

/// The uid and gid the code runs as when ferrograph runs as root: `FERROGRAPH_SANDBOX_UID`,
/// else this one, chosen high and unusual so that no host file or process has it.
pub const DEFAULT_SANDBOX_UID: u32 = 4_242_420;

/// How this machine confines runs (found once per process by [`mode`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mode {
    /// A user namespace is made (ferrograph is not root): the code runs as root of that
    /// namespace with every capability dropped, mapped to the invoking user.
    pub user_namespace: bool,
    /// The uid (and gid) inside.
    pub uid: u32,
}

fn euid_is_root() -> bool {
    #[cfg(unix)]
    {
        nix::unistd::geteuid().is_root()
    }
    #[cfg(not(unix))]
    {
        false
    }
}

fn sandbox_uid() -> u32 {
    std::env::var("FERROGRAPH_SANDBOX_UID")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&u: &u32| u != 0)
        .unwrap_or(DEFAULT_SANDBOX_UID)
}

/// The read-only paths every run gets: the system's programs and libraries, the loader's
/// cache and the time zone. The Python interpreter's own prefix is added by [`python_roots`].
const SYSTEM: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/alternatives",
];

/// The folders an interpreter outside `/usr` needs (a pyenv or a virtual environment and its
/// base installation).
pub(crate) fn python_roots(python: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut add = |exe: &Path| {
        let real = exe.canonicalize().unwrap_or_else(|_| exe.to_path_buf());
        for p in [exe, real.as_path()] {
            if let Some(prefix) = p.parent().and_then(Path::parent) {
                if !prefix.starts_with("/usr") && prefix != Path::new("/") {
                    out.push(prefix.to_path_buf());
                }
            }
        }
    };
    add(python);
    // A virtual environment names its base interpreter's bin folder in pyvenv.cfg.
    if let Some(prefix) = python.parent().and_then(Path::parent) {
        if let Ok(cfg) = std::fs::read_to_string(prefix.join("pyvenv.cfg")) {
            for line in cfg.lines() {
                if let Some((k, v)) = line.split_once('=') {
                    if k.trim() == "home" {
                        add(&Path::new(v.trim()).join("python3"));
                    }
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// What one confined run needs besides the program.
pub(crate) struct Plan<'a> {
    pub mode: &'a Mode,
    /// An empty host folder to build the new root on.
    pub new_root: &'a Path,
    /// The run's staged folder (copied into the sandbox).
    pub run_dir: &'a Path,
    pub disk_bytes: u64,
    pub procs: Vec<PathBuf>,
    pub read_only: Vec<PathBuf>,
}

/// The full command line (`unshare … sh -c SETUP …`) for `inner` (already wrapped in
/// `prlimit` where wanted).
pub(crate) fn command_line(plan: &Plan<'_>, inner: &[String]) -> Vec<String> {
    let mut v: Vec<String> = vec!["unshare".into()];
    if plan.mode.user_namespace {
        v.extend(["--user", "--map-root-user"].map(String::from));
    }
    v.extend(
        [
            "--mount",
            "--pid",
            "--net",
            "--ipc",
            "--uts",
            "--fork",
            "--kill-child",
            "--",
            "/bin/sh",
            "-c",
            SETUP,
            "ferrograph-sandbox",
        ]
        .map(String::from),
    );
    v.push(plan.new_root.display().to_string());
    v.push(plan.run_dir.display().to_string());
    v.push(plan.disk_bytes.to_string());
    v.push(plan.mode.uid.to_string());
    v.push(plan.mode.uid.to_string());
    v.push(
        plan.procs
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":"),
    );
    let mut ro: Vec<PathBuf> = SYSTEM.iter().map(PathBuf::from).collect();
    ro.extend(plan.read_only.iter().cloned());
    for p in ro {
        let s = p.display().to_string();
        // The script's own separator, and paths it cannot bind safely, are left out.
        if s != "--" && p.is_absolute() && !s.contains(':') {
            v.push(s);
        }
    }
    v.push("--".into());
    v.extend(inner.iter().cloned());
    v
}

/// A fresh, empty folder for a run's new root (removed by the caller).
pub(crate) fn new_root_dir() -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(crate::unique_name("ferrograph-sandbox-root"));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// How this machine confines runs, or why it cannot: found once, by running `true` through
/// the whole chain.
pub(crate) fn mode() -> Result<Mode, String> {
    static MODE: OnceLock<Result<Mode, String>> = OnceLock::new();
    MODE.get_or_init(probe).clone()
}

fn probe() -> Result<Mode, String> {
    let mode = if euid_is_root() {
        Mode {
            user_namespace: false,
            uid: sandbox_uid(),
        }
    } else {
        Mode {
            user_namespace: true,
            uid: 0,
        }
    };
    let root = new_root_dir().map_err(|e| format!("cannot make a folder for the new root: {e}"))?;
    let run = root.with_extension("run");
    let result = (|| {
        std::fs::create_dir_all(&run).map_err(|e| format!("{}: {e}", run.display()))?;
        let plan = Plan {
            mode: &mode,
            new_root: &root,
            run_dir: &run,
            disk_bytes: 1 << 20,
            procs: Vec::new(),
            read_only: Vec::new(),
        };
        let argv = command_line(&plan, &["true".to_string()]);
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("cannot start unshare (util-linux): {e}"))?;
        if out.status.success() {
            Ok(mode.clone())
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            Err(format!(
                "namespaces are not available here ({}): {}",
                if mode.user_namespace {
                    "unprivileged user namespaces"
                } else {
                    "mount and pid namespaces as root"
                },
                err.trim().lines().last().unwrap_or("no message")
            ))
        }
    })();
    let _ = std::fs::remove_dir_all(&run);
    let _ = std::fs::remove_dir_all(&root);
    if let Err(e) = &result {
        tracing::warn!("the sandbox cannot confine code on this machine: {e}");
    }
    result
}
