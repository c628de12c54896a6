//! The workflow's errors.

use std::path::{Path, PathBuf};

/// What can go wrong in the team's infrastructure (the agents' own failures are recorded in
/// the state and the audit trail instead).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TeamError {
    /// A file or folder could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The event bus or the conversation store failed.
    #[error("team store: {0}")]
    Store(#[from] sled::Error),
    /// Another process holds the store.
    #[error("the team store {} is held by another ferrograph process ({reason}); stop it or wait for its run to end", .path.display())]
    Busy {
        /// The store.
        path: PathBuf,
        /// What sled said.
        reason: String,
    },
    /// A stored record does not parse.
    #[error("team store record: {0}")]
    Record(#[from] serde_json::Error),
    /// The git workspace failed.
    #[error("workspace: {0}")]
    Git(#[from] git2::Error),
    /// The brief is missing or unusable.
    #[error("brief {path}: {reason}")]
    Brief {
        /// Its path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A path in the brief or from the model is not allowed.
    #[error(
        "refused path `{0}`: only plain file names like `name.py` in the workspace are allowed"
    )]
    HostilePath(String),
    /// The sandbox could not run.
    #[error("sandbox: {0}")]
    Sandbox(String),
    /// No run with this id.
    #[error("no team run `{0}` (list runs with `ferrograph threads list`)")]
    UnknownRun(String),
}

impl TeamError {
    /// An I/O error at `path`.
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        TeamError::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }
}
