//! Tools: the trait, the `#[tool]` macro, the registry, the tool node in a real graph, the
//! router, and the file-system tools (confinement with real symlinks, limits).

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use ferrograph_core::message::{Message, Role, ToolCall, ToolStatus};
use ferrograph_core::prelude::*;
use ferrograph_core::stream::NodeEventKind;
use ferrograph_runtime::{RunConfig, RunInput, Runtime};
use ferrograph_tools::builtin::{FsLimits, FsTools};
use ferrograph_tools::{
    tool, tools_condition, FnTool, Tool, ToolContext, ToolError, ToolExecutor, ToolRegistry,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Deserialize, JsonSchema)]
struct AddArgs {
    /// First term.
    a: i64,
    /// Second term.
    b: i64,
}

/// Adds two integers.
///
/// Returns their sum.
#[tool]
async fn add(args: AddArgs) -> Result<i64, ToolError> {
    Ok(args.a + args.b)
}

#[derive(Deserialize, JsonSchema)]
struct SleepArgs {
    /// Milliseconds to sleep.
    ms: u64,
}

#[derive(Serialize)]
struct Slept {
    slept_ms: u64,
    call_id: String,
}

/// Sleeps, then says how long.
#[tool(name = "sleep_ms")]
async fn sleepy(args: SleepArgs, ctx: &ToolContext) -> Result<Slept, ToolError> {
    tokio::time::sleep(Duration::from_millis(args.ms)).await;
    Ok(Slept {
        slept_ms: args.ms,
        call_id: ctx.call_id.clone(),
    })
}

#[derive(Deserialize, JsonSchema)]
struct Empty {}

/// Always fails.
#[tool(description = "A tool that fails.")]
async fn broken(_args: Empty, _ctx: ToolContext) -> Result<String, String> {
    Err("the disk is on fire".to_string())
}

#[tool]
async fn panics(_args: Empty) -> Result<String, ToolError> {
    panic!("tool bug")
}

fn registry() -> ToolRegistry {
    let mut r = ToolRegistry::new();
    r.register(add_tool()).unwrap();
    r.register(sleepy_tool()).unwrap();
    r.register(broken_tool()).unwrap();
    r.register(panics_tool()).unwrap();
    r
}

#[test]
fn macro_builds_tools_with_schema_and_docs() {
    let t = add_tool();
    assert_eq!(t.name(), "add");
    assert_eq!(t.description(), "Adds two integers.\n\nReturns their sum.");
    let schema = t.parameters();
    assert_eq!(schema["type"], "object");
    assert_eq!(schema["properties"]["a"]["description"], "First term.");
    assert!(schema.get("$schema").is_none());
    let required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(required, ["a", "b"]);
    assert_eq!(sleepy_tool().name(), "sleep_ms");
    assert_eq!(broken_tool().description(), "A tool that fails.");
    assert_eq!(panics_tool().description(), "");
}

#[tokio::test]
async fn tools_decode_arguments_and_report_bad_ones() {
    let ctx = ToolContext::detached("add");
    assert_eq!(
        add_tool()
            .call(json!({"a": 2, "b": 40}), &ctx)
            .await
            .unwrap(),
        json!(42)
    );
    // Arguments sent as a JSON string are accepted.
    assert_eq!(
        add_tool()
            .call(json!("{\"a\": 1, \"b\": 1}"), &ctx)
            .await
            .unwrap(),
        json!(2)
    );
    let err = add_tool().call(json!({"a": "x"}), &ctx).await.unwrap_err();
    assert!(matches!(err, ToolError::InvalidArguments { .. }), "{err}");
    assert_eq!(err.kind(), "invalid_arguments");
    let closure = FnTool::new("echo", "Echo.", |a: SleepArgs| async move {
        Ok::<_, ToolError>(format!("{}", a.ms))
    });
    assert_eq!(
        closure.call(json!({"ms": 3}), &ctx).await.unwrap(),
        json!("3")
    );
}

#[test]
fn registry_rejects_duplicates_and_bad_names_and_lists() {
    let mut r = registry();
    let err = r.register(add_tool()).unwrap_err();
    assert!(
        matches!(err, ToolError::DuplicateName(ref n) if n == "add"),
        "{err}"
    );
    let bad = FnTool::new("no spaces", "x", |_: Empty| async { Ok::<_, ToolError>(0) });
    assert!(matches!(
        r.register(bad).unwrap_err(),
        ToolError::InvalidName(_)
    ));
    assert_eq!(r.len(), 4);
    assert_eq!(r.names(), ["add", "sleep_ms", "broken", "panics"]);
    let list = r.list();
    assert_eq!(list[0].name, "add");
    assert_eq!(list[0].schema["properties"]["b"]["type"], "integer");
    let specs = r.specs();
    assert_eq!(specs[1].name, "sleep_ms");
    assert_eq!(specs[1].parameters.0["required"], json!(["ms"]));
    assert!(r.get("add").is_some());
    assert!(r.get("nope").is_none());
    assert!(matches!(
        r.require("nope"),
        Err(ToolError::UnknownTool { .. })
    ));
    let sub = r.subset(["broken"]).unwrap();
    assert_eq!(sub.names(), ["broken"]);
}

