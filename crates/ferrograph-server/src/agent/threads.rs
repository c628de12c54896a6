//! Threads as the Agent Server API shows them: created without a graph (the first run binds
//! one), searched, patched, copied; their state at a checkpoint in LangGraph's shape
//! (`checkpoint`, `parent_checkpoint`, `metadata`, `tasks` with their interrupts) alongside
//! ours, and their history.

use super::{iso, metadata_in, metadata_matches, metadata_out, page, unsupported};
use crate::api::{check_thread_id, load_thread, reconcile, workflow_of};
use crate::error::{ApiError, ApiJson};
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use ferrograph::core::id::now_millis;
use ferrograph::runtime::JsonSnapshot;
use ferrograph::{Interrupt, ThreadInfo, ThreadStatus};
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// A thread's status in the Agent Server API's words: `busy` (a run is on it), `interrupted`
/// (waiting for an answer), `error` (its last run failed, or was cut off by a crash) or
/// `idle`.
pub(crate) fn lg_status(info: &ThreadInfo, active: bool) -> &'static str {
    if active {
        return "busy";
    }
    match info.status {
        ThreadStatus::Interrupted => "interrupted",
        // A run stopped on request (a cancel) is not an error: the thread rests at its last
        // step, as LangGraph's server shows it.
        ThreadStatus::Failed
            if info.error.as_deref() == Some(&ferrograph::RunError::Cancelled.to_string()) =>
        {
            "idle"
        }
        ThreadStatus::Failed => "error",
        // Cut off mid-run (the process running it was killed): not finished, and not
        // running; a run with no input continues it.
        ThreadStatus::Running if ferrograph::runtime::owner::is_orphaned(info, false) => "error",
        ThreadStatus::Running => "busy",
        _ => "idle",
    }
}

/// An interrupt as the SDKs read it (`value`, `id`), with ours (`node`, `task_id`).
pub(crate) fn interrupt_json(i: &Interrupt) -> Value {
    json!({ "value": i.value, "id": i.id, "node": i.node, "task_id": i.task_id })
}

/// Interrupts by task, as a thread shows them.
pub(crate) fn interrupts_by_task(list: &[Interrupt]) -> Value {
    let mut map = Map::new();
    for i in list {
        let entry = map
            .entry(i.task_id.clone())
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(a) = entry {
            a.push(interrupt_json(i));
        }
    }
    Value::Object(map)
}

fn checkpoint_ref(thread: &str, id: &str) -> Value {
    json!({ "thread_id": thread, "checkpoint_ns": "", "checkpoint_id": id, "checkpoint_map": null })
}

/// A snapshot in both shapes: ours (`checkpoint_id`, `parent_id`, `step`, `source`,
/// `writers`, `created_at_ms`) and LangGraph's (`checkpoint`, `parent_checkpoint`, `metadata`,
/// `created_at`, `tasks` with `name`, `interrupts`, `state`, `result`).
pub(crate) fn state_view(thread: &str, graph: &str, s: &JsonSnapshot) -> Value {
    let tasks: Vec<Value> = s
        .tasks
        .iter()
        .map(|t| {
            let interrupts: Vec<Value> = s
                .interrupts
                .iter()
                .filter(|i| i.task_id == t.id)
                .map(interrupt_json)
                .collect();
            json!({
                "id": t.id, "name": t.node, "node": t.node, "finished": t.finished,
                "error": t.error, "interrupts": interrupts, "checkpoint": null,
                "state": null, "result": null,
            })
        })
        .collect();
    json!({
        "values": if s.values.is_null() { json!({}) } else { presented(&s.values) },
        "next": s.next,
        "checkpoint_id": s.checkpoint_id,
        "parent_id": s.parent_id,
        "step": s.step,
        "source": s.source,
        "writers": s.writers,
        "created_at_ms": s.created_at_ms,
        "interrupts": s.interrupts.iter().map(interrupt_json).collect::<Vec<_>>(),
        "tasks": tasks,
        "checkpoint": checkpoint_ref(thread, &s.checkpoint_id),
        "parent_checkpoint": s.parent_id.as_deref().map(|p| checkpoint_ref(thread, p)),
        "metadata": {
            "step": s.step, "source": s.source, "writers": s.writers,
            "thread_id": thread, "graph_id": graph,
        },
        "created_at": iso(s.created_at_ms),
    })
}

/// `values` with our messages dressed for LangChain's clients.
fn presented(values: &Value) -> Value {
    let mut v = values.clone();
    super::messages::present(&mut v);
    v
}

