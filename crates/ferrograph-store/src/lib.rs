//! The long-term store on disk: [`SledStore`] implements `ferrograph_core::store::Store`.
//!
//! Items live in a sled database (`<dir>/items`), each sealed in the checkpoint envelope
//! (format, checksum), keyed by namespace and key. With an embedder, the text of each item
//! (its configured fields) is embedded with the local model and kept in a
//! `ferrograph_index::Index` (`<dir>/vectors`: HNSW over vectors in sled), one document per
//! item, so that a search can go by meaning under a namespace prefix, with field filters.
//!
//! **Durability.** A put is acknowledged after the item is flushed to disk and its vector
//! committed. The two stores are separate, so a crash can leave an item whose vector is stale
//! or missing, or a vector without an item; opening the store reconciles them (re-embedding
//! what is stale, dropping what is orphaned) before anything else happens.
//!
//! **Time to live.** An item written with a TTL is not returned after it expires, and is
//! deleted when next touched or by [`SledStore::sweep_expired`] (run on open and available to
//! schedulers). Reads refresh the TTL unless the store was opened with
//! [`StoreOptions::refresh_ttl_on_read`] off.

use async_trait::async_trait;
use ferrograph_core::checkpoint::{decode, encode};
use ferrograph_core::id::now_millis;
use ferrograph_core::store::{
    check_key, check_namespace, IndexFields, Item, NamespaceQuery, PutOptions, SearchItem,
    SearchRequest, Store, StoreError,
};
use ferrograph_index::{
    ChunkMeta, DocumentUpdate, Embedder, Filter, Index, IndexConfig, NewChunk, SearchOptions,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Layout version of stored items.
const ITEM_SCHEMA: u32 = 1;
/// Separates namespace labels in a storage key (labels have no control characters).
const LABEL_SEP: char = '\u{1f}';
/// Separates the namespace from the key.
const KEY_SEP: char = '\u{1e}';

/// How a [`SledStore`] is opened.
#[derive(Clone, Default)]
pub struct StoreOptions {
    /// The embedding model for semantic search; without one, searches go by namespace and
    /// filter only.
    pub embedder: Option<Arc<dyn Embedder>>,
    /// Top-level fields embedded by default (empty: the whole value, as text if it is a
    /// string, as JSON otherwise).
    pub fields: Vec<String>,
    /// Whether a read pushes an item's expiry back by its TTL (LangGraph's `refresh_ttl`).
    pub refresh_ttl_on_read: bool,
}

impl fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreOptions")
            .field(
                "embedder",
                &self.embedder.as_ref().map(|e| e.model_id().to_string()),
            )
            .field("fields", &self.fields)
            .field("refresh_ttl_on_read", &self.refresh_ttl_on_read)
            .finish()
    }
}

impl StoreOptions {
    /// Semantic search with `embedder` over the whole value; TTLs refresh on read.
    pub fn semantic(embedder: Arc<dyn Embedder>) -> Self {
        StoreOptions {
            embedder: Some(embedder),
            fields: Vec::new(),
            refresh_ttl_on_read: true,
        }
    }

    /// No semantic search; TTLs refresh on read.
    pub fn plain() -> Self {
        StoreOptions {
            refresh_ttl_on_read: true,
            ..Self::default()
        }
    }

    /// Embeds these top-level fields by default.
    #[must_use]
    pub fn fields<I, T>(mut self, fields: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.fields = fields.into_iter().map(Into::into).collect();
        self
    }
}

/// An item as stored.
#[derive(Serialize, Deserialize)]
struct Stored {
    namespace: Vec<String>,
    key: String,
    /// The value as JSON text (the binary encoding cannot hold arbitrary JSON).
    value: String,
    created_at_ms: u64,
    updated_at_ms: u64,
    expires_at_ms: Option<u64>,
    ttl_ms: Option<u64>,
    /// What of the value is embedded (with the store's default fields for `Default`); the
    /// index must hold exactly that text for the item, whoever wrote it.
    index: IndexFields,
}

impl Stored {
    fn item(&self) -> Result<Item, StoreError> {
        let value = serde_json::from_str(&self.value).map_err(|e| StoreError::Corrupt {
            key: printable(&storage_key(&self.namespace, &self.key)),
            reason: e.to_string(),
        })?;
        Ok(Item {
            namespace: self.namespace.clone(),
            key: self.key.clone(),
            value,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
            expires_at_ms: self.expires_at_ms,
        })
    }

