//! The long-term store over HTTP, as the Agent Server API names it: items by namespace and
//! key (put, get, delete), search under a namespace prefix (by filter, or by meaning when the
//! store has an embedder), and the namespaces in use. The namespace `__ferrograph…` is the
//! server's own and is neither shown nor writable.

use super::assistants::{store_error, STORE_NAMESPACE};
use super::{iso, page};
use crate::error::{ApiError, ApiJson};
use crate::AppState;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use ferrograph::core::store::{
    FieldCondition, IndexFields, Item, NamespaceQuery, PutOptions, SearchRequest, Store,
};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

fn store(state: &AppState) -> Result<&Arc<dyn Store>, ApiError> {
    state.inner.store.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_store",
            "this server was started without a long-term store",
        )
    })
}

fn check_namespace(ns: &[String]) -> Result<(), ApiError> {
    if ns.is_empty() {
        return Err(ApiError::invalid_body("a namespace has at least one label"));
    }
    for label in ns {
        if label.is_empty() || label.contains('.') {
            return Err(ApiError::invalid_body(format!(
                "namespace labels are not empty and hold no `.` (got `{label}`)"
            )));
        }
    }
    if ns[0] == STORE_NAMESPACE[0] {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "reserved_namespace",
            format!("the namespace `{}` is the server's own", STORE_NAMESPACE[0]),
        ));
    }
    Ok(())
}

fn item_view(it: &Item) -> Value {
    json!({
        "namespace": it.namespace,
        "key": it.key,
        "value": it.value,
        "created_at": iso(it.created_at_ms),
        "updated_at": iso(it.updated_at_ms),
    })
}

#[derive(Deserialize)]
pub(crate) struct PutBody {
    namespace: Vec<String>,
    key: String,
    value: Value,
    #[serde(default)]
    index: Value,
    /// Minutes, as the SDKs send it.
    #[serde(default)]
    ttl: Option<f64>,
}

/// `PUT /store/items`.
pub(crate) async fn put_item(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<PutBody>,
) -> Result<StatusCode, ApiError> {
    let store = store(&state)?;
    check_namespace(&body.namespace)?;
    if body.key.is_empty() {
        return Err(ApiError::invalid_body("`key` is empty"));
    }
    if !body.value.is_object() {
        return Err(ApiError::invalid_body("`value` must be an object"));
    }
    let index = match &body.index {
        Value::Null => IndexFields::Default,
        Value::Bool(false) => IndexFields::Skip,
        Value::Array(fields) => IndexFields::Fields(
            fields
                .iter()
                .map(|f| {
                    f.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| ApiError::invalid_body("`index` lists field names"))
                })
                .collect::<Result<_, _>>()?,
        ),
        _ => {
            return Err(ApiError::invalid_body(
                "`index` is false or a list of field names",
            ))
        }
    };
    let ttl = match body.ttl {
        None => None,
        Some(m) if m > 0.0 && m.is_finite() => Some(Duration::from_secs_f64(m * 60.0)),
        Some(m) => {
            return Err(ApiError::invalid_body(format!(
                "`ttl` is a positive number of minutes, not {m}"
            )))
        }
    };
    store
        .put(
            &body.namespace,
            &body.key,
            body.value,
            PutOptions { ttl, index },
        )
        .await
        .map_err(store_error)?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
pub(crate) struct GetQuery {
    key: String,
    /// Labels joined with `.`.
    namespace: Option<String>,
}

fn split_ns(ns: Option<&str>) -> Vec<String> {
    ns.filter(|s| !s.is_empty())
        .map(|s| s.split('.').map(str::to_string).collect())
        .unwrap_or_default()
}

/// `GET /store/items?namespace=a.b&key=k`.
pub(crate) async fn get_item(
    State(state): State<AppState>,
    Query(q): Query<GetQuery>,
) -> Result<Json<Value>, ApiError> {
    let store = store(&state)?;
    let ns = split_ns(q.namespace.as_deref());
    check_namespace(&ns)?;
    match store.get(&ns, &q.key).await.map_err(store_error)? {
        Some(it) => Ok(Json(item_view(&it))),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "item_not_found",
            format!("no item `{}` in namespace `{}`", q.key, ns.join(".")),
        )),
    }
}

#[derive(Deserialize)]
pub(crate) struct DeleteBody {
    namespace: Vec<String>,
    key: String,
}

/// `DELETE /store/items`.
pub(crate) async fn delete_item(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<DeleteBody>,
) -> Result<StatusCode, ApiError> {
    let store = store(&state)?;
    check_namespace(&body.namespace)?;
    store
        .delete(&body.namespace, &body.key)
        .await
        .map_err(store_error)?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
pub(crate) struct SearchBody {
    #[serde(default)]
    namespace_prefix: Vec<String>,
    #[serde(default)]
    filter: Option<BTreeMap<String, Value>>,
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    offset: Option<i64>,
    #[serde(default)]
    query: Option<String>,
}

/// `POST /store/items/search`.
pub(crate) async fn search(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<SearchBody>,
) -> Result<Json<Value>, ApiError> {
    let store = store(&state)?;
    if body.namespace_prefix.first().map(String::as_str) == Some(STORE_NAMESPACE[0]) {
        check_namespace(&body.namespace_prefix)?;
    }
    let (limit, offset) = page(body.limit, body.offset)?;
    let mut filter = BTreeMap::new();
    for (k, v) in body.filter.unwrap_or_default() {
        let c = FieldCondition::from_json(v)
            .map_err(|e| ApiError::invalid_body(format!("filter `{k}`: {e}")))?;
        filter.insert(k, c);
    }
    // Hidden items are filtered after the search, so ask for enough to fill the page.
    let found = store
        .search(SearchRequest {
            namespace_prefix: body.namespace_prefix,
            filter,
            query: body.query.filter(|q| !q.is_empty()),
            limit: limit + offset,
            offset: 0,
        })
        .await
        .map_err(store_error)?;
    let items: Vec<Value> = found
        .iter()
        .filter(|s| s.item.namespace.first().map(String::as_str) != Some(STORE_NAMESPACE[0]))
        .skip(offset)
        .take(limit)
        .map(|s| {
            let mut v = item_view(&s.item);
            v["score"] = json!(s.score);
            v
        })
        .collect();
    Ok(Json(json!({ "items": items })))
}

#[derive(Deserialize)]
pub(crate) struct NamespacesBody {
    #[serde(default)]
    prefix: Vec<String>,
    #[serde(default)]
    suffix: Vec<String>,
    #[serde(default)]
    max_depth: Option<usize>,
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    offset: Option<i64>,
}

/// `POST /store/namespaces`.
pub(crate) async fn namespaces(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<NamespacesBody>,
) -> Result<Json<Value>, ApiError> {
    let store = store(&state)?;
    let (limit, offset) = page(body.limit.or(Some(100)), body.offset)?;
    let list = store
        .list_namespaces(NamespaceQuery {
            prefix: body.prefix,
            suffix: body.suffix,
            max_depth: body.max_depth,
            limit: None,
            offset: 0,
        })
        .await
        .map_err(store_error)?;
    let shown: Vec<Vec<String>> = list
        .into_iter()
        .filter(|ns| ns.first().map(String::as_str) != Some(STORE_NAMESPACE[0]))
        .skip(offset)
        .take(limit)
        .collect();
    Ok(Json(json!({ "namespaces": shown })))
}
