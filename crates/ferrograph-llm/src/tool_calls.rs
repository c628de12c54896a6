//! Tool calls for local models: the prompt section that describes bound tools (for chat
//! templates that do not render tools themselves), the grammar that holds the output to calls
//! of those tools, and parsing the output back into [`ToolCall`]s.
//!
//! The wire format is the Hermes/Qwen one that most small instruction-tuned models know:
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! With `tool_choice` `Required` the answer is one to [`MAX_PARALLEL_CALLS`] such blocks
//! (one with `parallel_tool_calls` off), with `Named` exactly one block calling that tool, and with `Auto` either such blocks or
//! free text (which must not start with `<tool_call>`; with a `response_format` the text
//! alternative is that JSON instead). `None` binds no grammar and renders no tools.

use crate::error::LlmError;
use crate::options::{GenerateOptions, ResponseFormat, ToolChoice};
use ferrograph_core::message::{ToolCall, ToolSpec};
use serde_json::{json, Value};

/// Opens a tool call in the output.
pub const TOOL_CALL_OPEN: &str = "<tool_call>";
/// Closes a tool call in the output.
pub const TOOL_CALL_CLOSE: &str = "</tool_call>";
/// Most calls one answer may hold (with `tool_choice` `Auto` or `Required`).
pub const MAX_PARALLEL_CALLS: usize = 4;

/// The JSON Schema that `options.response_format` asks for, if any.
pub fn response_schema(options: &GenerateOptions) -> Option<Value> {
    match options.response_format.as_ref()? {
        ResponseFormat::JsonObject => Some(json!({"type": "object"})),
        ResponseFormat::JsonSchema { schema, .. } => Some(schema.clone()),
    }
}

/// The tools a request offers the model: none with `tool_choice` `None`, only the named one
/// with `Named` (an unknown name is a validation error).
pub fn offered_tools(options: &GenerateOptions) -> Result<Vec<&ToolSpec>, LlmError> {
    match &options.tool_choice {
        ToolChoice::None => Ok(Vec::new()),
        ToolChoice::Named(name) => {
            let t = options
                .tools
                .iter()
                .find(|t| &t.name == name)
                .ok_or_else(|| {
                    LlmError::Validation(format!("tool_choice names `{name}`, which is not bound"))
                })?;
            Ok(vec![t])
        }
        _ => {
            if options.tool_choice == ToolChoice::Required && options.tools.is_empty() {
                return Err(LlmError::Validation(
                    "tool_choice `required` needs at least one bound tool".into(),
                ));
            }
            Ok(options.tools.iter().collect())
        }
    }
}

/// Tool definitions in the OpenAI shape chat templates expect
/// (`{"type": "function", "function": {name, description, parameters}}`).
pub fn template_tools(tools: &[&ToolSpec]) -> Vec<Value> {
    tools
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
        .collect()
}

/// The system-prompt section describing `tools` (OpenAI-shaped, as from [`template_tools`]),
/// for chat templates that do not render tools.
pub fn tools_prompt(tools: &[Value]) -> String {
    let mut s = String::from(
        "You can call these tools. Each tool is described by a JSON object:\n<tools>\n",
    );
    for t in tools {
        let f = t.get("function").unwrap_or(t);
        let line = json!({
            "name": f.get("name").cloned().unwrap_or(Value::Null),
            "description": f.get("description").cloned().unwrap_or(Value::Null),
            "parameters": f.get("parameters").cloned().unwrap_or(Value::Null),
        });
        s.push_str(&line.to_string());
        s.push('\n');
    }
    s.push_str(
        "</tools>\nTo call a tool, answer with <tool_call>\n{\"name\": <tool name>, \
         \"arguments\": <arguments object>}\n</tool_call>",
    );
    s
}

/// A tool call as text in the wire format (for templates that do not render calls).
pub fn format_call(call: &ToolCall) -> String {
    let body = json!({"name": call.name, "arguments": call.args.0});
    format!("{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}")
}

