//! The remote adapter against a scripted HTTP server on 127.0.0.1: the happy paths (chat,
//! tools, json_schema, streaming with usage, bearer token) and the protocol's edge cases
//! (429 with Retry-After, 503, malformed JSON, a dropped stream, a slow server hitting the
//! timeout, a refused connection, a 400).

#![cfg(feature = "remote")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ferrograph_core::message::{Message, ToolCall, ToolSpec, ToolStatus};
use ferrograph_llm::{
    ChatModel, ChatModelExt, GenerateOptions, LlmError, RemoteChatModel, RemoteConfig,
    ResponseFormat, RetryPolicy, TokenSink, ToolChoice,
};
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One step of a scripted answer.
#[derive(Clone)]
enum Step {
    Write(Vec<u8>),
    Sleep(Duration),
}

/// A request as the server saw it.
#[derive(Clone, Debug)]
struct Seen {
    head: String,
    body: Value,
}

struct Fake {
    base_url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// Serves one scripted answer per connection, in order (the last one repeats).
async fn fake(answers: Vec<Vec<Step>>) -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        let mut n = 0usize;
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let steps = answers[n.min(answers.len() - 1)].clone();
            n += 1;
            let seen = seen2.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let head_end = loop {
                    let k = sock.read(&mut chunk).await.unwrap_or(0);
                    if k == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..k]);
                    if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break p + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                while buf.len() < head_end + len {
                    let k = sock.read(&mut chunk).await.unwrap_or(0);
                    if k == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..k]);
                }
                let body = serde_json::from_slice(&buf[head_end..]).unwrap_or(Value::Null);
                seen.lock().push(Seen { head, body });
                for step in steps {
                    match step {
                        Step::Write(b) => {
                            if sock.write_all(&b).await.is_err() {
                                return;
                            }
                            let _ = sock.flush().await;
                        }
                        Step::Sleep(d) => tokio::time::sleep(d).await,
                    }
                }
                let _ = sock.shutdown().await;
            });
        }
    });
    Fake {
        base_url: format!("http://{addr}/v1"),
        seen,
    }
}

fn response(status: &str, headers: &[(&str, &str)], body: &str) -> Vec<Step> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(body);
    vec![Step::Write(head.into_bytes())]
}

fn json_ok(body: Value) -> Vec<Step> {
    response(
        "200 OK",
        &[("Content-Type", "application/json")],
        &body.to_string(),
    )
}

fn chunk(data: &str) -> Vec<u8> {
    format!("{:x}\r\n{data}\r\n", data.len()).into_bytes()
}

/// An event stream: a chunked body of `data:` events, ended properly when `complete`.
fn sse(events: &[Value], done: bool, complete: bool, pause: Duration) -> Vec<Step> {
    let mut steps = vec![Step::Write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            .to_vec(),
    )];
    for e in events {
        steps.push(Step::Write(chunk(&format!("data: {e}\n\n"))));
        steps.push(Step::Sleep(pause));
    }
    if done {
        steps.push(Step::Write(chunk("data: [DONE]\n\n")));
    }
    if complete {
        steps.push(Step::Write(b"0\r\n\r\n".to_vec()));
    }
    steps
}

fn completion(message: Value, finish: &str) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "served-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
                  "prompt_tokens_details": {"cached_tokens": 4}}
    })
}

fn model(f: &Fake) -> RemoteChatModel {
    RemoteChatModel::new(RemoteConfig::new(&f.base_url, "smol").timeout(Duration::from_secs(10)))
        .unwrap()
}

fn collecting_sink() -> (TokenSink, Arc<Mutex<Vec<String>>>) {
    let pieces = Arc::new(Mutex::new(Vec::new()));
    let p = pieces.clone();
    (
        TokenSink::callback(move |_model, piece| p.lock().push(piece.to_string())),
        pieces,
    )
}

