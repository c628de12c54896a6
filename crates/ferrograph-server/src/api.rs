//! The JSON API's handlers.

use crate::agent;
use crate::error::{ApiError, ApiJson};
use crate::runs;
use crate::AppState;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use ferrograph::runtime::{Entry, JsonInput, Workflow};
use ferrograph::{Resume, StreamMode, StreamModes, ThreadInfo, ThreadStatus};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::{BroadcastStream, ReceiverStream};

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/workflows", get(workflows))
        .route("/threads", get(list_threads).post(create_thread))
        .route(
            "/threads/{id}",
            get(get_thread)
                .delete(delete_thread)
                .patch(agent::threads::patch),
        )
        .route("/threads/{id}/state", get(get_state).post(update_state))
        .route(
            "/threads/{id}/history",
            get(history).post(agent::threads::history),
        )
        .route(
            "/threads/{id}/runs",
            get(agent::runs::list).post(create_run),
        )
        .route("/threads/{id}/events", get(thread_events))
        .merge(agent_routes())
}

/// The Agent Server API's routes that are not shared with ours.
fn agent_routes() -> Router<AppState> {
    use axum::routing::{delete, post};
    Router::new()
        .route("/info", get(agent::info))
        .route("/ok", get(agent::ok))
        .route("/assistants", post(agent::assistants::create))
        .route("/assistants/search", post(agent::assistants::search))
        .route("/assistants/count", post(agent::assistants::count))
        .route(
            "/assistants/{id}",
            get(agent::assistants::get)
                .patch(agent::assistants::patch)
                .delete(agent::assistants::delete),
        )
        .route("/assistants/{id}/graph", get(agent::assistants::graph))
        .route("/assistants/{id}/schemas", get(agent::assistants::schemas))
        .route(
            "/assistants/{id}/subgraphs",
            get(agent::assistants::subgraphs),
        )
        .route(
            "/assistants/{id}/subgraphs/{ns}",
            get(agent::assistants::subgraphs_ns),
        )
        .route(
            "/assistants/{id}/versions",
            post(agent::assistants::versions),
        )
        .route(
            "/assistants/{id}/latest",
            post(agent::assistants::set_latest),
        )
        .route("/workflows/{name}/graph", get(workflow_graph))
        .route("/threads/{id}/graph", get(thread_graph))
        .route("/threads/search", post(agent::threads::search))
        .route("/threads/count", post(agent::threads::count))
        .route("/threads/{id}/copy", post(agent::threads::copy))
        .route(
            "/threads/{id}/state/checkpoint",
            post(agent::threads::state_at_checkpoint),
        )
        .route(
            "/threads/{id}/state/{checkpoint}",
            get(agent::threads::state_at),
        )
        .route("/threads/{id}/runs/wait", post(agent::runs::wait_on_thread))
        .route(
            "/threads/{id}/runs/stream",
            post(agent::runs::stream_on_thread),
        )
        .route(
            "/threads/{id}/runs/{run}",
            get(agent::runs::get).delete(agent::runs::delete),
        )
        .route("/threads/{id}/runs/{run}/join", get(agent::runs::join))
        .route(
            "/threads/{id}/runs/{run}/stream",
            get(agent::runs::join_stream),
        )
        .route("/threads/{id}/runs/{run}/cancel", post(agent::runs::cancel))
        .route("/runs", post(agent::runs::create_stateless))
        .route("/runs/wait", post(agent::runs::wait_stateless))
        .route("/runs/stream", post(agent::runs::stream_stateless))
        .route("/runs/cancel", post(agent::runs::cancel_many))
        .route(
            "/store/items",
            get(agent::store::get_item)
                .put(agent::store::put_item)
                .delete(agent::store::delete_item),
        )
        .route("/store/items/search", post(agent::store::search))
        .route("/store/namespaces", post(agent::store::namespaces))
        .route("/threads/{id}/runs/crons", post(agent::unsupported_crons))
        .route("/runs/crons", post(agent::unsupported_crons))
        .route("/runs/crons/search", post(agent::unsupported_crons))
        .route("/runs/crons/{id}", delete(agent::unsupported_crons))
}

pub(crate) fn check_thread_id(id: &str) -> Result<(), ApiError> {
    ferrograph::core::id::check_thread_id(id).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_thread_id",
            format!(
                "{e} (thread ids are 1 to {} characters of A-Z a-z 0-9 - _ . : and do not start with a dot)",
                ferrograph::core::id::MAX_THREAD_ID
            ),
        )
    })
}

