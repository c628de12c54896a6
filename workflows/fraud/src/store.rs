//! Where finished investigations are kept: a sled database beside the checkpoints, with the
//! investigation, its tool log, insights, recommendations and an audit trail. Every write is
//! keyed by the investigation id, so completing the same investigation twice (a completion
//! node re-run after a crash) overwrites instead of duplicating; the audit trail is keyed by
//! investigation and event, in time order.

use super::state::Investigation;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// sled failed (or another process holds the database).
    #[error("fraud store at {path}: {source}")]
    Sled {
        /// The database folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: sled::Error,
    },
    /// An investigation id breaks the id rule: ids key rows as `id/…`, so an id with a `/`
    /// would read another investigation's rows.
    #[error("fraud store: {0}")]
    InvalidId(#[from] ferrograph::core::id::InvalidId),
    /// A stored record is not valid JSON.
    #[error("fraud store: corrupt record {key}: {source}")]
    Corrupt {
        /// The key.
        key: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
}

/// One audit entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Investigation.
    pub investigation_id: String,
    /// Transaction.
    pub transaction_id: String,
    /// `investigation_completed`, `investigation_timed_out`, ...
    pub event: String,
    /// When, ISO 8601.
    pub timestamp: String,
    /// Final status.
    pub status: String,
    /// Final severity.
    pub severity: String,
    /// Final confidence.
    pub confidence_score: f64,
    /// Tools run, in order.
    pub steps: Vec<String>,
    /// Planner decisions that used the fallback.
    pub fallback_decisions: usize,
    /// Tools that failed or timed out.
    pub failed_tools: Vec<String>,
}

/// The investigation store.
#[derive(Clone)]
pub struct FraudStore {
    db: sled::Db,
    path: PathBuf,
}

impl std::fmt::Debug for FraudStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FraudStore")
            .field("path", &self.path)
            .finish()
    }
}

fn registry() -> &'static Mutex<std::collections::HashMap<PathBuf, FraudStore>> {
    static R: OnceLock<Mutex<std::collections::HashMap<PathBuf, FraudStore>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(std::collections::HashMap::new()))
}

