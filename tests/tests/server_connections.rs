//! Connection limits of `ferrograph serve`: a request header that does not arrive in time, a
//! connection that sits idle, and connections over the cap are cut off; an open event stream is
//! not idle.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use ferrograph::checkpoint_savers::SledSaver;
use ferrograph::{CheckpointSaver, Runtime};
use ferrograph_server::{AppState, ConnectionLimits};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Server {
    addr: String,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn start(limits: ConnectionLimits) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let saver: Arc<dyn CheckpointSaver> = SledSaver::open(dir.path().join("db")).unwrap();
    let runtime = Runtime::new().await.unwrap();
    let registry = ferrograph_basics::registry(&runtime, saver.clone())
        .await
        .unwrap();
    let state = AppState::new(registry, saver, None).with_connection_limits(limits);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(ferrograph_server::serve_on(listener, state, async move {
        let _ = stopped.await;
    }));
    Server {
        addr,
        _dir: dir,
        stop: Some(stop),
    }
}

fn limits(header: f64, idle: f64, max: usize) -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: Duration::from_secs_f64(header),
        idle_timeout: Duration::from_secs_f64(idle),
        max_connections: max,
    }
}

/// Reads until the peer closes; `None` if it is still open after `wait`.
async fn closed_within(s: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let deadline = Instant::now() + wait;
    loop {
        let mut buf = [0u8; 4096];
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads one response's head and `Content-Length` body from a kept-alive connection.
async fn read_response(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    loop {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("a response")
            .unwrap();
        assert!(n > 0, "closed before the response was complete");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if body.len() >= len {
                return text;
            }
        }
    }
}

async fn get(s: &mut TcpStream, addr: &str, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    read_response(s).await
}

#[tokio::test]
async fn a_header_that_does_not_arrive_in_time_closes_the_connection() {
    let server = start(limits(1.0, 60.0, 64)).await;

    // Half a header, then nothing.
    let mut s = TcpStream::connect(&server.addr).await.unwrap();
    let begun = Instant::now();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let answer = closed_within(&mut s, Duration::from_secs(8)).await;
    assert!(answer.is_some(), "a half-sent header held the connection");
    let took = begun.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "closed before the timeout: {took:?}"
    );

    // A header dribbled a byte at a time (slowloris) is cut off too.
    let mut s = TcpStream::connect(&server.addr).await.unwrap();
    let begun = Instant::now();
    let header = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut cut_off = false;
    for byte in header {
        if s.write_all(&[*byte]).await.is_err() {
            cut_off = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        if begun.elapsed() > Duration::from_secs(8) {
            break;
        }
    }
    if !cut_off {
        let rest = closed_within(&mut s, Duration::from_secs(1)).await;
        cut_off = rest.is_some_and(|r| !String::from_utf8_lossy(&r).contains("200 OK"));
    }
    assert!(
        cut_off,
        "a dribbled header was served after {:?}",
        begun.elapsed()
    );

    // A prompt client is served.
    let mut s = TcpStream::connect(&server.addr).await.unwrap();
    assert!(get(&mut s, &server.addr, "/healthz")
        .await
        .starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn an_idle_connection_is_closed_but_an_open_event_stream_is_not() {
    let server = start(limits(30.0, 1.0, 64)).await;

    // Served once, then idle: closed after about a second.
    let mut s = TcpStream::connect(&server.addr).await.unwrap();
    assert!(get(&mut s, &server.addr, "/healthz")
        .await
        .starts_with("HTTP/1.1 200"));
    let begun = Instant::now();
    assert!(
        closed_within(&mut s, Duration::from_secs(8))
            .await
            .is_some(),
        "an idle connection stayed open"
    );
    assert!(begun.elapsed() >= Duration::from_millis(900));

    // Kept busy with requests more often than the idle time: stays open.
    let mut s = TcpStream::connect(&server.addr).await.unwrap();
    for _ in 0..5 {
        assert!(get(&mut s, &server.addr, "/healthz")
            .await
            .starts_with("HTTP/1.1 200"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // An event stream is a request in progress: not idle, however quiet.
    let mut c = TcpStream::connect(&server.addr).await.unwrap();
    let body = r#"{"workflow":"review"}"#;
    let req = format!(
        "POST /threads HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr,
        body.len()
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let created = read_response(&mut c).await;
    assert!(created.starts_with("HTTP/1.1 201"), "{created}");
    let json = created.split_once("\r\n\r\n").unwrap().1;
    let id = serde_json::from_str::<serde_json::Value>(json).unwrap()["thread_id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut ev = TcpStream::connect(&server.addr).await.unwrap();
    let req = format!(
        "GET /threads/{id}/events HTTP/1.1\r\nHost: {}\r\n\r\n",
        server.addr
    );
    ev.write_all(req.as_bytes()).await.unwrap();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), ev.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    assert!(
        closed_within(&mut ev, Duration::from_secs(3))
            .await
            .is_none(),
        "an open event stream was closed as idle"
    );
}

#[tokio::test]
async fn connections_over_the_cap_are_answered_503_and_a_freed_slot_is_reused() {
    let server = start(limits(30.0, 30.0, 2)).await;
    let mut a = TcpStream::connect(&server.addr).await.unwrap();
    let b = TcpStream::connect(&server.addr).await.unwrap();
    // Both are accepted (served) before the third arrives.
    assert!(get(&mut a, &server.addr, "/healthz")
        .await
        .starts_with("HTTP/1.1 200"));

    let mut c = TcpStream::connect(&server.addr).await.unwrap();
    let answer = closed_within(&mut c, Duration::from_secs(5))
        .await
        .expect("the connection over the cap was held open");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("retry-after: 1"));
    assert!(text.contains("too_many_connections"));

    // A slot freed by a client that leaves is given to the next one.
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut d = TcpStream::connect(&server.addr).await.unwrap();
        let req = format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", server.addr);
        d.write_all(req.as_bytes()).await.unwrap();
        let answer = closed_within(&mut d, Duration::from_millis(500)).await;
        match answer {
            // Still full: the server answered 503 and closed.
            Some(text) if String::from_utf8_lossy(&text).starts_with("HTTP/1.1 503") => {}
            // Served (kept alive, so still open) or answered 200 before closing.
            None => break,
            Some(text) if String::from_utf8_lossy(&text).starts_with("HTTP/1.1 200") => break,
            Some(text) => panic!("unexpected answer: {}", String::from_utf8_lossy(&text)),
        }
        assert!(Instant::now() < deadline, "the freed slot was never reused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
