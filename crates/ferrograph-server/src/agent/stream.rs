//! A run's events in the Agent Server API's stream modes.
//!
//! The runtime streams typed events (values, updates, tokens, tasks, checkpoints, interrupts);
//! [`Converter`] turns each into the Server-Sent Events that LangGraph's server sends for the
//! same moment, tagged with the stream mode that asks for them, so that one run can be
//! streamed and joined in any combination of modes:
//!
//! | mode | events |
//! |---|---|
//! | `values` | `values`: the whole state after each step; `{"__interrupt__": […]}` at an interrupt |
//! | `updates` | `updates`: `{node: update}` per task; `{"__interrupt__": […]}` at an interrupt |
//! | `messages-tuple` | `messages`: `[chunk, metadata]` per model token |
//! | `messages` | `messages/metadata`, `messages/partial` (the text so far), `messages/complete` |
//! | `custom` | `custom`: what a node wrote to its stream |
//! | `tasks` | `tasks`: a task's start (`input`, `triggers`) and its result |
//! | `checkpoints` | `checkpoints`: each checkpoint (`config`, `values`, `next`, `metadata`) |
//! | `debug` | `debug`: `{type: checkpoint | task | task_result, step, timestamp, payload}` |
//! | `events` | `events`: `on_chain_start`/`on_chain_end` per task, `on_chat_model_stream` per token, `on_tool_start`/`on_tool_end` |
//!
//! Events of a subgraph carry its namespace; they are sent (as `event|namespace`) only when
//! the run asks for subgraphs.

use super::iso;
use super::threads::interrupt_json;
use ferrograph::core::id::now_millis;
use ferrograph::Interrupt;
use serde_json::{json, Value};
use std::collections::HashMap;

/// The stream modes of the Agent Server API.
pub(crate) const MODES: [&str; 9] = [
    "values",
    "updates",
    "messages",
    "messages-tuple",
    "custom",
    "tasks",
    "checkpoints",
    "debug",
    "events",
];

/// One event of a run, ready to send.
#[derive(Debug)]
pub(crate) struct SseItem {
    /// The stream mode that carries it; `None` for events every stream gets (`metadata`,
    /// `error`).
    pub(crate) mode: Option<&'static str>,
    /// SSE event name, without the namespace.
    pub(crate) event: &'static str,
    /// Subgraph namespace ("" at the root).
    pub(crate) ns: String,
    /// SSE data, as JSON text.
    pub(crate) data: String,
}

impl SseItem {
    pub(crate) fn new(
        mode: Option<&'static str>,
        event: &'static str,
        ns: &str,
        data: &Value,
    ) -> Self {
        SseItem {
            mode,
            event,
            ns: ns.to_string(),
            data: data.to_string(),
        }
    }

    /// The SSE event name: `event`, or `event|namespace` inside a subgraph.
    pub(crate) fn name(&self) -> String {
        if self.ns.is_empty() {
            self.event.to_string()
        } else {
            format!("{}|{}", self.event, self.ns)
        }
    }

    /// Whether a stream of `modes` (with or without subgraphs) sends it.
    pub(crate) fn wanted(&self, modes: &[String], subgraphs: bool) -> bool {
        (self.ns.is_empty() || subgraphs) && self.mode.is_none_or(|m| modes.iter().any(|x| x == m))
    }
}

#[derive(Default)]
struct Message {
    id: String,
    text: String,
    started: bool,
}

/// Turns one run's events into the Agent Server API's stream events.
pub(crate) struct Converter {
    run_id: String,
    thread_id: String,
    /// The newest values, by namespace (for checkpoint payloads).
    values: HashMap<String, Value>,
    /// The message a node is writing, by (namespace, node).
    messages: HashMap<(String, String), Message>,
    /// Tasks started per (namespace, node), for message ids.
    counts: HashMap<(String, String), u64>,
}

fn timestamp() -> String {
    iso(now_millis())
}

fn field<'a>(d: &'a Value, k: &str) -> &'a Value {
    d.get(k).unwrap_or(&Value::Null)
}

impl Converter {
    pub(crate) fn new(run_id: &str, thread_id: &str) -> Self {
        Converter {
            run_id: run_id.to_string(),
            thread_id: thread_id.to_string(),
            values: HashMap::new(),
            messages: HashMap::new(),
            counts: HashMap::new(),
        }
    }

    fn node_metadata(&self, ns: &str, node: &str, step: &Value) -> Value {
        json!({
            "langgraph_node": node, "langgraph_step": step, "langgraph_checkpoint_ns": ns,
            "langgraph_triggers": [], "langgraph_path": ["__pregel_pull", node],
            "thread_id": self.thread_id, "run_id": self.run_id,
        })
    }

