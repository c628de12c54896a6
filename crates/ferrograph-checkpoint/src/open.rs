//! Opening a sled database: waiting for a previous handle that is still closing, and
//! recovering from a process killed while sled wrote its snapshot.
//!
//! sled releases its exclusive file lock only when the last of its internal references is
//! gone, and some live in its thread pool and epoch-deferred garbage for a moment after the
//! last `Db` handle is dropped: opening the same folder right after a drop can find the lock
//! still held. [`open_sled`] waits for that, with a bound, so that another process holding the
//! database still gets an error (recognised by [`is_lock_error`]).
//!
//! Every open of a sled 0.34 database that finds new log entries writes a snapshot of its page
//! table to `snap.<lsn>.generating`, syncs it and renames it to `snap.<lsn>`. A process killed
//! before the rename leaves the `.generating` file behind, often cut short, and sled's next
//! open reads the newest `snap.` file of any suffix: it finds the cut one and fails with
//! "Read corrupted data at file offset None" (sled issue #1527). Our crash tests met it: a
//! worker killed while it opened its store left a store that no process could open. The
//! snapshot only speeds up recovery (the log holds everything, and sled writes the snapshot
//! before it changes anything else), so [`open_sled`] removes such leftovers, holding the
//! store's lock, and opens again from the last complete snapshot and the log.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// sled's page cache for the checkpoint store: 128 MiB (sled's own default is 1 GiB, which a
/// long-lived server filled with threads it had written and would not read again).
pub const SLED_CACHE_BYTES: u64 = 128 << 20;

/// Whether `e` is sled's "could not acquire lock" (another handle holds the database).
pub fn is_lock_error(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

/// Opens the sled database at `path`, retrying for up to `wait` while its lock is held. If the
/// open fails as damaged and an interrupted snapshot (`snap.*.generating`) is present, that
/// snapshot is removed and the open tried once more. Any other error, or the lock error after
/// `wait`, is returned as sled gave it.
pub fn open_sled(path: &Path, wait: Duration) -> Result<sled::Db, sled::Error> {
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(2);
    let mut dropped_snapshots = false;
    loop {
        match sled::Config::new()
            .path(path)
            .cache_capacity(SLED_CACHE_BYTES)
            .open()
        {
            Err(e) if is_lock_error(&e) && Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e @ sled::Error::Corruption { .. }) if !dropped_snapshots => {
                dropped_snapshots = true;
                let removed = remove_interrupted_snapshots(path)?;
                if removed.is_empty() {
                    return Err(e);
                }
                tracing::warn!(
                    path = %path.display(),
                    removed = ?removed,
                    "sled's snapshot was being written when its process died; opening again from the \
                     previous snapshot and the log"
                );
            }
            other => return other,
        }
    }
}

/// Removes the `snap.*.generating` files in `path`, holding the lock of the store's log file
/// so that no process opening the store meanwhile loses the snapshot it is writing. Returns
/// the files removed; none when there are none or another process holds the store.
fn remove_interrupted_snapshots(path: &Path) -> Result<Vec<PathBuf>, sled::Error> {
    let interrupted: Vec<PathBuf> = std::fs::read_dir(path)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("snap.") && n.ends_with(".generating"))
        })
        .collect();
    if interrupted.is_empty() {
        return Ok(interrupted);
    }
    let log = std::fs::File::open(path.join("db"))?;
    match log.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(Vec::new()),
        Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
    }
    for file in &interrupted {
        std::fs::remove_file(file)?;
    }
    // The lock is released when `log` is closed, before sled opens the store again.
    drop(log);
    Ok(interrupted)
}
