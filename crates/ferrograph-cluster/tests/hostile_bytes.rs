//! A node's listener against hostile bytes, on loopback: lengths that would allocate
//! gigabytes, random bytes, connections that never authenticate. The node must stay up,
//! small, and joinable by a real peer afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use ferrograph_cluster::{ClusterError, ClusterNode, Limits, NodeConfig};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const COOKIE: &str = "hostile-test-9f3b2c7e1a5d4086";

fn config(name: &str, limits: Limits) -> NodeConfig {
    let mut c = NodeConfig::new(name, "127.0.0.1:0".parse().unwrap(), COOKIE);
    c.limits = limits;
    c
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Whether the server closes `stream` within `within` (reads end of stream or an error).
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

/// The node still serves: it describes itself, and a fresh connection is held open (not
/// refused) while it may authenticate. (Joins by real peers through the same front door are
/// `ferrograph-cli`'s cluster tests: two nodes in one process share ractor's groups.)
async fn joinable(node: &ClusterNode) {
    assert!(node.nodes().await.iter().any(|n| n.name == "target"));
    let mut s = TcpStream::connect(node.listen_addr()).await.unwrap();
    assert!(!closed_within(&mut s, Duration::from_millis(200)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_lengths_and_random_bytes_close_the_connection_not_the_node() {
    let node = ClusterNode::start(config("target", Limits::default()))
        .await
        .unwrap();
    let addr: SocketAddr = node.listen_addr().parse().unwrap();
    let before = rss_bytes();

    // Eight bytes claiming 2^63 - 1 bytes.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&(i64::MAX as u64).to_be_bytes()).await.unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);

    // Fifty connections each claiming 1 GiB, held open.
    let mut held = Vec::new();
    for _ in 0..50 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&(1u64 << 30).to_be_bytes()).await.unwrap();
        s.write_all(&[0u8; 1024]).await.unwrap_or(());
        held.push(s);
    }
    for s in &mut held {
        assert!(closed_within(s, Duration::from_secs(5)).await);
    }

    // 64 KiB of random bytes, 200 times.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..200 {
        let mut bytes = vec![0u8; 64 * 1024];
        for b in bytes.iter_mut() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *b = seed as u8;
        }
        let mut s = TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(&bytes).await;
        assert!(closed_within(&mut s, Duration::from_secs(5)).await);
    }
    let grown = rss_bytes().saturating_sub(before);
    assert!(
        grown < 200 * 1024 * 1024,
        "the node grew by {grown} bytes under hostile connections"
    );
    joinable(&node).await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_excess_unauthenticated_connections_are_closed() {
    let mut limits = Limits::default();
    limits.auth_deadline = Duration::from_millis(500);
    limits.unauthenticated_connections = 4;
    let node = ClusterNode::start(config("target", limits)).await.unwrap();
    let addr: SocketAddr = node.listen_addr().parse().unwrap();

    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A fifth is closed at once: four already wait to authenticate.
    let mut fifth = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut fifth, Duration::from_millis(400)).await);
    // The four are closed at the deadline.
    for s in &mut idle {
        assert!(closed_within(s, Duration::from_secs(5)).await);
    }
    // Their slots are free again: a real peer joins.
    tokio::time::sleep(Duration::from_millis(100)).await;
    joinable(&node).await;
    node.shutdown().await;
}

#[tokio::test]
async fn weak_cookies_are_refused_with_how_to_make_one() {
    for weak in ["a", "secret", "aaaaaaaaaaaaaaaaaaaaaaaa"] {
        let c = NodeConfig::new("weak", "127.0.0.1:0".parse().unwrap(), weak);
        let err = ClusterNode::start(c).await.unwrap_err();
        assert!(matches!(err, ClusterError::WeakCookie { .. }), "{err}");
        assert!(err.to_string().contains("/dev/urandom"), "{err}");
    }
}
