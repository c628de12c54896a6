//! Errors of the index, the embedder and the chunker.

use std::path::PathBuf;

/// Why an index operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// The document store (sled) failed or is corrupt.
    #[error("document store error in {path}: {source}")]
    Store {
        /// The store's folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: sled::Error,
    },
    /// The index's store stayed locked: another process has it open (or a handle in this
    /// one was not closed).
    #[error(
        "the index store {path} is locked by another process (waited {waited:?}); close the other ferrograph using it"
    )]
    Locked {
        /// The store's folder.
        path: PathBuf,
        /// How long opening waited.
        waited: std::time::Duration,
    },
    /// Reading or writing a file failed.
    #[error("io error on {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Stored data could not be decoded (the store is damaged or from another version).
    #[error("corrupt index data in {path}: {reason}")]
    Corrupt {
        /// The store's folder or the file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// There is no index at this path.
    #[error("no index at {0} (build one with `ferrograph index build DIR --name NAME`)")]
    NotFound(PathBuf),
    /// An index already exists at this path.
    #[error("an index already exists at {0}")]
    AlreadyExists(PathBuf),
    /// A vector has the wrong dimension.
    #[error(
        "vector dimension mismatch: the index holds {expected}-dimensional vectors, got {got}"
    )]
    Dimension {
        /// The index's dimension.
        expected: usize,
        /// The vector's dimension.
        got: usize,
    },
    /// The index was built with another embedding model.
    #[error("the index was built with model `{index}`, but the embedder is `{embedder}`")]
    ModelMismatch {
        /// The model recorded in the index.
        index: String,
        /// The embedder's model.
        embedder: String,
    },
    /// Loading or running the embedding model failed.
    #[error("embedding error: {0}")]
    Embedding(String),
    /// Locating or fetching the model failed.
    #[error(transparent)]
    Model(#[from] ferrograph_chat::LlmError),
    /// An argument is invalid (a filter, a query, options).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A blocking task (embedding, search) panicked or was cancelled.
    #[error("background task failed: {0}")]
    Task(String),
}

impl IndexError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        IndexError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, reason: impl std::fmt::Display) -> Self {
        IndexError::Corrupt {
            path: path.into(),
            reason: reason.to_string(),
        }
    }

    pub(crate) fn embedding(e: impl std::fmt::Display) -> Self {
        IndexError::Embedding(e.to_string())
    }
}

/// Result with [`IndexError`].
pub type Result<T, E = IndexError> = std::result::Result<T, E>;
