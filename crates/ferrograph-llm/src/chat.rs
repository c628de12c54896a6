//! The [`ChatModel`] trait, the local GGUF implementation and structured output.

use crate::actor::{load_model, ModelHandle, PromptInput};
use crate::error::LlmError;
use crate::options::{GenerateOptions, LoadOptions, ResponseFormat, ToolChoice};
use crate::sink::TokenSink;
use async_trait::async_trait;
use ferrograph_core::message::{Message, TokenUsage, ToolSpec};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::OnceCell;

/// A chat model: messages in, one AI message out, tokens streamed on the way.
#[async_trait]
pub trait ChatModel: Send + Sync {
    /// Name reported in token events and on the answer.
    fn model_name(&self) -> String;

    /// Generates the next AI message for `messages`. The answer carries token usage and the
    /// finish reason (`stop` or `length`); its text pieces go to `sink` as they are generated
    /// and concatenate to the answer's content.
    async fn invoke(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
        sink: Option<TokenSink>,
    ) -> Result<Message, LlmError>;

    /// This model answering with values of `T`: the call asks for `T`'s JSON schema as its
    /// `response_format` (local models enforce it by constrained decoding) and the answer is
    /// parsed into `T`.
    fn with_structured_output<T: JsonSchema + DeserializeOwned>(self) -> StructuredModel<Self, T>
    where
        Self: Sized,
    {
        StructuredModel {
            model: self,
            _t: PhantomData,
        }
    }

    /// This model with `tools` bound: every call offers them (as the options' `tools`, with
    /// `tool_choice` `Auto` unless set with [`ToolBoundModel::tool_choice`]), and answers
    /// that call tools carry them as the message's `tool_calls` with finish reason
    /// `tool_calls`. Options that already name tools keep theirs.
    fn bind_tools(self, tools: Vec<ToolSpec>) -> ToolBoundModel<Self>
    where
        Self: Sized,
    {
        ToolBoundModel {
            model: self,
            tools,
            choice: ToolChoice::Auto,
        }
    }
}

/// A chat model with tools bound (see [`ChatModel::bind_tools`]).
#[derive(Clone, Debug)]
pub struct ToolBoundModel<M> {
    model: M,
    tools: Vec<ToolSpec>,
    choice: ToolChoice,
}

impl<M> ToolBoundModel<M> {
    /// Sets whether and which tool the model must call.
    #[must_use]
    pub fn tool_choice(mut self, choice: ToolChoice) -> Self {
        self.choice = choice;
        self
    }

    /// The bound tools.
    pub fn tools(&self) -> &[ToolSpec] {
        &self.tools
    }

    /// The model underneath.
    pub fn inner(&self) -> &M {
        &self.model
    }
}

#[async_trait]
impl<M: ChatModel> ChatModel for ToolBoundModel<M> {
    fn model_name(&self) -> String {
        self.model.model_name()
    }

    async fn invoke(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
        sink: Option<TokenSink>,
    ) -> Result<Message, LlmError> {
        if !options.tools.is_empty() {
            return self.model.invoke(messages, options, sink).await;
        }
        let mut opts = options.clone();
        opts.tools = self.tools.clone();
        opts.tool_choice = self.choice.clone();
        self.model.invoke(messages, &opts, sink).await
    }
}

#[async_trait]
impl<M: ChatModel + ?Sized> ChatModel for Arc<M> {
    fn model_name(&self) -> String {
        (**self).model_name()
    }

    async fn invoke(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
        sink: Option<TokenSink>,
    ) -> Result<Message, LlmError> {
        (**self).invoke(messages, options, sink).await
    }
}

struct LocalInner {
    path: PathBuf,
    load: LoadOptions,
    handle: OnceCell<ModelHandle>,
}

/// A GGUF model on this machine, run by candle in a model actor. Cheap to clone; the model is
/// loaded lazily on the first call, once per process.
#[derive(Clone)]
pub struct LocalChatModel {
    inner: Arc<LocalInner>,
}

impl std::fmt::Debug for LocalChatModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalChatModel")
            .field("path", &self.inner.path)
            .finish()
    }
}

impl LocalChatModel {
    /// The model at `path` (a GGUF file), with default load options.
    pub fn new(path: impl AsRef<Path>) -> Self {
        Self::with_options(path, LoadOptions::default())
    }

    /// The model at `path` with `load` options.
    pub fn with_options(path: impl AsRef<Path>, load: LoadOptions) -> Self {
        LocalChatModel {
            inner: Arc::new(LocalInner {
                path: path.as_ref().to_path_buf(),
                load,
                handle: OnceCell::new(),
            }),
        }
    }

    /// The default chat model: `FERROGRAPH_MODEL` or the manifest's SmolLM2, on the device
    /// named by `FERROGRAPH_DEVICE`.
    pub fn from_env() -> Result<Self, LlmError> {
        let path = crate::manifest::default_chat_model_path()?;
        let load = LoadOptions {
            device: crate::options::DeviceKind::from_env()?,
            ..LoadOptions::default()
        };
        Ok(Self::with_options(path, load))
    }

