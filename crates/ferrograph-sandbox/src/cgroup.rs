//! One control group per run, so that the run is limited as a whole (memory, processes, CPU
//! time), measured, and killed as a whole.
//!
//! cgroup v2 is used where the process's own group can delegate `memory` and `pids` to a child;
//! else the v1 `memory`, `pids` and `cpuacct` hierarchies where they are writable. Where
//! neither is, there is no group and the per-process `prlimit` limits are all there is
//! ([`crate::Output::confinement`] says which).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Which cgroup interface limited a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CgroupVersion {
    /// The unified hierarchy.
    V2,
    /// The legacy per-controller hierarchies.
    V1,
}

impl CgroupVersion {
    /// `v1` or `v2`.
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupVersion::V2 => "v2",
            CgroupVersion::V1 => "v1",
        }
    }
}

/// What the group measured of a whole run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// The most memory the run's processes held together (bytes), where the kernel reports it.
    pub peak_memory_bytes: Option<u64>,
    /// CPU time of all its processes together.
    pub cpu_time: Option<Duration>,
    /// Whether the memory limit was reached (allocations failed or a process was OOM-killed).
    pub memory_limit_hit: bool,
    /// Whether a fork was refused by the process limit.
    pub process_limit_hit: bool,
}

/// The group of one run; removed (its processes killed first) on [`RunGroup::remove`].
#[derive(Debug)]
pub(crate) struct RunGroup {
    version: CgroupVersion,
    /// v2: one folder. v1: memory, pids, cpuacct (those that exist).
    dirs: Vec<PathBuf>,
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `key value` lines (memory.events, cpu.stat, pids.events).
fn keyed(path: &Path, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

const ROOT: &str = "/sys/fs/cgroup";

/// Our own v2 group: the `0::` line of /proc/self/cgroup.
fn own_v2_path() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(Path::new(ROOT).join(rel.trim_start_matches('/')))
}

impl RunGroup {
    /// A new group named `name` limited to `memory` bytes and `processes` tasks, or `None`
    /// where this process cannot make one (the reason is logged).
    pub(crate) fn create(name: &str, memory: u64, processes: u64) -> Option<RunGroup> {
        match Self::create_v2(name, memory, processes) {
            Ok(g) => return Some(g),
            Err(e) => tracing::debug!("no cgroup v2 group for the sandbox: {e}"),
        }
        match Self::create_v1(name, memory, processes) {
            Ok(g) => Some(g),
            Err(e) => {
                tracing::debug!("no cgroup v1 group for the sandbox: {e}");
                None
            }
        }
    }

    fn create_v2(name: &str, memory: u64, processes: u64) -> std::io::Result<RunGroup> {
        let not = |what: &str| std::io::Error::other(what.to_string());
        let base = own_v2_path().ok_or_else(|| not("no unified hierarchy"))?;
        let controllers = std::fs::read_to_string(base.join("cgroup.controllers"))?;
        for c in ["memory", "pids"] {
            if !controllers.split_whitespace().any(|x| x == c) {
                return Err(not(&format!("controller {c} not delegated")));
            }
        }
        let sub = std::fs::read_to_string(base.join("cgroup.subtree_control"))?;
        if !sub.contains("memory") || !sub.contains("pids") {
            std::fs::write(base.join("cgroup.subtree_control"), "+memory +pids")?;
        }
        let dir = base.join(name);
        std::fs::create_dir(&dir)?;
        let g = RunGroup {
            version: CgroupVersion::V2,
            dirs: vec![dir.clone()],
        };
        let set = || -> std::io::Result<()> {
            std::fs::write(dir.join("memory.max"), memory.to_string())?;
            // Swap would let the run go past its memory limit slowly instead of failing.
            let _ = std::fs::write(dir.join("memory.swap.max"), "0");
            std::fs::write(dir.join("pids.max"), processes.to_string())
        };
        if let Err(e) = set() {
            g.remove();
            return Err(e);
        }
        Ok(g)
    }

