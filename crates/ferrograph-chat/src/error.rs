//! Errors of model loading and generation.

use std::path::PathBuf;

/// Why a model call failed.
///
/// [`LlmError::is_retryable`] tells transient failures (worth retrying with backoff) from fatal
/// ones (retrying gives the same answer).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The model file is not on disk.
    #[error(
        "model file {path} is missing; fetch it with `ferrograph models fetch {name}` \
         (or `scripts/fetch-models.sh {name}`)"
    )]
    ModelMissing {
        /// The path that was looked for.
        path: PathBuf,
        /// The manifest name to fetch (or the file name when it is not in the manifest).
        name: String,
    },
    /// The model file exists but could not be read as a model (malformed GGUF, missing
    /// metadata, bad tokenizer).
    #[error("invalid model {path}: {reason}")]
    InvalidModel {
        /// The model file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The GGUF's `general.architecture` has no implementation here.
    #[error("unsupported architecture `{architecture}` in {path}; supported: {supported}")]
    UnsupportedArchitecture {
        /// The architecture named in the file.
        architecture: String,
        /// The model file.
        path: PathBuf,
        /// Comma-separated list of supported architectures.
        supported: String,
    },
    /// The options or messages are invalid (for example a prompt longer than `max_context`).
    #[error("invalid request: {0}")]
    Validation(String),
    /// The output did not match the requested schema.
    #[error("output does not match the schema: {message}; output was: {output}")]
    Schema {
        /// What did not match.
        message: String,
        /// The raw model output.
        output: String,
    },
    /// The chat template failed to render.
    #[error("chat template error: {0}")]
    Template(String),
    /// Tokenizing or detokenizing failed.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// The inference backend failed.
    #[error("inference error: {0}")]
    Backend(String),
    /// A remote or shared model is rate limited (HTTP 429).
    #[error("rate limited: {message}{}", fmt_retry_after(*retry_after))]
    RateLimited {
        /// What the server said.
        message: String,
        /// How long the server asked to wait (its `Retry-After`), when it said.
        retry_after: Option<std::time::Duration>,
    },
    /// A remote server is temporarily unavailable (HTTP 502, 503 or 504).
    #[error("server unavailable (HTTP {status}): {message}{}", fmt_retry_after(*retry_after))]
    Unavailable {
        /// The HTTP status.
        status: u16,
        /// What the server said.
        message: String,
        /// How long the server asked to wait (its `Retry-After`), when it said.
        retry_after: Option<std::time::Duration>,
    },
    /// A remote server answered with an error status that retrying will not fix (4xx other
    /// than 429, or 500).
    #[error("server error (HTTP {status}): {message}")]
    Http {
        /// The HTTP status.
        status: u16,
        /// What the server said.
        message: String,
    },
    /// The server could not be reached, or the connection failed before an answer started.
    #[error("connection to {url} failed: {message}")]
    Connection {
        /// The URL called.
        url: String,
        /// What failed.
        message: String,
    },
    /// The server's answer is not the JSON (or event stream) the protocol prescribes.
    #[error("malformed response: {message}; body was: {body}")]
    MalformedResponse {
        /// What is wrong.
        message: String,
        /// The offending body (cut to a few hundred characters).
        body: String,
    },
    /// A streamed answer stopped before it was complete (the connection dropped).
    #[error("stream interrupted: {0}")]
    StreamInterrupted(String),
    /// A provider could not be built from the configuration.
    #[error("configuration error: {0}")]
    Config(String),
    /// The model's request queue is full or its actor is busy beyond the caller's patience.
    #[error("model overloaded: {0}")]
    Overloaded(String),
    /// The call took longer than allowed.
    #[error("model call timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The model actor stopped (it panicked or was shut down).
    #[error("model actor stopped: {0}")]
    ActorStopped(String),
    /// The cluster node serving the model was lost during the call (it exited, was killed,
    /// or the network to it is cut), or no node of the cluster serves the model now.
    #[error("cluster node {node} lost: {message}")]
    NodeLost {
        /// The node's name (`none` when no node serves the model).
        node: String,
        /// What was seen.
        message: String,
    },
    /// Fetching a model from its registry (PyPI) failed (`ferrograph-models` builds it: when
    /// the registry cannot be reached the message says how to get the models onto an
    /// offline machine). The message holds the cause, so `{:#}` printing stays one line.
    #[error("{message}")]
    Fetch {
        /// The manifest name of the model.
        model: String,
        /// What failed, in one line.
        message: String,
    },
    /// Reading a file failed.
    #[error("io error on {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn fmt_retry_after(retry_after: Option<std::time::Duration>) -> String {
    match retry_after {
        Some(d) => format!(" (retry after {d:?})"),
        None => String::new(),
    }
}

