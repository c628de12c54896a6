//! Helpers for tests that run hostile code through the sandbox (feature `testing`): skip
//! visibly where the machine cannot confine, and check the host after the run.

use std::collections::BTreeMap;
use std::path::Path;

/// Whether this machine confines runs; where it does not, prints a visible `SKIPPING test`
/// line (CI's log shows it) and the caller returns.
pub fn confined_or_skip(test: &str) -> bool {
    match crate::confinement() {
        Ok(()) => true,
        Err(why) => {
            eprintln!("SKIPPING {test}: this machine cannot confine code ({why}); the refusal path is tested instead");
            false
        }
    }
}

/// Every file under `dir` (relative path → contents), to compare before and after a run.
/// Unreadable entries count as empty.
pub fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap_or(&p).display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    out
}

/// Host processes whose command line holds `marker` (`pid: command line`).
pub fn host_processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(marker) {
                found.push(format!("{name}: {cmd}"));
            }
        }
    }
    found
}
