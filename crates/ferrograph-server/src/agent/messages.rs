//! Chat messages as LangChain writes them, for clients of the Agent Server API.
//!
//! LangGraph's clients (the SDKs, `useStream`, the agent chat UI) send and read messages in
//! LangChain's dictionary shape: `{"type": "human", "content": "…", "id": "…"}`, content
//! possibly a list of blocks, tool calls as `{"name", "args", "id", "type": "tool_call"}`,
//! and a `messages` field merged by id (LangGraph's `add_messages`). Our state keeps
//! [`ferrograph::core::Message`] (`role` instead of `type`) and the messages rule takes a list
//! of operations. This module translates at the edge:
//!
//! - [`messages_in`]: a `messages` field of an input or a state update, written the LangChain
//!   way (a string, `[role, content]` pairs, message dictionaries, `RemoveMessage`), becomes
//!   the messages rule's operations. Operations and our own message shape pass through.
//! - [`present`]: every message of ours in a state read gains LangChain's fields (`type`,
//!   `additional_kwargs`, `response_metadata`, `usage_metadata`, tool calls with `type`),
//!   keeping its own, so both our console and LangChain's clients read it.

use ferrograph::core::{Json, Message, MessageOp, MessagesUpdate, ToolCall, ToolStatus};
use serde_json::{json, Map, Value};

/// LangGraph's id for "remove every message".
const REMOVE_ALL: &str = "__remove_all__";

/// Why a `messages` value could not be read.
#[derive(Debug, thiserror::Error)]
#[error("`messages`: {0}")]
pub(crate) struct MessagesError(String);

/// Rewrites `update["messages"]`, when present and written LangChain's way, into the messages
/// rule's operations (see the module documentation). Other fields are left alone.
pub(crate) fn messages_in(update: &mut Value) -> Result<(), MessagesError> {
    let Some(field) = update.get_mut("messages") else {
        return Ok(());
    };
    let items: Vec<Value> = match field.take() {
        Value::Array(items) => items,
        Value::Null => Vec::new(),
        one => vec![one],
    };
    let mut ops = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        ops.push(op_of(item).map_err(|e| MessagesError(format!("item {i}: {e}")))?);
    }
    *field = serde_json::to_value(MessagesUpdate(ops)).map_err(|e| MessagesError(e.to_string()))?;
    Ok(())
}

/// One item of a `messages` list as a messages-rule operation.
fn op_of(item: Value) -> Result<MessageOp, String> {
    if let Ok(op) = serde_json::from_value::<MessageOp>(item.clone()) {
        return Ok(op); // already an operation
    }
    match item {
        Value::String(text) => Ok(Message::human(text).into()),
        Value::Array(pair) => match pair.as_slice() {
            [Value::String(role), content] => {
                Ok(message(role, text_of(content)?, &Map::new())?.into())
            }
            _ => Err("a pair is [role, content]".into()),
        },
        Value::Object(o) => {
            let kind = o
                .get("type")
                .or_else(|| o.get("role"))
                .and_then(Value::as_str)
                .ok_or("a message has `type` (or `role`) and `content`")?;
            if kind == "remove" {
                let id =
                    id_of(&o).ok_or("a RemoveMessage needs the `id` of the message to remove")?;
                return Ok(if id == REMOVE_ALL {
                    MessageOp::RemoveAll
                } else {
                    MessageOp::remove(id)
                });
            }
            let content = o.get("content").ok_or("a message has `content`")?;
            Ok(message(kind, text_of(content)?, &o)?.into())
        }
        _ => Err("a message is a string, a [role, content] pair or an object".into()),
    }
}

