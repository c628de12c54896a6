//! API errors: every failure is answered with `{"error": {"code": "...", "message": "..."}}`.

use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrograph::runtime::RunError;
use ferrograph::{CheckpointError, NodeError};
use serde::de::DeserializeOwned;
use serde_json::json;

/// An error answered to an API client: an HTTP status, a stable machine-readable code and a
/// human-readable message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable code, e.g. `thread_not_found`, `thread_busy`, `invalid_input`.
    pub code: &'static str,
    /// What went wrong.
    pub message: String,
}

impl ApiError {
    /// An error with a status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// 404 for a thread that does not exist.
    pub fn thread_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "thread_not_found",
            format!("thread `{id}` not found"),
        )
    }

    /// 409 for a thread with a run in progress.
    pub fn thread_busy(id: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "thread_busy",
            format!("thread `{id}` already has a run in progress; wait for it to end"),
        )
    }

    /// 422 for a request body that is valid JSON but not what the route expects.
    pub fn invalid_body(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", message)
    }

    /// A generic error for a bare status (used to give JSON bodies to errors produced by
    /// layers, such as 405 or 413).
    pub fn from_status(status: StatusCode) -> Self {
        let code = match status {
            StatusCode::BAD_REQUEST => "bad_request",
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::FORBIDDEN => "forbidden",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::NOT_ACCEPTABLE => "not_acceptable",
            StatusCode::CONFLICT => "conflict",
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            StatusCode::UNPROCESSABLE_ENTITY => "unprocessable",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            s if s.is_client_error() => "client_error",
            _ => "internal_error",
        };
        let message = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "the request body is larger than the server accepts",
            StatusCode::METHOD_NOT_ALLOWED => "this method is not allowed on this route",
            StatusCode::NOT_FOUND => "no such route",
            _ => status.canonical_reason().unwrap_or("error"),
        };
        Self::new(status, code, message)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({ "error": { "code": self.code, "message": self.message } })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(code = self.code, message = %self.message, "request failed");
        } else {
            tracing::debug!(status = %self.status, code = self.code, message = %self.message, "request refused");
        }
        let mut resp = (self.status, Json(self.body())).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"ferrograph\""),
            );
        }
        resp
    }
}

impl From<CheckpointError> for ApiError {
    fn from(e: CheckpointError) -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "storage_error",
            e.to_string(),
        )
    }
}

impl From<RunError> for ApiError {
    fn from(e: RunError) -> Self {
        use StatusCode as S;
        let (status, code) = match &e {
            RunError::ThreadNotFound(_) => (S::NOT_FOUND, "thread_not_found"),
            RunError::ThreadBusy(_) => (S::CONFLICT, "thread_busy"),
            RunError::NoPendingInterrupt(_) => (S::CONFLICT, "no_pending_interrupt"),
            RunError::NothingToContinue(_) => (S::CONFLICT, "nothing_to_continue"),
            RunError::UnknownInterrupt { .. } => (S::UNPROCESSABLE_ENTITY, "unknown_interrupt"),
            RunError::AmbiguousResume { .. } => (S::UNPROCESSABLE_ENTITY, "ambiguous_resume"),
            RunError::InvalidInput(_) => (S::UNPROCESSABLE_ENTITY, "invalid_input"),
            RunError::InvalidThreadId(_) => (S::UNPROCESSABLE_ENTITY, "invalid_thread_id"),
            RunError::Node { source, .. } => match source {
                NodeError::BadResume { .. } => (S::UNPROCESSABLE_ENTITY, "bad_resume"),
                NodeError::Panicked(_) | NodeError::AgentLost(_) => {
                    (S::INTERNAL_SERVER_ERROR, "node_crashed")
                }
                NodeError::Cancelled => (S::SERVICE_UNAVAILABLE, "cancelled"),
                NodeError::NodeLost { .. } => (S::SERVICE_UNAVAILABLE, "cluster_node_lost"),
                _ => (S::UNPROCESSABLE_ENTITY, "run_failed"),
            },
            RunError::Step(_) => (S::UNPROCESSABLE_ENTITY, "run_failed"),
            RunError::StepLimit { .. } => (S::UNPROCESSABLE_ENTITY, "step_limit"),
            RunError::Timeout(_) => (S::GATEWAY_TIMEOUT, "run_timeout"),
            RunError::Cancelled => (S::CONFLICT, "run_cancelled"),
            RunError::ShuttingDown => (S::SERVICE_UNAVAILABLE, "shutting_down"),
            RunError::Checkpoint(_) => (S::INTERNAL_SERVER_ERROR, "storage_error"),
            RunError::Escalated { .. } => (S::INTERNAL_SERVER_ERROR, "node_escalated"),
            _ => (S::INTERNAL_SERVER_ERROR, "internal_error"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// A JSON request body whose failures are [`ApiError`]s: 400 for malformed JSON, 422 for JSON of
/// the wrong shape, 413 for a body over the limit, 415 for a non-JSON content type. An empty
/// body reads as `{}`.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

/// `Some(true)` for a JSON content type, `Some(false)` for another, `None` when absent.
fn json_content_type(headers: &HeaderMap) -> Option<bool> {
    headers.get(header::CONTENT_TYPE).map(|v| {
        v.to_str().is_ok_and(|s| {
            let mime = s
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            mime == "application/json"
                || (mime.starts_with("application/") && mime.ends_with("+json"))
        })
    })
}

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // A body needs `Content-Type: application/json`: web pages can send forms and plain
        // text to any server without asking, but not JSON. Only an empty body may omit it.
        let content_type = json_content_type(req.headers());
        let unsupported = || {
            ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the request body must be JSON (Content-Type: application/json)",
            )
        };
        if content_type == Some(false) {
            return Err(unsupported());
        }
        let bytes =
            axum::body::Bytes::from_request(req, state)
                .await
                .map_err(|e: BytesRejection| {
                    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                        ApiError::from_status(StatusCode::PAYLOAD_TOO_LARGE)
                    } else {
                        ApiError::new(
                            StatusCode::BAD_REQUEST,
                            "bad_body",
                            format!("could not read the request body: {e}"),
                        )
                    }
                })?;
        let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else if content_type.is_none() {
            return Err(unsupported());
        } else {
            &bytes
        };
        serde_json::from_slice(text).map(ApiJson).map_err(|e| {
            use serde_json::error::Category;
            match e.classify() {
                Category::Data => ApiError::invalid_body(format!("invalid request body: {e}")),
                _ => ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_json",
                    format!("the request body is not valid JSON: {e}"),
                ),
            }
        })
    }
}

/// Gives a JSON error body to error responses produced outside the handlers (405 from the
/// router, 413 from the body limit layer, path and query rejections).
pub(crate) async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let mut err = ApiError::from_status(status);
    if status == StatusCode::BAD_REQUEST {
        if let Ok(bytes) = axum::body::to_bytes(body, 4096).await {
            let text = String::from_utf8_lossy(&bytes).trim().to_string();
            if !text.is_empty() {
                err.message = text;
            }
        }
    }
    let mut out = err.into_response();
    for name in [header::ALLOW, header::WWW_AUTHENTICATE] {
        if let Some(v) = parts.headers.get(&name) {
            out.headers_mut().insert(name, v.clone());
        }
    }
    out
}
