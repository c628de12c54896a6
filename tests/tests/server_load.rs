//! Load test of the HTTP API: 1,000 threads of the `review` workflow at once over loopback, each
//! created, run to its interrupt and resumed with an approval, all through HTTP against a sled
//! checkpoint store. Prints p50/p99 request latency and proves that no run was lost: every
//! thread ends `done` with its own state.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ferrograph::checkpoint_savers::SledSaver;
use ferrograph::prelude::*;
use ferrograph::CheckpointSaver;
use ferrograph_server::{serve_on, AppState, ConnectionLimits};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

const THREADS: usize = 1000;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn call(
    client: &HttpClient,
    base: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value, Duration) {
    let started = Instant::now();
    let req = Request::builder()
        .method(method)
        .uri(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            body.map(|b| b.to_string()).unwrap_or_default(),
        )))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let elapsed = started.elapsed();
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, value, elapsed)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_review_threads_lose_no_run() {
    let dir = tempfile::tempdir().unwrap();
    let saver: Arc<dyn CheckpointSaver> = SledSaver::open(dir.path().join("db")).unwrap();
    let runtime = Runtime::new().await.unwrap();
    let registry = ferrograph_basics::registry(&runtime, saver.clone())
        .await
        .unwrap();
    // A thousand clients at once: above the default connection cap (512), which is not what
    // this test is about.
    let state = AppState::new(registry, saver, None).with_connection_limits(ConnectionLimits {
        max_connections: 2 * THREADS,
        ..ConnectionLimits::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_on(listener, state, async move {
        let _ = stopped.await;
    }));
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(THREADS)
        .build_http();

    let started = Instant::now();
    let mut tasks = Vec::with_capacity(THREADS);
    for i in 0..THREADS {
        let client = client.clone();
        let base = base.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("load-{i:04}");
            let title = format!("change number {i}");
            let mut lat = Vec::with_capacity(3);
            let (s, t, d) = call(
                &client,
                &base,
                Method::POST,
                "/threads",
                Some(json!({"workflow": "review", "thread_id": id})),
            )
            .await;
            assert_eq!(s, StatusCode::CREATED, "{t}");
            lat.push(d);
            let runs = format!("/threads/{id}/runs");
            let (s, out, d) = call(
                &client,
                &base,
                Method::POST,
                &runs,
                Some(json!({"input": {"title": title, "files": [format!("f{i}.rs")]}})),
            )
            .await;
            assert_eq!(s, StatusCode::OK, "{out}");
            assert_eq!(out["status"], "interrupted", "{out}");
            assert_eq!(out["interrupts"][0]["value"]["title"], title.as_str());
            lat.push(d);
            let (s, out, d) = call(
                &client,
                &base,
                Method::POST,
                &runs,
                Some(json!({"command": {"resume": "approve"}})),
            )
            .await;
            assert_eq!(s, StatusCode::OK, "{out}");
            assert_eq!(out["status"], "done", "{out}");
            lat.push(d);
            lat
        }));
    }
    let mut latencies = Vec::with_capacity(THREADS * 3);
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    let wall = started.elapsed();
    latencies.sort();
    let p50 = percentile(&latencies, 0.50);
    let p99 = percentile(&latencies, 0.99);
    println!(
        "server load: {THREADS} threads, {} requests in {:.2?} ({:.0} req/s); latency p50 {:.2?}, p99 {:.2?}, max {:.2?}",
        latencies.len(),
        wall,
        latencies.len() as f64 / wall.as_secs_f64(),
        p50,
        p99,
        latencies.last().unwrap()
    );

    // No run lost: every thread is done, with its own state.
    let (s, listed, _) = call(&client, &base, Method::GET, "/threads?status=done", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(listed["total"], THREADS, "every thread is done");
    let (_, busy, _) = call(&client, &base, Method::GET, "/threads?status=running", None).await;
    assert_eq!(busy["total"], 0);
    let (_, waiting, _) = call(
        &client,
        &base,
        Method::GET,
        "/threads?status=interrupted",
        None,
    )
    .await;
    assert_eq!(waiting["total"], 0);
    let mut checks = Vec::new();
    for i in (0..THREADS).step_by(7) {
        let client = client.clone();
        let base = base.clone();
        checks.push(tokio::spawn(async move {
            let (s, st, _) = call(
                &client,
                &base,
                Method::GET,
                &format!("/threads/load-{i:04}/state"),
                None,
            )
            .await;
            assert_eq!(s, StatusCode::OK);
            let v = &st["values"];
            assert_eq!(v["title"], format!("change number {i}"));
            assert_eq!(v["files"], json!([format!("f{i}.rs")]));
            assert_eq!(
                (v["decision"].as_str(), v["published"].as_bool()),
                (Some("approved"), Some(true))
            );
            assert_eq!(v["revisions"], 1);
        }));
    }
    for c in checks {
        c.await.unwrap();
    }
    let req = Request::builder()
        .uri(format!("{base}/metrics"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let metrics = client
        .request(req)
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    let metrics = String::from_utf8_lossy(&metrics);
    for needle in [
        format!("ferrograph_runs_total{{workflow=\"review\",status=\"done\"}} {THREADS}"),
        format!("ferrograph_runs_total{{workflow=\"review\",status=\"interrupted\"}} {THREADS}"),
        "ferrograph_interrupts_pending 0".to_string(),
        "ferrograph_runs_active 0".to_string(),
    ] {
        assert!(metrics.contains(&needle), "metrics lack {needle}");
    }
    assert!(!metrics.contains("status=\"failed\""));

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
