//! Indexing a folder: walk, chunk, embed (only changed files), commit per batch.

use crate::chunk::{chunk_document, language_for_path, ChunkOptions};
use crate::embed::Embedder;
use crate::error::{IndexError, Result};
use crate::index::Index;
use crate::types::{ChunkMeta, DocumentUpdate, NewChunk};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What [`index_dir`] indexes and how.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Chunk sizes.
    pub chunk: ChunkOptions,
    /// Files larger than this are skipped.
    pub max_file_bytes: u64,
    /// Chunks embedded and committed together.
    pub batch_chunks: usize,
    /// Folder names never entered.
    pub skip_dirs: Vec<String>,
    /// Remove documents whose files are gone.
    pub remove_missing: bool,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            chunk: ChunkOptions::default(),
            max_file_bytes: 1 << 20,
            batch_chunks: 128,
            skip_dirs: [
                "target",
                "node_modules",
                "__pycache__",
                "venv",
                "dist",
                "build",
                "models",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            remove_missing: true,
        }
    }
}

/// Progress of a build, reported after the scan and after every committed batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildProgress {
    /// Files found.
    pub files_total: usize,
    /// Files processed so far.
    pub files_done: usize,
    /// Chunks embedded so far.
    pub chunks_embedded: usize,
}

/// What a build did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct BuildReport {
    /// Files found.
    pub files_seen: usize,
    /// Files (re)indexed.
    pub files_indexed: usize,
    /// Files whose content was unchanged (not re-embedded).
    pub files_unchanged: usize,
    /// Documents removed because their files are gone.
    pub files_removed: usize,
    /// Files skipped (too large, not UTF-8, unreadable).
    pub files_skipped: usize,
    /// Chunks embedded.
    pub chunks_embedded: usize,
    /// Wall time.
    #[serde(with = "secs")]
    pub elapsed: Duration,
}

mod secs {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

/// The `module` of a path: the crate or package folder (`crates/<name>/...` → `<name>`,
/// `packages/<name>/...` → `<name>`), else the first folder, else `root`.
pub fn module_of(rel: &str) -> String {
    let parts: Vec<&str> = rel.split('/').collect();
    match parts.as_slice() {
        [top, name, _, ..] if ["crates", "packages", "libs", "apps"].contains(top) => {
            (*name).to_string()
        }
        [dir, _, ..] => (*dir).to_string(),
        _ => "root".to_string(),
    }
}

/// A folder name for the index of `folder`: its last component (letters, digits, `-`, `_`)
/// and a hash of its absolute path, so that two folders with one name get two indexes.
pub fn index_name(folder: &Path) -> String {
    let name: String = folder
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // FNV-1a: stable across builds and platforms, unlike the standard library's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in folder.to_string_lossy().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{name}-{h:016x}")
}

/// Files under `root` worth indexing (known languages), sorted, as (absolute, relative)
/// paths. Hidden entries, symlinks and `skip_dirs` are not followed.
pub fn collect_files(root: &Path, opts: &BuildOptions) -> Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let rd = std::fs::read_dir(&dir).map_err(|e| IndexError::io(&dir, e))?;
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let Ok(ft) = e.file_type() else { continue };
            let path = e.path();
            if ft.is_dir() {
                if !opts.skip_dirs.contains(&name) {
                    stack.push(path);
                }
            } else if ft.is_file() {
                let Ok(rel) = path.strip_prefix(root) else {
                    continue;
                };
                let rel: String = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                if language_for_path(&rel).is_some() {
                    out.push((path, rel));
                }
            }
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(out)
}

