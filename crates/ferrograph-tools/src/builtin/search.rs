//! Search tools over any retrieval backend: `rag_search` (a named index) and `docs_search`
//! (an offline documentation corpus) are [`SearchTool`]s over a [`Searcher`].
//!
//! This crate does not depend on the index; implement [`Searcher`] for the retriever (a few
//! lines over its async search) and register the tools:
//!
//! ```ignore
//! struct Rag(ferrograph_index::Retriever);
//! #[async_trait::async_trait]
//! impl Searcher for Rag {
//!     async fn search(&self, query: &str, k: usize) -> Result<Vec<SearchHit>, ToolError> {
//!         let hits = self.0.search_async(Query::new(query).k(k)).await.map_err(ToolError::from_error)?;
//!         Ok(hits.into_iter().map(|h| SearchHit { source: h.path, text: h.text, score: h.score,
//!             location: Some(format!("{}-{}", h.start_line, h.end_line)) }).collect())
//!     }
//! }
//! registry.register(SearchTool::rag_search("codebase", Arc::new(Rag(retriever))))?;
//! ```

use crate::tool::{decode_args, parameters_schema, Tool, ToolContext, ToolError};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

/// One search result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SearchHit {
    /// Where it comes from (a file path, a document name, a URL).
    pub source: String,
    /// Where in the source (lines, a heading), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Similarity score (higher is closer).
    pub score: f32,
    /// The matching text.
    pub text: String,
}

/// A retrieval backend: text query in, best hits out.
#[async_trait]
pub trait Searcher: Send + Sync {
    /// The `k` best hits for `query`, best first.
    async fn search(&self, query: &str, k: usize) -> Result<Vec<SearchHit>, ToolError>;
}

/// Arguments of a search tool.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    /// What to look for, in words.
    #[schemars(length(min = 1, max = 200))]
    pub query: String,
    /// How many results to return (default 5).
    #[serde(default)]
    #[schemars(range(min = 1, max = 20))]
    pub k: Option<usize>,
}

/// A search tool over a [`Searcher`], returning hits as JSON (`source`, `location`, `score`,
/// `text`, each text cut to a size limit).
#[derive(Clone)]
pub struct SearchTool {
    name: String,
    description: String,
    searcher: Arc<dyn Searcher>,
    max_k: usize,
    max_chars: usize,
}

impl std::fmt::Debug for SearchTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchTool")
            .field("name", &self.name)
            .field("max_k", &self.max_k)
            .finish()
    }
}

impl SearchTool {
    /// A search tool called `name`.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        searcher: Arc<dyn Searcher>,
    ) -> Self {
        SearchTool {
            name: name.into(),
            description: description.into(),
            searcher,
            max_k: 20,
            max_chars: 2000,
        }
    }

    /// `rag_search` over the index called `index_name`.
    pub fn rag_search(index_name: &str, searcher: Arc<dyn Searcher>) -> Self {
        Self::new(
            "rag_search",
            format!(
                "Search the `{index_name}` index for passages relevant to a question; returns \
                 the best matching chunks with their source and score."
            ),
            searcher,
        )
    }

    /// `docs_search` over an offline documentation corpus (vendor docs, changelogs, issue
    /// threads): the offline stand-in for web search.
    pub fn docs_search(corpus: &str, searcher: Arc<dyn Searcher>) -> Self {
        Self::new(
            "docs_search",
            format!(
                "Search the offline documentation corpus ({corpus}: documentation, READMEs, \
                 changelogs, known issues) for a topic, error message or bug; returns the best \
                 matching passages with their source."
            ),
            searcher,
        )
    }

    /// Caps `k` and the text returned per hit.
    #[must_use]
    pub fn limits(mut self, max_k: usize, max_chars: usize) -> Self {
        self.max_k = max_k.max(1);
        self.max_chars = max_chars.max(1);
        self
    }
}

#[async_trait]
impl Tool for SearchTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        parameters_schema::<SearchArgs>()
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let args: SearchArgs = decode_args(&self.name, args)?;
        if args.query.trim().is_empty() {
            return Err(ToolError::invalid_arguments(
                &self.name,
                "the query is empty",
            ));
        }
        let k = args.k.unwrap_or(5).clamp(1, self.max_k);
        let mut hits = self.searcher.search(&args.query, k).await?;
        hits.truncate(k);
        for h in &mut hits {
            if h.text.chars().count() > self.max_chars {
                h.text = h.text.chars().take(self.max_chars).collect::<String>() + "…";
            }
        }
        crate::tool::encode_output(&hits)
    }
}