/// Rewrites the local `$ref`s (`#...`) of `schema` to point into `#/$defs/{key}`, where the
/// schema will live inside a larger one.
fn rebase_refs(schema: &mut Value, key: &str) {
    match schema {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if k == "$ref" {
                    if let Value::String(r) = v {
                        if let Some(rest) = r.strip_prefix('#') {
                            let rest = rest.strip_prefix('/').unwrap_or(rest);
                            *r = if rest.is_empty() {
                                format!("#/$defs/{key}")
                            } else {
                                format!("#/$defs/{key}/{rest}")
                            };
                        }
                    }
                } else {
                    rebase_refs(v, key);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rebase_refs(v, key)),
        _ => {}
    }
}

/// The JSON Schema of one call body, `{"name": ..., "arguments": ...}`, over `tools`. Each
/// tool's parameter schema is kept whole under `$defs` (its own `$defs` and `$ref`s rebased),
/// so schemars output with definitions works unchanged.
pub fn call_schema(tools: &[&ToolSpec]) -> Value {
    let mut defs = serde_json::Map::new();
    let mut alternatives = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let key = format!("tool{i}");
        let mut params = match &t.parameters.0 {
            Value::Object(_) => t.parameters.0.clone(),
            _ => json!({"type": "object"}),
        };
        rebase_refs(&mut params, &key);
        defs.insert(key.clone(), params);
        alternatives.push(json!({
            "type": "object",
            "properties": {
                "name": {"const": t.name},
                "arguments": {"$ref": format!("#/$defs/{key}")},
            },
            "required": ["name", "arguments"],
            "additionalProperties": false,
        }));
    }
    let mut schema = if alternatives.len() == 1 {
        alternatives.pop().unwrap_or(Value::Null)
    } else {
        json!({"anyOf": alternatives})
    };
    if let Some(map) = schema.as_object_mut() {
        map.insert("$defs".into(), Value::Object(defs));
    }
    crate::constrain::with_json_options(&schema)
}

/// The Lark grammar for a request with tools, or `None` when no tool may be called.
pub fn tool_grammar(options: &GenerateOptions) -> Result<Option<String>, LlmError> {
    let tools = offered_tools(options)?;
    if tools.is_empty() {
        return Ok(None);
    }
    let body = call_schema(&tools);
    let max_calls = match options.tool_choice {
        ToolChoice::Named(_) => 1,
        _ if !options.parallel_tool_calls => 1,
        _ => MAX_PARALLEL_CALLS,
    };
    let calls = (1..=max_calls)
        .map(|n| vec!["call"; n].join(" \"\\n\" "))
        .collect::<Vec<_>>()
        .join(" | ");
    let start = match (&options.tool_choice, response_schema(options)) {
        (ToolChoice::Auto, Some(schema)) => {
            format!(
                "start: calls | answer\nanswer: %json {}\n",
                crate::constrain::with_json_options(&schema)
            )
        }
        (ToolChoice::Auto, None) => {
            "start: calls | TEXT\nTEXT: /(?s:.+)/ & ~/(?s:[ \\t\\r\\n]*<tool_call>.*)/\n".into()
        }
        _ => "start: calls\n".into(),
    };
    Ok(Some(format!(
        "{start}calls: {calls}\ncall: \"{TOOL_CALL_OPEN}\\n\" %json {body} \"\\n{TOOL_CALL_CLOSE}\"\n"
    )))
}

/// Splits a model's answer into its text and its tool calls: every
/// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block becomes a [`ToolCall`]
/// (with a fresh id) and is removed from the text. A block that is not a JSON object with a
/// string `name` is [`LlmError::Schema`]; an unclosed block at the end is too.
pub fn parse_tool_calls(text: &str) -> Result<(String, Vec<ToolCall>), LlmError> {
    let bad = |m: &str| LlmError::Schema {
        message: m.to_string(),
        output: text.to_string(),
    };
    let mut calls = Vec::new();
    let mut rest_text = String::new();
    let mut rest = text;
    while let Some(open) = rest.find(TOOL_CALL_OPEN) {
        rest_text.push_str(&rest[..open]);
        let after = &rest[open + TOOL_CALL_OPEN.len()..];
        let close = after
            .find(TOOL_CALL_CLOSE)
            .ok_or_else(|| bad("unclosed <tool_call> block"))?;
        let body: Value = serde_json::from_str(after[..close].trim())
            .map_err(|e| bad(&format!("tool call is not JSON: {e}")))?;
        let name = body
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("tool call without a string `name`"))?;
        let args = body
            .get("arguments")
            .or_else(|| body.get("parameters"))
            .cloned()
            .unwrap_or_else(|| json!({}));
        calls.push(ToolCall::new(name, args));
        rest = &after[close + TOOL_CALL_CLOSE.len()..];
    }
    rest_text.push_str(rest);
    Ok((rest_text.trim().to_string(), calls))
}