/// The status shown for a thread: `idle` for a thread created through the API that has not run
/// yet (stored as `done` without a checkpoint, since thread records have no idle status).
pub(crate) fn view_status(info: &ThreadInfo, active: bool) -> &'static str {
    if active {
        // A run is in progress here; the stored record catches up once its input is accepted.
        "running"
    } else if ferrograph::runtime::owner::is_orphaned(info, false) {
        // Recorded as running, but no run of this server (the only process that can hold the
        // store) is on it: its process ended mid-run. A run with no input continues it.
        "orphaned"
    } else if info.status == ThreadStatus::Done && info.last_checkpoint_id.is_none() {
        "idle"
    } else {
        info.status.as_str()
    }
}

pub(crate) fn thread_view(state: &AppState, info: &ThreadInfo) -> Value {
    let active = state.is_active(&info.thread_id);
    let status = view_status(info, active);
    json!({
        "thread_id": info.thread_id,
        // The Agent Server API's fields.
        "status": crate::agent::threads::lg_status(info, active),
        "interrupts": crate::agent::threads::interrupts_by_task(&info.interrupts),
        "created_at": crate::agent::iso(info.created_at_ms),
        "updated_at": crate::agent::iso(info.updated_at_ms),
        "metadata": crate::agent::metadata_out(&info.metadata),
        "config": {},
        // Ours.
        "workflow": info.graph,
        "run_status": status,
        "active": active,
        "pending_interrupts": info.interrupts,
        "created_at_ms": info.created_at_ms,
        "updated_at_ms": info.updated_at_ms,
        "last_checkpoint_id": info.last_checkpoint_id,
        "error": info.error,
        "hint": (status == "orphaned").then(|| format!(
            "the process running this thread ended mid-run; POST /threads/{}/runs with no input (or `ferrograph resume {}`) continues it from its last checkpoint",
            info.thread_id, info.thread_id
        )),
    })
}

/// The thread's record, made to agree with its newest checkpoint. A record that says the
/// thread waits for an answer, or runs, while no run of this server is on it is checked
/// against the checkpoint: its open interrupts are what is waiting (a crash can come between
/// the checkpoint and the record), and with none open the thread was cut off mid-run. A
/// corrected record is written back, so the two agree from then on.
pub(crate) async fn reconcile(state: &AppState, mut info: ThreadInfo) -> ThreadInfo {
    let claims = matches!(
        info.status,
        ThreadStatus::Interrupted | ThreadStatus::Running
    );
    if !claims || state.is_active(&info.thread_id) || state.was_reconciled(&info.thread_id) {
        return info;
    }
    let Ok(wf) = workflow_of(state, &info) else {
        return info;
    };
    let Ok(snap) = wf.get_state(&info.thread_id, None).await else {
        return info;
    };
    // From here on this process writes the record and the checkpoints together (only a crash
    // separates them), so one check per thread is enough: listing and reading threads do not
    // load every checkpoint again.
    state.mark_reconciled(&info.thread_id);
    let (status, interrupts) = if snap.interrupts.is_empty() {
        (ThreadStatus::Running, Vec::new())
    } else {
        (ThreadStatus::Interrupted, snap.interrupts)
    };
    let ids = |v: &[ferrograph::Interrupt]| v.iter().map(|i| i.id.clone()).collect::<Vec<_>>();
    if status == info.status && ids(&interrupts) == ids(&info.interrupts) {
        return info;
    }
    tracing::warn!(
        thread = %info.thread_id,
        recorded = %info.status,
        derived = %status,
        "the thread record disagreed with its checkpoint; corrected from the checkpoint"
    );
    info.status = status;
    info.interrupts = interrupts;
    if !snap.checkpoint_id.is_empty() {
        info.last_checkpoint_id = Some(snap.checkpoint_id);
    }
    let saver = &state.inner.saver;
    if let Ok(guard) = state.claim(&info.thread_id) {
        let written = match saver.put_thread(info.clone()).await {
            Ok(()) => saver.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            tracing::error!(thread = %info.thread_id, error = %e, "could not correct the thread record");
        }
        drop(guard);
    }
    info
}

pub(crate) async fn load_thread(state: &AppState, id: &str) -> Result<ThreadInfo, ApiError> {
    let info = state
        .inner
        .saver
        .get_thread(id)
        .await?
        .ok_or_else(|| ApiError::thread_not_found(id))?;
    Ok(reconcile(state, info).await)
}

