//! LangGraph's Agent Server API on top of ferrograph's threads and runs, so that the official
//! SDKs (`langgraph-sdk` for Python, `@langchain/langgraph-sdk` for JavaScript) and the tools
//! built on them work against `ferrograph serve` unchanged.
//!
//! - **Assistants** ([`assistants`]): every workflow of the registry is a graph with a default
//!   assistant (its id is the UUID v5 LangGraph derives from the graph's name, and the graph's
//!   name itself is accepted wherever an assistant id is); more assistants (a graph plus
//!   config, metadata, a name) can be created, versioned and deleted.
//! - **Threads** ([`threads`]): created unbound and bound to a graph by their first run,
//!   searched, patched, copied, deleted; their state at any checkpoint, edited, and their
//!   history.
//! - **Runs** ([`runs`]): in the background, waited for, streamed as Server-Sent Events in
//!   LangGraph's stream modes ([`stream`]), joined, cancelled, listed; `Command` input
//!   (`resume`, `update`, `goto`); stateless runs on a temporary thread.
//! - **Store** ([`store`]): the long-term store's items and namespaces.
//!
//! Our own routes keep their shapes; where a path is shared the request says which API it
//! speaks (a run with `assistant_id` is an Agent Server run; a thread created with `workflow`
//! is one of ours), and shared responses carry the fields of both.

pub(crate) mod assistants;
pub(crate) mod messages;
pub(crate) mod runs;
pub(crate) mod store;
pub(crate) mod stream;
pub(crate) mod threads;

use crate::error::ApiError;
use axum::http::StatusCode;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// An RFC 3339 timestamp (UTC, milliseconds) for a time in ms since the epoch.
pub(crate) fn iso(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|m| jiff::Timestamp::from_millisecond(m).ok())
        .map_or_else(|| "1970-01-01T00:00:00Z".to_string(), |t| t.to_string())
}

/// Marks a thread metadata value stored as JSON text (thread records hold text values; the
/// Agent Server API's metadata is any JSON).
const JSON_MARK: char = '\u{1f}';

/// Thread metadata from the API's JSON object into the record's text values: strings as they
/// are, anything else as marked JSON text.
pub(crate) fn metadata_in(value: &Value) -> Result<BTreeMap<String, String>, ApiError> {
    let map = match value {
        Value::Null => return Ok(BTreeMap::new()),
        Value::Object(m) => m,
        _ => return Err(ApiError::invalid_body("`metadata` must be an object")),
    };
    let mut out = BTreeMap::new();
    for (k, v) in map {
        let text = match v {
            Value::String(s) if s.starts_with(JSON_MARK) => {
                return Err(ApiError::invalid_body(format!(
                    "metadata `{k}` starts with the control character U+001F, which the server reserves"
                )))
            }
            Value::String(s) => s.clone(),
            other => format!("{JSON_MARK}{other}"),
        };
        out.insert(k.clone(), text);
    }
    Ok(out)
}

/// Thread metadata as the API shows it: the record's text values, marked JSON parsed back.
pub(crate) fn metadata_out(meta: &BTreeMap<String, String>) -> Value {
    let mut out = Map::new();
    for (k, v) in meta {
        let value = match v.strip_prefix(JSON_MARK) {
            Some(text) => serde_json::from_str(text).unwrap_or_else(|_| Value::String(v.clone())),
            None => Value::String(v.clone()),
        };
        out.insert(k.clone(), value);
    }
    Value::Object(out)
}

/// Whether `meta` holds every key of `filter` with an equal value.
pub(crate) fn metadata_matches(meta: &Value, filter: &Value) -> bool {
    match filter {
        Value::Object(f) => f.iter().all(|(k, want)| meta.get(k) == Some(want)),
        Value::Null => true,
        _ => false,
    }
}

/// A `limit`/`offset` pair from a search body, with LangGraph's defaults.
pub(crate) fn page(limit: Option<i64>, offset: Option<i64>) -> Result<(usize, usize), ApiError> {
    let limit = limit.unwrap_or(10);
    let offset = offset.unwrap_or(0);
    if !(1..=10_000).contains(&limit) || offset < 0 {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            format!("limit must be 1 to 10000 and offset not negative (got {limit}, {offset})"),
        ));
    }
    Ok((limit as usize, offset as usize))
}

/// 422 for a feature of the Agent Server API that ferrograph does not offer, naming it.
pub(crate) fn unsupported(what: &str, why: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "unsupported",
        format!("{what} is not supported by ferrograph: {why}"),
    )
}

/// `GET /info`: what this server is and which optional parts of the API it has.
pub(crate) async fn info(
    axum::extract::State(state): axum::extract::State<crate::AppState>,
) -> axum::Json<Value> {
    axum::Json(serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "server": "ferrograph",
        "langgraph_py_version": null,
        "flags": {
            "assistants": true,
            "crons": false,
            "langsmith": false,
            "store": state.inner.store.is_some(),
            "strict_resume": true,
        },
        "graphs": state.inner.registry.names(),
    }))
}

/// `GET /ok`: the Agent Server API's liveness probe.
pub(crate) async fn ok() -> axum::Json<Value> {
    axum::Json(serde_json::json!({ "ok": true }))
}

/// Cron routes: refused with a reason.
pub(crate) async fn unsupported_crons() -> ApiError {
    unsupported(
        "scheduling runs (crons)",
        "use the system's scheduler (cron, systemd timers) to call `POST /threads/{id}/runs`",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn metadata_round_trips_any_json() {
        let meta = json!({"user": "ann", "n": 1, "ok": true, "tags": ["a"], "none": null});
        let stored = metadata_in(&meta).unwrap();
        assert_eq!(stored["user"], "ann");
        assert_eq!(metadata_out(&stored), meta);
        assert!(metadata_in(&json!({"x": "\u{1f}1"})).is_err());
        assert!(metadata_in(&json!([1])).is_err());
    }

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(iso(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso(1_764_208_800_123), "2025-11-27T02:00:00.123Z");
    }
}
