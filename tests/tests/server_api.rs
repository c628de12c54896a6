//! The HTTP API end to end: a real server on 127.0.0.1:0 over a sled checkpoint store, driven by
//! a real HTTP client. Every route, SSE streaming, the review loop, the error cases (400, 401,
//! 404, 405, 409, 413, 415, 422) and the token rule for non-loopback binds.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use ferrograph::checkpoint_savers::SledSaver;
use ferrograph::core::stream::NodeEventKind;
use ferrograph::prelude::*;
use ferrograph::runtime::{InputPath, PathRoots};
use ferrograph::CheckpointSaver;
use ferrograph::{Entry, Registry};
use ferrograph_server::access::Access;
use ferrograph_server::{serve, serve_on, AppState, EventRetention, ServeOptions, ServerError};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

// ---- a scripted chat model and a gated slow node, registered next to the built-ins ----------

#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
struct Chat {
    prompt: String,
    reply: String,
}

/// The path fields of the `paths` test workflow.
const PATHS_FIELDS: &[InputPath] = &[
    InputPath::read("repository"),
    InputPath::output("out_dir"),
    InputPath::remote("remote"),
];

const SCRIPT: &str = "Sure, here is a short answer from the scripted model";

fn chat_graph() -> CompiledGraph<Chat> {
    StateGraph::<Chat>::new("chat")
        .add_node("model", |s: Arc<Chat>, ctx: NodeContext| async move {
            ctx.emit(NodeEventKind::ToolStart {
                call_id: "c1".into(),
                tool: "lookup".into(),
            })
            .await;
            ctx.emit(NodeEventKind::ToolEnd {
                call_id: "c1".into(),
                tool: "lookup".into(),
                status: "success".into(),
                duration: Duration::from_millis(2),
            })
            .await;
            let mut reply = String::new();
            for word in SCRIPT.split(' ') {
                ctx.emit(NodeEventKind::Token {
                    model: "scripted-1".into(),
                    text: format!("{word} "),
                })
                .await;
                reply.push_str(word);
                reply.push(' ');
            }
            Ok::<_, NodeError>(ChatUpdate::new().reply(format!("{}: {}", s.prompt, reply.trim())))
        })
        .add_edge(START, "model")
        .add_edge("model", END)
        .compile()
        .unwrap()
}

static GATE_OPEN: AtomicBool = AtomicBool::new(false);

#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
struct Slow {
    done: bool,
}

fn slow_graph() -> CompiledGraph<Slow> {
    StateGraph::<Slow>::new("slow")
        .add_node("wait", |_s: Arc<Slow>, _ctx: NodeContext| async move {
            while !GATE_OPEN.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok::<_, NodeError>(SlowUpdate::new().done(true))
        })
        .add_edge(START, "wait")
        .add_edge("wait", END)
        .compile()
        .unwrap()
}

/// Sleeps `ms` milliseconds per run and counts its naps (for cancellation and multitasking).
#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
struct Nap {
    ms: u64,
    #[reducer(add)]
    naps: u64,
}

fn nap_graph() -> CompiledGraph<Nap> {
    StateGraph::<Nap>::new("nap")
        .add_node("nap", |s: Arc<Nap>, _ctx: NodeContext| async move {
            tokio::time::sleep(Duration::from_millis(s.ms)).await;
            Ok::<_, NodeError>(NapUpdate::new().naps(1u64))
        })
        .add_edge(START, "nap")
        .add_edge("nap", END)
        .compile()
        .unwrap()
}

fn chat_sample() -> Value {
    json!({ "prompt": "hello" })
}

fn chat_parse(text: &str) -> Value {
    json!({ "prompt": text })
}

fn slow_sample() -> Value {
    json!({})
}

fn slow_parse(_: &str) -> Value {
    json!({})
}

struct Server {
    base: String,
    state: AppState,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), ServerError>>,
    _runtime: Runtime,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start(token: Option<&str>, max_body: Option<usize>) -> Server {
        Server::start_with(token, max_body, None).await
    }

    async fn start_with(
        token: Option<&str>,
        max_body: Option<usize>,
        access: Option<Access>,
    ) -> Server {
        Server::start_configured(token, max_body, access, None).await
    }

    async fn start_configured(
        token: Option<&str>,
        max_body: Option<usize>,
        access: Option<Access>,
        retention: Option<EventRetention>,
    ) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let saver: Arc<dyn CheckpointSaver> = SledSaver::open(dir.path().join("db")).unwrap();
        let runtime = Runtime::new().await.unwrap();
        let mut registry: Registry = ferrograph_basics::registry(&runtime, saver.clone())
            .await
            .unwrap();
        let chat = runtime
            .load(chat_graph())
            .await
            .unwrap()
            .with_checkpointer(saver.clone());
        registry.insert(
            "chat",
            Entry {
                workflow: Arc::new(chat),
                description: "a scripted model that streams tokens and calls a tool",
                parse_input: chat_parse,
                sample_input: chat_sample,
                parse_args: None,
                input_paths: &[],
            },
        );
        let slow = runtime
            .load(slow_graph())
            .await
            .unwrap()
            .with_checkpointer(saver.clone());
        registry.insert(
            "slow",
            Entry {
                workflow: Arc::new(slow),
                description: "waits for the test to open a gate",
                parse_input: slow_parse,
                sample_input: slow_sample,
                parse_args: None,
                input_paths: &[],
            },
        );
        // The review workflow again, declaring two path fields, for the confinement tests.
        let nap = runtime
            .load(nap_graph())
            .await
            .unwrap()
            .with_checkpointer(saver.clone());
        registry.insert(
            "nap",
            Entry {
                workflow: Arc::new(nap),
                description: "sleeps as long as asked",
                parse_input: slow_parse,
                sample_input: slow_sample,
                parse_args: None,
                input_paths: &[],
            },
        );
        let review = registry.get("review").unwrap().workflow.clone();
        registry.insert(
            "paths",
            Entry {
                workflow: review,
                description: "review, with a read path and an output path in its input",
                parse_input: chat_parse,
                sample_input: chat_sample,
                parse_args: None,
                input_paths: PATHS_FIELDS,
            },
        );
        let mut state = AppState::new(registry, saver, token.map(str::to_string));
        if let Some(a) = access {
            state = state.with_access(a);
        }
        if let Some(m) = max_body {
            state = state.with_max_body_bytes(m);
        }
        if let Some(r) = retention {
            state = state.with_event_retention(r);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_on(listener, state.clone(), async move {
            let _ = stopped.await;
        }));
        Server {
            base: format!("http://{addr}"),
            state,
            stop: Some(stop),
            task,
            _runtime: runtime,
            _dir: dir,
        }
    }

    async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("the server stops within 10 s")
            .unwrap()
            .unwrap();
    }
}

