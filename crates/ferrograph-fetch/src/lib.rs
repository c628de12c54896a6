//! Downloads from package registries for ferrograph: PyPI wheels and sdists (through the
//! Simple API) and crates.io crates, sha256-checked, written atomically and unpacked safely.
//!
//! ```no_run
//! use ferrograph_fetch::{cache_dir, pypi_file, unpack, Client, FileKind, Progress};
//!
//! # fn main() -> Result<(), ferrograph_fetch::FetchError> {
//! let client = Client::new()?;
//! let file = pypi_file(&client, "six", "1.16.0", FileKind::Sdist)?;
//! let archive = cache_dir().join("sdists").join(&file.filename);
//! client.download(&file.url, &archive, file.sha256.as_deref(), Progress::Bar)?;
//! unpack(&archive, &cache_dir().join("src").join("six-1.16.0"))?;
//! # Ok(())
//! # }
//! ```
//!
//! The client trusts the platform's certificate store, so it works behind a proxy whose CA is
//! installed there. Calls block; they may be made from inside an async runtime (the work runs
//! on a thread of its own).

mod client;
mod error;
mod registry;
mod unpack;

pub use client::{hex, sha256_file, Client, Progress, DEFAULT_PYPI_INDEX};
pub use error::FetchError;
pub use registry::{
    crate_file, crate_file_checked, normalize_package_name, pypi_file, FileKind, RegistryFile,
};
pub use unpack::{
    extract_member, extract_members, unpack, unpack_with_limits, Limits, MAX_MEMBER_BYTES,
};

use std::path::{Path, PathBuf};

/// The ferrograph checkout: `FERROGRAPH_HOME` when set, else the first folder, walking up
/// from the current directory, that holds `models/models.toml`.
pub fn find_repo_root() -> Option<PathBuf> {
    if let Some(home) = env_path("FERROGRAPH_HOME") {
        return Some(home);
    }
    let cwd = std::env::current_dir().ok()?;
    cwd.ancestors()
        .find(|d| d.join("models").join("models.toml").is_file())
        .map(Path::to_path_buf)
}

/// Where downloads are cached: `FERROGRAPH_CACHE_DIR` when set, else `.cache/ferrograph`
/// under [`find_repo_root`], else `$HOME/.cache/ferrograph` (a temporary folder's
/// `ferrograph-cache` without a home). Not created here.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = env_path("FERROGRAPH_CACHE_DIR") {
        return dir;
    }
    if let Some(root) = find_repo_root() {
        return root.join(".cache").join("ferrograph");
    }
    match env_path("HOME").or_else(|| env_path("USERPROFILE")) {
        Some(home) => home.join(".cache").join("ferrograph"),
        None => std::env::temp_dir().join("ferrograph-cache"),
    }
}

/// The environment variable `name` as a path, when set and not blank.
fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.to_string_lossy().trim().is_empty())
        .map(PathBuf::from)
}
