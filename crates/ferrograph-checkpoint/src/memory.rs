//! An in-memory checkpoint saver: fast, shared by every run of a process, gone when it exits.

use async_trait::async_trait;
use ferrograph_core::checkpoint::{
    CheckpointError, CheckpointRecord, CheckpointSaver, PendingWrite, ThreadInfo, ThreadStatus,
};
use parking_lot::RwLock;
use std::collections::{BTreeMap, HashMap};

#[derive(Default)]
struct Thread {
    checkpoints: BTreeMap<String, CheckpointRecord>,
    writes: HashMap<String, Vec<PendingWrite>>,
    info: Option<ThreadInfo>,
}

/// Keeps checkpoints in memory. Useful for tests, benchmarks and short-lived processes.
#[derive(Default)]
pub struct MemorySaver {
    threads: RwLock<HashMap<String, Thread>>,
}

impl MemorySaver {
    /// An empty saver.
    pub fn new() -> Self {
        Self::default()
    }

    /// Total bytes of stored checkpoint payloads (for measurements).
    pub fn payload_bytes(&self, thread_id: &str) -> usize {
        self.threads
            .read()
            .get(thread_id)
            .map(|t| t.checkpoints.values().map(|c| c.payload.len()).sum())
            .unwrap_or(0)
    }
}

#[async_trait]
impl CheckpointSaver for MemorySaver {
    async fn put(&self, record: CheckpointRecord) -> Result<(), CheckpointError> {
        let mut threads = self.threads.write();
        let t = threads.entry(record.thread_id.clone()).or_default();
        t.checkpoints.insert(record.checkpoint_id.clone(), record);
        Ok(())
    }

    async fn put_writes(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
        writes: Vec<PendingWrite>,
    ) -> Result<(), CheckpointError> {
        let mut threads = self.threads.write();
        let t = threads.entry(thread_id.to_string()).or_default();
        t.writes
            .entry(checkpoint_id.to_string())
            .or_default()
            .extend(writes);
        Ok(())
    }

    async fn get(
        &self,
        thread_id: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<Option<CheckpointRecord>, CheckpointError> {
        let threads = self.threads.read();
        let Some(t) = threads.get(thread_id) else {
            return Ok(None);
        };
        Ok(match checkpoint_id {
            Some(id) => t.checkpoints.get(id).cloned(),
            None => t.checkpoints.values().next_back().cloned(),
        })
    }

    async fn get_writes(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
    ) -> Result<Vec<PendingWrite>, CheckpointError> {
        Ok(self
            .threads
            .read()
            .get(thread_id)
            .and_then(|t| t.writes.get(checkpoint_id).cloned())
            .unwrap_or_default())
    }

    async fn list(
        &self,
        thread_id: &str,
        before: Option<&str>,
        limit: Option<usize>,
    ) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        let threads = self.threads.read();
        let Some(t) = threads.get(thread_id) else {
            return Ok(Vec::new());
        };
        let iter = t
            .checkpoints
            .values()
            .rev()
            .filter(|c| before.is_none_or(|b| c.checkpoint_id.as_str() < b));
        Ok(match limit {
            Some(n) => iter.take(n).cloned().collect(),
            None => iter.cloned().collect(),
        })
    }

    async fn put_thread(&self, info: ThreadInfo) -> Result<(), CheckpointError> {
        let mut threads = self.threads.write();
        let key = info.thread_id.clone();
        threads.entry(key).or_default().info = Some(info);
        Ok(())
    }

    async fn get_thread(&self, thread_id: &str) -> Result<Option<ThreadInfo>, CheckpointError> {
        Ok(self
            .threads
            .read()
            .get(thread_id)
            .and_then(|t| t.info.clone()))
    }

    async fn list_threads(
        &self,
        status: Option<ThreadStatus>,
    ) -> Result<Vec<ThreadInfo>, CheckpointError> {
        let mut out: Vec<ThreadInfo> = self
            .threads
            .read()
            .values()
            .filter_map(|t| t.info.clone())
            .filter(|i| status.is_none_or(|s| i.status == s))
            .collect();
        out.sort_by(|a, b| a.thread_id.cmp(&b.thread_id));
        Ok(out)
    }

    async fn delete_before(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
    ) -> Result<usize, CheckpointError> {
        let mut threads = self.threads.write();
        let Some(t) = threads.get_mut(thread_id) else {
            return Ok(0);
        };
        let old: Vec<String> = t
            .checkpoints
            .range(..checkpoint_id.to_string())
            .map(|(k, _)| k.clone())
            .collect();
        for k in &old {
            t.checkpoints.remove(k);
            t.writes.remove(k);
        }
        Ok(old.len())
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        Ok(self.threads.write().remove(thread_id).is_some())
    }
}