// ---- a small HTTP client -----------------------------------------------------------------------

#[derive(Clone)]
struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    token: Option<String>,
}

struct Resp {
    status: StatusCode,
    headers: hyper::HeaderMap,
    body: Bytes,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }

    /// The error code of a JSON error body.
    fn code(&self) -> String {
        let v = self.json();
        assert!(v["error"]["message"].is_string(), "error body: {v}");
        v["error"]["code"].as_str().unwrap().to_string()
    }
}

impl Http {
    fn new(base: &str, token: Option<&str>) -> Http {
        Http {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: base.to_string(),
            token: token.map(str::to_string),
        }
    }

    fn request(&self, method: Method, path: &str) -> hyper::http::request::Builder {
        let mut b = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        b
    }

    async fn send(&self, req: Request<Full<Bytes>>) -> Resp {
        let resp = self.client.request(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        Resp {
            status,
            headers,
            body,
        }
    }

    async fn get(&self, path: &str) -> Resp {
        let req = self
            .request(Method::GET, path)
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.send(req).await
    }

    async fn delete(&self, path: &str) -> Resp {
        let req = self
            .request(Method::DELETE, path)
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.send(req).await
    }

    async fn post(&self, path: &str, body: Value) -> Resp {
        self.post_raw(path, "application/json", body.to_string().into_bytes())
            .await
    }

    async fn post_raw(&self, path: &str, content_type: &str, body: Vec<u8>) -> Resp {
        let req = self
            .request(Method::POST, path)
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        self.send(req).await
    }

    /// Opens a response whose body is read incrementally (SSE).
    async fn open(&self, method: Method, path: &str, body: Option<Value>) -> Sse {
        let mut b = self.request(method, path);
        if body.is_some() {
            b = b.header("content-type", "application/json");
        }
        let req = b
            .body(Full::new(Bytes::from(
                body.map(|v| v.to_string()).unwrap_or_default(),
            )))
            .unwrap();
        let resp = self.client.request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        Sse {
            body: resp.into_body(),
            buf: String::new(),
        }
    }
}

/// A Server-Sent Events reader.
struct Sse {
    body: hyper::body::Incoming,
    buf: String,
}

impl Sse {
    /// The next event (name, data as JSON), skipping comments; `None` at the end of the stream.
    async fn next(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(i) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..i + 2).collect();
                let mut kind = "message".to_string();
                let mut data = Vec::new();
                for line in block.lines() {
                    if let Some(k) = line.strip_prefix("event:") {
                        kind = k.trim().to_string();
                    } else if let Some(d) = line.strip_prefix("data:") {
                        data.push(d.strip_prefix(' ').unwrap_or(d).to_string());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                return Some((kind, serde_json::from_str(&data.join("\n")).unwrap()));
            }
            let frame = tokio::time::timeout(Duration::from_secs(20), self.body.frame())
                .await
                .expect("an SSE event within 20 s")?
                .unwrap();
            if let Ok(data) = frame.into_data() {
                self.buf.push_str(&String::from_utf8_lossy(&data));
            }
        }
    }

    /// Reads events until one named `kind`; returns every event read.
    async fn until(&mut self, kind: &str) -> Vec<(String, Value)> {
        let mut seen = Vec::new();
        while let Some(ev) = self.next().await {
            let stop = ev.0 == kind;
            seen.push(ev);
            if stop {
                return seen;
            }
        }
        panic!("stream ended before `{kind}`: {seen:?}");
    }
}

