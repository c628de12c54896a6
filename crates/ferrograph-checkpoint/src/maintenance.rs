//! Keeping a checkpoint store recoverable: verify every record, back it up to one file, and
//! restore a backup into a new store.
//!
//! sled refuses to open a database whose log is damaged (good: nothing is silently reset), so
//! the way back from a damaged disk is a backup. [`backup`] copies every tree of an open store
//! into one sealed file (magic bytes, format version, CRC-32 over the whole content; written to
//! a temporary file, synced and renamed, so a crash never leaves half a backup under the
//! name). It can run while the store is in use: the thread records are copied first, then the
//! checkpoints and pending writes, which are only ever appended before the record that names
//! them, so every record in a backup finds its checkpoint. [`restore`] writes a backup into a
//! new, empty store directory. [`verify`] opens every record of every tree and names the ones
//! that do not read back.

use ferrograph_core::checkpoint::{
    decode, encode, CheckpointRecord, CodecError, PendingWrite, ThreadInfo,
};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::sled::{CHECKPOINTS_TREE, THREADS_TREE, WRITES_TREE};

/// Format version of backup files.
pub const BACKUP_SCHEMA: u32 = 1;

/// Why a backup, restore or verification failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MaintenanceError {
    /// The store could not be read or written.
    #[error("store {path}: {source}")]
    Store {
        /// The store's directory.
        path: PathBuf,
        /// sled's error.
        #[source]
        source: sled::Error,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// A backup file is damaged or not a backup.
    #[error("{path} is not a readable ferrograph backup: {source}")]
    BadBackup {
        /// The file.
        path: PathBuf,
        /// What did not check out.
        #[source]
        source: CodecError,
    },
    /// Another process (or handle) has the store open.
    #[error("store {0} is in use (a server or another command has it open); stop it first")]
    InUse(PathBuf),
    /// Nothing of a damaged store can be read, even without its snapshot.
    #[error("store {path} cannot be salvaged: {reason}")]
    Unsalvageable {
        /// The store's directory.
        path: PathBuf,
        /// What sled said, with and without the snapshot.
        reason: String,
    },
    /// A restore's target already holds a store.
    #[error("{0} already exists and is not empty: restore into a new folder (move the old one aside first)")]
    TargetExists(PathBuf),
}

/// What one tree of a store holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TreeReport {
    /// Tree name.
    pub name: String,
    /// Records read.
    pub records: u64,
    /// Keys (printable) of records that do not read back.
    pub damaged: Vec<String>,
}

/// The result of [`verify`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// One entry per tree.
    pub trees: Vec<TreeReport>,
}

impl VerifyReport {
    /// Whether every record read back.
    pub fn is_clean(&self) -> bool {
        self.trees.iter().all(|t| t.damaged.is_empty())
    }

    /// Records read, over every tree.
    pub fn records(&self) -> u64 {
        self.trees.iter().map(|t| t.records).sum()
    }
}

/// What [`backup`] or [`restore`] copied.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CopySummary {
    /// Trees copied.
    pub trees: usize,
    /// Records copied.
    pub records: u64,
    /// Bytes of the backup file.
    pub bytes: u64,
}

#[derive(Serialize, Deserialize)]
struct BackupTree {
    name: Vec<u8>,
    entries: Vec<(Vec<u8>, Vec<u8>)>,
}

pub(crate) fn printable(key: &[u8]) -> String {
    String::from_utf8_lossy(key).replace('\0', "/")
}

fn store_err(path: &Path) -> impl Fn(sled::Error) -> MaintenanceError + '_ {
    move |source| MaintenanceError::Store {
        path: path.to_path_buf(),
        source,
    }
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> MaintenanceError + '_ {
    move |source| MaintenanceError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A record of the store, decoded by the tree it is in.
pub(crate) enum Record {
    /// A thread record.
    Thread(ThreadInfo),
    /// A checkpoint.
    Checkpoint(CheckpointRecord),
    /// A pending write.
    Write,
    /// A value of another tree (sled's own, internal ones): holds no sealed value.
    Other,
}

/// Decodes a value of the tree called `tree`, checking its seal.
pub(crate) fn decode_record(tree: &[u8], value: &[u8]) -> Result<Record, CodecError> {
    let schema = crate::sled::STORE_SCHEMA;
    Ok(match tree {
        t if t == THREADS_TREE.as_bytes() => Record::Thread(decode(schema, value)?),
        t if t == CHECKPOINTS_TREE.as_bytes() => Record::Checkpoint(decode(schema, value)?),
        t if t == WRITES_TREE.as_bytes() => {
            decode::<PendingWrite>(schema, value)?;
            Record::Write
        }
        _ => Record::Other,
    })
}

