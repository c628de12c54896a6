//! Chat messages shared by the whole workspace: system, human, AI (with tool calls) and tool
//! results. Every message has an id, which the messages merge rule uses to replace or remove it.

use crate::id::random_id;
use crate::json::Json;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions for the model.
    System,
    /// A person (or the caller) speaking.
    Human,
    /// The model speaking, possibly asking for tools.
    Ai,
    /// The result of one tool call.
    Tool,
}

/// Outcome of a tool execution, as recorded on its result message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolStatus {
    /// The tool returned normally.
    Success,
    /// The tool returned an error; the content describes it.
    Error,
    /// The tool ran past its timeout.
    Timeout,
}

/// A tool invocation requested by a model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Unique id; the tool result message refers to it.
    pub id: String,
    /// Name of the tool to call.
    pub name: String,
    /// Arguments as JSON.
    pub args: Json,
}

impl ToolCall {
    /// A tool call with a fresh id.
    pub fn new(name: impl Into<String>, args: serde_json::Value) -> Self {
        ToolCall {
            id: format!("call_{}", &random_id()[..16]),
            name: name.into(),
            args: Json(args),
        }
    }
}

/// A tool as offered to a model: its name, what it does, and the JSON Schema of its arguments.
///
/// Models that are bound to tools receive these specs (a local model constrains its output to
/// calls that match them; a remote model gets them in the request's `tools` field) and answer
/// with [`ToolCall`]s.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Name the model uses to call the tool.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Json,
}

impl ToolSpec {
    /// A tool spec.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: serde_json::Value,
    ) -> Self {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            parameters: Json(parameters),
        }
    }
}

/// Token counts of one model call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    /// Tokens in the prompt.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// Prompt tokens served from a cached prefix instead of being computed again.
    #[serde(default)]
    pub cached_prompt_tokens: u32,
}

/// One chat message. The fields after `content` are only meaningful for some roles: tool
/// calls, usage and finish reason for AI messages; the call id, tool name and status for tool
/// results. The layout is flat so that it encodes the same way in JSON and in checkpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Unique id within a conversation.
    pub id: String,
    /// Author.
    pub role: Role,
    /// Text content.
    pub content: String,
    /// Tool calls the model asked for, in order (AI messages).
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// The id of the [`ToolCall`] this answers (tool results).
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// The tool's name (tool results) or the author's display name.
    #[serde(default)]
    pub name: Option<String>,
    /// Whether the tool succeeded (tool results).
    #[serde(default)]
    pub tool_status: Option<ToolStatus>,
    /// Token counts, when the model reported them (AI messages).
    #[serde(default)]
    pub usage: Option<TokenUsage>,
    /// Why generation stopped (`stop`, `length`, `tool_calls`, ...), when known.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Free-form string metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

impl Message {
    fn with_role(role: Role, content: impl Into<String>) -> Self {
        Message {
            id: random_id(),
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            tool_status: None,
            usage: None,
            finish_reason: None,
            metadata: BTreeMap::new(),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::with_role(Role::System, content)
    }

    /// A human message.
    pub fn human(content: impl Into<String>) -> Self {
        Self::with_role(Role::Human, content)
    }

    /// An AI message with no tool calls.
    pub fn ai(content: impl Into<String>) -> Self {
        Self::with_role(Role::Ai, content)
    }

    /// An AI message that asks for tool calls.
    pub fn ai_with_tools(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        let mut m = Self::with_role(Role::Ai, content);
        m.tool_calls = tool_calls;
        m
    }

    /// The result of a tool call.
    pub fn tool(call: &ToolCall, status: ToolStatus, content: impl Into<String>) -> Self {
        let mut m = Self::with_role(Role::Tool, content);
        m.tool_call_id = Some(call.id.clone());
        m.name = Some(call.name.clone());
        m.tool_status = Some(status);
        m
    }

    /// Replaces the id (e.g. to overwrite an existing message through the messages rule).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// Adds a metadata entry.
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// The tool calls of an AI message (empty for other roles).
    pub fn tool_calls(&self) -> &[ToolCall] {
        &self.tool_calls
    }

    /// Short role name: `system`, `human`, `ai` or `tool`.
    pub fn role_name(&self) -> &'static str {
        match self.role {
            Role::System => "system",
            Role::Human => "human",
            Role::Ai => "ai",
            Role::Tool => "tool",
        }
    }
}

/// One operation of the messages merge rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageOp {
    /// Appends the message, or replaces the existing message with the same id in place.
    Upsert {
        /// The message.
        message: Message,
    },
    /// Removes the message with this id. Removing an id that is not present is an error.
    Remove {
        /// Id of the message to remove.
        id: String,
    },
    /// Removes every message.
    RemoveAll,
}

impl MessageOp {
    /// A removal marker for the message with `id`.
    pub fn remove(id: impl Into<String>) -> Self {
        MessageOp::Remove { id: id.into() }
    }
}

impl From<Message> for MessageOp {
    fn from(message: Message) -> Self {
        MessageOp::Upsert { message }
    }
}

/// The update value of a field under the messages rule: a list of operations applied in order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MessagesUpdate(pub Vec<MessageOp>);

impl MessagesUpdate {
    /// Number of operations.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no operations.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<Message> for MessagesUpdate {
    fn from(m: Message) -> Self {
        MessagesUpdate(vec![m.into()])
    }
}

impl From<Vec<Message>> for MessagesUpdate {
    fn from(v: Vec<Message>) -> Self {
        MessagesUpdate(v.into_iter().map(MessageOp::from).collect())
    }
}

impl From<MessageOp> for MessagesUpdate {
    fn from(op: MessageOp) -> Self {
        MessagesUpdate(vec![op])
    }
}

impl From<Vec<MessageOp>> for MessagesUpdate {
    fn from(v: Vec<MessageOp>) -> Self {
        MessagesUpdate(v)
    }
}

impl<const N: usize> From<[Message; N]> for MessagesUpdate {
    fn from(v: [Message; N]) -> Self {
        MessagesUpdate(v.into_iter().map(MessageOp::from).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_roundtrip_through_bincode_and_json() {
        let call = ToolCall::new("search", serde_json::json!({"q": "x"}));
        let msgs = [
            Message::system("s"),
            Message::human("h").with_metadata("k", "v"),
            Message::ai_with_tools("a", vec![call.clone()]),
            Message::tool(&call, ToolStatus::Error, "failed"),
        ];
        let ops: Vec<MessageOp> = msgs
            .iter()
            .cloned()
            .map(MessageOp::from)
            .chain([MessageOp::remove("x"), MessageOp::RemoveAll])
            .collect();
        let cfg = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(&ops, cfg).unwrap();
        let (back, _): (Vec<MessageOp>, usize) =
            bincode::serde::decode_from_slice(&bytes, cfg).unwrap();
        assert_eq!(back, ops);
        let text = serde_json::to_string(&ops).unwrap();
        let back: Vec<MessageOp> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, ops);
        assert_eq!(msgs[3].tool_call_id.as_deref(), Some(call.id.as_str()));
        assert_eq!(msgs[2].tool_calls(), &[call]);
    }
}