    fn interrupts(list: &Value) -> Value {
        let parsed: Vec<Interrupt> = serde_json::from_value(list.clone()).unwrap_or_default();
        Value::Array(parsed.iter().map(interrupt_json).collect())
    }

    /// The stream events for one of the runtime's events (`kind`, `namespace`, `data` as
    /// [`ferrograph::runtime::event_json`] makes them).
    pub(crate) fn convert(&mut self, kind: &str, ns: &str, d: &Value) -> Vec<SseItem> {
        let mut out = Vec::new();
        let mut push = |mode: &'static str, event: &'static str, data: Value| {
            out.push(SseItem::new(Some(mode), event, ns, &data));
        };
        match kind {
            "values" => {
                let mut state = field(d, "state").clone();
                super::messages::present(&mut state);
                self.values.insert(ns.to_string(), state.clone());
                push("values", "values", state);
            }
            "updates" => {
                let node = field(d, "node").as_str().unwrap_or("").to_string();
                let mut update = field(d, "update").clone();
                super::messages::present(&mut update);
                push("updates", "updates", json!({ node: update }));
            }
            "custom" => push("custom", "custom", field(d, "payload").clone()),
            "interrupt" => {
                let list = Self::interrupts(field(d, "interrupts"));
                push("values", "values", json!({ "__interrupt__": list }));
                push("updates", "updates", json!({ "__interrupt__": list }));
            }
            "token" => {
                let node = field(d, "node").as_str().unwrap_or("").to_string();
                let text = field(d, "text").as_str().unwrap_or("").to_string();
                let model = field(d, "model").clone();
                let key = (ns.to_string(), node.clone());
                let count = self.counts.get(&key).copied().unwrap_or(0);
                let meta = {
                    let mut m = self.node_metadata(ns, &node, &Value::Null);
                    m["ls_model_name"] = model.clone();
                    m
                };
                let msg = self.messages.entry(key).or_default();
                if msg.id.is_empty() {
                    msg.id = format!("run-{}-{node}-{count}", self.run_id);
                }
                msg.text.push_str(&text);
                let chunk = json!({
                    "type": "AIMessageChunk", "id": msg.id, "content": text,
                    "additional_kwargs": {}, "response_metadata": {}, "name": null,
                    "tool_calls": [], "invalid_tool_calls": [], "tool_call_chunks": [],
                    "usage_metadata": null, "example": false,
                });
                let first = !msg.started;
                msg.started = true;
                let partial = json!([{ "type": "ai", "id": msg.id, "content": msg.text }]);
                let id = msg.id.clone();
                push("messages-tuple", "messages", json!([chunk, meta]));
                if first {
                    push(
                        "messages",
                        "messages/metadata",
                        json!({ id.clone(): { "metadata": meta } }),
                    );
                }
                push("messages", "messages/partial", partial);
                push(
                    "events",
                    "events",
                    json!({
                        "event": "on_chat_model_stream", "name": model, "run_id": id,
                        "tags": [], "metadata": meta, "data": { "chunk": chunk },
                    }),
                );
            }
            "task_start" => {
                let node = field(d, "node").as_str().unwrap_or("").to_string();
                let step = field(d, "step").clone();
                let key = (ns.to_string(), node.clone());
                *self.counts.entry(key.clone()).or_default() += 1;
                self.messages.remove(&key);
                let payload = json!({
                    "id": field(d, "task_id"), "name": node, "input": null, "triggers": [],
                });
                push("tasks", "tasks", payload.clone());
                push(
                    "debug",
                    "debug",
                    json!({ "type": "task", "step": step, "timestamp": timestamp(), "payload": payload }),
                );
                push(
                    "events",
                    "events",
                    json!({
                        "event": "on_chain_start", "name": node, "run_id": field(d, "task_id"),
                        "tags": [], "metadata": self.node_metadata(ns, &node, &step),
                        "data": {},
                    }),
                );
            }
            "task_end" => {
                let node = field(d, "node").as_str().unwrap_or("").to_string();
                let step = field(d, "step").clone();
                let key = (ns.to_string(), node.clone());
                if let Some(msg) = self.messages.remove(&key) {
                    if msg.started {
                        push(
                            "messages",
                            "messages/complete",
                            json!([{ "type": "ai", "id": msg.id, "content": msg.text }]),
                        );
                    }
                }
                let outcome = field(d, "outcome");
                let error = outcome
                    .get("error")
                    .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_string));
                let payload = json!({
                    "id": field(d, "task_id"), "name": node, "error": error,
                    "interrupts": [], "result": {},
                    "ferrograph": { "outcome": outcome, "duration_ms": field(d, "duration_ms"), "attempt": field(d, "attempt") },
                });
                push("tasks", "tasks", payload.clone());
                push(
                    "debug",
                    "debug",
                    json!({ "type": "task_result", "step": step, "timestamp": timestamp(), "payload": payload }),
                );
                push(
                    "events",
                    "events",
                    json!({
                        "event": "on_chain_end", "name": node, "run_id": field(d, "task_id"),
                        "tags": [], "metadata": self.node_metadata(ns, &node, &step),
                        "data": { "output": {} },
                    }),
                );
            }
            "checkpoint" => {
                let step = field(d, "step").clone();
                let config = json!({ "configurable": {
                    "thread_id": self.thread_id, "checkpoint_ns": ns,
                    "checkpoint_id": field(d, "checkpoint_id"),
                }});
                let payload = json!({
                    "config": config,
                    "parent_config": null,
                    "values": self.values.get(ns).cloned().unwrap_or(json!({})),
                    "next": field(d, "next"),
                    "metadata": { "step": step, "source": "loop", "run_id": self.run_id },
                    "tasks": [],
                });
                push("checkpoints", "checkpoints", payload.clone());
                push(
                    "debug",
                    "debug",
                    json!({ "type": "checkpoint", "step": step, "timestamp": timestamp(), "payload": payload }),
                );
            }
            "tool" => {
                let node = field(d, "node").as_str().unwrap_or("").to_string();
                let ev = field(d, "event");
                let name = match field(ev, "event").as_str() {
                    Some("tool_start") => "on_tool_start",
                    Some("tool_end") => "on_tool_end",
                    _ => return out,
                };
                push(
                    "events",
                    "events",
                    json!({
                        "event": name, "name": field(ev, "tool"), "run_id": field(ev, "call_id"),
                        "tags": [], "metadata": self.node_metadata(ns, &node, &Value::Null),
                        "data": ev,
                    }),
                );
            }
            _ => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(items: &[SseItem], modes: &[&str]) -> Vec<String> {
        let modes: Vec<String> = modes.iter().map(|s| s.to_string()).collect();
        items
            .iter()
            .filter(|i| i.wanted(&modes, false))
            .map(SseItem::name)
            .collect()
    }