#[tokio::test]
async fn executor_runs_calls_concurrently_and_turns_failures_into_messages() {
    let mut registry = registry();
    registry
        .register(FnTool::new("hang", "Never returns.", |_: Empty| async {
            std::future::pending::<Result<String, ToolError>>().await
        }))
        .unwrap();
    let exec = ToolExecutor::new(registry)
        .timeout(Duration::from_secs(20))
        .tool_timeout("hang", Duration::from_millis(300));
    let calls = vec![
        ToolCall::new("sleep_ms", json!({"ms": 100})),
        ToolCall::new("sleep_ms", json!({"ms": 100})),
        ToolCall::new("add", json!({"a": 1, "b": 2})),
        ToolCall::new("hang", json!({})),
        ToolCall::new("broken", json!({})),
        ToolCall::new("nope", json!({})),
        ToolCall::new("add", json!({"a": "one"})),
        ToolCall::new("panics", json!(null)),
    ];
    let started = Instant::now();
    let out = exec.execute(&calls, None).await;
    // The hanging call is cut at its own timeout, without holding the others up for long.
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(out.len(), calls.len());
    for (m, c) in out.iter().zip(&calls) {
        assert_eq!(m.role, Role::Tool);
        assert_eq!(m.tool_call_id.as_deref(), Some(c.id.as_str()));
        assert_eq!(m.name.as_deref(), Some(c.name.as_str()));
        assert!(m.metadata.contains_key("duration_ms"), "{m:?}");
    }
    let status: Vec<ToolStatus> = out.iter().map(|m| m.tool_status.unwrap()).collect();
    use ToolStatus::*;
    assert_eq!(
        status,
        [Success, Success, Success, Timeout, Error, Error, Error, Error]
    );
    let slept: serde_json::Value = serde_json::from_str(&out[0].content).unwrap();
    assert_eq!(slept["slept_ms"], 100);
    assert_eq!(slept["call_id"], calls[0].id.as_str());
    assert_eq!(out[2].content, "3");
    assert!(out[3].content.contains("timed out"), "{}", out[3].content);
    assert_eq!(out[3].metadata["status"], "timeout");
    assert!(out[4].content.contains("the disk is on fire"));
    assert!(out[5].content.contains("unknown tool `nope`"));
    assert!(out[5].content.contains("add, sleep_ms"));
    assert_eq!(out[5].metadata["error_kind"], "unknown_tool");
    assert_eq!(out[6].metadata["error_kind"], "invalid_arguments");
    assert!(out[7].content.contains("panicked"));
}

#[tokio::test]
async fn max_concurrency_limits_parallel_calls() {
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (r2, p2) = (running.clone(), peak.clone());
    let t = FnTool::new("work", "Work.", move |_: Empty| {
        let (running, peak) = (r2.clone(), p2.clone());
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            running.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, ToolError>("done")
        }
    });
    let registry = ToolRegistry::new().with(t).unwrap();
    let calls: Vec<ToolCall> = (0..6).map(|_| ToolCall::new("work", json!({}))).collect();
    // Unlimited: all six run at once.
    let out = ToolExecutor::new(registry.clone())
        .execute(&calls, None)
        .await;
    assert!(out
        .iter()
        .all(|m| m.tool_status == Some(ToolStatus::Success)));
    assert_eq!(peak.swap(0, Ordering::SeqCst), 6);
    let out = ToolExecutor::new(registry)
        .max_concurrency(2)
        .execute(&calls, None)
        .await;
    assert!(out
        .iter()
        .all(|m| m.tool_status == Some(ToolStatus::Success)));
    assert_eq!(peak.load(Ordering::SeqCst), 2);
}

#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
struct Chat {
    #[reducer(messages)]
    messages: Vec<Message>,
    #[reducer(add)]
    model_turns: u64,
}
ferrograph_tools::impl_has_messages!(Chat, ChatUpdate, messages);