async fn create(http: &Http, workflow: &str, id: Option<&str>) -> String {
    let mut body = json!({ "workflow": workflow });
    if let Some(id) = id {
        body["thread_id"] = json!(id);
    }
    let r = http.post("/threads", body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let v = r.json();
    assert_eq!(v["status"], "idle");
    assert_eq!(v["workflow"], workflow);
    v["thread_id"].as_str().unwrap().to_string()
}

// ---- tests -------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_loop_and_every_thread_route() {
    let server = Server::start(None, None).await;
    let http = Http::new(&server.base, None);

    // Service routes.
    let r = http.get("/healthz").await;
    assert_eq!(
        (r.status, r.json()),
        (StatusCode::OK, json!({"status": "ok"}))
    );
    let wf = http.get("/workflows").await.json();
    let names: Vec<&str> = wf["workflows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["chat", "demo", "nap", "paths", "review", "slow"]);
    let review = &wf["workflows"][4];
    assert!(review["mermaid"].as_str().unwrap().contains("human_review"));
    assert!(review["nodes"]
        .as_array()
        .unwrap()
        .contains(&json!("draft")));
    assert!(review["sample_input"]["title"].is_string());
    let doc = http.get("/openapi.json").await.json();
    assert_eq!(doc["openapi"], "3.0.3");
    for path in [
        "/healthz",
        "/metrics",
        "/openapi.json",
        "/workflows",
        "/threads",
        "/threads/{id}",
        "/threads/{id}/state",
        "/threads/{id}/history",
        "/threads/{id}/runs",
        "/threads/{id}/events",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is documented");
    }
    assert!(doc["paths"]["/threads/{id}/runs"]["post"]["responses"]["409"].is_object());

    // Threads: create (generated and given ids), duplicates, unknown workflows, bad ids.
    let generated = create(&http, "review", None).await;
    assert_eq!(generated.len(), 32);
    let id = create(&http, "review", Some("review-1")).await;
    let r = http
        .post(
            "/threads",
            json!({"workflow": "review", "thread_id": "review-1"}),
        )
        .await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::CONFLICT, "thread_exists".into())
    );
    let r = http.post("/threads", json!({"workflow": "nope"})).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::NOT_FOUND, "workflow_not_found".into())
    );
    for bad in ["a/b c", ".", "..", ".hidden", "", "x/../y"] {
        let r = http
            .post("/threads", json!({"workflow": "review", "thread_id": bad}))
            .await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{bad:?}");
        assert_eq!(r.json()["error"]["code"], "invalid_thread_id", "{bad:?}");
    }
    let r = http.get("/threads?status=idle").await.json();
    assert_eq!(r["total"], 2);
    let r = http.get("/threads/review-1/state").await.json();
    assert_eq!(r["values"], json!({}));
    assert_eq!(
        http.get("/threads/review-1/history").await.json(),
        json!({"history": []})
    );

    // The review loop: run -> interrupted -> feedback -> interrupted -> approve -> done.
    let out = http
        .post(
            &format!("/threads/{id}/runs"),
            json!({"input": {"title": "Retry on rate limits", "files": ["retry.rs"]}}),
        )
        .await;
    assert_eq!(out.status, StatusCode::OK, "{}", out.text());
    let out = out.json();
    assert_eq!(out["status"], "interrupted");
    let payload = &out["interrupts"][0]["value"];
    assert_eq!(payload["kind"], "review");
    assert!(payload["summary"].as_str().unwrap().contains("`retry.rs`"));
    let t = http.get(&format!("/threads/{id}")).await.json();
    assert_eq!(t["run_status"], "interrupted");
    assert_eq!(t["pending_interrupts"][0]["value"]["kind"], "review");
    let listed = http.get("/threads?status=interrupted").await.json();
    assert_eq!(listed["threads"][0]["thread_id"], id.as_str());

    // A resume value the workflow does not understand: 422, and the interrupt stays open.
    let r = http
        .post(
            &format!("/threads/{id}/runs"),
            json!({"command": {"resume": "maybe"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let err = r.json();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unrecognized review answer"),
        "{err}"
    );
    let t = http.get(&format!("/threads/{id}")).await.json();
    assert_eq!(t["run_status"], "interrupted", "{t}");
    assert_eq!(t["pending_interrupts"].as_array().unwrap().len(), 1);

    let out = http
        .post(
            &format!("/threads/{id}/runs"),
            json!({"command": {"resume": {"feedback": "add a test"}}}),
        )
        .await
        .json();
    assert_eq!(out["status"], "interrupted");
    assert_eq!(out["state"]["revisions"], 2);
    // Addressed by interrupt id.
    let pending = out["interrupts"][0]["id"].as_str().unwrap().to_string();
    let out = http
        .post(
            &format!("/threads/{id}/runs"),
            json!({"command": {"resume": {pending.as_str(): "approve"}}}),
        )
        .await;
    assert_eq!(out.status, StatusCode::OK, "{}", out.text());
    let out = out.json();
    assert_eq!(out["status"], "done");
    assert_eq!(out["state"]["published"], true);
    assert_eq!(out["state"]["decision"], "approved");
    assert_eq!(out["state"]["feedback"], json!(["add a test"]));

    // Nothing left to resume.
    let r = http
        .post(
            &format!("/threads/{id}/runs"),
            json!({"command": {"resume": "approve"}}),
        )
        .await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::CONFLICT, "no_pending_interrupt".into())
    );
    assert_eq!(
        http.get(&format!("/threads/{id}")).await.json()["run_status"],
        "done"
    );

    // State, history, update as a node.
    let s = http.get(&format!("/threads/{id}/state")).await.json();
    assert_eq!(s["values"]["decision"], "approved");
    let h = http.get(&format!("/threads/{id}/history")).await.json();
    let history = h["history"].as_array().unwrap();
    assert!(history.len() >= 6, "{h}");
    assert_eq!(history[0]["checkpoint_id"], s["checkpoint_id"]);
    let h2 = http
        .get(&format!("/threads/{id}/history?limit=2"))
        .await
        .json();
    assert_eq!(h2["history"].as_array().unwrap().len(), 2);
    let old = history.last().unwrap()["checkpoint_id"].as_str().unwrap();
    let s_old = http
        .get(&format!("/threads/{id}/state?checkpoint_id={old}"))
        .await
        .json();
    assert_eq!(s_old["checkpoint_id"], old);
    let r = http
        .get(&format!("/threads/{id}/state?checkpoint_id=ffff"))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let u = http
        .post(
            &format!("/threads/{id}/state"),
            json!({"values": {"title": "Edited"}, "as_node": "draft"}),
        )
        .await;
    assert_eq!(u.status, StatusCode::OK, "{}", u.text());
    let cp = u.json()["checkpoint_id"].as_str().unwrap().to_string();
    let s = http.get(&format!("/threads/{id}/state")).await.json();
    assert_eq!(
        (s["checkpoint_id"].as_str().unwrap(), &s["values"]["title"]),
        (cp.as_str(), &json!("Edited"))
    );
    assert_eq!(s["next"], json!(["human_review"]));
    let r = http
        .post(
            &format!("/threads/{id}/state"),
            json!({"values": {"revisions": "many"}}),
        )
        .await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_input".into())
    );
    let r = http
        .post(
            &format!("/threads/{id}/state"),
            json!({"values": {}, "as_node": "nobody"}),
        )
        .await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::UNPROCESSABLE_ENTITY, "unknown_node".into())
    );

    // Continue (no input, no command) runs from the edited state: back to the interrupt.
    let out = http
        .post(&format!("/threads/{id}/runs"), json!({}))
        .await
        .json();
    assert_eq!(out["status"], "interrupted", "{out}");
    assert_eq!(out["interrupts"][0]["value"]["title"], "Edited");

    // Metrics.
    let m = http.get("/metrics").await;
    assert!(m.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let m = m.text();
    for needle in [
        "ferrograph_runs_total{workflow=\"review\",status=\"done\"} 1",
        "ferrograph_runs_total{workflow=\"review\",status=\"failed\"} 1",
        "ferrograph_interrupts_pending 1",
        "ferrograph_node_duration_seconds_count{workflow=\"review\",node=\"draft\"}",
        "ferrograph_steps_total{workflow=\"review\"}",
        "ferrograph_threads{status=\"idle\"} 1",
    ] {
        assert!(m.contains(needle), "metrics lack {needle}:\n{m}");
    }

    // Delete.
    let r = http.delete(&format!("/threads/{id}")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    for path in ["", "/state", "/history", "/events"] {
        let r = http.get(&format!("/threads/{id}{path}")).await;
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::NOT_FOUND, "thread_not_found".into()),
            "{path}"
        );
    }
    let r = http.delete(&format!("/threads/{id}")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = http.post(&format!("/threads/{id}/runs"), json!({})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = http
        .post(&format!("/threads/{id}/state"), json!({"values": {}}))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_stream_server_sent_events_and_the_live_channel_follows_the_thread() {
    let server = Server::start(None, None).await;
    let http = Http::new(&server.base, None);
    let id = create(&http, "review", Some("sse-1")).await;

    // The live channel of the thread, open before the run starts.
    let mut live = http.open(Method::GET, "/threads/sse-1/events", None).await;
    let (kind, first) = live.next().await.unwrap();
    assert_eq!(
        (kind.as_str(), &first["run_status"]),
        ("thread", &json!("idle"))
    );

    // A streamed run: events in the requested modes, then `end` with the outcome.
    let mut run = http
        .open(
            Method::POST,
            &format!("/threads/{id}/runs"),
            Some(json!({"input": {"title": "Streamed"}, "stream": true, "stream_mode": ["updates", "tasks"]})),
        )
        .await;
    let events = run.until("end").await;
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        kinds.contains(&"task_start") && kinds.contains(&"task_end"),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&"updates") && kinds.contains(&"interrupt"),
        "{kinds:?}"
    );
    assert!(
        !kinds.contains(&"values"),
        "values were not asked for: {kinds:?}"
    );
    let update = events.iter().find(|(k, _)| k == "updates").unwrap();
    assert_eq!(update.1["data"]["node"], "draft");
    let end = &events.last().unwrap().1;
    assert_eq!(end["status"], "interrupted");
    assert_eq!(end["interrupts"][0]["value"]["kind"], "review");
    assert!(run.next().await.is_none(), "the stream ends after `end`");

    // The live channel saw the same run.
    let seen = live.until("end").await;
    let kinds: Vec<&str> = seen.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds[0], "run_start");
    assert!(
        kinds.contains(&"interrupt") && kinds.contains(&"task_end"),
        "{kinds:?}"
    );

    // A failing resume streams an `error` event; the live channel sees it too.
    let mut run = http
        .open(
            Method::POST,
            &format!("/threads/{id}/runs"),
            Some(json!({"command": {"resume": 42}, "stream": true})),
        )
        .await;
    let events = run.until("error").await;
    assert_eq!(events.last().unwrap().1["error"]["code"], "run_failed");
    live.until("error").await;

    // Default stream mode is `values`; approve through a stream and watch it live.
    let mut run = http
        .open(
            Method::POST,
            &format!("/threads/{id}/runs"),
            Some(json!({"command": {"resume": "approve"}, "stream": true})),
        )
        .await;
    let events = run.until("end").await;
    assert!(events
        .iter()
        .any(|(k, e)| k == "values" && e["data"]["state"]["decision"] == "approved"));
    assert_eq!(events.last().unwrap().1["status"], "done");
    let seen = live.until("end").await;
    assert_eq!(seen.last().unwrap().1["state"]["published"], true);

    // Shutting down ends the open live stream.
    server.shutdown().await;
    assert!(tokio::time::timeout(Duration::from_secs(5), live.next())
        .await
        .unwrap()
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_on_a_busy_thread_is_409_and_tokens_and_tools_are_counted() {
    let server = Server::start(None, None).await;
    let http = Http::new(&server.base, None);
    let id = create(&http, "slow", Some("busy-1")).await;
    GATE_OPEN.store(false, Ordering::SeqCst);
    let first = {
        let http = http.clone();
        tokio::spawn(async move {
            http.post("/threads/busy-1/runs", json!({"input": {}}))
                .await
        })
    };
    let mut active = false;
    for _ in 0..400 {
        let t = http.get(&format!("/threads/{id}")).await.json();
        if t["active"] == true {
            assert_eq!(t["run_status"], "running");
            active = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(active, "the first run shows as active");
    assert_eq!(server.state.active_runs(), 1);
    for (r, what) in [
        (
            http.post(&format!("/threads/{id}/runs"), json!({})).await,
            "run",
        ),
        (
            http.post(&format!("/threads/{id}/state"), json!({"values": {}}))
                .await,
            "update",
        ),
        (http.delete(&format!("/threads/{id}")).await, "delete"),
    ] {
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::CONFLICT, "thread_busy".into()),
            "{what}"
        );
    }
    let r = http.get("/threads?status=running").await.json();
    assert_eq!(r["total"], 1);
    GATE_OPEN.store(true, Ordering::SeqCst);
    let r = first.await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["status"], "done");
    assert_eq!(r.json()["state"]["done"], true);

    // The scripted model: tokens and tool executions reach the metrics.
    let chat = create(&http, "chat", None).await;
    let out = http
        .post(
            &format!("/threads/{chat}/runs"),
            json!({"input": {"prompt": "hi"}}),
        )
        .await
        .json();
    assert_eq!(out["status"], "done");
    assert!(out["state"]["reply"]
        .as_str()
        .unwrap()
        .starts_with("hi: Sure"));
    let mut stream = http
        .open(
            Method::POST,
            &format!("/threads/{chat}/runs"),
            Some(json!({"input": {"prompt": "again"}, "stream": true, "stream_mode": ["tokens"]})),
        )
        .await;
    let events = stream.until("end").await;
    let tokens: String = events
        .iter()
        .filter(|(k, _)| k == "token")
        .map(|(_, e)| e["data"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(tokens.trim(), SCRIPT);
    assert!(
        events.iter().all(|(k, _)| k == "token" || k == "end"),
        "{events:?}"
    );
    let m = http.get("/metrics").await.text();
    let words = SCRIPT.split(' ').count() * 2;
    for needle in [
        format!("ferrograph_tokens_generated_total{{model=\"scripted-1\"}} {words}"),
        "ferrograph_tool_executions_total{tool=\"lookup\",status=\"success\"} 2".to_string(),
        "ferrograph_tokens_per_second{model=\"scripted-1\"}".to_string(),
        "ferrograph_runs_total{workflow=\"chat\",status=\"done\"} 2".to_string(),
        "ferrograph_runs_total{workflow=\"slow\",status=\"done\"} 1".to_string(),
        "ferrograph_runs_active 0".to_string(),
    ] {
        assert!(m.contains(&needle), "metrics lack {needle}:\n{m}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_mistakes_are_4xx_with_json_bodies() {
    let server = Server::start(None, Some(1024)).await;
    let http = Http::new(&server.base, None);
    let id = create(&http, "review", Some("errors-1")).await;
    let runs = format!("/threads/{id}/runs");

    // 400: malformed JSON.
    let r = http
        .post_raw(&runs, "application/json", b"{\"input\":".to_vec())
        .await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::BAD_REQUEST, "bad_json".into())
    );
    // 415: not JSON.
    let r = http.post_raw(&runs, "text/plain", b"hello".to_vec()).await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    r.code();
    // 422: JSON of the wrong shape.
    for body in [
        json!({"unknown": 1}),
        json!({"input": 5}),
        json!({"input": {"title": 7}}),
        json!({"input": {}, "command": {"resume": "approve"}}),
        json!({"command": {}}),
        json!({"stream": "yes"}),
        json!({"stream": true, "stream_mode": ["telepathy"]}),
        json!([1, 2]),
    ] {
        let r = http.post(&runs, body.clone()).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {}",
            r.text()
        );
        r.code();
    }
    // The thread is untouched by refused runs.
    let t = http.get(&format!("/threads/{id}")).await.json();
    assert_eq!(t["status"], "idle");
    // 409: nothing to continue, nothing to resume.
    let r = http.post(&runs, json!({})).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::CONFLICT, "nothing_to_continue".into())
    );
    let r = http
        .post(&runs, json!({"command": {"resume": "approve"}}))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(
        http.get(&format!("/threads/{id}")).await.json()["run_status"],
        "idle"
    );
    // 413: a body over the limit.
    let big = json!({"input": {"title": "x".repeat(4096)}});
    let r = http.post(&runs, big).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large".into())
    );
    // 404: unknown thread and unknown route; 405: wrong method.
    let r = http.post("/threads/missing/runs", json!({})).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::NOT_FOUND, "thread_not_found".into())
    );
    let r = http.get("/nothing/here").await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::NOT_FOUND, "not_found".into())
    );
    let r = http.post("/healthz", json!({})).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed".into())
    );
    // 400: bad queries.
    for q in [
        "/threads?status=sleeping",
        "/threads?limit=0",
        "/threads?limit=x",
    ] {
        let r = http.get(q).await;
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::BAD_REQUEST, "invalid_query".into()),
            "{q}"
        );
    }
    // Odd ids in paths are just unknown threads.
    for p in [
        "/threads/%00",
        "/threads/%E2%98%83/state",
        "/threads/..%2F../history",
    ] {
        let r = http.get(p).await;
        assert!(r.status.is_client_error(), "{p}: {}", r.status);
        r.code();
    }
    // The server still works.
    let out = http.post(&runs, json!({"input": {"title": "ok"}})).await;
    assert_eq!(out.json()["status"], "interrupted");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_every_route_but_healthz_and_non_loopback_binds_need_one() {
    let server = Server::start(Some("s3cret"), None).await;
    let anon = Http::new(&server.base, None);
    let wrong = Http::new(&server.base, Some("guess"));
    let ok = Http::new(&server.base, Some("s3cret"));
    assert_eq!(anon.get("/healthz").await.status, StatusCode::OK);
    for path in [
        "/threads",
        "/workflows",
        "/metrics",
        "/openapi.json",
        "/threads/x",
    ] {
        for client in [&anon, &wrong] {
            let r = client.get(path).await;
            assert_eq!(
                (r.status, r.code()),
                (StatusCode::UNAUTHORIZED, "unauthorized".into()),
                "{path}"
            );
            assert!(r.headers["www-authenticate"]
                .to_str()
                .unwrap()
                .starts_with("Bearer"));
        }
        assert_ne!(
            ok.get(path).await.status,
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
    }
    let r = anon.post("/threads", json!({"workflow": "review"})).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let id = create(&ok, "review", None).await;
    let out = ok
        .post(
            &format!("/threads/{id}/runs"),
            json!({"input": {"title": "t"}}),
        )
        .await;
    assert_eq!(out.json()["status"], "interrupted");
    // The console page itself is public (it asks for the token); its data is not.
    let page = anon.get("/").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.text().contains("ferrograph"));
    server.shutdown().await;

    // Non-loopback binds are refused without a token, by `serve` and by `serve_on`.
    let dir = tempfile::tempdir().unwrap();
    let saver: Arc<dyn CheckpointSaver> = SledSaver::open(dir.path().join("db")).unwrap();
    let runtime = Runtime::new().await.unwrap();
    let registry = ferrograph_basics::registry(&runtime, saver.clone())
        .await
        .unwrap();
    let options = ServeOptions {
        bind: "0.0.0.0:0".parse().unwrap(),
        ..ServeOptions::default()
    };
    let err = serve(options.clone(), registry.clone(), saver.clone(), async {})
        .await
        .unwrap_err();
    assert!(matches!(err, ServerError::TokenRequired(_)), "{err}");
    let empty = ServeOptions {
        token: Some(String::new()),
        ..options.clone()
    };
    let err = serve(empty, registry.clone(), saver.clone(), async {})
        .await
        .unwrap_err();
    assert!(matches!(err, ServerError::TokenRequired(_)), "{err}");
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let err = serve_on(
        listener,
        AppState::new(registry.clone(), saver.clone(), None),
        async {},
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ServerError::TokenRequired(_)), "{err}");
    // With a token it binds (and stops at once here).
    let with_token = ServeOptions {
        token: Some("t".into()),
        ..options
    };
    serve(with_token, registry, saver, async {}).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_without_external_resources() {
    let server = Server::start(None, None).await;
    let http = Http::new(&server.base, None);
    for path in ["/", "/console"] {
        let r = http.get(path).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html"));
        let html = r.text();
        assert!(html.contains("/console/assets/console.js"));
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "no external resources"
        );
    }
    let js = http.get("/console/assets/console.js").await;
    assert!(js.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/javascript"));
    assert!(js.text().contains("EventSource"));
    let css = http.get("/console/assets/console.css").await;
    assert!(css.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/css"));
    server.shutdown().await;
}

/// Sends `req` with extra headers and returns status and body.
async fn send_with(
    http: &Http,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Resp {
    let mut b = http.request(method, path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    http.send(b.body(Full::new(Bytes::from(body.to_string()))).unwrap())
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_hosts_cross_origin_pages_and_bodies_that_are_not_json_are_refused() {
    let server = Server::start(None, None).await;
    let http = Http::new(&server.base, None);
    let host = server.base.trim_start_matches("http://").to_string();
    let body = r#"{"workflow": "review"}"#;
    let json_ct = ("content-type", "application/json");

    // A DNS-rebinding page reaches the loopback server under its own name.
    let r = send_with(
        &http,
        Method::POST,
        "/threads",
        &[json_ct, ("host", "evil.example:8420")],
        body,
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.json()["error"]["code"], "host_not_allowed");
    let r = send_with(
        &http,
        Method::GET,
        "/threads",
        &[("host", "evil.example")],
        "",
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    // A cross-site page: refused, and nothing was created.
    let r = send_with(
        &http,
        Method::POST,
        "/threads",
        &[json_ct, ("origin", "http://evil.example")],
        body,
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.json()["error"]["code"], "origin_not_allowed");
    assert!(r.headers.get("access-control-allow-origin").is_none());
    // Forms and plain text, which pages send without a preflight, are not JSON: 415.
    for ct in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let mut h = vec![];
        if let Some(c) = ct {
            h.push(("content-type", c));
        }
        let r = send_with(&http, Method::POST, "/threads", &h, body).await;
        assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct:?}");
        assert_eq!(r.json()["error"]["code"], "unsupported_media_type");
    }
    assert_eq!(http.get("/threads").await.json()["total"], 0);

    // The server's own page (the console) and clients without Origin are served.
    let own = format!("http://{host}");
    let r = send_with(
        &http,
        Method::POST,
        "/threads",
        &[json_ct, ("origin", own.as_str())],
        body,
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let r = send_with(
        &http,
        Method::POST,
        "/threads",
        &[json_ct, ("host", "localhost:1")],
        body,
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED);
    // An empty body needs no content type.
    let id = r.json()["thread_id"].as_str().unwrap().to_string();
    let r = send_with(
        &http,
        Method::POST,
        &format!("/threads/{id}/state"),
        &[],
        "",
    )
    .await;
    assert_ne!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    server.shutdown().await;

    // A configured origin and host name are allowed, with CORS headers for the origin.
    let access = Access {
        allowed_origins: vec!["https://app.example".into()],
        allowed_hosts: vec!["ferro.lan".into()],
        ..Access::default()
    };
    let server = Server::start_with(None, None, Some(access)).await;
    let http = Http::new(&server.base, None);
    let pre = send_with(
        &http,
        Method::OPTIONS,
        "/threads",
        &[
            ("origin", "https://app.example"),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "content-type"),
        ],
        "",
    )
    .await;
    assert!(pre.status.is_success(), "{}", pre.status);
    assert_eq!(
        pre.headers["access-control-allow-origin"],
        "https://app.example"
    );
    let r = send_with(
        &http,
        Method::POST,
        "/threads",
        &[
            json_ct,
            ("origin", "https://app.example"),
            ("host", "ferro.lan:8420"),
        ],
        body,
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(
        r.headers["access-control-allow-origin"],
        "https://app.example"
    );
    let r = send_with(
        &http,
        Method::POST,
        "/threads",
        &[json_ct, ("origin", "https://other.example")],
        body,
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_in_client_input_stay_inside_the_configured_roots() {
    let t = tempfile::tempdir().unwrap();
    let ws = t.path().join("ws");
    std::fs::create_dir_all(ws.join("project")).unwrap();
    std::fs::create_dir_all(t.path().join("secret")).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(t.path().join("secret"), ws.join("escape")).unwrap();
    let data = t.path().join("data");
    let roots = PathRoots::new([ws.clone()], &data).unwrap();

    // Without roots (the default), clients name no path at all.
    let server = Server::start(None, None).await;
    let http = Http::new(&server.base, None);
    let id = create(&http, "paths", Some("p0")).await;
    let r = http
        .post(
            &format!("/threads/{id}/runs"),
            json!({"input": {"repository": ws.display().to_string()}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.json()["error"]["code"], "path_not_allowed");
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--workspace"));
    server.shutdown().await;

    let access = Access {
        roots: Some(roots),
        ..Access::default()
    };
    let server = Server::start_with(None, None, Some(access)).await;
    let http = Http::new(&server.base, None);
    let id = create(&http, "paths", Some("p1")).await;
    let secret = t.path().join("secret").display().to_string();
    let created = t
        .path()
        .join("secret")
        .join("made-by-server")
        .display()
        .to_string();
    for input in [
        json!({"repository": secret}),
        json!({"repository": "/"}),
        json!({"repository": "../secret"}),
        json!({"repository": "escape"}),
        json!({"out_dir": created}),
        json!({"out_dir": "../secret/made-by-server"}),
        json!({"out_dir": "/tmp"}),
        // A remote to push to: a bare repository outside every folder, or the network.
        json!({"remote": secret}),
        json!({"remote": format!("file://{secret}")}),
        json!({"remote": "https://example.com/repo.git"}),
        json!({"remote": "git@example.com:repo.git"}),
    ] {
        let r = http
            .post(&format!("/threads/{id}/runs"), json!({"input": input}))
            .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{input}: {}", r.json());
        assert_eq!(r.json()["error"]["code"], "path_not_allowed");
        let r = http
            .post(&format!("/threads/{id}/state"), json!({"values": input}))
            .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "state update {input}");
    }
    assert!(!t.path().join("secret/made-by-server").exists());
    let r = http
        .post(
            &format!("/threads/{id}/runs"),
            json!({"input": {"repository": "missing"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.json()["error"]["code"], "path_not_found");
    // Paths inside the roots pass the fence (the review graph then refuses the unknown
    // fields itself).
    for input in [
        json!({"repository": "project"}),
        json!({"out_dir": "runs/p1"}),
        json!({"remote": "origin"}),
        json!({"remote": ws.join("project").display().to_string()}),
    ] {
        let r = http
            .post(&format!("/threads/{id}/runs"), json!({"input": input}))
            .await;
        assert_ne!(r.status, StatusCode::FORBIDDEN, "{input}");
        assert_ne!(r.json()["error"]["code"], "path_not_found");
    }
    server.shutdown().await;
}

/// The events of an SSE body read to its end: (id, event, data).
fn sse_events(text: &str) -> Vec<(Option<u64>, String, Value)> {
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .filter_map(|block| {
            let (mut id, mut event, mut data) = (None, String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            (!event.is_empty()).then(|| {
                (
                    id,
                    event,
                    serde_json::from_str(&data).unwrap_or(Value::Null),
                )
            })
        })
        .collect()
}

// The Agent Server API's runs: token streaming as message chunks, cancellation, multitask
// strategies, joining a finished run's stream from an event id, stateless runs, refusals.
#[tokio::test]
async fn agent_server_runs_stream_cancel_queue_and_refuse() {
    let server = Server::start(None, None).await;
    let http = Http::new(&server.base, None);
    let thread = |v: Value| v["thread_id"].as_str().unwrap().to_string();

    // Tokens as `messages` tuples: the chunks spell the reply.
    let t = thread(http.post("/threads", json!({})).await.json());
    let r = http
        .post(
            &format!("/threads/{t}/runs/stream"),
            json!({"assistant_id": "chat", "input": {"prompt": "hi"}, "stream_mode": ["messages-tuple", "values"]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(r.headers["content-location"]
        .to_str()
        .unwrap()
        .starts_with(&format!("/threads/{t}/runs/")));
    let events = sse_events(&r.text());
    assert_eq!(events[0].1, "metadata");
    let text: String = events
        .iter()
        .filter(|e| e.1 == "messages")
        .map(|e| e.2[0]["content"].as_str().unwrap().to_string())
        .collect();
    let last = events.iter().rev().find(|e| e.1 == "values").unwrap();
    let reply = last.2["reply"].as_str().unwrap();
    assert!(
        !text.trim().is_empty() && reply.ends_with(text.trim()),
        "{text:?} vs {reply:?}"
    );
    assert!(events.iter().all(|e| e.1 != "error"));
    let ids: Vec<u64> = events.iter().filter_map(|e| e.0).collect();
    // Ids are positions in the run's whole event log (every mode), so they rise with gaps.
    assert_eq!(ids.len(), events.len());
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");

    // Joining the finished run's stream after its second event replays the rest.
    let run_id = events[0].2["run_id"].as_str().unwrap().to_string();
    let req = http
        .request(Method::GET, &format!("/threads/{t}/runs/{run_id}/stream"))
        .header("last-event-id", ids[1].to_string())
        .body(Full::new(Bytes::new()))
        .unwrap();
    let joined = sse_events(&http.send(req).await.text());
    let joined_ids: Vec<u64> = joined.iter().filter_map(|e| e.0).collect();
    assert_eq!(joined_ids, ids[2..], "{joined:?}");

    // A long run cancelled: the run ends `interrupted` at once and the thread is free.
    let t = thread(http.post("/threads", json!({})).await.json());
    let run = http
        .post(
            &format!("/threads/{t}/runs"),
            json!({"assistant_id": "nap", "input": {"ms": 60000}}),
        )
        .await
        .json();
    let rid = run["run_id"].as_str().unwrap().to_string();
    assert!(
        matches!(run["status"].as_str(), Some("running" | "pending")),
        "{run}"
    );
    // A second run on the busy thread is refused by default.
    let r = http
        .post(
            &format!("/threads/{t}/runs/wait"),
            json!({"assistant_id": "nap", "input": {"ms": 1}}),
        )
        .await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::CONFLICT, "thread_busy".into())
    );
    let started = std::time::Instant::now();
    let r = http
        .post_raw(
            &format!("/threads/{t}/runs/{rid}/cancel?wait=1"),
            "application/json",
            Vec::new(),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    assert!(started.elapsed() < Duration::from_secs(10));
    let got = http.get(&format!("/threads/{t}/runs/{rid}")).await.json();
    assert_eq!(got["status"], "interrupted", "{got}");
    assert_eq!(
        http.get(&format!("/threads/{t}")).await.json()["status"],
        "idle"
    );

    // Enqueue waits for the run in progress; interrupt cancels it.
    let first = http
        .post(
            &format!("/threads/{t}/runs"),
            json!({"assistant_id": "nap", "input": {"ms": 300}}),
        )
        .await
        .json();
    let out = http
        .post(
            &format!("/threads/{t}/runs/wait"),
            json!({"assistant_id": "nap", "input": {"ms": 1}, "multitask_strategy": "enqueue"}),
        )
        .await
        .json();
    assert_eq!(out["naps"], 2, "both naps ran: {out}");
    let first_id = first["run_id"].as_str().unwrap();
    assert_eq!(
        http.get(&format!("/threads/{t}/runs/{first_id}"))
            .await
            .json()["status"],
        "success"
    );
    let long = http
        .post(
            &format!("/threads/{t}/runs"),
            json!({"assistant_id": "nap", "input": {"ms": 60000}}),
        )
        .await
        .json();
    let out = http
        .post(
            &format!("/threads/{t}/runs/wait"),
            json!({"assistant_id": "nap", "input": {"ms": 1}, "multitask_strategy": "interrupt"}),
        )
        .await
        .json();
    assert_eq!(out["naps"], 3, "the interrupted nap added nothing: {out}");
    let long_id = long["run_id"].as_str().unwrap();
    assert_eq!(
        http.get(&format!("/threads/{t}/runs/{long_id}"))
            .await
            .json()["status"],
        "interrupted"
    );
    let listed = http.get(&format!("/threads/{t}/runs")).await.json();
    assert_eq!(listed.as_array().unwrap().len(), 5, "{listed}");

    // A thread runs one graph.
    let r = http
        .post(
            &format!("/threads/{t}/runs/wait"),
            json!({"assistant_id": "review", "input": {"title": "x"}}),
        )
        .await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::CONFLICT, "thread_graph_mismatch".into())
    );

    // Stateless runs delete their thread unless asked to keep it.
    let before = http.post("/threads/count", json!({})).await.json();
    let out = http
        .post(
            "/runs/wait",
            json!({"assistant_id": "nap", "input": {"ms": 1}}),
        )
        .await
        .json();
    assert_eq!(out["naps"], 1);
    let out = http
        .post(
            "/runs/wait",
            json!({"assistant_id": "nap", "input": {"ms": 1}, "on_completion": "keep"}),
        )
        .await;
    let kept = out.headers["content-location"]
        .to_str()
        .unwrap()
        .split('/')
        .nth(2)
        .unwrap()
        .to_string();
    let after = http.post("/threads/count", json!({})).await.json();
    assert_eq!(after.as_u64().unwrap(), before.as_u64().unwrap() + 1);
    assert_eq!(
        http.get(&format!("/threads/{kept}")).await.json()["values"]["naps"],
        1
    );

    // Refusals, each before anything runs.
    for (body, code) in [
        (
            json!({"assistant_id": "nap", "interrupt_before": ["nap"]}),
            "unsupported",
        ),
        (
            json!({"assistant_id": "nap", "stream_mode": "sideways"}),
            "invalid_body",
        ),
        (
            json!({"assistant_id": "nap", "webhook": "http://x"}),
            "unsupported",
        ),
        (json!({"assistant_id": "nope"}), "assistant_not_found"),
    ] {
        let r = http.post("/runs/wait", body.clone()).await;
        assert!(r.status.is_client_error(), "{body}: {}", r.text());
        assert_eq!(r.code(), code, "{body}");
    }
    let t = thread(http.post("/threads", json!({})).await.json());
    let r = http
        .post(
            &format!("/threads/{t}/runs/wait"),
            json!({"assistant_id": "review", "command": {"resume": "approve"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    assert_eq!(
        http.get(&format!("/threads/{t}")).await.json()["status"],
        "idle"
    );
    server.shutdown().await;
}

/// A new thread through the Agent Server API; its id.
async fn new_thread(http: &Http) -> String {
    http.post("/threads", json!({})).await.json()["thread_id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Runs `demo` on `thread` over `commits` to the end (every commit classified) and answers
/// the run's record.
async fn demo_run(http: &Http, thread: &str, commits: &[String]) -> Value {
    let out = http
        .post(
            &format!("/threads/{thread}/runs/wait"),
            json!({"assistant_id": "demo", "input": {"commits": commits}}),
        )
        .await;
    assert_eq!(out.status, StatusCode::OK, "{}", out.text());
    assert_eq!(out.json()["classified"], commits.len(), "{}", out.text());
    http.get(&format!("/threads/{thread}/runs")).await.json()[0].clone()
}

// Event memory is bounded: a run keeps at most its cap of events (the newest), all runs
// together at most the total (the oldest finished runs give theirs up first), and a client
// joining an old run's stream is told what was dropped before it reads what is kept.
#[tokio::test]
async fn run_events_are_kept_within_their_caps_and_joining_says_what_was_dropped() {
    let retention = EventRetention {
        per_run_bytes: 128 << 10,
        total_bytes: 320 << 10,
        result_grace: Duration::ZERO,
    };
    let server = Server::start_configured(None, None, None, Some(retention)).await;
    let http = Http::new(&server.base, None);
    let commits: Vec<String> = (0..300)
        .map(|i| format!("feat: change number {i}"))
        .collect();
    let first_thread = new_thread(&http).await;
    let run = demo_run(&http, &first_thread, &commits).await;
    let events = &run["events"];
    let dropped = events["dropped"].as_u64().unwrap();
    let kept = events["kept"].as_u64().unwrap();
    assert!(
        dropped > 0,
        "300 tasks make more than 128 KiB of events: {run}"
    );
    assert!(kept > 10, "the newest events are kept: {run}");
    assert!(events["kept_bytes"].as_u64().unwrap() <= 128 << 10, "{run}");

    // Joining from the start: a `dropped` event first (no id), then what is kept, ending
    // with the final state; the header says the same.
    let run_id = run["run_id"].as_str().unwrap();
    let path = format!("/threads/{first_thread}/runs/{run_id}/stream?stream_mode=values,updates");
    let req = http
        .request(Method::GET, &path)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = http.send(req).await;
    assert_eq!(
        resp.headers["x-ferrograph-events-dropped"]
            .to_str()
            .unwrap(),
        dropped.to_string()
    );
    let joined = sse_events(&resp.text());
    assert_eq!(joined[0].1, "dropped", "{:?}", &joined[..2]);
    assert_eq!(joined[0].0, None);
    assert_eq!(joined[0].2["dropped"], dropped);
    assert_eq!(joined[0].2["kept_from_id"], dropped);
    assert!(joined[0].2["message"]
        .as_str()
        .unwrap()
        .contains("--keep-run-events-mib"));
    assert!(joined[1..]
        .iter()
        .all(|e| e.0.unwrap() >= dropped && e.1 != "dropped"));
    let last = joined.iter().rev().find(|e| e.1 == "values").unwrap();
    assert_eq!(last.2["classified"], 300);
    assert!(last.2["markdown"]
        .as_str()
        .unwrap()
        .contains("change number 299"));

    // Resuming past the dropped part gets no `dropped` event.
    let from = joined[1].0.unwrap();
    let req = http
        .request(Method::GET, &path)
        .header("last-event-id", from.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = http.send(req).await;
    assert!(!resp.headers.contains_key("x-ferrograph-events-dropped"));
    let resumed = sse_events(&resp.text());
    assert!(resumed
        .iter()
        .all(|e| e.1 != "dropped" && e.0.unwrap() > from));

    // Four more runs: all together stay within the total, the oldest run gave its events up
    // first, and the newest keeps its own.
    let mut threads = vec![first_thread.clone()];
    for _ in 0..4 {
        let t = new_thread(&http).await;
        demo_run(&http, &t, &commits).await;
        threads.push(t);
    }
    let mut views = Vec::new();
    for t in &threads {
        views.push(http.get(&format!("/threads/{t}/runs")).await.json()[0].clone());
    }
    let held: u64 = views
        .iter()
        .map(|v| {
            v["events"]["kept_bytes"].as_u64().unwrap()
                + v["events"]["result_bytes"].as_u64().unwrap()
        })
        .sum();
    assert!(held <= 320 << 10, "{held} bytes held over {views:?}");
    let oldest = views[0]["events"]["kept"].as_u64().unwrap();
    let newest = views[4]["events"]["kept"].as_u64().unwrap();
    assert!(oldest < kept, "the oldest run was shed: {oldest} vs {kept}");
    assert!(views[4]["events"]["result_kept"].as_bool().unwrap());
    assert!(newest > 10, "the newest run keeps its events: {newest}");
    // Joining the shed run still answers, and says everything before what is kept is gone.
    let old_run = views[0]["run_id"].as_str().unwrap();
    let req = http
        .request(
            Method::GET,
            &format!("/threads/{first_thread}/runs/{old_run}/stream"),
        )
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = http.send(req).await;
    assert_eq!(resp.status, StatusCode::OK);
    let joined = sse_events(&resp.text());
    assert_eq!(joined[0].1, "dropped");
    assert!(joined[0].2["dropped"].as_u64().unwrap() > dropped);
    let r = http
        .get(&format!("/threads/{first_thread}/runs/{old_run}/join"))
        .await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "shedding events left the result: {}",
        r.text()
    );
    server.shutdown().await;

    // Caps so tight that events are not enough: the oldest finished run's result goes too,
    // and joining it says so and where the thread's state is; the newest run's is there.
    let tight = EventRetention {
        per_run_bytes: 16 << 10,
        total_bytes: 40 << 10,
        result_grace: Duration::ZERO,
    };
    let server = Server::start_configured(None, None, None, Some(tight)).await;
    let http = Http::new(&server.base, None);
    let mut finished = Vec::new();
    for _ in 0..2 {
        let t = new_thread(&http).await;
        let run = demo_run(&http, &t, &commits).await;
        finished.push((t, run["run_id"].as_str().unwrap().to_string()));
    }
    let (t, old_run) = &finished[0];
    let view = http
        .get(&format!("/threads/{t}/runs/{old_run}"))
        .await
        .json();
    assert_eq!(view["events"]["result_kept"], false, "{view}");
    assert_eq!(view["status"], "success", "the record stays: {view}");
    let r = http.get(&format!("/threads/{t}/runs/{old_run}/join")).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::GONE, "run_result_dropped".into())
    );
    assert!(
        r.text().contains(&format!("/threads/{t}/state")),
        "{}",
        r.text()
    );
    let (t, new_run) = &finished[1];
    let r = http.get(&format!("/threads/{t}/runs/{new_run}/join")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["classified"], 300);
    server.shutdown().await;
}