pub(crate) fn workflow_of(
    state: &AppState,
    info: &ThreadInfo,
) -> Result<Arc<dyn Workflow>, ApiError> {
    entry_of(state, info).map(|e| e.workflow.clone())
}

pub(crate) fn entry_of<'a>(state: &'a AppState, info: &ThreadInfo) -> Result<&'a Entry, ApiError> {
    let reg = &state.inner.registry;
    if info.graph.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "thread_unbound",
            format!(
                "thread `{}` has no graph yet: its first run names one (`assistant_id`)",
                info.thread_id
            ),
        ));
    }
    if let Some(e) = reg.get(&info.graph) {
        return Ok(e);
    }
    reg.iter()
        .find(|(_, e)| e.workflow.info().name == info.graph)
        .map(|(_, e)| e)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "workflow_not_loaded",
                format!(
                    "thread `{}` belongs to workflow `{}`, which this server does not serve",
                    info.thread_id, info.graph
                ),
            )
        })
}

async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

async fn openapi(State(state): State<AppState>) -> Json<Value> {
    let mut samples = Vec::new();
    let mut nodes = Vec::new();
    for (name, entry) in state.inner.registry.iter() {
        samples.push((name.clone(), (entry.sample_input)()));
        nodes.extend(entry.workflow.info().nodes);
    }
    nodes.sort();
    nodes.dedup();
    Json(crate::openapi::document(&samples, &nodes))
}

async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let records = state.inner.saver.list_threads(None).await?;
    let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
    let mut pending = 0u64;
    for r in &records {
        *by_status
            .entry(view_status(r, state.is_active(&r.thread_id)).to_string())
            .or_default() += 1;
        if r.status == ThreadStatus::Interrupted {
            pending += r.interrupts.len() as u64;
        }
    }
    let mut text = state
        .inner
        .metrics
        .render(&by_status, pending, state.active_runs());
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&state.inner.registry.render_metrics());
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str("# EOF\n");
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        )],
        text,
    )
        .into_response())
}

async fn workflows(State(state): State<AppState>) -> Json<Value> {
    let list: Vec<Value> = state
        .inner
        .registry
        .iter()
        .map(|(name, e)| {
            let info = e.workflow.info();
            json!({
                "name": name,
                "graph": info.name,
                "description": e.description,
                "nodes": info.nodes,
                "mermaid": info.mermaid,
                "sample_input": (e.sample_input)(),
            })
        })
        .collect();
    Json(json!({ "workflows": list }))
}

#[derive(Deserialize)]
struct GraphQuery {
    format: Option<String>,
}

/// A picture in the format asked for: `svg` (the default), `mermaid` or `json` (LangGraph's).
fn picture(
    drawing: &ferrograph::core::drawing::GraphDrawing,
    highlight: Option<&ferrograph::core::drawing::Highlight>,
    format: Option<&str>,
) -> Result<Response, ApiError> {
    let typed = |ct: &'static str, body: String| {
        ([(header::CONTENT_TYPE, HeaderValue::from_static(ct))], body).into_response()
    };
    Ok(match format.unwrap_or("svg") {
        "svg" => typed("image/svg+xml", drawing.to_svg(highlight)),
        "mermaid" => typed("text/plain; charset=utf-8", drawing.to_mermaid(highlight)),
        "json" => Json(drawing.to_langgraph_json()).into_response(),
        other => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                format!("format is svg, mermaid or json, not `{other}`"),
            ))
        }
    })
}

/// `GET /workflows/{name}/graph?format=svg|mermaid|json`: the workflow's graph.
async fn workflow_graph(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<GraphQuery>,
) -> Result<Response, ApiError> {
    let entry = state.inner.registry.get(&name).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "workflow_not_found",
            format!("no workflow `{name}`"),
        )
    })?;
    picture(&entry.workflow.info().drawing, None, q.format.as_deref())
}

