//! Durable delivery of domain events, and the agents' conversation store, on sled.
//!
//! The outbox lives in the checkpointed state; before each agent step its pending events are
//! dispatched here. Delivery is **at least once** (a step that crashes after dispatching runs
//! again and dispatches again) and **deduplicated by message id** (an inbox holds each id
//! once), so every subscriber receives every event exactly once.

use crate::error::TeamError;
use crate::events::Envelope;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Conversation entries kept per agent and run (older ones are dropped).
pub const MAX_ENTRIES_PER_AGENT: usize = 64;

/// A message as a recipient holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Delivered {
    /// Order of first dispatch in the run.
    pub seq: u64,
    /// The message.
    pub envelope: Envelope,
    /// When it was first delivered.
    pub delivered_at: String,
}

/// A message of the run's log, with its delivery record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// Order of first dispatch.
    pub seq: u64,
    /// The message.
    pub envelope: Envelope,
    /// Dispatch attempts (more than one after a crash between dispatch and checkpoint).
    pub attempts: u32,
    /// Who received it.
    pub recipients: Vec<String>,
}

/// What one dispatch did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DispatchReport {
    /// New (recipient, message id) deliveries.
    pub delivered: usize,
    /// Deliveries skipped because the inbox already held the id.
    pub duplicates: usize,
}

/// One turn of an agent's conversation with its model (the seed's `ConversationEntry`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConversationEntry {
    /// `<step>-<turn>`: the same when a step runs again, so a replay overwrites.
    pub entry_id: String,
    /// The agent.
    pub agent_id: String,
    /// The run.
    pub task_id: String,
    /// system, user, assistant.
    pub role: String,
    /// The text.
    pub content: String,
    /// When.
    pub timestamp: String,
    /// Tokens, when known.
    pub token_count: Option<u32>,
    /// The model.
    pub model: Option<String>,
}

/// The event bus and the conversation store of a data folder: a sled database, opened once
/// per process (sled locks its files; another process that holds them gets a clear error).
#[derive(Clone, Debug)]
pub struct TeamStore {
    path: PathBuf,
}

fn key(parts: &[&str]) -> Vec<u8> {
    parts.join("\0").into_bytes()
}

fn prefix(parts: &[&str]) -> Vec<u8> {
    let mut k = key(parts);
    k.push(0);
    k
}

impl TeamStore {
    /// The store at `dir`.
    pub fn new(dir: impl AsRef<Path>) -> Self {
        TeamStore {
            path: dir.as_ref().to_path_buf(),
        }
    }

    fn db(&self) -> Result<sled::Db, TeamError> {
        static OPEN: std::sync::OnceLock<std::sync::Mutex<BTreeMap<PathBuf, sled::Db>>> =
            std::sync::OnceLock::new();
        let mut open = OPEN
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(db) = open.get(&self.path) {
            return Ok(db.clone());
        }
        std::fs::create_dir_all(&self.path).map_err(|e| TeamError::io(&self.path, e))?;
        let db =
            ferrograph::checkpoint_savers::open_sled(&self.path, std::time::Duration::from_secs(2))
                .map_err(|e| match e {
                    sled::Error::Io(io)
                        if io.kind() == std::io::ErrorKind::Other
                            || io.kind() == std::io::ErrorKind::WouldBlock =>
                    {
                        TeamError::Busy {
                            path: self.path.clone(),
                            reason: io.to_string(),
                        }
                    }
                    other => TeamError::Store(other),
                })?;
        open.insert(self.path.clone(), db.clone());
        Ok(db)
    }

