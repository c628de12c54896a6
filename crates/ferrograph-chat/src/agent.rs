//! An agent's model calls, the way the workflows make them: [`AgentLlm`] calls the primary
//! model with retries on retryable errors only (rate limits, overload, time-outs; never schema
//! or validation errors), then one fallback call (a second configured model, or the same model
//! with another sampling configuration) that is not retried (seed 001's
//! `.with_retry(...).with_fallbacks([...])`). Each call is recorded as an [`LlmCall`], which a
//! workflow keeps in its state.

use crate::fallback::default_fallback_on;
use crate::model::schema_hint;
use crate::{
    parse_structured, run_with_retry, ChatModel, GenerateOptions, LlmError, ResponseFormat,
    RetryPolicy, TokenSink, ToolChoice,
};
use ferrograph_core::message::{Message, ToolSpec};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// One model call of an agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmCall {
    /// What the call was for (`hypothesis`, `classify`, `changes`, …).
    pub purpose: String,
    /// The model that answered.
    pub model: String,
    /// Whether the fallback model answered.
    pub used_fallback: bool,
    /// Attempts on the primary model (retries included).
    pub attempts: u32,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Prompt tokens served from the prefix cache.
    pub cached_prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Wall time.
    pub duration_ms: u64,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// The models and options of the agents' calls.
#[derive(Clone)]
pub struct AgentLlm {
    /// The primary model.
    pub primary: Arc<dyn ChatModel>,
    /// Options of primary calls.
    pub primary_options: GenerateOptions,
    /// The fallback model (may be the primary with other options).
    pub fallback: Arc<dyn ChatModel>,
    /// Options of fallback calls.
    pub fallback_options: GenerateOptions,
    /// Retries of the primary model.
    pub retry: RetryPolicy,
}

impl AgentLlm {
    /// `primary` greedy, retried 3 times; the fallback is `fallback` greedy, or `primary`
    /// again sampled at temperature 0.7 with a fixed seed when no second model is configured.
    pub fn new(primary: Arc<dyn ChatModel>, fallback: Option<Arc<dyn ChatModel>>) -> Self {
        // The repetition guard stops loops while decoding (the text checks catch the rest);
        // eight tokens, so that a long identifier may be named twice.
        let base = GenerateOptions::greedy()
            .max_context(8192)
            .no_repeat_ngram(8);
        let (fallback, fallback_options) = match fallback {
            Some(f) => (f, base.clone()),
            None => (
                primary.clone(),
                base.clone().temperature(0.7).top_p(0.9).seed(17),
            ),
        };
        AgentLlm {
            primary,
            primary_options: base,
            fallback,
            fallback_options,
            retry: RetryPolicy::attempts(3),
        }
    }

    /// Asks for a `T`, with `patch` editing `T`'s JSON schema first (to constrain fields to
    /// values known only at run time, such as retrieved paths).
    pub async fn structured<T: JsonSchema + DeserializeOwned>(
        &self,
        purpose: &str,
        messages: &[Message],
        max_tokens: usize,
        patch: impl Fn(&mut Value),
        sink: Option<TokenSink>,
    ) -> (Result<T, LlmError>, LlmCall) {
        self.structured_as(false, purpose, messages, max_tokens, patch, sink)
            .await
    }

