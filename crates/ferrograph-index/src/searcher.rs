//! [`Retriever`] as a [`Searcher`], so the index backs the `rag_search` and `docs_search`
//! tools of `ferrograph-tools` (feature `tools`).
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn demo(retriever: ferrograph_index::Retriever) -> Result<(), ferrograph_tools::ToolError> {
//! use ferrograph_tools::{builtin::SearchTool, ToolRegistry};
//! let mut registry = ToolRegistry::new();
//! registry.register(SearchTool::docs_search("vendor docs", Arc::new(retriever)))?;
//! # Ok(()) }
//! ```

use crate::{Hit, Query, Retriever};
use async_trait::async_trait;
use ferrograph_tools::builtin::{SearchHit, Searcher};
use ferrograph_tools::ToolError;

impl From<Hit> for SearchHit {
    fn from(h: Hit) -> Self {
        let location = match h.metadata.get("heading") {
            Some(heading) if !heading.is_empty() => {
                format!("lines {}-{} ({heading})", h.start_line, h.end_line)
            }
            _ => format!("lines {}-{}", h.start_line, h.end_line),
        };
        SearchHit {
            source: h.path,
            location: Some(location),
            score: h.score,
            text: h.text,
        }
    }
}

#[async_trait]
impl Searcher for Retriever {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<SearchHit>, ToolError> {
        let hits = self
            .search_async(Query::new(query).k(k))
            .await
            .map_err(ToolError::from_error)?;
        Ok(hits.into_iter().map(SearchHit::from).collect())
    }
}
