//! Chunks, hits and filters.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where a chunk comes from and what it is about; filters read these fields.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkMeta {
    /// Path of the source document, relative to the indexed folder, `/`-separated.
    pub path: String,
    /// First line of the chunk (1-based).
    pub start_line: u32,
    /// Last line of the chunk (1-based, inclusive).
    pub end_line: u32,
    /// Language (`rust`, `python`, `markdown`, `text`, ...).
    pub language: String,
    /// Any other key/value (`module`, `heading`, `item`, ...).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

impl ChunkMeta {
    /// The value of a field: `path`, `language`, `start_line`, `end_line`, else a metadata key.
    pub fn field(&self, key: &str) -> Option<std::borrow::Cow<'_, str>> {
        use std::borrow::Cow;
        match key {
            "path" => Some(Cow::Borrowed(&self.path)),
            "language" => Some(Cow::Borrowed(&self.language)),
            "start_line" => Some(Cow::Owned(self.start_line.to_string())),
            "end_line" => Some(Cow::Owned(self.end_line.to_string())),
            other => self.metadata.get(other).map(|v| Cow::Borrowed(v.as_str())),
        }
    }
}

/// A chunk to store: its metadata, its text and its embedding.
#[derive(Clone, Debug, PartialEq)]
pub struct NewChunk {
    /// Metadata.
    pub meta: ChunkMeta,
    /// Text (returned with hits).
    pub text: String,
    /// Embedding; normalized to unit length when stored.
    pub vector: Vec<f32>,
}

/// A new version of a document: its chunks replace the old ones in one atomic commit.
#[derive(Clone, Debug, PartialEq)]
pub struct DocumentUpdate {
    /// The document's path (its key).
    pub path: String,
    /// A hash of its content; an unchanged hash lets builders skip re-embedding.
    pub content_hash: String,
    /// The chunks.
    pub chunks: Vec<NewChunk>,
}

/// One search result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hit {
    /// The chunk's id (stable until the chunk is deleted or replaced).
    pub id: u64,
    /// Cosine similarity to the query, in `[-1, 1]` (higher is closer).
    pub score: f32,
    /// Path of the document.
    pub path: String,
    /// First line (1-based).
    pub start_line: u32,
    /// Last line (1-based, inclusive).
    pub end_line: u32,
    /// Language.
    pub language: String,
    /// Other metadata.
    pub metadata: BTreeMap<String, String>,
    /// The chunk's text.
    pub text: String,
}

/// A condition on chunk metadata. Several filters in a query must all hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Filter {
    /// The field (see [`ChunkMeta::field`]) equals the value.
    Eq {
        /// Field name.
        key: String,
        /// Wanted value.
        value: String,
    },
    /// The field equals one of the values.
    OneOf {
        /// Field name.
        key: String,
        /// Accepted values.
        values: Vec<String>,
    },
    /// The path starts with this prefix.
    PathPrefix(String),
}

impl Filter {
    /// `key == value` on any field.
    pub fn eq(key: impl Into<String>, value: impl Into<String>) -> Self {
        Filter::Eq {
            key: key.into(),
            value: value.into(),
        }
    }

    /// The `module` metadata key (set by [`crate::index_dir`]).
    pub fn module(module: impl Into<String>) -> Self {
        Filter::eq("module", module)
    }

    /// The language.
    pub fn language(language: impl Into<String>) -> Self {
        Filter::eq("language", language)
    }

    /// A path prefix.
    pub fn path_prefix(prefix: impl Into<String>) -> Self {
        Filter::PathPrefix(prefix.into())
    }

    /// Parses `key=value`; `path_prefix=P` gives [`Filter::PathPrefix`] and `key=a|b|c`
    /// gives [`Filter::OneOf`].
    pub fn parse(s: &str) -> crate::Result<Self> {
        let (key, value) = s
            .split_once('=')
            .ok_or_else(|| crate::IndexError::Invalid(format!("filter `{s}` is not key=value")))?;
        let key = key.trim();
        if key.is_empty() {
            return Err(crate::IndexError::Invalid(format!(
                "filter `{s}` has an empty key"
            )));
        }
        Ok(match key {
            "path_prefix" | "prefix" => Filter::PathPrefix(value.to_string()),
            _ if value.contains('|') => Filter::OneOf {
                key: key.to_string(),
                values: value.split('|').map(str::to_string).collect(),
            },
            _ => Filter::eq(key, value),
        })
    }

    /// Whether a chunk passes.
    pub fn matches(&self, meta: &ChunkMeta) -> bool {
        match self {
            Filter::Eq { key, value } => meta.field(key).is_some_and(|v| v == value.as_str()),
            Filter::OneOf { key, values } => meta
                .field(key)
                .is_some_and(|v| values.iter().any(|x| x.as_str() == v)),
            Filter::PathPrefix(p) => meta.path.starts_with(p.as_str()),
        }
    }
}

/// Whether a chunk passes every filter.
pub fn matches_all(filters: &[Filter], meta: &ChunkMeta) -> bool {
    filters.iter().all(|f| f.matches(meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_and_match() {
        let mut meta = ChunkMeta {
            path: "crates/x/src/lib.rs".into(),
            start_line: 1,
            end_line: 9,
            language: "rust".into(),
            ..Default::default()
        };
        meta.metadata.insert("module".into(), "x".into());
        assert!(Filter::parse("module=x").unwrap().matches(&meta));
        assert!(!Filter::parse("module=y").unwrap().matches(&meta));
        assert!(Filter::parse("module=y|x").unwrap().matches(&meta));
        assert!(Filter::parse("path_prefix=crates/x/")
            .unwrap()
            .matches(&meta));
        assert!(Filter::parse("language=rust").unwrap().matches(&meta));
        assert!(!Filter::parse("missing=1").unwrap().matches(&meta));
        assert!(Filter::parse("novalue").is_err());
        assert!(Filter::parse("=x").is_err());
    }
}
