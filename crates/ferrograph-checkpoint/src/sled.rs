//! A durable checkpoint saver on [sled](https://docs.rs/sled/0.34), an embedded log-structured
//! key-value store.
//!
//! # Layout
//!
//! One sled database per directory, opened once per process and shared by every run (see
//! [`SledSaver::open`]). Three trees:
//!
//! - [`CHECKPOINTS_TREE`]: key `thread \0 checkpoint_id`, value a sealed [`CheckpointRecord`].
//!   Checkpoint ids are fixed-width, time-ordered hex strings, so the keys of one thread sort by
//!   creation: the newest checkpoint is the last key of the range `thread\0 .. thread\x01` (a
//!   reverse range scan) and `list` walks that range backwards.
//! - [`WRITES_TREE`]: key `thread \0 checkpoint_id \0 seq`, where `seq` is a big-endian `u64`
//!   from sled's `generate_id` (monotonic across restarts), value a sealed [`PendingWrite`].
//!   Pending writes of a step therefore come back in the order they were written.
//! - [`THREADS_TREE`]: key `thread`, value a sealed [`ThreadInfo`].
//!
//! Thread and checkpoint ids must not contain NUL bytes (the key separator); writing one is a
//! typed [`CheckpointError::Backend`] error, reading one finds nothing.
//!
//! # Integrity
//!
//! Every stored value is sealed with [`ferrograph_core::checkpoint::encode`] (magic bytes,
//! format version, CRC-32, length). A damaged or truncated value is reported as
//! [`CheckpointError::Corrupt`] naming the thread and checkpoint (thread records name the
//! checkpoint `(thread record)`); nothing is ever silently dropped or reset.
//!
//! # Durability and group commit
//!
//! Writes go to sled's in-memory log buffers; [`CheckpointSaver::flush`] makes them durable
//! (write and sync on the calling thread, with the tokio worker handed over meanwhile; see
//! `flush_db`). Flushes are
//! grouped: every write bumps a counter, a flush remembers the counter it must cover, and of
//! the flushes waiting at the same time only one goes to disk, covering all writes made
//! before it started. Hundreds of concurrent runs in sync mode therefore share fsyncs instead
//! of queueing one each. sled recovers a prefix of its log after a crash, so a write that
//! survived implies that every earlier one did.
//!
//! # Deleting
//!
//! [`CheckpointSaver::delete_thread`] and [`CheckpointSaver::delete_before`] remove their
//! keys in one sled transaction over the three trees, so a crash leaves either all of them or
//! none.

use async_trait::async_trait;
use ferrograph_core::checkpoint::{
    decode, encode, CheckpointError, CheckpointRecord, CheckpointSaver, CodecError, PendingWrite,
    ThreadInfo, ThreadStatus,
};
use parking_lot::Mutex;
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

/// Name of the tree holding checkpoint records.
pub const CHECKPOINTS_TREE: &str = "ferrograph/checkpoints/v1";
/// Name of the tree holding pending writes.
pub const WRITES_TREE: &str = "ferrograph/writes/v1";
/// Name of the tree holding thread records.
pub const THREADS_TREE: &str = "ferrograph/threads/v1";

/// Schema version written in the envelope of every stored value. The state's own schema
/// version lives inside the checkpoint payload, which is sealed separately.
pub(crate) const STORE_SCHEMA: u32 = 1;

/// How long opening a store waits for the lock of a handle that is still closing.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Name used in [`CheckpointError::Corrupt`] for a damaged thread record.
pub const THREAD_RECORD: &str = "(thread record)";

const SEP: u8 = 0;

/// Counters of what a [`SledSaver`] wrote, for measurements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SledStats {
    /// Checkpoint records stored.
    pub checkpoints: u64,
    /// Pending writes stored.
    pub pending_writes: u64,
    /// Thread records stored.
    pub thread_records: u64,
    /// Bytes handed to sled (keys and sealed values) by every kind of write.
    pub bytes_written: u64,
    /// Of `bytes_written`, the checkpoint payloads (state snapshots or deltas) alone.
    pub payload_bytes: u64,
    /// Flushes that went to disk.
    pub disk_flushes: u64,
    /// Flush calls answered by a flush that another caller made (group commit).
    pub grouped_flushes: u64,
    /// Flush calls with nothing new to flush.
    pub empty_flushes: u64,
    /// Total time spent in disk flushes, nanoseconds.
    pub flush_nanos: u64,
}

