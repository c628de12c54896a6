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
        "model file {path} is missing; fetch it with `scripts/fetch-models.sh {name}` \
         (or `ferrograph models fetch {name}`)"
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
    /// A remote or shared model is rate limited.
    #[error("rate limited: {0}")]
    RateLimited(String),
    /// The model's request queue is full or its actor is busy beyond the caller's patience.
    #[error("model overloaded: {0}")]
    Overloaded(String),
    /// The call took longer than allowed.
    #[error("model call timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The model actor stopped (it panicked or was shut down).
    #[error("model actor stopped: {0}")]
    ActorStopped(String),
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

impl LlmError {
    /// Whether retrying the same call later may succeed: rate limits, overload, timeouts and a
    /// stopped actor (it is restarted on the next call) are retryable; schema, validation,
    /// missing or invalid models and unsupported architectures are fatal.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LlmError::RateLimited(_)
                | LlmError::Overloaded(_)
                | LlmError::Timeout(_)
                | LlmError::ActorStopped(_)
        )
    }

    pub(crate) fn backend(e: impl std::fmt::Display) -> Self {
        LlmError::Backend(e.to_string())
    }

    pub(crate) fn invalid(path: &std::path::Path, reason: impl std::fmt::Display) -> Self {
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
        assert!(LlmError::RateLimited("x".into()).is_retryable());
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
        assert!(text.contains("scripts/fetch-models.sh x"), "{text}");
        assert!(text.contains("ferrograph models fetch x"), "{text}");
    }
}
