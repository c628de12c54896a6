//! [`LocalChatModel`]: a GGUF model on this machine behind the [`ChatModel`] contract.

use crate::actor::{load_model, ModelHandle, PromptInput};
use crate::error::LlmError;
use crate::options::{GenerateOptions, LoadOptions};
use crate::sink::TokenSink;
use crate::ChatModel;
use async_trait::async_trait;
use ferrograph_core::message::{Message, TokenUsage};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::OnceCell;
use tracing::Instrument as _;

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
        // One span per model call, under the node that makes it (see the runtime's run,
        // superstep and node spans); the token counts are recorded when it answers.
        let span = tracing::info_span!(
            target: "ferrograph::trace",
            "ferrograph.model",
            model = %self.model_name(),
            provider = "local",
            messages = messages.len(),
            prompt_tokens = tracing::field::Empty,
            completion_tokens = tracing::field::Empty,
            cached_prompt_tokens = tracing::field::Empty,
            finish_reason = tracing::field::Empty,
        );
        let answer = self
            .generate_message(messages, options, sink)
            .instrument(span.clone())
            .await;
        if let Ok(msg) = &answer {
            if let Some(u) = &msg.usage {
                span.record("prompt_tokens", u.prompt_tokens);
                span.record("completion_tokens", u.completion_tokens);
                span.record("cached_prompt_tokens", u.cached_prompt_tokens);
            }
            if let Some(f) = &msg.finish_reason {
                span.record("finish_reason", f.as_str());
            }
        }
        answer
    }
}

impl LocalChatModel {
    /// [`ChatModel::invoke`]'s work, inside its span.
    async fn generate_message(
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