#[tokio::test]
async fn chat_with_tools_and_json_schema_maps_request_and_answer() {
    let f = fake(vec![json_ok(completion(
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_9", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "call_10", "type": "function",
             "function": {"name": "get_weather", "arguments": "{not json"}}
        ]}),
        "tool_calls",
    ))])
    .await;
    let var = "FERROGRAPH_TEST_REMOTE_FAKE_KEY";
    std::env::set_var(var, "sk-test-123");
    let m = RemoteChatModel::new(RemoteConfig::new(&f.base_url, "smol").api_key_env(var)).unwrap();
    let earlier = ToolCall::new("get_weather", json!({"city": "Oslo"}));
    let messages = vec![
        Message::system("be brief"),
        Message::human("weather?"),
        Message::ai_with_tools("", vec![earlier.clone()]),
        Message::tool(&earlier, ToolStatus::Success, "rain"),
    ];
    let schema =
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let opts = GenerateOptions {
        tools: vec![ToolSpec::new(
            "get_weather",
            "Weather in a city.",
            schema.clone(),
        )],
        tool_choice: ToolChoice::Named("get_weather".into()),
        response_format: Some(ResponseFormat::JsonSchema {
            name: "answer".into(),
            schema: schema.clone(),
        }),
        seed: Some(7),
        ..GenerateOptions::default()
    }
    .stop("\n\n");
    let answer = m.invoke(&messages, &opts, None).await.unwrap();
    assert_eq!(answer.tool_calls.len(), 2);
    assert_eq!(answer.tool_calls[0].id, "call_9");
    assert_eq!(answer.tool_calls[0].args.0, json!({"city": "Paris"}));
    // Arguments that are not JSON are kept as text for the tool node to reject.
    assert_eq!(answer.tool_calls[1].args.0, json!("{not json"));
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));
    let usage = answer.usage.unwrap();
    assert_eq!(
        (
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.cached_prompt_tokens
        ),
        (12, 3, 4)
    );
    assert_eq!(answer.metadata["model"], "served-model");
    assert_eq!(answer.metadata["provider"], "remote");

    let seen = f.seen.lock()[0].clone();
    assert!(
        seen.head.starts_with("POST /v1/chat/completions "),
        "{}",
        seen.head
    );
    assert!(
        seen.head
            .to_ascii_lowercase()
            .contains("authorization: bearer sk-test-123"),
        "{}",
        seen.head
    );
    let b = seen.body;
    assert_eq!(b["model"], "smol");
    assert_eq!(b["seed"], 7);
    assert_eq!(b["stop"], json!(["\n\n"]));
    assert!(b.get("stream").is_none());
    let roles: Vec<&str> = b["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool"]);
    assert_eq!(b["messages"][2]["tool_calls"][0]["id"], earlier.id.as_str());
    assert_eq!(
        b["messages"][2]["tool_calls"][0]["function"]["arguments"],
        "{\"city\":\"Oslo\"}"
    );
    assert_eq!(b["messages"][3]["tool_call_id"], earlier.id.as_str());
    assert_eq!(b["tools"][0]["type"], "function");
    assert_eq!(b["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(b["tools"][0]["function"]["parameters"], schema);
    assert_eq!(b["tool_choice"]["function"]["name"], "get_weather");
    assert_eq!(b["response_format"]["type"], "json_schema");
    assert_eq!(b["response_format"]["json_schema"]["schema"], schema);
    assert_eq!(b["response_format"]["json_schema"]["name"], "answer");
}

#[tokio::test]
async fn no_authorization_header_without_a_token() {
    let f = fake(vec![json_ok(completion(
        json!({"role": "assistant", "content": "hi"}),
        "stop",
    ))])
    .await;
    let m = RemoteChatModel::new(
        RemoteConfig::new(&f.base_url, "smol").api_key_env("FERROGRAPH_TEST_UNSET_KEY_VAR"),
    )
    .unwrap();
    let answer = m
        .invoke(&[Message::human("hi")], &GenerateOptions::default(), None)
        .await
        .unwrap();
    assert_eq!(answer.content, "hi");
    assert!(!f.seen.lock()[0]
        .head
        .to_ascii_lowercase()
        .contains("authorization"));
}

#[tokio::test]
async fn streaming_sends_tokens_to_the_sink_and_assembles_tool_calls_and_usage() {
    let events = [
        json!({"model": "served", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        json!({"choices": [{"index": 0, "delta": {"content": "Hel"}}]}),
        json!({"choices": [{"index": 0, "delta": {"content": "lo"}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "type": "function", "function": {"name": "add", "arguments": ""}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "{\"a\": 1,"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": " \"b\": 2}"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}}),
    ];
    let f = fake(vec![sse(&events, true, true, Duration::from_millis(5))]).await;
    let (sink, pieces) = collecting_sink();
    let answer = model(&f)
        .invoke(
            &[Message::human("hi")],
            &GenerateOptions::default(),
            Some(sink),
        )
        .await
        .unwrap();
    assert_eq!(*pieces.lock(), ["Hel", "lo"]);
    assert_eq!(answer.content, "Hello");
    assert_eq!(answer.tool_calls.len(), 1);
    assert_eq!(answer.tool_calls[0].id, "call_1");
    assert_eq!(answer.tool_calls[0].name, "add");
    assert_eq!(answer.tool_calls[0].args.0, json!({"a": 1, "b": 2}));
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(answer.usage.unwrap().completion_tokens, 5);
    assert!(answer.metadata.contains_key("time_to_first_token_ms"));
    let body = f.seen.lock()[0].body.clone();
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
}

#[tokio::test]
async fn rate_limit_with_retry_after_is_retryable_and_honoured() {
    let f = fake(vec![
        response(
            "429 Too Many Requests",
            &[("Retry-After", "1"), ("Content-Type", "application/json")],
            r#"{"error": {"message": "slow down", "type": "rate_limit"}}"#,
        ),
        json_ok(completion(
            json!({"role": "assistant", "content": "ok"}),
            "stop",
        )),
    ])
    .await;
    let err = model(&f)
        .invoke(&[Message::human("hi")], &GenerateOptions::default(), None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, LlmError::RateLimited { ref message, retry_after: Some(d) } if message == "slow down" && d == Duration::from_secs(1)),
        "{err:?}"
    );
    assert!(err.is_retryable());

    // Through with_retry: the wait follows Retry-After (1 s), not the 1 ms backoff.
    let f = fake(vec![
        response("429 Too Many Requests", &[("Retry-After", "1")], "busy"),
        json_ok(completion(
            json!({"role": "assistant", "content": "ok"}),
            "stop",
        )),
    ])
    .await;
    let retried = model(&f).with_retry(
        RetryPolicy::attempts(3).backoff(Duration::from_millis(1), Duration::from_millis(1)),
    );
    let started = Instant::now();
    let answer = retried
        .invoke(&[Message::human("hi")], &GenerateOptions::default(), None)
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(answer.content, "ok");
    assert_eq!(answer.metadata["attempts"], "2");
    assert_eq!(f.seen.lock().len(), 2);
}

#[tokio::test]
async fn unavailable_is_retryable_with_retry_after_ms_and_400_is_fatal() {
    let f = fake(vec![response(
        "503 Service Unavailable",
        &[("retry-after-ms", "250")],
        "loading model",
    )])
    .await;
    let err = model(&f)
        .invoke(&[Message::human("hi")], &GenerateOptions::default(), None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, LlmError::Unavailable { status: 503, .. }),
        "{err:?}"
    );
    assert_eq!(err.retry_after(), Some(Duration::from_millis(250)));
    assert!(err.is_retryable());

    let f = fake(vec![response(
        "400 Bad Request",
        &[("Content-Type", "application/json")],
        r#"{"detail": "unknown field"}"#,
    )])
    .await;
    let retried = model(&f).with_retry(RetryPolicy::attempts(3));
    let err = retried
        .invoke(&[Message::human("hi")], &GenerateOptions::default(), None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, LlmError::Http { status: 400, ref message } if message == "unknown field"),
        "{err:?}"
    );
    assert!(!err.is_retryable());
    assert_eq!(f.seen.lock().len(), 1, "a 400 is not retried");
}

#[tokio::test]
async fn malformed_json_is_a_typed_error() {
    let f = fake(vec![response(
        "200 OK",
        &[("Content-Type", "application/json")],
        "{\"choices\": [ oops",
    )])
    .await;
    let err = model(&f)
        .invoke(&[Message::human("hi")], &GenerateOptions::default(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::MalformedResponse { .. }), "{err:?}");
    assert!(!err.is_retryable());

    let f = fake(vec![json_ok(
        json!({"object": "chat.completion", "choices": []}),
    )])
    .await;
    let err = model(&f)
        .invoke(&[Message::human("hi")], &GenerateOptions::default(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::MalformedResponse { .. }), "{err:?}");

    // A garbage event in a stream.
    let mut steps = sse(
        &[json!({"choices": [{"index": 0, "delta": {"content": "a"}}]})],
        false,
        false,
        Duration::ZERO,
    );
    steps.push(Step::Write(chunk("data: {not json\n\n")));
    steps.push(Step::Write(b"0\r\n\r\n".to_vec()));
    let f = fake(vec![steps]).await;
    let (sink, _) = collecting_sink();
    let err = model(&f)
        .invoke(
            &[Message::human("hi")],
            &GenerateOptions::default(),
            Some(sink),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::MalformedResponse { .. }), "{err:?}");
}

