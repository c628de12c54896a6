//! Checking and installing a bundle.

use crate::error::BundleError;
use crate::manifest::{
    install_path, BundleFile, BundleManifest, HashingReader, FORMAT, MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// What [`verify`] found: a bundle whose every file matches its manifest.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Verified {
    /// The bundle's manifest.
    pub manifest: BundleManifest,
    /// Whether its binary runs here (same architecture and OS, no missing CPU feature).
    pub runs_here: bool,
}

/// What [`install`] did.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Installed {
    /// The install folder.
    pub prefix: PathBuf,
    /// The installed binary (`<prefix>/bin/ferrograph`).
    pub binary: PathBuf,
    /// The bundle's manifest (also written to `<prefix>/bundle.json`).
    pub manifest: BundleManifest,
    /// Files installed.
    pub files: usize,
    /// Their total size.
    pub bytes: u64,
}

/// Reads the whole bundle and checks every file against its manifest (paths, sizes, sha256;
/// none missing, none extra) without writing anything.
pub fn verify(archive: &Path) -> Result<Verified, BundleError> {
    let manifest = read_bundle(archive, false, &mut |_, reader| {
        std::io::copy(reader, &mut std::io::sink()).map(|_| ())
    })?;
    let runs_here = check_platform(archive, &manifest).is_ok();
    Ok(Verified {
        manifest,
        runs_here,
    })
}

/// Installs a bundle into `prefix`: `bin/ferrograph`, `models/`, `licenses/` and
/// `bundle.json`. Refuses a bundle for another platform or a CPU without the binary's
/// features before writing anything; writes every file into a staging folder inside
/// `prefix`, checking its size and sha256 as it goes, and renames the files into place only
/// when all of them matched. On any error nothing is installed (the staging folder is
/// removed). Files of an earlier install that the bundle does not hold (another model) stay.
pub fn install(archive: &Path, prefix: &Path) -> Result<Installed, BundleError> {
    let created = !prefix.exists();
    std::fs::create_dir_all(prefix).map_err(|e| BundleError::io(prefix, e))?;
    let staging = prefix.join(format!(".bundle-staging-{}", std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| BundleError::io(&staging, e))?;
    }
    let result = install_via(archive, prefix, &staging);
    if staging.exists() {
        if let Err(e) = std::fs::remove_dir_all(&staging) {
            tracing::warn!(path = %staging.display(), error = %e, "staging folder not removed");
        }
    }
    // A refused bundle leaves no trace, not even the folder made for it (removed only if empty).
    if result.is_err() && created {
        let _ = std::fs::remove_dir(prefix);
    }
    result
}

fn install_via(archive: &Path, prefix: &Path, staging: &Path) -> Result<Installed, BundleError> {
    let manifest = read_bundle(archive, true, &mut |rel, reader| {
        let path = staging.join(rel);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = std::fs::File::create(&path)?;
        std::io::copy(reader, &mut file)?;
        file.sync_all()
    })?;
    for f in &manifest.files {
        let rel = install_path(&f.path).map_err(|reason| unsafe_entry(archive, &f.path, reason))?;
        let from = staging.join(&rel);
        let to = prefix.join(&rel);
        if f.executable {
            set_executable(&from)?;
        }
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).map_err(|e| BundleError::io(dir, e))?;
        }
        // A folder (or anything else) where a file goes would make the rename fail.
        if to.is_dir() {
            std::fs::remove_dir_all(&to).map_err(|e| BundleError::io(&to, e))?;
        }
        std::fs::rename(&from, &to).map_err(|e| BundleError::io(&to, e))?;
    }
    let record = prefix.join(MANIFEST_NAME);
    let tmp = prefix.join(format!(".{MANIFEST_NAME}.partial"));
    let json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| BundleError::io(&record, std::io::Error::other(e)))?;
    std::fs::write(&tmp, json).map_err(|e| BundleError::io(&tmp, e))?;
    std::fs::rename(&tmp, &record).map_err(|e| BundleError::io(&record, e))?;
    Ok(Installed {
        prefix: prefix.to_path_buf(),
        binary: prefix.join("bin").join("ferrograph"),
        files: manifest.files.len(),
        bytes: manifest.total_bytes(),
        manifest,
    })
}