    fn expired(&self, now: u64) -> bool {
        self.expires_at_ms.is_some_and(|t| t <= now)
    }
}

fn decode_item(key: &[u8], bytes: &[u8]) -> Result<Stored, StoreError> {
    decode(ITEM_SCHEMA, bytes).map_err(|e| StoreError::Corrupt {
        key: printable(&String::from_utf8_lossy(key)),
        reason: e.to_string(),
    })
}

fn storage_key(namespace: &[String], key: &str) -> String {
    let mut out = namespace.join(&LABEL_SEP.to_string());
    out.push(KEY_SEP);
    out.push_str(key);
    out
}

fn namespace_prefix(prefix: &[String]) -> String {
    prefix.join(&LABEL_SEP.to_string())
}

fn printable(key: &str) -> String {
    key.replace(LABEL_SEP, "/").replace(KEY_SEP, ":")
}

fn content_hash(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn backend(
    message: impl Into<String>,
    e: impl std::error::Error + Send + Sync + 'static,
) -> StoreError {
    StoreError::Backend {
        message: message.into(),
        source: Some(Box::new(e)),
    }
}

/// The text of `value` to embed under `fields` (empty: the whole value); `None` when none of
/// the fields is there.
fn embedding_text(value: &Value, fields: &[String]) -> Option<String> {
    let text_of = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if fields.is_empty() {
        let t = text_of(value);
        return (!t.trim().is_empty()).then_some(t);
    }
    let parts: Vec<String> = fields
        .iter()
        .filter_map(|f| value.get(f).map(text_of))
        .filter(|t| !t.trim().is_empty())
        .collect();
    (!parts.is_empty()).then(|| parts.join("\n"))
}

struct Semantic {
    index: Index,
    embedder: Arc<dyn Embedder>,
}

/// The long-term store on sled, with optional semantic search (see the crate docs).
pub struct SledStore {
    dir: PathBuf,
    db: sled::Db,
    items: sled::Tree,
    semantic: Option<Semantic>,
    fields: Vec<String>,
    refresh_on_read: bool,
}

impl fmt::Debug for SledStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SledStore")
            .field("dir", &self.dir)
            .field("semantic", &self.semantic.is_some())
            .finish_non_exhaustive()
    }
}

/// What opening a store found and repaired.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Items read.
    pub items: usize,
    /// Items whose vector was missing or stale and was embedded again.
    pub reembedded: usize,
    /// Vectors without an item, removed.
    pub orphans_removed: usize,
    /// Expired items deleted.
    pub expired_removed: usize,
}