    /// [`AgentLlm::structured`], on the alternative configuration when `alternative` (the
    /// fallback model, or the primary sampled instead of greedy) with no further fallback:
    /// the second try of an answer whose text failed its checks.
    pub async fn structured_as<T: JsonSchema + DeserializeOwned>(
        &self,
        alternative: bool,
        purpose: &str,
        messages: &[Message],
        max_tokens: usize,
        patch: impl Fn(&mut Value),
        sink: Option<TokenSink>,
    ) -> (Result<T, LlmError>, LlmCall) {
        let mut schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null);
        patch(&mut schema);
        let name = schema
            .get("title")
            .and_then(Value::as_str)
            .unwrap_or("answer")
            .to_string();
        let instruction = format!(
            "Answer with JSON of this shape: {}",
            schema_hint(&schema, &schema, 0)
        );
        let msgs = with_instruction(messages, &instruction);
        let format = ResponseFormat::JsonSchema { name, schema };
        self.call(
            alternative,
            purpose,
            &msgs,
            |o| {
                o.max_tokens = max_tokens;
                o.response_format = Some(format.clone());
            },
            |answer| match serde_json::from_str::<T>(answer.content.trim()) {
                Ok(v) => Ok(v),
                Err(e) if answer.finish_reason.as_deref() == Some("length") => {
                    Err(LlmError::Schema {
                        message: format!("the answer was cut off at max_tokens: {e}"),
                        output: answer.content.clone(),
                    })
                }
                Err(_) => parse_structured(&answer.content),
            },
            sink,
        )
        .await
    }

    /// Free text (the writer's comment).
    pub async fn text(
        &self,
        purpose: &str,
        messages: &[Message],
        max_tokens: usize,
        sink: Option<TokenSink>,
    ) -> (Result<String, LlmError>, LlmCall) {
        self.text_with(purpose, messages, max_tokens, |_| {}, sink)
            .await
    }

    /// Free text with `set` adjusting the call's options first: an answer that must repeat
    /// itself (search/replace edits quote the lines they change) turns the repetition guard
    /// off, and a long one widens the context.
    pub async fn text_with(
        &self,
        purpose: &str,
        messages: &[Message],
        max_tokens: usize,
        set: impl Fn(&mut GenerateOptions),
        sink: Option<TokenSink>,
    ) -> (Result<String, LlmError>, LlmCall) {
        self.call(
            false,
            purpose,
            messages,
            |o| {
                o.max_tokens = max_tokens;
                set(o);
            },
            |answer| {
                let t = answer.content.trim();
                if t.is_empty() {
                    Err(LlmError::Schema {
                        message: "the model returned no text".into(),
                        output: String::new(),
                    })
                } else {
                    Ok(t.to_string())
                }
            },
            sink,
        )
        .await
    }

    /// A tool-calling turn: the model must call one of `tools` (the answer's tool calls).
    pub async fn tool_request(
        &self,
        purpose: &str,
        messages: &[Message],
        tools: Vec<ToolSpec>,
        max_tokens: usize,
        sink: Option<TokenSink>,
    ) -> (Result<Message, LlmError>, LlmCall) {
        self.call(
            false,
            purpose,
            messages,
            |o| {
                o.max_tokens = max_tokens;
                o.tools = tools.clone();
                // With one tool, name it: the same constraint, and servers that refuse
                // `required` (llama-cpp-python's function-calling format) accept a name.
                o.tool_choice = match tools.as_slice() {
                    [only] => ToolChoice::Named(only.name.clone()),
                    _ => ToolChoice::Required,
                };
            },
            |answer| {
                if answer.tool_calls.is_empty() {
                    Err(LlmError::Schema {
                        message: "the model made no tool call".into(),
                        output: answer.content.clone(),
                    })
                } else {
                    Ok(answer.clone())
                }
            },
            sink,
        )
        .await
    }

    async fn call<T>(
        &self,
        alternative: bool,
        purpose: &str,
        messages: &[Message],
        set: impl Fn(&mut GenerateOptions),
        parse: impl Fn(&Message) -> Result<T, LlmError>,
        sink: Option<TokenSink>,
    ) -> (Result<T, LlmError>, LlmCall) {
        let started = Instant::now();
        if alternative {
            return self
                .call_alternative(purpose, messages, set, parse, sink)
                .await;
        }
        let mut rec = LlmCall {
            purpose: purpose.to_string(),
            model: self.primary.model_name(),
            ..LlmCall::default()
        };
        let mut opts = self.primary_options.clone();
        set(&mut opts);
        let usage = std::sync::Mutex::new((0u32, 0u32, 0u32));
        let add = |m: &Message| {
            if let (Some(u), Ok(mut acc)) = (&m.usage, usage.lock()) {
                acc.0 += u.prompt_tokens;
                acc.1 += u.cached_prompt_tokens;
                acc.2 += u.completion_tokens;
            }
        };
        let attempts = std::sync::atomic::AtomicU32::new(0);
        let primary = run_with_retry(&self.retry, |attempt| {
            attempts.store(attempt, std::sync::atomic::Ordering::Relaxed);
            let (opts, sink) = (&opts, sink.clone());
            let (add, parse) = (&add, &parse);
            async move {
                let answer = self.primary.invoke(messages, opts, sink).await?;
                add(&answer);
                parse(&answer)
            }
        })
        .await;
        rec.attempts = attempts.load(std::sync::atomic::Ordering::Relaxed);
        let result = match primary {
            Ok(v) => Ok(v),
            Err(e) if default_fallback_on(&e) => {
                tracing::warn!(purpose, error = %e, "primary model failed; calling the fallback once");
                rec.used_fallback = true;
                rec.model = self.fallback.model_name();
                let mut fopts = self.fallback_options.clone();
                set(&mut fopts);
                match self.fallback.invoke(messages, &fopts, sink).await {
                    Ok(answer) => {
                        add(&answer);
                        parse(&answer).map_err(|e2| fallback_error(&e, e2))
                    }
                    Err(e2) => Err(fallback_error(&e, e2)),
                }
            }
            Err(e) => Err(e),
        };
        if let Ok(acc) = usage.lock() {
            (
                rec.prompt_tokens,
                rec.cached_prompt_tokens,
                rec.completion_tokens,
            ) = *acc;
        }
        rec.duration_ms = started.elapsed().as_millis() as u64;
        rec.error = result.as_ref().err().map(|e| e.to_string());
        (result, rec)
    }
}