/// Hex sha256 of a text.
pub fn content_hash(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Chunks one document into chunks without vectors (metadata and text).
pub fn chunk_file(rel: &str, text: &str, opts: &ChunkOptions) -> Vec<(ChunkMeta, String)> {
    let language = language_for_path(rel).unwrap_or("text");
    let module = module_of(rel);
    chunk_document(text, language, opts)
        .into_iter()
        .map(|c| {
            let mut metadata = BTreeMap::new();
            metadata.insert("module".to_string(), module.clone());
            if let Some(t) = c.title {
                let key = if language == "markdown" {
                    "heading"
                } else {
                    "item"
                };
                metadata.insert(key.to_string(), t);
            }
            (
                ChunkMeta {
                    path: rel.to_string(),
                    start_line: c.start_line,
                    end_line: c.end_line,
                    language: language.to_string(),
                    metadata,
                },
                c.text,
            )
        })
        .collect()
}

/// The text given to the embedder for a chunk: its path, then its text (the path helps
/// queries that name a module or file).
pub fn embedding_text(meta: &ChunkMeta, text: &str) -> String {
    format!("{}\n{}", meta.path, text)
}

struct Pending {
    rel: String,
    hash: String,
    chunks: Vec<(ChunkMeta, String)>,
}

fn flush(
    index: &Index,
    embedder: &dyn Embedder,
    pending: &mut Vec<Pending>,
    report: &mut BuildReport,
) -> Result<()> {
    if pending.is_empty() {
        return Ok(());
    }
    let inputs: Vec<String> = pending
        .iter()
        .flat_map(|p| p.chunks.iter().map(|(m, t)| embedding_text(m, t)))
        .collect();
    let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let mut vectors = embedder.embed(&refs)?.into_iter();
    let mut docs = Vec::with_capacity(pending.len());
    for p in pending.drain(..) {
        let mut chunks = Vec::with_capacity(p.chunks.len());
        for (meta, text) in p.chunks {
            let vector = vectors
                .next()
                .ok_or_else(|| IndexError::Embedding("embedder returned too few vectors".into()))?;
            chunks.push(NewChunk { meta, text, vector });
        }
        report.chunks_embedded += chunks.len();
        docs.push(DocumentUpdate {
            path: p.rel,
            content_hash: p.hash,
            chunks,
        });
    }
    index.upsert_documents(docs)?;
    Ok(())
}

/// Indexes the files under `root` into `index`: new and changed files are chunked, embedded
/// and committed in batches (each document atomically); unchanged files are skipped without
/// embedding; documents whose files are gone are removed (with `remove_missing`). The graph
/// is saved at the end. `progress` is called after the scan and after every batch.
pub fn index_dir(
    index: &Index,
    embedder: &dyn Embedder,
    root: &Path,
    opts: &BuildOptions,
    progress: &mut dyn FnMut(&BuildProgress),
) -> Result<BuildReport> {
    let start = Instant::now();
    if embedder.model_id() != index.config().model {
        return Err(IndexError::ModelMismatch {
            index: index.config().model.clone(),
            embedder: embedder.model_id().to_string(),
        });
    }
    if embedder.dim() != index.config().dim {
        return Err(IndexError::Dimension {
            expected: index.config().dim,
            got: embedder.dim(),
        });
    }
    let files = collect_files(root, opts)?;
    let mut report = BuildReport {
        files_seen: files.len(),
        ..Default::default()
    };
    let mut prog = BuildProgress {
        files_total: files.len(),
        files_done: 0,
        chunks_embedded: 0,
    };
    progress(&prog);
    let mut pending: Vec<Pending> = Vec::new();
    let mut pending_chunks = 0;
    let mut seen = HashSet::new();
    for (abs, rel) in &files {
        seen.insert(rel.clone());
        let size = std::fs::metadata(abs).map(|m| m.len()).unwrap_or(u64::MAX);
        let text = if size <= opts.max_file_bytes {
            std::fs::read(abs)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
        } else {
            None
        };
        prog.files_done += 1;
        let Some(text) = text else {
            report.files_skipped += 1;
            continue;
        };
        let hash = content_hash(&text);
        if index.document_hash(rel)?.as_deref() == Some(hash.as_str()) {
            report.files_unchanged += 1;
            continue;
        }
        let chunks = chunk_file(rel, &text, &opts.chunk);
        report.files_indexed += 1;
        pending_chunks += chunks.len();
        pending.push(Pending {
            rel: rel.clone(),
            hash,
            chunks,
        });
        if pending_chunks >= opts.batch_chunks.max(1) {
            flush(index, embedder, &mut pending, &mut report)?;
            pending_chunks = 0;
            prog.chunks_embedded = report.chunks_embedded;
            progress(&prog);
        }
    }
    flush(index, embedder, &mut pending, &mut report)?;
    if opts.remove_missing {
        let gone: Vec<String> = index
            .documents()?
            .into_iter()
            .filter(|d| !seen.contains(d))
            .collect();
        report.files_removed = gone.len();
        if !gone.is_empty() {
            index.delete_documents(&gone)?;
        }
    }
    index.save()?;
    prog.chunks_embedded = report.chunks_embedded;
    prog.files_done = files.len();
    progress(&prog);
    report.elapsed = start.elapsed();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules() {
        assert_eq!(
            module_of("crates/ferrograph-llm/src/lib.rs"),
            "ferrograph-llm"
        );
        assert_eq!(module_of("src/lib.rs"), "src");
        assert_eq!(module_of("README.md"), "root");
        assert_eq!(module_of("crates/x"), "crates");
    }
}
