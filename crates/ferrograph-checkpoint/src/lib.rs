//! Checkpoint savers for ferrograph: [`MemorySaver`] for tests and short-lived processes, and
//! [`SledSaver`], durable on disk; [`EncryptedSaver`] encrypts what either stores. The trait and the record encoding live in
//! `ferrograph_core::checkpoint`.

pub mod encrypted;
pub mod maintenance;
mod memory;
mod open;
pub mod salvage;
mod sled;

pub use self::sled::{
    checkpoint_key, SledSaver, SledStats, CHECKPOINTS_TREE, THREADS_TREE, THREAD_RECORD,
    WRITES_TREE,
};
pub use encrypted::{CheckpointKey, EncryptedSaver, KeyError};
pub use memory::MemorySaver;
pub use open::{is_lock_error, open_sled};
