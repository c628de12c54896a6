//! The index: sled is the source of truth (chunks, vectors, metadata, documents); the HNSW
//! graph is a cache rebuilt from the stored vectors (never by re-embedding).

use crate::distance::{dot, normalize};
use crate::error::{IndexError, Result};
use crate::graph::{self, Graph};
use crate::types::{matches_all, ChunkMeta, DocumentUpdate, Filter, Hit, NewChunk};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Version of the store layout.
const STORE_FORMAT: u32 = 1;
/// Most chunks in one sled transaction (documents are never split across transactions).
const TX_CHUNKS: usize = 4096;

/// HNSW parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HnswParams {
    /// Links per point (hnsw `M`).
    pub m: usize,
    /// Candidate list size while building.
    pub ef_construction: usize,
    /// Default candidate list size while searching (raised to `k` when smaller).
    pub ef_search: usize,
    /// Rebuild the graph when more than this fraction of its points are deleted.
    pub max_tombstone_ratio: f32,
    /// A filter matching at most this many chunks is answered by exact search.
    pub exact_below: usize,
}

impl Default for HnswParams {
    fn default() -> Self {
        HnswParams {
            m: 16,
            ef_construction: 200,
            ef_search: 64,
            max_tombstone_ratio: 0.2,
            exact_below: 2048,
        }
    }
}

/// What an index holds: its dimension, the embedding model that made its vectors, and the
/// HNSW parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IndexConfig {
    /// Vector dimension.
    pub dim: usize,
    /// Embedding model id (see [`crate::Embedder::model_id`]).
    pub model: String,
    /// HNSW parameters.
    #[serde(default)]
    pub hnsw: HnswParams,
}

impl IndexConfig {
    /// A config with default HNSW parameters.
    pub fn new(dim: usize, model: impl Into<String>) -> Self {
        IndexConfig {
            dim,
            model: model.into(),
            hnsw: HnswParams::default(),
        }
    }
}

/// How the graph was obtained when the index was opened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum GraphSource {
    /// Created empty (new index).
    New,
    /// Loaded from a current dump.
    Loaded,
    /// Loaded from an older dump, then the newer vectors were inserted from sled.
    CaughtUp {
        /// Vectors inserted.
        inserted: usize,
    },
    /// Rebuilt from the vectors in sled.
    Rebuilt {
        /// Why the dump could not be used.
        reason: String,
    },
}

/// Counts describing an index.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IndexStats {
    /// The index folder.
    pub dir: PathBuf,
    /// Live chunks.
    pub chunks: usize,
    /// Documents.
    pub documents: usize,
    /// Vector dimension.
    pub dim: usize,
    /// Embedding model.
    pub model: String,
    /// HNSW parameters.
    pub hnsw: HnswParams,
    /// Commits so far.
    pub generation: u64,
    /// Points in the graph (live and deleted).
    pub graph_points: usize,
    /// Deleted chunks still in the graph.
    pub tombstones: usize,
    /// Points the graph cannot reach (searched exactly).
    pub orphans: usize,
    /// How the graph was obtained at open.
    pub graph_source: GraphSource,
    /// Whether the graph on disk matches the store.
    pub graph_saved: bool,
    /// Bytes on disk.
    pub disk_bytes: u64,
}

/// Search knobs beyond `k` and filters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SearchOptions {
    /// Candidate list size (default: the index's `ef_search`).
    pub ef: Option<usize>,
    /// Drop hits scoring below this.
    pub min_score: Option<f32>,
    /// Scan every vector instead of the graph.
    pub exact: bool,
}

/// What a commit did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitReport {
    /// Ids given to the new chunks, in input order.
    pub added: Vec<u64>,
    /// Chunks deleted (tombstoned).
    pub deleted: usize,
    /// Generation after the commit.
    pub generation: u64,
}

#[derive(Serialize, Deserialize)]
struct DocRecord {
    hash: String,
    ids: Vec<u64>,
}

/// Vectors in memory, contiguous for exact scans.
struct VecStore {
    dim: usize,
    ids: Vec<u64>,
    data: Vec<f32>,
    slot: HashMap<u64, usize>,
}