/// Refuses a bundle whose binary cannot run on this machine.
fn check_platform(archive: &Path, manifest: &BundleManifest) -> Result<(), BundleError> {
    let p = &manifest.platform;
    if !p.same_target_as_this_machine() {
        return Err(BundleError::WrongPlatform {
            archive: archive.to_path_buf(),
            bundle: p.label(),
            here: crate::platform::Platform::of_this_build().label(),
        });
    }
    let missing = p.missing_cpu_features();
    if !missing.is_empty() {
        return Err(BundleError::MissingCpuFeatures {
            archive: archive.to_path_buf(),
            missing,
        });
    }
    Ok(())
}

#[cfg(unix)]
fn set_executable(path: &Path) -> Result<(), BundleError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| BundleError::io(path, e))
}

#[cfg(not(unix))]
fn set_executable(_path: &Path) -> Result<(), BundleError> {
    Ok(())
}

fn unsafe_entry(archive: &Path, entry: &str, reason: impl Into<String>) -> BundleError {
    BundleError::UnsafeEntry {
        archive: archive.to_path_buf(),
        entry: entry.to_string(),
        reason: reason.into(),
    }
}

fn not_a_bundle(archive: &Path, reason: impl Into<String>) -> BundleError {
    BundleError::NotABundle {
        archive: archive.to_path_buf(),
        reason: reason.into(),
    }
}

fn mismatch(archive: &Path, entry: &str, reason: impl Into<String>) -> BundleError {
    BundleError::Mismatch {
        archive: archive.to_path_buf(),
        entry: entry.to_string(),
        reason: reason.into(),
    }
}

/// What a sink does with one checked entry: gets the entry's relative install path and a
/// reader of its contents (which hashes what is read).
type Sink<'a> = dyn FnMut(&Path, &mut dyn Read) -> std::io::Result<()> + 'a;

