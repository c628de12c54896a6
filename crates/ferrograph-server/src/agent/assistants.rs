//! Assistants: a graph (one of the registry's workflows) plus config, context, metadata and a
//! name. Every workflow has a default assistant made by the server; more are created through
//! the API, versioned on every change, and kept in the long-term store when the server has one
//! (in memory otherwise).

use super::{iso, page};
use crate::error::{ApiError, ApiJson};
use crate::runs::lock;
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrograph::core::id::now_millis;
use ferrograph::core::store::{PutOptions, SearchRequest};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Namespace of the store that keeps created assistants (hidden from the store endpoints).
pub(crate) const STORE_NAMESPACE: [&str; 2] = ["__ferrograph", "assistants"];

/// One version of an assistant's settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Version {
    pub(crate) version: u64,
    pub(crate) config: Value,
    pub(crate) context: Value,
    pub(crate) metadata: Value,
    pub(crate) name: String,
    pub(crate) description: Option<String>,
    pub(crate) created_at_ms: u64,
}

/// An assistant with its versions.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Assistant {
    pub(crate) assistant_id: String,
    pub(crate) graph_id: String,
    pub(crate) created_at_ms: u64,
    pub(crate) updated_at_ms: u64,
    /// The version in use.
    pub(crate) current: u64,
    pub(crate) versions: Vec<Version>,
    /// Made by the server for a workflow (cannot be changed or deleted).
    #[serde(default)]
    pub(crate) system: bool,
}

impl Assistant {
    pub(crate) fn settings(&self) -> Option<&Version> {
        self.versions.iter().find(|v| v.version == self.current)
    }

    /// The Agent Server API's view.
    pub(crate) fn view(&self) -> Value {
        let v = self.settings();
        json!({
            "assistant_id": self.assistant_id,
            "graph_id": self.graph_id,
            "config": v.map_or(json!({}), |v| v.config.clone()),
            "context": v.map_or(json!({}), |v| v.context.clone()),
            "metadata": v.map_or(json!({}), |v| v.metadata.clone()),
            "name": name_of(self),
            "description": v.and_then(|v| v.description.clone()),
            "version": self.current,
            "created_at": iso(self.created_at_ms),
            "updated_at": iso(self.updated_at_ms),
        })
    }

    fn version_view(&self, v: &Version) -> Value {
        json!({
            "assistant_id": self.assistant_id,
            "graph_id": self.graph_id,
            "config": v.config,
            "context": v.context,
            "metadata": v.metadata,
            "name": v.name,
            "description": v.description,
            "version": v.version,
            "created_at": iso(v.created_at_ms),
        })
    }

    /// The run limit from `config.recursion_limit`, if set.
    pub(crate) fn recursion_limit(&self) -> Option<u64> {
        self.settings()?
            .config
            .get("recursion_limit")
            .and_then(Value::as_u64)
    }
}

/// The namespace of LangGraph's default assistant ids.
const GRAPH_NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6ba7b821_9dad_11d1_80b4_00c04fd430c8);

/// The id LangGraph's server gives a graph's default assistant: UUID v5 of the graph's name
/// in its graph namespace (so `fe096781-…` is the assistant of a graph named `agent` on both
/// servers, and scripts that name it keep working).
pub(crate) fn default_id(graph: &str) -> String {
    uuid::Uuid::new_v5(&GRAPH_NAMESPACE, graph.as_bytes()).to_string()
}

/// Created assistants, loaded from the store on first use.
#[derive(Default)]
pub(crate) struct AssistantTable {
    loaded: Mutex<Option<BTreeMap<String, Assistant>>>,
}

fn system_assistant(graph: &str) -> Assistant {
    Assistant {
        assistant_id: default_id(graph),
        graph_id: graph.to_string(),
        created_at_ms: 0,
        updated_at_ms: 0,
        current: 1,
        versions: vec![Version {
            version: 1,
            config: json!({}),
            context: json!({}),
            metadata: json!({ "created_by": "system" }),
            name: graph.to_string(),
            description: None,
            created_at_ms: 0,
        }],
        system: true,
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "assistant_not_found",
        format!("no assistant or graph `{id}`"),
    )
}

fn store_ns() -> Vec<String> {
    STORE_NAMESPACE.iter().map(|s| s.to_string()).collect()
}