/// `GET /threads/{id}/graph?format=svg|mermaid|json`: the thread's graph with the path taken
/// and the node that runs (or waits) now highlighted.
async fn thread_graph(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<GraphQuery>,
) -> Result<Response, ApiError> {
    let info = load_thread(&state, &id).await?;
    let entry = entry_of(&state, &info)?;
    let drawing = entry.workflow.info().drawing;
    let (steps, mut next) = agent::threads::path_of(&state, &info).await?;
    if let Some(running) = state.running_nodes(&id) {
        next = running;
    }
    let h = ferrograph::core::drawing::Highlight::from_steps(&drawing, &steps, &next);
    picture(&drawing, Some(&h), q.format.as_deref())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateThread {
    workflow: String,
    #[serde(default)]
    thread_id: Option<String>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
}

/// `POST /threads`: ours when the body names a `workflow`, the Agent Server API's otherwise.
async fn create_thread(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    if body.get("workflow").is_none_or(Value::is_null) {
        let created = crate::agent::threads::create(&state, body).await?;
        let id = created["thread_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let mut resp = (StatusCode::CREATED, created).into_response();
        if let Ok(loc) = HeaderValue::from_str(&format!("/threads/{id}")) {
            resp.headers_mut().insert(header::LOCATION, loc);
        }
        return Ok(resp);
    }
    let body: CreateThread = serde_json::from_value(body)
        .map_err(|e| ApiError::invalid_body(format!("not a thread to create: {e}")))?;
    if state.inner.registry.get(&body.workflow).is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "workflow_not_found",
            format!(
                "no workflow `{}` (available: {})",
                body.workflow,
                state.inner.registry.names().join(", ")
            ),
        ));
    }
    let id = match body.thread_id {
        Some(id) => {
            check_thread_id(&id)?;
            id
        }
        None => ferrograph::core::id::random_id(),
    };
    let saver = &state.inner.saver;
    if saver.get_thread(&id).await?.is_some() || state.is_active(&id) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "thread_exists",
            format!("thread `{id}` already exists"),
        ));
    }
    let mut info = ThreadInfo::new(id.clone(), body.workflow);
    info.status = ThreadStatus::Done;
    info.metadata = body.metadata;
    saver.put_thread(info.clone()).await?;
    // Acknowledged means durable: a 201 for a thread that a crash then loses would let a
    // client act on a thread that does not exist.
    saver.flush().await?;
    let mut resp = (StatusCode::CREATED, Json(thread_view(&state, &info))).into_response();
    if let Ok(loc) = HeaderValue::from_str(&format!("/threads/{id}")) {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(resp)
}

#[derive(Deserialize)]
struct ListQuery {
    status: Option<String>,
    workflow: Option<String>,
    limit: Option<String>,
}

async fn list_threads(
    State(state): State<AppState>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", m);
    // Filtered on the status as shown (a thread with a run in progress shows as running even
    // before its stored record says so), so every record is read.
    let wanted_view: Option<&str> = match q.status.as_deref() {
        None | Some("") => None,
        Some("idle") => Some("idle"),
        Some("orphaned") => Some("orphaned"),
        Some(s) => {
            let st: ThreadStatus = s
                .parse()
                .map_err(|e: String| bad(format!("{e}, or idle")))?;
            Some(st.as_str())
        }
    };
    let limit = match q.limit.as_deref() {
        None | Some("") => usize::MAX,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| bad(format!("limit must be a positive integer, not `{l}`")))?,
    };
    let mut records = Vec::new();
    for r in state.inner.saver.list_threads(None).await? {
        records.push(reconcile(&state, r).await);
    }
    records.retain(|r| {
        wanted_view.is_none_or(|w| view_status(r, state.is_active(&r.thread_id)) == w)
            && q.workflow
                .as_deref()
                .is_none_or(|w| w.is_empty() || r.graph == w)
    });
    records.sort_by(|a, b| {
        b.updated_at_ms
            .cmp(&a.updated_at_ms)
            .then_with(|| a.thread_id.cmp(&b.thread_id))
    });
    let total = records.len();
    let threads: Vec<Value> = records
        .iter()
        .take(limit)
        .map(|r| thread_view(&state, r))
        .collect();
    Ok(Json(json!({ "threads": threads, "total": total })))
}

async fn get_thread(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let info = load_thread(&state, &id).await?;
    Ok(Json(agent::threads::thread_full(&state, &info).await))
}

