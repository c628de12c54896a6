//! The web console: static HTML, CSS and JavaScript embedded in the binary (no build step, no
//! external resources).

use crate::AppState;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("console/index.html");
const STYLE: &str = include_str!("console/console.css");
const SCRIPT: &str = include_str!("console/console.js");
const SSE_SCRIPT: &str = include_str!("console/sse.js");
const CHAT: &str = include_str!("console/chat.html");
const CHAT_SCRIPT: &str = include_str!("console/chat.js");

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(index))
        .route("/console", get(index))
        .route("/console/assets/console.css", get(style))
        .route("/console/assets/console.js", get(script))
        .route("/console/assets/sse.js", get(sse_script))
        .route("/console/chat", get(chat))
        .route("/console/assets/chat.js", get(chat_script))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(
                    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
                ),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        body,
    )
        .into_response()
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// The chat page: a conversation with a chat workflow (the tutor), answers streamed.
async fn chat() -> Response {
    asset("text/html; charset=utf-8", CHAT)
}

/// The Server-Sent Events reader both pages share.
async fn sse_script() -> Response {
    asset("text/javascript; charset=utf-8", SSE_SCRIPT)
}

async fn chat_script() -> Response {
    asset("text/javascript; charset=utf-8", CHAT_SCRIPT)
}
