//! Salvage: reading what is still readable out of a store that sled no longer opens, into a
//! new store, and naming what could not be saved.
//!
//! sled refuses to open a database whose log or snapshot is damaged. Its log is written in
//! order, and when sled has no snapshot it rebuilds its page table by scanning the log from
//! the start, stopping at the first message that fails its checksum. So [`salvage`] works on a
//! copy of the store (the damaged one is never written): it opens the copy as it is, or, when
//! that fails, with the snapshot files removed, which gives every write that the log holds
//! before the first damaged byte. Every record read from it is checked again (our own seal:
//! magic, format, schema, CRC-32) and only records that pass go into the new store; pending
//! writes whose checkpoint was not saved are dropped with them.
//!
//! To name what was lost, the damaged store's files are also read raw: every sealed thread
//! record and checkpoint in them (self-delimiting and CRC-checked, so found by their magic
//! bytes wherever they lie) is compared with what was saved. A thread seen there but not
//! saved, or a checkpoint newer than the newest one saved for its thread, is reported. These
//! raw finds can include threads deleted before the damage (sled does not erase old log
//! entries at once), so the report says "seen", not "lost for certain".

use crate::maintenance::{
    decode_record, printable, write_store, CopySummary, MaintenanceError, Record,
};
use crate::sled::{STORE_SCHEMA, WRITES_TREE};
use ferrograph_core::checkpoint::{
    decode, CheckpointRecord, ThreadInfo, HEADER_LEN as HEADER, MAGIC,
};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

/// What [`salvage`] saved, and what it saw that it could not save.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SalvageReport {
    /// Why the store did not open as it was (`None`: it opened, and only records that fail
    /// their checks were left out).
    pub open_error: Option<String>,
    /// Whether the copy was opened without its snapshot (sled rebuilt its state from the log,
    /// up to the first damaged message).
    pub snapshot_dropped: bool,
    /// What was written into the new store.
    pub copied: CopySummary,
    /// Records left out because they fail their checks (`tree: key`).
    pub damaged: Vec<String>,
    /// Trees whose reading stopped early (`tree: error`).
    pub unreadable: Vec<String>,
    /// Pending writes left out because their checkpoint was not saved.
    pub dangling_writes: u64,
    /// Every thread of the new store.
    pub threads: Vec<SalvagedThread>,
    /// Threads seen in the damaged files whose record was not saved.
    pub lost_threads: Vec<LostThread>,
    /// Sealed records found in the damaged files that fail their checksum or are cut short:
    /// each may have been the only copy of a thread record or checkpoint, which can then be
    /// neither saved nor named.
    pub damaged_seen: u64,
}

impl SalvageReport {
    /// Whether anything seen in the damaged store is missing from the new one.
    pub fn lost_anything(&self) -> bool {
        !self.damaged.is_empty()
            || self.damaged_seen > 0
            || !self.unreadable.is_empty()
            || self.dangling_writes > 0
            || !self.lost_threads.is_empty()
            || self
                .threads
                .iter()
                .any(|t| t.newer_checkpoints_seen > 0 || t.record_names_missing.is_some())
    }
}

/// A thread as saved.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SalvagedThread {
    /// Thread id.
    pub thread_id: String,
    /// Its status as recorded (`none` when only checkpoints were saved).
    pub status: String,
    /// Checkpoints saved.
    pub checkpoints: u64,
    /// The newest checkpoint saved, and its step.
    pub newest: Option<(String, u64)>,
    /// The checkpoint the saved record names when that one was not saved (the thread is back
    /// at `newest`).
    pub record_names_missing: Option<String>,
    /// Checkpoints of this thread seen in the damaged files that are newer than `newest`.
    pub newer_checkpoints_seen: u64,
}

/// A thread seen in the damaged files whose record was not saved.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LostThread {
    /// Thread id.
    pub thread_id: String,
    /// Its graph, when a record of it was seen.
    pub graph: Option<String>,
    /// The status of the newest record seen.
    pub status: Option<String>,
    /// Checkpoints of it seen.
    pub checkpoints_seen: u64,
    /// The newest time seen on it (record update or checkpoint), ms since the epoch.
    pub last_seen_ms: u64,
}

