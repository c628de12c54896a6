//! What one generation asks for: [`GenerateOptions`], [`ResponseFormat`], [`ToolChoice`].

use ferrograph_core::message::ToolSpec;
use serde::{Deserialize, Serialize};

/// How one generation samples and when it stops.
///
/// The default is greedy decoding of at most 256 tokens within a 2,048-token context.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling temperature; `0.0` (or less) means greedy decoding.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens before sampling.
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability adds up to `p` (nucleus sampling).
    pub top_p: Option<f32>,
    /// Penalty for tokens seen in the last `repeat_last_n` tokens (`1.0` disables it).
    pub repetition_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    pub repeat_last_n: usize,
    /// Repetition guard: a sampled token may not complete an n-gram of this many tokens that
    /// the answer already contains (`None`: off). It works under a grammar constraint: it
    /// only acts where the grammar leaves a free choice (more than a handful of allowed
    /// tokens), never bans every allowed token, and never touches tokens the grammar forces.
    /// Local models only.
    pub no_repeat_ngram: Option<usize>,
    /// Seed of the sampler: the same seed and input give the same output. `None` draws one.
    pub seed: Option<u64>,
    /// Generation stops before the first occurrence of any of these strings (which is not part
    /// of the output).
    pub stop: Vec<String>,
    /// Most tokens (prompt plus output) the call may use. Caches are sized by what is used,
    /// never by the model's full context window.
    pub max_context: usize,
    /// Text that begins the answer: it is appended to the prompt after the opened assistant
    /// turn, generation continues it, and it is part of the returned text (not streamed).
    pub response_prefix: Option<String>,
    /// Shape the answer must have: free text (`None`), any JSON object, or JSON matching a
    /// schema. Local models enforce it by constrained decoding; remote models get it as the
    /// request's `response_format`.
    pub response_format: Option<ResponseFormat>,
    /// Tools the model may call. A model answering with calls returns them as the AI
    /// message's `tool_calls`.
    pub tools: Vec<ToolSpec>,
    /// Whether and which tool the model must call (only meaningful with `tools`).
    pub tool_choice: ToolChoice,
    /// Whether one answer may call several tools (OpenAI's `parallel_tool_calls`, default
    /// true). Small models tend to repeat a call until `max_tokens`; `false` ends the answer
    /// after the first call.
    pub parallel_tool_calls: bool,
    /// Who the request is for (OpenAI's `user`). A local model's actor serves waiting
    /// requests round-robin between users, so one busy caller cannot starve the others; when
    /// unset, each calling tokio task (or thread) counts as its own user.
    pub user: Option<String>,
}

/// The shape of a structured answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
// Exhaustive on purpose: every implementation of the contract must handle each variant.
pub enum ResponseFormat {
    /// Any JSON object.
    JsonObject,
    /// A JSON value matching `schema`.
    JsonSchema {
        /// Name of the schema (sent to remote servers; informative locally).
        name: String,
        /// The JSON Schema.
        schema: serde_json::Value,
    },
}

/// Whether a model bound to tools must call one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
// Exhaustive on purpose, like `ResponseFormat`.
pub enum ToolChoice {
    /// The model decides between answering in text and calling tools (the default).
    #[default]
    Auto,
    /// The model must call at least one tool.
    Required,
    /// The model must not call tools.
    None,
    /// The model must call the named tool.
    Named(String),
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            temperature: 0.0,
            top_k: None,
            top_p: None,
            repetition_penalty: 1.0,
            repeat_last_n: 64,
            no_repeat_ngram: None,
            seed: None,
            stop: Vec::new(),
            max_context: 2048,
            response_prefix: None,
            response_format: None,
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            user: None,
        }
    }
}

impl GenerateOptions {
    /// Greedy decoding (the default).
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Sampling at `temperature` with `seed`.
    pub fn sampled(temperature: f32, seed: u64) -> Self {
        GenerateOptions {
            temperature,
            seed: Some(seed),
            ..Self::default()
        }
    }

    /// Sets the repetition guard (see [`GenerateOptions::no_repeat_ngram`]).
    #[must_use]
    pub fn no_repeat_ngram(mut self, n: usize) -> Self {
        self.no_repeat_ngram = Some(n);
        self
    }

    /// Sets the token limit.
    #[must_use]
    pub fn max_tokens(mut self, n: usize) -> Self {
        self.max_tokens = n;
        self
    }

    /// Sets the temperature.
    #[must_use]
    pub fn temperature(mut self, t: f32) -> Self {
        self.temperature = t;
        self
    }

    /// Sets top-k.
    #[must_use]
    pub fn top_k(mut self, k: usize) -> Self {
        self.top_k = Some(k);
        self
    }

    /// Sets top-p.
    #[must_use]
    pub fn top_p(mut self, p: f32) -> Self {
        self.top_p = Some(p);
        self
    }

    /// Sets the repetition penalty.
    #[must_use]
    pub fn repetition_penalty(mut self, penalty: f32) -> Self {
        self.repetition_penalty = penalty;
        self
    }

    /// Sets the seed.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Adds a stop string.
    #[must_use]
    pub fn stop(mut self, s: impl Into<String>) -> Self {
        self.stop.push(s.into());
        self
    }

    /// Sets the context limit.
    #[must_use]
    pub fn max_context(mut self, n: usize) -> Self {
        self.max_context = n;
        self
    }

    /// Asks for an answer of this shape (see [`ResponseFormat`]).
    #[must_use]
    pub fn response_format(mut self, format: ResponseFormat) -> Self {
        self.response_format = Some(format);
        self
    }

    /// Asks for JSON matching `schema` (a [`ResponseFormat::JsonSchema`] named `name`).
    #[must_use]
    pub fn json_schema(self, name: impl Into<String>, schema: serde_json::Value) -> Self {
        self.response_format(ResponseFormat::JsonSchema {
            name: name.into(),
            schema,
        })
    }

    /// Binds tools the model may call.
    #[must_use]
    pub fn tools(mut self, tools: Vec<ToolSpec>) -> Self {
        self.tools = tools;
        self
    }

    /// Sets whether and which tool the model must call.
    #[must_use]
    pub fn tool_choice(mut self, choice: ToolChoice) -> Self {
        self.tool_choice = choice;
        self
    }

    /// Sets whether one answer may call several tools.
    #[must_use]
    pub fn parallel_tool_calls(mut self, parallel: bool) -> Self {
        self.parallel_tool_calls = parallel;
        self
    }

    /// Checks the options for values that cannot work.
    pub fn validate(&self) -> Result<(), crate::error::LlmError> {
        let bad = |m: &str| Err(crate::error::LlmError::Validation(m.to_string()));
        if self.max_context == 0 {
            return bad("max_context must be positive");
        }
        if !self.temperature.is_finite() {
            return bad("temperature must be finite");
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return bad("top_p must be in (0, 1]");
            }
        }
        if self.top_k == Some(0) {
            return bad("top_k must be positive");
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad("repetition_penalty must be positive");
        }
        if self.stop.iter().any(String::is_empty) {
            return bad("stop strings must not be empty");
        }
        Ok(())
    }
}
