//! Retrieval for ferrograph: on-device embeddings, a persistent vector index of text chunks,
//! and a retriever.
//!
//! - [`BertEmbedder`]: all-MiniLM-L6-v2 (from `models/`, see
//!   [`ferrograph_models::manifest`]) on candle — mean pooling over the attention mask,
//!   L2-normalized, batched by length, CPU by default ([`EmbedOptions::device`]).
//! - [`Index`]: sled holds the chunks, vectors and metadata (the source of truth); an HNSW
//!   graph (hnsw_rs) is a cache, dumped crash-safely and rebuilt from the stored vectors
//!   (never by re-embedding) when missing, stale or corrupt. Deletes and updates are
//!   tombstones, filtered out of searches; the graph is rebuilt when they pile up. Metadata
//!   filters run inside the graph search and are re-checked on every hit.
//! - [`chunk`]: code by top-level items, Markdown by headings and paragraphs, else windows.
//! - [`Retriever`]: [`Query`] (text, `k`, filters, per-filter top-k merged by score, minimum
//!   score) to [`Hit`]s; [`Retriever::search_async`] runs on tokio's blocking pool.
//! - [`index_dir`]: index a folder incrementally (unchanged files are not re-embedded).
//!
//! ```no_run
//! use ferrograph_index::{BertEmbedder, EmbedOptions, Embedder, Index, IndexConfig, Query, Retriever, Filter};
//! use std::sync::Arc;
//! # fn main() -> Result<(), ferrograph_index::IndexError> {
//! let embedder = Arc::new(BertEmbedder::default_model(EmbedOptions::default())?);
//! let index = Index::open_or_create("/tmp/my-index", IndexConfig::new(embedder.dim(), embedder.model_id()))?;
//! ferrograph_index::index_dir(&index, embedder.as_ref(), "src".as_ref(), &Default::default(), &mut |_| {})?;
//! let retriever = Retriever::new(Arc::new(index), embedder)?;
//! let hits = retriever.search(&Query::new("where are checkpoints written?").k(5).filter(Filter::language("rust")))?;
//! for h in hits {
//!     println!("{:.3} {}:{}-{}", h.score, h.path, h.start_line, h.end_line);
//! }
//! # Ok(()) }
//! ```

pub mod bench;
pub mod build;
pub mod chunk;
pub mod distance;
pub mod embed;
pub mod error;
mod graph;
pub mod index;
pub mod lexical;
pub mod retriever;
#[cfg(feature = "tools")]
pub mod searcher;
pub mod types;
mod view;

pub use build::{index_dir, BuildOptions, BuildProgress, BuildReport};
pub use chunk::{ChunkOptions, TextChunk};
pub use embed::{
    BertEmbedder, CountingEmbedder, EmbedOptions, Embedder, HashEmbedder, DEFAULT_EMBEDDING_MODEL,
};
pub use error::{IndexError, Result};
/// Which forward pass runs a model ([`EmbedOptions::kernels`]).
pub use ferrograph_kernels::Kernels;
pub use index::{
    is_index, CommitReport, GraphSource, HnswParams, Index, IndexConfig, IndexStats, SearchOptions,
    LOCK_WAIT,
};
pub use lexical::{code_tokens, reciprocal_rank_fusion, CodeTokenizer, LexicalIndex};
pub use retriever::{PerFilter, Query, Retriever};
pub use types::{ChunkMeta, DocumentUpdate, Filter, Hit, NewChunk};
