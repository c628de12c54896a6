//! Client connections: the accept loop with its limits.
//!
//! `axum::serve` keeps a connection for as long as the client wants: a client that sends half a
//! request header, or that keeps a connection open and sends nothing, holds a task and a file
//! descriptor indefinitely, and nothing caps how many such connections there are. This loop
//! serves each connection with hyper's HTTP/1 server and bounds three things:
//!
//! - **header read time** (hyper's own timer): a request's header must arrive in full within
//!   [`ConnectionLimits::header_read_timeout`] of the connection opening or of its first byte;
//! - **idle time**: a connection with no request in progress and no byte read or written for
//!   [`ConnectionLimits::idle_timeout`] is closed (an open event stream is a request in
//!   progress and sends keep-alive comments, so it is never idle);
//! - **connections**: at most [`ConnectionLimits::max_connections`] at once; one more is answered
//!   `503 Service Unavailable` with `Retry-After` and closed.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

/// Limits on the server's client connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Longest time a request's header may take to arrive in full.
    pub header_read_timeout: Duration,
    /// A connection with no request in progress and no traffic for this long is closed.
    pub idle_timeout: Duration,
    /// Most connections served at once; one more is answered 503 and closed.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 512,
        }
    }
}

/// What a connection has done lately: when it last moved a byte, and how many requests are in
/// progress on it.
#[derive(Debug)]
struct Activity {
    start: Instant,
    /// Milliseconds after `start` of the last byte read or written.
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        })
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Time since the last byte, or `None` while a request is in progress.
    fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        Some(self.start.elapsed().saturating_sub(last))
    }
}

/// Counts a request as in progress until the response body is dropped (sent in full, or the
/// connection gone).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(activity: &Arc<Activity>) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A TCP stream that records its traffic in an [`Activity`].
struct Tracked {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The answer to a connection over the cap.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
retry-after: 1\r\nconnection: close\r\ncontent-length: 83\r\n\r\n\
{\"error\":\"too_many_connections\",\"message\":\"the server is at its connection limit\"}\n";

async fn refuse(mut stream: TcpStream) {
    // Best effort: the client may already be gone, and a slow one must not hold a task.
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = stream.write_all(BUSY).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Accept errors that concern one connection (the client gave up); the loop goes on at once.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Serves `app` on `listener` within `limits` until `shutdown` resolves; then asks every open
/// connection to close after its request in progress (`on_shutdown` runs first, to end event
/// streams) and waits for them.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_shutdown: impl FnOnce() + Send,
) -> io::Result<()> {
    let max = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let permits = Arc::new(Semaphore::new(max));
    let (closing_tx, closing_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::error!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(max, "connection refused: at the connection limit");
            tokio::spawn(refuse(stream));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let closing = closing_rx.clone();
        tokio::spawn(async move {
            serve_one(stream, app, limits, closing).await;
            drop(permit);
        });
    }
    on_shutdown();
    let _ = closing_tx.send(true);
    // Every connection holds a permit until it ends.
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let _ = permits.acquire_many(all).await;
    Ok(())
}

async fn serve_one(
    stream: TcpStream,
    app: Router,
    limits: ConnectionLimits,
    mut closing: watch::Receiver<bool>,
) {
    let activity = Activity::new();
    let io = TokioIo::new(Tracked {
        stream,
        activity: activity.clone(),
    });
    let requests = activity.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let in_flight = InFlight::new(&requests);
        let app = app.clone();
        async move {
            let response = app.oneshot(req.map(Body::new)).await?;
            // The request stays in progress until its body has been sent (or dropped).
            Ok::<_, std::convert::Infallible>(response.map(move |body| {
                Body::new(body.map_frame(move |frame| {
                    let _ = &in_flight;
                    frame
                }))
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let tick = (limits.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
    let mut asked_to_close = false;
    loop {
        tokio::select! {
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            changed = closing.changed(), if !asked_to_close => {
                if changed.is_err() || *closing.borrow() {
                    asked_to_close = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
            () = tokio::time::sleep(tick), if !asked_to_close => {
                if activity.idle_for().is_some_and(|idle| idle >= limits.idle_timeout) {
                    tracing::debug!("closing an idle connection");
                    asked_to_close = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_answer_has_the_length_it_claims() {
        let text = std::str::from_utf8(BUSY).unwrap_or_default();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or_default();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(serde_json::from_str::<serde_json::Value>(body).is_ok());
    }

    #[test]
    fn a_request_in_progress_is_never_idle() {
        let activity = Activity::new();
        let guard = InFlight::new(&activity);
        assert_eq!(activity.idle_for(), None);
        drop(guard);
        assert!(activity.idle_for().is_some());
    }
}