/// A message's non-empty `id`.
fn id_of(o: &Map<String, Value>) -> Option<&str> {
    o.get("id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Our message from LangChain's fields (a fresh id when it has none).
fn message(kind: &str, text: String, o: &Map<String, Value>) -> Result<Message, String> {
    let string = |key: &str| o.get(key).and_then(Value::as_str).map(str::to_string);
    let mut m = match kind {
        "human" | "user" => Message::human(text),
        "ai" | "assistant" | "AIMessageChunk" => Message::ai(text),
        "system" | "developer" => Message::system(text),
        "tool" => {
            let status = match o.get("status").and_then(Value::as_str) {
                Some("error") => ToolStatus::Error,
                _ => ToolStatus::Success,
            };
            // The call it answers: its id and tool name are set from the message below.
            let call = ToolCall {
                id: String::new(),
                name: String::new(),
                args: Json(json!({})),
            };
            Message::tool(&call, status, text)
        }
        other => {
            return Err(format!(
                "unknown message type `{other}` (human, ai, system, tool or remove)"
            ))
        }
    };
    m.tool_calls = match o.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .map(|c| {
                let name = c
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or("a tool call has a `name`")?;
                Ok(ToolCall {
                    id: c
                        .get("id")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .into(),
                    name: name.into(),
                    args: Json(c.get("args").cloned().unwrap_or(json!({}))),
                })
            })
            .collect::<Result<_, String>>()?,
        Some(_) => return Err("`tool_calls` is a list".into()),
    };
    m.tool_call_id = string("tool_call_id");
    m.name = string("name");
    if let Some(id) = id_of(o) {
        m.id = id.to_string();
    }
    Ok(m)
}

/// The text of LangChain content: a string, or a list of blocks whose text parts are joined.
fn text_of(content: &Value) -> Result<String, String> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for b in blocks {
                match b {
                    Value::String(s) => out.push_str(s),
                    Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("text") => {
                        out.push_str(o.get("text").and_then(Value::as_str).unwrap_or_default());
                    }
                    Value::Object(o) => {
                        let kind = o.get("type").and_then(Value::as_str).unwrap_or("?");
                        return Err(format!(
                            "content blocks of type `{kind}` are not supported (text only)"
                        ));
                    }
                    _ => {
                        return Err(
                            "content blocks are strings or {\"type\": \"text\"} objects".into()
                        )
                    }
                }
            }
            Ok(out)
        }
        _ => Err("`content` is a string or a list of blocks".into()),
    }
}

/// Whether `o` is one of our messages as serialized.
fn is_ours(o: &Map<String, Value>) -> bool {
    matches!(
        o.get("role").and_then(Value::as_str),
        Some("human" | "ai" | "system" | "tool")
    ) && o.get("content").is_some_and(Value::is_string)
        && o.get("id").is_some_and(Value::is_string)
        && o.get("tool_calls").is_some_and(Value::is_array)
        && o.get("metadata").is_some_and(Value::is_object)
}

/// Adds LangChain's fields to every message of ours inside `v` (see the module
/// documentation).
pub(crate) fn present(v: &mut Value) {
    match v {
        Value::Array(items) => items.iter_mut().for_each(present),
        Value::Object(o) if is_ours(o) => dress(o),
        Value::Object(o) => o.values_mut().for_each(present),
        _ => {}
    }
}

