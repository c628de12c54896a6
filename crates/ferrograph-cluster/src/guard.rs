//! The node's own front door: every byte a peer sends passes a frame check before
//! `ractor_cluster` sees it.
//!
//! `ractor_cluster` 0.15 reads an 8-byte length and allocates a buffer of that size before the
//! peer has authenticated, with no cap: eight bytes claiming 2^63 bytes abort the process, and
//! fifty connections claiming 1 GiB each take a node to a gigabyte. It cannot be configured
//! otherwise, so the node does not let it listen on the node's address. [`FrontDoor`] listens
//! there instead and hands each accepted connection to the node server as an external stream
//! ([`NodeServerMessage::ConnectionOpenedExternal`]) wrapped in a [`FrameGuard`], which:
//!
//! - reads each frame's length first and ends the connection when it is over the cap:
//!   [`Limits::unauthenticated_frame`] (64 KiB; the handshake's messages are a few hundred
//!   bytes) until the session is authenticated, [`Limits::frame`] after;
//! - ends a connection that has not authenticated within [`Limits::auth_deadline`];
//! - admits at most [`Limits::unauthenticated_connections`] connections that have not
//!   authenticated yet; one more is closed on accept.
//!
//! The connections this node opens (`join`) pass the same guard: a hostile node that is
//! joined gets the same caps.
//!
//! What is left: `ractor_cluster`'s own listener still exists (it cannot be turned off), bound
//! to a loopback port chosen by the kernel and announced to nobody. A process on the same
//! host can still find it; off the host it is unreachable.

use parking_lot::Mutex;
use ractor::ActorRef;
use ractor_cluster::{BoxRead, BoxWrite, ClusterBidiStream, NodeServerMessage};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The caps a node's connections are held to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// The largest frame a peer may send before its session is authenticated.
    pub unauthenticated_frame: u64,
    /// The largest frame after (the wire format's own limit is 64 MiB, plus the envelope).
    pub frame: u64,
    /// How long a connection may take to authenticate.
    pub auth_deadline: Duration,
    /// How many connections may be open and not yet authenticated at once.
    pub unauthenticated_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            unauthenticated_frame: 64 * 1024,
            frame: 80 * 1024 * 1024,
            auth_deadline: Duration::from_secs(10),
            unauthenticated_connections: 64,
        }
    }
}

/// What the front door and the session events share about one connection.
#[derive(Debug)]
struct ConnState {
    authenticated: AtomicBool,
    /// The unauthenticated-connection slot, given back when the session authenticates or
    /// the connection ends.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
}

impl ConnState {
    fn authenticate(&self) {
        self.authenticated.store(true, Ordering::Release);
        self.permit.lock().take();
    }
}

/// The connections that passed the front door, by the label the node server knows them by.
#[derive(Clone, Debug, Default)]
pub(crate) struct Connections(Arc<Mutex<HashMap<String, Arc<ConnState>>>>);

impl Connections {
    /// The session labelled `label` authenticated: its frame cap rises and its slot frees.
    pub(crate) fn authenticated(&self, label: &str) {
        if let Some(c) = self.0.lock().get(label) {
            c.authenticate();
        }
    }

    /// The session labelled `label` closed.
    pub(crate) fn closed(&self, label: &str) {
        self.0.lock().remove(label);
    }

    fn insert(&self, label: String, state: Arc<ConnState>) {
        self.0.lock().insert(label, state);
    }
}

/// Where a frame's reading stands.
#[derive(Debug)]
enum Frame {
    /// Reading the 8-byte length: the bytes seen so far.
    Length { buf: [u8; 8], have: usize },
    /// Handing the checked length to the reader: `given` of its 8 bytes given.
    GiveLength { buf: [u8; 8], given: usize },
    /// Passing a payload through: bytes left.
    Payload(u64),
    /// The connection broke a rule: end of stream from now on.
    Closed,
}

/// A read half that enforces [`Limits`] on the frames it passes.
pub(crate) struct FrameGuard<R> {
    inner: R,
    frame: Frame,
    limits: Limits,
    state: Arc<ConnState>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    peer: String,
}

impl<R> FrameGuard<R> {
    fn new(inner: R, limits: Limits, state: Arc<ConnState>, peer: String) -> Self {
        FrameGuard {
            inner,
            frame: Frame::Length {
                buf: [0; 8],
                have: 0,
            },
            limits,
            state,
            deadline: Box::pin(tokio::time::sleep(limits.auth_deadline)),
            peer,
        }
    }

