//! Seed 000 on ferrograph: **ticket to pull request**, offline, on a real local git
//! repository.
//!
//! ```text
//! fetch_ticket ─▶ classify_ticket ─▶ identify_modules ─▶ retrieve_context ─▶ generate_code_changes
//!     │ (unknown ticket, bad repository: no model call)        ▲                     │
//!     ▼                                                       │ feedback (≤ 3)      ▼
//! handle_error ─▶ END                     human_review_gate ◀─ prepare_diff_summary ◀─ generate_tests
//!                                              │ approve            │ reject / a 4th generation
//!                                              ▼                    ▼
//!                      apply_changes ─▶ create_pull_request ─▶ post_ticket_comment ─▶ END
//! ```
//!
//! - Tickets are files in a folder ([`ticket`]); the comment goes back there.
//! - The repository is any local git repository ([`repo`]): its modules come from its layout
//!   or `ferrograph-modules.toml`; it is indexed on first use and refreshed incrementally.
//! - Every model call is structured and constrained (modules and paths are enums fixed at run
//!   time), retried on retryable errors only, then the fallback, then `error` and a status.
//! - The gate's payload carries a real unified diff of every file against the base commit.
//! - Approval makes a branch with one commit per file (built in memory: the working tree and
//!   current branch are untouched), a pull-request record in sled ([`prs`]) with a
//!   `git format-patch` series, an optional push, and the ticket comment, each exactly once
//!   across crashes.
//!
//! Run it with `ferrograph run ticket-to-pr --ticket KEY --tickets DIR --repo DIR`.

pub mod edit;
pub mod error;
pub mod fixture;
pub mod metrics;
pub mod prompts;
pub mod prs;
pub mod repo;
pub mod state;
#[cfg(feature = "testing")]
pub mod testing;
pub mod ticket;

pub use error::TicketPrError;
pub use state::{TicketPrState, TicketPrStateUpdate};

use ferrograph::chat::agent::{AgentLlm, LlmCall};
use ferrograph::chat::TokenSink;
use ferrograph::core::message::Message;
use ferrograph::prelude::*;
use ferrograph::{CheckpointSaver, CompileError, WorkflowSettings};
use ferrograph_index::embed::EmbedderFactory;
use ferrograph_index::{
    index_dir, BuildOptions, Embedder, Filter, Index, IndexConfig, Query, Retriever,
};
use repo::FileChange;
use serde_json::{json, Value};
use state::{status, Chunk, Classification, CodeChanges, ModuleChoice, PrRef, TestChanges};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use ticket::{TicketStore, TicketType};

/// The workflow's name in the registry.
pub const NAME: &str = "ticket-to-pr";

/// Most generations of the change (the first and two revisions).
pub const MAX_GENERATIONS: u32 = 3;

/// A proposed file over this many lines is flagged at the gate.
pub const LARGE_FILE_LINES: usize = 300;

/// The environment variable that names a crash point (tests only): when the run reaches it,
/// the process kills itself with SIGKILL.
pub const CRASH_ENV: &str = "FERROGRAPH_TICKET_PR_CRASH_AT";

/// What the workflow needs besides its state.
#[derive(Clone)]
pub struct TicketPrSettings {
    /// `<data>/ticket-to-pr` holds the indexes, the pull requests and the default output.
    pub data_dir: PathBuf,
    /// The model; `None` ends every run before the first model call with a clear error.
    pub llm: Option<AgentLlm>,
    /// Makes the embedder for retrieval.
    pub make_embedder: EmbedderFactory,
    /// A crash point ([`CRASH_ENV`]).
    pub crash_at: Option<String>,
}

impl TicketPrSettings {
    /// From the shared settings: the workflow's model, MiniLM, `FERROGRAPH_TICKET_PR_CRASH_AT`.
    pub fn from_workflow_settings(w: &WorkflowSettings) -> Self {
        TicketPrSettings {
            data_dir: w.data_dir.join("ticket-to-pr"),
            llm: w.llm_for(NAME).map(|m| code_llm(m, w.fallback_llm.clone())),
            make_embedder: ferrograph_index::embed::minilm(),
            crash_at: std::env::var(CRASH_ENV).ok().filter(|v| !v.is_empty()),
        }
    }

    /// The pull-request store.
    pub fn prs(&self) -> prs::PrStore {
        prs::PrStore::new(self.data_dir.join("prs"))
    }
}

/// The agents' model calls, set for code: the repetition guard allows longer repeats than
/// prose (code repeats itself legitimately) and the context is the model's 8K.
pub fn code_llm(
    primary: Arc<dyn ferrograph::chat::ChatModel>,
    fallback: Option<Arc<dyn ferrograph::chat::ChatModel>>,
) -> AgentLlm {
    let mut llm = AgentLlm::new(primary, fallback);
    for o in [&mut llm.primary_options, &mut llm.fallback_options] {
        o.no_repeat_ngram = Some(32);
        o.max_context = 8192;
    }
    llm
}

struct Deps {
    settings: TicketPrSettings,
    embedder: tokio::sync::OnceCell<Arc<dyn Embedder>>,
    indexes: tokio::sync::Mutex<HashMap<PathBuf, Arc<Index>>>,
}

type Update = TicketPrStateUpdate;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn failed(msg: impl Into<String>) -> Update {
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
        let pid = std::process::id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid])
            .status();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
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

fn repo_name(s: &TicketPrState) -> String {
    Path::new(&s.repo)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "project".into())
}

fn messages_for(s: &TicketPrState, task: String) -> Vec<Message> {
    vec![
        Message::system(prompts::system(&repo_name(s))),
        Message::human(task),
    ]
}

/// Node 1: the ticket, the base commit and the modules; no model call.
async fn fetch_ticket(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    _ctx: NodeContext,
) -> Result<Update, NodeError> {
    let fetched = (|| -> Result<Update, TicketPrError> {
        let store = TicketStore::open(&s.tickets)?;
        let t = store.get(s.ticket_key.trim())?;
        let repo = repo::open(Path::new(&s.repo))?;
        repo::check_clean(&repo)?;
        let (branch, commit) = repo::head(&repo)?;
        let modules = repo::modules(&repo, &commit)?;
        let names: Vec<&str> = modules.iter().map(|m| m.name.as_str()).collect();
        let line = format!(
            "Fetched ticket {}: {} ({:?}); base {branch} at {}; modules: {}",
            t.key,
            t.summary,
            t.ticket_type,
            &commit[..commit.len().min(10)],
            names.join(", ")
        );
        Ok(Update::new()
            .ticket(t)
            .base_branch(branch)
            .base_commit(commit)
            .modules(modules)
            .messages(vec![line]))
    })();
    let out = if s.out.is_empty() {
        d.settings.data_dir.join("out").display().to_string()
    } else {
        s.out.clone()
    };
    Ok(match fetched {
        Ok(u) => u.out(out),
        Err(e @ TicketPrError::UnknownTicket(_)) => Update::new()
            .error(Some(e.to_string()))
            .status(status::UNKNOWN_TICKET.to_string())
            .messages(vec![format!("error: {e}")]),
        Err(e) => failed(e.to_string()),
    })
}