async fn delete_thread(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let guard = state.claim(&id)?;
    let existed = state.inner.saver.delete_thread(&id).await?;
    // A 204 promises the thread stays gone after a crash.
    state.inner.saver.flush().await?;
    drop(guard);
    if !existed {
        return Err(ApiError::thread_not_found(&id));
    }
    state.release_live(&id, true);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct StateQuery {
    checkpoint_id: Option<String>,
}

/// `GET /threads/{id}/state`: the newest snapshot (or the one at `?checkpoint_id=`), in both
/// APIs' shapes.
async fn get_state(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<StateQuery>,
) -> Result<Json<Value>, ApiError> {
    let info = load_thread(&state, &id).await?;
    let checkpoint = q.checkpoint_id.filter(|c| !c.is_empty());
    Ok(Json(
        crate::agent::threads::snapshot(&state, &info, checkpoint.as_deref()).await?,
    ))
}

/// `POST /threads/{id}/state`: edits the state as node `as_node` (or as input); with a
/// checkpoint (the Agent Server API's `checkpoint_id` or `checkpoint`), on a branch from it.
/// Answers the new checkpoint in both shapes.
async fn update_state(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(mut body): ApiJson<crate::agent::threads::UpdateBody>,
) -> Result<Json<Value>, ApiError> {
    let info = load_thread(&state, &id).await?;
    let entry = entry_of(&state, &info)?;
    let wf = entry.workflow.clone();
    if !body.values.is_object() {
        return Err(ApiError::invalid_body("`values` must be an object"));
    }
    let at = match body.checkpoint_id.take().filter(|c| !c.is_empty()) {
        Some(c) => Some(c),
        None => crate::agent::threads::checkpoint_id_of(&body.checkpoint)?,
    };
    state
        .inner
        .access
        .confine(entry.input_paths, &mut body.values)?;
    messages_in(&mut body.values)?;
    if let Some(node) = &body.as_node {
        if !wf.info().nodes.iter().any(|n| n == node) {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown_node",
                format!("workflow `{}` has no node `{node}`", info.graph),
            ));
        }
    }
    let guard = state.claim(&id)?;
    let result = match &at {
        Some(cp) => {
            wf.update_state_at(&id, cp, body.values, body.as_node.as_deref())
                .await
        }
        None => {
            wf.update_state(&id, body.values, body.as_node.as_deref())
                .await
        }
    };
    drop(guard);
    let checkpoint_id = result?;
    Ok(Json(json!({
        "thread_id": id,
        "checkpoint_id": checkpoint_id,
        "checkpoint": {
            "thread_id": id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id,
            "checkpoint_map": null,
        },
    })))
}

#[derive(Deserialize)]
struct HistoryQuery {
    limit: Option<String>,
}

async fn history(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<HistoryQuery>,
) -> Result<Json<Value>, ApiError> {
    let info = load_thread(&state, &id).await?;
    let wf = workflow_of(&state, &info)?;
    let limit = match q.limit.as_deref() {
        None | Some("") => usize::MAX,
        Some(l) => l.parse::<usize>().ok().filter(|n| *n >= 1).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                format!("limit must be a positive integer, not `{l}`"),
            )
        })?,
    };
    let list = match wf.history(&id).await {
        Ok(l) => l,
        Err(ferrograph::RunError::ThreadNotFound(_)) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let items: Vec<Value> = list
        .iter()
        .take(limit)
        .map(|s| serde_json::to_value(s).unwrap_or(Value::Null))
        .collect();
    Ok(Json(json!({ "history": items })))
}

/// LangGraph's `Command` as a run's input: any of a resume value, a state update and nodes to
/// go to (one name or a list).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunCommand {
    #[serde(default)]
    resume: Option<Value>,
    #[serde(default)]
    update: Option<Value>,
    #[serde(default)]
    goto: Option<GotoTargets>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum GotoTargets {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunRequest {
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    command: Option<RunCommand>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_mode: Option<Vec<StreamMode>>,
}

/// A resume value addressed by interrupt id when it is an object whose keys are all ids of
/// pending interrupts; otherwise one value for the single pending interrupt.
fn resume_of(value: Value, info: &ThreadInfo) -> Resume {
    if let Value::Object(map) = &value {
        let addressed = !map.is_empty()
            && map
                .keys()
                .all(|k| info.interrupts.iter().any(|i| &i.id == k));
        if addressed {
            let by_id: HashMap<String, Value> = map.clone().into_iter().collect();
            return Resume::by_id(by_id);
        }
    }
    Resume::value(value)
}

/// What a run starts with: `input` (an update of the state; `null` or none continues the
/// thread) or `command` (LangGraph's `Command`: `resume`, `update`, `goto`), not both. Paths in
/// the input are confined to the server's roots.
/// [`crate::agent::messages::messages_in`] with its error as a 422.
fn messages_in(update: &mut Value) -> Result<(), ApiError> {
    crate::agent::messages::messages_in(update).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            e.to_string(),
        )
    })
}

