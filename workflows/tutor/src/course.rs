//! The course material: one folder per subject, each with its notes (`*.md`) and a `guide.md`
//! (the seed's "guía docente"); an index over all of it with the subject in every chunk's
//! metadata, built on first use and refreshed when files change.
//!
//! The two subjects this repository ships (`networks`, `databases`) are compiled into the
//! binary and written out on first use, so `ferrograph chat tutor` works from any folder and
//! from an installed bundle.

use crate::state::ContextChunk;
use ferrograph_index::build::{chunk_file, content_hash, embedding_text};
use ferrograph_index::{
    BuildOptions, DocumentUpdate, Embedder, Filter, Index, IndexConfig, NewChunk, Query, Retriever,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The course files shipped with the tutor: (path under the course folder, text).
pub const BUILTIN_COURSE: &[(&str, &str)] = &[
    (
        "networks/guide.md",
        include_str!("../course/networks/guide.md"),
    ),
    (
        "networks/layers.md",
        include_str!("../course/networks/layers.md"),
    ),
    (
        "networks/transport.md",
        include_str!("../course/networks/transport.md"),
    ),
    (
        "networks/routing.md",
        include_str!("../course/networks/routing.md"),
    ),
    ("networks/dns.md", include_str!("../course/networks/dns.md")),
    (
        "databases/guide.md",
        include_str!("../course/databases/guide.md"),
    ),
    (
        "databases/sql.md",
        include_str!("../course/databases/sql.md"),
    ),
    (
        "databases/normalisation.md",
        include_str!("../course/databases/normalisation.md"),
    ),
    (
        "databases/transactions.md",
        include_str!("../course/databases/transactions.md"),
    ),
    (
        "databases/indexes.md",
        include_str!("../course/databases/indexes.md"),
    ),
];

/// The guide's file name in each subject folder.
pub const GUIDE_FILE: &str = "guide.md";

/// What went wrong with the course material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CourseError {
    /// The subject has no folder.
    #[error("unknown subject `{subject}` (the course folder {dir} has: {available})")]
    UnknownSubject {
        /// Asked for.
        subject: String,
        /// The course folder.
        dir: String,
        /// The subjects it has.
        available: String,
    },
    /// A subject folder has no guide.
    #[error("the subject `{0}` has no {GUIDE_FILE}")]
    NoGuide(String),
    /// Reading or writing the files.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The index.
    #[error("the course index: {0}")]
    Index(#[from] ferrograph_index::IndexError),
    /// The embedding model could not be loaded.
    #[error("the embedding model: {0}")]
    Embedder(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CourseError {
    let what = what.into();
    move |source| CourseError::Io { what, source }
}

/// Writes the built-in course into `dir` when `dir` does not exist yet (a folder that exists
/// is the user's and is left as it is).
pub fn ensure_builtin(dir: &Path) -> Result<(), CourseError> {
    if dir.exists() {
        return Ok(());
    }
    for (rel, text) in BUILTIN_COURSE {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io(format!("creating {}", parent.display())))?;
        }
        std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))?;
    }
    Ok(())
}

