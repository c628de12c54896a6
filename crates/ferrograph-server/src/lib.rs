//! HTTP API, event streams, web console and metrics for ferrograph.
//!
//! [`serve`] runs everything on one socket:
//!
//! - the JSON API over threads and runs (`/threads`, `/threads/{id}/runs`, `/workflows`, ...),
//!   described by the OpenAPI 3.0 document at `/openapi.json`;
//! - Server-Sent Events: a run's own events (`POST /threads/{id}/runs` with `"stream": true`) and
//!   the live events of whatever runs on a thread (`GET /threads/{id}/events`);
//! - Prometheus metrics at `/metrics` and a liveness probe at `/healthz`;
//! - the web console at `/` (static files embedded in the binary).
//!
//! Every error is JSON: `{"error": {"code": "...", "message": "..."}}`. A second run on a thread
//! that already has one in progress is refused with `409 thread_busy`.
//!
//! The server binds 127.0.0.1 unless told otherwise; binding any other address requires a bearer
//! token, and when a token is set every route except `/healthz` and the console's static files
//! requires `Authorization: Bearer <token>`.
//!
//! Requests from web pages are fenced (see [`access`]): the `Host` header must be an IP
//! address, `localhost` or a configured name (a DNS-rebinding page sends its own name), a
//! request with an `Origin` other than the server's own is refused unless that origin is
//! configured (and then answered with CORS headers), and request bodies must be JSON
//! (`415` otherwise). Paths in a workflow's input are confined to the server's configured
//! roots ([`ferrograph::runtime::PathRoots`]).
//!
//! For tests and embedding, build an [`AppState`] and either call [`router`] or [`serve_on`]
//! with a listener bound to port 0.

pub mod access;
mod agent;
mod api;
mod conn;
mod console;
mod error;
mod metrics;
mod openapi;
mod runs;

pub use conn::ConnectionLimits;
pub use error::{ApiError, ApiJson};

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ferrograph::core::store::Store;
use ferrograph::CheckpointSaver;
use ferrograph::Registry;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use tokio::sync::{broadcast, watch};

/// Default largest request body: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;

/// Default port of `ferrograph serve`.
pub const DEFAULT_PORT: u16 = 8420;

/// How many bytes of run events the Agent Server API keeps in memory for clients that join
/// a run's stream later (see `GET /threads/{id}/runs/{run}/stream`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventRetention {
    /// Most bytes one run keeps; its oldest events are dropped beyond it.
    pub per_run_bytes: usize,
    /// Most bytes all runs keep together; beyond it the events of the oldest finished runs
    /// are dropped first, then the oldest events of running runs (each keeps its newest),
    /// then the results of runs finished more than `result_grace` ago. Results count here,
    /// not against `per_run_bytes`.
    pub total_bytes: usize,
    /// How long a finished run's result is kept whatever the caps, so that the clients
    /// waiting for it read it.
    pub result_grace: std::time::Duration,
}

impl Default for EventRetention {
    /// 16 MiB per run, 256 MiB in all, results kept at least 10 minutes.
    fn default() -> Self {
        EventRetention {
            per_run_bytes: 16 << 20,
            total_bytes: 256 << 20,
            result_grace: std::time::Duration::from_secs(600),
        }
    }
}

