//! The node cache: outputs of nodes with a [`CachePolicy`], keyed by node and input, shared by
//! every run of a loaded graph (LangGraph's node caching).

use ferrograph_core::checkpoint::encode;
use ferrograph_core::id::stable_hash;
use ferrograph_core::node::{CachePolicy, NodeOutput};
use ferrograph_core::State;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Instant;

/// Entries kept at most; when full, expired entries go first, then everything.
const CAPACITY: usize = 10_000;

struct Entry<S: State> {
    written: Instant,
    output: NodeOutput<S>,
}

/// Cached node outputs of one loaded graph.
pub(crate) struct NodeCache<S: State> {
    entries: Mutex<HashMap<String, Entry<S>>>,
}

impl<S: State> NodeCache<S> {
    pub(crate) fn new() -> Self {
        NodeCache {
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The key of a task of `node` with `input`; `None` when the input cannot be encoded.
    pub(crate) fn key(node: &str, input: &S) -> Option<String> {
        let bytes = encode(S::SCHEMA_VERSION, input).ok()?;
        Some(stable_hash(&[b"node-cache", node.as_bytes(), &bytes]))
    }

    /// The cached output under `key`, if it is still fresh under `policy`.
    pub(crate) fn get(&self, key: &str, policy: &CachePolicy) -> Option<NodeOutput<S>> {
        let mut entries = self.entries.lock();
        let entry = entries.get(key)?;
        if policy.ttl.is_some_and(|ttl| entry.written.elapsed() > ttl) {
            entries.remove(key);
            return None;
        }
        Some(entry.output.clone())
    }

    /// Caches `output` under `key`.
    pub(crate) fn put(&self, key: String, output: NodeOutput<S>, policy: &CachePolicy) {
        let mut entries = self.entries.lock();
        if entries.len() >= CAPACITY && !entries.contains_key(&key) {
            if let Some(ttl) = policy.ttl {
                entries.retain(|_, e| e.written.elapsed() <= ttl);
            }
            if entries.len() >= CAPACITY {
                entries.clear();
            }
        }
        entries.insert(
            key,
            Entry {
                written: Instant::now(),
                output,
            },
        );
    }
}
