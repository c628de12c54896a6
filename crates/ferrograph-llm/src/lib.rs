//! On-device LLM inference for ferrograph.
//!
//! - [`ChatModel`]: messages in, one AI message out (with usage and finish reason), tokens
//!   streamed through a [`TokenSink`] — for example the node's event sink, so they reach the
//!   run's *tokens* stream ([`TokenSink::from_context`]).
//! - [`LocalChatModel`]: a GGUF model run by candle's quantized models, chosen by
//!   `general.architecture` (see [`SUPPORTED_ARCHITECTURES`]), with its tokenizer built from
//!   the GGUF metadata and its chat template rendered by minijinja. Each loaded model lives in
//!   one model actor ([`ModelHandle`]) that decodes concurrent requests together (continuous
//!   batching: one forward pass per step for all of them, [`LoadOptions::max_batch`]) and
//!   gives free batch places to callers round-robin ([`GenerateOptions::user`]); models are
//!   loaded lazily, once per process, with a progress bar on a terminal ([`progress`]).
//! - Sampling: greedy, temperature, top-k, top-p, repetition penalty, seed, stop strings, max
//!   tokens, `max_context` ([`GenerateOptions`]). Prompt prefixes (a shared system prompt, the
//!   previous turn) are reused across calls from KV snapshots.
//! - Constrained decoding ([`constrain`], llguidance over a toktrie token trie built from the
//!   model's vocabulary): [`ChatModel::with_structured_output`] asks for a type's JSON schema
//!   as `response_format` and the local model can only produce JSON of that schema;
//!   [`ChatModel::bind_tools`] (or the options' `tools` and `tool_choice`) holds the output to
//!   calls of the bound tools ([`tool_calls`]), returned as the message's `tool_calls`.
//! - [`manifest`] (from `ferrograph-models`): `models/models.toml`, listing, verifying and
//!   fetching models.
//! - The contract ([`ChatModel`], options, retry, fallback, structured output) is
//!   `ferrograph-chat`'s, re-exported; the CPU kernels are `ferrograph-kernels`'.
//!
//! Build for the host CPU (`RUSTFLAGS="-C target-cpu=native"`): candle's CPU kernels are
//! several times slower without it.

pub mod actor;
pub mod constrain;
pub mod engine;
pub mod local;
pub mod options;
pub mod progress;
pub mod prompt;
pub mod provider;
#[cfg(feature = "remote")]
pub mod remote;
pub mod sampling;
mod sequence;
pub mod template;
mod text;
pub mod tokenizer;
pub mod tool_calls;

// The chat contract, re-exported so that code using the engine needs one import path.
pub use ferrograph_chat::{
    error, fallback, invoke_all, parallel, parse_structured, retry, run_with_retry, schema_hint,
    sink, ChatModel, ChatModelExt, FallbackModel, GenerateOptions, LlmError, ResponseFormat,
    RetryModel, RetryPolicy, StructuredModel, TokenSink, ToolBoundModel, ToolChoice,
};
pub use ferrograph_models::{manifest, DeviceKind};

pub use actor::{load_model, ModelHandle, PromptInput};
pub use constrain::{ConstraintStats, GrammarSpec};
pub use engine::{
    BatchStats, Engine, FinishReason, Generation, ModelInfo, SUPPORTED_ARCHITECTURES,
};
pub use local::LocalChatModel;
pub use options::LoadOptions;
pub use prompt::{ChatPrompt, PromptError, PromptTemplate};
pub use provider::{chat_model_from_config, chat_model_from_env, Provider, RemoteConfig};
#[cfg(feature = "remote")]
pub use remote::RemoteChatModel;
pub use template::ChatTemplate;