/// A key and its value.
type Entry = (Vec<u8>, Vec<u8>);

/// The most bytes one raw record may span when the damaged files are read in chunks.
const MAX_CARVED_RECORD: usize = 64 << 20;

/// Chunk size for reading the damaged files.
const CHUNK: usize = 16 << 20;

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> MaintenanceError + '_ {
    move |source| MaintenanceError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Runs `f`, turning a panic inside sled (it has some on damaged data) into an error.
fn guarded<T>(f: impl FnOnce() -> Result<T, sled::Error>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(panic) => Err(format!(
            "sled panicked: {}",
            panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)")
        )),
    }
}

/// Copies the regular files of `from` (and its subfolders) into `to`.
fn copy_tree(from: &Path, to: &Path) -> Result<(), MaintenanceError> {
    let mut files = Vec::new();
    list_files(from, &mut files)?;
    for file in files {
        let target = to.join(file.strip_prefix(from).unwrap_or(&file));
        if let Some(dir) = target.parent() {
            std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        std::fs::copy(&file, &target).map_err(io_err(&target))?;
    }
    Ok(())
}

/// Salvages the store at `damaged` into a new store at `into` (a folder that does not exist or
/// is empty). `damaged` is only read. See the module documentation for how.
pub fn salvage(damaged: &Path, into: &Path) -> Result<SalvageReport, MaintenanceError> {
    crate::maintenance::ensure_new_target(into)?;
    if !damaged.is_dir() {
        return Err(MaintenanceError::Io {
            path: damaged.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no store here"),
        });
    }
    // sled holds an exclusive lock on its log file while the store is open; hold it too, so
    // nothing opens the store (or writes it) while it is copied.
    let log = damaged.join("db");
    let _lock = match std::fs::File::open(&log) {
        Ok(file) => match file.try_lock() {
            Ok(()) => Some(file),
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(MaintenanceError::InUse(damaged.to_path_buf()))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io_err(&log)(e)),
        },
        // No log file: the open below says what is wrong.
        Err(_) => None,
    };
    let parent = into
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io_err(parent))?;
    let scratch = tempfile::Builder::new()
        .prefix(".salvage-")
        .tempdir_in(parent)
        .map_err(io_err(parent))?;
    let copy = scratch.path().join("store");
    copy_tree(damaged, &copy)?;

    let mut report = SalvageReport::default();
    let db = match guarded(|| sled::Config::new().path(&copy).open()) {
        Ok(db) => db,
        Err(first) => {
            report.open_error = Some(first.clone());
            report.snapshot_dropped = true;
            for entry in std::fs::read_dir(&copy).map_err(io_err(&copy))? {
                let entry = entry.map_err(io_err(&copy))?;
                if entry.file_name().to_string_lossy().starts_with("snap.") {
                    std::fs::remove_file(entry.path()).map_err(io_err(&entry.path()))?;
                }
            }
            guarded(|| sled::Config::new().path(&copy).open()).map_err(|second| {
                MaintenanceError::Unsalvageable {
                    path: damaged.to_path_buf(),
                    reason: format!(
                        "{first}; without its snapshot: {second}. Nothing in it can be read; restore a backup (`ferrograph store restore`)"
                    ),
                }
            })?
        }
    };

    // Read every tree, keeping the records that pass their checks.
    let mut kept: Vec<(Vec<u8>, Vec<Entry>)> = Vec::new();
    let mut threads: BTreeMap<String, ThreadInfo> = BTreeMap::new();
    let mut checkpoints: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let mut writes: Vec<Entry> = Vec::new();
    let names = guarded(|| Ok(db.tree_names())).unwrap_or_default();
    for name in names {
        let label = String::from_utf8_lossy(&name).into_owned();
        let tree = match guarded(|| db.open_tree(&name)) {
            Ok(t) => t,
            Err(e) => {
                report.unreadable.push(format!("{label}: {e}"));
                continue;
            }
        };
        let entries = match guarded(|| {
            let mut out = Vec::new();
            let mut failed = None;
            for item in tree.iter() {
                match item {
                    Ok((k, v)) => out.push((k.to_vec(), v.to_vec())),
                    Err(e) => {
                        failed = Some(e.to_string());
                        break;
                    }
                }
            }
            Ok((out, failed))
        }) {
            Ok((out, failed)) => {
                if let Some(e) = failed {
                    report
                        .unreadable
                        .push(format!("{label}: stopped after {} records: {e}", out.len()));
                }
                out
            }
            Err(e) => {
                report.unreadable.push(format!("{label}: {e}"));
                continue;
            }
        };
        let mut good = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            match decode_record(&name, &v) {
                Ok(Record::Thread(info)) => {
                    threads.insert(info.thread_id.clone(), info);
                    good.push((k, v));
                }
                Ok(Record::Checkpoint(c)) => {
                    checkpoints
                        .entry(c.thread_id)
                        .or_default()
                        .insert(c.checkpoint_id, c.step);
                    good.push((k, v));
                }
                // Kept below, once it is known whether their checkpoint was saved.
                Ok(Record::Write) => writes.push((k, v)),
                Ok(Record::Other) => good.push((k, v)),
                Err(_) => report.damaged.push(format!("{label}: {}", printable(&k))),
            }
        }
        kept.push((name.to_vec(), good));
    }
    // Pending writes only with their checkpoint.
    let mut good_writes = Vec::new();
    for (k, v) in writes {
        // Key: thread \0 checkpoint \0 seq.
        let mut parts = k.splitn(3, |b| *b == 0);
        let thread = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
        let checkpoint = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
        if checkpoints
            .get(&thread)
            .is_some_and(|c| c.contains_key(&checkpoint))
        {
            good_writes.push((k, v));
        } else {
            report.dangling_writes += 1;
        }
    }
    if let Some(slot) = kept
        .iter_mut()
        .find(|(n, _)| n.as_slice() == WRITES_TREE.as_bytes())
    {
        slot.1 = good_writes;
    }
    drop(db);

    report.copied = write_store(into, kept.iter().map(|(n, e)| (n.as_slice(), e.as_slice())))?;

    // What the damaged files show that was not saved.
    let seen = carve(damaged)?;
    let mut ids: BTreeSet<&String> = threads.keys().collect();
    ids.extend(checkpoints.keys());
    for id in ids {
        let saved = checkpoints.get(id);
        let newest = saved.and_then(|c| c.iter().next_back().map(|(k, s)| (k.clone(), *s)));
        let record_names_missing = threads
            .get(id)
            .and_then(|t| t.last_checkpoint_id.clone())
            .filter(|c| !saved.is_some_and(|s| s.contains_key(c)));
        let newer_checkpoints_seen = seen.checkpoints.get(id).map_or(0, |ids| {
            ids.keys()
                .filter(|c| newest.as_ref().is_none_or(|(n, _)| c.as_str() > n.as_str()))
                .count() as u64
        });
        report.threads.push(SalvagedThread {
            thread_id: id.clone(),
            status: threads
                .get(id)
                .map_or("none".to_string(), |t| t.status.as_str().to_string()),
            checkpoints: saved.map_or(0, |c| c.len() as u64),
            newest,
            record_names_missing,
            newer_checkpoints_seen,
        });
    }
    report.damaged_seen = seen.damaged;
    let mut lost: BTreeSet<&String> = seen.threads.keys().collect();
    lost.extend(seen.checkpoints.keys());
    for id in lost {
        if threads.contains_key(id) {
            continue;
        }
        let record = seen.threads.get(id);
        let cps = seen.checkpoints.get(id);
        report.lost_threads.push(LostThread {
            thread_id: id.clone(),
            graph: record.map(|r| r.graph.clone()),
            status: record.map(|r| r.status.as_str().to_string()),
            checkpoints_seen: cps.map_or(0, |c| c.len() as u64),
            last_seen_ms: record
                .map(|r| r.updated_at_ms)
                .into_iter()
                .chain(cps.into_iter().flat_map(|c| c.values().copied()))
                .max()
                .unwrap_or(0),
        });
    }
    Ok(report)
}