#[tokio::test]
async fn tool_node_and_router_run_an_agent_loop_in_a_graph() {
    let exec = ToolExecutor::new(registry()).tool_timeout("sleep_ms", Duration::from_millis(100));
    // A scripted "model": first asks for tools, then answers from their results.
    let graph = StateGraph::<Chat>::new("agent")
        .add_node("agent", |s: Arc<Chat>, _ctx: NodeContext| async move {
            let msg = if s.model_turns == 0 {
                Message::ai_with_tools(
                    "",
                    vec![
                        ToolCall::new("add", json!({"a": 20, "b": 22})),
                        ToolCall::new("sleep_ms", json!({"ms": 10_000})),
                        ToolCall::new("missing", json!({})),
                    ],
                )
            } else {
                let results: Vec<&str> = s
                    .messages
                    .iter()
                    .filter(|m| m.role == Role::Tool)
                    .map(|m| m.content.as_str())
                    .collect();
                Message::ai(format!("results: {}", results.len()))
            };
            Ok::<_, NodeError>(ChatUpdate::new().messages(msg).model_turns(1u64))
        })
        .add_node("tools", exec.node::<Chat>())
        .add_edge(START, "agent")
        .add_conditional_edges(
            "agent",
            tools_condition::<Chat>("tools", END),
            ["tools", END],
        )
        .add_edge("tools", "agent")
        .compile()
        .unwrap();
    let runner = Runtime::new().await.unwrap().load(graph).await.unwrap();
    let mut stream = runner
        .stream(
            RunInput::Update(ChatUpdate::new().messages(Message::human("add 20 and 22"))),
            RunConfig::default().stream(StreamMode::Tasks),
        )
        .await
        .unwrap();
    let mut starts = 0;
    let mut ends = Vec::new();
    while let Some(ev) = stream.next_event().await {
        if let StreamEvent::Tool { event, node, .. } = ev {
            assert_eq!(&*node, "tools");
            match event {
                NodeEventKind::ToolStart { .. } => starts += 1,
                NodeEventKind::ToolEnd { tool, status, .. } => ends.push((tool, status)),
                _ => {}
            }
        }
    }
    let out = stream.outcome().await.unwrap();
    assert_eq!(starts, 3);
    ends.sort();
    assert_eq!(
        ends,
        [
            ("add".to_string(), "success".to_string()),
            ("missing".to_string(), "error".to_string()),
            ("sleep_ms".to_string(), "timeout".to_string()),
        ]
    );
    let msgs = &out.state.messages;
    assert_eq!(msgs.len(), 6, "{msgs:#?}");
    assert_eq!(msgs[2].content, "42");
    assert_eq!(msgs[3].tool_status, Some(ToolStatus::Timeout));
    assert_eq!(msgs[4].tool_status, Some(ToolStatus::Error));
    assert_eq!(msgs[5].content, "results: 3");
    assert_eq!(out.state.model_turns, 2);
}

#[test]
fn router_goes_to_tools_only_after_an_ai_message_with_calls() {
    let route = tools_condition::<Chat>("tools", "synthesize");
    let mut s = Chat::default();
    assert_eq!(route(&s), "synthesize");
    s.messages.push(Message::human("hi"));
    assert_eq!(route(&s), "synthesize");
    let call = ToolCall::new("add", json!({}));
    s.messages
        .push(Message::ai_with_tools("", vec![call.clone()]));
    assert_eq!(route(&s), "tools");
    s.messages
        .push(Message::tool(&call, ToolStatus::Success, "1"));
    assert_eq!(route(&s), "synthesize");
    s.messages.push(Message::ai("done"));
    assert_eq!(route(&s), "synthesize");
}

// ---------------------------------------------------------------- file-system tools

struct Sandbox {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    outside: std::path::PathBuf,
}

fn sandbox() -> Sandbox {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(root.join("src/nested")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(root.join("README.md"), "# Demo\nThe answer is 42.\n").unwrap();
    std::fs::write(
        root.join("src/lib.rs"),
        "fn main() {}\n// TODO: answer\nlet answer = 42;\n",
    )
    .unwrap();
    std::fs::write(root.join("src/nested/deep.txt"), "ANSWER in caps\n").unwrap();
    std::fs::write(root.join("blob.bin"), b"abc\0def answer").unwrap();
    std::fs::write(outside.join("secret.txt"), "the answer is secret\n").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::symlink;
        symlink(outside.join("secret.txt"), root.join("escape.txt")).unwrap();
        symlink(&outside, root.join("escape_dir")).unwrap();
        symlink(root.join("README.md"), root.join("inside_link.md")).unwrap();
    }
    Sandbox {
        _dir: dir,
        root,
        outside,
    }
}