impl AppState {
    async fn created_assistants(&self) -> Result<BTreeMap<String, Assistant>, ApiError> {
        if let Some(map) = lock(&self.inner.assistants.loaded).clone() {
            return Ok(map);
        }
        let mut map = BTreeMap::new();
        if let Some(store) = &self.inner.store {
            let items = store
                .search(SearchRequest::under(store_ns()).limit(usize::MAX))
                .await
                .map_err(store_error)?;
            for it in items {
                match serde_json::from_value::<Assistant>(it.item.value) {
                    Ok(a) => {
                        map.insert(a.assistant_id.clone(), a);
                    }
                    Err(e) => {
                        tracing::warn!(key = %it.item.key, error = %e, "skipped an unreadable assistant record")
                    }
                }
            }
        }
        let mut slot = lock(&self.inner.assistants.loaded);
        Ok(slot.get_or_insert(map).clone())
    }

    async fn save_assistant(&self, a: &Assistant) -> Result<(), ApiError> {
        if let Some(store) = &self.inner.store {
            let value = serde_json::to_value(a).unwrap_or(Value::Null);
            store
                .put(&store_ns(), &a.assistant_id, value, PutOptions::default())
                .await
                .map_err(store_error)?;
        }
        lock(&self.inner.assistants.loaded)
            .get_or_insert_with(BTreeMap::new)
            .insert(a.assistant_id.clone(), a.clone());
        Ok(())
    }

    /// Every assistant: the workflows' defaults, then the created ones.
    pub(crate) async fn all_assistants(&self) -> Result<Vec<Assistant>, ApiError> {
        let mut out: Vec<Assistant> = self
            .inner
            .registry
            .names()
            .iter()
            .map(|g| system_assistant(g))
            .collect();
        out.extend(self.created_assistants().await?.into_values());
        Ok(out)
    }

    /// The assistant named by `id` and the registry entry of its graph.
    async fn assistant_entry(
        &self,
        id: &str,
    ) -> Result<(Assistant, &ferrograph::runtime::Entry), ApiError> {
        let a = self.assistant(id).await?;
        let entry = self
            .inner
            .registry
            .get(&a.graph_id)
            .ok_or_else(|| not_found(&a.graph_id))?;
        Ok((a, entry))
    }

    /// The assistant named by an assistant id or a graph name.
    pub(crate) async fn assistant(&self, id: &str) -> Result<Assistant, ApiError> {
        if self.inner.registry.get(id).is_some() {
            return Ok(system_assistant(id));
        }
        if let Some(g) = self
            .inner
            .registry
            .names()
            .into_iter()
            .find(|g| default_id(g) == id)
        {
            return Ok(system_assistant(&g));
        }
        self.created_assistants()
            .await?
            .remove(id)
            .ok_or_else(|| not_found(id))
    }
}

/// A store failure as an API error: a request the store cannot use is the client's (422),
/// a semantic search without an index is refused (422), the rest is the server's (500).
pub(crate) fn store_error(e: ferrograph::core::store::StoreError) -> ApiError {
    use ferrograph::core::store::StoreError;
    let (status, code) = match &e {
        StoreError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_store_request"),
        StoreError::NoIndex => (StatusCode::UNPROCESSABLE_ENTITY, "no_embedding_index"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "store_error"),
    };
    ApiError::new(status, code, e.to_string())
}

#[derive(Deserialize)]
pub(crate) struct CreateBody {
    graph_id: String,
    #[serde(default)]
    assistant_id: Option<String>,
    #[serde(default)]
    config: Option<Value>,
    #[serde(default)]
    context: Option<Value>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    if_exists: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
}

fn object_or_empty(v: Option<Value>, field: &str) -> Result<Value, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(json!({})),
        Some(v @ Value::Object(_)) => Ok(v),
        Some(_) => Err(ApiError::invalid_body(format!(
            "`{field}` must be an object"
        ))),
    }
}

pub(crate) async fn create(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<Json<Value>, ApiError> {
    if state.inner.registry.get(&body.graph_id).is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "graph_not_found",
            format!(
                "no graph `{}` (available: {})",
                body.graph_id,
                state.inner.registry.names().join(", ")
            ),
        ));
    }
    let id = match body.assistant_id {
        Some(id) => uuid::Uuid::parse_str(&id)
            .map_err(|_| ApiError::invalid_body(format!("assistant_id `{id}` is not a UUID")))?
            .to_string(),
        None => uuid::Uuid::new_v4().to_string(),
    };
    if let Ok(existing) = state.assistant(&id).await {
        return match body.if_exists.as_deref() {
            Some("do_nothing") => Ok(Json(existing.view())),
            _ => Err(ApiError::new(
                StatusCode::CONFLICT,
                "assistant_exists",
                format!("assistant `{id}` already exists"),
            )),
        };
    }
    let now = now_millis();
    let a = Assistant {
        assistant_id: id,
        graph_id: body.graph_id.clone(),
        created_at_ms: now,
        updated_at_ms: now,
        current: 1,
        versions: vec![Version {
            version: 1,
            config: object_or_empty(body.config, "config")?,
            context: object_or_empty(body.context, "context")?,
            metadata: object_or_empty(body.metadata, "metadata")?,
            name: body.name.unwrap_or_else(|| "Untitled".to_string()),
            description: body.description,
            created_at_ms: now,
        }],
        system: false,
    };
    state.save_assistant(&a).await?;
    Ok(Json(a.view()))
}