/// The state of a thread with no checkpoint yet.
pub(crate) fn empty_state(thread: &str) -> Value {
    json!({
        "values": {}, "next": [], "checkpoint_id": null, "parent_id": null, "step": 0,
        "source": null, "writers": [], "created_at_ms": null, "interrupts": [], "tasks": [],
        "checkpoint": { "thread_id": thread, "checkpoint_ns": "", "checkpoint_id": null, "checkpoint_map": null },
        "parent_checkpoint": null, "metadata": {}, "created_at": null,
    })
}

/// The thread's current values (`{}` before its first checkpoint or while unbound).
pub(crate) async fn current_values(state: &AppState, info: &ThreadInfo) -> Value {
    if info.graph.is_empty() || info.last_checkpoint_id.is_none() {
        return json!({});
    }
    let Ok(wf) = workflow_of(state, info) else {
        return json!({});
    };
    match wf.get_state(&info.thread_id, None).await {
        Ok(mut s) if !s.values.is_null() => {
            super::messages::present(&mut s.values);
            s.values
        }
        _ => json!({}),
    }
}

/// The thread in both shapes, with its values.
pub(crate) async fn thread_full(state: &AppState, info: &ThreadInfo) -> Value {
    let mut v = crate::api::thread_view(state, info);
    v["values"] = current_values(state, info).await;
    v
}

#[derive(Deserialize)]
pub(crate) struct CreateBody {
    #[serde(default)]
    thread_id: Option<String>,
    #[serde(default)]
    metadata: Value,
    #[serde(default)]
    if_exists: Option<String>,
    #[serde(default)]
    graph_id: Option<String>,
    #[serde(default)]
    supersteps: Option<Value>,
    #[serde(default)]
    ttl: Option<Value>,
}

/// `POST /threads` without `workflow`: a thread, bound to `graph_id` when given, else to the
/// graph of its first run.
pub(crate) async fn create(state: &AppState, body: Value) -> Result<Json<Value>, ApiError> {
    let body: CreateBody = serde_json::from_value(body)
        .map_err(|e| ApiError::invalid_body(format!("not a thread to create: {e}")))?;
    if body.supersteps.as_ref().is_some_and(|s| !s.is_null()) {
        return Err(unsupported(
            "creating a thread with `supersteps`",
            "create it, then POST its state",
        ));
    }
    if body.ttl.as_ref().is_some_and(|s| !s.is_null()) {
        return Err(unsupported(
            "a thread `ttl`",
            "threads are kept until deleted (DELETE /threads/{id}, `ferrograph threads prune`)",
        ));
    }
    let graph = match body.graph_id.filter(|g| !g.is_empty()) {
        Some(g) => {
            let a = state.assistant(&g).await?;
            a.graph_id
        }
        None => String::new(),
    };
    let id = match body.thread_id {
        Some(id) => {
            check_thread_id(&id)?;
            id
        }
        None => uuid::Uuid::now_v7().to_string(),
    };
    let saver = &state.inner.saver;
    if let Some(existing) = saver.get_thread(&id).await? {
        return match body.if_exists.as_deref() {
            Some("do_nothing") => Ok(Json(thread_full(state, &existing).await)),
            _ => Err(ApiError::new(
                StatusCode::CONFLICT,
                "thread_exists",
                format!("thread `{id}` already exists"),
            )),
        };
    }
    if state.is_active(&id) {
        return Err(ApiError::thread_busy(&id));
    }
    let mut info = ThreadInfo::new(id, graph);
    info.status = ThreadStatus::Done;
    info.metadata = metadata_in(&body.metadata)?;
    saver.put_thread(info.clone()).await?;
    saver.flush().await?;
    Ok(Json(thread_full(state, &info).await))
}

#[derive(Deserialize)]
pub(crate) struct PatchBody {
    #[serde(default)]
    metadata: Value,
}

pub(crate) async fn patch(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<PatchBody>,
) -> Result<Json<Value>, ApiError> {
    let guard = state.claim(&id)?;
    let mut info = load_thread(&state, &id).await?;
    info.metadata.extend(metadata_in(&body.metadata)?);
    info.updated_at_ms = now_millis();
    state.inner.saver.put_thread(info.clone()).await?;
    state.inner.saver.flush().await?;
    drop(guard);
    Ok(Json(thread_full(&state, &info).await))
}

#[derive(Deserialize, Default)]
pub(crate) struct SearchBody {
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    values: Option<Value>,
    #[serde(default)]
    ids: Option<Vec<String>>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    offset: Option<i64>,
    #[serde(default)]
    sort_by: Option<String>,
    #[serde(default)]
    sort_order: Option<String>,
}

