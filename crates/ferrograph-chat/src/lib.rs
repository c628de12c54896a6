//! The chat contract of ferrograph: what a workflow needs to talk to a model, and nothing that
//! runs one. No candle, no grammar engine, no tokenizer, no template engine: a workflow that
//! depends on this crate alone compiles in seconds and works with any implementation — the
//! local engine (`ferrograph-llm`'s `LocalChatModel`), the OpenAI-compatible remote adapter,
//! or a scripted model in tests.
//!
//! - [`ChatModel`]: messages in, one AI message out (with usage and finish reason), tokens
//!   streamed through a [`TokenSink`] — for example the node's event sink, so they reach the
//!   run's *tokens* stream ([`TokenSink::from_context`]).
//! - [`GenerateOptions`], [`ResponseFormat`], [`ToolChoice`]: what one call asks for.
//! - [`ChatModel::with_structured_output`] ([`StructuredModel`], [`parse_structured`]) and
//!   [`ChatModel::bind_tools`] ([`ToolBoundModel`]).
//! - Combinators: [`RetryModel`] (a [`RetryPolicy`] with backoff and `Retry-After`),
//!   [`FallbackModel`] ([`ChatModelExt::with_fallbacks`]), [`invoke_all`] and
//!   [`parallel!`] for concurrent sub-calls.
//! - [`agent::AgentLlm`]: an agent's structured, text and tool calls with retry and fallback,
//!   each recorded as an [`agent::LlmCall`].
//! - [`LlmError`]: every way a model call fails, with [`LlmError::is_retryable`].
//! - With the `testing` feature, `testing::ScriptedModel`: a model answering from a script,
//!   for tests of the logic around a model.

pub mod agent;
pub mod error;
pub mod fallback;
pub mod model;
pub mod options;
pub mod parallel;
pub mod retry;
pub mod sink;
#[cfg(feature = "testing")]
pub mod testing;

pub use error::LlmError;
pub use fallback::{default_fallback_on, ChatModelExt, FallbackModel};
pub use model::{parse_structured, schema_hint, ChatModel, StructuredModel, ToolBoundModel};
pub use options::{GenerateOptions, ResponseFormat, ToolChoice};
pub use parallel::invoke_all;
pub use retry::{run_with_retry, RetryModel, RetryPolicy};
pub use sink::TokenSink;

#[doc(hidden)]
pub mod __private {
    pub use futures;
}