/// Writes `trees` (name, key-value pairs) into a new store at `into`, flushed before it
/// returns; counts the trees and records written.
pub(crate) fn write_store<'a>(
    into: &Path,
    trees: impl IntoIterator<Item = (&'a [u8], &'a [(Vec<u8>, Vec<u8>)])>,
) -> Result<CopySummary, MaintenanceError> {
    let db = sled::open(into).map_err(store_err(into))?;
    let mut summary = CopySummary::default();
    for (name, entries) in trees {
        let tree = db.open_tree(name).map_err(store_err(into))?;
        for (k, v) in entries {
            tree.insert(k.as_slice(), v.as_slice())
                .map_err(store_err(into))?;
            summary.records += 1;
        }
        summary.trees += 1;
    }
    db.flush().map_err(store_err(into))?;
    Ok(summary)
}

/// Reads every record of every tree of `db` (the store at `path`) and names those that do not
/// decode (checksum, length, format).
pub fn verify(db: &sled::Db, path: &Path) -> Result<VerifyReport, MaintenanceError> {
    let mut report = VerifyReport::default();
    for name in db.tree_names() {
        let tree = db.open_tree(&name).map_err(store_err(path))?;
        let mut t = TreeReport {
            name: printable(&name),
            ..TreeReport::default()
        };
        for item in tree.iter() {
            let (key, value) = match item {
                Ok(kv) => kv,
                Err(e) => {
                    t.damaged.push(format!("(unreadable: {e})"));
                    break;
                }
            };
            t.records += 1;
            let ok = decode_record(&name, &value).is_ok();
            if !ok {
                t.damaged.push(printable(&key));
            }
        }
        report.trees.push(t);
    }
    Ok(report)
}

/// Copies every tree of `db` (the store at `path`) into the backup file `out`, replacing it
/// atomically. Flushes the store first.
pub fn backup(db: &sled::Db, path: &Path, out: &Path) -> Result<CopySummary, MaintenanceError> {
    db.flush().map_err(store_err(path))?;
    let mut names = db.tree_names();
    // Thread records first: a record copied before its checkpoint could name one the backup
    // lacks; checkpoints are written before the record that names them.
    let rank = |n: &sled::IVec| match n.as_ref() {
        x if x == THREADS_TREE.as_bytes() => 0,
        x if x == CHECKPOINTS_TREE.as_bytes() => 1,
        x if x == WRITES_TREE.as_bytes() => 2,
        _ => 3,
    };
    names.sort_by_key(rank);
    let mut trees = Vec::with_capacity(names.len());
    let mut records = 0u64;
    for name in names {
        let tree = db.open_tree(&name).map_err(store_err(path))?;
        let mut entries = Vec::new();
        for item in tree.iter() {
            let (k, v) = item.map_err(store_err(path))?;
            entries.push((k.to_vec(), v.to_vec()));
        }
        records += entries.len() as u64;
        trees.push(BackupTree {
            name: name.to_vec(),
            entries,
        });
    }
    let bytes = encode(BACKUP_SCHEMA, &trees).map_err(|source| MaintenanceError::BadBackup {
        path: out.to_path_buf(),
        source,
    })?;
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io_err(dir))?;
    tmp.write_all(&bytes).map_err(io_err(out))?;
    tmp.as_file().sync_all().map_err(io_err(out))?;
    tmp.persist(out).map_err(|e| MaintenanceError::Io {
        path: out.to_path_buf(),
        source: e.error,
    })?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(CopySummary {
        trees: trees.len(),
        records,
        bytes: bytes.len() as u64,
    })
}

/// Refuses a target folder for a new store that exists and is not empty.
pub(crate) fn ensure_new_target(into: &Path) -> Result<(), MaintenanceError> {
    let used = into.exists()
        && std::fs::read_dir(into)
            .map_err(io_err(into))?
            .next()
            .is_some();
    if used {
        return Err(MaintenanceError::TargetExists(into.to_path_buf()));
    }
    Ok(())
}

/// Writes the backup file `file` into a new store at `into` (a folder that does not exist or
/// is empty), flushed before it returns.
pub fn restore(file: &Path, into: &Path) -> Result<CopySummary, MaintenanceError> {
    ensure_new_target(into)?;
    let bytes = std::fs::read(file).map_err(io_err(file))?;
    let trees: Vec<BackupTree> =
        decode(BACKUP_SCHEMA, &bytes).map_err(|source| MaintenanceError::BadBackup {
            path: file.to_path_buf(),
            source,
        })?;
    let written = write_store(
        into,
        trees
            .iter()
            .map(|t| (t.name.as_slice(), t.entries.as_slice())),
    )?;
    Ok(CopySummary {
        bytes: bytes.len() as u64,
        ..written
    })
}
