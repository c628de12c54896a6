//! [`RemoteChatModel`]: an OpenAI-compatible `/v1/chat/completions` server (vLLM, llama.cpp
//! server, llama-cpp-python, Ollama, LiteLLM...) as a [`ChatModel`].
//!
//! - Messages map to `system` / `user` / `assistant` (with `tool_calls`) / `tool` (with
//!   `tool_call_id`); [`GenerateOptions::tools`] become `tools` and `tool_choice`;
//!   [`GenerateOptions::response_format`] becomes `response_format` (`json_object` or
//!   `json_schema` with `strict: true`). `response_prefix` and `max_context` are not sent (the
//!   protocol has no equivalent).
//! - With a [`TokenSink`] that wants tokens the call streams (server-sent events) and every
//!   content delta goes to the sink; usage is asked for with `stream_options.include_usage`.
//! - Errors are typed: 429 is [`LlmError::RateLimited`] and 502/503/504
//!   [`LlmError::Unavailable`], both carrying `Retry-After` (seconds, or `retry-after-ms`);
//!   a refused connection is [`LlmError::Connection`]; running past the connect or total
//!   timeout is [`LlmError::Timeout`]; a body that is not the expected JSON is
//!   [`LlmError::MalformedResponse`]; a stream that ends before `[DONE]` or a finish reason
//!   is [`LlmError::StreamInterrupted`]; other statuses are [`LlmError::Http`].
//! - The bearer token comes from the environment variable the [`RemoteConfig`] names
//!   (default `FERROGRAPH_API_KEY`).

use crate::error::LlmError;
use crate::options::{GenerateOptions, ResponseFormat, ToolChoice};
use crate::provider::RemoteConfig;
use crate::sink::TokenSink;
use crate::ChatModel;
use async_trait::async_trait;
use ferrograph_core::message::{Message, Role, TokenUsage, ToolCall};
use futures::StreamExt;
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// A chat model served by an OpenAI-compatible server. Cheap to clone (the HTTP client's
/// connection pool is shared).
#[derive(Clone, Debug)]
pub struct RemoteChatModel {
    config: RemoteConfig,
    endpoint: String,
    client: reqwest::Client,
    /// Set once the server refused `json_schema`: schemas then go as `json_object` with a
    /// `schema` field (llama-cpp-python's form).
    schema_in_json_object: Arc<AtomicBool>,
}

impl RemoteChatModel {
    /// A client for the server `config` describes ([`LlmError::Config`] when it is invalid).
    pub fn new(config: RemoteConfig) -> Result<Self, LlmError> {
        config.validate()?;
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout_duration())
            .timeout(config.total_timeout())
            .build()
            .map_err(|e| LlmError::Config(format!("cannot build the HTTP client: {e}")))?;
        Ok(RemoteChatModel {
            endpoint: config.endpoint(),
            config,
            client,
            schema_in_json_object: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RemoteConfig {
        &self.config
    }

    /// The request body for `messages` and `options` (public for inspection and tests).
    pub fn request_body(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
        stream: bool,
    ) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(self.config.model));
        body.insert(
            "messages".into(),
            Value::Array(messages.iter().map(message_json).collect()),
        );
        body.insert("max_tokens".into(), json!(options.max_tokens));
        body.insert("temperature".into(), json!(options.temperature.max(0.0)));
        if let Some(p) = options.top_p {
            body.insert("top_p".into(), json!(p));
        }
        if let Some(k) = options.top_k {
            body.insert("top_k".into(), json!(k));
        }
        if (options.repetition_penalty - 1.0).abs() > f32::EPSILON {
            body.insert(
                "repetition_penalty".into(),
                json!(options.repetition_penalty),
            );
        }
        if let Some(seed) = options.seed {
            body.insert("seed".into(), json!(seed));
        }
        if !options.stop.is_empty() {
            body.insert("stop".into(), json!(options.stop));
        }
        if !options.tools.is_empty() {
            let tools: Vec<Value> = options
                .tools
                .iter()
                .map(|t| {
                    json!({
                        "type": "function",
                        "function": {
                            "name": t.name,
                            "description": t.description,
                            "parameters": t.parameters.0,
                        }
                    })
                })
                .collect();
            body.insert("tools".into(), Value::Array(tools));
            let choice = match &options.tool_choice {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::Required => json!("required"),
                ToolChoice::None => json!("none"),
                ToolChoice::Named(name) => {
                    json!({"type": "function", "function": {"name": name}})
                }
            };
            body.insert("tool_choice".into(), choice);
        }
        match &options.response_format {
            None => {}
            Some(ResponseFormat::JsonObject) => {
                body.insert("response_format".into(), json!({"type": "json_object"}));
            }
            Some(ResponseFormat::JsonSchema { schema, .. })
                if self.schema_in_json_object.load(Ordering::Relaxed) =>
            {
                body.insert(
                    "response_format".into(),
                    json!({"type": "json_object", "schema": schema}),
                );
            }
            Some(ResponseFormat::JsonSchema { name, schema }) => {
                body.insert(
                    "response_format".into(),
                    json!({
                        "type": "json_schema",
                        "json_schema": {"name": name, "schema": schema, "strict": true}
                    }),
                );
            }
        }
        if stream {
            body.insert("stream".into(), json!(true));
            body.insert("stream_options".into(), json!({"include_usage": true}));
        }
        Value::Object(body)
    }