async fn matching(state: &AppState, body: &SearchBody) -> Result<Vec<ThreadInfo>, ApiError> {
    if let Some(s) = body.status.as_deref() {
        if !matches!(s, "idle" | "busy" | "interrupted" | "error") {
            return Err(ApiError::invalid_body(format!(
                "status must be idle, busy, interrupted or error, not `{s}`"
            )));
        }
    }
    let mut out = Vec::new();
    for r in state.inner.saver.list_threads(None).await? {
        let r = reconcile(state, r).await;
        let active = state.is_active(&r.thread_id);
        if body
            .status
            .as_deref()
            .is_some_and(|s| lg_status(&r, active) != s)
            || body
                .ids
                .as_ref()
                .is_some_and(|ids| !ids.contains(&r.thread_id))
            || body
                .metadata
                .as_ref()
                .is_some_and(|m| !metadata_matches(&metadata_out(&r.metadata), m))
        {
            continue;
        }
        if let Some(want) = &body.values {
            if !metadata_matches(&current_values(state, &r).await, want) {
                continue;
            }
        }
        out.push(r);
    }
    let key = body.sort_by.as_deref().unwrap_or("created_at");
    out.sort_by(|a, b| {
        match key {
            "thread_id" => a.thread_id.cmp(&b.thread_id),
            "updated_at" => a.updated_at_ms.cmp(&b.updated_at_ms),
            "status" => a.status.as_str().cmp(b.status.as_str()),
            _ => a.created_at_ms.cmp(&b.created_at_ms),
        }
        .then_with(|| a.thread_id.cmp(&b.thread_id))
    });
    if body.sort_order.as_deref() != Some("asc") {
        out.reverse();
    }
    Ok(out)
}

pub(crate) async fn search(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<SearchBody>,
) -> Result<Json<Value>, ApiError> {
    let (limit, offset) = page(body.limit, body.offset)?;
    let list = matching(&state, &body).await?;
    let mut items = Vec::new();
    for r in list.iter().skip(offset).take(limit) {
        items.push(thread_full(&state, r).await);
    }
    Ok(Json(Value::Array(items)))
}

pub(crate) async fn count(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<SearchBody>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(matching(&state, &body).await?.len())))
}

/// `POST /threads/{id}/copy`: a new thread with the same graph, metadata and state (its newest
/// checkpoint, copied; the history is not).
pub(crate) async fn copy(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let info = load_thread(&state, &id).await?;
    let new_id = uuid::Uuid::now_v7().to_string();
    let guard = state.claim(&new_id)?;
    let saver = &state.inner.saver;
    let mut copy = ThreadInfo::new(new_id.clone(), info.graph.clone());
    if let (false, Some(cp)) = (info.graph.is_empty(), info.last_checkpoint_id.as_deref()) {
        let wf = workflow_of(&state, &info)?;
        let new_cp = wf.fork(&id, cp, &new_id).await?;
        copy.last_checkpoint_id = Some(new_cp);
    }
    copy.status = match info.status {
        ThreadStatus::Running => ThreadStatus::Done,
        s => s,
    };
    copy.interrupts = info.interrupts.clone();
    copy.error = info.error.clone();
    copy.metadata = info.metadata.clone();
    // The source's last run is not the copy's.
    copy.metadata.remove(super::runs::RUN_KEY);
    copy.metadata
        .insert("copied_from".into(), info.thread_id.clone());
    saver.put_thread(copy.clone()).await?;
    saver.flush().await?;
    drop(guard);
    Ok(Json(thread_full(&state, &copy).await))
}

/// A snapshot of a bound thread at `checkpoint` (the newest when `None`), in both shapes.
pub(crate) async fn snapshot(
    state: &AppState,
    info: &ThreadInfo,
    checkpoint: Option<&str>,
) -> Result<Value, ApiError> {
    let id = info.thread_id.as_str();
    if info.graph.is_empty() {
        return match checkpoint {
            None => Ok(empty_state(id)),
            Some(c) => Err(checkpoint_not_found(id, c)),
        };
    }
    let wf = workflow_of(state, info)?;
    if checkpoint.is_none() && info.last_checkpoint_id.is_none() {
        if let Ok(None) = state.inner.saver.get(id, None).await {
            return Ok(empty_state(id));
        }
    }
    match wf.get_state(id, checkpoint).await {
        Ok(s) => Ok(state_view(id, &info.graph, &s)),
        Err(ferrograph::RunError::ThreadNotFound(_)) if checkpoint.is_none() => Ok(empty_state(id)),
        Err(ferrograph::RunError::Checkpoint(ferrograph::CheckpointError::NotFound {
            checkpoint,
            ..
        })) => Err(checkpoint_not_found(id, &checkpoint)),
        Err(ferrograph::RunError::ThreadNotFound(_)) => {
            Err(checkpoint_not_found(id, checkpoint.unwrap_or("")))
        }
        Err(e) => Err(e.into()),
    }
}