#[derive(Default)]
struct Counters {
    checkpoints: AtomicU64,
    pending_writes: AtomicU64,
    thread_records: AtomicU64,
    bytes_written: AtomicU64,
    payload_bytes: AtomicU64,
    disk_flushes: AtomicU64,
    grouped_flushes: AtomicU64,
    empty_flushes: AtomicU64,
    flush_nanos: AtomicU64,
}

/// Durable checkpoints in a sled database on disk. See the module documentation for the
/// layout, integrity checks and group commit.
pub struct SledSaver {
    path: PathBuf,
    db: sled::Db,
    checkpoints: sled::Tree,
    writes: sled::Tree,
    threads: sled::Tree,
    /// Writes that returned (each bumps it after sled accepted it).
    written: AtomicU64,
    /// Highest `written` value known to be on disk.
    durable: AtomicU64,
    /// Held while a flush is on its way to disk.
    flush_lock: tokio::sync::Mutex<()>,
    counters: Counters,
}

impl std::fmt::Debug for SledSaver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledSaver")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

type Registry = Mutex<HashMap<PathBuf, Weak<SledSaver>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

fn backend(message: impl Into<String>, e: sled::Error) -> CheckpointError {
    CheckpointError::backend(message, e)
}

/// A failed sled transaction (storage error, or an abort, which these transactions never ask
/// for) as a backend error about `what`.
fn transaction_failed(what: &str, e: TransactionError<()>) -> CheckpointError {
    match e {
        TransactionError::Storage(e) => backend(format!("could not {what}"), e),
        TransactionError::Abort(()) => CheckpointError::Backend {
            message: format!("the transaction to {what} was aborted"),
            source: None,
        },
    }
}

fn no_nul(kind: &str, id: &str) -> Result<(), CheckpointError> {
    if id.as_bytes().contains(&SEP) {
        return Err(CheckpointError::Backend {
            message: format!("{kind} id {id:?} contains a NUL byte, which sled keys reserve"),
            source: None,
        });
    }
    Ok(())
}

fn has_nul(id: &str) -> bool {
    id.as_bytes().contains(&SEP)
}

/// `thread \0`: the prefix of the thread's checkpoint keys.
fn thread_prefix(thread: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(thread.len() + 1);
    k.extend_from_slice(thread.as_bytes());
    k.push(SEP);
    k
}

/// `thread \x01`: just past every key of the thread.
fn thread_end(thread: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(thread.len() + 1);
    k.extend_from_slice(thread.as_bytes());
    k.push(SEP + 1);
    k
}

/// The key of a checkpoint record: `thread \0 checkpoint_id`.
pub fn checkpoint_key(thread: &str, checkpoint_id: &str) -> Vec<u8> {
    let mut k = thread_prefix(thread);
    k.extend_from_slice(checkpoint_id.as_bytes());
    k
}

/// `thread \0 checkpoint_id \0`: the prefix of a step's pending-write keys.
fn writes_prefix(thread: &str, checkpoint_id: &str) -> Vec<u8> {
    let mut k = checkpoint_key(thread, checkpoint_id);
    k.push(SEP);
    k
}

/// The checkpoint id of a key in the checkpoints or writes tree of `thread` (for errors).
fn checkpoint_of_key(thread: &str, key: &[u8]) -> String {
    let rest = key.get(thread.len() + 1..).unwrap_or_default();
    let end = rest.iter().position(|b| *b == SEP).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end]).into_owned()
}

fn corrupt(thread: &str, checkpoint: &str, source: CodecError) -> CheckpointError {
    CheckpointError::Corrupt {
        thread: thread.to_string(),
        checkpoint: checkpoint.to_string(),
        source,
    }
}

fn encode_value<T: serde::Serialize>(
    thread: &str,
    checkpoint: &str,
    value: &T,
) -> Result<Vec<u8>, CheckpointError> {
    encode(STORE_SCHEMA, value).map_err(|e| corrupt(thread, checkpoint, e))
}