    fn map_send_error(&self, e: reqwest::Error) -> LlmError {
        if e.is_timeout() {
            LlmError::Timeout(self.config.total_timeout())
        } else if e.is_connect() {
            let timed_out = std::error::Error::source(&e)
                .map(|s| s.to_string().contains("timed out"))
                .unwrap_or(false);
            if timed_out {
                LlmError::Timeout(self.config.connect_timeout_duration())
            } else {
                LlmError::Connection {
                    url: self.endpoint.clone(),
                    message: error_chain(&e),
                }
            }
        } else {
            LlmError::Connection {
                url: self.endpoint.clone(),
                message: error_chain(&e),
            }
        }
    }

    async fn send(&self, body: &Value) -> Result<reqwest::Response, LlmError> {
        let mut req = self.client.post(&self.endpoint).json(body);
        if let Some(token) = self.config.bearer_token() {
            req = req.bearer_auth(token);
        }
        let resp = req.send().await.map_err(|e| self.map_send_error(e))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let retry_after = retry_after(resp.headers());
        let text = resp.text().await.unwrap_or_default();
        let message = error_message(&text);
        Err(match status.as_u16() {
            429 => LlmError::RateLimited {
                message,
                retry_after,
            },
            code @ (502..=504) => LlmError::Unavailable {
                status: code,
                message,
                retry_after,
            },
            408 => LlmError::Timeout(self.config.total_timeout()),
            code => LlmError::Http {
                status: code,
                message,
            },
        })
    }

