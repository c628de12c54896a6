//! The triage's indexes: one per repository and one per docs folder, under
//! `<data>/triage/indexes/`, built on first use (MiniLM embeddings, HNSW over sled) and
//! reused after: a later run re-embeds only files that changed.

use super::evidence::Evidence;
use ferrograph_index::{
    index_dir, reciprocal_rank_fusion, BuildOptions, BuildProgress, Embedder, Hit, Index,
    IndexConfig, LexicalIndex, Query, Retriever,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use ferrograph_index::embed::{minilm, EmbedderFactory};

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

/// Reports index-build progress (files found and done, chunks embedded, seconds so far).
pub type IndexProgressHook = Arc<dyn Fn(&Path, &BuildProgress, f64) + Send + Sync>;

/// Indexes by folder, opened once per process.
pub struct Retrieval {
    root: PathBuf,
    make_embedder: EmbedderFactory,
    embedder: tokio::sync::OnceCell<Arc<dyn Embedder>>,
    retrievers: tokio::sync::Mutex<HashMap<PathBuf, (Retriever, Arc<LexicalIndex>)>>,
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
        self.root.join(ferrograph_index::build::index_name(folder))
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
        Ok(self.indexes(folder, None).await?.0)
    }

    /// The retriever and the lexical index over `folder`, building or refreshing the index
    /// first (once per process), reporting the build to `progress`.
    pub async fn indexes(
        &self,
        folder: &str,
        progress: Option<IndexProgressHook>,
    ) -> Result<(Retriever, Arc<LexicalIndex>), String> {
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
        let started = std::time::Instant::now();
        let embedder = self.embedder().await?;
        let path = self.index_path(&dir);
        let (e, d) = (embedder.clone(), dir.clone());
        let (index, lexical) = tokio::task::spawn_blocking(move || -> Result<(Index, LexicalIndex), String> {
            let index = Index::open_or_create(&path, IndexConfig::new(e.dim(), e.model_id()))
                .map_err(|err| format!("index {}: {err}", path.display()))?;
            let opts = BuildOptions {
                remove_missing: true,
                ..BuildOptions::default()
            };
            let report = index_dir(&index, e.as_ref(), &d, &opts, &mut |p| {
                if let Some(hook) = &progress {
                    hook(&d, p, started.elapsed().as_secs_f64());
                }
            })
            .map_err(|err| format!("indexing {}: {err}", d.display()))?;
            tracing::info!(folder = %d.display(), files = report.files_seen, embedded = report.chunks_embedded, "index ready");
            let lexical = LexicalIndex::build(&index)
                .map_err(|err| format!("lexical index of {}: {err}", d.display()))?;
            Ok((index, lexical))
        })
        .await
        .map_err(|e| format!("indexing panicked: {e}"))??;
        let r = Retriever::new(Arc::new(index), embedder).map_err(|e| e.to_string())?;
        let pair = (r, Arc::new(lexical));
        cache.insert(dir, pair.clone());
        Ok(pair)
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

/// What the codebase search looks for: free-text queries (title, hypothesis, error lines)
/// for both the vector and the lexical index, and the report's evidence for exact matches.
#[derive(Clone, Debug, Default)]
pub struct SearchPlan {
    /// Free-text queries, most important first.
    pub queries: Vec<String>,
    /// Code identifiers from the report (and from gaps the critic named).
    pub identifiers: Vec<String>,
    /// Constant words of the error messages, to find where they are raised.
    pub phrases: Vec<String>,
    /// Repository files the report's stack frames point at, innermost first, with the
    /// frame's line when known.
    pub frame_files: Vec<(String, Option<u32>)>,
    /// The innermost frame is a check that only raises (`_check_not_negative`): the message
    /// is raised there, but the refused value was made by its caller.
    pub raised_in_check: bool,
}

impl SearchPlan {
    /// The plan for a report: its title and error lines as queries, its identifiers,
    /// message phrases and frames (matched to `repo_files`).
    pub fn from_evidence(title: &str, ev: &Evidence, repo_files: &[String]) -> SearchPlan {
        let mut queries = vec![title.to_string()];
        queries.extend(ev.error_lines.iter().take(3).cloned());
        queries.extend(ev.code_lines.iter().take(2).cloned());
        let frame_files = ev
            .repo_files(repo_files)
            .into_iter()
            .map(|p| {
                let line = ev
                    .frames
                    .iter()
                    .rev()
                    .find(|f| super::evidence::match_repo_path(&f.file, repo_files) == Some(p))
                    .and_then(|f| f.line);
                (p.to_string(), line)
            })
            .collect();
        // A check that only raises is not where the refused value was made: its definition
        // is no lead.
        let check = ev.raising_check(repo_files);
        let identifiers = ev
            .identifiers
            .iter()
            .filter(|i| Some(i.rsplit(['.', ':']).next().unwrap_or(i)) != check)
            .cloned()
            .collect();
        SearchPlan {
            queries,
            identifiers,
            phrases: ev.message_phrases(),
            frame_files,
            raised_in_check: check.is_some(),
        }
    }

    /// The plan's search terms as one comparable set (to tell whether a second round would
    /// search for anything new).
    pub fn terms(&self) -> Vec<String> {
        let mut t: Vec<String> = self
            .queries
            .iter()
            .chain(&self.identifiers)
            .chain(&self.phrases)
            .map(|s| s.trim().to_lowercase())
            .filter(|s| !s.is_empty())
            .collect();
        t.sort();
        t.dedup();
        t
    }
}

/// One file in the fused ranking.
#[derive(Clone, Debug, PartialEq)]
pub struct RankedFile {
    /// Path relative to the repository.
    pub path: String,
    /// Fused score (after the tests/docs discount).
    pub score: f32,
    /// Why it ranks: which signals found it.
    pub signals: Vec<String>,
}

/// The codebase search's result: chunks and files in fused order.
#[derive(Clone, Debug, Default)]
pub struct CodeSearch {
    /// Chunks, best first (score: the fused score).
    pub chunks: Vec<RetrievedChunk>,
    /// Files, best first.
    pub files: Vec<RankedFile>,
    /// Every file path of the repository index.
    pub repo_files: Vec<String>,
}

/// Whether a path is a test, an example, documentation or packaging rather than the source
/// it is about: such files rank below source files.
pub fn is_secondary(path: &str) -> bool {
    let p = path.to_lowercase();
    let name = p.rsplit('/').next().unwrap_or(&p);
    p.starts_with("test/")
        || p.starts_with("tests/")
        || p.contains("/tests/")
        || p.contains("/test/")
        || p.starts_with("docs/")
        || p.contains("/docs/")
        || p.starts_with("examples/")
        || p.contains("/examples/")
        || p.starts_with("benches/")
        || p.starts_with("benchmarks/")
        || name.starts_with("test_")
        || name.ends_with("_test.py")
        || name.ends_with("_tests.rs")
        || name == "conftest.py"
        || name == "setup.py"
        || name == "noxfile.py"
        || name == "tasks.py"
        || name == "build.rs"
        || name.contains("version")
        || name.ends_with(".md")
        || name.ends_with(".rst")
        || name.ends_with(".txt")
        || name.ends_with(".toml")
        || name.ends_with(".cfg")
        || name.ends_with(".ini")
        || name.ends_with(".json")
        || name.ends_with(".yml")
        || name.ends_with(".yaml")
}

/// Files ranked from chunk lists: a file's score is its best chunk's plus a third of its
/// second best; secondary files (tests, docs, packaging) count half.
fn rank_files(chunks: &[(Hit, f32)], signals: &HashMap<String, Vec<String>>) -> Vec<RankedFile> {
    let mut per_file: HashMap<&str, Vec<f32>> = HashMap::new();
    for (h, s) in chunks {
        per_file.entry(h.path.as_str()).or_default().push(*s);
    }
    let mut files: Vec<RankedFile> = per_file
        .into_iter()
        .map(|(path, mut scores)| {
            scores.sort_by(|a, b| b.total_cmp(a));
            let mut score = scores[0] + scores.get(1).copied().unwrap_or(0.0) / 3.0;
            if is_secondary(path) {
                score *= 0.5;
            }
            RankedFile {
                path: path.to_string(),
                score,
                signals: signals.get(path).cloned().unwrap_or_default(),
            }
        })
        .collect();
    files.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.path.cmp(&b.path)));
    files
}

