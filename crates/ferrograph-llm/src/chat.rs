//! The [`ChatModel`] trait, the local GGUF implementation and structured output.

use crate::actor::{load_model, ModelHandle, PromptInput};
use crate::error::LlmError;
use crate::options::{GenerateOptions, LoadOptions};
use crate::sink::TokenSink;
use async_trait::async_trait;
use ferrograph_core::message::{Message, TokenUsage};
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

    /// This model answering with values of `T`, parsed and checked against `T`'s JSON schema.
    fn with_structured_output<T: JsonSchema + DeserializeOwned>(self) -> StructuredModel<Self, T>
    where
        Self: Sized,
    {
        StructuredModel {
            model: self,
            _t: PhantomData,
        }
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
        let input = PromptInput::Chat {
            messages: messages.to_vec(),
            tools: None,
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
        let mut msg = Message::ai(format!("{prefix}{}", generation.text));
        msg.name = Some(name.clone());
        msg.usage = Some(TokenUsage {
            prompt_tokens: generation.prompt_tokens as u32,
            completion_tokens: generation.tokens.len() as u32,
            cached_prompt_tokens: generation.cached_prompt_tokens as u32,
        });
        msg.finish_reason = Some(generation.finish_reason.as_str().to_string());
        Ok(msg.with_metadata("model", name).with_metadata(
            "time_to_first_token_ms",
            format!("{:.1}", generation.time_to_first_token.as_secs_f64() * 1e3),
        ))
    }
}

/// A chat model whose answers are values of `T` (see [`ChatModel::with_structured_output`]).
///
/// This is *prompted* structured output: the schema goes into the system prompt, the answer is
/// started with `{` (or `[`), and the output is parsed and validated against `T`; a mismatch is
/// [`LlmError::Schema`]. Generation is not constrained token by token.
pub struct StructuredModel<M, T> {
    model: M,
    _t: PhantomData<fn() -> T>,
}

impl<M: ChatModel, T: JsonSchema + DeserializeOwned> StructuredModel<M, T> {
    /// The JSON schema of `T`.
    pub fn schema(&self) -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(T)).unwrap_or(serde_json::Value::Null)
    }

    /// Asks for a `T`.
    pub async fn invoke(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
    ) -> Result<T, LlmError> {
        let schema = self.schema();
        let is_array = schema.get("type").and_then(|t| t.as_str()) == Some("array");
        let instruction = format!(
            "Answer with one JSON {} that matches this JSON Schema, and nothing else:\n{}",
            if is_array { "array" } else { "object" },
            serde_json::to_string(&schema).unwrap_or_default()
        );
        let mut msgs = Vec::with_capacity(messages.len() + 1);
        match messages.first() {
            Some(m) if m.role == ferrograph_core::message::Role::System => {
                let mut m = m.clone();
                m.content = format!("{}\n\n{instruction}", m.content);
                msgs.push(m);
                msgs.extend_from_slice(&messages[1..]);
            }
            _ => {
                msgs.push(Message::system(instruction));
                msgs.extend_from_slice(messages);
            }
        }
        let mut opts = options.clone();
        opts.response_prefix = Some(if is_array { "[" } else { "{" }.to_string());
        let answer = self.model.invoke(&msgs, &opts, None).await?;
        parse_structured(&answer.content)
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
