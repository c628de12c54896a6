//! Text queries: embed, search, merge.

use crate::embed::Embedder;
use crate::error::{IndexError, Result};
use crate::index::{Index, SearchOptions};
use crate::types::{Filter, Hit};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Search each value of a key separately (`k_each` hits per value) and merge by score — how
/// seed 000 searches code per module.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerFilter {
    /// Metadata key (for example `module`).
    pub key: String,
    /// Values, each searched with `key == value`.
    pub values: Vec<String>,
    /// Hits per value.
    pub k_each: usize,
}

/// A text query.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Query {
    /// The query text.
    pub text: String,
    /// Hits wanted (after the per-filter merge).
    pub k: usize,
    /// Conditions every hit satisfies.
    #[serde(default)]
    pub filters: Vec<Filter>,
    /// Per-value searches merged by score.
    #[serde(default)]
    pub per_filter: Option<PerFilter>,
    /// Drop hits scoring below this (cosine similarity).
    #[serde(default)]
    pub min_score: Option<f32>,
    /// Candidate list size (default: the index's).
    #[serde(default)]
    pub ef: Option<usize>,
}

impl Query {
    /// `k = 10`, no filter.
    pub fn new(text: impl Into<String>) -> Self {
        Query {
            text: text.into(),
            k: 10,
            filters: Vec::new(),
            per_filter: None,
            min_score: None,
            ef: None,
        }
    }

    /// Sets `k`.
    pub fn k(mut self, k: usize) -> Self {
        self.k = k;
        self
    }

    /// Adds a filter.
    pub fn filter(mut self, f: Filter) -> Self {
        self.filters.push(f);
        self
    }

    /// Searches each value of `key` for `k_each` hits and merges them.
    pub fn per_filter(
        mut self,
        key: impl Into<String>,
        values: impl IntoIterator<Item = impl Into<String>>,
        k_each: usize,
    ) -> Self {
        self.per_filter = Some(PerFilter {
            key: key.into(),
            values: values.into_iter().map(Into::into).collect(),
            k_each,
        });
        self
    }

    /// Sets the minimum score.
    pub fn min_score(mut self, s: f32) -> Self {
        self.min_score = Some(s);
        self
    }
}

/// An index with the embedder that made it: text queries in, hits out. Cheap to clone.
#[derive(Clone)]
pub struct Retriever {
    index: Arc<Index>,
    embedder: Arc<dyn Embedder>,
}

impl std::fmt::Debug for Retriever {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retriever")
            .field("index", &self.index)
            .field("model", &self.embedder.model_id())
            .finish()
    }
}

impl Retriever {
    /// Pairs an index with its embedder; fails when the embedder's model or dimension differs
    /// from the index's.
    pub fn new(index: Arc<Index>, embedder: Arc<dyn Embedder>) -> Result<Self> {
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
        Ok(Retriever { index, embedder })
    }

    /// The index.
    pub fn index(&self) -> &Arc<Index> {
        &self.index
    }

    /// The embedder.
    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.embedder
    }

    /// Embeds the query text and searches (blocking: embedding takes milliseconds of CPU).
    pub fn search(&self, q: &Query) -> Result<Vec<Hit>> {
        if q.text.trim().is_empty() {
            return Err(IndexError::Invalid("empty query".into()));
        }
        let v = self
            .embedder
            .embed(&[q.text.as_str()])?
            .into_iter()
            .next()
            .ok_or_else(|| IndexError::Embedding("no vector for the query".into()))?;
        self.search_vector(&v, q)
    }

    /// Searches with an already embedded query (the query's text is ignored).
    pub fn search_vector(&self, v: &[f32], q: &Query) -> Result<Vec<Hit>> {
        let opts = SearchOptions {
            ef: q.ef,
            min_score: q.min_score,
            exact: false,
        };
        match &q.per_filter {
            None => self.index.search(v, q.k, &q.filters, opts),
            Some(pf) => {
                let mut all: Vec<Hit> = Vec::new();
                for value in &pf.values {
                    let mut filters = q.filters.clone();
                    filters.push(Filter::eq(pf.key.clone(), value.clone()));
                    all.extend(self.index.search(v, pf.k_each, &filters, opts)?);
                }
                all.sort_by(|a, b| {
                    b.score
                        .partial_cmp(&a.score)
                        .unwrap_or(std::cmp::Ordering::Equal)
                        .then(a.id.cmp(&b.id))
                });
                let mut seen = std::collections::HashSet::new();
                all.retain(|h| seen.insert(h.id));
                all.truncate(q.k);
                Ok(all)
            }
        }
    }

    /// [`Retriever::search`] on tokio's blocking pool, for async callers.
    pub async fn search_async(&self, q: Query) -> Result<Vec<Hit>> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.search(&q))
            .await
            .map_err(|e| IndexError::Task(e.to_string()))?
    }
}
