//! HTTP API, event streams, web console and metrics for ferrograph (being built: see issue 8).

use ferrograph::CheckpointSaver;
use ferrograph_workflows::Registry;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

/// Settings of `ferrograph serve`.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Address to bind; 127.0.0.1 by default. Any other address requires `token`.
    pub bind: SocketAddr,
    /// Bearer token required on every request (except `/healthz`) when set.
    pub token: Option<String>,
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
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
}

/// Serves the API and console for `registry` until `shutdown` resolves.
pub async fn serve(
    options: ServeOptions,
    registry: Registry,
    saver: Arc<dyn CheckpointSaver>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let _ = (registry, saver);
    if !options.bind.ip().is_loopback() && options.token.is_none() {
        return Err(ServerError::TokenRequired(options.bind));
    }
    let listener = tokio::net::TcpListener::bind(options.bind).await?;
    tracing::info!(addr = %listener.local_addr()?, "serving");
    shutdown.await;
    Ok(())
}