/// Whether `text` defines `name` (a function, class, type, method or module-level constant).
fn defines(text: &str, name: &str) -> bool {
    const KEYWORDS: &[&str] = &[
        "def ",
        "class ",
        "fn ",
        "struct ",
        "enum ",
        "trait ",
        "type ",
        "function ",
        "const ",
        "static ",
        "mod ",
        "async def ",
        "interface ",
    ];
    for line in text.lines() {
        let t = line.trim_start();
        let t = t.strip_prefix("pub ").unwrap_or(t);
        let t = t.strip_prefix("pub(crate) ").unwrap_or(t);
        for k in KEYWORDS {
            if let Some(rest) = t.strip_prefix(k) {
                if rest.starts_with(name)
                    && !rest[name.len()..]
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_')
                {
                    return true;
                }
            }
        }
        if let Some(rest) = line.strip_prefix(name) {
            let after = rest.trim_start();
            if after.starts_with('=') && !after.starts_with("==") {
                return true;
            }
        }
    }
    false
}

impl Retrieval {
    /// Hybrid code search over `folder`: for every query, the vector index (MiniLM + HNSW)
    /// and the lexical index (BM25); the identifiers as one lexical query; chunks that define
    /// an identifier of the report, that contain an error message's constant words, or that
    /// the stack frames point at, as exact-match lists. The lists are fused by weighted
    /// reciprocal rank fusion; files are ranked from their chunks with tests and docs below
    /// the source.
    pub async fn code_search(
        &self,
        folder: &str,
        plan: &SearchPlan,
        progress: Option<IndexProgressHook>,
    ) -> Result<CodeSearch, String> {
        let (retriever, lexical) = self.indexes(folder, progress).await?;
        let plan = plan.clone();
        tokio::task::spawn_blocking(move || hybrid(&retriever, &lexical, &plan))
            .await
            .map_err(|e| format!("code search panicked: {e}"))?
    }