/// The subjects of a course folder: its subfolders, sorted.
pub fn subjects(dir: &Path) -> Result<Vec<String>, CourseError> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(io(format!("reading {}", dir.display())))?;
    for e in entries.flatten() {
        if e.path().is_dir() {
            if let Some(name) = e.file_name().to_str() {
                if !name.starts_with('.') {
                    out.push(name.to_string());
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Checks that `subject` is one of the course's subjects.
pub fn check_subject(dir: &Path, subject: &str) -> Result<(), CourseError> {
    let all = subjects(dir)?;
    if all.iter().any(|s| s == subject) {
        Ok(())
    } else {
        Err(CourseError::UnknownSubject {
            subject: subject.to_string(),
            dir: dir.display().to_string(),
            available: if all.is_empty() {
                "no subjects".into()
            } else {
                all.join(", ")
            },
        })
    }
}

/// The subject's course guide.
pub fn guide(dir: &Path, subject: &str) -> Result<String, CourseError> {
    check_subject(dir, subject)?;
    let path = dir.join(subject).join(GUIDE_FILE);
    if !path.is_file() {
        return Err(CourseError::NoGuide(subject.to_string()));
    }
    read_notes(&path)
}

/// A file of notes as the tutor uses it: its Markdown made readable ([`crate::clean`]).
pub fn read_notes(path: &Path) -> Result<String, CourseError> {
    std::fs::read_to_string(path)
        .map(|t| crate::clean::readable(&t))
        .map_err(io(format!("reading {}", path.display())))
}

/// All of a subject's material (notes and guide), for checking what an answer states.
pub fn material(dir: &Path, subject: &str) -> String {
    let folder = dir.join(subject);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&folder)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .filter(|p| p.extension().and_then(|x| x.to_str()) == Some("md"))
        .filter_map(|p| read_notes(p).ok())
        .collect::<Vec<_>>()
        .join("\n")
}

pub use ferrograph_index::embed::{minilm, EmbedderFactory};

/// The course index, opened (and brought up to date) once per process.
pub struct CourseIndex {
    course_dir: PathBuf,
    index_dir: PathBuf,
    make_embedder: EmbedderFactory,
    retriever: tokio::sync::OnceCell<Arc<Retriever>>,
    /// Each subject's material, read once per process like the index.
    material: std::sync::Mutex<BTreeMap<String, Arc<str>>>,
}

impl CourseIndex {
    /// An index of `course_dir` kept in `index_dir`.
    pub fn new(course_dir: PathBuf, index_dir: PathBuf, make_embedder: EmbedderFactory) -> Self {
        CourseIndex {
            course_dir,
            index_dir,
            make_embedder,
            retriever: tokio::sync::OnceCell::new(),
            material: std::sync::Mutex::new(BTreeMap::new()),
        }
    }

    /// The course folder.
    pub fn course_dir(&self) -> &Path {
        &self.course_dir
    }

    /// All of `subject`'s material (see [`material`]), read the first time it is asked for.
    pub fn material(&self, subject: &str) -> Arc<str> {
        let mut cache = self
            .material
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        cache
            .entry(subject.to_string())
            .or_insert_with(|| material(&self.course_dir, subject).into())
            .clone()
    }

    /// The retriever, building or refreshing the index the first time.
    pub async fn retriever(&self) -> Result<Arc<Retriever>, CourseError> {
        self.retriever
            .get_or_try_init(|| async {
                let course = self.course_dir.clone();
                let index = self.index_dir.clone();
                let make = self.make_embedder.clone();
                tokio::task::spawn_blocking(move || open_index(&course, &index, &make))
                    .await
                    .map_err(|e| CourseError::Embedder(format!("indexing panicked: {e}")))?
            })
            .await
            .cloned()
    }

    /// The `k` passages of `subject`'s notes closest to `query`.
    pub async fn search(
        &self,
        subject: &str,
        query: &str,
        k: usize,
    ) -> Result<Vec<ContextChunk>, CourseError> {
        let retriever = self.retriever().await?;
        let q = Query::new(query)
            .k(k)
            .filter(Filter::eq("subject", subject));
        let hits = retriever.search_async(q).await?;
        Ok(hits
            .into_iter()
            .map(|h| ContextChunk {
                heading: h.metadata.get("heading").cloned().unwrap_or_default(),
                path: h.path,
                text: h.text,
                score: h.score,
            })
            .collect())
    }
}

impl CourseIndex {
    /// The note of `subject` named after `name` (`sled` → `sled.md`; case, `-`, `_` and
    /// spaces ignored), if there is one.
    fn note_named(&self, subject: &str, name: &str) -> Option<PathBuf> {
        let key = |s: &str| s.to_lowercase().replace(['-', '_', ' '], "");
        let want = key(name);
        if want.is_empty() || want == "guide" {
            return None;
        }
        let folder = self.course_dir.join(subject);
        let found = std::fs::read_dir(&folder)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.extension().and_then(|x| x.to_str()) == Some("md")
                    && p.file_stem().and_then(|s| s.to_str()).map(key) == Some(want.clone())
            });
        found
    }

    /// The sections (split at headings) of the note of `subject` named after `name`, in
    /// order; empty when there is no such note.
    pub fn sections(&self, subject: &str, name: &str) -> Vec<ContextChunk> {
        let Some(path) = self.note_named(subject, name) else {
            return Vec::new();
        };
        let Ok(text) = read_notes(&path) else {
            return Vec::new();
        };
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default()
            .to_string();
        let mut out: Vec<ContextChunk> = Vec::new();
        let mut cur = ContextChunk {
            path: format!("{subject}/{file}"),
            ..ContextChunk::default()
        };
        let mut in_code = false;
        for line in text.lines() {
            if line.starts_with("```") {
                in_code = !in_code;
            }
            if !in_code && line.starts_with('#') {
                if !cur.text.trim().is_empty() {
                    out.push(cur.clone());
                }
                cur.heading = line.trim_start_matches('#').trim().to_string();
                cur.text.clear();
            }
            cur.text.push_str(line);
            cur.text.push('\n');
        }
        if !cur.text.trim().is_empty() {
            out.push(cur);
        }
        out
    }

    /// The opening of the note of `subject` named after `name` (`sled` → `sled.md`; case,
    /// `-` and `_` ignored): its first heading and the text up to the next heading, at most
    /// `max_chars`. A README begins by saying what its subject is, and a question like "What
    /// is sled?" is answered there, while a search for the name alone often lands on the
    /// passages that repeat it most (thanks, links, related projects).
    pub fn lead(&self, subject: &str, name: &str, max_chars: usize) -> Option<ContextChunk> {
        // Text before the first heading is a web page's banner (taglines, links): the lead
        // starts at the first heading and ends at the next one that follows prose, or at code
        // after prose.
        let sections = self.sections(subject, name);
        let start = sections.iter().position(|c| !c.heading.is_empty())?;
        let mut body = String::new();
        'sections: for section in &sections[start..] {
            let mut in_code = false;
            // The section's first line is its heading.
            for line in section.text.lines().skip(1) {
                if line.starts_with("```") {
                    if !body.trim().is_empty() {
                        break 'sections;
                    }
                    in_code = !in_code;
                    continue;
                }
                if !in_code {
                    body.push_str(line);
                    body.push('\n');
                }
            }
            if !body.trim().is_empty() {
                break;
            }
        }
        let body = body.trim();
        if body.is_empty() {
            return None;
        }
        let mut lead = sections.into_iter().nth(start)?;
        lead.text = crate::text::clip(body, max_chars);
        lead.score = 1.0;
        Some(lead)
    }
}