fn record(calls: &mut Vec<LlmCall>, c: LlmCall) {
    calls.push(c);
}

/// Node 2: the classifier; a ticket with acceptance criteria stays a story.
async fn classify_ticket(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    let llm = match d.llm() {
        Ok(l) => l,
        Err(e) => return Ok(failed(e)),
    };
    let msgs = messages_for(&s, prompts::classify(&s));
    let (res, call) = llm
        .structured::<Classification>(
            "classify",
            &msgs,
            200,
            |_| {},
            TokenSink::from_context(&ctx),
        )
        .await;
    let mut calls = Vec::new();
    record(&mut calls, call);
    let c = match res {
        Ok(c) => c,
        Err(e) => return Ok(failed(format!("classifying the ticket: {e}")).llm_calls(calls)),
    };
    let mut t = s.ticket.clone();
    let mut line = format!(
        "Classified as {:?}, complexity {:?}: {}",
        c.confirmed_type,
        c.complexity,
        c.technical_summary.trim()
    );
    if c.confirmed_type == TicketType::Bug && !t.acceptance_criteria.is_empty() {
        line.push_str(" (kept as a Story: the ticket has acceptance criteria)");
    } else {
        t.ticket_type = c.confirmed_type;
    }
    Ok(Update::new()
        .classification(Some(c))
        .ticket(t)
        .llm_calls(calls)
        .messages(vec![line]))
}