    /// Every file path of `folder`'s index (building it first, reporting to `progress`).
    pub async fn repo_files_with(
        &self,
        folder: &str,
        progress: Option<IndexProgressHook>,
    ) -> Result<Vec<String>, String> {
        let (_, lexical) = self.indexes(folder, progress).await?;
        let mut files: Vec<String> = lexical.chunks().values().map(|h| h.path.clone()).collect();
        files.sort();
        files.dedup();
        Ok(files)
    }

    /// [`Retrieval::retriever`], reporting an index build to `progress`.
    pub async fn retriever_with(
        &self,
        folder: &str,
        progress: Option<IndexProgressHook>,
    ) -> Result<Retriever, String> {
        Ok(self.indexes(folder, progress).await?.0)
    }

    /// Baseline: files ranked by the lexical index alone for one query.
    pub async fn lexical_baseline(&self, folder: &str, query: &str) -> Result<Vec<String>, String> {
        let (_, lexical) = self.indexes(folder, None).await?;
        let hits = lexical.search(query, 100);
        Ok(files_in_order(hits.iter().map(|h| h.path.as_str())))
    }

    /// Baseline: files ranked by the vector index alone for one query.
    pub async fn vector_baseline(&self, folder: &str, query: &str) -> Result<Vec<String>, String> {
        let (retriever, _) = self.indexes(folder, None).await?;
        let hits = retriever
            .search_async(Query::new(clip_query(query)).k(100))
            .await
            .map_err(|e| e.to_string())?;
        Ok(files_in_order(hits.iter().map(|h| h.path.as_str())))
    }
}

/// MiniLM reads at most 256 tokens; longer queries are cut at about that.
fn clip_query(q: &str) -> String {
    q.chars().take(1000).collect()
}

fn files_in_order<'a>(paths: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in paths {
        if !out.iter().any(|o| o == p) {
            out.push(p.to_string());
        }
    }
    out
}