/// Streams the archive: parses `bundle.json` (the first entry), checks its paths (and, with
/// `runnable`, that its binary runs here, before any file is read), then hands each following
/// entry to `sink` and checks its size and sha256 against the manifest.
fn read_bundle(
    archive: &Path,
    runnable: bool,
    sink: &mut Sink<'_>,
) -> Result<BundleManifest, BundleError> {
    let file = std::fs::File::open(archive).map_err(|e| BundleError::io(archive, e))?;
    let gz = flate2::read::GzDecoder::new(std::io::BufReader::new(file));
    let mut tar = tar::Archive::new(gz);
    let mut entries = tar
        .entries()
        .map_err(|e| not_a_bundle(archive, e.to_string()))?;

    let first = entries
        .next()
        .ok_or_else(|| not_a_bundle(archive, "the archive is empty"))?
        .map_err(|e| not_a_bundle(archive, format!("not a gzip-compressed tar archive ({e})")))?;
    let name = first
        .path()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    if name != MANIFEST_NAME || !first.header().entry_type().is_file() {
        return Err(not_a_bundle(
            archive,
            format!("its first entry is `{name}`, not {MANIFEST_NAME}"),
        ));
    }
    let mut json = Vec::new();
    first
        .take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut json)
        .map_err(|e| not_a_bundle(archive, format!("{MANIFEST_NAME} unreadable: {e}")))?;
    if json.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(not_a_bundle(
            archive,
            format!("{MANIFEST_NAME} is larger than {MAX_MANIFEST_BYTES} bytes"),
        ));
    }
    let format = serde_json::from_slice::<serde_json::Value>(&json)
        .ok()
        .and_then(|v| v.get("format").and_then(serde_json::Value::as_u64));
    if let Some(found) = format.filter(|f| *f != u64::from(FORMAT)) {
        return Err(BundleError::UnsupportedFormat {
            archive: archive.to_path_buf(),
            found: u32::try_from(found).unwrap_or(u32::MAX),
            supported: FORMAT,
        });
    }
    let manifest: BundleManifest = serde_json::from_slice(&json)
        .map_err(|e| not_a_bundle(archive, format!("{MANIFEST_NAME}: {e}")))?;

    let mut expected: HashMap<&str, (&BundleFile, bool)> = HashMap::new();
    for f in &manifest.files {
        install_path(&f.path).map_err(|reason| unsafe_entry(archive, &f.path, reason))?;
        if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(not_a_bundle(
                archive,
                format!("{MANIFEST_NAME}: `{}` has no valid sha256", f.path),
            ));
        }
        if expected.insert(f.path.as_str(), (f, false)).is_some() {
            return Err(not_a_bundle(
                archive,
                format!("{MANIFEST_NAME} lists `{}` twice", f.path),
            ));
        }
    }

    if runnable {
        check_platform(archive, &manifest)?;
    }
    for entry in &mut entries {
        let entry = entry.map_err(|e| not_a_bundle(archive, format!("corrupt archive: {e}")))?;
        let name = entry
            .path()
            .map(|p| p.to_string_lossy().into_owned())
            .map_err(|e| not_a_bundle(archive, format!("corrupt archive: {e}")))?;
        let kind = entry.header().entry_type();
        if kind != tar::EntryType::Regular && kind != tar::EntryType::Continuous {
            return Err(unsafe_entry(
                archive,
                &name,
                format!("not a plain file ({kind:?})"),
            ));
        }
        let rel = install_path(&name).map_err(|reason| unsafe_entry(archive, &name, reason))?;
        let Some((record, seen)) = expected.get_mut(name.as_str()) else {
            return Err(mismatch(
                archive,
                &name,
                format!("not listed in {MANIFEST_NAME}"),
            ));
        };
        if *seen {
            return Err(mismatch(archive, &name, "appears twice in the archive"));
        }
        *seen = true;
        let record: &BundleFile = record;
        let declared = entry.header().size().unwrap_or(u64::MAX);
        if declared != record.bytes {
            return Err(mismatch(
                archive,
                &name,
                format!("{declared} bytes, the manifest says {}", record.bytes),
            ));
        }
        let mut reader = HashingReader::new(entry.take(record.bytes + 1));
        if let Err(e) = sink(&rel, &mut reader) {
            return Err(match reader.failed {
                Some(why) => not_a_bundle(archive, format!("corrupt archive at `{name}`: {why}")),
                None => BundleError::io(&rel, e),
            });
        }
        // Whatever the sink left unread still counts.
        std::io::copy(&mut reader, &mut std::io::sink())
            .map_err(|e| not_a_bundle(archive, format!("corrupt archive: {e}")))?;
        if reader.bytes != record.bytes {
            return Err(mismatch(
                archive,
                &name,
                format!("{} bytes, the manifest says {}", reader.bytes, record.bytes),
            ));
        }
        if reader.sha256() != record.sha256 {
            return Err(mismatch(
                archive,
                &name,
                "sha256 differs (damaged or altered)",
            ));
        }
    }
    // The end of the gzip stream (its CRC and length) too: a damaged or cut archive is
    // refused even where the damage falls after the last file.
    std::io::copy(&mut tar.into_inner(), &mut std::io::sink())
        .map_err(|e| not_a_bundle(archive, format!("damaged after its last file: {e}")))?;
    if let Some(path) = manifest
        .files
        .iter()
        .map(|f| f.path.as_str())
        .find(|p| expected.get(p).is_some_and(|(_, seen)| !seen))
    {
        return Err(mismatch(archive, path, "missing from the archive"));
    }
    Ok(manifest)
}