    async fn complete(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
    ) -> Result<Message, LlmError> {
        let started = Instant::now();
        let body = self.request_body(messages, options, false);
        let resp = self.send(&body).await?;
        let bytes = resp.bytes().await.map_err(|e| self.map_body_error(e))?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| malformed(e, &bytes))?;
        let choice = value
            .get("choices")
            .and_then(|c| c.get(0))
            .ok_or_else(|| malformed("no `choices[0]` in the answer", &bytes))?;
        let message = choice
            .get("message")
            .ok_or_else(|| malformed("no `choices[0].message` in the answer", &bytes))?;
        let content = message
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let mut calls = Vec::new();
        if let Some(list) = message.get("tool_calls").and_then(Value::as_array) {
            for c in list {
                let function = c
                    .get("function")
                    .ok_or_else(|| malformed("a tool call has no `function`", &bytes))?;
                let name = function
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| malformed("a tool call has no function name", &bytes))?;
                let args = match function.get("arguments") {
                    Some(Value::String(s)) => parse_arguments(s),
                    Some(other) => other.clone(),
                    None => json!({}),
                };
                calls.push(tool_call(c.get("id").and_then(Value::as_str), name, args));
            }
        }
        let finish = choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(self.answer(
            content,
            calls,
            finish,
            usage(value.get("usage")),
            value.get("model"),
            started,
            None,
        ))
    }

    fn map_body_error(&self, e: reqwest::Error) -> LlmError {
        if e.is_timeout() {
            LlmError::Timeout(self.config.total_timeout())
        } else {
            LlmError::StreamInterrupted(error_chain(&e))
        }
    }

    async fn stream(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
        sink: &TokenSink,
    ) -> Result<Message, LlmError> {
        let started = Instant::now();
        let body = self.request_body(messages, options, true);
        let resp = self.send(&body).await?;
        let is_sse = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("event-stream"));
        if !is_sse {
            let bytes = resp.bytes().await.map_err(|e| self.map_body_error(e))?;
            return Err(malformed("expected a text/event-stream answer", &bytes));
        }
        let model_name = self.config.model.clone();
        let mut state = StreamState::default();
        let mut buf: Vec<u8> = Vec::new();
        let mut bytes = resp.bytes_stream();
        let mut first_token: Option<Duration> = None;
        'read: while let Some(chunk) = bytes.next().await {
            let chunk = chunk.map_err(|e| self.map_body_error(e))?;
            buf.extend_from_slice(&chunk);
            while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                let line = String::from_utf8_lossy(&line);
                let line = line.trim_end_matches(['\r', '\n']);
                let Some(data) = line.strip_prefix("data:") else {
                    continue; // comments, `event:`, `id:` and blank separators
                };
                let data = data.trim_start();
                if data == "[DONE]" {
                    state.done = true;
                    break 'read;
                }
                let event: Value =
                    serde_json::from_str(data).map_err(|e| malformed(e, data.as_bytes()))?;
                if let Some(err) = event.get("error") {
                    return Err(LlmError::Http {
                        status: err.get("code").and_then(Value::as_u64).unwrap_or(500) as u16,
                        message: error_message(&event.to_string()),
                    });
                }
                if let Some(piece) = state.apply(&event, data)? {
                    if first_token.is_none() {
                        first_token = Some(started.elapsed());
                    }
                    sink.send(&model_name, &piece).await;
                }
            }
        }
        if !state.done && state.finish.is_none() {
            return Err(LlmError::StreamInterrupted(format!(
                "the event stream ended after {} bytes of content without `[DONE]` or a finish reason",
                state.content.len()
            )));
        }
        let calls = state
            .calls
            .into_iter()
            .map(|c| tool_call(c.id.as_deref(), &c.name, parse_arguments(&c.arguments)))
            .collect();
        Ok(self.answer(
            state.content,
            calls,
            state.finish,
            state.usage,
            state.model.as_ref(),
            started,
            first_token,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn answer(
        &self,
        content: String,
        calls: Vec<ToolCall>,
        finish: Option<String>,
        usage: Option<TokenUsage>,
        server_model: Option<&Value>,
        started: Instant,
        first_token: Option<Duration>,
    ) -> Message {
        let mut msg = if calls.is_empty() {
            Message::ai(content)
        } else {
            Message::ai_with_tools(content, calls)
        };
        msg.name = Some(self.config.model.clone());
        msg.usage = usage;
        msg.finish_reason = finish;
        let mut msg = msg
            .with_metadata(
                "model",
                server_model
                    .and_then(Value::as_str)
                    .unwrap_or(&self.config.model)
                    .to_string(),
            )
            .with_metadata("provider", "remote")
            .with_metadata(
                "duration_ms",
                format!("{:.1}", started.elapsed().as_secs_f64() * 1e3),
            );
        if let Some(t) = first_token {
            msg = msg.with_metadata(
                "time_to_first_token_ms",
                format!("{:.1}", t.as_secs_f64() * 1e3),
            );
        }
        msg
    }
}

#[async_trait]
impl ChatModel for RemoteChatModel {
    fn model_name(&self) -> String {
        self.config.model.clone()
    }

    async fn invoke(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
        sink: Option<TokenSink>,
    ) -> Result<Message, LlmError> {
        options.validate()?;
        let span = tracing::info_span!(
            target: "ferrograph::trace",
            "ferrograph.model",
            model = %self.config.model,
            provider = "remote",
            url = %self.endpoint,
            messages = messages.len(),
        );
        async {
            let sink = sink.filter(|s| s.wants_tokens(&self.config.model));
            let result = match &sink {
                Some(sink) => self.stream(messages, options, sink).await,
                None => self.complete(messages, options).await,
            };
            match result {
                // Servers that predate `json_schema` (llama-cpp-python) refuse it; they take
                // the schema inside a `json_object` format instead. Switch once, for good.
                // llama-cpp-python 0.3.36 answers its request validation error with a 500
                // that names both; other servers use 400 or 422.
                Err(LlmError::Http { status, ref message })
                    if (status == 400
                        || status == 422
                        || (status == 500 && message.contains("json_schema")))
                        && message.contains("response_format")
                        && matches!(options.response_format, Some(ResponseFormat::JsonSchema { .. }))
                        && !self.schema_in_json_object.swap(true, Ordering::Relaxed) =>
                {
                    tracing::info!(url = %self.endpoint, "server refused `json_schema`; sending the schema in a `json_object` response format");
                    match &sink {
                        Some(sink) => self.stream(messages, options, sink).await,
                        None => self.complete(messages, options).await,
                    }
                }
                other => other,
            }
        }
        .instrument(span)
        .await
    }
}

/// One tool call being assembled from stream deltas.
#[derive(Default, Debug)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

#[derive(Default, Debug)]
struct StreamState {
    content: String,
    calls: Vec<PartialCall>,
    finish: Option<String>,
    usage: Option<TokenUsage>,
    model: Option<Value>,
    done: bool,
}

impl StreamState {
    /// Folds one chunk in; returns the content delta to stream, if any.
    fn apply(&mut self, event: &Value, raw: &str) -> Result<Option<String>, LlmError> {
        if let Some(m) = event.get("model") {
            self.model = Some(m.clone());
        }
        if let Some(u) = usage(event.get("usage")) {
            self.usage = Some(u);
        }
        let Some(choices) = event.get("choices").and_then(Value::as_array) else {
            return Ok(None);
        };
        let Some(choice) = choices.first() else {
            return Ok(None);
        };
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_string());
        }
        let Some(delta) = choice.get("delta") else {
            return Ok(None);
        };
        if let Some(list) = delta.get("tool_calls").and_then(Value::as_array) {
            for c in list {
                let index = c
                    .get("index")
                    .and_then(Value::as_u64)
                    .map(|i| i as usize)
                    .unwrap_or(self.calls.len().saturating_sub(1));
                if index > 1024 {
                    return Err(malformed("tool call index out of range", raw.as_bytes()));
                }
                while self.calls.len() <= index {
                    self.calls.push(PartialCall::default());
                }
                let call = &mut self.calls[index];
                if let Some(id) = c.get("id").and_then(Value::as_str) {
                    call.id = Some(id.to_string());
                }
                if let Some(f) = c.get("function") {
                    if let Some(n) = f.get("name").and_then(Value::as_str) {
                        call.name.push_str(n);
                    }
                    match f.get("arguments") {
                        Some(Value::String(a)) => call.arguments.push_str(a),
                        Some(Value::Null) | None => {}
                        Some(other) => call.arguments.push_str(&other.to_string()),
                    }
                }
            }
        }
        match delta.get("content").and_then(Value::as_str) {
            Some(piece) if !piece.is_empty() => {
                self.content.push_str(piece);
                Ok(Some(piece.to_string()))
            }
            _ => Ok(None),
        }
    }
}

