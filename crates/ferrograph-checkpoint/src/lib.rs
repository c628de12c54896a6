//! Checkpoint savers for ferrograph: [`MemorySaver`] for tests and short-lived processes.
//! The trait and the record encoding live in `ferrograph_core::checkpoint`.

mod memory;

pub use memory::MemorySaver;