fn checkpoint_not_found(thread: &str, checkpoint: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "checkpoint_not_found",
        format!("thread `{thread}` has no checkpoint `{checkpoint}`"),
    )
}

/// `GET /threads/{id}/state/{checkpoint_id}`.
pub(crate) async fn state_at(
    State(state): State<AppState>,
    Path((id, checkpoint)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let info = load_thread(&state, &id).await?;
    Ok(Json(snapshot(&state, &info, Some(&checkpoint)).await?))
}

/// A checkpoint named by the SDKs: an id, or `{"checkpoint_id": …, "checkpoint_ns": …}`.
pub(crate) fn checkpoint_id_of(v: &Value) -> Result<Option<String>, ApiError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s.is_empty() => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        Value::Object(m) => {
            if let Some(ns) = m.get("checkpoint_ns").and_then(Value::as_str) {
                if !ns.is_empty() {
                    return Err(unsupported(
                        "a subgraph checkpoint namespace",
                        "subgraph states are read through their parent thread",
                    ));
                }
            }
            Ok(m.get("checkpoint_id")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string))
        }
        _ => Err(ApiError::invalid_body(
            "a checkpoint is an id or an object with `checkpoint_id`",
        )),
    }
}

#[derive(Deserialize)]
pub(crate) struct StateAtBody {
    #[serde(default)]
    checkpoint: Value,
}

/// `POST /threads/{id}/state/checkpoint`.
pub(crate) async fn state_at_checkpoint(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<StateAtBody>,
) -> Result<Json<Value>, ApiError> {
    let info = load_thread(&state, &id).await?;
    let cp = checkpoint_id_of(&body.checkpoint)?;
    Ok(Json(snapshot(&state, &info, cp.as_deref()).await?))
}

#[derive(Deserialize)]
pub(crate) struct HistoryBody {
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    before: Value,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    checkpoint: Value,
}

/// `POST /threads/{id}/history`: states newest first, LangGraph's shape.
pub(crate) async fn history(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<HistoryBody>,
) -> Result<Json<Value>, ApiError> {
    let (limit, _) = page(body.limit, None)?;
    let info = load_thread(&state, &id).await?;
    // A subgraph namespace is refused here; a root checkpoint starts the listing at it.
    let from = checkpoint_id_of(&body.checkpoint)?;
    let before = checkpoint_id_of(&body.before)?;
    if info.graph.is_empty() {
        return Ok(Json(json!([])));
    }
    let wf = workflow_of(&state, &info)?;
    let list = match wf.history(&id).await {
        Ok(l) => l,
        Err(ferrograph::RunError::ThreadNotFound(_)) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let mut started = from.is_none() && before.is_none();
    let mut out = Vec::new();
    for s in &list {
        if !started {
            if from.as_deref() == Some(s.checkpoint_id.as_str()) {
                started = true;
            } else if before.as_deref() == Some(s.checkpoint_id.as_str()) {
                started = true;
                continue;
            } else {
                continue;
            }
        }
        let v = state_view(&id, &info.graph, s);
        if body
            .metadata
            .as_ref()
            .is_some_and(|m| !metadata_matches(&v["metadata"], m))
        {
            continue;
        }
        out.push(v);
        if out.len() >= limit {
            break;
        }
    }
    Ok(Json(Value::Array(out)))
}

/// The body of `POST /threads/{id}/state`, both APIs: `values` and `as_node`, and for the
/// Agent Server API a checkpoint to branch from.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateBody {
    pub(crate) values: Value,
    #[serde(default)]
    pub(crate) as_node: Option<String>,
    #[serde(default)]
    pub(crate) checkpoint_id: Option<String>,
    #[serde(default)]
    pub(crate) checkpoint: Value,
}

/// The highlight of a thread's path: the nodes of each superstep (the writers of its
/// checkpoints, oldest first) and the nodes planned next.
pub(crate) async fn path_of(
    state: &AppState,
    info: &ThreadInfo,
) -> Result<(Vec<Vec<String>>, Vec<String>), ApiError> {
    if info.graph.is_empty() || info.last_checkpoint_id.is_none() {
        return Ok((Vec::new(), Vec::new()));
    }
    let wf = workflow_of(state, info)?;
    let list = match wf.history(&info.thread_id).await {
        Ok(l) => l,
        Err(ferrograph::RunError::ThreadNotFound(_)) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    Ok(ferrograph::runtime::path_of(&list))
}
