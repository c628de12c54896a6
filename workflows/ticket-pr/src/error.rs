//! Every way the workflow's own parts fail (tickets, the repository, the PR store).

use std::path::Path;

/// Why a ticket, the repository or the pull-request store could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TicketPrError {
    /// No such ticket.
    #[error("unknown ticket {0}")]
    UnknownTicket(String),
    /// A ticket file or folder that cannot be read as tickets.
    #[error("tickets: {0}")]
    Tickets(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The folder is not a git repository.
    #[error("{0} is not a git repository")]
    NotGit(String),
    /// The working tree has uncommitted changes.
    #[error(
        "the working tree of {repo} has uncommitted changes ({files}); commit or stash them first"
    )]
    Dirty {
        /// The repository.
        repo: String,
        /// Some of the changed files.
        files: String,
    },
    /// The branch exists and holds commits this run did not make.
    #[error("branch {branch} already exists with other commits ({detail}); delete or rename it, or approve under another ticket")]
    BranchConflict {
        /// The branch.
        branch: String,
        /// What differs.
        detail: String,
    },
    /// A proposed path is outside the repository or the selected modules.
    #[error("refused path `{path}`: {why}")]
    PathRefused {
        /// The path as proposed.
        path: String,
        /// Why.
        why: String,
    },
    /// The remote to push to is neither a remote the repository names nor a path.
    #[error("the repository has no remote named `{0}` (name one of its remotes, or give a path or file:// URL of a repository)")]
    UnknownRemote(String),
    /// The repository's modules could not be found or read.
    #[error("modules: {0}")]
    Modules(String),
    /// libgit2 failed.
    #[error("git: {context}: {source}")]
    Git {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: git2::Error,
    },
    /// The pull-request store failed.
    #[error("pull-request store: {0}")]
    Store(#[from] sled::Error),
    /// A stored record could not be read.
    #[error("pull-request store: record {key}: {source}")]
    Record {
        /// The record's key.
        key: String,
        /// The error.
        #[source]
        source: serde_json::Error,
    },
    /// The repository is too large to copy for a test run.
    #[error(
        "the repository's text files exceed {limit_mib} MiB: too large to copy for a test run"
    )]
    TreeTooLarge {
        /// The limit.
        limit_mib: usize,
    },
    /// Running the proposed tests failed to start or to stage (a failing test is a result,
    /// not this error).
    #[error("running the tests: {0}")]
    Sandbox(#[from] ferrograph_sandbox::SandboxError),
}

impl TicketPrError {
    /// An IO error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        TicketPrError::Io {
            path: path.display().to_string(),
            source,
        }
    }

    /// A libgit2 error while doing `context`.
    pub fn git(context: impl Into<String>) -> impl FnOnce(git2::Error) -> Self {
        let context = context.into();
        move |source| TicketPrError::Git { context, source }
    }
}