impl LlmError {
    /// Whether retrying the same call later may succeed: rate limits, overload (a full queue,
    /// HTTP 502/503/504), timeouts, failed connections and a stopped actor (it is restarted on
    /// the next call) are retryable; schema, validation, other HTTP errors, malformed
    /// responses, interrupted streams (tokens were already delivered), missing or invalid
    /// models and unsupported architectures are fatal.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LlmError::RateLimited { .. }
                | LlmError::Unavailable { .. }
                | LlmError::Connection { .. }
                | LlmError::Overloaded(_)
                | LlmError::Timeout(_)
                | LlmError::ActorStopped(_)
                | LlmError::NodeLost { .. }
        )
    }

    /// How long the server asked to wait before retrying (`Retry-After`), when it said.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            LlmError::RateLimited { retry_after, .. }
            | LlmError::Unavailable { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A rate-limit error without a `Retry-After`.
    pub fn rate_limited(message: impl Into<String>) -> Self {
        LlmError::RateLimited {
            message: message.into(),
            retry_after: None,
        }
    }

    /// An inference-backend error ([`LlmError::Backend`]) from anything printable.
    pub fn backend(e: impl std::fmt::Display) -> Self {
        LlmError::Backend(e.to_string())
    }

    /// [`LlmError::InvalidModel`] for the model file at `path`.
    pub fn invalid(path: &std::path::Path, reason: impl std::fmt::Display) -> Self {
        LlmError::InvalidModel {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_classification() {
        assert!(LlmError::rate_limited("x").is_retryable());
        let limited = LlmError::RateLimited {
            message: "slow down".into(),
            retry_after: Some(std::time::Duration::from_secs(2)),
        };
        assert!(limited.is_retryable());
        assert_eq!(
            limited.retry_after(),
            Some(std::time::Duration::from_secs(2))
        );
        assert!(limited.to_string().contains("retry after 2s"), "{limited}");
        assert!(!LlmError::Http {
            status: 400,
            message: "bad".into()
        }
        .is_retryable());
        assert!(!LlmError::MalformedResponse {
            message: "m".into(),
            body: "b".into()
        }
        .is_retryable());
        assert!(LlmError::Overloaded("x".into()).is_retryable());
        assert!(LlmError::Timeout(std::time::Duration::from_secs(1)).is_retryable());
        assert!(!LlmError::Validation("x".into()).is_retryable());
        assert!(!LlmError::Schema {
            message: "m".into(),
            output: "o".into()
        }
        .is_retryable());
        let missing = LlmError::ModelMissing {
            path: "models/x/y.gguf".into(),
            name: "x".into(),
        };
        assert!(!missing.is_retryable());
        let text = missing.to_string();
        assert!(text.contains("ferrograph models fetch x"), "{text}");
        assert!(text.contains("ferrograph models fetch x"), "{text}");
        let fetch = LlmError::Fetch {
            model: "x".into(),
            message: "cannot fetch model x: not found: package `p` on PyPI".into(),
        };
        assert!(!fetch.is_retryable());
        assert_eq!(
            fetch.to_string(),
            "cannot fetch model x: not found: package `p` on PyPI"
        );
    }
}
