//! A check that a sandboxed run left a repository's `.git` as it was: the hooks and the
//! configuration (what runs on the user's next `git commit`, and where a push goes).
//!
//! A confined run never sees the caller's repositories (only its own copied folder), so this
//! is the second fence: it is what still protects a repository when the user allowed
//! unconfined runs, and it proves the first held.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The hooks and configuration of one repository at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GitSnapshot {
    git_dir: PathBuf,
    files: BTreeMap<PathBuf, Vec<u8>>,
}

/// What [`GitSnapshot::restore_changes`] found and undid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GitTampering {
    /// Files (relative to `.git`) that were added, changed or removed, and were put back.
    pub restored: Vec<String>,
    /// Files that could not be put back, with why.
    pub failed: Vec<String>,
}

impl GitTampering {
    /// Whether anything had changed.
    pub fn any(&self) -> bool {
        !self.restored.is_empty() || !self.failed.is_empty()
    }

    /// `put back: a, b` and, where some could not be, `; could not put back: c (why)`.
    pub fn describe(&self) -> String {
        let mut line = format!("put back: {}", self.restored.join(", "));
        if !self.failed.is_empty() {
            line.push_str(&format!("; could not put back: {}", self.failed.join(", ")));
        }
        line
    }
}

fn watched(git_dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    for name in ["config", "HEAD", "info/attributes", "info/exclude"] {
        let p = git_dir.join(name);
        if let Ok(bytes) = std::fs::read(&p) {
            files.insert(PathBuf::from(name), bytes);
        }
    }
    if let Ok(entries) = std::fs::read_dir(git_dir.join("hooks")) {
        for e in entries.flatten() {
            let rel = PathBuf::from("hooks").join(e.file_name());
            // A hook that is a link or a folder is recorded as such (empty), so that one
            // appearing is seen.
            let bytes = if e.file_type().is_ok_and(|t| t.is_file()) {
                std::fs::read(e.path()).unwrap_or_default()
            } else {
                b"<not a plain file>".to_vec()
            };
            files.insert(rel, bytes);
        }
    }
    files
}

impl GitSnapshot {
    /// The state of `repo`'s `.git` (a repository folder, or a `.git` folder itself); `None`
    /// when it has none.
    pub fn take(repo: &Path) -> Option<GitSnapshot> {
        let git_dir = if repo.file_name().is_some_and(|n| n == ".git") {
            repo.to_path_buf()
        } else {
            repo.join(".git")
        };
        git_dir.is_dir().then(|| GitSnapshot {
            files: watched(&git_dir),
            git_dir,
        })
    }

    /// Puts back what changed since the snapshot and says what that was.
    pub fn restore_changes(&self) -> GitTampering {
        let now = watched(&self.git_dir);
        let mut out = GitTampering::default();
        for (rel, bytes) in &self.files {
            if now.get(rel) != Some(bytes) {
                let path = self.git_dir.join(rel);
                let _ = std::fs::remove_file(&path);
                match std::fs::write(&path, bytes) {
                    Ok(()) => out.restored.push(rel.display().to_string()),
                    Err(e) => out.failed.push(format!("{}: {e}", rel.display())),
                }
            }
        }
        for rel in now.keys().filter(|k| !self.files.contains_key(*k)) {
            let path = self.git_dir.join(rel);
            let gone = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir_all(&path));
            match gone {
                Ok(()) => out.restored.push(rel.display().to_string()),
                Err(e) => out.failed.push(format!("{}: {e}", rel.display())),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_planted_hook_and_a_changed_config_are_put_back() {
        let dir = tempfile::tempdir().unwrap();
        let git = dir.path().join(".git");
        std::fs::create_dir_all(git.join("hooks")).unwrap();
        std::fs::write(git.join("config"), "[core]\n").unwrap();
        std::fs::write(git.join("hooks/pre-push.sample"), "#!/bin/sh\n").unwrap();
        let snap = GitSnapshot::take(dir.path()).unwrap();
        assert!(!snap.restore_changes().any());
        std::fs::write(git.join("hooks/pre-commit"), "#!/bin/sh\ncurl evil\n").unwrap();
        std::fs::write(git.join("config"), "[core]\nhooksPath = /tmp\n").unwrap();
        let t = snap.restore_changes();
        assert_eq!(t.restored, vec!["config", "hooks/pre-commit"]);
        assert!(!git.join("hooks/pre-commit").exists());
        assert_eq!(
            std::fs::read_to_string(git.join("config")).unwrap(),
            "[core]\n"
        );
        assert!(GitSnapshot::take(&dir.path().join("nothing")).is_none());
    }
}