impl SledSaver {
    /// Opens (creating if needed) the database in directory `path`.
    ///
    /// A process opens each database once: opening a path that is already open (by any
    /// spelling of it) returns the same instance, so every run of the process shares one
    /// sled database, its cache and its group commit. The database is closed (and flushed)
    /// when the last `Arc` is dropped.
    pub fn open(path: impl AsRef<Path>) -> Result<Arc<SledSaver>, CheckpointError> {
        let path = path.as_ref();
        std::fs::create_dir_all(path).map_err(|e| {
            CheckpointError::backend(format!("could not create {}", path.display()), e)
        })?;
        let canonical = std::fs::canonicalize(path).map_err(|e| {
            CheckpointError::backend(format!("could not resolve {}", path.display()), e)
        })?;
        let mut reg = registry().lock();
        if let Some(existing) = reg.get(&canonical).and_then(Weak::upgrade) {
            return Ok(existing);
        }
        reg.retain(|_, w| w.strong_count() > 0);
        let saver = Arc::new(Self::open_uncached(&canonical)?);
        reg.insert(canonical, Arc::downgrade(&saver));
        Ok(saver)
    }

    fn open_uncached(path: &Path) -> Result<SledSaver, CheckpointError> {
        let started = Instant::now();
        let mut conf_reset = false;
        let db = loop {
            // The previous instance of this path may still be closing on another thread:
            // wait for it briefly.
            match crate::open_sled(path, LOCK_WAIT) {
                Ok(db) => break db,
                // sled writes its `conf` file in two unsynchronized writes when it creates a
                // database; a process killed in between leaves a damaged `conf` and no `db`
                // file. Nothing was ever stored then, so the creation can start over.
                Err(sled::Error::Corruption { .. })
                    if !conf_reset
                        && std::fs::metadata(path.join("db")).map_or(true, |m| m.len() == 0) =>
                {
                    conf_reset = true;
                    tracing::warn!(
                        path = %path.display(),
                        "sled database creation was interrupted; creating it again"
                    );
                    std::fs::remove_file(path.join("conf")).map_err(|e| {
                        CheckpointError::backend(
                            format!("could not reset {}", path.join("conf").display()),
                            e,
                        )
                    })?;
                }
                Err(e) => {
                    return Err(backend(
                        format!("could not open the sled database at {}", path.display()),
                        e,
                    ))
                }
            }
        };
        let tree = |name: &str| {
            db.open_tree(name)
                .map_err(|e| backend(format!("could not open sled tree `{name}`"), e))
        };
        let saver = SledSaver {
            checkpoints: tree(CHECKPOINTS_TREE)?,
            writes: tree(WRITES_TREE)?,
            threads: tree(THREADS_TREE)?,
            path: path.to_path_buf(),
            db,
            written: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            flush_lock: tokio::sync::Mutex::new(()),
            counters: Counters::default(),
        };
        tracing::debug!(
            path = %path.display(),
            recovered = saver.db.was_recovered(),
            elapsed = ?started.elapsed(),
            "opened sled checkpoint store"
        );
        Ok(saver)
    }