impl VecStore {
    fn new(dim: usize) -> Self {
        VecStore {
            dim,
            ids: Vec::new(),
            data: Vec::new(),
            slot: HashMap::new(),
        }
    }
    fn get(&self, id: u64) -> Option<&[f32]> {
        let s = *self.slot.get(&id)?;
        self.data.get(s * self.dim..(s + 1) * self.dim)
    }
    fn push(&mut self, id: u64, v: &[f32]) {
        if self.slot.contains_key(&id) {
            return;
        }
        self.slot.insert(id, self.ids.len());
        self.ids.push(id);
        self.data.extend_from_slice(v);
    }
    fn remove(&mut self, id: u64) {
        let Some(s) = self.slot.remove(&id) else {
            return;
        };
        let last = self.ids.len() - 1;
        if s != last {
            let moved = self.ids[last];
            self.ids.swap(s, last);
            let (a, b) = self.data.split_at_mut(last * self.dim);
            a[s * self.dim..(s + 1) * self.dim].copy_from_slice(&b[..self.dim]);
            self.slot.insert(moved, s);
        }
        self.ids.pop();
        self.data.truncate(last * self.dim);
    }
    fn iter(&self) -> impl Iterator<Item = (u64, &[f32])> {
        self.ids
            .iter()
            .copied()
            .zip(self.data.chunks_exact(self.dim.max(1)))
    }
}

struct State {
    live: HashMap<u64, Arc<ChunkMeta>>,
    vecs: VecStore,
    documents: usize,
    graph: Graph,
    generation: u64,
    next_id: u64,
    saved_generation: Option<u64>,
    graph_source: GraphSource,
}

