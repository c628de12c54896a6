//! Helpers shared by the saver's integration tests.
#![allow(dead_code, clippy::unwrap_used)] // each test binary uses some of them

use ferrograph_core::checkpoint::{CheckpointRecord, CheckpointSource};
use std::path::Path;

/// Checkpoint `step` of `thread`, a full one of 150 bytes, child of the checkpoint of the
/// step before.
pub fn record(thread: &str, step: u64) -> CheckpointRecord {
    CheckpointRecord {
        thread_id: thread.into(),
        checkpoint_id: format!("{:016x}{:08x}", 1_000 + step, 0),
        parent_id: (step > 0).then(|| format!("{:016x}{:08x}", 1_000 + step - 1, 0)),
        step,
        source: CheckpointSource::Loop,
        created_at_ms: 1_000 + step,
        writers: vec!["node".into()],
        next: vec![],
        full: true,
        payload: vec![step as u8; 150],
    }
}

/// Copies the folder `from` (a store) to `to`, recursively.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}
