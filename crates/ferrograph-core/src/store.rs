//! The long-term store: memory shared across threads (LangGraph's `BaseStore`).
//!
//! Checkpoints hold one thread's state; a store holds what outlives a thread, such as what a
//! tutor has learned about a student or facts an agent team has settled. Items are JSON values
//! under a key in a *namespace* (a path of labels such as `["students", "ana", "memories"]`).
//! A store can list its namespaces, filter items by their fields, search them by meaning when
//! it has an embedding index, and forget items after a time to live.
//!
//! Nodes reach the runner's store through [`crate::NodeContext::store`]; tools through their
//! context. The trait lives here without any IO; `ferrograph_store::SledStore` implements it on
//! disk, with semantic search over the local embedding model and an HNSW index.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// Longest namespace (labels).
pub const MAX_NAMESPACE_DEPTH: usize = 16;
/// Longest label or key, in bytes.
pub const MAX_LABEL_BYTES: usize = 256;

/// A stored item.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Item {
    /// Its namespace.
    pub namespace: Vec<String>,
    /// Its key within the namespace.
    pub key: String,
    /// The value.
    pub value: Value,
    /// When it was first written, ms since the epoch.
    pub created_at_ms: u64,
    /// When it was last written, ms since the epoch.
    pub updated_at_ms: u64,
    /// When it expires, ms since the epoch (`None`: never).
    pub expires_at_ms: Option<u64>,
}

/// An item found by [`Store::search`], with its similarity to the query when the search was
/// semantic.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SearchItem {
    /// The item.
    #[serde(flatten)]
    pub item: Item,
    /// Cosine similarity to the query (`None` for a search without a query).
    pub score: Option<f32>,
}

/// What of an item's value is embedded for semantic search.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexFields {
    /// The store's configured fields.
    #[default]
    Default,
    /// Not embedded: the item is found by key, filter and listing only.
    Skip,
    /// These top-level fields (text fields are embedded as they are, others as JSON).
    Fields(Vec<String>),
}

/// Options of [`Store::put`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PutOptions {
    /// Forget the item this long after it is written (and after each read, when the store
    /// refreshes on read).
    pub ttl: Option<Duration>,
    /// What to embed.
    pub index: IndexFields,
}

impl PutOptions {
    /// Options with a time to live.
    pub fn ttl(ttl: Duration) -> Self {
        PutOptions {
            ttl: Some(ttl),
            ..Self::default()
        }
    }
}

/// A condition on one top-level field of an item's value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FieldCondition {
    /// Equal (JSON equality).
    Eq(Value),
    /// Not equal (a missing field is not equal).
    Ne(Value),
    /// Greater than (numbers, or strings compared as text).
    Gt(Value),
    /// Greater than or equal.
    Gte(Value),
    /// Less than.
    Lt(Value),
    /// Less than or equal.
    Lte(Value),
}

impl FieldCondition {
    /// Parses LangGraph's filter form: a plain value means equality; an object with one of
    /// `$eq`, `$ne`, `$gt`, `$gte`, `$lt`, `$lte` is that comparison.
    pub fn from_json(v: Value) -> Result<Self, StoreError> {
        if let Value::Object(map) = &v {
            if map.len() == 1 {
                if let Some((op, arg)) = map.iter().next() {
                    let arg = arg.clone();
                    return match op.as_str() {
                        "$eq" => Ok(FieldCondition::Eq(arg)),
                        "$ne" => Ok(FieldCondition::Ne(arg)),
                        "$gt" => Ok(FieldCondition::Gt(arg)),
                        "$gte" => Ok(FieldCondition::Gte(arg)),
                        "$lt" => Ok(FieldCondition::Lt(arg)),
                        "$lte" => Ok(FieldCondition::Lte(arg)),
                        other if other.starts_with('$') => Err(StoreError::Invalid(format!(
                            "unknown filter operator `{other}` (use $eq, $ne, $gt, $gte, $lt, $lte)"
                        ))),
                        _ => Ok(FieldCondition::Eq(v)),
                    };
                }
            }
        }
        Ok(FieldCondition::Eq(v))
    }

