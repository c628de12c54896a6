//! Human-in-the-loop interrupts and the values that resume them.

use crate::json::Json;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A pending interrupt: a node asked for outside input and the run stopped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Interrupt {
    /// Stable id; a resume value is addressed to it.
    pub id: String,
    /// The node that interrupted (for subgraphs, `parent_node/child_node`).
    pub node: String,
    /// The interrupted task.
    pub task_id: String,
    /// What the node showed (for example a diff summary or a question).
    pub value: Json,
    /// True for static interrupts configured before or after a node; they resume with no value.
    #[serde(default)]
    pub static_: bool,
}

/// Resume values given to an interrupted run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Resume {
    /// One value, for a run with exactly one pending interrupt.
    Value(Json),
    /// Values addressed by interrupt id, for runs with several pending interrupts (for example
    /// from parallel branches).
    ById(BTreeMap<String, Json>),
}

impl Resume {
    /// A single resume value.
    pub fn value(v: serde_json::Value) -> Self {
        Resume::Value(Json(v))
    }

    /// Resume values by interrupt id.
    pub fn by_id<I, K>(values: I) -> Self
    where
        I: IntoIterator<Item = (K, serde_json::Value)>,
        K: Into<String>,
    {
        Resume::ById(
            values
                .into_iter()
                .map(|(k, v)| (k.into(), Json(v)))
                .collect(),
        )
    }
}
