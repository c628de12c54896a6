//! What workflows built on ferrograph share: where data lives, limits, and the model.

use ferrograph_chat::ChatModel;
use std::sync::Arc;

/// What the built-in workflows share: where data lives, limits, and the model.
#[derive(Clone, Default)]
pub struct WorkflowSettings {
    /// Data directory (datasets, indexes and stores live under it).
    pub data_dir: std::path::PathBuf,
    /// Step limit of agent loops (`FERROGRAPH_MAX_STEPS`).
    pub max_steps: Option<u32>,
    /// Whole-run limit (`FERROGRAPH_MAX_RUNTIME_SECONDS`).
    pub run_timeout: Option<std::time::Duration>,
    /// Per-tool limit (`FERROGRAPH_TOOL_TIMEOUT_SECONDS`).
    pub tool_timeout: Option<std::time::Duration>,
    /// The chat model (local or remote); `None` runs the deterministic paths only.
    pub llm: Option<Arc<dyn ChatModel>>,
    /// A second model to fall back to once the first one's retries are exhausted.
    pub fallback_llm: Option<Arc<dyn ChatModel>>,
    /// Models configured for one workflow (`[workflows.NAME] model = ...` in the config file,
    /// or `FERROGRAPH_<NAME>_MODEL`), by workflow name; `None` there means no model for that
    /// workflow. A workflow not listed uses [`WorkflowSettings::llm`].
    pub workflow_llms: std::collections::BTreeMap<String, Option<Arc<dyn ChatModel>>>,
}

impl WorkflowSettings {
    /// The model of `workflow`: its own when one is configured, else the shared one.
    pub fn llm_for(&self, workflow: &str) -> Option<Arc<dyn ChatModel>> {
        match self.workflow_llms.get(workflow) {
            Some(m) => m.clone(),
            None => self.llm.clone(),
        }
    }
}