pub(crate) async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(state.assistant(&id).await?.view()))
}

#[derive(Deserialize)]
pub(crate) struct PatchBody {
    #[serde(default)]
    graph_id: Option<String>,
    #[serde(default)]
    config: Option<Value>,
    #[serde(default)]
    context: Option<Value>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
}

fn refuse_system(a: &Assistant) -> Result<(), ApiError> {
    if a.system {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "system_assistant",
            format!(
                "`{}` is the default assistant of graph `{}`, made by the server; create an assistant to change settings",
                a.assistant_id, a.graph_id
            ),
        ));
    }
    Ok(())
}

pub(crate) async fn patch(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<PatchBody>,
) -> Result<Json<Value>, ApiError> {
    let mut a = state.assistant(&id).await?;
    refuse_system(&a)?;
    if let Some(g) = body.graph_id {
        if state.inner.registry.get(&g).is_none() {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "graph_not_found",
                format!("no graph `{g}`"),
            ));
        }
        a.graph_id = g;
    }
    let Some(base) = a.settings().cloned() else {
        return Err(not_found(&id));
    };
    let now = now_millis();
    let next = a.versions.iter().map(|v| v.version).max().unwrap_or(0) + 1;
    let merged_metadata = match (base.metadata, body.metadata) {
        (Value::Object(mut old), Some(Value::Object(new))) => {
            old.extend(new);
            Value::Object(old)
        }
        (old, None) => old,
        (_, Some(_)) => return Err(ApiError::invalid_body("`metadata` must be an object")),
    };
    a.versions.push(Version {
        version: next,
        config: match body.config {
            Some(c) => object_or_empty(Some(c), "config")?,
            None => base.config,
        },
        context: match body.context {
            Some(c) => object_or_empty(Some(c), "context")?,
            None => base.context,
        },
        metadata: merged_metadata,
        name: body.name.unwrap_or(base.name),
        description: body.description.or(base.description),
        created_at_ms: now,
    });
    a.current = next;
    a.updated_at_ms = now;
    state.save_assistant(&a).await?;
    Ok(Json(a.view()))
}

pub(crate) async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let a = state.assistant(&id).await?;
    refuse_system(&a)?;
    if let Some(store) = &state.inner.store {
        store
            .delete(&store_ns(), &a.assistant_id)
            .await
            .map_err(store_error)?;
    }
    if let Some(map) = lock(&state.inner.assistants.loaded).as_mut() {
        map.remove(&a.assistant_id);
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default)]
pub(crate) struct SearchBody {
    #[serde(default)]
    graph_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    offset: Option<i64>,
    #[serde(default)]
    sort_by: Option<String>,
    #[serde(default)]
    sort_order: Option<String>,
}

fn name_of(a: &Assistant) -> &str {
    a.settings()
        .map_or(a.graph_id.as_str(), |v| v.name.as_str())
}

async fn matching(state: &AppState, body: &SearchBody) -> Result<Vec<Assistant>, ApiError> {
    let mut list = state.all_assistants().await?;
    list.retain(|a| {
        let v = a.settings();
        body.graph_id
            .as_deref()
            .is_none_or(|g| g.is_empty() || a.graph_id == g)
            && body.name.as_deref().is_none_or(|n| {
                v.is_some_and(|v| v.name.to_lowercase().contains(&n.to_lowercase()))
            })
            && body
                .metadata
                .as_ref()
                .is_none_or(|m| v.is_some_and(|v| super::metadata_matches(&v.metadata, m)))
    });
    let key = body.sort_by.as_deref().unwrap_or("created_at");
    list.sort_by(|a, b| match key {
        "assistant_id" => a.assistant_id.cmp(&b.assistant_id),
        "graph_id" => a.graph_id.cmp(&b.graph_id),
        "name" => name_of(a).cmp(name_of(b)),
        "updated_at" => a.updated_at_ms.cmp(&b.updated_at_ms),
        _ => a
            .created_at_ms
            .cmp(&b.created_at_ms)
            .then_with(|| a.graph_id.cmp(&b.graph_id)),
    });
    if body.sort_order.as_deref() != Some("asc") {
        list.reverse();
    }
    Ok(list)
}