    /// The model file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The model actor, loading the model if needed.
    pub async fn handle(&self) -> Result<&ModelHandle, LlmError> {
        self.inner
            .handle
            .get_or_try_init(|| load_model(&self.inner.path, &self.inner.load))
            .await
    }
}

#[async_trait]
impl ChatModel for LocalChatModel {
    fn model_name(&self) -> String {
        self.inner
            .handle
            .get()
            .map(|h| h.info().name.clone())
            .or_else(|| {
                self.inner
                    .path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
            })
            .unwrap_or_default()
    }

    async fn invoke(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
        sink: Option<TokenSink>,
    ) -> Result<Message, LlmError> {
        let handle = self.handle().await?;
        let name = handle.info().name.clone();
        let prefix = options.response_prefix.clone().unwrap_or_default();
        let offered = crate::tool_calls::offered_tools(options)?;
        let tools = (!offered.is_empty()).then(|| crate::tool_calls::template_tools(&offered));
        let input = PromptInput::Chat {
            messages: messages.to_vec(),
            tools,
            assistant_prefix: prefix.clone(),
        };
        let sink = sink.filter(|s| s.wants_tokens(&name));
        let (tx, mut rx) = match sink {
            Some(_) => {
                let (tx, rx) = tokio::sync::mpsc::channel::<String>(64);
                (Some(tx), Some(rx))
            }
            None => (None, None),
        };
        let forward = async {
            if let (Some(rx), Some(sink)) = (rx.as_mut(), sink.as_ref()) {
                while let Some(piece) = rx.recv().await {
                    sink.send(&name, &piece).await;
                }
            }
        };
        let (result, ()) = tokio::join!(handle.generate(input, options.clone(), tx), forward);
        let generation = result?;
        let text = format!("{prefix}{}", generation.text);
        let (content, calls) = if offered.is_empty() {
            (text, Vec::new())
        } else {
            let complete = if generation.finish_reason == crate::engine::FinishReason::Length {
                crate::tool_calls::drop_unfinished_call(&text)
            } else {
                &text
            };
            let (content, calls) = crate::tool_calls::parse_tool_calls(complete)?;
            crate::tool_calls::check_calls(&calls, options)?;
            (content, calls)
        };
        let called = !calls.is_empty();
        let mut msg = Message::ai(content);
        msg.tool_calls = calls;
        msg.name = Some(name.clone());
        msg.usage = Some(TokenUsage {
            prompt_tokens: generation.prompt_tokens as u32,
            completion_tokens: generation.tokens.len() as u32,
            cached_prompt_tokens: generation.cached_prompt_tokens as u32,
        });
        msg.finish_reason = Some(if called {
            "tool_calls".to_string()
        } else {
            generation.finish_reason.as_str().to_string()
        });
        let mut msg = msg.with_metadata("model", name).with_metadata(
            "time_to_first_token_ms",
            format!("{:.1}", generation.time_to_first_token.as_secs_f64() * 1e3),
        );
        if let Some(c) = generation.constraint {
            msg = msg.with_metadata(
                "constraint_ms",
                format!("{:.2}", (c.time + c.compile_time).as_secs_f64() * 1e3),
            );
        }
        Ok(msg)
    }
}

/// A chat model whose answers are values of `T` (see [`ChatModel::with_structured_output`]).
///
/// Each call sets the options' `response_format` to `T`'s JSON schema: local models decode
/// under that schema's grammar, so the answer is valid JSON of the schema by construction
/// (unless it runs out of `max_tokens`); remote models get it as the request's
/// `response_format`. A short sketch of the expected shape is added to the system prompt (it
/// helps small models choose sensible values), and the answer is parsed into `T`; a mismatch
/// is [`LlmError::Schema`].
pub struct StructuredModel<M, T> {
    model: M,
    _t: PhantomData<fn() -> T>,
}

impl<M: ChatModel, T: JsonSchema + DeserializeOwned> StructuredModel<M, T> {
    /// The JSON schema of `T`.
    pub fn schema(&self) -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(T)).unwrap_or(serde_json::Value::Null)
    }

    /// The model underneath.
    pub fn inner(&self) -> &M {
        &self.model
    }

    /// The messages and options of a call asking for a `T`.
    pub fn request(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
    ) -> (Vec<Message>, GenerateOptions) {
        let schema = self.schema();
        let instruction = format!(
            "Answer with JSON of this shape: {}",
            schema_hint(&schema, &schema, 0)
        );
        let mut msgs = Vec::with_capacity(messages.len() + 1);
        match messages.first() {
            Some(m) if m.role == ferrograph_core::message::Role::System => {
                let mut m = m.clone();
                m.content = format!("{}\n{instruction}", m.content);
                msgs.push(m);
                msgs.extend_from_slice(&messages[1..]);
            }
            _ => {
                msgs.push(Message::system(instruction));
                msgs.extend_from_slice(messages);
            }
        }
        let name = schema
            .get("title")
            .and_then(|t| t.as_str())
            .unwrap_or("answer")
            .to_string();
        let mut opts = options.clone();
        opts.response_format = Some(ResponseFormat::JsonSchema { name, schema });
        opts.response_prefix = None;
        (msgs, opts)
    }

    /// Asks for a `T`.
    pub async fn invoke(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
    ) -> Result<T, LlmError> {
        let (msgs, opts) = self.request(messages, options);
        let answer = self.model.invoke(&msgs, &opts, None).await?;
        match serde_json::from_str::<T>(answer.content.trim()) {
            Ok(v) => Ok(v),
            Err(e) if answer.finish_reason.as_deref() == Some("length") => Err(LlmError::Schema {
                message: format!("the answer was cut off at max_tokens: {e}"),
                output: answer.content,
            }),
            Err(_) => parse_structured(&answer.content),
        }
    }
}