/// Sealed records found by their magic bytes in a store's files.
#[derive(Default)]
struct Carved {
    /// The newest thread record seen per thread.
    threads: BTreeMap<String, ThreadInfo>,
    /// Checkpoint ids seen per thread, with their creation time.
    checkpoints: BTreeMap<String, BTreeMap<String, u64>>,
    /// Sealed records that fail their checksum or are cut short.
    damaged: u64,
}

impl Carved {
    /// Tries the bytes at a magic: a checkpoint or a thread record. Returns the bytes the
    /// record spans, or `None` when they are not a whole valid record (or one still cut
    /// by the end of `bytes`: `Some(0)` asks for more).
    fn take(&mut self, bytes: &[u8], at_end: bool) -> Option<usize> {
        match ferrograph_core::checkpoint::open(bytes) {
            Ok((_, body)) => {
                let len = bytes.len().min(HEADER + body.len());
                if let Ok(c) = decode::<CheckpointRecord>(STORE_SCHEMA, &bytes[..len]) {
                    self.checkpoints
                        .entry(c.thread_id)
                        .or_default()
                        .insert(c.checkpoint_id, c.created_at_ms);
                } else if let Ok(t) = decode::<ThreadInfo>(STORE_SCHEMA, &bytes[..len]) {
                    let newer = self
                        .threads
                        .get(&t.thread_id)
                        .is_none_or(|old| old.updated_at_ms <= t.updated_at_ms);
                    if newer {
                        self.threads.insert(t.thread_id.clone(), t);
                    }
                }
                Some(len)
            }
            Err(ferrograph_core::checkpoint::CodecError::Truncated { expected, .. })
                if !at_end && expected <= MAX_CARVED_RECORD =>
            {
                Some(0)
            }
            Err(
                ferrograph_core::checkpoint::CodecError::Checksum { .. }
                | ferrograph_core::checkpoint::CodecError::Truncated { .. },
            ) => {
                self.damaged += 1;
                None
            }
            Err(_) => None,
        }
    }
}