/// `text` without a last `<tool_call>` block that was never closed (an answer cut off at
/// `max_tokens` in the middle of a further call keeps its complete calls).
pub fn drop_unfinished_call(text: &str) -> &str {
    match (text.rfind(TOOL_CALL_OPEN), text.rfind(TOOL_CALL_CLOSE)) {
        (Some(open), Some(close)) if open > close => &text[..open],
        (Some(open), None) => &text[..open],
        _ => text,
    }
}

/// Checks parsed calls against the offered tools: each must name one of them.
pub fn check_calls(calls: &[ToolCall], options: &GenerateOptions) -> Result<(), LlmError> {
    let tools = offered_tools(options)?;
    for c in calls {
        if !tools.iter().any(|t| t.name == c.name) {
            return Err(LlmError::Schema {
                message: format!("call of unknown tool `{}`", c.name),
                output: format_call(c),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> ToolSpec {
        ToolSpec::new(
            "get_weather",
            "Weather of a city",
            json!({
                "type": "object",
                "properties": {"city": {"$ref": "#/$defs/City"}},
                "required": ["city"],
                "$defs": {"City": {"type": "string"}}
            }),
        )
    }

    #[test]
    fn refs_are_rebased_under_defs() {
        let t = weather();
        let s = call_schema(&[&t]);
        assert_eq!(
            s["$defs"]["tool0"]["properties"]["city"]["$ref"],
            "#/$defs/tool0/$defs/City"
        );
        assert_eq!(s["properties"]["name"]["const"], "get_weather");
        assert_eq!(s["properties"]["arguments"]["$ref"], "#/$defs/tool0");
    }

    #[test]
    fn parses_calls_and_text() {
        let (text, calls) = parse_tool_calls(
            "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"x\"}</tool_call>",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(text, "Sure.");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].args.0["city"], "Paris");
        assert_eq!(calls[1].args.0, json!({}));
        assert!(matches!(
            parse_tool_calls("<tool_call>{\"name\": 1}</tool_call>"),
            Err(LlmError::Schema { .. })
        ));
        assert!(matches!(
            parse_tool_calls("<tool_call>{\"name\": \"x\""),
            Err(LlmError::Schema { .. })
        ));
    }

    #[test]
    fn unfinished_last_call_is_dropped() {
        let t = "<tool_call>\n{}\n</tool_call>\n<tool_call>\n{\"na";
        assert_eq!(drop_unfinished_call(t), "<tool_call>\n{}\n</tool_call>\n");
        assert_eq!(drop_unfinished_call("<tool_call>{"), "");
        assert_eq!(drop_unfinished_call("plain"), "plain");
    }

    #[test]
    fn grammar_by_choice() {
        let mut o = GenerateOptions::default();
        assert_eq!(tool_grammar(&o).unwrap_or_default(), None);
        o.tools = vec![weather()];
        let auto = tool_grammar(&o).ok().flatten().unwrap_or_default();
        assert!(auto.starts_with("start: calls | TEXT"), "{auto}");
        o.tool_choice = ToolChoice::Required;
        let req = tool_grammar(&o).ok().flatten().unwrap_or_default();
        assert!(req.starts_with("start: calls\n"), "{req}");
        assert!(req.contains("calls: call | call \"\\n\" call |"), "{req}");
        o.parallel_tool_calls = false;
        let one = tool_grammar(&o).ok().flatten().unwrap_or_default();
        assert!(one.contains("calls: call\n"), "{one}");
        o.tool_choice = ToolChoice::None;
        assert_eq!(tool_grammar(&o).unwrap_or_default(), None);
        o.tool_choice = ToolChoice::Named("nope".into());
        assert!(matches!(tool_grammar(&o), Err(LlmError::Validation(_))));
    }
}