    fn cap(&self) -> u64 {
        if self.state.authenticated.load(Ordering::Acquire) {
            self.limits.frame
        } else {
            self.limits.unauthenticated_frame
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for FrameGuard<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let cap = this.cap();
        if !this.state.authenticated.load(Ordering::Acquire)
            && this.deadline.as_mut().poll(cx).is_ready()
        {
            if !matches!(this.frame, Frame::Closed) {
                tracing::warn!(peer = %this.peer, "closing a cluster connection that did not authenticate in time");
            }
            this.frame = Frame::Closed;
        }
        loop {
            match &mut this.frame {
                Frame::Closed => return Poll::Ready(Ok(())),
                Frame::Length { buf, have } => {
                    let mut rb = ReadBuf::new(&mut buf[*have..]);
                    match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Ready(Ok(())) => {
                            let n = rb.filled().len();
                            if n == 0 {
                                // End of stream: pass the partial length on (the reader
                                // sees a short read and ends the session).
                                let (buf, have) = (*buf, *have);
                                let take = have.min(out.remaining());
                                out.put_slice(&buf[..take]);
                                this.frame = Frame::Closed;
                                return Poll::Ready(Ok(()));
                            }
                            *have += n;
                            if *have == 8 {
                                let length = u64::from_be_bytes(*buf);
                                if length > cap {
                                    tracing::warn!(
                                        peer = %this.peer, length, cap,
                                        "closing a cluster connection: a frame over the cap"
                                    );
                                    this.frame = Frame::Closed;
                                    return Poll::Ready(Ok(()));
                                }
                                this.frame = Frame::GiveLength {
                                    buf: *buf,
                                    given: 0,
                                };
                            }
                        }
                    }
                }
                Frame::GiveLength { buf, given } => {
                    let take = (8 - *given).min(out.remaining());
                    out.put_slice(&buf[*given..*given + take]);
                    *given += take;
                    if *given == 8 {
                        let length = u64::from_be_bytes(*buf);
                        this.frame = if length == 0 {
                            Frame::Length {
                                buf: [0; 8],
                                have: 0,
                            }
                        } else {
                            Frame::Payload(length)
                        };
                    }
                    return Poll::Ready(Ok(()));
                }
                Frame::Payload(left) => {
                    let room = usize::try_from(*left)
                        .unwrap_or(usize::MAX)
                        .min(out.remaining());
                    let mut rb = ReadBuf::new(out.initialize_unfilled_to(room));
                    match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Ready(Ok(())) => {
                            let n = rb.filled().len();
                            out.advance(n);
                            if n == 0 {
                                this.frame = Frame::Closed;
                                return Poll::Ready(Ok(()));
                            }
                            *left -= n as u64;
                            if *left == 0 {
                                this.frame = Frame::Length {
                                    buf: [0; 8],
                                    have: 0,
                                };
                            }
                            return Poll::Ready(Ok(()));
                        }
                    }
                }
            }
        }
    }
}

/// One guarded connection, as the node server takes it.
struct GuardedStream {
    reader: BoxRead,
    writer: BoxWrite,
    label: String,
}

impl ClusterBidiStream for GuardedStream {
    fn split(self: Box<Self>) -> (BoxRead, BoxWrite) {
        (self.reader, self.writer)
    }

    fn peer_label(&self) -> Option<String> {
        Some(self.label.clone())
    }
}

/// Where guarded connections go: the node server, the connections it knows, and the caps.
#[derive(Clone)]
pub(crate) struct Sessions {
    pub(crate) server: ActorRef<NodeServerMessage>,
    pub(crate) connections: Connections,
    pub(crate) limits: Limits,
}

impl Sessions {
    /// Wraps `stream` in the guard and hands it to the node server as a session labelled
    /// `label` (`is_server`: the peer opened it; `permit`: its unauthenticated slot).
    pub(crate) fn open<S>(
        &self,
        stream: S,
        label: String,
        permit: Option<OwnedSemaphorePermit>,
        is_server: bool,
    ) -> Result<(), String>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let state = Arc::new(ConnState {
            authenticated: AtomicBool::new(false),
            permit: Mutex::new(permit),
        });
        self.connections.insert(label.clone(), state.clone());
        let (read, write) = tokio::io::split(stream);
        let stream = GuardedStream {
            reader: Box::new(FrameGuard::new(read, self.limits, state, label.clone())),
            writer: Box::new(write),
            label: label.clone(),
        };
        self.server
            .cast(NodeServerMessage::ConnectionOpenedExternal {
                stream: Box::new(stream),
                is_server,
            })
            .map_err(|e| {
                self.connections.closed(&label);
                e.to_string()
            })
    }

    /// [`Sessions::open`] for an accepted connection, logging a failure.
    fn accept<S>(&self, stream: S, peer: std::net::SocketAddr, permit: OwnedSemaphorePermit)
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        if let Err(e) = self.open(stream, peer.to_string(), Some(permit), true) {
            tracing::warn!(%peer, "handing a connection to the node server: {e}");
        }
    }
}

/// The node's listener: accepts, applies TLS when configured, and opens guarded sessions.
pub(crate) struct FrontDoor {
    pub(crate) listener: TcpListener,
    pub(crate) acceptor: Option<tokio_rustls::TlsAcceptor>,
    pub(crate) sessions: Sessions,
}