    /// The database directory (canonical).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The underlying sled database, for tools and tests (for example to inspect or damage
    /// raw values). Writing to the ferrograph trees directly bypasses every check.
    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    /// What this instance wrote since it was opened.
    pub fn stats(&self) -> SledStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SledStats {
            checkpoints: l(&c.checkpoints),
            pending_writes: l(&c.pending_writes),
            thread_records: l(&c.thread_records),
            bytes_written: l(&c.bytes_written),
            payload_bytes: l(&c.payload_bytes),
            disk_flushes: l(&c.disk_flushes),
            grouped_flushes: l(&c.grouped_flushes),
            empty_flushes: l(&c.empty_flushes),
            flush_nanos: l(&c.flush_nanos),
        }
    }

    /// Bytes sled occupies on disk.
    pub fn size_on_disk(&self) -> Result<u64, CheckpointError> {
        self.db
            .size_on_disk()
            .map_err(|e| backend("could not read the database size", e))
    }

    /// The batch of pending writes for the step after `checkpoint_id`, keyed in the order
    /// written, and its size in bytes.
    fn writes_batch(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
        writes: &[PendingWrite],
    ) -> Result<(sled::Batch, usize), CheckpointError> {
        no_nul("thread", thread_id)?;
        no_nul("checkpoint", checkpoint_id)?;
        let prefix = writes_prefix(thread_id, checkpoint_id);
        let mut batch = sled::Batch::default();
        let mut bytes = 0usize;
        for w in writes {
            let seq = self
                .db
                .generate_id()
                .map_err(|e| backend("could not number a pending write", e))?;
            let mut key = prefix.clone();
            key.extend_from_slice(&seq.to_be_bytes());
            let value = encode_value(thread_id, checkpoint_id, w)?;
            bytes += key.len() + value.len();
            batch.insert(key, value);
        }
        Ok((batch, bytes))
    }

    fn count_writes(&self, n: usize, bytes: usize) {
        self.counters
            .pending_writes
            .fetch_add(n as u64, Ordering::Relaxed);
        self.counters
            .bytes_written
            .fetch_add(bytes as u64, Ordering::Relaxed);
        self.written.fetch_add(1, Ordering::AcqRel);
    }

    fn wrote(&self, key: &[u8], value: &[u8]) {
        self.counters
            .bytes_written
            .fetch_add((key.len() + value.len()) as u64, Ordering::Relaxed);
        self.written.fetch_add(1, Ordering::AcqRel);
    }

    fn decode_record(
        thread: &str,
        key: &[u8],
        bytes: &[u8],
    ) -> Result<CheckpointRecord, CheckpointError> {
        let checkpoint = || checkpoint_of_key(thread, key);
        let record: CheckpointRecord =
            decode(STORE_SCHEMA, bytes).map_err(|e| corrupt(thread, &checkpoint(), e))?;
        if record.thread_id != thread || record.checkpoint_id.as_bytes() != &key[thread.len() + 1..]
        {
            return Err(corrupt(
                thread,
                &checkpoint(),
                CodecError::Decode(format!(
                    "the record under this key is checkpoint `{}` of thread `{}`",
                    record.checkpoint_id, record.thread_id
                )),
            ));
        }
        Ok(record)
    }

    /// Every key of `tree` in `[start, end)`.
    fn keys_in(
        tree: &sled::Tree,
        start: &[u8],
        end: &[u8],
    ) -> Result<Vec<sled::IVec>, CheckpointError> {
        tree.range(start..end)
            .keys()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| backend("could not scan keys", e))
    }

    /// Removes the given keys (and optionally a thread record) in one transaction.
    fn remove_atomically(
        &self,
        checkpoint_keys: &[sled::IVec],
        write_keys: &[sled::IVec],
        thread_key: Option<&[u8]>,
    ) -> Result<(), CheckpointError> {
        let mut cps = sled::Batch::default();
        for k in checkpoint_keys {
            cps.remove(k.clone());
        }
        let mut ws = sled::Batch::default();
        for k in write_keys {
            ws.remove(k.clone());
        }
        let result: Result<(), TransactionError<()>> =
            (&self.checkpoints, &self.writes, &self.threads).transaction(|(c, w, t)| {
                if let Some(k) = thread_key {
                    t.remove(k)?;
                }
                c.apply_batch(&cps)?;
                w.apply_batch(&ws)?;
                Ok::<(), ConflictableTransactionError<()>>(())
            });
        result.map_err(|e| transaction_failed("delete", e))?;
        self.written.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

#[async_trait]
impl CheckpointSaver for SledSaver {
    async fn put(&self, record: CheckpointRecord) -> Result<(), CheckpointError> {
        no_nul("thread", &record.thread_id)?;
        no_nul("checkpoint", &record.checkpoint_id)?;
        let key = checkpoint_key(&record.thread_id, &record.checkpoint_id);
        let value = encode_value(&record.thread_id, &record.checkpoint_id, &record)?;
        self.checkpoints
            .insert(&key, value.as_slice())
            .map_err(|e| backend("could not store a checkpoint", e))?;
        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        self.counters
            .payload_bytes
            .fetch_add(record.payload.len() as u64, Ordering::Relaxed);
        self.wrote(&key, &value);
        Ok(())
    }

    async fn put_writes(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
        writes: Vec<PendingWrite>,
    ) -> Result<(), CheckpointError> {
        if writes.is_empty() {
            return Ok(());
        }
        let (batch, bytes) = self.writes_batch(thread_id, checkpoint_id, &writes)?;
        self.writes
            .apply_batch(batch)
            .map_err(|e| backend("could not store pending writes", e))?;
        self.count_writes(writes.len(), bytes);
        Ok(())
    }

    async fn put_writes_and_thread(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
        writes: Vec<PendingWrite>,
        info: ThreadInfo,
    ) -> Result<(), CheckpointError> {
        no_nul("thread", &info.thread_id)?;
        let (batch, bytes) = self.writes_batch(thread_id, checkpoint_id, &writes)?;
        let record = encode_value(&info.thread_id, THREAD_RECORD, &info)?;
        let key = info.thread_id.as_bytes();
        let result: Result<(), TransactionError<()>> =
            (&self.writes, &self.threads).transaction(|(w, t)| {
                w.apply_batch(&batch)?;
                t.insert(key, record.as_slice())?;
                Ok::<(), ConflictableTransactionError<()>>(())
            });
        result.map_err(|e| transaction_failed("store writes and thread record", e))?;
        self.count_writes(writes.len(), bytes);
        self.counters.thread_records.fetch_add(1, Ordering::Relaxed);
        self.wrote(key, &record);
        Ok(())
    }

    async fn get(
        &self,
        thread_id: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<Option<CheckpointRecord>, CheckpointError> {
        if has_nul(thread_id) || checkpoint_id.is_some_and(has_nul) {
            return Ok(None);
        }
        let found = match checkpoint_id {
            Some(c) => {
                let key = checkpoint_key(thread_id, c);
                self.checkpoints
                    .get(&key)
                    .map(|v| v.map(|v| (sled::IVec::from(key), v)))
            }
            None => self
                .checkpoints
                .range(thread_prefix(thread_id)..thread_end(thread_id))
                .next_back()
                .transpose(),
        }
        .map_err(|e| backend("could not read a checkpoint", e))?;
        match found {
            Some((key, value)) => Self::decode_record(thread_id, &key, &value).map(Some),
            None => Ok(None),
        }
    }

    async fn get_writes(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
    ) -> Result<Vec<PendingWrite>, CheckpointError> {
        if has_nul(thread_id) || has_nul(checkpoint_id) {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for item in self
            .writes
            .scan_prefix(writes_prefix(thread_id, checkpoint_id))
        {
            let (_, value) = item.map_err(|e| backend("could not read pending writes", e))?;
            let w: PendingWrite =
                decode(STORE_SCHEMA, &value).map_err(|e| corrupt(thread_id, checkpoint_id, e))?;
            out.push(w);
        }
        Ok(out)
    }

    async fn list(
        &self,
        thread_id: &str,
        before: Option<&str>,
        limit: Option<usize>,
    ) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        if has_nul(thread_id) {
            return Ok(Vec::new());
        }
        let start = thread_prefix(thread_id);
        let end = match before {
            Some(b) => checkpoint_key(thread_id, b),
            None => thread_end(thread_id),
        };
        if end <= start {
            return Ok(Vec::new());
        }
        let limit = limit.unwrap_or(usize::MAX);
        let mut out = Vec::new();
        for item in self.checkpoints.range(start..end).rev() {
            if out.len() >= limit {
                break;
            }
            let (key, value) = item.map_err(|e| backend("could not list checkpoints", e))?;
            out.push(Self::decode_record(thread_id, &key, &value)?);
        }
        Ok(out)
    }

    async fn put_thread(&self, info: ThreadInfo) -> Result<(), CheckpointError> {
        no_nul("thread", &info.thread_id)?;
        let value = encode_value(&info.thread_id, THREAD_RECORD, &info)?;
        self.threads
            .insert(info.thread_id.as_bytes(), value.as_slice())
            .map_err(|e| backend("could not store a thread record", e))?;
        self.counters.thread_records.fetch_add(1, Ordering::Relaxed);
        self.wrote(info.thread_id.as_bytes(), &value);
        Ok(())
    }

    async fn get_thread(&self, thread_id: &str) -> Result<Option<ThreadInfo>, CheckpointError> {
        if has_nul(thread_id) {
            return Ok(None);
        }
        let Some(value) = self
            .threads
            .get(thread_id.as_bytes())
            .map_err(|e| backend("could not read a thread record", e))?
        else {
            return Ok(None);
        };
        decode(STORE_SCHEMA, &value)
            .map(Some)
            .map_err(|e| corrupt(thread_id, THREAD_RECORD, e))
    }

    async fn list_threads(
        &self,
        status: Option<ThreadStatus>,
    ) -> Result<Vec<ThreadInfo>, CheckpointError> {
        let mut out = Vec::new();
        for item in self.threads.iter() {
            let (key, value) = item.map_err(|e| backend("could not list threads", e))?;
            let info: ThreadInfo = decode(STORE_SCHEMA, &value)
                .map_err(|e| corrupt(&String::from_utf8_lossy(&key), THREAD_RECORD, e))?;
            if status.is_none_or(|s| info.status == s) {
                out.push(info);
            }
        }
        // Keys are thread ids, so sled's order is the thread-id order MemorySaver returns.
        Ok(out)
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        if has_nul(thread_id) {
            return Ok(false);
        }
        let (start, end) = (thread_prefix(thread_id), thread_end(thread_id));
        let cps = Self::keys_in(&self.checkpoints, &start, &end)?;
        let ws = Self::keys_in(&self.writes, &start, &end)?;
        let existed = !cps.is_empty()
            || !ws.is_empty()
            || self
                .threads
                .contains_key(thread_id.as_bytes())
                .map_err(|e| backend("could not read a thread record", e))?;
        if existed {
            self.remove_atomically(&cps, &ws, Some(thread_id.as_bytes()))?;
            tracing::debug!(
                thread = thread_id,
                checkpoints = cps.len(),
                writes = ws.len(),
                "deleted thread"
            );
        }
        Ok(existed)
    }

    async fn delete_before(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
    ) -> Result<usize, CheckpointError> {
        if has_nul(thread_id) || has_nul(checkpoint_id) {
            return Ok(0);
        }
        let start = thread_prefix(thread_id);
        let end = checkpoint_key(thread_id, checkpoint_id);
        let cps = Self::keys_in(&self.checkpoints, &start, &end)?;
        if cps.is_empty() {
            return Ok(0);
        }
        // Writes of the removed checkpoints: their keys extend the checkpoint keys, and
        // `thread\0cp\0..` sorts before `thread\0cp_kept` exactly when `cp < cp_kept` (ids
        // contain no NUL), so they are the write keys in the same range.
        let ws = Self::keys_in(&self.writes, &start, &end)?;
        self.remove_atomically(&cps, &ws, None)?;
        tracing::debug!(
            thread = thread_id,
            checkpoints = cps.len(),
            writes = ws.len(),
            "deleted old checkpoints"
        );
        Ok(cps.len())
    }

    async fn flush(&self) -> Result<(), CheckpointError> {
        let target = self.written.load(Ordering::Acquire);
        if self.durable.load(Ordering::Acquire) >= target {
            self.counters.empty_flushes.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let _guard = self.flush_lock.lock().await;
        if self.durable.load(Ordering::Acquire) >= target {
            // A flush that started after our writes finished while we waited.
            self.counters
                .grouped_flushes
                .fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let upto = self.written.load(Ordering::Acquire);
        let started = Instant::now();
        flush_db(&self.db)
            .await
            .map_err(|e| backend("could not flush the sled database", e))?;
        self.counters
            .flush_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.counters.disk_flushes.fetch_add(1, Ordering::Relaxed);
        self.durable.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }
}

/// Flushes `db`. On a multi-threaded tokio runtime the flush runs right here, with the worker
/// handed over to another thread meanwhile (`block_in_place`): the caller waits for the disk
/// and nothing else. sled's own `flush_async` would instead wake a thread of sled's pool and
/// be woken back, two thread switches on the path of every step in sync mode (about a fifth
/// of a step's cost on a 2-core machine). Elsewhere (a current-thread runtime, no runtime) it
/// falls back to `flush_async`.
async fn flush_db(db: &sled::Db) -> sled::Result<usize> {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi_thread {
        tokio::task::block_in_place(|| db.flush())
    } else {
        db.flush_async().await
    }
}

impl Drop for SledSaver {
    fn drop(&mut self) {
        // sled flushes when its last handle goes; say so when that fails.
        if let Err(e) = self.db.flush() {
            tracing::error!(path = %self.path.display(), error = %e, "could not flush the sled database on close");
        }
    }
}
