//! The triage's indexes: one per repository and one per docs folder, under
//! `<data>/triage/indexes/`, built on first use (MiniLM embeddings, HNSW over sled) and
//! reused after: a later run re-embeds only files that changed.

use ferrograph_index::{
    index_dir, BertEmbedder, BuildOptions, EmbedOptions, Embedder, Index, IndexConfig, Query,
    Retriever,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Makes the embedder (tests may swap in a cheaper one).
pub type EmbedderFactory = Arc<dyn Fn() -> Result<Arc<dyn Embedder>, String> + Send + Sync>;

/// The default embedder: all-MiniLM-L6-v2 from `models/`.
pub fn minilm() -> EmbedderFactory {
    Arc::new(|| {
        BertEmbedder::default_model(EmbedOptions::default())
            .map(|e| Arc::new(e) as Arc<dyn Embedder>)
            .map_err(|e| e.to_string())
    })
}

/// One retrieved code chunk.
#[derive(Clone, Debug, PartialEq)]
pub struct RetrievedChunk {
    /// Path relative to the repository.
    pub path: String,
    /// First line.
    pub start_line: u32,
    /// Last line.
    pub end_line: u32,
    /// Best score over the queries.
    pub score: f32,
    /// Text.
    pub text: String,
}

impl RetrievedChunk {
    /// `path:start-end`.
    pub fn location(&self) -> String {
        format!("{}:{}-{}", self.path, self.start_line, self.end_line)
    }
}

/// Indexes by folder, opened once per process.
pub struct Retrieval {
    root: PathBuf,
    make_embedder: EmbedderFactory,
    embedder: tokio::sync::OnceCell<Arc<dyn Embedder>>,
    retrievers: tokio::sync::Mutex<HashMap<PathBuf, Retriever>>,
}

impl Retrieval {
    /// Indexes live under `root`.
    pub fn new(root: PathBuf, make_embedder: EmbedderFactory) -> Self {
        Retrieval {
            root,
            make_embedder,
            embedder: tokio::sync::OnceCell::new(),
            retrievers: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Where the index of `folder` lives.
    pub fn index_path(&self, folder: &Path) -> PathBuf {
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
        // FNV-1a of the absolute path: two folders with one name get two indexes.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in folder.to_string_lossy().bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.root.join(format!("{name}-{h:016x}"))
    }

    async fn embedder(&self) -> Result<Arc<dyn Embedder>, String> {
        let make = self.make_embedder.clone();
        self.embedder
            .get_or_try_init(|| async move {
                tokio::task::spawn_blocking(move || make())
                    .await
                    .map_err(|e| format!("loading the embedder panicked: {e}"))?
            })
            .await
            .cloned()
    }

    /// The retriever over `folder`'s index, building or refreshing the index first (once
    /// per process).
    pub async fn retriever(&self, folder: &str) -> Result<Retriever, String> {
        if folder.is_empty() {
            return Err("no folder given".into());
        }
        let dir = std::path::absolute(folder).map_err(|e| format!("{folder}: {e}"))?;
        if !dir.is_dir() {
            return Err(format!("{} is not a folder", dir.display()));
        }
        let mut cache = self.retrievers.lock().await;
        if let Some(r) = cache.get(&dir) {
            return Ok(r.clone());
        }
        let embedder = self.embedder().await?;
        let path = self.index_path(&dir);
        let (e, d) = (embedder.clone(), dir.clone());
        let index = tokio::task::spawn_blocking(move || -> Result<Index, String> {
            let index = Index::open_or_create(&path, IndexConfig::new(e.dim(), e.model_id()))
                .map_err(|err| format!("index {}: {err}", path.display()))?;
            let opts = BuildOptions {
                remove_missing: true,
                ..BuildOptions::default()
            };
            let report = index_dir(&index, e.as_ref(), &d, &opts, &mut |_| {})
                .map_err(|err| format!("indexing {}: {err}", d.display()))?;
            tracing::info!(folder = %d.display(), files = report.files_seen, embedded = report.chunks_embedded, "index ready");
            Ok(index)
        })
        .await
        .map_err(|e| format!("indexing panicked: {e}"))??;
        let r = Retriever::new(Arc::new(index), embedder).map_err(|e| e.to_string())?;
        cache.insert(dir, r.clone());
        Ok(r)
    }

    /// Searches `folder` for each of `queries` (`k` each) and merges the hits: one entry per
    /// chunk with its best score, best first.
    pub async fn search_repo(
        &self,
        folder: &str,
        queries: &[String],
        k: usize,
    ) -> Result<Vec<RetrievedChunk>, String> {
        let r = self.retriever(folder).await?;
        let mut best: HashMap<u64, RetrievedChunk> = HashMap::new();
        let mut seen_queries = std::collections::HashSet::new();
        for q in queries {
            let q = q.trim();
            if q.is_empty() || !seen_queries.insert(q.to_string()) {
                continue;
            }
            let hits = r
                .search_async(Query::new(q).k(k))
                .await
                .map_err(|e| e.to_string())?;
            for h in hits {
                let entry = best.entry(h.id).or_insert_with(|| RetrievedChunk {
                    path: h.path.clone(),
                    start_line: h.start_line,
                    end_line: h.end_line,
                    score: h.score,
                    text: h.text.clone(),
                });
                entry.score = entry.score.max(h.score);
            }
        }
        let mut out: Vec<RetrievedChunk> = best.into_values().collect();
        out.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.path.cmp(&b.path)));
        Ok(out)
    }
}