impl FrontDoor {
    /// Accepts connections until the task is aborted.
    pub(crate) async fn serve(self) {
        let limits = self.sessions.limits;
        let slots = Arc::new(Semaphore::new(limits.unauthenticated_connections));
        loop {
            let (tcp, peer) = match self.listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("accepting a cluster connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                tracing::warn!(
                    %peer,
                    limit = limits.unauthenticated_connections,
                    "refusing a cluster connection: too many connections have not authenticated"
                );
                drop(tcp);
                continue;
            };
            let _ = tcp.set_nodelay(true);
            match &self.acceptor {
                None => self.sessions.accept(tcp, peer, permit),
                Some(acceptor) => {
                    let acceptor = acceptor.clone();
                    let sessions = self.sessions.clone();
                    // The handshake counts against the deadline and holds a slot.
                    tokio::spawn(async move {
                        match tokio::time::timeout(limits.auth_deadline, acceptor.accept(tcp)).await
                        {
                            Ok(Ok(tls)) => sessions.accept(tls, peer, permit),
                            Ok(Err(e)) => tracing::warn!(%peer, "TLS handshake refused: {e}"),
                            Err(_) => tracing::warn!(%peer, "TLS handshake did not finish in time"),
                        }
                    });
                }
            }
        }
    }
}

/// Why a cookie is too weak, or `None`.
pub(crate) fn cookie_weakness(cookie: &str) -> Option<String> {
    const MIN_LEN: usize = 16;
    const MIN_DISTINCT: usize = 8;
    let len = cookie.chars().count();
    let mut distinct: Vec<char> = cookie.chars().collect();
    distinct.sort_unstable();
    distinct.dedup();
    if len < MIN_LEN {
        Some(format!(
            "it has {len} characters, and a cookie needs at least {MIN_LEN}"
        ))
    } else if distinct.len() < MIN_DISTINCT {
        Some(format!(
            "it uses {} different characters, and a cookie needs at least {MIN_DISTINCT}",
            distinct.len()
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn guard(
        bytes: Vec<u8>,
        authenticated: bool,
        limits: Limits,
    ) -> FrameGuard<io::Cursor<Vec<u8>>> {
        let state = Arc::new(ConnState {
            authenticated: AtomicBool::new(authenticated),
            permit: Mutex::new(None),
        });
        FrameGuard::new(io::Cursor::new(bytes), limits, state, "test".into())
    }

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut v = (payload.len() as u64).to_be_bytes().to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[tokio::test]
    async fn frames_under_the_cap_pass_unchanged() {
        let mut bytes = frame(b"hello");
        bytes.extend(frame(&[7u8; 3000]));
        bytes.extend(frame(b""));
        bytes.extend(frame(b"end"));
        let mut g = guard(bytes.clone(), false, Limits::default());
        let mut got = Vec::new();
        g.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, bytes);
    }

    #[tokio::test]
    async fn a_length_over_the_cap_ends_the_stream_before_any_of_it() {
        let mut bytes = frame(b"ok");
        bytes.extend(u64::MAX.to_be_bytes());
        bytes.extend([1u8; 100]);
        let mut g = guard(bytes, false, Limits::default());
        let mut got = Vec::new();
        g.read_to_end(&mut got).await.unwrap();
        assert_eq!(
            got,
            frame(b"ok"),
            "the first frame passes, nothing of the second"
        );
        // The reader `ractor_cluster` uses sees end of stream on the next length.
        let mut g = guard(u64::MAX.to_be_bytes().to_vec(), false, Limits::default());
        assert_eq!(
            g.read_u64().await.unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[tokio::test]
    async fn the_cap_rises_after_authentication() {
        let big = vec![3u8; 100 * 1024];
        let mut g = guard(frame(&big), false, Limits::default());
        let mut got = Vec::new();
        g.read_to_end(&mut got).await.unwrap();
        assert!(got.is_empty(), "100 KiB before authentication is refused");
        let mut g = guard(frame(&big), true, Limits::default());
        let mut got = Vec::new();
        g.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, frame(&big));
    }

    #[tokio::test]
    async fn an_unauthenticated_stream_ends_at_the_deadline() {
        let limits = Limits {
            auth_deadline: Duration::from_millis(100),
            ..Limits::default()
        };
        let (client, server) = tokio::io::duplex(64);
        let state = Arc::new(ConnState {
            authenticated: AtomicBool::new(false),
            permit: Mutex::new(None),
        });
        let mut g = FrameGuard::new(server, limits, state, "idle".into());
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), g.read_to_end(&mut got)).await;
        assert!(matches!(read, Ok(Ok(0))), "{read:?}");
        drop(client);
    }

    #[test]
    fn weak_cookies_are_named() {
        assert!(cookie_weakness("a").is_some());
        assert!(cookie_weakness("test-secret").is_some());
        assert!(cookie_weakness("aaaaaaaaaaaaaaaaaaaaaaaa").is_some());
        assert!(cookie_weakness("3f9c1e7a5b2d8064a1c3e5f7").is_none());
    }
}