async fn call(t: &dyn Tool, args: serde_json::Value) -> Result<serde_json::Value, ToolError> {
    t.call(args, &ToolContext::detached(t.name())).await
}

#[tokio::test]
async fn read_file_reads_inside_and_refuses_traversal_and_symlink_escapes() {
    let sb = sandbox();
    let fs = FsTools::new(&sb.root).unwrap();
    let rf = fs.read_file();
    let text = call(&rf, json!({"path": "README.md"})).await.unwrap();
    assert_eq!(text, json!("# Demo\nThe answer is 42.\n"));
    let text = call(&rf, json!({"path": "./src/../README.md"})).await;
    assert!(matches!(text, Err(ToolError::Denied { .. })), "{text:?}");
    for bad in [
        "../outside/secret.txt",
        "src/../../outside/secret.txt",
        "..",
    ] {
        let err = call(&rf, json!({ "path": bad })).await.unwrap_err();
        assert!(matches!(err, ToolError::Denied { .. }), "{bad}: {err}");
    }
    let abs = sb.outside.join("secret.txt");
    let err = call(&rf, json!({"path": abs.to_string_lossy()}))
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::Denied { .. }), "{err}");
    // An absolute path inside the (canonical) root is fine.
    let inside = fs.root().join("README.md");
    assert!(call(&rf, json!({"path": inside.to_string_lossy()}))
        .await
        .is_ok());
    #[cfg(unix)]
    {
        let err = call(&rf, json!({"path": "escape.txt"})).await.unwrap_err();
        assert!(matches!(err, ToolError::Denied { .. }), "{err}");
        assert!(err.to_string().contains("symlink"), "{err}");
        let err = call(&rf, json!({"path": "escape_dir/secret.txt"}))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::Denied { .. }), "{err}");
        assert_eq!(
            call(&rf, json!({"path": "inside_link.md"})).await.unwrap(),
            json!("# Demo\nThe answer is 42.\n")
        );
    }
    let err = call(&rf, json!({"path": "nope.txt"})).await.unwrap_err();
    assert!(matches!(err, ToolError::Io { .. }), "{err}");
    let err = call(&rf, json!({"path": "blob.bin"})).await.unwrap_err();
    assert!(err.to_string().contains("binary"), "{err}");
    let err = call(&rf, json!({"path": "src"})).await.unwrap_err();
    assert!(err.to_string().contains("not a file"), "{err}");
    let err = call(&rf, json!({"path": "README.md", "extra": 1}))
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::InvalidArguments { .. }), "{err}");
}

