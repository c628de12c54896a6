//! What can go wrong making, checking or installing a bundle.

use std::path::PathBuf;

/// Why a bundle could not be made, checked or installed. Every variant displays as one line
/// that names the file concerned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BundleError {
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The model manifest could not be read.
    #[error("model manifest: {0}")]
    Models(#[from] ferrograph_models::LlmError),
    /// A model named for the bundle is not in the model manifest.
    #[error("unknown model `{name}`; known: {known}")]
    UnknownModel {
        /// The name given.
        name: String,
        /// The manifest's models.
        known: String,
    },
    /// A model named for the bundle is not complete and verified in the models folder.
    #[error("model `{name}`: {} {problem}; run `ferrograph models fetch {name}` first", file.display())]
    ModelNotReady {
        /// The model.
        name: String,
        /// The file that is missing or wrong.
        file: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The archive is not a ferrograph bundle (not gzip/tar, no manifest first, bad manifest).
    #[error("{}: not a ferrograph bundle: {reason}", archive.display())]
    NotABundle {
        /// The archive.
        archive: PathBuf,
        /// Why.
        reason: String,
    },
    /// The bundle was written in a format this build does not read.
    #[error("{}: bundle format {found}, this ferrograph reads format {supported}", archive.display())]
    UnsupportedFormat {
        /// The archive.
        archive: PathBuf,
        /// Its format number.
        found: u32,
        /// The one this build reads.
        supported: u32,
    },
    /// An entry could write outside the install folder or is not a plain file (absolute path,
    /// `..`, a link, a device), or is a manifest path of that kind.
    #[error("{}: refused entry `{entry}`: {reason}", archive.display())]
    UnsafeEntry {
        /// The archive.
        archive: PathBuf,
        /// The entry's path as written in the archive.
        entry: String,
        /// Why it was refused.
        reason: String,
    },
    /// An entry's content or presence does not match the bundle manifest (tampered, corrupt,
    /// truncated, extra or missing).
    #[error("{}: `{entry}` does not match the bundle manifest: {reason}", archive.display())]
    Mismatch {
        /// The archive.
        archive: PathBuf,
        /// The entry.
        entry: String,
        /// What differs.
        reason: String,
    },
    /// The bundle's binary was built for another operating system or architecture.
    #[error("{}: made for {bundle}, this machine is {here}", archive.display())]
    WrongPlatform {
        /// The archive.
        archive: PathBuf,
        /// Its platform (`arch-os`).
        bundle: String,
        /// This machine's.
        here: String,
    },
    /// The bundle's binary was compiled for CPU features this CPU does not have (for example a
    /// build with `-C target-cpu=native` on a newer machine): it would die of an illegal
    /// instruction.
    #[error(
        "{}: its binary needs CPU features this CPU lacks ({}); make the bundle with a binary built without `-C target-cpu=native`",
        archive.display(),
        missing.join(", ")
    )]
    MissingCpuFeatures {
        /// The archive.
        archive: PathBuf,
        /// The features missing here.
        missing: Vec<String>,
    },
}

impl BundleError {
    /// An [`BundleError::Io`] error for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