/// A persistent vector index of text chunks. Cheap to share (`Arc<Index>`); reads run in
/// parallel, writes are serialized. Every write is committed (fsynced) before it returns.
///
/// Layout of the folder: `db/` (sled: the source of truth) and `graph-<generation>/` (the
/// HNSW dump, a cache).
pub struct Index {
    dir: PathBuf,
    db: sled::Db,
    meta: sled::Tree,
    chunk_meta: sled::Tree,
    texts: sled::Tree,
    vectors: sled::Tree,
    docs: sled::Tree,
    config: IndexConfig,
    state: RwLock<State>,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("dir", &self.dir)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// How long opening an index waits for the file lock of a handle that is still closing.
///
/// sled releases its exclusive lock on `db` only when the last of its internal references is
/// gone, and some of those live in its thread pool and epoch-deferred garbage for a moment
/// after the last `Db` handle is dropped: on a busy machine an `Index::open` right after
/// `drop(index)` found the lock still held (about 1 run in 6 of the crash test). Another
/// process holding the index still gets a clear [`IndexError::Locked`] after this wait.
pub const LOCK_WAIT: Duration = Duration::from_secs(5);

/// Opens the sled database at `path`, waiting up to [`LOCK_WAIT`] for a closing handle.
fn open_sled(path: &Path) -> Result<sled::Db> {
    ferrograph_checkpoint::open_sled(path, LOCK_WAIT).map_err(|source| {
        if ferrograph_checkpoint::is_lock_error(&source) {
            IndexError::Locked {
                path: path.to_path_buf(),
                waited: LOCK_WAIT,
            }
        } else {
            IndexError::Store {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

fn key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

fn id_of(k: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(k.try_into().ok()?))
}

fn vec_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bytes_vec(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn u64_of(b: Option<sled::IVec>) -> Option<u64> {
    b.and_then(|v| id_of(&v))
}

fn dir_size(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}

/// Whether `dir` holds an index.
pub fn is_index(dir: &Path) -> bool {
    dir.join("db").is_dir() && dir.join("INDEX").is_file()
}

impl Index {
    fn store_err(&self, source: sled::Error) -> IndexError {
        IndexError::Store {
            path: self.dir.join("db"),
            source,
        }
    }

    fn open_db(dir: &Path) -> Result<(sled::Db, [sled::Tree; 5])> {
        let dbp = dir.join("db");
        let err = |source| IndexError::Store {
            path: dbp.clone(),
            source,
        };
        let db = open_sled(&dbp)?;
        let t = |n: &str| db.open_tree(n).map_err(err);
        let trees = [
            t("meta")?,
            t("chunk_meta")?,
            t("texts")?,
            t("vectors")?,
            t("docs")?,
        ];
        Ok((db, trees))
    }

    /// Flushes and closes the index. Dropping it does the same without reporting a failed
    /// flush; either way, opening the same folder again right after waits (up to
    /// [`LOCK_WAIT`]) for sled's own background work to let go of the file lock.
    pub fn close(self) -> Result<()> {
        self.db.flush().map_err(|e| self.store_err(e))?;
        Ok(())
    }

    /// Creates an empty index in `dir` (created if missing). Fails with
    /// [`IndexError::AlreadyExists`] when one is there.
    pub fn create(dir: impl AsRef<Path>, config: IndexConfig) -> Result<Index> {
        let dir = dir.as_ref();
        if is_index(dir) {
            return Err(IndexError::AlreadyExists(dir.to_path_buf()));
        }
        if config.dim == 0 || config.dim > 65536 {
            return Err(IndexError::Invalid(format!(
                "dimension {} out of range",
                config.dim
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| IndexError::io(dir, e))?;
        let (db, [meta, ..]) = Self::open_db(dir)?;
        let cfg = serde_json::to_vec(&config).map_err(|e| IndexError::corrupt(dir, e))?;
        let err = |source| IndexError::Store {
            path: dir.join("db"),
            source,
        };
        meta.insert("format", &STORE_FORMAT.to_be_bytes())
            .map_err(err)?;
        meta.insert("config", cfg).map_err(err)?;
        meta.insert("next_id", &key(0)).map_err(err)?;
        meta.insert("generation", &key(0)).map_err(err)?;
        db.flush().map_err(err)?;
        drop((meta, db));
        let marker = dir.join("INDEX");
        std::fs::write(&marker, b"ferrograph-index 1\n").map_err(|e| IndexError::io(&marker, e))?;
        graph::fsync_dir(dir)?;
        Self::open(dir)
    }

    /// Opens the index in `dir`, or [`IndexError::NotFound`]. Loads the graph dump when it is
    /// current; catches up from an older dump or rebuilds from the stored vectors otherwise
    /// (no embedding), then saves the new dump.
    pub fn open(dir: impl AsRef<Path>) -> Result<Index> {
        let dir = dir.as_ref().to_path_buf();
        if !is_index(&dir) {
            return Err(IndexError::NotFound(dir));
        }
        let (db, [meta, chunk_meta, texts, vectors, docs]) = Self::open_db(&dir)?;
        let dbp = dir.join("db");
        let serr = |source| IndexError::Store {
            path: dbp.clone(),
            source,
        };
        let format = meta.get("format").map_err(serr)?;
        if format.as_deref() != Some(&STORE_FORMAT.to_be_bytes()[..]) {
            return Err(IndexError::corrupt(&dbp, "missing or unknown store format"));
        }
        let cfg = meta
            .get("config")
            .map_err(serr)?
            .ok_or_else(|| IndexError::corrupt(&dbp, "missing config"))?;
        let config: IndexConfig =
            serde_json::from_slice(&cfg).map_err(|e| IndexError::corrupt(&dbp, e))?;
        let next_id = u64_of(meta.get("next_id").map_err(serr)?)
            .ok_or_else(|| IndexError::corrupt(&dbp, "missing next_id"))?;
        let generation = u64_of(meta.get("generation").map_err(serr)?)
            .ok_or_else(|| IndexError::corrupt(&dbp, "missing generation"))?;

        let mut live = HashMap::new();
        for kv in chunk_meta.iter() {
            let (k, v) = kv.map_err(serr)?;
            let id = id_of(&k).ok_or_else(|| IndexError::corrupt(&dbp, "bad chunk key"))?;
            let m: ChunkMeta =
                serde_json::from_slice(&v).map_err(|e| IndexError::corrupt(&dbp, e))?;
            live.insert(id, Arc::new(m));
        }
        let mut vecs = VecStore::new(config.dim);
        for kv in vectors.iter() {
            let (k, v) = kv.map_err(serr)?;
            let id = id_of(&k).ok_or_else(|| IndexError::corrupt(&dbp, "bad vector key"))?;
            if v.len() != config.dim * 4 {
                return Err(IndexError::corrupt(
                    &dbp,
                    format!("vector {id} has {} bytes", v.len()),
                ));
            }
            if !live.contains_key(&id) {
                return Err(IndexError::corrupt(
                    &dbp,
                    format!("vector {id} has no chunk"),
                ));
            }
            vecs.push(id, &bytes_vec(&v));
        }
        if vecs.ids.len() != live.len() {
            return Err(IndexError::corrupt(
                &dbp,
                format!("{} chunks but {} vectors", live.len(), vecs.ids.len()),
            ));
        }
        if let Some(max) = live.keys().max() {
            if *max >= next_id {
                return Err(IndexError::corrupt(&dbp, "chunk id beyond next_id"));
            }
        }
        let documents = docs.len();

        let p = config.hnsw;
        let (graph, graph_source, saved) = match graph::load_latest(
            &dir,
            generation,
            config.dim,
            p.m,
            p.ef_construction,
        ) {
            Ok((h, mut g)) => {
                g.dead = g.ids.iter().filter(|id| !live.contains_key(id)).count();
                let missing: Vec<(&[f32], u64)> = vecs
                    .iter()
                    .filter(|(id, _)| !g.ids.contains(id))
                    .map(|(id, v)| (v, id))
                    .collect();
                let n = missing.len();
                if n == 0 && h.generation == generation {
                    (g, GraphSource::Loaded, Some(generation))
                } else {
                    g.insert(&missing)?;
                    g.refresh_reachability();
                    (g, GraphSource::CaughtUp { inserted: n }, None)
                }
            }
            Err(reason) => {
                if !live.is_empty() {
                    tracing::info!(dir = %dir.display(), %reason, "rebuilding the HNSW graph from the store");
                }
                let mut g = Graph::new(p.m, p.ef_construction, vecs.ids.len());
                let pts: Vec<(&[f32], u64)> = vecs.iter().map(|(id, v)| (v, id)).collect();
                g.insert(&pts)?;
                g.refresh_reachability();
                let src = if live.is_empty() {
                    GraphSource::New
                } else {
                    GraphSource::Rebuilt { reason }
                };
                (g, src, None)
            }
        };
        let index = Index {
            dir,
            db,
            meta,
            chunk_meta,
            texts,
            vectors,
            docs,
            config,
            state: RwLock::new(State {
                live,
                vecs,
                documents,
                graph,
                generation,
                next_id,
                saved_generation: saved,
                graph_source,
            }),
        };
        index.maybe_rebuild();
        if !index.state.read().live.is_empty() {
            if let Err(e) = index.save() {
                tracing::warn!(error = %e, "could not save the HNSW graph (it is only a cache)");
            }
        }
        Ok(index)
    }

    /// Opens the index in `dir`, creating it with `config` when there is none. An existing
    /// index must have the same dimension and model.
    pub fn open_or_create(dir: impl AsRef<Path>, config: IndexConfig) -> Result<Index> {
        let dir = dir.as_ref();
        if !is_index(dir) {
            return Self::create(dir, config);
        }
        let index = Self::open(dir)?;
        if index.config.dim != config.dim {
            return Err(IndexError::Dimension {
                expected: index.config.dim,
                got: config.dim,
            });
        }
        if index.config.model != config.model {
            return Err(IndexError::ModelMismatch {
                index: index.config.model.clone(),
                embedder: config.model,
            });
        }
        Ok(index)
    }

    /// Removes the index folder. Returns false when there was no index there; refuses to
    /// remove a folder that is not an index.
    pub fn remove(dir: impl AsRef<Path>) -> Result<bool> {
        let dir = dir.as_ref();
        if !dir.exists() {
            return Ok(false);
        }
        if !is_index(dir) {
            return Err(IndexError::Invalid(format!(
                "{} exists but is not an index; not removing it",
                dir.display()
            )));
        }
        std::fs::remove_dir_all(dir).map_err(|e| IndexError::io(dir, e))?;
        Ok(true)
    }

    /// The index folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Dimension, model and HNSW parameters.
    pub fn config(&self) -> &IndexConfig {
        &self.config
    }

    /// Number of live chunks.
    pub fn len(&self) -> usize {
        self.state.read().live.len()
    }

    /// Whether the index holds no chunk.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stored content hash of a document, if it is indexed.
    pub fn document_hash(&self, path: &str) -> Result<Option<String>> {
        let v = self.docs.get(path).map_err(|e| self.store_err(e))?;
        match v {
            None => Ok(None),
            Some(v) => {
                let d: DocRecord = serde_json::from_slice(&v)
                    .map_err(|e| IndexError::corrupt(self.dir.join("db"), e))?;
                Ok(Some(d.hash))
            }
        }
    }

    /// Every indexed document path.
    pub fn documents(&self) -> Result<Vec<String>> {
        self.docs
            .iter()
            .keys()
            .map(|k| {
                k.map(|k| String::from_utf8_lossy(&k).into_owned())
                    .map_err(|e| self.store_err(e))
            })
            .collect()
    }

    /// The chunk with this id.
    pub fn get(&self, id: u64) -> Result<Option<Hit>> {
        let st = self.state.read();
        let Some(meta) = st.live.get(&id).cloned() else {
            return Ok(None);
        };
        let text = self.text_of(id)?;
        Ok(Some(hit(id, 1.0, &meta, text)))
    }

    /// The stored (unit) vector of a chunk.
    pub fn vector(&self, id: u64) -> Option<Vec<f32>> {
        self.state.read().vecs.get(id).map(<[f32]>::to_vec)
    }

    /// Every live chunk id, ascending.
    pub fn ids(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.state.read().live.keys().copied().collect();
        v.sort_unstable();
        v
    }

    fn text_of(&self, id: u64) -> Result<String> {
        let t = self
            .texts
            .get(key(id))
            .map_err(|e| self.store_err(e))?
            .ok_or_else(|| {
                IndexError::corrupt(self.dir.join("db"), format!("chunk {id} has no text"))
            })?;
        Ok(String::from_utf8_lossy(&t).into_owned())
    }

    fn check(&self, v: &[f32]) -> Result<Vec<f32>> {
        if v.len() != self.config.dim {
            return Err(IndexError::Dimension {
                expected: self.config.dim,
                got: v.len(),
            });
        }
        if v.iter().any(|x| !x.is_finite()) {
            return Err(IndexError::Invalid("vector has a non-finite value".into()));
        }
        let mut v = v.to_vec();
        normalize(&mut v);
        Ok(v)
    }

    /// Adds chunks (each appended to its path's document). Atomic per 4096 chunks.
    pub fn add_chunks(&self, chunks: Vec<NewChunk>) -> Result<CommitReport> {
        self.apply(chunks.into_iter().map(Op::Add).collect())
    }

    /// Replaces documents: each one's old chunks are deleted and its new chunks added in the
    /// same atomic commit (documents are never split across commits).
    pub fn upsert_documents(&self, docs: Vec<DocumentUpdate>) -> Result<CommitReport> {
        self.apply(docs.into_iter().map(Op::Replace).collect())
    }

    /// Deletes documents and their chunks.
    pub fn delete_documents(&self, paths: &[String]) -> Result<CommitReport> {
        self.apply(paths.iter().cloned().map(Op::DeleteDoc).collect())
    }

    /// Deletes chunks by id (unknown ids are ignored).
    pub fn delete_chunks(&self, ids: &[u64]) -> Result<CommitReport> {
        self.apply(ids.iter().copied().map(Op::DeleteChunk).collect())
    }

    fn apply(&self, ops: Vec<Op>) -> Result<CommitReport> {
        // Validate and normalize everything before taking the lock.
        let mut prepared = Vec::with_capacity(ops.len());
        for op in ops {
            prepared.push(match op {
                Op::Add(c) => {
                    let v = self.check(&c.vector)?;
                    POp::Add(vec![(c.meta, c.text, v)])
                }
                Op::Replace(d) => {
                    let mut cs = Vec::with_capacity(d.chunks.len());
                    for mut c in d.chunks {
                        let v = self.check(&c.vector)?;
                        c.meta.path.clone_from(&d.path);
                        cs.push((c.meta, c.text, v));
                    }
                    POp::Replace(d.path, d.content_hash, cs)
                }
                Op::DeleteDoc(p) => POp::DeleteDoc(p),
                Op::DeleteChunk(id) => POp::DeleteChunk(id),
            });
        }
        let mut report = CommitReport::default();
        let mut st = self.state.write();
        let mut batch: Vec<POp> = Vec::new();
        let mut size = 0;
        for op in prepared {
            let n = op.size();
            if size + n > TX_CHUNKS && !batch.is_empty() {
                self.commit(&mut st, std::mem::take(&mut batch), &mut report)?;
                size = 0;
            }
            size += n;
            batch.push(op);
        }
        if !batch.is_empty() {
            self.commit(&mut st, batch, &mut report)?;
        }
        report.generation = st.generation;
        drop(st);
        self.maybe_rebuild();
        Ok(report)
    }

    /// One sled transaction, fsynced, then the in-memory state and the graph.
    fn commit(&self, st: &mut State, ops: Vec<POp>, report: &mut CommitReport) -> Result<()> {
        let dbp = self.dir.join("db");
        // Plan ids outside the transaction (the closure may run more than once).
        let mut next = st.next_id;
        let mut planned: Vec<(Vec<u64>, POp)> = Vec::with_capacity(ops.len());
        for op in ops {
            let ids: Vec<u64> = match &op {
                POp::Add(cs) | POp::Replace(_, _, cs) => cs
                    .iter()
                    .map(|_| {
                        next += 1;
                        next - 1
                    })
                    .collect(),
                _ => Vec::new(),
            };
            planned.push((ids, op));
        }
        let generation = st.generation + 1;
        let trees = (
            &self.meta,
            &self.chunk_meta,
            &self.texts,
            &self.vectors,
            &self.docs,
        );
        let removed: Vec<u64> = trees
            .transaction(|(tm, tcm, tt, tv, td)| {
                let abort = |e: String| ConflictableTransactionError::Abort(e);
                let mut removed = Vec::new();
                let del = |id: u64, removed: &mut Vec<u64>| -> sled::transaction::ConflictableTransactionResult<(), String> {
                    if tcm.remove(&key(id))?.is_some() {
                        removed.push(id);
                    }
                    tt.remove(&key(id))?;
                    tv.remove(&key(id))?;
                    Ok(())
                };
                for (ids, op) in &planned {
                    match op {
                        POp::Add(cs) | POp::Replace(_, _, cs) => {
                            let replace = matches!(op, POp::Replace(..));
                            let mut per_doc: HashMap<&str, Vec<u64>> = HashMap::new();
                            for (id, (meta, text, v)) in ids.iter().zip(cs) {
                                let mj = serde_json::to_vec(meta).map_err(|e| abort(e.to_string()))?;
                                tcm.insert(&key(*id), mj)?;
                                tt.insert(&key(*id), text.as_bytes())?;
                                tv.insert(&key(*id), vec_bytes(v))?;
                                per_doc.entry(meta.path.as_str()).or_default().push(*id);
                            }
                            if let POp::Replace(path, _, _) = op {
                                per_doc.entry(path.as_str()).or_default();
                            }
                            for (path, new_ids) in per_doc {
                                let old: Option<DocRecord> = match td.get(path.as_bytes())? {
                                    Some(v) => Some(
                                        serde_json::from_slice(&v).map_err(|e| abort(e.to_string()))?,
                                    ),
                                    None => None,
                                };
                                let rec = if replace {
                                    if let Some(old) = &old {
                                        for id in &old.ids {
                                            del(*id, &mut removed)?;
                                        }
                                    }
                                    let hash = match op {
                                        POp::Replace(_, h, _) => h.clone(),
                                        _ => String::new(),
                                    };
                                    DocRecord { hash, ids: new_ids }
                                } else {
                                    let mut old = old.unwrap_or(DocRecord {
                                        hash: String::new(),
                                        ids: Vec::new(),
                                    });
                                    old.ids.extend(new_ids);
                                    old
                                };
                                let rj = serde_json::to_vec(&rec).map_err(|e| abort(e.to_string()))?;
                                td.insert(path.as_bytes(), rj)?;
                            }
                        }
                        POp::DeleteDoc(path) => {
                            if let Some(v) = td.remove(path.as_bytes())? {
                                let old: DocRecord =
                                    serde_json::from_slice(&v).map_err(|e| abort(e.to_string()))?;
                                for id in &old.ids {
                                    del(*id, &mut removed)?;
                                }
                            }
                        }
                        POp::DeleteChunk(id) => {
                            if let Some(m) = tcm.get(key(*id))? {
                                let m: ChunkMeta =
                                    serde_json::from_slice(&m).map_err(|e| abort(e.to_string()))?;
                                del(*id, &mut removed)?;
                                if let Some(v) = td.get(m.path.as_bytes())? {
                                    let mut d: DocRecord = serde_json::from_slice(&v)
                                        .map_err(|e| abort(e.to_string()))?;
                                    d.ids.retain(|x| x != id);
                                    if d.ids.is_empty() {
                                        td.remove(m.path.as_bytes())?;
                                    } else {
                                        let rj = serde_json::to_vec(&d)
                                            .map_err(|e| abort(e.to_string()))?;
                                        td.insert(m.path.as_bytes(), rj)?;
                                    }
                                }
                            }
                        }
                    }
                }
                tm.insert("next_id", &key(next))?;
                tm.insert("generation", &key(generation))?;
                Ok(removed)
            })
            .map_err(|e: TransactionError<String>| match e {
                TransactionError::Abort(reason) => IndexError::corrupt(&dbp, reason),
                TransactionError::Storage(source) => IndexError::Store {
                    path: dbp.clone(),
                    source,
                },
            })?;
        self.db.flush().map_err(|e| self.store_err(e))?;

        // The commit is durable: mirror it in memory.
        st.next_id = next;
        st.generation = generation;
        for id in &removed {
            st.live.remove(id);
            st.vecs.remove(*id);
            if st.graph.ids.contains(id) {
                st.graph.dead += 1;
            }
        }
        report.deleted += removed.len();
        let mut new_points = Vec::new();
        for (ids, op) in planned {
            if let POp::Add(cs) | POp::Replace(_, _, cs) = op {
                for (id, (meta, _, v)) in ids.into_iter().zip(cs) {
                    st.live.insert(id, Arc::new(meta));
                    st.vecs.push(id, &v);
                    new_points.push(id);
                    report.added.push(id);
                }
            }
        }
        let State { vecs, graph, .. } = &mut *st;
        let pts: Vec<(&[f32], u64)> = new_points
            .iter()
            .filter_map(|id| vecs.get(*id).map(|v| (v, *id)))
            .collect();
        graph.insert(&pts)?;
        if !pts.is_empty() {
            graph.refresh_reachability();
        }
        st.documents = self.docs.len();
        Ok(())
    }

    /// Rebuilds the graph when tombstones exceed `max_tombstone_ratio`.
    fn maybe_rebuild(&self) {
        let needs = {
            let st = self.state.read();
            let pts = st.graph.ids.len();
            st.graph.dead > 16
                && st.graph.dead as f32 > self.config.hnsw.max_tombstone_ratio * pts as f32
        };
        if needs {
            self.rebuild_graph();
        }
    }

    /// Rebuilds the graph from the stored vectors (drops every tombstone).
    pub fn rebuild_graph(&self) {
        let mut st = self.state.write();
        let p = self.config.hnsw;
        let mut g = Graph::new(p.m, p.ef_construction, st.vecs.ids.len());
        let pts: Vec<(&[f32], u64)> = st.vecs.iter().map(|(id, v)| (v, id)).collect();
        if let Err(e) = g.insert(&pts) {
            tracing::warn!(error = %e, "graph rebuild failed; keeping the old graph");
            return;
        }
        g.refresh_reachability();
        st.graph = g;
        st.saved_generation = None;
    }

    /// Writes the graph to disk when it is newer than the saved one (temp folder, fsync,
    /// rename). Optional: an index whose graph was not saved catches up on open.
    pub fn save(&self) -> Result<()> {
        let st = self.state.read();
        if st.saved_generation == Some(st.generation) {
            return Ok(());
        }
        if st.graph.ids.is_empty() {
            return Ok(());
        }
        graph::save(
            &self.dir,
            &st.graph,
            st.generation,
            st.next_id,
            self.config.dim,
        )?;
        let g = st.generation;
        drop(st);
        self.state.write().saved_generation = Some(g);
        Ok(())
    }

    /// Counts.
    pub fn stats(&self) -> IndexStats {
        let st = self.state.read();
        IndexStats {
            dir: self.dir.clone(),
            chunks: st.live.len(),
            documents: st.documents,
            dim: self.config.dim,
            model: self.config.model.clone(),
            hnsw: self.config.hnsw,
            generation: st.generation,
            graph_points: st.graph.ids.len(),
            tombstones: st.graph.dead,
            orphans: st.graph.orphans.len(),
            graph_source: st.graph_source.clone(),
            graph_saved: st.saved_generation == Some(st.generation),
            disk_bytes: dir_size(&self.dir),
        }
    }

    /// The `k` nearest live chunks passing every filter, best first. Filters are applied
    /// inside the graph search and re-checked on every result; selective filters, small
    /// indexes and a graph that returns too few results fall back to an exact scan, and
    /// orphaned points are always scored exactly.
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        filters: &[Filter],
        opts: SearchOptions,
    ) -> Result<Vec<Hit>> {
        let q = self.check(query)?;
        let st = self.state.read();
        let scored = self.search_ids(&st, &q, k, filters, opts);
        let mut out = Vec::with_capacity(scored.len());
        for (id, score) in scored {
            // A final guard: never hand back a deleted or filtered-out chunk.
            let Some(meta) = st.live.get(&id) else {
                continue;
            };
            if !matches_all(filters, meta) {
                continue;
            }
            out.push(hit(id, score, meta, self.text_of(id)?));
        }
        Ok(out)
    }

    /// Exact (brute-force) search: the ground truth for recall measurements.
    pub fn search_exact(&self, query: &[f32], k: usize, filters: &[Filter]) -> Result<Vec<Hit>> {
        self.search(
            query,
            k,
            filters,
            SearchOptions {
                exact: true,
                ..Default::default()
            },
        )
    }

    /// Ids and scores only (no text fetch); `query` must be unit length.
    pub fn search_ids_only(
        &self,
        query: &[f32],
        k: usize,
        filters: &[Filter],
        opts: SearchOptions,
    ) -> Result<Vec<(u64, f32)>> {
        if query.len() != self.config.dim {
            return Err(IndexError::Dimension {
                expected: self.config.dim,
                got: query.len(),
            });
        }
        let st = self.state.read();
        Ok(self.search_ids(&st, query, k, filters, opts))
    }

    fn search_ids(
        &self,
        st: &State,
        q: &[f32],
        k: usize,
        filters: &[Filter],
        opts: SearchOptions,
    ) -> Vec<(u64, f32)> {
        if k == 0 || st.live.is_empty() {
            return Vec::new();
        }
        let pass = |id: u64| st.live.get(&id).is_some_and(|m| matches_all(filters, m));
        let p = self.config.hnsw;
        let matching = if filters.is_empty() {
            st.live.len()
        } else {
            st.live.values().filter(|m| matches_all(filters, m)).count()
        };
        if matching == 0 {
            return Vec::new();
        }
        let exact = opts.exact
            || matching <= k
            || matching <= p.exact_below
            || (!filters.is_empty() && matching * 10 < st.live.len());
        let mut res = if exact {
            exact_scan(st, q, k, &pass)
        } else {
            let ef = opts.ef.unwrap_or(p.ef_search).max(k);
            let neigh = if filters.is_empty() && st.graph.dead == 0 {
                st.graph.search(q, k, ef, None)
            } else {
                st.graph.search(q, k, ef, Some(&pass))
            };
            let mut res: Vec<(u64, f32)> = neigh
                .into_iter()
                .filter(|id| pass(*id))
                .filter_map(|id| st.vecs.get(id).map(|v| (id, dot(q, v))))
                .collect();
            for id in &st.graph.orphans {
                if pass(*id) {
                    if let Some(v) = st.vecs.get(*id) {
                        res.push((*id, dot(q, v)));
                    }
                }
            }
            // Live chunks missing from the graph (should not happen) are scored too.
            if st.graph.ids.len() - st.graph.dead < st.live.len() {
                for (id, v) in st.vecs.iter() {
                    if !st.graph.ids.contains(&id) && pass(id) {
                        res.push((id, dot(q, v)));
                    }
                }
            }
            res.sort_by(|a, b| cmp_hits(*a, *b));
            res.dedup_by_key(|x| x.0);
            if res.len() < k.min(matching) {
                exact_scan(st, q, k, &pass)
            } else {
                res
            }
        };
        res.sort_by(|a, b| cmp_hits(*a, *b));
        res.truncate(k);
        if let Some(min) = opts.min_score {
            res.retain(|(_, s)| *s >= min);
        }
        res
    }
}

fn cmp_hits(a: (u64, f32), b: (u64, f32)) -> Ordering {
    b.1.partial_cmp(&a.1)
        .unwrap_or(Ordering::Equal)
        .then(a.0.cmp(&b.0))
}

#[derive(PartialEq)]
struct MinScore(f32, u64);
impl Eq for MinScore {}
impl PartialOrd for MinScore {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for MinScore {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: the heap's top is the worst kept hit.
        other
            .0
            .partial_cmp(&self.0)
            .unwrap_or(Ordering::Equal)
            .then(self.1.cmp(&other.1))
    }
}

fn exact_scan(st: &State, q: &[f32], k: usize, pass: &dyn Fn(u64) -> bool) -> Vec<(u64, f32)> {
    let mut heap: BinaryHeap<MinScore> = BinaryHeap::with_capacity(k + 1);
    for (id, v) in st.vecs.iter() {
        let s = dot(q, v);
        if heap.len() == k {
            if let Some(top) = heap.peek() {
                if s < top.0 || (s == top.0 && id > top.1) {
                    continue;
                }
            }
        }
        if !pass(id) {
            continue;
        }
        heap.push(MinScore(s, id));
        if heap.len() > k {
            heap.pop();
        }
    }
    let mut v: Vec<(u64, f32)> = heap.into_iter().map(|m| (m.1, m.0)).collect();
    v.sort_by(|a, b| cmp_hits(*a, *b));
    v
}

fn hit(id: u64, score: f32, meta: &ChunkMeta, text: String) -> Hit {
    Hit {
        id,
        score,
        path: meta.path.clone(),
        start_line: meta.start_line,
        end_line: meta.end_line,
        language: meta.language.clone(),
        metadata: meta.metadata.clone(),
        text,
    }
}

enum Op {
    Add(NewChunk),
    Replace(DocumentUpdate),
    DeleteDoc(String),
    DeleteChunk(u64),
}

type Prepared = (ChunkMeta, String, Vec<f32>);

enum POp {
    Add(Vec<Prepared>),
    Replace(String, String, Vec<Prepared>),
    DeleteDoc(String),
    DeleteChunk(u64),
}

impl POp {
    fn size(&self) -> usize {
        match self {
            POp::Add(c) | POp::Replace(_, _, c) => c.len().max(1),
            _ => 1,
        }
    }
}