impl FraudStore {
    /// Opens (once per process) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Arc<FraudStore>, StoreError> {
        let key = dir.to_path_buf();
        let mut reg = match registry().lock() {
            Ok(r) => r,
            Err(p) => p.into_inner(),
        };
        if let Some(s) = reg.get(&key) {
            return Ok(Arc::new(s.clone()));
        }
        let db = sled::open(dir).map_err(|source| StoreError::Sled {
            path: key.clone(),
            source,
        })?;
        let store = FraudStore {
            db,
            path: key.clone(),
        };
        reg.insert(key, store.clone());
        Ok(Arc::new(store))
    }

    fn err(&self, source: sled::Error) -> StoreError {
        StoreError::Sled {
            path: self.path.clone(),
            source,
        }
    }

    fn put(&self, tree: &str, key: &str, value: &Value) -> Result<(), StoreError> {
        let t = self.db.open_tree(tree).map_err(|e| self.err(e))?;
        t.insert(
            key.as_bytes(),
            serde_json::to_vec(value).unwrap_or_default(),
        )
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn scan(&self, tree: &str, prefix: &str) -> Result<Vec<Value>, StoreError> {
        let t = self.db.open_tree(tree).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for kv in t.scan_prefix(prefix.as_bytes()) {
            let (k, v) = kv.map_err(|e| self.err(e))?;
            out.push(
                serde_json::from_slice(&v).map_err(|source| StoreError::Corrupt {
                    key: String::from_utf8_lossy(&k).into_owned(),
                    source,
                })?,
            );
        }
        Ok(out)
    }

    fn get(&self, tree: &str, key: &str) -> Result<Option<Value>, StoreError> {
        let t = self.db.open_tree(tree).map_err(|e| self.err(e))?;
        match t.get(key.as_bytes()).map_err(|e| self.err(e))? {
            None => Ok(None),
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|source| StoreError::Corrupt {
                    key: format!("{tree}/{key}"),
                    source,
                }),
        }
    }

    /// Persists a finished investigation (seed order: investigation, state, tool log,
    /// insights, recommendations, audit) and flushes.
    pub fn persist(&self, s: &Investigation, event: &str) -> Result<AuditEntry, StoreError> {
        let id = &s.investigation_id;
        ferrograph::core::id::check_thread_id(id)?;
        self.put(
            "investigations",
            id,
            &json!({
                "investigation_id": id, "transaction_id": s.transaction_id, "status": s.status,
                "severity": s.severity, "confidence_score": s.confidence_score,
                "started_at": s.started_at, "completed_at": s.completed_at,
                "step_count": s.step_count, "error": s.error,
            }),
        )?;
        self.put(
            "states",
            id,
            &serde_json::to_value(s).unwrap_or(Value::Null),
        )?;
        for (i, t) in s.tool_executions.iter().enumerate() {
            self.put(
                "tool_log",
                &format!("{id}/{i:04}"),
                &serde_json::to_value(t).unwrap_or(Value::Null),
            )?;
        }
        self.put(
            "insights",
            id,
            &json!({
                "hypotheses": s.hypotheses, "evidence": s.evidence,
                "reasoning": s.reasoning, "pattern_results": s.pattern_results,
            }),
        )?;
        self.put(
            "recommendations",
            id,
            &json!({ "recommendations": s.recommendations, "rule_draft": s.rule_draft }),
        )?;
        let entry = AuditEntry {
            investigation_id: id.clone(),
            transaction_id: s.transaction_id.clone(),
            event: event.to_string(),
            timestamp: s.completed_at.clone().unwrap_or_else(super::time::now_iso),
            status: s.status.clone(),
            severity: s.severity.clone(),
            confidence_score: s.confidence_score,
            steps: s.completed_steps.clone(),
            fallback_decisions: s
                .planner_decisions
                .iter()
                .filter(|d| d.used_fallback)
                .count(),
            failed_tools: s
                .tool_executions
                .iter()
                .filter(|t| t.status != "SUCCESS")
                .map(|t| format!("{} ({})", t.tool_name, t.status))
                .collect(),
        };
        self.put(
            "audit",
            &format!("{id}/{event}"),
            &serde_json::to_value(&entry).unwrap_or(Value::Null),
        )?;
        self.db.flush().map_err(|e| self.err(e))?;
        Ok(entry)
    }

    /// Investigations, as summaries.
    pub fn investigations(&self) -> Result<Vec<Value>, StoreError> {
        self.scan("investigations", "")
    }

    /// One investigation's full state, tool log, insights and recommendations.
    pub fn investigation(&self, id: &str) -> Result<Option<Value>, StoreError> {
        ferrograph::core::id::check_thread_id(id)?;
        let state = self.get("states", id)?;
        let Some(state) = state else {
            return Ok(None);
        };
        Ok(Some(json!({
            "state": state,
            "tool_log": self.scan("tool_log", &format!("{id}/"))?,
            "insights": self.get("insights", id)?,
            "recommendations": self.get("recommendations", id)?,
            "audit": self.scan("audit", &format!("{id}/"))?,
        })))
    }

    /// The audit trail (of one investigation, or all).
    pub fn audit(&self, id: Option<&str>) -> Result<Vec<AuditEntry>, StoreError> {
        if let Some(i) = id {
            ferrograph::core::id::check_thread_id(i)?;
        }
        let prefix = id.map(|i| format!("{i}/")).unwrap_or_default();
        let mut out = Vec::new();
        for v in self.scan("audit", &prefix)? {
            out.push(
                serde_json::from_value(v).map_err(|source| StoreError::Corrupt {
                    key: "audit".into(),
                    source,
                })?,
            );
        }
        out.sort_by(|a: &AuditEntry, b| a.timestamp.cmp(&b.timestamp));
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn one_investigation_never_reads_another_ones_rows() {
        let dir = tempfile::tempdir().unwrap();
        let store = FraudStore::open(&dir.path().join("store")).unwrap();
        for id in ["a", "a:b", "ab"] {
            let s = Investigation {
                investigation_id: id.into(),
                transaction_id: format!("TX-{id}"),
                ..Investigation::default()
            };
            store.persist(&s, "completed").unwrap();
        }
        let audit = store.audit(Some("a")).unwrap();
        assert_eq!(audit.len(), 1, "{audit:?}");
        assert_eq!(audit[0].investigation_id, "a");
        // Ids that could reach other rows (or leave a folder) are refused, not scanned.
        let bad = Investigation {
            investigation_id: "a/b".into(),
            ..Investigation::default()
        };
        assert!(matches!(
            store.persist(&bad, "completed"),
            Err(StoreError::InvalidId(_))
        ));
        assert!(matches!(
            store.audit(Some("a/")),
            Err(StoreError::InvalidId(_))
        ));
        assert!(matches!(
            store.investigation(".."),
            Err(StoreError::InvalidId(_))
        ));
    }
}