/// A compact sketch of the JSON a schema describes, for prompts: `{"name": string, "tags":
/// [string], "kind": "a" | "b"}`. Local `$ref`s are followed (a few levels deep).
pub fn schema_hint(schema: &serde_json::Value, root: &serde_json::Value, depth: usize) -> String {
    use serde_json::Value;
    if depth > 4 {
        return "...".into();
    }
    let Some(obj) = schema.as_object() else {
        return "any".into();
    };
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        let target = r
            .strip_prefix('#')
            .and_then(|p| root.pointer(p))
            .unwrap_or(&Value::Null);
        return schema_hint(target, root, depth + 1);
    }
    if let Some(Value::Array(vals)) = obj.get("enum") {
        return vals
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(" | ");
    }
    if let Some(c) = obj.get("const") {
        return c.to_string();
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(alts)) = obj.get(key) {
            let parts: Vec<String> = alts
                .iter()
                .map(|a| schema_hint(a, root, depth + 1))
                .collect();
            return parts.join(" | ");
        }
    }
    let types: Vec<&str> = match obj.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ if obj.contains_key("properties") => vec!["object"],
        _ => vec![],
    };
    let mut parts = Vec::new();
    for t in &types {
        parts.push(match *t {
            "object" => {
                let props = obj.get("properties").and_then(Value::as_object);
                let fields: Vec<String> = props
                    .map(|p| {
                        p.iter()
                            .map(|(k, v)| format!("\"{k}\": {}", schema_hint(v, root, depth + 1)))
                            .collect()
                    })
                    .unwrap_or_default();
                format!("{{{}}}", fields.join(", "))
            }
            "array" => format!(
                "[{}]",
                obj.get("items")
                    .map(|i| schema_hint(i, root, depth + 1))
                    .unwrap_or_else(|| "any".into())
            ),
            "integer" | "number" => {
                let min = obj
                    .get("minimum")
                    .map(|v| v.to_string())
                    .unwrap_or_default();
                let max = obj
                    .get("maximum")
                    .map(|v| v.to_string())
                    .unwrap_or_default();
                if min.is_empty() && max.is_empty() {
                    (*t).to_string()
                } else {
                    format!("{t} {min}..{max}")
                }
            }
            other => other.to_string(),
        });
    }
    if parts.is_empty() {
        "any".into()
    } else {
        parts.join(" | ")
    }
}

/// Parses the first JSON value in `text` as a `T`; [`LlmError::Schema`] when there is none or
/// it does not match.
pub fn parse_structured<T: DeserializeOwned>(text: &str) -> Result<T, LlmError> {
    let json = first_json_value(text).ok_or_else(|| LlmError::Schema {
        message: "no complete JSON value in the output".into(),
        output: text.to_string(),
    })?;
    serde_json::from_str(json).map_err(|e| LlmError::Schema {
        message: e.to_string(),
        output: text.to_string(),
    })
}

/// The first balanced `{...}` or `[...]` in `text` (string-aware).
fn first_json_value(text: &str) -> Option<&str> {
    let start = text.find(['{', '['])?;
    let mut depth = 0usize;
    let mut in_str = false;
    let mut escaped = false;
    for (i, c) in text[start..].char_indices() {
        if in_str {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(&text[start..start + i + c.len_utf8()]);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, schemars::JsonSchema, Debug, PartialEq)]
    struct City {
        name: String,
        population: u64,
    }

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    enum Color {
        Red,
        Green,
    }

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Item {
        color: Color,
        tags: Vec<String>,
        count: Option<u8>,
    }

    #[test]
    fn schema_hint_sketches_shape() {
        let schema = serde_json::to_value(schemars::schema_for!(Item)).unwrap_or_default();
        let hint = schema_hint(&schema, &schema, 0);
        assert_eq!(
            hint,
            "{\"color\": \"Red\" | \"Green\", \"tags\": [string], \"count\": integer 0..255 | null}"
        );
    }

    #[test]
    fn parses_first_json_value() {
        let c: City =
            parse_structured("sure: {\"name\": \"Paris {x}\", \"population\": 2} trailing")
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.name, "Paris {x}");
        assert!(matches!(
            parse_structured::<City>("{\"name\": 3}"),
            Err(LlmError::Schema { .. })
        ));
        assert!(matches!(
            parse_structured::<City>("no json"),
            Err(LlmError::Schema { .. })
        ));
    }
}