pub(crate) async fn search(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<SearchBody>,
) -> Result<Response, ApiError> {
    let (limit, offset) = page(body.limit, body.offset)?;
    let list = matching(&state, &body).await?;
    let total = list.len();
    let items: Vec<Value> = list
        .iter()
        .skip(offset)
        .take(limit)
        .map(Assistant::view)
        .collect();
    let mut resp = Json(Value::Array(items)).into_response();
    if offset + limit < total {
        if let Ok(v) = HeaderValue::from_str(&(offset + limit).to_string()) {
            resp.headers_mut().insert("X-Pagination-Next", v);
        }
    }
    if let Ok(v) = HeaderValue::from_str(&total.to_string()) {
        resp.headers_mut().insert("X-Pagination-Total", v);
    }
    Ok(resp)
}

pub(crate) async fn count(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<SearchBody>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(matching(&state, &body).await?.len())))
}

#[derive(Deserialize)]
pub(crate) struct VersionsBody {
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    offset: Option<i64>,
}

pub(crate) async fn versions(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<VersionsBody>,
) -> Result<Json<Value>, ApiError> {
    let (limit, offset) = page(body.limit, body.offset)?;
    let a = state.assistant(&id).await?;
    let list: Vec<Value> = a
        .versions
        .iter()
        .rev()
        .filter(|v| {
            body.metadata
                .as_ref()
                .is_none_or(|m| super::metadata_matches(&v.metadata, m))
        })
        .skip(offset)
        .take(limit)
        .map(|v| a.version_view(v))
        .collect();
    Ok(Json(Value::Array(list)))
}

#[derive(Deserialize)]
pub(crate) struct LatestBody {
    version: u64,
}

pub(crate) async fn set_latest(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<LatestBody>,
) -> Result<Json<Value>, ApiError> {
    let mut a = state.assistant(&id).await?;
    refuse_system(&a)?;
    if !a.versions.iter().any(|v| v.version == body.version) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "version_not_found",
            format!("assistant `{id}` has no version {}", body.version),
        ));
    }
    a.current = body.version;
    a.updated_at_ms = now_millis();
    state.save_assistant(&a).await?;
    Ok(Json(a.view()))
}

/// The graph of an assistant in LangGraph's JSON form (`nodes` with `id`, `type`, `data`;
/// `edges` with `source`, `target`, `conditional`, `data`).
pub(crate) async fn graph(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (_, entry) = state.assistant_entry(&id).await?;
    Ok(Json(entry.workflow.info().drawing.to_langgraph_json()))
}

pub(crate) async fn schemas(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (a, entry) = state.assistant_entry(&id).await?;
    let sample = (entry.sample_input)();
    Ok(Json(json!({
        "graph_id": a.graph_id,
        "input_schema": input_schema(&sample),
        "output_schema": null,
        "state_schema": null,
        "config_schema": {
            "type": "object",
            "properties": { "recursion_limit": { "type": "integer", "minimum": 1 } },
        },
        "context_schema": null,
    })))
}

/// A JSON Schema of the input's top-level fields, from the workflow's sample input (the
/// fields and their JSON types; the workflow checks the values when a run starts).
fn input_schema(sample: &Value) -> Value {
    let Value::Object(map) = sample else {
        return Value::Null;
    };
    let props: serde_json::Map<String, Value> = map
        .iter()
        .map(|(k, v)| {
            let t = match v {
                Value::String(_) => "string",
                Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
                Value::Number(_) => "number",
                Value::Bool(_) => "boolean",
                Value::Array(_) => "array",
                Value::Object(_) => "object",
                Value::Null => "null",
            };
            (k.clone(), json!({ "type": t }))
        })
        .collect();
    json!({ "type": "object", "title": "Input", "properties": props })
}

/// `GET /assistants/{id}/subgraphs`: the graphs run as nodes of this one. Subgraphs are
/// compiled into their parent node here, so none are listed.
pub(crate) async fn subgraphs(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    state.assistant(&id).await?;
    Ok(Json(json!({})))
}

/// `GET /assistants/{id}/subgraphs/{namespace}`.
pub(crate) async fn subgraphs_ns(
    state: State<AppState>,
    Path((id, _ns)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    subgraphs(state, Path(id)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_ids_are_langgraphs() {
        // The default assistant of a graph named `agent` on LangGraph's server.
        assert_eq!(default_id("agent"), "fe096781-5601-53d2-b2f6-0d3403f7e9ca");
    }
}
