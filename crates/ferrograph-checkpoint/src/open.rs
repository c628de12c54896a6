//! Opening a sled database whose previous handle is still closing.
//!
//! sled releases its exclusive file lock only when the last of its internal references is
//! gone, and some live in its thread pool and epoch-deferred garbage for a moment after the
//! last `Db` handle is dropped: opening the same folder right after a drop can find the lock
//! still held. [`open_sled`] waits for that, with a bound, so that another process holding the
//! database still gets an error (recognised by [`is_lock_error`]).

use std::path::Path;
use std::time::{Duration, Instant};

/// Whether `e` is sled's "could not acquire lock" (another handle holds the database).
pub fn is_lock_error(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

/// Opens the sled database at `path`, retrying for up to `wait` while its lock is held; any
/// other error, or the lock error after `wait`, is returned as sled gave it.
pub fn open_sled(path: &Path, wait: Duration) -> Result<sled::Db, sled::Error> {
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(2);
    loop {
        match sled::Config::new().path(path).open() {
            Err(e) if is_lock_error(&e) && Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}