    /// Whether `field` (absent: `None`) satisfies the condition.
    pub fn holds(&self, field: Option<&Value>) -> bool {
        use std::cmp::Ordering;
        let order = |want: &Value| -> Option<Ordering> {
            match (field?, want) {
                (Value::Number(a), Value::Number(b)) => a.as_f64()?.partial_cmp(&b.as_f64()?),
                (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
                _ => None,
            }
        };
        match self {
            FieldCondition::Eq(v) => field == Some(v),
            FieldCondition::Ne(v) => field.is_some_and(|f| f != v),
            FieldCondition::Gt(v) => order(v) == Some(Ordering::Greater),
            FieldCondition::Gte(v) => matches!(order(v), Some(Ordering::Greater | Ordering::Equal)),
            FieldCondition::Lt(v) => order(v) == Some(Ordering::Less),
            FieldCondition::Lte(v) => matches!(order(v), Some(Ordering::Less | Ordering::Equal)),
        }
    }
}

/// A search over the items under a namespace prefix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SearchRequest {
    /// Only items whose namespace starts with these labels (empty: everywhere).
    #[serde(default)]
    pub namespace_prefix: Vec<String>,
    /// Conditions on top-level fields of the value; all must hold.
    #[serde(default)]
    pub filter: BTreeMap<String, FieldCondition>,
    /// Text to search for by meaning (needs a store with an embedding index); without it,
    /// items come newest first.
    #[serde(default)]
    pub query: Option<String>,
    /// At most this many items (default 10).
    #[serde(default = "default_limit")]
    pub limit: usize,
    /// Skip this many first.
    #[serde(default)]
    pub offset: usize,
}

fn default_limit() -> usize {
    10
}

impl SearchRequest {
    /// A search under `prefix` (no filter, no query, 10 items).
    pub fn under<I, T>(prefix: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        SearchRequest {
            namespace_prefix: prefix.into_iter().map(Into::into).collect(),
            filter: BTreeMap::new(),
            query: None,
            limit: default_limit(),
            offset: 0,
        }
    }

    /// Searches by meaning for `text`.
    #[must_use]
    pub fn query(mut self, text: impl Into<String>) -> Self {
        self.query = Some(text.into());
        self
    }

    /// Adds a condition on a field.
    #[must_use]
    pub fn filter(mut self, field: impl Into<String>, condition: FieldCondition) -> Self {
        self.filter.insert(field.into(), condition);
        self
    }

    /// Sets the limit.
    #[must_use]
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Whether an item's value passes every condition.
    pub fn matches(&self, value: &Value) -> bool {
        self.filter
            .iter()
            .all(|(field, cond)| cond.holds(value.get(field)))
    }
}

/// Which namespaces [`Store::list_namespaces`] returns.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceQuery {
    /// Only namespaces starting with these labels (`*` matches any one label).
    #[serde(default)]
    pub prefix: Vec<String>,
    /// Only namespaces ending with these labels (`*` matches any one label).
    #[serde(default)]
    pub suffix: Vec<String>,
    /// Cut namespaces to this many labels (duplicates removed).
    #[serde(default)]
    pub max_depth: Option<usize>,
    /// At most this many (default 100).
    #[serde(default)]
    pub limit: Option<usize>,
    /// Skip this many first.
    #[serde(default)]
    pub offset: usize,
}

impl NamespaceQuery {
    /// Whether `ns` passes the prefix and suffix conditions.
    pub fn matches(&self, ns: &[String]) -> bool {
        let label = |want: &String, have: &String| want == "*" || want == have;
        ns.len() >= self.prefix.len()
            && ns.len() >= self.suffix.len()
            && self.prefix.iter().zip(ns).all(|(w, h)| label(w, h))
            && self
                .suffix
                .iter()
                .rev()
                .zip(ns.iter().rev())
                .all(|(w, h)| label(w, h))
    }
}

/// Errors of a store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A namespace, key, filter or request that cannot be used.
    #[error("invalid store request: {0}")]
    Invalid(String),
    /// A semantic search on a store without an embedding index.
    #[error("this store has no embedding index: semantic search needs one (open the store with an embedder)")]
    NoIndex,
    /// The embedding model failed.
    #[error("embedding failed: {0}")]
    Embedding(String),
    /// A stored item does not read back.
    #[error("stored item `{key}` is damaged: {reason}")]
    Corrupt {
        /// The item's storage key, printable.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The storage backend failed.
    #[error("store backend failed: {message}")]
    Backend {
        /// What failed.
        message: String,
        /// Underlying error.
        #[source]
        source: Option<crate::node::BoxError>,
    },
}