/// Settings of `ferrograph serve`.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Address to bind; 127.0.0.1 by default. Any other address requires `token`.
    pub bind: SocketAddr,
    /// Bearer token required on every request (except `/healthz` and the console's static
    /// files) when set. An empty token counts as none.
    pub token: Option<String>,
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// Folders whose contents API clients may name as workflow input (a repository to triage,
    /// a dataset); none by default, so clients can name no folder to read.
    pub workspace_roots: Vec<std::path::PathBuf>,
    /// The folder under which API clients may name output folders (created if missing);
    /// `None` refuses every client-chosen output path.
    pub output_root: Option<std::path::PathBuf>,
    /// Host names accepted in the `Host` header besides IP addresses and `localhost`.
    pub allowed_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`) of web pages allowed to call the API cross-origin;
    /// `*` allows any.
    pub allowed_origins: Vec<String>,
    /// Header-read and idle timeouts and the connection cap.
    pub limits: ConnectionLimits,
    /// How many bytes of run events are kept for clients that join later.
    pub event_retention: EventRetention,
    /// The long-term store served at `/store` (the Agent Server API's), which also keeps
    /// the assistants created through the API; without one those routes answer 503 and
    /// created assistants live in memory.
    pub store: Option<Arc<dyn Store>>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, DEFAULT_PORT)),
            token: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            workspace_roots: Vec::new(),
            output_root: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            limits: ConnectionLimits::default(),
            event_retention: EventRetention::default(),
            store: None,
        }
    }
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Binding a non-loopback address without a token.
    #[error("refusing to bind {0} without a bearer token (use --token-env)")]
    TokenRequired(SocketAddr),
    /// The socket could not be bound or served.
    #[error("server IO failed: {0}")]
    Io(#[from] std::io::Error),
    /// A configured workspace or output root cannot be used.
    #[error("cannot use the configured folder: {0}")]
    Roots(#[source] std::io::Error),
}

/// One event of a thread's live stream.
#[derive(Debug)]
pub(crate) struct LiveEvent {
    /// SSE event name.
    pub(crate) kind: String,
    /// SSE data, as JSON text.
    pub(crate) data: String,
    /// The runtime's event that `data` was made from (`None` for the server's own events:
    /// `thread`, `run_start`, `end`, `error`), so that a consumer that reshapes events (the
    /// Agent Server API's stream modes) reads it without parsing `data` back.
    pub(crate) event: Option<ferrograph::runtime::JsonEvent>,
}

pub(crate) struct Inner {
    pub(crate) registry: Registry,
    pub(crate) saver: Arc<dyn CheckpointSaver>,
    pub(crate) token: Option<String>,
    pub(crate) max_body_bytes: usize,
    pub(crate) access: access::Access,
    pub(crate) limits: ConnectionLimits,
    pub(crate) metrics: metrics::Metrics,
    /// Live event channels, by thread.
    pub(crate) live: Mutex<HashMap<String, broadcast::Sender<Arc<LiveEvent>>>>,
    /// Threads with a run in progress through this server.
    pub(crate) active: Mutex<HashSet<String>>,
    /// Threads whose record this process has checked against their newest checkpoint.
    pub(crate) reconciled: Mutex<HashSet<String>>,
    /// Flips to true when the server shuts down, ending open event streams.
    pub(crate) closing: watch::Sender<bool>,
    /// Nodes running now, by thread (for the graph's highlight).
    pub(crate) running: Mutex<HashMap<String, Vec<String>>>,
    /// The long-term store (the Agent Server API's `/store` routes and created assistants).
    pub(crate) store: Option<Arc<dyn Store>>,
    /// Assistants created through the API.
    pub(crate) assistants: agent::assistants::AssistantTable,
    /// Runs started through the Agent Server API.
    pub(crate) agent_runs: agent::runs::RunTable,
}

/// Shared state of the server: the workflows, the checkpoint saver, the token, metrics and the
/// live event channels. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
}

impl AppState {
    /// State serving `registry`, with thread records in `saver` (the saver the registry's
    /// workflows checkpoint into). `token`, when set and non-empty, is required as a bearer
    /// token on every route except `/healthz` and the console's static files.
    pub fn new(registry: Registry, saver: Arc<dyn CheckpointSaver>, token: Option<String>) -> Self {
        let (closing, _) = watch::channel(false);
        AppState {
            inner: Arc::new(Inner {
                registry,
                saver,
                token: token.filter(|t| !t.is_empty()),
                max_body_bytes: DEFAULT_MAX_BODY_BYTES,
                access: access::Access::default(),
                limits: ConnectionLimits::default(),
                metrics: metrics::Metrics::new(),
                live: Mutex::new(HashMap::new()),
                active: Mutex::new(HashSet::new()),
                reconciled: Mutex::new(HashSet::new()),
                closing,
                running: Mutex::new(HashMap::new()),
                store: None,
                assistants: agent::assistants::AssistantTable::default(),
                agent_runs: agent::runs::RunTable::default(),
            }),
        }
    }

    /// Sets the largest accepted request body (413 above it). Call before [`router`].
    #[must_use]
    pub fn with_max_body_bytes(self, max: usize) -> Self {
        self.configure(|inner| inner.max_body_bytes = max)
    }

    /// Sets how many bytes of run events are kept for clients that join later. Call before
    /// [`router`].
    #[must_use]
    pub fn with_event_retention(self, retention: EventRetention) -> Self {
        self.configure(|inner| inner.agent_runs.retention = retention)
    }

    /// Sets who may call and which paths clients may name (see [`access::Access`]). Call
    /// before [`router`].
    #[must_use]
    pub fn with_access(self, access: access::Access) -> Self {
        self.configure(|inner| inner.access = access)
    }

    /// Serves `store` as the long-term store (`/store/items`, `/store/namespaces`) and keeps
    /// the assistants created through the API in it. Call before [`router`].
    #[must_use]
    pub fn with_store(self, store: Arc<dyn Store>) -> Self {
        self.configure(|inner| inner.store = Some(store))
    }

    /// Sets the header-read and idle timeouts and the connection cap that [`serve_on`]
    /// applies.
    #[must_use]
    pub fn with_connection_limits(self, limits: ConnectionLimits) -> Self {
        self.configure(|inner| inner.limits = limits)
    }

    fn configure(self, f: impl FnOnce(&mut Inner)) -> Self {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                f(&mut inner);
                AppState {
                    inner: Arc::new(inner),
                }
            }
            Err(inner) => {
                tracing::warn!("AppState configured after it was shared; ignored");
                AppState { inner }
            }
        }
    }

    /// Whether a bearer token is required.
    pub fn requires_token(&self) -> bool {
        self.inner.token.is_some()
    }

    /// Ends the open event streams (`/threads/{id}/events`), so that a graceful shutdown does
    /// not wait for clients that never disconnect.
    pub fn close_streams(&self) {
        self.inner.closing.send_replace(true);
    }

    /// Number of runs in progress through this server.
    pub fn active_runs(&self) -> usize {
        runs::lock(&self.inner.active).len()
    }
}

/// The routes, with authentication, the body limit and JSON error bodies.
pub fn router(state: AppState) -> axum::Router {
    let max = state.inner.max_body_bytes;
    api::routes()
        .merge(console::routes())
        .fallback(|| async { ApiError::from_status(StatusCode::NOT_FOUND) })
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            access::fence,
        ))
        .layer(state.inner.access.cors())
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(tower_http::limit::RequestBodyLimitLayer::new(max))
        .layer(axum::middleware::map_response(error::json_errors))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            count_responses,
        ))
        .with_state(state)
}

async fn count_responses(State(state): State<AppState>, req: Request, next: Next) -> Response {
    // Known methods only, so that clients cannot grow the label set.
    let method: &'static str = match req.method().as_str() {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    };
    let resp = next.run(req).await;
    state
        .inner
        .metrics
        .record_http(method, resp.status().as_u16());
    resp
}

/// Paths served without a token: the liveness probe and the console's static files (a browser
/// cannot send a bearer token when it navigates; the console asks for the token and sends it
/// with its API calls).
fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/" | "/console") || path.starts_with("/console/assets/")
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(token) = &state.inner.token {
        if !is_public(req.uri().path()) {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| {
                    v.strip_prefix("Bearer ")
                        .or_else(|| v.strip_prefix("bearer "))
                })
                .map(str::trim);
            let ok = given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes()));
            if !ok {
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    if given.is_some() {
                        "the bearer token is wrong"
                    } else {
                        "this server requires `Authorization: Bearer <token>`"
                    },
                )
                .into_response();
            }
        }
    }
    next.run(req).await
}

/// Resolves on Ctrl-C, or on SIGTERM on Unix (what service managers and `kill` send): the
/// moment to drain and stop.
pub async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Serves the API and console for `registry` until `shutdown` resolves.
///
/// Refuses ([`ServerError::TokenRequired`]) to bind a non-loopback address without a token.
pub async fn serve(
    options: ServeOptions,
    registry: Registry,
    saver: Arc<dyn CheckpointSaver>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let token = options.token.filter(|t| !t.is_empty());
    if !options.bind.ip().is_loopback() && token.is_none() {
        return Err(ServerError::TokenRequired(options.bind));
    }
    let roots = match &options.output_root {
        Some(out) => Some(
            ferrograph::runtime::PathRoots::new(options.workspace_roots.clone(), out)
                .map_err(ServerError::Roots)?,
        ),
        None if !options.workspace_roots.is_empty() => {
            return Err(ServerError::Roots(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "workspace roots need an output root",
            )))
        }
        None => None,
    };
    let access = access::Access {
        roots,
        allowed_hosts: options.allowed_hosts.clone(),
        allowed_origins: options.allowed_origins.clone(),
    };
    let mut state = AppState::new(registry, saver, token)
        .with_max_body_bytes(options.max_body_bytes)
        .with_access(access)
        .with_connection_limits(options.limits)
        .with_event_retention(options.event_retention);
    if let Some(store) = options.store {
        state = state.with_store(store);
    }
    let listener = tokio::net::TcpListener::bind(options.bind).await?;
    serve_on(listener, state, shutdown).await
}

/// Serves `state` on an already bound listener until `shutdown` resolves; then ends the open
/// event streams and waits for requests in progress. Refuses a non-loopback listener when no
/// token is set.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() && !state.requires_token() {
        return Err(ServerError::TokenRequired(addr));
    }
    tracing::info!(%addr, auth = state.requires_token(), "serving the ferrograph API and console");
    let app = router(state.clone());
    let closer = state.clone();
    conn::serve(listener, app, state.inner.limits, shutdown, move || {
        tracing::info!("shutting down: ending event streams");
        closer.close_streams();
    })
    .await?;
    Ok(())
}