/// Opens (or creates) the index and re-embeds the files that changed since it was written;
/// files that are gone are removed from it.
fn open_index(
    course: &Path,
    dir: &Path,
    make: &EmbedderFactory,
) -> Result<Arc<Retriever>, CourseError> {
    ensure_builtin(course)?;
    let embedder = make().map_err(CourseError::Embedder)?;
    let index = Arc::new(Index::open_or_create(
        dir,
        IndexConfig::new(embedder.dim(), embedder.model_id()),
    )?);
    let opts = BuildOptions::default();
    let mut present = BTreeMap::new();
    for subject in subjects(course)? {
        let folder = course.join(&subject);
        let entries =
            std::fs::read_dir(&folder).map_err(io(format!("reading {}", folder.display())))?;
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().and_then(|x| x.to_str()) != Some("md") {
                continue;
            }
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            present.insert(format!("{subject}/{name}"), (subject.clone(), path.clone()));
        }
    }
    let mut updates = Vec::new();
    for (rel, (subject, path)) in &present {
        let text = read_notes(path)?;
        let hash = content_hash(&text);
        if index.document_hash(rel)?.as_deref() == Some(hash.as_str()) {
            continue;
        }
        let chunks = chunk_file(rel, &text, &opts.chunk);
        let texts: Vec<String> = chunks.iter().map(|(m, t)| embedding_text(m, t)).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let vectors = embedder.embed(&refs)?;
        let chunks = chunks
            .into_iter()
            .zip(vectors)
            .map(|((mut meta, text), vector)| {
                meta.metadata.insert("subject".into(), subject.clone());
                NewChunk { meta, text, vector }
            })
            .collect();
        updates.push(DocumentUpdate {
            path: rel.clone(),
            content_hash: hash,
            chunks,
        });
    }
    let gone: Vec<String> = index
        .documents()?
        .into_iter()
        .filter(|d| !present.contains_key(d))
        .collect();
    let changed = !updates.is_empty() || !gone.is_empty();
    if !gone.is_empty() {
        index.delete_documents(&gone)?;
    }
    if !updates.is_empty() {
        tracing::info!(files = updates.len(), "indexing the course notes");
        index.upsert_documents(updates)?;
    }
    if changed {
        index.save()?;
    }
    Ok(Arc::new(Retriever::new(index, embedder)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_named_after_the_question_gives_its_opening() {
        let dir = tempfile::tempdir().unwrap();
        let course = dir.path().join("course");
        std::fs::create_dir_all(course.join("crates")).unwrap();
        std::fs::write(
            course.join("crates/dash-map.md"),
            "<p>buy us a coffee to keep going</p>\n\n# DashMap\n\n```rust\nlet m = 1;\n```\n\nBlazingly fast concurrent map in Rust.\n\nDashMap is an implementation of a concurrent hashmap.\n\n## Usage\n\nAdd it.\n",
        )
        .unwrap();
        let idx = CourseIndex::new(course, dir.path().join("index"), minilm());
        let lead = idx.lead("crates", "Dash_Map", 450).unwrap();
        assert_eq!(lead.path, "crates/dash-map.md");
        assert_eq!(lead.heading, "DashMap");
        assert_eq!(
            lead.text,
            "Blazingly fast concurrent map in Rust.\n\nDashMap is an implementation of a concurrent hashmap."
        );
        assert!(idx.lead("crates", "tokio", 450).is_none());
        let sections = idx.sections("crates", "dashmap");
        assert_eq!(
            sections
                .iter()
                .map(|c| c.heading.as_str())
                .collect::<Vec<_>>(),
            ["", "DashMap", "Usage"]
        );
        assert!(sections[1].text.contains("```rust\nlet m = 1;\n```"));
        assert!(idx.lead("nothing", "dashmap", 450).is_none());
    }
}