fn dress(o: &mut Map<String, Value>) {
    let role = o
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or("ai")
        .to_string();
    o.insert("type".into(), json!(role));
    o.insert("additional_kwargs".into(), json!({}));
    let mut response = Map::new();
    if let Some(reason) = o.get("finish_reason").filter(|r| r.is_string()) {
        response.insert("finish_reason".into(), reason.clone());
    }
    o.insert("response_metadata".into(), Value::Object(response));
    o.insert("example".into(), json!(false));
    if let Some(Value::Array(calls)) = o.get_mut("tool_calls") {
        for c in calls.iter_mut() {
            if let Some(c) = c.as_object_mut() {
                c.insert("type".into(), json!("tool_call"));
            }
        }
    }
    match role.as_str() {
        "ai" => {
            o.insert("invalid_tool_calls".into(), json!([]));
            let usage = o.get("usage").and_then(|u| {
                let input = u.get("prompt_tokens")?.as_u64()?;
                let output = u.get("completion_tokens")?.as_u64()?;
                Some(json!({
                    "input_tokens": input, "output_tokens": output,
                    "total_tokens": input + output,
                }))
            });
            o.insert("usage_metadata".into(), usage.unwrap_or(Value::Null));
        }
        "tool" => {
            let status = match o.get("tool_status").and_then(Value::as_str) {
                Some("success") | None => "success",
                Some(_) => "error",
            };
            o.insert("status".into(), json!(status));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrograph::core::{Message, MessagesUpdate, ToolCall, ToolStatus};

    #[test]
    fn langchain_messages_become_operations_our_rule_reads() {
        let mut input = json!({
            "messages": [
                "hello",
                ["assistant", "hi there"],
                { "type": "human", "content": [{ "type": "text", "text": "a " }, "b"], "id": "h1" },
                { "type": "ai", "content": "", "id": "a1",
                  "tool_calls": [{ "name": "search", "args": { "q": "x" }, "id": "c1", "type": "tool_call" }] },
                { "type": "tool", "content": "found", "tool_call_id": "c1", "status": "error" },
                { "type": "remove", "id": "a1" },
                { "type": "remove", "id": REMOVE_ALL },
            ],
            "other": "left alone",
        });
        messages_in(&mut input).unwrap();
        assert_eq!(input["other"], "left alone");
        let ops: MessagesUpdate = serde_json::from_value(input["messages"].clone()).unwrap();
        assert_eq!(ops.len(), 7);
        let json = serde_json::to_value(&ops).unwrap();
        assert_eq!(json[0]["upsert"]["message"]["role"], "human");
        assert_eq!(json[0]["upsert"]["message"]["content"], "hello");
        assert_eq!(json[1]["upsert"]["message"]["role"], "ai");
        assert_eq!(json[2]["upsert"]["message"]["content"], "a b");
        assert_eq!(json[2]["upsert"]["message"]["id"], "h1");
        assert_eq!(
            json[3]["upsert"]["message"]["tool_calls"][0]["args"]["q"],
            "x"
        );
        assert_eq!(json[4]["upsert"]["message"]["tool_status"], "error");
        assert_eq!(json[5], json!({ "remove": { "id": "a1" } }));
        assert_eq!(json[6], json!("remove_all"));
        // A single message or a single string is a list of one.
        let mut one = json!({ "messages": { "role": "user", "content": "x" } });
        messages_in(&mut one).unwrap();
        assert_eq!(one["messages"][0]["upsert"]["message"]["role"], "human");
    }

    #[test]
    fn operations_and_bad_messages() {
        let ops = serde_json::to_value(MessagesUpdate::from(Message::human("x"))).unwrap();
        let mut input = json!({ "messages": ops.clone() });
        messages_in(&mut input).unwrap();
        assert_eq!(input["messages"], ops);
        for bad in [
            json!({ "messages": [{ "type": "robot", "content": "x" }] }),
            json!({ "messages": [{ "type": "human" }] }),
            json!({ "messages": [{ "type": "human", "content": [{ "type": "image_url" }] }] }),
            json!({ "messages": [42] }),
            json!({ "messages": [{ "type": "remove" }] }),
        ] {
            let mut b = bad.clone();
            let e = messages_in(&mut b).unwrap_err().to_string();
            assert!(e.starts_with("`messages`: item 0"), "{bad}: {e}");
        }
    }

    #[test]
    fn our_messages_read_as_langchain_and_keep_their_fields() {
        let call = ToolCall::new("search", json!({ "q": "x" }));
        let mut ai = Message::ai_with_tools("thinking", vec![call.clone()]);
        ai.usage = Some(ferrograph::core::TokenUsage {
            prompt_tokens: 10,
            completion_tokens: 3,
            cached_prompt_tokens: 0,
        });
        let tool = Message::tool(&call, ToolStatus::Error, "failed");
        let mut state = json!({ "messages": [Message::human("hi"), ai, tool], "n": 1 });
        present(&mut state);
        let m = &state["messages"];
        assert_eq!(m[0]["type"], "human");
        assert_eq!(m[0]["role"], "human");
        assert_eq!(m[1]["type"], "ai");
        assert_eq!(m[1]["tool_calls"][0]["type"], "tool_call");
        assert_eq!(m[1]["usage_metadata"]["total_tokens"], 13);
        assert_eq!(m[2]["status"], "error");
        assert_eq!(state["n"], 1);
        // What a client reads back in is read as the same message.
        let mut back = json!({ "messages": [m[1].clone()] });
        messages_in(&mut back).unwrap();
        let ops: MessagesUpdate = serde_json::from_value(back["messages"].clone()).unwrap();
        let json = serde_json::to_value(&ops).unwrap();
        assert_eq!(json[0]["upsert"]["message"]["id"], m[1]["id"]);
        assert_eq!(
            json[0]["upsert"]["message"]["tool_calls"][0]["name"],
            "search"
        );
    }
}
