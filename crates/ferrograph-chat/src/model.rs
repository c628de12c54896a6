//! The [`ChatModel`] trait, tool binding and structured output.

use crate::error::LlmError;
use crate::options::{GenerateOptions, ResponseFormat, ToolChoice};
use crate::sink::TokenSink;
use async_trait::async_trait;
use ferrograph_core::message::{Message, ToolSpec};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use std::marker::PhantomData;
use std::sync::Arc;

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
        // A long list (a file's lines, a repository's paths) is described, not repeated:
        // the grammar holds the list, and the prompt shows what it comes from.
        if vals.len() > 12 {
            return match obj.get("description").and_then(Value::as_str) {
                Some(d) => format!("<{d}>"),
                None => format!(
                    "{} | … ({} choices)",
                    vals.iter()
                        .take(3)
                        .map(|v| v.to_string())
                        .collect::<Vec<_>>()
                        .join(" | "),
                    vals.len()
                ),
            };
        }
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