fn hybrid(
    retriever: &Retriever,
    lexical: &LexicalIndex,
    plan: &SearchPlan,
) -> Result<CodeSearch, String> {
    const K: usize = 30;
    let mut lists: Vec<(f32, Vec<u64>)> = Vec::new();
    let mut signals: HashMap<String, Vec<String>> = HashMap::new();
    let mut note = |path: &str, s: String| {
        let v = signals.entry(path.to_string()).or_default();
        if !v.contains(&s) && v.len() < 4 {
            v.push(s);
        }
    };
    let mut seen = std::collections::HashSet::new();
    for (i, q) in plan.queries.iter().enumerate() {
        let q = q.trim();
        if q.is_empty() || !seen.insert(q.to_lowercase()) {
            continue;
        }
        let w = if i == 0 { 1.0 } else { 0.7 };
        let v = retriever
            .search(&Query::new(clip_query(q)).k(K))
            .map_err(|e| e.to_string())?;
        lists.push((w, v.iter().map(|h| h.id).collect()));
        let l = lexical.search(q, K);
        lists.push((w, l.iter().map(|h| h.id).collect()));
    }
    if !plan.identifiers.is_empty() {
        let l = lexical.search(&plan.identifiers.join(" "), K);
        lists.push((1.5, l.iter().map(|h| h.id).collect()));
    }
    // Where the message is raised matters most without a stack trace; with one, the frames
    // say more (the raise may sit in a check called by the faulty code).
    // When the raise sits in a check function, the message's location is the check's file,
    // which the stack trace already names and which says least of all: the phrases are left
    // out.
    let phrase_weight = if plan.frame_files.is_empty() {
        2.0
    } else if plan.raised_in_check {
        0.0
    } else {
        1.0
    };
    // Exact matches over every chunk.
    let mut ids: Vec<&u64> = lexical.chunks().keys().collect();
    ids.sort();
    let mut definitions: Vec<(usize, u64)> = Vec::new();
    let mut phrases: Vec<(usize, u64)> = Vec::new();
    // One list per stack frame: the innermost frame's chunks say most.
    let mut frames: Vec<Vec<(usize, u64)>> = vec![Vec::new(); plan.frame_files.len()];
    for id in ids {
        let Some(h) = lexical.chunks().get(id) else {
            continue;
        };
        for (rank, ident) in plan.identifiers.iter().enumerate() {
            let name = ident.rsplit(['.', ':']).next().unwrap_or(ident);
            if name.len() >= 4 && defines(&h.text, name) {
                definitions.push((rank, *id));
                note(&h.path, format!("defines `{name}`"));
                break;
            }
        }
        let lower = h.text.to_lowercase();
        for (rank, p) in plan.phrases.iter().enumerate() {
            if phrase_weight <= 0.0 {
                break;
            }
            if lower.contains(&p.to_lowercase()) {
                phrases.push((rank, *id));
                note(&h.path, format!("contains \"{p}\""));
                break;
            }
        }
        for (rank, (path, line)) in plan.frame_files.iter().enumerate() {
            if &h.path == path {
                let at_line = line.is_some_and(|l| h.start_line <= l && l <= h.end_line);
                if let Some(list) = frames.get_mut(rank) {
                    list.push((usize::from(!at_line), *id));
                }
                note(&h.path, "in the stack trace".to_string());
            }
        }
    }
    let mut exact = vec![(2.0, definitions), (phrase_weight, phrases)];
    // The caller of a check that raised computed the refused value: its frame is the prime
    // suspect.
    let mut frame_weight = if plan.raised_in_check { 2.5 } else { 1.5 };
    for list in frames {
        exact.push((frame_weight, list));
        frame_weight *= 0.6;
    }
    for (weight, mut list) in exact {
        if weight <= 0.0 {
            continue;
        }
        list.sort();
        if !list.is_empty() {
            lists.push((weight, list.into_iter().map(|(_, id)| id).collect()));
        }
    }
    let fused = reciprocal_rank_fusion(&lists, 60.0);
    let scored: Vec<(Hit, f32)> = fused
        .iter()
        .filter_map(|(id, s)| lexical.chunks().get(id).map(|h| (h.clone(), *s)))
        .collect();
    let files = rank_files(&scored, &signals);
    let mut chunks: Vec<RetrievedChunk> = scored
        .into_iter()
        .map(|(h, s)| RetrievedChunk {
            path: h.path,
            start_line: h.start_line,
            end_line: h.end_line,
            score: s,
            text: h.text,
        })
        .collect();
    // Chunks of secondary files after those of source files of the same standing.
    let rank_of: HashMap<&str, usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (f.path.as_str(), i))
        .collect();
    chunks.sort_by(|a, b| {
        let fa = rank_of.get(a.path.as_str()).copied().unwrap_or(usize::MAX);
        let fb = rank_of.get(b.path.as_str()).copied().unwrap_or(usize::MAX);
        fa.cmp(&fb).then(b.score.total_cmp(&a.score))
    });
    let mut repo_files: Vec<String> = lexical.chunks().values().map(|h| h.path.clone()).collect();
    repo_files.sort();
    repo_files.dedup();
    Ok(CodeSearch {
        chunks,
        files,
        repo_files,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn definitions_are_found_and_calls_are_not() {
        assert!(defines(
            "x = 1\ndef apply_discounts(a, b):\n    pass",
            "apply_discounts"
        ));
        assert!(defines(
            "    pub fn parse_duration(s: &str)",
            "parse_duration"
        ));
        assert!(defines("DEFAULT_RATE = 0.19\n", "DEFAULT_RATE"));
        assert!(!defines("net = apply_discounts(a, b)", "apply_discounts"));
        assert!(!defines("def apply_discounts_v2():", "apply_discounts"));
    }

    #[test]
    fn tests_docs_and_packaging_are_secondary() {
        for p in [
            "tests/test_x.py",
            "pkg/tests/util.py",
            "docs/conf.py",
            "README.md",
            "setup.py",
            "pkg/_version.py",
            "test_api.py",
            "Cargo.toml",
        ] {
            assert!(is_secondary(p), "{p}");
        }
        for p in ["pkg/discounts.py", "src/lib.rs", "src/parser.rs"] {
            assert!(!is_secondary(p), "{p}");
        }
    }
}
