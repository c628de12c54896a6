//! OpenTelemetry traces over OTLP, end to end: the `ferrograph` binary exports to a receiver
//! written for the test (no collector binary is published on the registries this project
//! installs from), an HTTP/1.1 server on loopback that decodes OTLP/HTTP protobuf with the
//! `opentelemetry-proto` types. Checked: one span per run, superstep, node task and model
//! call, nested in that order, with their attributes; nothing is sent without an endpoint.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

/// Spans received, with the service name of their resource.
#[derive(Default)]
struct Received {
    spans: Vec<(String, Span)>,
    requests: usize,
}

/// Serves OTLP/HTTP on 127.0.0.1 (any port) until the test ends; returns the base URL.
fn receiver() -> (String, Arc<Mutex<Received>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let got = Arc::new(Mutex::new(Received::default()));
    let store = got.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let store = store.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut conn = conn;
                loop {
                    let mut request_line = String::new();
                    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        reader.read_line(&mut line).unwrap();
                        let line = line.trim_end();
                        if line.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = line.split_once(':') {
                            if k.eq_ignore_ascii_case("content-length") {
                                length = v.trim().parse().unwrap();
                            }
                        }
                    }
                    let mut body = vec![0u8; length];
                    reader.read_exact(&mut body).unwrap();
                    assert!(
                        request_line.starts_with("POST /v1/traces "),
                        "{request_line}"
                    );
                    let req = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
                    {
                        let mut g = store.lock().unwrap();
                        g.requests += 1;
                        for rs in req.resource_spans {
                            let service = rs
                                .resource
                                .iter()
                                .flat_map(|r| &r.attributes)
                                .find(|a| a.key == "service.name")
                                .and_then(|a| a.value.as_ref())
                                .and_then(|v| match &v.value {
                                    Some(AnyValue::StringValue(s)) => Some(s.clone()),
                                    _ => None,
                                })
                                .unwrap_or_default();
                            for ss in rs.scope_spans {
                                for span in ss.spans {
                                    g.spans.push((service.clone(), span));
                                }
                            }
                        }
                    }
                    let reply = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if conn.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, got)
}

fn ferrograph(data: &std::path::Path, otlp: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrograph"));
    c.args(args)
        .env("FERROGRAPH_DATA_DIR", data)
        .env_remove("FERROGRAPH_CONFIG")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("FERROGRAPH_OTLP_ENDPOINT")
        .env("OTEL_SERVICE_NAME", "otlp-test");
    match otlp {
        Some(url) => c.env("OTEL_EXPORTER_OTLP_ENDPOINT", url),
        None => c.env_remove("OTEL_EXPORTER_OTLP_ENDPOINT"),
    };
    c.output().expect("run ferrograph")
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| match &v.value {
            Some(AnyValue::StringValue(s)) => Some(s.clone()),
            Some(AnyValue::IntValue(i)) => Some(i.to_string()),
            _ => None,
        })
}

fn named<'a>(spans: &'a [(String, Span)], name: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .map(|(_, s)| s)
        .filter(|s| s.name == name)
        .collect()
}

#[test]
fn runs_supersteps_and_nodes_are_exported_nested() {
    let (url, got) = receiver();
    let dir = tempfile::tempdir().unwrap();
    let out = ferrograph(
        dir.path(),
        Some(&url),
        &["run", "review", "--thread", "o1", "-q"],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let g = got.lock().unwrap();
    assert!(g.requests >= 1, "nothing was exported");
    assert!(g.spans.iter().all(|(svc, _)| svc == "otlp-test"));
    let runs = named(&g.spans, "ferrograph.run");
    assert_eq!(runs.len(), 1, "one run span");
    let run = runs[0];
    assert_eq!(attr(run, "graph").as_deref(), Some("review"));
    assert_eq!(attr(run, "thread_id").as_deref(), Some("o1"));
    let steps = named(&g.spans, "ferrograph.superstep");
    assert_eq!(steps.len(), 2, "draft, then the review");
    assert!(steps
        .iter()
        .all(|s| s.parent_span_id == run.span_id && s.trace_id == run.trace_id));
    let nodes = named(&g.spans, "ferrograph.node");
    let node_names: Vec<String> = nodes.iter().filter_map(|n| attr(n, "node")).collect();
    assert_eq!(node_names.len(), 2, "{node_names:?}");
    assert!(
        node_names.contains(&"draft".to_string())
            && node_names.contains(&"human_review".to_string())
    );
    for n in &nodes {
        assert!(
            steps.iter().any(|s| s.span_id == n.parent_span_id),
            "a node span's parent is a superstep"
        );
        assert!(n.end_time_unix_nano >= n.start_time_unix_nano);
    }
    drop(g);

    // Without an endpoint nothing is sent.
    let before = got.lock().unwrap().requests;
    let out = ferrograph(dir.path(), None, &["resume", "o1", "--approve", "-q"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(got.lock().unwrap().requests, before);
}

#[test]
fn model_calls_nest_under_their_node_with_token_counts() {
    let (url, got) = receiver();
    let dir = tempfile::tempdir().unwrap();
    let fx = dir.path().join("fx");
    let out = ferrograph(
        dir.path(),
        None,
        &["team", "fixture", &fx.display().to_string()],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The product owner and the analyst call the real SmolLM2 before the stories gate.
    let brief = fx.join("wordstats/brief.md");
    let out = ferrograph(
        dir.path(),
        Some(&url),
        &["run", "team", "--brief", &brief.display().to_string(), "-q"],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let g = got.lock().unwrap();
    let models = named(&g.spans, "ferrograph.model");
    assert!(!models.is_empty(), "no model span");
    let nodes = named(&g.spans, "ferrograph.node");
    for m in &models {
        let parent = nodes
            .iter()
            .find(|n| n.span_id == m.parent_span_id)
            .expect("a model span's parent is a node span");
        let node = attr(parent, "node").unwrap();
        assert!(node.ends_with("_agent"), "model called by {node}");
        assert_eq!(attr(m, "provider").as_deref(), Some("local"));
        let prompt: u64 = attr(m, "prompt_tokens").unwrap().parse().unwrap();
        let completion: u64 = attr(m, "completion_tokens").unwrap().parse().unwrap();
        assert!(prompt > 50 && completion > 0, "{prompt} {completion}");
    }
}