/// Reads every regular file under `dir` raw and collects the sealed records in them.
fn carve(dir: &Path) -> Result<Carved, MaintenanceError> {
    let mut out = Carved::default();
    let mut files = Vec::new();
    list_files(dir, &mut files)?;
    for file in files {
        let mut f = std::fs::File::open(&file).map_err(io_err(&file))?;
        let mut buf: Vec<u8> = Vec::new();
        let mut at_end = false;
        while !at_end {
            let mut chunk = Vec::with_capacity(CHUNK);
            (&mut f)
                .take(CHUNK as u64)
                .read_to_end(&mut chunk)
                .map_err(io_err(&file))?;
            at_end = chunk.len() < CHUNK;
            buf.extend_from_slice(&chunk);
            let mut pos = 0;
            let mut carry_from = None;
            while let Some(i) = find_magic(&buf[pos..]) {
                let start = pos + i;
                match out.take(&buf[start..], at_end) {
                    Some(0) => {
                        carry_from = Some(start);
                        break;
                    }
                    Some(n) => pos = start + n.max(1),
                    None => pos = start + 1,
                }
            }
            // Keep the tail that may hold the start of a record cut by the chunk's end.
            let keep_from = carry_from.unwrap_or_else(|| buf.len().saturating_sub(HEADER));
            buf.drain(..keep_from.min(buf.len()));
        }
    }
    Ok(out)
}

fn find_magic(bytes: &[u8]) -> Option<usize> {
    bytes.windows(MAGIC.len()).position(|w| w == MAGIC)
}

fn list_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), MaintenanceError> {
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let kind = entry.file_type().map_err(io_err(&entry.path()))?;
        if kind.is_dir() {
            list_files(&entry.path(), out)?;
        } else if kind.is_file() {
            out.push(entry.path());
        }
    }
    Ok(())
}