/// Checks a namespace: 1 to [`MAX_NAMESPACE_DEPTH`] labels, each non-empty, at most
/// [`MAX_LABEL_BYTES`] bytes, without control characters.
pub fn check_namespace(ns: &[String]) -> Result<(), StoreError> {
    if ns.is_empty() || ns.len() > MAX_NAMESPACE_DEPTH {
        return Err(StoreError::Invalid(format!(
            "a namespace has 1 to {MAX_NAMESPACE_DEPTH} labels, this one {}",
            ns.len()
        )));
    }
    for label in ns {
        check_label(label, "namespace label")?;
    }
    Ok(())
}

/// Checks a key (the same rules as a label).
pub fn check_key(key: &str) -> Result<(), StoreError> {
    check_label(key, "key")
}

fn check_label(label: &str, what: &str) -> Result<(), StoreError> {
    if label.is_empty() || label.len() > MAX_LABEL_BYTES || label.chars().any(char::is_control) {
        return Err(StoreError::Invalid(format!(
            "a {what} is 1 to {MAX_LABEL_BYTES} bytes without control characters: {label:?}"
        )));
    }
    Ok(())
}

/// A long-term store (see the module docs).
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Creates or replaces the item at `namespace`/`key`.
    async fn put(
        &self,
        namespace: &[String],
        key: &str,
        value: Value,
        options: PutOptions,
    ) -> Result<(), StoreError>;

    /// The item at `namespace`/`key`, unless it is missing or expired.
    async fn get(&self, namespace: &[String], key: &str) -> Result<Option<Item>, StoreError>;

    /// Deletes the item; whether it existed.
    async fn delete(&self, namespace: &[String], key: &str) -> Result<bool, StoreError>;

    /// Items under a namespace prefix passing the filter: by meaning when the request has a
    /// query, newest first otherwise.
    async fn search(&self, request: SearchRequest) -> Result<Vec<SearchItem>, StoreError>;

    /// Namespaces that hold items, sorted.
    async fn list_namespaces(&self, query: NamespaceQuery) -> Result<Vec<Vec<String>>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conditions_parse_and_compare() {
        let c = FieldCondition::from_json(json!({"$gte": 3})).unwrap();
        assert!(c.holds(Some(&json!(3))));
        assert!(c.holds(Some(&json!(4.5))));
        assert!(!c.holds(Some(&json!(2))));
        assert!(!c.holds(None));
        assert!(!c.holds(Some(&json!("3"))));
        let eq = FieldCondition::from_json(json!("math")).unwrap();
        assert!(eq.holds(Some(&json!("math"))));
        let obj = FieldCondition::from_json(json!({"a": 1})).unwrap();
        assert_eq!(obj, FieldCondition::Eq(json!({"a": 1})));
        assert!(FieldCondition::from_json(json!({"$near": 1})).is_err());
        let ne = FieldCondition::Ne(json!(1));
        assert!(!ne.holds(None));
        assert!(ne.holds(Some(&json!(2))));
    }

    #[test]
    fn namespaces_and_keys_are_checked() {
        let ns = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_namespace(&ns(&["students", "ana"])).is_ok());
        assert!(check_namespace(&[]).is_err());
        assert!(check_namespace(&ns(&["a", ""])).is_err());
        assert!(check_namespace(&ns(&["a\u{1f}b"])).is_err());
        assert!(check_key(&"k".repeat(MAX_LABEL_BYTES + 1)).is_err());
        let q = NamespaceQuery {
            prefix: ns(&["students", "*"]),
            suffix: ns(&["memories"]),
            ..Default::default()
        };
        assert!(q.matches(&ns(&["students", "ana", "memories"])));
        assert!(!q.matches(&ns(&["students", "ana", "notes"])));
        assert!(!q.matches(&ns(&["teachers", "ana", "memories"])));
    }
}