/// Node 3: the modules to change, from the repository's own list.
async fn identify_modules(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    let llm = match d.llm() {
        Ok(l) => l,
        Err(e) => return Ok(failed(e)),
    };
    let with_module = |files: Vec<String>| -> Vec<(String, String)> {
        files
            .into_iter()
            .filter_map(|f| {
                let m = s.modules.iter().find(|m| m.files.contains(&f))?;
                Some((
                    f.rsplit('/').next().unwrap_or(&f).to_string(),
                    m.name.clone(),
                ))
            })
            .collect()
    };
    let named = with_module(named_files(&s, &s.modules));
    let named_exactly = with_module(named_files_exactly(&s, &s.modules));
    // The modules holding named files first: the first choices are the likely ones.
    let mut names: Vec<String> = Vec::new();
    for m in named
        .iter()
        .map(|(_, m)| m)
        .chain(s.modules.iter().map(|m| &m.name))
    {
        if !names.contains(m) {
            names.push(m.clone());
        }
    }
    let files: Vec<String> = s.modules.iter().flat_map(|m| m.files.clone()).collect();
    let msgs = messages_for(&s, prompts::identify_modules(&s, &s.modules, &named));
    let (res, call) = llm
        .structured::<ModuleChoice>(
            "identify_modules",
            &msgs,
            300,
            |schema| {
                if let Some(p) = schema.pointer_mut("/properties/affected_modules") {
                    p["items"] = json!({"type": "string", "enum": names});
                    p["maxItems"] = json!(names.len().min(3));
                }
                if files.len() <= 300 {
                    if let Some(p) = schema.pointer_mut("/properties/files_likely_to_change") {
                        p["items"] = json!({"type": "string", "enum": files});
                    }
                }
            },
            TokenSink::from_context(&ctx),
        )
        .await;
    let calls = vec![call];
    let choice = match res {
        Ok(c) => c,
        Err(e) => {
            return Ok(failed(format!("identifying the modules: {e}")).llm_calls(calls));
        }
    };
    let mut chosen: Vec<String> = Vec::new();
    for m in &choice.affected_modules {
        if s.modules.iter().any(|x| &x.name == m) && !chosen.contains(m) {
            chosen.push(m.clone());
        }
    }
    // A module holding a file the ticket names exactly is always in scope: the ticket's own
    // words are stronger evidence than a small model's pick.
    let mut added = Vec::new();
    for (file, m) in &named_exactly {
        if !chosen.contains(m) {
            chosen.push(m.clone());
            added.push(format!("{m} (the ticket names {file})"));
        }
    }
    if chosen.is_empty() {
        return Ok(failed(format!(
            "the model named no module of the repository (it said {:?}; the repository has {})",
            choice.affected_modules,
            s.modules
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .llm_calls(calls));
    }
    let affected_files: Vec<String> = choice
        .files_likely_to_change
        .iter()
        .filter(|f| {
            s.modules
                .iter()
                .any(|m| chosen.contains(&m.name) && m.files.contains(f))
        })
        .cloned()
        .collect();
    let reasoning = first_sentence(&choice.reasoning);
    let mut line = format!("Modules affected: {} ({reasoning})", chosen.join(", "));
    if !added.is_empty() {
        line.push_str(&format!("; added: {}", added.join(", ")));
    }
    Ok(Update::new()
        .messages(vec![line])
        .affected_modules(chosen)
        .module_reasoning(reasoning)
        .affected_files(affected_files)
        .llm_calls(calls))
}

/// Node 4: the top 4 chunks of each selected module (a path filter per module), merged by
/// similarity, top 10.
async fn retrieve_context(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    _ctx: NodeContext,
) -> Result<Update, NodeError> {
    let repo_dir = match std::path::absolute(&s.repo) {
        Ok(p) => p,
        Err(e) => return Ok(failed(format!("{}: {e}", s.repo))),
    };
    let retriever = match d.retriever(&repo_dir).await {
        Ok(r) => r,
        Err(e) => return Ok(failed(format!("indexing the repository: {e}"))),
    };
    let text = format!("{} {}", s.ticket.summary, s.ticket.description);
    let mut chunks: Vec<Chunk> = Vec::new();
    for m in s.selected_modules() {
        let q = Query::new(text.clone())
            .k(4)
            .filter(Filter::path_prefix(format!("{}/", m.path)));
        let hits = match retriever.search_async(q).await {
            Ok(h) => h,
            Err(e) => return Ok(failed(format!("searching {}: {e}", m.name))),
        };
        chunks.extend(
            hits.into_iter()
                .filter(|h| m.files.contains(&h.path))
                .map(|h| Chunk {
                    file_path: h.path,
                    module: m.name.clone(),
                    start_line: h.start_line,
                    end_line: h.end_line,
                    similarity: h.score,
                    text: h.text,
                }),
        );
    }
    chunks.sort_by(|a, b| b.similarity.total_cmp(&a.similarity));
    chunks.truncate(10);
    let list: Vec<String> = chunks
        .iter()
        .map(|c| format!("{} ({:.2})", c.file_path, c.similarity))
        .collect();
    Ok(Update::new()
        .messages(vec![format!(
            "Retrieved {} chunks: {}",
            chunks.len(),
            list.join(", ")
        )])
        .retrieved_chunks(chunks))
}

/// The first sentence of a model's free text (a small model's later sentences tend to loop).
fn first_sentence(text: &str) -> String {
    let t = text.trim();
    match t.find(". ") {
        Some(i) => t[..=i].to_string(),
        None => t.to_string(),
    }
}

/// Files of `modules` whose names the ticket itself spells exactly (`TaskService`).
fn named_files_exactly(s: &TicketPrState, modules: &[repo::Module]) -> Vec<String> {
    let text = format!("{} {}", s.ticket.summary, s.ticket.description);
    let words: std::collections::HashSet<&str> = text
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .filter(|w| w.len() > 2)
        .collect();
    modules
        .iter()
        .flat_map(|m| m.files.iter())
        .filter(|p| {
            Path::new(p)
                .file_stem()
                .is_some_and(|st| words.contains(st.to_string_lossy().as_ref()))
        })
        .cloned()
        .collect()
}

/// Files of `modules` whose names the ticket or the classifier mentions: first those named
/// exactly (`TaskService.findOverdue` names `TaskService.java`), then those named loosely
/// (in another case or in the plural: "tasks" names `Task.java`).
fn named_files(s: &TicketPrState, modules: &[repo::Module]) -> Vec<String> {
    let mut text = format!("{} {}", s.ticket.summary, s.ticket.description);
    if let Some(c) = &s.classification {
        text.push(' ');
        text.push_str(&c.affected_components.join(" "));
    }
    let words: std::collections::HashSet<&str> = text
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .filter(|w| w.len() > 2)
        .collect();
    let loose: std::collections::HashSet<String> = words
        .iter()
        .flat_map(|w| {
            let l = w.to_lowercase();
            let singular = l.strip_suffix('s').map(str::to_string);
            std::iter::once(l).chain(singular)
        })
        .collect();
    let stem = |p: &String| {
        Path::new(p)
            .file_stem()
            .map(|st| st.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let files: Vec<&String> = modules.iter().flat_map(|m| m.files.iter()).collect();
    let mut out: Vec<String> = files
        .iter()
        .filter(|p| words.contains(stem(p).as_str()))
        .map(|p| (*p).clone())
        .collect();
    for p in files {
        if !out.contains(p) && loose.contains(&stem(p).to_lowercase()) {
            out.push(p.clone());
        }
    }
    out
}

/// Source files the generator may rewrite: the picker's files, then the files of the best
/// chunks, in the selected modules and not tests, at most `n`.
fn candidate_sources(s: &TicketPrState, n: usize) -> Vec<String> {
    let selected = s.selected_modules();
    let in_scope =
        |p: &String| !repo::is_test_path(p) && selected.iter().any(|m| m.files.contains(p));
    let named = named_files(s, &selected);
    let mut out: Vec<String> = Vec::new();
    // Files the ticket or the classifier names come first, then the picker's, then
    // retrieval's.
    for p in named
        .iter()
        .chain(s.affected_files.iter())
        .chain(s.retrieved_chunks.iter().map(|c| &c.file_path))
    {
        if in_scope(p)
            && !out.contains(p)
            && ferrograph_index::chunk::language_for_path(p).is_some()
        {
            out.push(p.clone());
        }
    }
    out.truncate(n);
    out
}

/// Reads `paths` at the base commit.
fn read_files(s: &TicketPrState, paths: &[String]) -> Result<Vec<(String, String)>, String> {
    let repo = repo::open(Path::new(&s.repo)).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for p in paths {
        if let Some(text) = repo::read_at(&repo, &s.base_commit, p).map_err(|e| e.to_string())? {
            out.push((p.clone(), text));
        }
    }
    Ok(out)
}

/// The model's files checked: paths inside the selected modules, edits of the file's own
/// lines (or a new file's content), one entry per path, and no file left as it was. Returns
/// the changes and what was dropped.
fn check_changes(
    s: &TicketPrState,
    proposed: Vec<state::ProposedFile>,
) -> Result<(Vec<FileChange>, Vec<String>), TicketPrError> {
    let repo = repo::open(Path::new(&s.repo))?;
    let selected = s.selected_modules();
    let mut out: Vec<FileChange> = Vec::new();
    let mut dropped = Vec::new();
    for p in proposed {
        let path = repo::check_path(&repo, &s.base_commit, &p.file_path, &selected)?;
        let old = repo::read_at(&repo, &s.base_commit, &path)?;
        let content = match edit::compose(&p, old.as_deref()) {
            Ok(c) => c,
            Err(why) => {
                dropped.push(format!("{path}: {why}"));
                continue;
            }
        };
        if content.trim().is_empty() {
            dropped.push(format!("{path}: empty content"));
            continue;
        }
        if old.as_deref() == Some(content.as_str()) {
            dropped.push(format!("{path}: unchanged"));
            continue;
        }
        if out.iter().any(|c| c.file_path == path) {
            dropped.push(format!("{path}: proposed twice"));
            continue;
        }
        let description = match p.description.trim() {
            d if d.is_empty() || edit::degenerate(d) => describe_edit(&p, &path),
            d => d.to_string(),
        };
        out.push(FileChange {
            file_path: path,
            description,
            new_content: content,
        });
    }
    Ok((out, dropped))
}

/// A description composed from the change itself, for when the model's is empty or loops.
fn describe_edit(p: &state::ProposedFile, path: &str) -> String {
    let short = |t: &str| {
        let t = t.trim().replace('\n', " ");
        if t.chars().count() > 60 {
            format!("{}…", t.chars().take(60).collect::<String>())
        } else {
            t
        }
    };
    match p.edits.first() {
        Some(e) if e.replace.trim().is_empty() => format!("remove `{}`", short(&e.find)),
        Some(e) => format!("replace `{}` with `{}`", short(&e.find), short(&e.replace)),
        None => format!("add {path}"),
    }
}

/// The `items` schema of a list of proposed files: one alternative per allowed path, with
/// edits of its own lines when it exists (`files`), else its whole content.
fn files_schema(
    paths: &[String],
    files: &[(String, String)],
    max_len: usize,
    ticket: &str,
) -> Value {
    let alts: Vec<Value> = paths
        .iter()
        .map(|p| {
            let lines = files.iter().find(|(f, _)| f == p).map(|(_, t)| {
                // The lines the ticket points at first.
                let mut l = edit::pointed_lines(t, ticket);
                for x in edit::edit_targets(t) {
                    if !l.contains(&x) {
                        l.push(x);
                    }
                }
                l
            });
            edit::file_schema(p, lines.as_deref(), max_len)
        })
        .collect();
    match alts.as_slice() {
        [one] => one.clone(),
        _ => json!({ "anyOf": alts }),
    }
}

/// `maxLength` of a new file's content and the tokens to allow for an answer.
fn content_budget(files: &[(String, String)], new_files: usize) -> (usize, usize) {
    let longest = files.iter().map(|(_, t)| t.len()).max().unwrap_or(1200);
    let max_len = (longest + 400).clamp(1200, 6000);
    // Edits are short; a new file is written whole.
    (max_len, 700 + new_files * (max_len / 3))
}

/// Node 5: the changes, whole files; on a revision with the reviewer's feedback. A first
/// answer that changes nothing is asked again on the alternative configuration once.
async fn generate_code_changes(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    let llm = match d.llm() {
        Ok(l) => l,
        Err(e) => return Ok(failed(e)),
    };
    let paths = candidate_sources(&s, 2);
    if paths.is_empty() {
        return Ok(failed(format!(
            "no source file found in the modules {} to change",
            s.affected_modules.join(", ")
        )));
    }
    let files = match read_files(&s, &paths) {
        Ok(f) => f,
        Err(e) => return Ok(failed(e)),
    };
    let ticket_text = format!("{} {}", s.ticket.summary, s.ticket.description);
    let context = prompts::code_context(&files, &s.retrieved_chunks, 9000, &ticket_text);
    let msgs = messages_for(&s, prompts::generate_changes(&s, &context));
    let (max_len, max_tokens) = content_budget(&files, 0);
    let is_bug = s.ticket.ticket_type == TicketType::Bug;
    let items = files_schema(&paths, &files, max_len, &ticket_text);
    let patch = |schema: &mut Value| {
        if let Some(p) = schema.pointer_mut("/properties/changes") {
            p["items"] = items.clone();
            p["maxItems"] = json!(paths.len());
        }
        if !is_bug {
            if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
                props.remove("root_cause");
            }
            if let Some(req) = schema.get_mut("required").and_then(Value::as_array_mut) {
                req.retain(|r| r != "root_cause");
            }
        }
    };
    let mut calls = Vec::new();
    let mut dropped_all = Vec::new();
    let mut result = None;
    for alternative in [false, true] {
        let (res, call) = llm
            .structured_as::<CodeChanges>(
                alternative,
                "generate_code_changes",
                &msgs,
                max_tokens,
                patch,
                TokenSink::from_context(&ctx),
            )
            .await;
        calls.push(call);
        let answer = match res {
            Ok(a) => a,
            Err(e) => {
                return Ok(failed(format!("generating the changes: {e}")).llm_calls(calls));
            }
        };
        match check_changes(&s, answer.changes.clone()) {
            Ok((changes, dropped)) if !changes.is_empty() => {
                dropped_all.extend(dropped);
                result = Some((answer.root_cause, changes));
                break;
            }
            Ok((_, dropped)) => dropped_all.extend(dropped),
            Err(e) => {
                return Ok(failed(format!("the proposed changes: {e}")).llm_calls(calls));
            }
        }
    }
    let Some((root_cause, changes)) = result else {
        return Ok(failed(format!(
            "the model proposed no change to any file ({})",
            dropped_all.join("; ")
        ))
        .llm_calls(calls));
    };
    let mut line = format!(
        "Generation {}: {} file change(s): {}",
        s.generations + 1,
        changes.len(),
        changes
            .iter()
            .map(|c| c.file_path.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !dropped_all.is_empty() {
        line.push_str(&format!(" (dropped: {})", dropped_all.join("; ")));
    }
    Ok(Update::new()
        .root_cause(if is_bug && !edit::degenerate(&root_cause) {
            root_cause.trim().to_string()
        } else {
            String::new()
        })
        .proposed_changes(changes)
        .proposed_tests(Vec::new())
        .generations(1u32)
        .decision(String::new())
        .llm_calls(calls)
        .messages(vec![line]))
}

/// `src/main/.../X.java` → `src/test/.../XTest.java` (and the like for other layouts).
fn test_path_for(path: &str) -> Option<String> {
    let p = Path::new(path);
    let stem = p.file_stem()?.to_string_lossy().into_owned();
    let ext = p.extension()?.to_string_lossy().into_owned();
    let dir = p.parent()?.to_string_lossy().into_owned();
    let dir = if dir.contains("/src/main/") {
        dir.replacen("/src/main/", "/src/test/", 1)
    } else if let Some(rest) = dir.strip_suffix("/src") {
        format!("{rest}/tests")
    } else {
        dir
    };
    Some(match ext.as_str() {
        "py" => format!("{dir}/test_{stem}.{ext}"),
        "ts" | "js" => format!("{dir}/{stem}.test.{ext}"),
        _ => format!("{dir}/{stem}Test.{ext}"),
    })
}

/// Node 6: the tests, seeing the changes and the existing test of the changed class.
async fn generate_tests(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    let llm = match d.llm() {
        Ok(l) => l,
        Err(e) => return Ok(failed(e)),
    };
    let selected = s.selected_modules();
    let tests: Vec<String> = selected
        .iter()
        .flat_map(|m| m.files.iter())
        .filter(|f| {
            repo::is_test_path(f) && ferrograph_index::chunk::language_for_path(f).is_some()
        })
        .cloned()
        .collect();
    let stems: Vec<String> = s
        .proposed_changes
        .iter()
        .filter_map(|c| Path::new(&c.file_path).file_stem())
        .map(|x| x.to_string_lossy().to_lowercase())
        .collect();
    let stem_of = |p: &String| {
        Path::new(p)
            .file_stem()
            .map(|x| x.to_string_lossy().to_lowercase())
            .unwrap_or_default()
    };
    let existing = tests
        .iter()
        .find(|t| stems.iter().any(|st| stem_of(t).contains(st.as_str())))
        .or_else(|| {
            s.retrieved_chunks
                .iter()
                .map(|c| &c.file_path)
                .find(|p| tests.contains(p))
        })
        .or_else(|| tests.first())
        .cloned();
    let mut paths: Vec<String> = existing.iter().cloned().collect();
    for c in &s.proposed_changes {
        if let Some(t) = test_path_for(&c.file_path) {
            if !paths.contains(&t)
                && !stems.is_empty()
                && existing.as_ref().is_none_or(|e| stem_of(e) != stem_of(&t))
                && selected
                    .iter()
                    .any(|m| t.starts_with(&format!("{}/", m.path)))
            {
                paths.push(t);
            }
        }
    }
    if paths.is_empty() {
        return Ok(Update::new().messages(vec![
            "No test file to write: the selected modules have no tests and no test path could be derived".into(),
        ]));
    }
    let files = match existing
        .as_ref()
        .map(|e| read_files(&s, std::slice::from_ref(e)))
    {
        Some(Ok(f)) => f,
        Some(Err(e)) => return Ok(failed(e)),
        None => Vec::new(),
    };
    let shown = files.first().map(|(p, t)| (p.as_str(), t.as_str()));
    let msgs = messages_for(&s, prompts::generate_tests(&s, shown));
    let new_files = paths
        .iter()
        .filter(|p| !files.iter().any(|(f, _)| f == *p))
        .count();
    let (max_len, max_tokens) = content_budget(&files, new_files.min(1));
    let ticket_text = format!("{} {}", s.ticket.summary, s.ticket.description);
    let items = files_schema(&paths, &files, max_len, &ticket_text);
    let (res, call) = llm
        .structured::<TestChanges>(
            "generate_tests",
            &msgs,
            max_tokens,
            |schema| {
                if let Some(p) = schema.pointer_mut("/properties/tests") {
                    p["items"] = items.clone();
                }
            },
            TokenSink::from_context(&ctx),
        )
        .await;
    let calls = vec![call];
    let answer = match res {
        Ok(a) => a,
        Err(e) => return Ok(failed(format!("generating the tests: {e}")).llm_calls(calls)),
    };
    let (tests, dropped) = match check_changes(&s, answer.tests) {
        Ok(x) => x,
        Err(e) => return Ok(failed(format!("the proposed tests: {e}")).llm_calls(calls)),
    };
    let mut line = if tests.is_empty() {
        "No test change proposed".to_string()
    } else {
        format!(
            "{} test file(s): {}",
            tests.len(),
            tests
                .iter()
                .map(|c| c.file_path.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    if !dropped.is_empty() {
        line.push_str(&format!(" (dropped: {})", dropped.join("; ")));
    }
    Ok(Update::new()
        .proposed_tests(tests)
        .llm_calls(calls)
        .messages(vec![line]))
}

/// Node 7: the reviewer's summary, the unified diff and the scope warnings.
async fn prepare_diff_summary(
    _d: Arc<Deps>,
    s: Arc<TicketPrState>,
    _ctx: NodeContext,
) -> Result<Update, NodeError> {
    let all = s.all_changes();
    let repo = match repo::open(Path::new(&s.repo)) {
        Ok(r) => r,
        Err(e) => return Ok(failed(e.to_string())),
    };
    let mut diff = String::new();
    let mut lines = vec![format!(
        "## Proposed changes for {}: {}\n",
        s.ticket.key, s.ticket.summary
    )];
    if !s.root_cause.is_empty() {
        lines.push(format!("**Root cause:** {}\n", s.root_cause));
    } else if s.ticket.ticket_type == TicketType::Bug {
        lines.push(
            "**Root cause:** not stated (the model gave none that reads as an explanation)\n"
                .into(),
        );
    }
    lines.push(format!(
        "Generation {} of at most {MAX_GENERATIONS}; modules: {}.\n",
        s.generations,
        s.affected_modules.join(", ")
    ));
    lines.push("### Files to be changed\n".into());
    let mut warnings = Vec::new();
    for c in &all {
        let old = match repo::read_at(&repo, &s.base_commit, &c.file_path) {
            Ok(o) => o,
            Err(e) => return Ok(failed(e.to_string())),
        };
        match repo::unified_diff(&c.file_path, old.as_deref(), &c.new_content) {
            Ok(d) => diff.push_str(&d),
            Err(e) => return Ok(failed(e.to_string())),
        }
        let (mut added, mut removed) = (0usize, 0usize);
        for l in diff_lines(&c.file_path, old.as_deref(), &c.new_content) {
            match l {
                '+' => added += 1,
                '-' => removed += 1,
                _ => {}
            }
        }
        let new_file = if old.is_none() { ", new file" } else { "" };
        lines.push(format!(
            "- `{}` — {} (+{added} −{removed}{new_file})",
            c.file_path, c.description
        ));
        let n = c.new_content.lines().count();
        if n > LARGE_FILE_LINES {
            warnings.push(format!(
                "Large file: `{}` would have {n} lines (over {LARGE_FILE_LINES}). Extra review recommended.",
                c.file_path
            ));
        }
        if let Some(o) = &old {
            let before = o.lines().count();
            if before >= 10 && n * 2 < before {
                warnings.push(format!(
                    "`{}` shrinks from {before} to {n} lines: check that nothing needed was dropped.",
                    c.file_path
                ));
            }
        }
    }
    if s.affected_modules.len() > 2 {
        warnings.push(format!(
            "Multi-module change: {}. Verify the scope is appropriate.",
            s.affected_modules.join(", ")
        ));
    }
    for w in &warnings {
        lines.push(format!("\n⚠️ **{w}**"));
    }
    let summary = lines.join("\n");
    Ok(Update::new()
        .diff_summary(summary)
        .diff(diff)
        .warnings(warnings)
        .gate_opened_ms(now_ms())
        .status(status::AWAITING_REVIEW.to_string())
        .messages(vec![format!(
            "Prepared the review of {} file(s)",
            all.len()
        )]))
}

/// `+`/`-` per changed line of the diff of `path` (for the summary's counts).
fn diff_lines(path: &str, old: Option<&str>, new: &str) -> Vec<char> {
    repo::unified_diff(path, old, new)
        .map(|d| {
            d.lines()
                .filter(|l| !l.starts_with("+++") && !l.starts_with("---"))
                .filter_map(|l| l.chars().next().filter(|c| *c == '+' || *c == '-'))
                .collect()
        })
        .unwrap_or_default()
}

/// A reviewer's answer.
#[derive(Clone, Debug, PartialEq)]
pub enum GateAnswer {
    /// Apply the change.
    Approve,
    /// End without applying anything.
    Reject,
    /// Generate again with this feedback.
    Feedback(String),
}

impl GateAnswer {
    /// Reads `"approve"`, `"reject"`, any other text (feedback, as in the seed),
    /// `{"feedback": "..."}` or `{"decision": "approve|reject|feedback", "feedback": "..."}`.
    pub fn from_json(v: &Value) -> Result<GateAnswer, String> {
        let text = match v {
            Value::String(s) => Some(s.trim().to_string()),
            Value::Object(o) => {
                let fb = o
                    .get("feedback")
                    .and_then(Value::as_str)
                    .map(|f| f.trim().to_string());
                match o.get("decision").and_then(Value::as_str) {
                    Some("approve") => return Ok(GateAnswer::Approve),
                    Some("reject") => return Ok(GateAnswer::Reject),
                    Some("feedback") | None => match fb {
                        Some(f) if !f.is_empty() => return Ok(GateAnswer::Feedback(f)),
                        _ => None,
                    },
                    Some(other) => {
                        return Err(format!(
                            "unknown decision `{other}` (approve, reject or feedback)"
                        ))
                    }
                }
            }
            _ => None,
        };
        match text.as_deref() {
            Some(t) if t.eq_ignore_ascii_case("approve") || t.eq_ignore_ascii_case("approved") => {
                Ok(GateAnswer::Approve)
            }
            Some(t) if t.eq_ignore_ascii_case("reject") || t.eq_ignore_ascii_case("rejected") => {
                Ok(GateAnswer::Reject)
            }
            Some(t) if !t.is_empty() => Ok(GateAnswer::Feedback(t.to_string())),
            _ => Err(format!(
                "unrecognized review answer {v}: use \"approve\", \"reject\" or {{\"feedback\": \"what to change\"}}"
            )),
        }
    }
}

/// Node 8: the gate. Its payload carries the summary, the diff and the choices; the answer
/// approves, rejects, or asks for another generation (at most [`MAX_GENERATIONS`]).
async fn human_review_gate(
    _d: Arc<Deps>,
    s: Arc<TicketPrState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    let files: Vec<Value> = s
        .all_changes()
        .iter()
        .map(|c| json!({"path": c.file_path, "description": c.description}))
        .collect();
    let answer: Value = ctx.interrupt(json!({
        "kind": "review",
        "ticket_key": s.ticket.key,
        "title": format!("{}: {}", s.ticket.key, s.ticket.summary),
        "generation": s.generations,
        "max_generations": MAX_GENERATIONS,
        "prompt": format!("{}\n\n**Do you approve these changes?** (approve, reject, or feedback for a revision)", s.diff_summary),
        "summary": s.diff_summary,
        "diff": s.diff,
        "files": files,
        "warnings": s.warnings,
        "choices": ["approve", "reject", "feedback"],
    }))?;
    let answer = GateAnswer::from_json(&answer).map_err(NodeError::fatal)?;
    metrics::review_answered(now_ms().saturating_sub(s.gate_opened_ms) as f64 / 1000.0);
    Ok(match answer {
        GateAnswer::Approve => Update::new()
            .decision("approve".to_string())
            .messages(vec!["The reviewer approved".into()]),
        GateAnswer::Reject => {
            metrics::run_finished(status::REJECTED, s.generations);
            Update::new()
                .decision("reject".to_string())
                .status(status::REJECTED.to_string())
                .messages(vec![
                    "The reviewer rejected the change: nothing applied".into()
                ])
        }
        GateAnswer::Feedback(f) if s.generations >= MAX_GENERATIONS => {
            metrics::run_finished(status::REVISION_LIMIT, s.generations);
            Update::new()
                .decision("feedback".to_string())
                .feedback(vec![f])
                .status(status::REVISION_LIMIT.to_string())
                .messages(vec![format!(
                    "Feedback after {MAX_GENERATIONS} generations: the revision limit is reached, nothing applied"
                )])
        }
        GateAnswer::Feedback(f) => Update::new()
            .decision("feedback".to_string())
            .messages(vec![format!("Feedback: {f}")])
            .feedback(vec![f]),
    })
}

/// Node 9: the branch with one commit per file, exactly once.
async fn apply_changes(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    _ctx: NodeContext,
) -> Result<Update, NodeError> {
    let branch = repo::branch_name(&s.ticket.key, &s.ticket.summary);
    let changes = s.all_changes();
    let d2 = d.clone();
    let res = (|| -> Result<Vec<String>, TicketPrError> {
        let repo = repo::open(Path::new(&s.repo))?;
        let selected = s.selected_modules();
        for c in &changes {
            repo::check_path(&repo, &s.base_commit, &c.file_path, &selected)?;
        }
        repo::apply(
            &repo,
            &s.base_commit,
            &branch,
            &s.ticket.key,
            &changes,
            &mut |point| d2.crash_point(point),
        )
    })();
    match res {
        Ok(commits) => {
            d.crash_point("applied");
            Ok(Update::new()
                .messages(vec![format!(
                    "Committed {} file(s) to branch {branch}",
                    commits.len()
                )])
                .branch(branch)
                .commits(commits))
        }
        Err(e) => Ok(failed(format!("applying the changes: {e}"))),
    }
}

fn pr_body(s: &TicketPrState, thread: &str) -> String {
    let mut b = format!(
        "Ticket: {} ({:?})\n\n{}\n",
        s.ticket.key, s.ticket.ticket_type, s.ticket.summary
    );
    if !s.root_cause.is_empty() {
        b.push_str(&format!("\n**Root cause:** {}\n", s.root_cause));
    }
    if !s.ticket.acceptance_criteria.is_empty() {
        b.push_str("\n**Acceptance criteria**\n");
        for a in &s.ticket.acceptance_criteria {
            b.push_str(&format!("- {a}\n"));
        }
    }
    b.push_str("\n**Changes**\n");
    for c in s.all_changes() {
        b.push_str(&format!("- `{}`: {}\n", c.file_path, c.description));
    }
    b.push_str(&format!(
        "\nGenerated by ferrograph ticket-to-pr (run {thread}) in {} generation(s) and approved by a reviewer.\n",
        s.generations
    ));
    b
}

/// Node 10: the patch series, the optional push and the pull-request record, once.
async fn create_pull_request(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    let thread = ctx.thread_id().unwrap_or("").to_string();
    let res = (|| -> Result<prs::PullRequest, TicketPrError> {
        let repo = repo::open(Path::new(&s.repo))?;
        let patch = repo::format_patch(&repo, &s.commits)?;
        let out = PathBuf::from(&s.out);
        std::fs::create_dir_all(&out).map_err(|e| TicketPrError::io(&out, e))?;
        let patch_path = out.join(format!("{}.patch", s.branch.replace('/', "_")));
        let tmp = patch_path.with_extension("patch.tmp");
        std::fs::write(&tmp, patch).map_err(|e| TicketPrError::io(&tmp, e))?;
        std::fs::rename(&tmp, &patch_path).map_err(|e| TicketPrError::io(&patch_path, e))?;
        d.crash_point("patch-written");
        if let Some(remote) = s.remote.as_deref().filter(|r| !r.is_empty()) {
            repo::push(&repo, remote, &s.branch)?;
        }
        let pr = d.settings.prs().create(prs::PullRequest {
            number: 0,
            ticket_key: s.ticket.key.clone(),
            title: format!("[{}] {}", s.ticket.key, s.ticket.summary),
            body: pr_body(&s, &thread),
            repo: std::path::absolute(&s.repo)
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| s.repo.clone()),
            base_branch: s.base_branch.clone(),
            base_commit: s.base_commit.clone(),
            head_branch: s.branch.clone(),
            commits: s.commits.clone(),
            patch_path: Some(patch_path.display().to_string()),
            pushed_to: s.remote.clone().filter(|r| !r.is_empty()),
            thread_id: thread.clone(),
            created_ms: now_ms(),
        })?;
        d.crash_point("pr-recorded");
        Ok(pr)
    })();
    match res {
        Ok(pr) => Ok(Update::new()
            .messages(vec![format!("Pull request #{}: {}", pr.number, pr.title)])
            .pr(Some(PrRef {
                number: pr.number,
                title: pr.title,
                patch_path: pr.patch_path.unwrap_or_default(),
                pushed_to: pr.pushed_to,
            }))),
        Err(e) => Ok(failed(format!("opening the pull request: {e}"))),
    }
}

/// Node 11: the comment on the ticket, once.
async fn post_ticket_comment(
    d: Arc<Deps>,
    s: Arc<TicketPrState>,
    _ctx: NodeContext,
) -> Result<Update, NodeError> {
    let Some(pr) = &s.pr else {
        return Ok(failed("no pull request to comment about"));
    };
    let id = format!("pr-{}", pr.number);
    let body = format!(
        "Pull request #{} opened: {}\nBranch: {} ({} commit(s) on {})\nPatch: {}",
        pr.number,
        pr.title,
        s.branch,
        s.commits.len(),
        s.base_branch,
        pr.patch_path
    );
    let res = TicketStore::open(&s.tickets).and_then(|store| {
        store.add_comment(
            &s.ticket.key,
            &ticket::Comment {
                id: id.clone(),
                author: "ferrograph".into(),
                body,
                created_ms: now_ms(),
            },
        )
    });
    match res {
        Ok(added) => {
            d.crash_point("commented");
            metrics::run_finished(status::PR_OPENED, s.generations);
            Ok(Update::new()
                .comment_id(id)
                .status(status::PR_OPENED.to_string())
                .messages(vec![if added {
                    format!("Commented on {}", s.ticket.key)
                } else {
                    format!("{} already had the comment", s.ticket.key)
                }]))
        }
        Err(e) => Ok(failed(format!("commenting on the ticket: {e}"))),
    }
}

/// The error end: records the outcome.
async fn handle_error(
    _d: Arc<Deps>,
    s: Arc<TicketPrState>,
    _ctx: NodeContext,
) -> Result<Update, NodeError> {
    let st = if s.status.is_empty() {
        status::FAILED
    } else {
        s.status.as_str()
    };
    metrics::run_finished(st, s.generations);
    Ok(Update::new().status(st.to_string()))
}

fn on_error(next: &'static str) -> impl Fn(&TicketPrState) -> &'static str + Send + Sync + 'static {
    move |s: &TicketPrState| {
        if s.error.is_some() {
            "handle_error"
        } else {
            next
        }
    }
}

macro_rules! node {
    ($deps:expr, $f:ident) => {{
        let d = $deps.clone();
        move |s: Arc<TicketPrState>, ctx: NodeContext| $f(d.clone(), s, ctx)
    }};
}

/// The graph, with `settings`.
pub fn graph(settings: TicketPrSettings) -> Result<CompiledGraph<TicketPrState>, CompileError> {
    let d = Arc::new(Deps {
        settings,
        embedder: tokio::sync::OnceCell::new(),
        indexes: tokio::sync::Mutex::new(HashMap::new()),
    });
    StateGraph::<TicketPrState>::new(NAME)
        .add_node("fetch_ticket", node!(d, fetch_ticket))
        .add_node("classify_ticket", node!(d, classify_ticket))
        .add_node("identify_modules", node!(d, identify_modules))
        .add_node("retrieve_context", node!(d, retrieve_context))
        .add_node("generate_code_changes", node!(d, generate_code_changes))
        .add_node("generate_tests", node!(d, generate_tests))
        .add_node("prepare_diff_summary", node!(d, prepare_diff_summary))
        .add_node("human_review_gate", node!(d, human_review_gate))
        .add_node("apply_changes", node!(d, apply_changes))
        .add_node("create_pull_request", node!(d, create_pull_request))
        .add_node("post_ticket_comment", node!(d, post_ticket_comment))
        .add_node("handle_error", node!(d, handle_error))
        .add_edge(START, "fetch_ticket")
        .add_conditional_edges(
            "fetch_ticket",
            on_error("classify_ticket"),
            ["classify_ticket", "handle_error"],
        )
        .add_conditional_edges(
            "classify_ticket",
            on_error("identify_modules"),
            ["identify_modules", "handle_error"],
        )
        .add_conditional_edges(
            "identify_modules",
            on_error("retrieve_context"),
            ["retrieve_context", "handle_error"],
        )
        .add_conditional_edges(
            "retrieve_context",
            on_error("generate_code_changes"),
            ["generate_code_changes", "handle_error"],
        )
        .add_conditional_edges(
            "generate_code_changes",
            on_error("generate_tests"),
            ["generate_tests", "handle_error"],
        )
        .add_conditional_edges(
            "generate_tests",
            on_error("prepare_diff_summary"),
            ["prepare_diff_summary", "handle_error"],
        )
        .add_conditional_edges(
            "prepare_diff_summary",
            on_error("human_review_gate"),
            ["human_review_gate", "handle_error"],
        )
        .add_conditional_edges(
            "human_review_gate",
            |s: &TicketPrState| match (s.decision.as_str(), s.status.as_str()) {
                ("approve", _) => "apply_changes",
                ("feedback", st) if st != status::REVISION_LIMIT => "generate_code_changes",
                _ => END,
            },
            ["apply_changes", "generate_code_changes", END],
        )
        .add_conditional_edges(
            "apply_changes",
            on_error("create_pull_request"),
            ["create_pull_request", "handle_error"],
        )
        .add_conditional_edges(
            "create_pull_request",
            on_error("post_ticket_comment"),
            ["post_ticket_comment", "handle_error"],
        )
        .add_edge("post_ticket_comment", END)
        .add_edge("handle_error", END)
        .compile()
}

/// Reads the input: a JSON object (`{"ticket_key", "tickets", "repo", "remote", "out"}`) or
/// a bare ticket key.
pub fn parse_input(text: &str) -> Value {
    match serde_json::from_str::<Value>(text) {
        Ok(v) if v.is_object() => v,
        _ => json!({ "ticket_key": text.trim() }),
    }
}

/// The input when none is given: the fixture's bug ticket under `./taskmaster`
/// (`ferrograph tickets fixture taskmaster` makes it).
pub fn sample_input() -> Value {
    json!({
        "ticket_key": fixture::BUG_TICKET,
        "tickets": "taskmaster/tickets",
        "repo": "taskmaster/repo",
    })
}

fn absolute(p: &str) -> String {
    std::path::absolute(p)
        .map(|a| a.display().to_string())
        .unwrap_or_else(|_| p.to_string())
}

/// `--ticket KEY --tickets DIR --repo DIR [--remote R] [--out DIR]`.
pub fn parse_args(args: &[String]) -> Result<Value, String> {
    let mut input = serde_json::Map::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (field, is_path) = match a.as_str() {
            "--ticket" => ("ticket_key", false),
            "--tickets" => ("tickets", true),
            "--repo" => ("repo", true),
            "--remote" => ("remote", false),
            "--out" => ("out", true),
            other => {
                return Err(format!(
                    "unknown argument `{other}` (ticket-to-pr takes --ticket KEY --tickets DIR --repo DIR [--remote R] [--out DIR])"
                ))
            }
        };
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        let v = if is_path || (field == "remote" && Path::new(v).exists()) {
            absolute(v)
        } else {
            v.clone()
        };
        input.insert(field.into(), json!(v));
    }
    for (field, flag) in [
        ("ticket_key", "--ticket KEY"),
        ("tickets", "--tickets DIR"),
        ("repo", "--repo DIR"),
    ] {
        if !input.contains_key(field) {
            return Err(format!("ticket-to-pr needs {flag}"));
        }
    }
    Ok(Value::Object(input))
}

const INPUT_PATHS: &[ferrograph::runtime::InputPath] = &[
    ferrograph::runtime::InputPath::read("tickets"),
    ferrograph::runtime::InputPath::read("repo"),
    ferrograph::runtime::InputPath::output("out"),
];

/// Loads the workflow into `runtime` with `saver` and adds it and its metrics to `registry`.
pub async fn register(
    registry: &mut ferrograph::Registry,
    runtime: &Runtime,
    saver: Arc<dyn CheckpointSaver>,
    settings: &WorkflowSettings,
) -> Result<(), ferrograph::RegistryError> {
    register_with(
        registry,
        runtime,
        saver,
        TicketPrSettings::from_workflow_settings(settings),
    )
    .await
}

/// [`register`] with the workflow's own settings (tests swap the model and the embedder).
pub async fn register_with(
    registry: &mut ferrograph::Registry,
    runtime: &Runtime,
    saver: Arc<dyn CheckpointSaver>,
    settings: TicketPrSettings,
) -> Result<(), ferrograph::RegistryError> {
    let wf = runtime
        .load(graph(settings)?)
        .await?
        .with_checkpointer(saver);
    registry.insert(
        NAME,
        ferrograph::Entry {
            workflow: Arc::new(wf),
            description: "ticket to pull request on a local git repository: classify, modules, retrieval, changes and tests, a review gate with revisions, then branch, commits, PR record and ticket comment",
            parse_input,
            sample_input,
            parse_args: Some(parse_args),
            input_paths: INPUT_PATHS,
        },
    );
    registry.add_metrics(Arc::new(metrics::render));
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn gate_answers() {
        assert_eq!(
            GateAnswer::from_json(&json!("approve")),
            Ok(GateAnswer::Approve)
        );
        assert_eq!(
            GateAnswer::from_json(&json!(" Reject ")),
            Ok(GateAnswer::Reject)
        );
        assert_eq!(
            GateAnswer::from_json(&json!("use a guard clause")),
            Ok(GateAnswer::Feedback("use a guard clause".into()))
        );
        assert_eq!(
            GateAnswer::from_json(&json!({"feedback": "more tests"})),
            Ok(GateAnswer::Feedback("more tests".into()))
        );
        assert_eq!(
            GateAnswer::from_json(&json!({"decision": "approve"})),
            Ok(GateAnswer::Approve)
        );
        for bad in [
            json!(""),
            json!(3),
            json!({"decision": "maybe"}),
            json!({"feedback": " "}),
        ] {
            assert!(GateAnswer::from_json(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn test_paths_follow_the_layout() {
        assert_eq!(
            test_path_for("core/src/main/java/a/TaskService.java").unwrap(),
            "core/src/test/java/a/TaskServiceTest.java"
        );
        assert_eq!(
            test_path_for("pkg/src/util.py").unwrap(),
            "pkg/tests/test_util.py"
        );
    }

    #[test]
    fn args_need_ticket_tickets_and_repo() {
        let a = |v: &[&str]| parse_args(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(a(&["--ticket", "T-1"]).unwrap_err().contains("--tickets"));
        assert!(a(&["--bogus", "x"])
            .unwrap_err()
            .contains("unknown argument"));
        let v = a(&["--ticket", "T-1", "--tickets", "t", "--repo", "r"]).unwrap();
        assert!(Path::new(v["repo"].as_str().unwrap()).is_absolute());
    }
}