impl AgentLlm {
    /// One call on the alternative configuration, not retried, no fallback.
    async fn call_alternative<T>(
        &self,
        purpose: &str,
        messages: &[Message],
        set: impl Fn(&mut GenerateOptions),
        parse: impl Fn(&Message) -> Result<T, LlmError>,
        sink: Option<TokenSink>,
    ) -> (Result<T, LlmError>, LlmCall) {
        let started = Instant::now();
        let mut rec = LlmCall {
            purpose: format!("{purpose} (second try)"),
            model: self.fallback.model_name(),
            used_fallback: true,
            attempts: 1,
            ..LlmCall::default()
        };
        let mut opts = self.fallback_options.clone();
        set(&mut opts);
        let result = match self.fallback.invoke(messages, &opts, sink).await {
            Ok(answer) => {
                if let Some(u) = &answer.usage {
                    rec.prompt_tokens = u.prompt_tokens;
                    rec.cached_prompt_tokens = u.cached_prompt_tokens;
                    rec.completion_tokens = u.completion_tokens;
                }
                parse(&answer)
            }
            Err(e) => Err(e),
        };
        rec.duration_ms = started.elapsed().as_millis() as u64;
        rec.error = result.as_ref().err().map(|e| e.to_string());
        (result, rec)
    }
}

fn fallback_error(primary: &LlmError, fallback: LlmError) -> LlmError {
    tracing::warn!(primary = %primary, fallback = %fallback, "the fallback failed too");
    fallback
}

/// `messages` with `instruction` appended to the last message: the system message stays the
/// same for every agent, so its prefill is cached once and reused (see
/// `LoadOptions::prefix_cache_entries`).
fn with_instruction(messages: &[Message], instruction: &str) -> Vec<Message> {
    let mut msgs = messages.to_vec();
    match msgs.last_mut() {
        Some(m) if m.role != ferrograph_core::message::Role::System => {
            m.content = format!("{}\n\n{instruction}", m.content);
        }
        _ => msgs.push(Message::human(instruction)),
    }
    msgs
}

/// Sets `schema.properties.<field>` to a string enum of `values` (an array field's items when
/// the field is an array). With no values, the field can only be empty (arrays) or is left
/// alone (strings).
pub fn constrain_to(schema: &mut Value, field: &str, values: &[String]) {
    let Some(prop) = schema.get_mut("properties").and_then(|p| p.get_mut(field)) else {
        return;
    };
    let is_array = prop.get("type").and_then(Value::as_str) == Some("array");
    let choices = serde_json::json!({"type": "string", "enum": values});
    if is_array {
        if values.is_empty() {
            prop["maxItems"] = Value::from(0);
            prop["minItems"] = Value::from(0);
        } else {
            prop["items"] = choices;
            let max = prop
                .get("maxItems")
                .and_then(Value::as_u64)
                .unwrap_or(u64::MAX);
            prop["maxItems"] = Value::from(max.min(values.len() as u64));
            let min = prop.get("minItems").and_then(Value::as_u64).unwrap_or(0);
            prop["minItems"] = Value::from(min.min(values.len() as u64));
        }
    } else if !values.is_empty() {
        *prop = choices;
    }
}

/// Whether a model's sentence loops: a sentence said twice, or a four-word phrase three
/// times.
pub fn degenerate(text: &str) -> bool {
    let sentences: Vec<String> = text
        .split(['.', '!', '?'])
        .map(|s| s.trim().to_lowercase())
        .filter(|s| s.split_whitespace().count() >= 3)
        .collect();
    let mut seen = std::collections::HashSet::new();
    if sentences.iter().any(|s| !seen.insert(s.clone())) {
        return true;
    }
    let words: Vec<String> = text
        .split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .collect();
    let mut counts = std::collections::HashMap::new();
    for w in words.windows(4) {
        let c = counts.entry(w.join(" ")).or_insert(0);
        *c += 1;
        if *c >= 3 {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn constraining_fields_to_known_values() {
        let mut s = json!({"properties": {
            "paths": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
            "location": {"type": "string"},
            "errors": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        }});
        constrain_to(&mut s, "paths", &["a.py".into(), "b.py".into()]);
        constrain_to(&mut s, "location", &["a.py:1-9".into()]);
        constrain_to(&mut s, "errors", &[]);
        assert_eq!(
            s["properties"]["paths"]["items"]["enum"],
            json!(["a.py", "b.py"])
        );
        assert_eq!(s["properties"]["paths"]["maxItems"], 2);
        assert_eq!(s["properties"]["paths"]["minItems"], 1);
        assert_eq!(s["properties"]["location"]["enum"], json!(["a.py:1-9"]));
        assert_eq!(s["properties"]["errors"]["maxItems"], 0);
    }
}