#[tokio::test]
async fn dropped_stream_is_a_typed_error_after_the_tokens_it_sent() {
    let events = [
        json!({"choices": [{"index": 0, "delta": {"content": "par"}}]}),
        json!({"choices": [{"index": 0, "delta": {"content": "tial"}}]}),
    ];
    // The connection closes in the middle of the chunked body.
    let f = fake(vec![sse(&events, false, false, Duration::from_millis(5))]).await;
    let (sink, pieces) = collecting_sink();
    let err = model(&f)
        .invoke(
            &[Message::human("hi")],
            &GenerateOptions::default(),
            Some(sink),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::StreamInterrupted(_)), "{err:?}");
    assert!(!err.is_retryable());
    assert_eq!(*pieces.lock(), ["par", "tial"]);

    // A body that ends cleanly but without [DONE] or a finish reason is cut short too.
    let f = fake(vec![sse(&events, false, true, Duration::ZERO)]).await;
    let (sink, _) = collecting_sink();
    let err = model(&f)
        .invoke(
            &[Message::human("hi")],
            &GenerateOptions::default(),
            Some(sink),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::StreamInterrupted(_)), "{err:?}");
}

#[tokio::test]
async fn slow_server_hits_the_timeout() {
    let mut slow = vec![Step::Sleep(Duration::from_secs(5))];
    slow.extend(json_ok(completion(
        json!({"role": "assistant", "content": "late"}),
        "stop",
    )));
    let f = fake(vec![slow]).await;
    let m = RemoteChatModel::new(
        RemoteConfig::new(&f.base_url, "smol").timeout(Duration::from_millis(400)),
    )
    .unwrap();
    let started = Instant::now();
    let err = m
        .invoke(&[Message::human("hi")], &GenerateOptions::default(), None)
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(
        matches!(err, LlmError::Timeout(d) if d == Duration::from_millis(400)),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");

    // A stream that stalls after its first token hits the same total limit.
    let f = fake(vec![sse(
        &[json!({"choices": [{"index": 0, "delta": {"content": "a"}}]})],
        true,
        true,
        Duration::from_secs(5),
    )])
    .await;
    let m = RemoteChatModel::new(
        RemoteConfig::new(&f.base_url, "smol").timeout(Duration::from_millis(400)),
    )
    .unwrap();
    let (sink, pieces) = collecting_sink();
    let err = m
        .invoke(
            &[Message::human("hi")],
            &GenerateOptions::default(),
            Some(sink),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::Timeout(_)), "{err:?}");
    assert_eq!(*pieces.lock(), ["a"]);
}

