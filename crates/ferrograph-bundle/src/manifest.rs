//! `bundle.json`: what a bundle holds, with the sha256 of every file.

use crate::platform::Platform;
use serde::{Deserialize, Serialize};
use std::path::{Component, Path, PathBuf};

/// The bundle format this build writes and reads.
pub const FORMAT: u32 = 1;

/// The name of the manifest entry, always the archive's first entry.
pub const MANIFEST_NAME: &str = "bundle.json";

/// The top-level folders a bundle may write into.
pub(crate) const TOP_FOLDERS: [&str; 3] = ["bin", "models", "licenses"];

/// The most bytes `bundle.json` may have (a bundle of thousands of licence files stays far
/// below it).
pub(crate) const MAX_MANIFEST_BYTES: u64 = 8 << 20;

/// The contents of `bundle.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleManifest {
    /// The bundle format ([`FORMAT`]).
    pub format: u32,
    /// The version of the ferrograph that made the bundle.
    pub ferrograph_version: String,
    /// When it was made, seconds since the Unix epoch.
    pub created_unix: u64,
    /// What the bundled binary was built for.
    pub platform: Platform,
    /// The models it holds, by manifest name.
    pub models: Vec<String>,
    /// Every file after the manifest, in archive order.
    pub files: Vec<BundleFile>,
}

/// One file of a bundle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleFile {
    /// Relative path, `/`-separated, under one of `bin/`, `models/`, `licenses/`.
    pub path: String,
    /// sha256 of the contents, lowercase hex.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Installed with the executable bit.
    #[serde(default)]
    pub executable: bool,
}

impl BundleManifest {
    /// The total size of the files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

/// A reader that hashes and counts what passes through it, and remembers a read error (so a
/// damaged source can be told from a failing writer).
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: sha2::Sha256,
    /// Bytes read so far.
    pub bytes: u64,
    /// The read error, if one happened.
    pub failed: Option<String>,
}

impl<R> HashingReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: sha2::Digest::new(),
            bytes: 0,
            failed: None,
        }
    }

    /// The sha256 of what was read, lowercase hex.
    pub(crate) fn sha256(self) -> String {
        ferrograph_fetch::hex(&sha2::Digest::finalize(self.hasher))
    }
}

impl<R: std::io::Read> std::io::Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf).inspect_err(|e| {
            self.failed = Some(e.to_string());
        })?;
        sha2::Digest::update(&mut self.hasher, buf.get(..n).unwrap_or_default());
        self.bytes += n as u64;
        Ok(n)
    }
}

/// The relative path a bundle path installs to, or why it is refused: it must be made of
/// plain `/`-separated components (no `..`, `.`, empty, absolute, backslash or NUL parts, none
/// starting with a dot) under one of [`TOP_FOLDERS`], with at least one component below it.
pub(crate) fn install_path(path: &str) -> Result<PathBuf, String> {
    if path.contains('\\') || path.contains('\0') {
        return Err("has a backslash or NUL in its name".into());
    }
    let mut out = PathBuf::new();
    for (i, part) in path.split('/').enumerate() {
        if part.is_empty() || part == "." || part == ".." {
            return Err("is not a plain relative path".into());
        }
        if part.starts_with('.') {
            return Err("has a component starting with a dot".into());
        }
        if i == 0 && !TOP_FOLDERS.contains(&part) {
            return Err(format!(
                "is outside the bundle's folders ({})",
                TOP_FOLDERS.join(", ")
            ));
        }
        out.push(part);
    }
    let plain = out.components().all(|c| matches!(c, Component::Normal(_)));
    if !plain || out.components().count() < 2 {
        return Err("is not a file under one of the bundle's folders".into());
    }
    Ok(out)
}

/// A bundle path for `rel` (a path made by this crate), `/`-separated.
pub(crate) fn bundle_path(rel: &Path) -> String {
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_paths_under_the_bundle_folders_are_accepted() {
        assert!(install_path("bin/ferrograph").is_ok());
        assert!(install_path("models/smollm2/x.gguf").is_ok());
        for bad in [
            "../x",
            "bin/../../etc/passwd",
            "/etc/passwd",
            "bin//x",
            "bin/./x",
            "etc/passwd",
            "bin",
            "models/.hidden",
            ".bashrc",
            "bin\\x",
            "",
        ] {
            assert!(install_path(bad).is_err(), "{bad} accepted");
        }
    }
}