    /// Delivers `events` of `run` to their recipients; `after_each` runs after each event
    /// is stored (the crash tests stop the process there).
    pub fn dispatch(
        &self,
        run: &str,
        events: &[Envelope],
        after_each: &dyn Fn(usize),
    ) -> Result<DispatchReport, TeamError> {
        let db = self.db()?;
        let log = db.open_tree("events")?;
        let inbox = db.open_tree("inbox")?;
        let attempts = db.open_tree("attempts")?;
        let mut report = DispatchReport::default();
        for (i, e) in events.iter().enumerate() {
            let k = key(&[run, e.id()]);
            attempts.update_and_fetch(&k, |old| {
                let n = old
                    .and_then(|v| <[u8; 4]>::try_from(v).ok())
                    .map_or(0, u32::from_be_bytes);
                Some((n + 1).to_be_bytes().to_vec())
            })?;
            let seq = match log.get(&k)? {
                Some(v) => serde_json::from_slice::<Delivered>(&v)?.seq,
                None => {
                    let d = Delivered {
                        seq: db.generate_id()?,
                        envelope: e.clone(),
                        delivered_at: crate::domain::now(),
                    };
                    let v = serde_json::to_vec(&d)?;
                    // Another dispatch of the same id may have won: keep the first.
                    let _ = log.compare_and_swap(&k, None as Option<&[u8]>, Some(v))?;
                    match log.get(&k)? {
                        Some(v) => serde_json::from_slice::<Delivered>(&v)?.seq,
                        None => d.seq,
                    }
                }
            };
            for r in e.recipients() {
                let d = Delivered {
                    seq,
                    envelope: e.clone(),
                    delivered_at: crate::domain::now(),
                };
                let ik = key(&[run, &r, e.id()]);
                match inbox.compare_and_swap(
                    &ik,
                    None as Option<&[u8]>,
                    Some(serde_json::to_vec(&d)?),
                )? {
                    Ok(()) => report.delivered += 1,
                    Err(_) => report.duplicates += 1,
                }
            }
            db.flush()?;
            after_each(i);
        }
        Ok(report)
    }

    /// What `agent` received in `run`, in dispatch order.
    pub fn inbox(&self, run: &str, agent: &str) -> Result<Vec<Delivered>, TeamError> {
        let db = self.db()?;
        let inbox = db.open_tree("inbox")?;
        let mut out = Vec::new();
        for kv in inbox.scan_prefix(prefix(&[run, agent])) {
            let (_, v) = kv?;
            out.push(serde_json::from_slice::<Delivered>(&v)?);
        }
        out.sort_by_key(|d| d.seq);
        Ok(out)
    }

    /// The run's messages in dispatch order, with attempts and recipients.
    pub fn events(&self, run: &str) -> Result<Vec<EventRecord>, TeamError> {
        let db = self.db()?;
        let log = db.open_tree("events")?;
        let attempts = db.open_tree("attempts")?;
        let inbox = db.open_tree("inbox")?;
        let mut recipients: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for kv in inbox.scan_prefix(prefix(&[run])) {
            let (k, _) = kv?;
            let k = String::from_utf8_lossy(&k).into_owned();
            let mut parts = k.split('\0').skip(1);
            if let (Some(agent), Some(id)) = (parts.next(), parts.next()) {
                recipients
                    .entry(id.to_string())
                    .or_default()
                    .push(agent.to_string());
            }
        }
        let mut out = Vec::new();
        for kv in log.scan_prefix(prefix(&[run])) {
            let (k, v) = kv?;
            let d: Delivered = serde_json::from_slice(&v)?;
            let n = attempts
                .get(&k)?
                .and_then(|v| <[u8; 4]>::try_from(v.as_ref()).ok())
                .map_or(0, u32::from_be_bytes);
            out.push(EventRecord {
                seq: d.seq,
                attempts: n,
                recipients: recipients.remove(d.envelope.id()).unwrap_or_default(),
                envelope: d.envelope,
            });
        }
        out.sort_by_key(|r| r.seq);
        Ok(out)
    }

    /// Saves `entry` (an entry with the same id replaces it) and drops the agent's oldest
    /// entries beyond [`MAX_ENTRIES_PER_AGENT`].
    pub fn save_entry(&self, entry: &ConversationEntry) -> Result<(), TeamError> {
        let db = self.db()?;
        let conv = db.open_tree("conversations")?;
        conv.insert(
            key(&[&entry.task_id, &entry.agent_id, &entry.entry_id]),
            serde_json::to_vec(entry)?,
        )?;
        let p = prefix(&[&entry.task_id, &entry.agent_id]);
        let n = conv.scan_prefix(&p).count();
        if n > MAX_ENTRIES_PER_AGENT {
            let old: Vec<_> = conv
                .scan_prefix(&p)
                .keys()
                .take(n - MAX_ENTRIES_PER_AGENT)
                .collect::<Result<_, _>>()?;
            for k in old {
                conv.remove(k)?;
            }
        }
        db.flush()?;
        Ok(())
    }