    #[test]
    fn tokens_become_message_chunks_and_partials() {
        let mut c = Converter::new("r1", "t1");
        let mut all = c.convert(
            "task_start",
            "",
            &json!({"node": "writer", "step": 1, "task_id": "k"}),
        );
        all.extend(c.convert(
            "token",
            "",
            &json!({"node": "writer", "model": "m", "text": "Hel"}),
        ));
        all.extend(c.convert(
            "token",
            "",
            &json!({"node": "writer", "model": "m", "text": "lo"}),
        ));
        all.extend(c.convert(
            "task_end",
            "",
            &json!({"node": "writer", "step": 1, "task_id": "k", "outcome": "ok"}),
        ));
        assert_eq!(names(&all, &["messages-tuple"]), ["messages", "messages"]);
        assert_eq!(
            names(&all, &["messages"]),
            [
                "messages/metadata",
                "messages/partial",
                "messages/partial",
                "messages/complete"
            ]
        );
        let complete = all.iter().find(|i| i.event == "messages/complete").unwrap();
        let v: Value = serde_json::from_str(&complete.data).unwrap();
        assert_eq!(v[0]["content"], "Hello");
        let tuple = all.iter().find(|i| i.event == "messages").unwrap();
        let v: Value = serde_json::from_str(&tuple.data).unwrap();
        assert_eq!(v[0]["content"], "Hel");
        assert_eq!(v[1]["langgraph_node"], "writer");
        assert!(names(&all, &["values"]).is_empty());
    }

    #[test]
    fn interrupts_reach_values_and_updates() {
        let mut c = Converter::new("r", "t");
        let items = c.convert(
            "interrupt",
            "",
            &json!({"interrupts": [{"id": "i1", "node": "gate", "task_id": "k", "value": {"q": 1}}]}),
        );
        assert_eq!(names(&items, &["values", "updates"]), ["values", "updates"]);
        let v: Value = serde_json::from_str(&items[0].data).unwrap();
        assert_eq!(v["__interrupt__"][0]["id"], "i1");
        assert_eq!(v["__interrupt__"][0]["value"]["q"], 1);
    }

    #[test]
    fn subgraph_events_need_subgraphs() {
        let mut c = Converter::new("r", "t");
        let items = c.convert(
            "updates",
            "inner:k1",
            &json!({"node": "n", "update": {"a": 1}}),
        );
        let modes = vec!["updates".to_string()];
        assert!(!items[0].wanted(&modes, false));
        assert!(items[0].wanted(&modes, true));
        assert_eq!(items[0].name(), "updates|inner:k1");
    }
}
