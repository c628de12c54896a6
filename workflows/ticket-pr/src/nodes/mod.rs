//! The graph's nodes, by stage, and what they share: the dependencies every node holds
//! ([`Deps`]), the update type, and the failure update.

mod analysis;
mod by_blocks;
mod candidates;
mod delivery;
mod generation;
mod review;
mod verification;

pub(crate) use analysis::*;
pub(crate) use candidates::*;
pub(crate) use delivery::*;
pub(crate) use generation::*;
pub use review::GateAnswer;
pub(crate) use review::*;
pub(crate) use verification::*;

use crate::repo::FileChange;
use crate::state::{status, Chunk, Classification, CodeChanges, ModuleChoice, PrRef, TestChanges};
use crate::ticket::{TicketStore, TicketType};
use crate::{
    edit, metrics, prompts, prs, repo, state, ticket, TicketPrError, TicketPrSettings,
    TicketPrState, TicketPrStateUpdate, LARGE_FILE_LINES, MAX_GENERATIONS,
};
use ferrograph::chat::agent::AgentLlm;
use ferrograph::chat::TokenSink;
use ferrograph::core::message::Message;
use ferrograph::prelude::*;
use ferrograph_index::{
    index_dir, BuildOptions, Embedder, Filter, Index, IndexConfig, Query, Retriever,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) struct Deps {
    settings: TicketPrSettings,
    embedder: tokio::sync::OnceCell<Arc<dyn Embedder>>,
    indexes: tokio::sync::Mutex<HashMap<PathBuf, Arc<Index>>>,
}

impl Deps {
    /// The dependencies of a graph with `settings`.
    pub(crate) fn new(settings: TicketPrSettings) -> Self {
        Deps {
            settings,
            embedder: tokio::sync::OnceCell::new(),
            indexes: tokio::sync::Mutex::new(HashMap::new()),
        }
    }
}

pub(crate) type Update = TicketPrStateUpdate;

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn failed(msg: impl Into<String>) -> Update {
    let msg = msg.into();
    tracing::warn!(error = %msg, "ticket-to-pr step failed");
    Update::new()
        .error(Some(msg.clone()))
        .status(status::FAILED.to_string())
        .messages(vec![format!("error: {msg}")])
}

impl Deps {
    /// Stops the process with SIGKILL at `point` when the crash tests ask for it.
    fn crash_point(&self, point: &str) {
        if self.settings.crash_at.as_deref() != Some(point) {
            return;
        }
        tracing::warn!(point, "crash point reached: killing this process");
        #[cfg(unix)]
        {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
        }
        // Not reached where SIGKILL exists; elsewhere the process still ends here.
        std::process::abort();
    }

    fn llm(&self) -> Result<&AgentLlm, String> {
        self.settings.llm.as_ref().ok_or_else(|| {
            "no model is configured for ticket-to-pr (set FERROGRAPH_MODEL to a GGUF file or `default`, or [workflows.ticket-to-pr] model in the config file)".to_string()
        })
    }

    async fn embedder(&self) -> Result<Arc<dyn Embedder>, String> {
        let make = self.settings.make_embedder.clone();
        self.embedder
            .get_or_try_init(|| async move {
                tokio::task::spawn_blocking(move || make())
                    .await
                    .map_err(|e| format!("loading the embedder failed: {e}"))?
            })
            .await
            .cloned()
    }

    /// The repository's index, opened once per process and brought up to date with the
    /// working tree (only changed files are embedded again).
    async fn retriever(&self, repo: &Path) -> Result<Retriever, String> {
        let embedder = self.embedder().await?;
        let mut cache = self.indexes.lock().await;
        let index = match cache.get(repo) {
            Some(i) => i.clone(),
            None => {
                let dir = self
                    .settings
                    .data_dir
                    .join("indexes")
                    .join(ferrograph_index::build::index_name(repo));
                let e = embedder.clone();
                let index = tokio::task::spawn_blocking(move || {
                    Index::open_or_create(&dir, IndexConfig::new(e.dim(), e.model_id()))
                        .map_err(|err| format!("index {}: {err}", dir.display()))
                })
                .await
                .map_err(|e| e.to_string())??;
                let index = Arc::new(index);
                cache.insert(repo.to_path_buf(), index.clone());
                index
            }
        };
        drop(cache);
        let (i, e, root) = (index.clone(), embedder.clone(), repo.to_path_buf());
        tokio::task::spawn_blocking(move || {
            let opts = BuildOptions {
                remove_missing: true,
                ..BuildOptions::default()
            };
            index_dir(&i, e.as_ref(), &root, &opts, &mut |_| {})
                .map_err(|err| format!("indexing {}: {err}", root.display()))
        })
        .await
        .map_err(|e| e.to_string())??;
        Retriever::new(index, embedder).map_err(|e| e.to_string())
    }
}

pub(crate) fn repo_name(s: &TicketPrState) -> String {
    Path::new(&s.repo)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "project".into())
}

pub(crate) fn messages_for(s: &TicketPrState, task: String) -> Vec<Message> {
    vec![
        Message::system(prompts::system(&repo_name(s))),
        Message::human(task),
    ]
}