    /// The agent's conversation in `run`, oldest first; with `limit`, the last `limit`.
    pub fn history(
        &self,
        run: &str,
        agent: &str,
        limit: Option<usize>,
    ) -> Result<Vec<ConversationEntry>, TeamError> {
        let db = self.db()?;
        let conv = db.open_tree("conversations")?;
        let mut out = Vec::new();
        for kv in conv.scan_prefix(prefix(&[run, agent])) {
            out.push(serde_json::from_slice::<ConversationEntry>(&kv?.1)?);
        }
        if let Some(l) = limit {
            let skip = out.len().saturating_sub(l);
            out.drain(..skip);
        }
        Ok(out)
    }

    /// Every agent's conversation in `run`, grouped by agent.
    pub fn full_history(
        &self,
        run: &str,
    ) -> Result<BTreeMap<String, Vec<ConversationEntry>>, TeamError> {
        let db = self.db()?;
        let conv = db.open_tree("conversations")?;
        let mut out: BTreeMap<String, Vec<ConversationEntry>> = BTreeMap::new();
        for kv in conv.scan_prefix(prefix(&[run])) {
            let e: ConversationEntry = serde_json::from_slice(&kv?.1)?;
            out.entry(e.agent_id.clone()).or_default().push(e);
        }
        Ok(out)
    }

    /// Forgets the agent's conversation in `run`.
    pub fn clear_history(&self, run: &str, agent: &str) -> Result<(), TeamError> {
        let db = self.db()?;
        let conv = db.open_tree("conversations")?;
        let keys: Vec<_> = conv
            .scan_prefix(prefix(&[run, agent]))
            .keys()
            .collect::<Result<_, _>>()?;
        for k in keys {
            conv.remove(k)?;
        }
        db.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::events::{agent, DomainEvent, Envelope};

    #[test]
    fn redelivery_is_deduplicated_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let store = TeamStore::new(dir.path());
        let ev = DomainEvent::CodeArtifactReady {
            artifact_id: "A".into(),
            story_ids: vec![],
            test_coverage: 90.0,
            self_tests_passing: true,
        };
        let e = Envelope::event("m1".into(), agent::SSE, &ev);
        let r = store
            .dispatch("run", std::slice::from_ref(&e), &|_| {})
            .unwrap();
        assert_eq!(r.delivered, 2);
        let r = store.dispatch("run", &[e], &|_| {}).unwrap();
        assert_eq!((r.delivered, r.duplicates), (0, 2));
        assert_eq!(store.inbox("run", agent::QC).unwrap().len(), 1);
        assert_eq!(store.inbox("run", agent::TL).unwrap().len(), 1);
        assert!(store.inbox("run", agent::PO).unwrap().is_empty());
        let log = store.events("run").unwrap();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].attempts, 2);
        assert_eq!(log[0].recipients.len(), 2);
        assert!(store.events("other").unwrap().is_empty());
    }

    #[test]
    fn conversations_are_ordered_limited_and_grouped() {
        let dir = tempfile::tempdir().unwrap();
        let store = TeamStore::new(dir.path());
        let entry = |agent: &str, i: usize| ConversationEntry {
            entry_id: format!("{i:08}-00"),
            agent_id: agent.into(),
            task_id: "run".into(),
            role: "user".into(),
            content: format!("turn {i}"),
            timestamp: String::new(),
            token_count: None,
            model: None,
        };
        for i in 0..MAX_ENTRIES_PER_AGENT + 5 {
            store.save_entry(&entry("po_agent", i)).unwrap();
        }
        store.save_entry(&entry("ba_agent", 1)).unwrap();
        store.save_entry(&entry("ba_agent", 1)).unwrap();
        let h = store.history("run", "po_agent", None).unwrap();
        assert_eq!(h.len(), MAX_ENTRIES_PER_AGENT);
        assert_eq!(h[0].content, "turn 5", "the oldest went");
        assert_eq!(
            store.history("run", "po_agent", Some(2)).unwrap()[1].content,
            format!("turn {}", MAX_ENTRIES_PER_AGENT + 4)
        );
        let all = store.full_history("run").unwrap();
        assert_eq!(all["ba_agent"].len(), 1, "a replayed entry replaces itself");
        store.clear_history("run", "po_agent").unwrap();
        assert!(store.history("run", "po_agent", None).unwrap().is_empty());
    }
}