#[tokio::test]
async fn read_file_pages_large_files() {
    let sb = sandbox();
    let limits = FsLimits {
        max_read_bytes: 10,
        ..FsLimits::default()
    };
    let fs = FsTools::with_limits(&sb.root, limits).unwrap();
    let rf = fs.read_file();
    let first = call(&rf, json!({"path": "README.md"})).await.unwrap();
    let first = first.as_str().unwrap();
    assert!(first.starts_with("# Demo\nThe"), "{first}");
    assert!(first.contains("offset=10"), "{first}");
    let second = call(
        &rf,
        json!({"path": "README.md", "offset": 10, "max_bytes": 5}),
    )
    .await
    .unwrap();
    assert!(second.as_str().unwrap().starts_with(" answ"), "{second}");
    let err = call(&rf, json!({"path": "README.md", "offset": 1000}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("past the end"), "{err}");
}

#[tokio::test]
async fn list_dir_lists_inside_only() {
    let sb = sandbox();
    let fs = FsTools::new(&sb.root).unwrap();
    let ld = fs.list_dir();
    let out = call(&ld, json!({})).await.unwrap();
    let names: Vec<&str> = out["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"README.md") && names.contains(&"src"),
        "{names:?}"
    );
    assert_eq!(out["path"], ".");
    let src = call(&ld, json!({"path": "src"})).await.unwrap();
    assert_eq!(src["entries"][0]["name"], "lib.rs");
    assert_eq!(src["entries"][0]["kind"], "file");
    assert_eq!(src["entries"][1]["kind"], "dir");
    assert!(matches!(
        call(&ld, json!({"path": ".."})).await.unwrap_err(),
        ToolError::Denied { .. }
    ));
    #[cfg(unix)]
    {
        let e = out["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "escape_dir")
            .unwrap();
        assert_eq!(e["kind"], "symlink");
        assert!(matches!(
            call(&ld, json!({"path": "escape_dir"})).await.unwrap_err(),
            ToolError::Denied { .. }
        ));
    }
    let limits = FsLimits {
        max_list_entries: 2,
        ..FsLimits::default()
    };
    let small = FsTools::with_limits(&sb.root, limits).unwrap().list_dir();
    let out = call(&small, json!({})).await.unwrap();
    assert_eq!(out["entries"].as_array().unwrap().len(), 2);
    assert_eq!(out["truncated"], true);
}

#[tokio::test]
async fn grep_searches_inside_the_root_without_following_escapes() {
    let sb = sandbox();
    let fs = FsTools::new(&sb.root).unwrap();
    let g = fs.grep();
    let out = call(&g, json!({"pattern": "answer"})).await.unwrap();
    let out = out.as_str().unwrap();
    assert!(out.contains("README.md:2: The answer is 42."), "{out}");
    assert!(out.contains("src/lib.rs:2: // TODO: answer"), "{out}");
    assert!(out.contains("inside_link.md:2:"), "{out}");
    assert!(!out.contains("secret"), "{out}");
    assert!(!out.contains("blob.bin"), "{out}");
    assert!(!out.contains("ANSWER"), "{out}");
    let ci = call(
        &g,
        json!({"pattern": "answer", "path": "src", "case_insensitive": true}),
    )
    .await
    .unwrap();
    assert!(
        ci.as_str()
            .unwrap()
            .contains("src/nested/deep.txt:1: ANSWER"),
        "{ci}"
    );
    assert!(!ci.as_str().unwrap().contains("README"), "{ci}");
    let one = call(&g, json!({"pattern": "answer", "max_matches": 1}))
        .await
        .unwrap();
    assert!(
        one.as_str().unwrap().contains("[truncated after 1 matches"),
        "{one}"
    );
    let none = call(&g, json!({"pattern": "zzz"})).await.unwrap();
    assert_eq!(none, json!("no matches"));
    assert!(matches!(
        call(&g, json!({"pattern": "("})).await.unwrap_err(),
        ToolError::InvalidArguments { .. }
    ));
    assert!(matches!(
        call(&g, json!({"pattern": "x", "path": "../outside"}))
            .await
            .unwrap_err(),
        ToolError::Denied { .. }
    ));
    assert!(matches!(
        call(&g, json!({"pattern": "a".repeat(5000)}))
            .await
            .unwrap_err(),
        ToolError::Limit(_)
    ));
}

#[test]
fn fs_tools_register_and_need_a_directory_root() {
    let sb = sandbox();
    let mut r = ToolRegistry::new();
    FsTools::new(&sb.root)
        .unwrap()
        .register_all(&mut r)
        .unwrap();
    assert_eq!(r.names(), ["read_file", "list_dir", "grep"]);
    assert!(FsTools::new(sb.root.join("README.md")).is_err());
    assert!(FsTools::new(sb.root.join("missing")).is_err());
}

// ---------------------------------------------------------------- search tools

struct Keyword(Vec<(&'static str, &'static str)>);

#[async_trait::async_trait]
impl ferrograph_tools::builtin::Searcher for Keyword {
    async fn search(
        &self,
        query: &str,
        k: usize,
    ) -> Result<Vec<ferrograph_tools::builtin::SearchHit>, ToolError> {
        Ok(self
            .0
            .iter()
            .filter(|(_, text)| text.contains(query))
            .take(k)
            .map(|(source, text)| ferrograph_tools::builtin::SearchHit {
                source: source.to_string(),
                location: None,
                score: 1.0,
                text: text.to_string(),
            })
            .collect())
    }
}

#[tokio::test]
async fn search_tools_wrap_a_searcher() {
    use ferrograph_tools::builtin::SearchTool;
    let corpus = Arc::new(Keyword(vec![
        ("CHANGELOG.md", "fixed: sled flush hangs on close"),
        ("README.md", "sled is an embedded database"),
        ("NOTES.md", "sled flush is slow on tmpfs"),
    ]));
    let docs = SearchTool::docs_search("cargo registry", corpus.clone()).limits(5, 10);
    assert_eq!(docs.name(), "docs_search");
    assert!(docs.description().contains("cargo registry"));
    let out = call(&docs, json!({"query": "flush", "k": 1}))
        .await
        .unwrap();
    assert_eq!(out.as_array().unwrap().len(), 1);
    assert_eq!(out[0]["source"], "CHANGELOG.md");
    assert_eq!(out[0]["text"], "fixed: sle…");
    let rag = SearchTool::rag_search("codebase", corpus);
    assert_eq!(rag.name(), "rag_search");
    let out = call(&rag, json!({"query": "sled"})).await.unwrap();
    assert_eq!(out.as_array().unwrap().len(), 3);
    assert!(matches!(
        call(&rag, json!({"query": " "})).await.unwrap_err(),
        ToolError::InvalidArguments { .. }
    ));
}