pub(crate) fn run_input(
    state: &AppState,
    entry: &Entry,
    info: &ThreadInfo,
    input: Option<Value>,
    command: Option<RunCommand>,
) -> Result<JsonInput, ApiError> {
    Ok(match (input, command) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid_body(
                "give either `input` or `command`, not both",
            ))
        }
        (Some(Value::Null), None) | (None, None) => JsonInput::Continue,
        (Some(mut v), None) => {
            if !v.is_object() {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_input",
                    "`input` must be an object (an update of the workflow's state)",
                ));
            }
            state.inner.access.confine(entry.input_paths, &mut v)?;
            messages_in(&mut v)?;
            JsonInput::Update(v)
        }
        (
            None,
            Some(RunCommand {
                resume: Some(resume),
                update: None,
                goto: None,
            }),
        ) => JsonInput::Resume(resume_of(resume, info)),
        (None, Some(c)) => {
            let update = match c.update {
                Some(mut v) => {
                    if !v.is_object() {
                        return Err(ApiError::new(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            "invalid_input",
                            "`command.update` must be an object (an update of the workflow's state)",
                        ));
                    }
                    state.inner.access.confine(entry.input_paths, &mut v)?;
                    messages_in(&mut v)?;
                    Some(v)
                }
                None => None,
            };
            let goto = match c.goto {
                None => Vec::new(),
                Some(GotoTargets::One(n)) => vec![n],
                Some(GotoTargets::Many(list)) => list,
            };
            JsonInput::Command {
                update,
                goto,
                resume: c.resume.map(|r| resume_of(r, info)),
            }
        }
    })
}

/// Starts a run on a thread: with `input`, from that update; with `command` (`resume`, `update`,
/// `goto`, any of them), as LangGraph's `Command`; with neither, continuing the thread. Refused with `409 thread_busy` while
/// another run is in progress on the thread.
async fn create_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    if body.get("assistant_id").is_some_and(|a| !a.is_null()) {
        return agent::runs::create_on_thread(state, id, body).await;
    }
    let body: RunRequest = serde_json::from_value(body)
        .map_err(|e| ApiError::invalid_body(format!("not a run request: {e}")))?;
    let info = load_thread(&state, &id).await?;
    let entry = entry_of(&state, &info)?;
    let wf = entry.workflow.clone();
    let input = run_input(&state, entry, &info, body.input, body.command)?;
    let modes: Option<StreamModes> = body.stream.then(|| match &body.stream_mode {
        Some(list) if !list.is_empty() => list.iter().copied().collect(),
        _ => StreamModes::from(StreamMode::Values),
    });
    let started =
        runs::start_run(&state, info, wf, input, modes, runs::RunOptions::default()).await?;
    if let Some(rx) = started.events {
        let events = ReceiverStream::new(rx)
            .map(|e| Ok::<_, Infallible>(Event::default().event(&e.kind).data(&e.data)));
        return Ok(Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    match started.outcome.await {
        Ok(Ok(outcome)) => Ok(Json(outcome).into_response()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "the run ended without an outcome",
        )),
    }
}

/// The live events of the runs on a thread, as Server-Sent Events: first a `thread` event with
/// the thread record, then every event of every run (`run_start`, the run's events, `end` or
/// `error`), until the client disconnects or the server shuts down.
async fn thread_events(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let rx = state.live_sender(&id).subscribe();
    let info = match load_thread(&state, &id).await {
        Ok(i) => i,
        Err(e) => {
            drop(rx);
            state.release_live(&id, false);
            return Err(e);
        }
    };
    let first = runs::live_event("thread", &thread_view(&state, &info));
    let live = BroadcastStream::new(rx).map(|r| match r {
        Ok(e) => Event::default().event(&e.kind).data(&e.data),
        Err(BroadcastStreamRecvError::Lagged(n)) => Event::default()
            .event("lagged")
            .data(json!({ "skipped": n }).to_string()),
    });
    let first =
        futures::stream::once(async move { Event::default().event(&first.kind).data(&first.data) });
    let mut closing = state.inner.closing.subscribe();
    let stop = async move {
        let _ = closing.wait_for(|c| *c).await;
    };
    let events = first.chain(live).take_until(stop).map(Ok::<_, Infallible>);
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}