impl SledStore {
    /// Opens (or creates) the store in `dir`, reconciling items and vectors and sweeping
    /// expired items first.
    pub fn open(
        dir: impl AsRef<Path>,
        options: StoreOptions,
    ) -> Result<(Arc<Self>, OpenReport), StoreError> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir)
            .map_err(|e| backend(format!("creating {}", dir.display()), e))?;
        let items_dir = dir.join("items");
        let db = ferrograph_checkpoint::open_sled(&items_dir, std::time::Duration::from_secs(5))
            .map_err(|e| backend(format!("opening {}", items_dir.display()), e))?;
        let items = db
            .open_tree("items")
            .map_err(|e| backend("opening the items tree", e))?;
        let semantic = match options.embedder {
            Some(embedder) => {
                let config = IndexConfig::new(embedder.dim(), embedder.model_id());
                let index = Index::open_or_create(dir.join("vectors"), config)
                    .map_err(|e| backend("opening the vector index", e))?;
                if index.config().model != embedder.model_id() {
                    return Err(StoreError::Invalid(format!(
                        "the store's vectors were made by `{}`, not `{}`; open it with that model",
                        index.config().model,
                        embedder.model_id()
                    )));
                }
                Some(Semantic { index, embedder })
            }
            None => None,
        };
        let store = SledStore {
            dir,
            db,
            items,
            semantic,
            fields: options.fields,
            refresh_on_read: options.refresh_ttl_on_read,
        };
        let mut report = OpenReport {
            expired_removed: store.sweep_expired()?,
            ..OpenReport::default()
        };
        store.reconcile(&mut report)?;
        Ok((Arc::new(store), report))
    }

    /// The store's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn read(&self, key: &[u8]) -> Result<Option<Stored>, StoreError> {
        self.items
            .get(key)
            .map_err(|e| backend("reading an item", e))?
            .map(|bytes| decode_item(key, &bytes))
            .transpose()
    }

    /// Every item whose storage key starts with `prefix`, with its storage key, read once.
    fn scan(
        &self,
        prefix: &str,
    ) -> impl Iterator<Item = Result<(String, Stored), StoreError>> + '_ {
        self.items.scan_prefix(prefix.as_bytes()).map(|entry| {
            let (k, v) = entry.map_err(|e| backend("reading the items", e))?;
            let stored = decode_item(&k, &v)?;
            Ok((String::from_utf8_lossy(&k).into_owned(), stored))
        })
    }

    fn write(&self, stored: &Stored) -> Result<(), StoreError> {
        let key = storage_key(&stored.namespace, &stored.key);
        let bytes = encode(ITEM_SCHEMA, stored).map_err(|e| StoreError::Corrupt {
            key: printable(&key),
            reason: e.to_string(),
        })?;
        self.items
            .insert(key.as_bytes(), bytes)
            .map_err(|e| backend("writing an item", e))?;
        self.db
            .flush()
            .map_err(|e| backend("flushing the store", e))?;
        Ok(())
    }

    /// Removes an item and its vector.
    fn remove(&self, key: &str) -> Result<bool, StoreError> {
        let existed = self
            .items
            .remove(key.as_bytes())
            .map_err(|e| backend("deleting an item", e))?
            .is_some();
        self.db
            .flush()
            .map_err(|e| backend("flushing the store", e))?;
        if let Some(s) = &self.semantic {
            s.index
                .delete_documents(&[key.to_string()])
                .map_err(|e| backend("deleting a vector", e))?;
        }
        Ok(existed)
    }

    fn embed(&self, text: &str) -> Result<Vec<f32>, StoreError> {
        let s = self.semantic.as_ref().ok_or(StoreError::NoIndex)?;
        s.embedder
            .embed(&[text])
            .map_err(|e| StoreError::Embedding(e.to_string()))?
            .pop()
            .ok_or_else(|| StoreError::Embedding("the model returned no vector".into()))
    }

    /// Makes the index hold `text` (or nothing) for the item at `key`.
    fn index_item(&self, key: &str, text: Option<&str>) -> Result<(), StoreError> {
        let Some(s) = &self.semantic else {
            return Ok(());
        };
        match text {
            None => {
                s.index
                    .delete_documents(&[key.to_string()])
                    .map_err(|e| backend("deleting a vector", e))?;
            }
            Some(text) => {
                let vector = self.embed(text)?;
                let doc = DocumentUpdate {
                    path: key.to_string(),
                    content_hash: content_hash(text),
                    chunks: vec![NewChunk {
                        meta: ChunkMeta {
                            path: key.to_string(),
                            start_line: 1,
                            end_line: 1,
                            language: "text".into(),
                            metadata: Default::default(),
                        },
                        text: text.to_string(),
                        vector,
                    }],
                };
                s.index
                    .upsert_documents(vec![doc])
                    .map_err(|e| backend("writing a vector", e))?;
            }
        }
        Ok(())
    }

    /// The text the index must hold for `stored` (`None`: no vector).
    fn text_to_embed(&self, stored: &Stored) -> Result<Option<String>, StoreError> {
        if self.semantic.is_none() {
            return Ok(None);
        }
        let value = stored.item()?.value;
        Ok(match &stored.index {
            IndexFields::Skip => None,
            IndexFields::Default => embedding_text(&value, &self.fields),
            IndexFields::Fields(f) => embedding_text(&value, f),
        })
    }

    /// Brings the item's vector in line with its value: embeds only when the text changed.
    fn sync_vector(&self, key: &str, stored: &Stored) -> Result<bool, StoreError> {
        let Some(s) = &self.semantic else {
            return Ok(false);
        };
        let text = self.text_to_embed(stored)?;
        let have = s
            .index
            .document_hash(key)
            .map_err(|e| backend("reading the vector index", e))?;
        if text.as_deref().map(content_hash) == have {
            return Ok(false);
        }
        self.index_item(key, text.as_deref())?;
        Ok(true)
    }

    fn reconcile(&self, report: &mut OpenReport) -> Result<(), StoreError> {
        let mut keys = std::collections::HashSet::new();
        for entry in self.scan("") {
            let (key, stored) = entry?;
            report.items += 1;
            if self.sync_vector(&key, &stored)? {
                report.reembedded += 1;
            }
            keys.insert(key);
        }
        if let Some(s) = &self.semantic {
            let orphans: Vec<String> = s
                .index
                .documents()
                .map_err(|e| backend("reading the vector index", e))?
                .into_iter()
                .filter(|d| !keys.contains(d))
                .collect();
            if !orphans.is_empty() {
                report.orphans_removed = orphans.len();
                s.index
                    .delete_documents(&orphans)
                    .map_err(|e| backend("deleting vectors", e))?;
            }
        }
        Ok(())
    }

    /// Deletes every expired item (and its vector); returns how many.
    pub fn sweep_expired(&self) -> Result<usize, StoreError> {
        let now = now_millis();
        let mut expired = Vec::new();
        for entry in self.scan("") {
            let (key, stored) = entry?;
            if stored.expired(now) {
                expired.push(key);
            }
        }
        for key in &expired {
            self.remove(key)?;
        }
        Ok(expired.len())
    }

    fn put_blocking(
        &self,
        namespace: Vec<String>,
        key: String,
        value: Value,
        options: PutOptions,
    ) -> Result<(), StoreError> {
        check_namespace(&namespace)?;
        check_key(&key)?;
        let skey = storage_key(&namespace, &key);
        let now = now_millis();
        let previous = self.read(skey.as_bytes())?;
        let ttl_ms = options
            .ttl
            .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
        let stored = Stored {
            namespace,
            key,
            value: value.to_string(),
            created_at_ms: previous.as_ref().map_or(now, |p| p.created_at_ms),
            updated_at_ms: now,
            expires_at_ms: ttl_ms.map(|t| now.saturating_add(t)),
            ttl_ms,
            index: options.index,
        };
        // The vector first: a failing model leaves the old item as it was (a crash in between
        // is repaired when the store is next opened).
        self.sync_vector(&skey, &stored)?;
        self.write(&stored)
    }

    fn get_blocking(&self, namespace: &[String], key: &str) -> Result<Option<Item>, StoreError> {
        check_namespace(namespace)?;
        check_key(key)?;
        let skey = storage_key(namespace, key);
        let Some(mut stored) = self.read(skey.as_bytes())? else {
            return Ok(None);
        };
        let now = now_millis();
        if stored.expired(now) {
            self.remove(&skey)?;
            return Ok(None);
        }
        if let (true, Some(ttl)) = (self.refresh_on_read, stored.ttl_ms) {
            stored.expires_at_ms = Some(now.saturating_add(ttl));
            self.write(&stored)?;
        }
        stored.item().map(Some)
    }

    fn search_blocking(&self, request: &SearchRequest) -> Result<Vec<SearchItem>, StoreError> {
        for label in &request.namespace_prefix {
            check_key(label)?;
        }
        let wanted = request.offset.saturating_add(request.limit);
        let now = now_millis();
        let in_prefix = |ns: &[String]| ns.starts_with(&request.namespace_prefix);
        match &request.query {
            None => {
                let prefix = namespace_prefix(&request.namespace_prefix);
                let mut found = Vec::new();
                for entry in self.scan(&prefix) {
                    let (_, stored) = entry?;
                    if stored.expired(now) || !in_prefix(&stored.namespace) {
                        continue;
                    }
                    let item = stored.item()?;
                    if request.matches(&item.value) {
                        found.push(SearchItem { item, score: None });
                    }
                }
                found.sort_by(|a, b| {
                    b.item
                        .updated_at_ms
                        .cmp(&a.item.updated_at_ms)
                        .then_with(|| a.item.key.cmp(&b.item.key))
                });
                Ok(found
                    .into_iter()
                    .skip(request.offset)
                    .take(request.limit)
                    .collect())
            }
            Some(text) => {
                let s = self.semantic.as_ref().ok_or(StoreError::NoIndex)?;
                let query = self.embed(text)?;
                let filters = if request.namespace_prefix.is_empty() {
                    Vec::new()
                } else {
                    vec![Filter::path_prefix(namespace_prefix(
                        &request.namespace_prefix,
                    ))]
                };
                let total = s.index.len();
                let mut k = wanted.saturating_mul(4).max(32);
                loop {
                    let hits = s
                        .index
                        .search(&query, k, &filters, SearchOptions::default())
                        .map_err(|e| backend("searching the vector index", e))?;
                    let exhausted = hits.len() < k || k >= total;
                    let mut found = Vec::new();
                    for hit in &hits {
                        let Some(stored) = self.read(hit.path.as_bytes())? else {
                            continue;
                        };
                        if stored.expired(now) || !in_prefix(&stored.namespace) {
                            continue;
                        }
                        let item = stored.item()?;
                        if request.matches(&item.value) {
                            found.push(SearchItem {
                                item,
                                score: Some(hit.score),
                            });
                        }
                    }
                    if found.len() >= wanted || exhausted {
                        return Ok(found
                            .into_iter()
                            .skip(request.offset)
                            .take(request.limit)
                            .collect());
                    }
                    k = k.saturating_mul(4).min(total.max(1));
                }
            }
        }
    }

    fn namespaces_blocking(&self, query: &NamespaceQuery) -> Result<Vec<Vec<String>>, StoreError> {
        let now = now_millis();
        let mut set = std::collections::BTreeSet::new();
        for entry in self.scan("") {
            let (_, stored) = entry?;
            if stored.expired(now) || !query.matches(&stored.namespace) {
                continue;
            }
            let mut ns = stored.namespace;
            if let Some(depth) = query.max_depth {
                ns.truncate(depth.max(1));
            }
            set.insert(ns);
        }
        Ok(set
            .into_iter()
            .skip(query.offset)
            .take(query.limit.unwrap_or(100))
            .collect())
    }
}