    fn create_v1(name: &str, memory: u64, processes: u64) -> std::io::Result<RunGroup> {
        let find = |names: &[&str], file: &str| -> Option<PathBuf> {
            names
                .iter()
                .map(|n| Path::new(ROOT).join(n))
                .find(|p| p.join(file).exists())
        };
        let missing = |c: &str| std::io::Error::other(format!("no v1 {c} hierarchy"));
        let mem = find(&["memory"], "memory.limit_in_bytes").ok_or_else(|| missing("memory"))?;
        let pids = find(&["pids"], "cgroup.procs").ok_or_else(|| missing("pids"))?;
        let acct = find(&["cpuacct", "cpu,cpuacct", "cpuacct,cpu"], "cpuacct.usage");
        let mut g = RunGroup {
            version: CgroupVersion::V1,
            dirs: Vec::new(),
        };
        for base in [Some(mem), Some(pids), acct].into_iter().flatten() {
            let dir = base.join("ferrograph-sandbox").join(name);
            if let Err(e) = std::fs::create_dir_all(&dir) {
                g.remove();
                return Err(e);
            }
            g.dirs.push(dir);
        }
        let set = |g: &RunGroup| -> std::io::Result<()> {
            let mem = &g.dirs[0];
            std::fs::write(mem.join("memory.limit_in_bytes"), memory.to_string())?;
            // With swap accounting, the same cap on memory and swap together.
            if mem.join("memory.memsw.limit_in_bytes").exists() {
                let _ = std::fs::write(mem.join("memory.memsw.limit_in_bytes"), memory.to_string());
            }
            let _ = std::fs::write(mem.join("memory.swappiness"), "0");
            std::fs::write(g.dirs[1].join("pids.max"), processes.to_string())
        };
        if let Err(e) = set(&g) {
            g.remove();
            return Err(e);
        }
        Ok(g)
    }

    /// Which interface.
    pub(crate) fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The `cgroup.procs` files a process writes its pid to, to join.
    pub(crate) fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// CPU time of the whole run so far.
    pub(crate) fn cpu_time(&self) -> Option<Duration> {
        match self.version {
            CgroupVersion::V2 => {
                keyed(&self.dirs[0].join("cpu.stat"), "usage_usec").map(Duration::from_micros)
            }
            CgroupVersion::V1 => self
                .dirs
                .get(2)
                .and_then(|d| read_u64(&d.join("cpuacct.usage")))
                .map(Duration::from_nanos),
        }
    }

    /// What the group measured.
    pub(crate) fn usage(&self) -> Usage {
        let cpu_time = self.cpu_time();
        match self.version {
            CgroupVersion::V2 => {
                let d = &self.dirs[0];
                Usage {
                    peak_memory_bytes: read_u64(&d.join("memory.peak")),
                    cpu_time,
                    memory_limit_hit: keyed(&d.join("memory.events"), "max").unwrap_or(0) > 0
                        || keyed(&d.join("memory.events"), "oom_kill").unwrap_or(0) > 0,
                    process_limit_hit: keyed(&d.join("pids.events"), "max").unwrap_or(0) > 0,
                }
            }
            CgroupVersion::V1 => {
                let mem = &self.dirs[0];
                let peak = read_u64(&mem.join("memory.max_usage_in_bytes"));
                let limit = read_u64(&mem.join("memory.limit_in_bytes"));
                Usage {
                    peak_memory_bytes: peak,
                    cpu_time,
                    memory_limit_hit: read_u64(&mem.join("memory.failcnt")).unwrap_or(0) > 0
                        || keyed(&mem.join("memory.oom_control"), "oom_kill").unwrap_or(0) > 0
                        || matches!((peak, limit), (Some(p), Some(l)) if p >= l),
                    process_limit_hit: keyed(&self.dirs[1].join("pids.events"), "max").unwrap_or(0)
                        > 0,
                }
            }
        }
    }

    /// SIGKILLs every process still in the group.
    pub(crate) fn kill_all(&self) {
        if self.version == CgroupVersion::V2 {
            let kill = self.dirs[0].join("cgroup.kill");
            if kill.exists() && std::fs::write(&kill, "1").is_ok() {
                return;
            }
        }
        for procs in self.procs_files() {
            let Ok(text) = std::fs::read_to_string(&procs) else {
                continue;
            };
            for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                #[cfg(unix)]
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                #[cfg(not(unix))]
                let _ = pid;
            }
        }
    }

    /// Kills what is left and removes the group's folders (a folder is removable once its
    /// last process is gone, which can take a moment after SIGKILL).
    pub(crate) fn remove(&self) {
        for attempt in 0..50 {
            self.kill_all();
            let mut left = false;
            for d in &self.dirs {
                if d.exists() && std::fs::remove_dir(d).is_err() {
                    left = true;
                }
            }
            if !left {
                return;
            }
            std::thread::sleep(Duration::from_millis(if attempt < 10 { 5 } else { 20 }));
        }
        tracing::warn!(dirs = ?self.dirs, "a sandbox cgroup could not be removed");
    }
}
