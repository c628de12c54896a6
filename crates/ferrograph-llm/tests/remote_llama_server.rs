//! The remote adapter against a real OpenAI-compatible server: llama-cpp-python's
//! `llama_cpp.server`, serving the SmolLM2 GGUF on 127.0.0.1. The test starts the server
//! (two aliases of the same file: `smol` with the model's ChatML template, `smol-tools` with
//! `chatml-function-calling` for tool calls) and stops it when done.
//!
//! Needs `scripts/setup-llama-server.sh` (the `.venv-llama` virtual environment and the
//! model); without them the test fails and says so.

#![cfg(feature = "remote")]
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use ferrograph_core::message::{Message, ToolSpec, ToolStatus};
use ferrograph_llm::{
    ChatModel, GenerateOptions, RemoteChatModel, RemoteConfig, ResponseFormat, TokenSink,
    ToolChoice,
};
use parking_lot::Mutex;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The server process; killed (and reaped) when dropped.
struct Server {
    child: Child,
    base_url: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

fn start_server() -> Server {
    let root = repo_root();
    let python = root.join(".venv-llama/bin/python");
    assert!(
        python.exists(),
        "llama-cpp-python's server is not installed ({} is missing): run \
         `scripts/setup-llama-server.sh` first (it creates .venv-llama and fetches the model)",
        python.display()
    );
    let model = root.join("models/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        model.exists(),
        "{} is missing: run `scripts/setup-llama-server.sh` (or `scripts/fetch-models.sh \
         smollm2-135m-instruct-q4_1`)",
        model.display()
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let model = model.canonicalize().unwrap();
    let entry = |alias: &str, format: &str| {
        json!({
            "model": model, "model_alias": alias, "chat_format": format,
            "n_ctx": 2048, "n_threads": 2, "n_batch": 256, "verbose": false
        })
    };
    let config = json!({
        "host": "127.0.0.1",
        "port": port,
        "models": [entry("smol", "chatml"), entry("smol-tools", "chatml-function-calling")],
    });
    let config_path = dir.path().join("server.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let log = dir.path().join("server.log");
    let out = std::fs::File::create(&log).unwrap();
    let err = out.try_clone().unwrap();
    let child = Command::new(&python)
        .args(["-m", "llama_cpp.server", "--config_file"])
        .arg(&config_path)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap();
    Server {
        child,
        base_url: format!("http://127.0.0.1:{port}/v1"),
        log,
        _dir: dir,
    }
}

async fn wait_ready(server: &mut Server) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let client = reqwest_free_get();
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            panic!(
                "llama_cpp.server exited ({status}) before it was ready:\n{}",
                server.log_tail()
            );
        }
        if client(&server.base_url).await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "llama_cpp.server did not answer within 120 s:\n{}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A readiness probe: `GET /v1/models` over a plain TCP connection.
fn reqwest_free_get() -> impl Fn(&str) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool>>>
{
    |base: &str| {
        let addr = base
            .trim_start_matches("http://")
            .trim_end_matches("/v1")
            .to_string();
        Box::pin(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let Ok(mut sock) = tokio::net::TcpStream::connect(&addr).await else {
                return false;
            };
            let req =
                format!("GET /v1/models HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
            if sock.write_all(req.as_bytes()).await.is_err() {
                return false;
            }
            let mut buf = Vec::new();
            let _ = sock.read_to_end(&mut buf).await;
            buf.starts_with(b"HTTP/1.1 200")
        })
    }
}

fn model(server: &Server, name: &str) -> RemoteChatModel {
    RemoteChatModel::new(
        RemoteConfig::new(&server.base_url, name).timeout(Duration::from_secs(120)),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_cpp_server_chat_stream_json_schema_and_tools() {
    let mut server = start_server();
    wait_ready(&mut server).await;
    let started = Instant::now();

    // Chat.
    let smol = model(&server, "smol");
    let question = [
        Message::system("You are a helpful assistant."),
        Message::human("What is the capital of France? Answer in one word."),
    ];
    let opts = GenerateOptions::default().max_tokens(24);
    let answer = smol
        .invoke(&question, &opts, None)
        .await
        .unwrap_or_else(|e| panic!("chat failed: {e}\n{}", server.log_tail()));
    assert!(!answer.content.trim().is_empty(), "{answer:?}");
    let usage = answer.usage.expect("usage");
    assert!(
        usage.prompt_tokens > 10 && usage.completion_tokens > 0,
        "{usage:?}"
    );
    assert!(matches!(
        answer.finish_reason.as_deref(),
        Some("stop" | "length")
    ));
    eprintln!("chat: {:?} ({:?})", answer.content, started.elapsed());

    // Streaming: the pieces arrive one by one and add up to the answer; greedy decoding gives
    // the same text as the call above.
    let pieces = Arc::new(Mutex::new(Vec::<String>::new()));
    let p = pieces.clone();
    let sink = TokenSink::callback(move |_, piece| p.lock().push(piece.to_string()));
    let streamed = smol.invoke(&question, &opts, Some(sink)).await.unwrap();
    let pieces = pieces.lock().clone();
    assert!(pieces.len() > 1, "{pieces:?}");
    assert_eq!(pieces.concat(), streamed.content);
    assert_eq!(streamed.content, answer.content);
    eprintln!("stream: {} pieces ({:?})", pieces.len(), started.elapsed());

    // JSON-schema output (the server enforces it with a grammar).
    let schema = json!({
        "type": "object",
        "properties": {
            "answer": {"type": "string", "enum": ["yes", "no"]},
            "sure": {"type": "boolean"}
        },
        "required": ["answer", "sure"]
    });
    let opts_json = GenerateOptions {
        response_format: Some(ResponseFormat::JsonSchema {
            name: "verdict".into(),
            schema,
        }),
        ..GenerateOptions::default().max_tokens(64)
    };
    let verdict = smol
        .invoke(
            &[Message::human("Is Paris in France? Answer in JSON.")],
            &opts_json,
            None,
        )
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(verdict.content.trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", verdict.content));
    assert!(matches!(v["answer"].as_str(), Some("yes" | "no")), "{v}");
    assert!(v["sure"].is_boolean(), "{v}");
    eprintln!("json_schema: {v} ({:?})", started.elapsed());

    // Tool calls: the named tool is called with arguments matching its schema; its result
    // goes back as a tool message and the model answers.
    let tools = model(&server, "smol-tools");
    let weather = ToolSpec::new(
        "get_weather",
        "Get the current weather in a city.",
        json!({
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"]
        }),
    );
    let opts_tools = GenerateOptions {
        tools: vec![weather],
        tool_choice: ToolChoice::Named("get_weather".into()),
        ..GenerateOptions::default().max_tokens(64)
    };
    let mut convo = vec![
        Message::system("You are a helpful assistant with tools."),
        Message::human("What is the weather in Paris?"),
    ];
    let call = tools
        .invoke(&convo, &opts_tools, None)
        .await
        .unwrap_or_else(|e| panic!("tool call failed: {e}\n{}", server.log_tail()));
    assert_eq!(call.tool_calls.len(), 1, "{call:?}");
    let tc = &call.tool_calls[0];
    assert_eq!(tc.name, "get_weather");
    assert!(tc.args.0["city"].is_string(), "{:?}", tc.args);
    assert!(!tc.id.is_empty());
    eprintln!(
        "tool call: {} {} ({:?})",
        tc.name,
        tc.args,
        started.elapsed()
    );
    let result = Message::tool(tc, ToolStatus::Success, "18 degrees and sunny");
    convo.push(call.clone());
    convo.push(result);
    let final_opts = GenerateOptions {
        tool_choice: ToolChoice::None,
        ..opts_tools.clone()
    };
    let final_answer = tools
        .invoke(&convo, &final_opts, None)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "answer after the tool result failed: {e}\n{}",
                server.log_tail()
            )
        });
    assert!(final_answer.tool_calls.is_empty(), "{final_answer:?}");
    assert!(!final_answer.content.trim().is_empty(), "{final_answer:?}");
    eprintln!(
        "after tool: {:?} ({:?})",
        final_answer.content,
        started.elapsed()
    );
    drop(server);
}