fn tool_call(id: Option<&str>, name: &str, args: Value) -> ToolCall {
    let mut call = ToolCall::new(name, args);
    if let Some(id) = id.filter(|i| !i.is_empty()) {
        call.id = id.to_string();
    }
    call
}

/// Arguments as JSON; text that is not JSON is kept as a string (the tool then reports the
/// bad arguments to the model).
fn parse_arguments(s: &str) -> Value {
    if s.trim().is_empty() {
        return json!({});
    }
    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.to_string()))
}

fn message_json(m: &Message) -> Value {
    match m.role {
        Role::System => json!({"role": "system", "content": m.content}),
        Role::Human => json!({"role": "user", "content": m.content}),
        Role::Ai => {
            if m.tool_calls.is_empty() {
                json!({"role": "assistant", "content": m.content})
            } else {
                let calls: Vec<Value> = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        json!({
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.args.0.to_string()},
                        })
                    })
                    .collect();
                // A string even when empty: OpenAI also takes null, but llama-cpp-python's
                // request validation requires a string.
                json!({"role": "assistant", "content": m.content, "tool_calls": calls})
            }
        }
        Role::Tool => {
            let mut v = json!({
                "role": "tool",
                "content": m.content,
                "tool_call_id": m.tool_call_id.clone().unwrap_or_default(),
            });
            if let Some(name) = &m.name {
                v["name"] = json!(name);
            }
            v
        }
    }
}

fn usage(v: Option<&Value>) -> Option<TokenUsage> {
    let v = v.filter(|v| v.is_object())?;
    let n = |key: &str| v.get(key).and_then(Value::as_u64).unwrap_or(0) as u32;
    Some(TokenUsage {
        prompt_tokens: n("prompt_tokens"),
        completion_tokens: n("completion_tokens"),
        cached_prompt_tokens: v
            .get("prompt_tokens_details")
            .and_then(|d| d.get("cached_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(0) as u32,
    })
}

/// `Retry-After` (seconds) or `retry-after-ms`.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            // A server's header must not be able to panic us (`Duration` overflows past
            // ~5.8e11 years): capped at a day, like `retry-after`.
            return Some(Duration::from_secs_f64((ms / 1e3).min(86_400.0)));
        }
    }
    let secs = get("retry-after")?.parse::<f64>().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)))
}

/// The server's error message: `error.message`, `detail`, or the body itself (cut).
fn error_message(body: &str) -> String {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        let msg = v
            .get("error")
            .and_then(|e| e.get("message").or(Some(e)))
            .or_else(|| v.get("detail"))
            .or_else(|| v.get("message"));
        if let Some(m) = msg {
            return match m {
                Value::String(s) => cut(s),
                other => cut(&other.to_string()),
            };
        }
    }
    cut(body)
}

fn cut(s: &str) -> String {
    const MAX: usize = 500;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(MAX).collect();
        out.push('…');
        out
    }
}

fn malformed(message: impl std::fmt::Display, body: &[u8]) -> LlmError {
    LlmError::MalformedResponse {
        message: message.to_string(),
        body: cut(&String::from_utf8_lossy(body)),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