#[tokio::test]
async fn refused_connection_is_a_retryable_connection_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let m = RemoteChatModel::new(RemoteConfig::new(format!("http://{addr}"), "smol")).unwrap();
    let err = m
        .invoke(&[Message::human("hi")], &GenerateOptions::default(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::Connection { .. }), "{err:?}");
    assert!(err.is_retryable());
    assert!(matches!(
        RemoteChatModel::new(RemoteConfig::new("localhost:8000", "m")),
        Err(LlmError::Config(_))
    ));
}

#[tokio::test]
async fn servers_refusing_json_schema_get_the_schema_in_json_object() {
    let refusal = r#"{"detail": [{"type": "literal_error", "loc": ["body", "response_format", "type"], "msg": "Input should be 'text' or 'json_object'"}]}"#;
    let f = fake(vec![
        response(
            "422 Unprocessable Entity",
            &[("Content-Type", "application/json")],
            refusal,
        ),
        json_ok(completion(
            json!({"role": "assistant", "content": "{\"a\": 1}"}),
            "stop",
        )),
    ])
    .await;
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let opts = GenerateOptions {
        response_format: Some(ResponseFormat::JsonSchema {
            name: "a".into(),
            schema: schema.clone(),
        }),
        ..GenerateOptions::default()
    };
    let m = model(&f);
    let answer = m
        .invoke(&[Message::human("hi")], &opts, None)
        .await
        .unwrap();
    assert_eq!(answer.content, "{\"a\": 1}");
    let seen = f.seen.lock().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].body["response_format"]["type"], "json_schema");
    assert_eq!(
        seen[1].body["response_format"],
        json!({"type": "json_object", "schema": schema})
    );
    // Remembered: the next call uses the accepted form at once.
    let body = m.request_body(&[Message::human("hi")], &opts, false);
    assert_eq!(body["response_format"]["type"], "json_object");
}