/// Runs blocking store work (sled IO, embedding) off the async executor.
async fn blocking<T, F>(store: Arc<SledStore>, f: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce(&SledStore) -> Result<T, StoreError> + Send + 'static,
{
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .map_err(|e| backend("a store task failed", e))?
}

/// A handle that runs the store's blocking work off the executor.
#[derive(Clone, Debug)]
pub struct StoreHandle(Arc<SledStore>);

impl StoreHandle {
    /// The store.
    pub fn new(store: Arc<SledStore>) -> Self {
        StoreHandle(store)
    }

    /// The store under the handle.
    pub fn inner(&self) -> &Arc<SledStore> {
        &self.0
    }
}

#[async_trait]
impl Store for StoreHandle {
    async fn put(
        &self,
        namespace: &[String],
        key: &str,
        value: Value,
        options: PutOptions,
    ) -> Result<(), StoreError> {
        let (ns, key) = (namespace.to_vec(), key.to_string());
        blocking(self.0.clone(), move |s| {
            s.put_blocking(ns, key, value, options)
        })
        .await
    }

    async fn get(&self, namespace: &[String], key: &str) -> Result<Option<Item>, StoreError> {
        let (ns, key) = (namespace.to_vec(), key.to_string());
        blocking(self.0.clone(), move |s| s.get_blocking(&ns, &key)).await
    }

    async fn delete(&self, namespace: &[String], key: &str) -> Result<bool, StoreError> {
        check_namespace(namespace)?;
        check_key(key)?;
        let skey = storage_key(namespace, key);
        blocking(self.0.clone(), move |s| s.remove(&skey)).await
    }

    async fn search(&self, request: SearchRequest) -> Result<Vec<SearchItem>, StoreError> {
        blocking(self.0.clone(), move |s| s.search_blocking(&request)).await
    }

    async fn list_namespaces(&self, query: NamespaceQuery) -> Result<Vec<Vec<String>>, StoreError> {
        blocking(self.0.clone(), move |s| s.namespaces_blocking(&query)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_keep_namespaces_apart() {
        let ns = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let a = storage_key(&ns(&["a"]), "k");
        let ab = storage_key(&ns(&["a", "b"]), "k");
        let a_b = storage_key(&ns(&["a/b"]), "k");
        assert_ne!(ab, a_b);
        assert!(ab.starts_with(&namespace_prefix(&ns(&["a"]))));
        assert!(a.starts_with(&namespace_prefix(&ns(&["a"]))));
        assert_eq!(printable(&ab), "a/b:k");
    }

    #[test]
    fn embedding_text_reads_fields() {
        let v = json!({"text": "likes fractions", "n": 3, "empty": " "});
        assert_eq!(
            embedding_text(&v, &["text".into()]).as_deref(),
            Some("likes fractions")
        );
        assert_eq!(
            embedding_text(&v, &["text".into(), "n".into()]).as_deref(),
            Some("likes fractions\n3")
        );
        assert_eq!(
            embedding_text(&v, &["missing".into(), "empty".into()]),
            None
        );
        assert_eq!(
            embedding_text(&json!("plain"), &[]).as_deref(),
            Some("plain")
        );
    }
}
