//! Shared fixtures for ferrograph's end-to-end and semantics tests.

use ferrograph::prelude::*;
use serde::{Deserialize, Serialize};

/// A state exercising every merge rule.
#[derive(State, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Doc {
    /// Chat messages (messages rule).
    #[reducer(messages)]
    pub messages: Vec<Message>,
    /// Visit log (append rule).
    #[reducer(append)]
    pub log: Vec<String>,
    /// Counter (add rule).
    #[reducer(add)]
    pub count: i64,
    /// Largest value seen (custom rule).
    #[reducer(with = keep_max)]
    pub max: i64,
    /// A single value (overwrite, the default).
    pub status: String,
    /// Fan-out item (overwrite).
    pub item: i64,
    /// Answers from people (append).
    #[reducer(append)]
    pub answers: Vec<String>,
}

/// Custom rule: keeps the maximum.
pub fn keep_max(current: &mut i64, update: i64) {
    *current = (*current).max(update);
}

/// An update that appends one log entry.
pub fn log(entry: &str) -> DocUpdate {
    DocUpdate::new().log(vec![entry.to_string()])
}
