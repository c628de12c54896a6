//! Errors of downloading, checking and unpacking.

use std::path::PathBuf;

/// Why a fetch failed.
///
/// Every variant displays as one line. [`FetchError::is_unreachable`] tells "the registry could
/// not be reached at all" (offline machine, DNS, TLS, connect timeout) from the other failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The server could not be reached: no network, DNS failure, TLS failure or a timeout
    /// before any answer.
    #[error("cannot reach {url}: {}", root_cause(source))]
    Unreachable {
        /// The URL requested.
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The connection dropped (or stalled) while a body was being downloaded.
    #[error("download of {url} was interrupted: {source}")]
    Interrupted {
        /// The URL being downloaded.
        url: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The server answered with an error status.
    #[error("{url} answered HTTP {status}")]
    Http {
        /// The URL requested.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// No such package, version, file or archive member.
    #[error("not found: {what}")]
    NotFound {
        /// What was looked for, and where.
        what: String,
    },
    /// A file's sha256 is not the expected one.
    #[error("sha256 mismatch for {what}: expected {expected}, got {actual}")]
    Checksum {
        /// The URL or path checked.
        what: String,
        /// The expected digest, lowercase hex.
        expected: String,
        /// The digest found, lowercase hex.
        actual: String,
    },
    /// Reading or writing a local file failed.
    #[error("io error on {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An archive could not be unpacked: malformed, unknown format, too large, or with a
    /// hostile entry (absolute path, `..`, link out of the tree).
    #[error("cannot unpack {archive}: {reason}")]
    Unpack {
        /// The archive.
        archive: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A registry answer is not the JSON its API prescribes.
    #[error("malformed answer from {url}: {source}")]
    Json {
        /// The URL requested.
        url: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The request itself is invalid (a bad URL, an empty name).
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl FetchError {
    /// Whether the server could not be reached at all (see [`FetchError::Unreachable`]): on an
    /// offline machine every fetch fails this way.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, FetchError::Unreachable { .. })
    }

    /// The URL involved, for the network errors.
    pub fn url(&self) -> Option<&str> {
        match self {
            FetchError::Unreachable { url, .. }
            | FetchError::Interrupted { url, .. }
            | FetchError::Http { url, .. }
            | FetchError::Json { url, .. } => Some(url),
            _ => None,
        }
    }

    /// The innermost cause of an [`FetchError::Unreachable`] (for example "failed to lookup
    /// address information: ..."), on one line; `None` for the other variants.
    pub fn unreachable_reason(&self) -> Option<String> {
        match self {
            FetchError::Unreachable { source, .. } => Some(root_cause(source)),
            _ => None,
        }
    }

    /// Whether trying again may help: interrupted transfers, HTTP 429 and 5xx.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            FetchError::Interrupted { .. } => true,
            FetchError::Http { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FetchError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn unpack(archive: impl Into<PathBuf>, reason: impl std::fmt::Display) -> Self {
        FetchError::Unpack {
            archive: archive.into(),
            reason: reason.to_string(),
        }
    }
}

/// The innermost error of `e`'s source chain, on one line (reqwest's outer messages only say
/// "error sending request").
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last: &(dyn std::error::Error + 'static) = e;
    while let Some(next) = last.source() {
        last = next;
    }
    let text = last.to_string();
    let text = if text.is_empty() { e.to_string() } else { text };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
