//! Which process runs a thread, so that a run whose process died is shown as orphaned instead
//! of `running` forever.
//!
//! When a run's input is accepted, the runner writes the owner into the thread record's
//! metadata under [`OWNER_KEY`]: host name, process id and the process's start time (clock
//! ticks after boot, from `/proc`), so that a later process that reuses the id is not taken
//! for the owner. [`RunOwner::liveness`] says whether that process still runs; where it cannot
//! be told (another host, no `/proc`), it says so rather than guess.

use std::fmt;
use std::sync::OnceLock;

use ferrograph_core::{ThreadInfo, ThreadStatus};

/// Metadata key of a thread record that holds its run's owner.
pub const OWNER_KEY: &str = "ferrograph.owner";

/// The process that runs (or ran) a thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOwner {
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// The process's start time in clock ticks after boot (`/proc/PID/stat`, field 22); `0`
    /// where unknown.
    pub start_ticks: u64,
}

/// Whether a run's owner still runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Liveness {
    /// The owner is this process.
    ThisProcess,
    /// The owner process runs (same id, same start time).
    Alive,
    /// The owner process has ended (or its id now belongs to another process).
    Gone,
    /// Cannot be told from here (another host, or no `/proc`).
    Unknown,
}

impl fmt::Display for RunOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.host, self.pid, self.start_ticks)
    }
}

impl RunOwner {
    /// This process.
    pub fn this_process() -> &'static RunOwner {
        static THIS: OnceLock<RunOwner> = OnceLock::new();
        THIS.get_or_init(|| {
            let pid = std::process::id();
            RunOwner {
                host: host_name(),
                pid,
                start_ticks: start_ticks(pid).unwrap_or(0),
            }
        })
    }

    /// Reads an owner written by [`fmt::Display`]; `None` for anything else.
    pub fn parse(text: &str) -> Option<RunOwner> {
        let mut parts = text.rsplitn(3, ' ');
        let start_ticks = parts.next()?.parse().ok()?;
        let pid = parts.next()?.parse().ok()?;
        let host = parts.next()?.to_string();
        Some(RunOwner {
            host,
            pid,
            start_ticks,
        })
    }

    /// The owner recorded in a thread record.
    pub fn of(info: &ThreadInfo) -> Option<RunOwner> {
        info.metadata
            .get(OWNER_KEY)
            .and_then(|v| RunOwner::parse(v))
    }

    /// Whether this owner still runs.
    pub fn liveness(&self) -> Liveness {
        let me = RunOwner::this_process();
        if self == me {
            return Liveness::ThisProcess;
        }
        if self.host != me.host || self.start_ticks == 0 || me.start_ticks == 0 {
            return Liveness::Unknown;
        }
        match start_ticks(self.pid) {
            Some(t) if t == self.start_ticks => Liveness::Alive,
            _ => Liveness::Gone,
        }
    }
}

/// Records this process as the owner of `info`'s run.
pub fn claim(info: &mut ThreadInfo) {
    info.metadata
        .insert(OWNER_KEY.to_string(), RunOwner::this_process().to_string());
}

/// Whether `info` says it is running but its owner has ended: its run will never finish by
/// itself, and a run with no input (`resume`) continues it from its last checkpoint. A record
/// without an owner (written before owners were recorded) counts as orphaned unless this
/// process is running it, which only the caller can know: pass `running_here`.
pub fn is_orphaned(info: &ThreadInfo, running_here: bool) -> bool {
    if info.status != ThreadStatus::Running || running_here {
        return false;
    }
    match RunOwner::of(info).map(|o| o.liveness()) {
        Some(Liveness::Gone) | None => true,
        // This process owns it but does not run it: its run ended without updating the record.
        Some(Liveness::ThisProcess) => true,
        Some(Liveness::Alive | Liveness::Unknown) => false,
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty() && !h.contains(' '))
        .unwrap_or_else(|| "localhost".to_string())
}

/// A process's start time from `/proc/PID/stat` (field 22), or `None`.
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_reads_back_what_it_wrote() {
        let me = RunOwner::this_process();
        assert_eq!(RunOwner::parse(&me.to_string()).as_ref(), Some(me));
        assert_eq!(RunOwner::parse("garbage"), None);
        assert_eq!(RunOwner::parse("host x 1"), None);
    }

    #[test]
    fn this_process_is_alive_a_finished_child_is_gone() {
        assert_eq!(RunOwner::this_process().liveness(), Liveness::ThisProcess);
        if cfg!(target_os = "linux") {
            assert!(RunOwner::this_process().start_ticks > 0);
            let mut child = std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap_or_else(|e| unreachable!("spawn sleep: {e}"));
            let owner = RunOwner {
                host: RunOwner::this_process().host.clone(),
                pid: child.id(),
                start_ticks: start_ticks(child.id()).unwrap_or(0),
            };
            assert_eq!(owner.liveness(), Liveness::Alive);
            let _ = child.kill();
            let _ = child.wait();
            assert_eq!(owner.liveness(), Liveness::Gone);
            // Same id, other start time: a reused id is not the owner.
            let reused = RunOwner {
                start_ticks: RunOwner::this_process().start_ticks + 1,
                pid: std::process::id(),
                ..owner.clone()
            };
            assert_eq!(reused.liveness(), Liveness::Gone);
            let elsewhere = RunOwner {
                host: "some-other-host".into(),
                ..owner
            };
            assert_eq!(elsewhere.liveness(), Liveness::Unknown);
        }
    }

    #[test]
    fn only_running_records_with_a_gone_or_missing_owner_are_orphaned() {
        let mut info = ThreadInfo::new("t", "g");
        assert!(is_orphaned(&info, false), "no owner recorded");
        assert!(!is_orphaned(&info, true));
        claim(&mut info);
        // Owned by this process, which says it is not running it.
        assert!(is_orphaned(&info, false));
        info.status = ThreadStatus::Done;
        assert!(!is_orphaned(&info, false));
    }
}
