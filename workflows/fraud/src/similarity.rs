//! Nearest-neighbour search over the behaviour features of the settled history.
//!
//! The vectors live in a [`ferrograph_index::Index`] beside the dataset (`similarity-index/`):
//! sled keeps them, HNSW searches them. The index is rebuilt from the dataset when it is
//! missing, from another feature version, or does not hold exactly the settled history.

use super::dataset::{Dataset, DatasetError};
use super::features::{TxFeatures, FEATURE_DIM};
use ferrograph_index::{ChunkMeta, Index, IndexConfig, NewChunk, SearchOptions};
use ferrograph_tools::ToolError;
use std::collections::BTreeMap;
use std::path::Path;

/// Identifies the feature layout; a change rebuilds the index.
const FEATURE_MODEL: &str = "fraud-behaviour-features-v1";

/// HNSW beam width for these searches. The feature vectors are low-dimensional and strongly
/// clustered (most dimensions are 0/1 flags), so the data is a few hundred tight clusters,
/// some holding hundreds of nearly equidistant points. A beam narrower than such a cluster can
/// fill up with it and stop before reaching the query's own cluster. Measured on the default
/// dataset (8 graph builds, about 4,800 queries): 16 to 24 queries with recall@10 under 0.5
/// at a beam of 64 or 128, none at 256; a search costs about 50 µs at 256.
const SEARCH_EF: usize = 256;

/// Feature vectors of the settled history, searchable by similarity.
pub struct SimilarityIndex {
    /// (dataset row, timestamp, unit vector) of every settled transaction.
    rows: Vec<(usize, i64, Vec<f32>)>,
    index: Index,
}

fn index_error(dir: &Path, e: impl std::fmt::Display) -> DatasetError {
    DatasetError::Malformed {
        path: dir.display().to_string(),
        reason: format!("similarity index: {e}"),
    }
}

fn unit(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter().map(|x| x / n).collect()
    } else {
        v.to_vec()
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl SimilarityIndex {
    /// Builds the index for `dataset` (kept beside it in `dir`).
    pub fn build(
        dir: &Path,
        dataset: &Dataset,
        features: &[TxFeatures],
    ) -> Result<Self, DatasetError> {
        let rows: Vec<(usize, i64, Vec<f32>)> = dataset
            .transactions
            .iter()
            .zip(features)
            .enumerate()
            .filter(|(_, (t, _))| t.status == "settled")
            .map(|(i, (t, f))| (i, t.ts_ms, unit(&f.vector())))
            .collect();
        let path = dir.join("similarity-index");
        let current = Index::open(&path)
            .ok()
            .filter(|ix| ix.config().model == FEATURE_MODEL && ix.len() == rows.len());
        let index = match current {
            Some(ix) => ix,
            None => {
                let _ = Index::remove(&path);
                let ix = Index::create(&path, IndexConfig::new(FEATURE_DIM, FEATURE_MODEL))
                    .map_err(|e| index_error(&path, e))?;
                let chunks = rows
                    .iter()
                    .map(|(i, _, v)| {
                        let t = &dataset.transactions[*i];
                        let mut metadata = BTreeMap::new();
                        metadata.insert(
                            "fraud_label".to_string(),
                            t.fraud_label.clone().unwrap_or_default(),
                        );
                        metadata.insert("mcc".to_string(), t.mcc.to_string());
                        NewChunk {
                            meta: ChunkMeta {
                                path: t.id.clone(),
                                start_line: 1,
                                end_line: 1,
                                language: "transaction".into(),
                                metadata,
                            },
                            text: String::new(),
                            vector: v.clone(),
                        }
                    })
                    .collect();
                ix.add_chunks(chunks).map_err(|e| index_error(&path, e))?;
                ix
            }
        };
        Ok(SimilarityIndex { rows, index })
    }

    /// Exact top-`k` by cosine similarity among rows before `before_ms`.
    pub fn exact(&self, v: &[f32], k: usize, before_ms: i64) -> Vec<(usize, f32)> {
        let q = unit(v);
        let mut scored: Vec<(usize, f32)> = self
            .rows
            .iter()
            .filter(|(_, ts, _)| *ts < before_ms)
            .map(|(i, _, r)| (*i, cosine(&q, r)))
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored.truncate(k);
        scored
    }

    /// Approximate top-`k` among rows before `before_ms`, through the HNSW index. Later
    /// rows are dropped after the search (over-fetching to make up for them); if too few
    /// remain, the exact scan answers.
    pub fn search(
        &self,
        dataset: &Dataset,
        v: &[f32],
        k: usize,
        before_ms: i64,
    ) -> Result<Vec<(usize, f32)>, ToolError> {
        let q = unit(v);
        if q.iter().all(|x| *x == 0.0) {
            return Ok(self.exact(v, k, before_ms));
        }
        let hits = self
            .index
            .search(
                &q,
                k * 3,
                &[],
                SearchOptions {
                    ef: Some(SEARCH_EF),
                    ..SearchOptions::default()
                },
            )
            .map_err(ToolError::from_error)?;
        let mut out: Vec<(usize, f32)> = hits
            .into_iter()
            .filter_map(|h| {
                let row = dataset.position(&h.path)?;
                (dataset.transactions[row].ts_ms < before_ms).then_some((row, h.score))
            })
            .collect();
        out.truncate(k);
        if out.len() < k.min(self.rows.len()) {
            return Ok(self.exact(v, k, before_ms));
        }
        Ok(out)
    }
}
