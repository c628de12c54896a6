//! Chat templates: the GGUF's `tokenizer.chat_template` (Jinja) rendered with minijinja, with
//! fallbacks for known families when a file has none.

use crate::error::LlmError;
use ferrograph_core::message::{Message, Role};
use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde::Serialize;

/// The ChatML template (SmolLM, Qwen, ...), used when a model ships none.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Gemma's turn template (Gemma 2 and 3 GGUFs often lack one); the system prompt is folded
/// into the first user turn as Gemma does.
pub const GEMMA_TEMPLATE: &str = "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] + '\n\n' %}{% set msgs = messages[1:] %}{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}{% for message in msgs %}{% set role = 'model' if message['role'] == 'assistant' else 'user' %}{{ '<start_of_turn>' + role + '\n' + (sys if loop.first else '') + message['content'] + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

/// A compiled chat template with the tokens it refers to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

#[derive(Serialize)]
struct TemplateFunction<'a> {
    name: &'a str,
    arguments: &'a serde_json::Value,
}

#[derive(Serialize)]
struct TemplateToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: TemplateFunction<'a>,
}

#[derive(Serialize)]
struct TemplateMessage<'a> {
    role: &'static str,
    content: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<TemplateToolCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::Human => "user",
        Role::Ai => "assistant",
        Role::Tool => "tool",
    }
}

impl ChatTemplate {
    /// Compiles `source`, a Hugging Face style Jinja chat template.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, LlmError> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", |_fmt: String| -> String { String::new() });
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| LlmError::Template(format!("does not compile: {e}")))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The fallback for a model family without a template: Gemma's turns for `gemma*`,
    /// ChatML otherwise.
    pub fn fallback(
        architecture: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<Self, LlmError> {
        if architecture.starts_with("gemma") {
            Self::new(GEMMA_TEMPLATE, bos_token, eos_token)
        } else {
            Self::new(CHATML_TEMPLATE, bos_token, eos_token)
        }
    }

    /// The template's source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template renders tool definitions itself (it refers to `tools`).
    pub fn renders_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// Renders `messages` (and optionally tool definitions, OpenAI-shaped
    /// `{"type": "function", "function": {...}}` values) into a prompt;
    /// `add_generation_prompt` opens the assistant's turn.
    ///
    /// A template that does not render tools gets them as a section of the system prompt
    /// ([`crate::tool_calls::tools_prompt`]), and earlier tool calls of AI messages as
    /// `<tool_call>` blocks in their content, so the model sees the same format it is
    /// constrained to.
    pub fn render(
        &self,
        messages: &[Message],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, LlmError> {
        let tools = tools.filter(|t| !t.is_empty());
        let fold = !self.renders_tools();
        let mut contents: Vec<std::borrow::Cow<'_, str>> = messages
            .iter()
            .map(|m| {
                if fold && !m.tool_calls.is_empty() {
                    let mut c = m.content.clone();
                    for call in &m.tool_calls {
                        if !c.is_empty() {
                            c.push('\n');
                        }
                        c.push_str(&crate::tool_calls::format_call(call));
                    }
                    std::borrow::Cow::Owned(c)
                } else {
                    std::borrow::Cow::Borrowed(m.content.as_str())
                }
            })
            .collect();
        let mut system_owned = None;
        if let (true, Some(tools)) = (fold, tools) {
            let section = crate::tool_calls::tools_prompt(tools);
            match messages.first() {
                Some(m) if m.role == Role::System => {
                    contents[0] = std::borrow::Cow::Owned(format!("{}\n\n{section}", m.content));
                }
                _ => system_owned = Some(section),
            }
        }
        let mut msgs: Vec<TemplateMessage<'_>> = Vec::with_capacity(messages.len() + 1);
        if let Some(section) = system_owned.as_deref() {
            msgs.push(TemplateMessage {
                role: "system",
                content: section,
                tool_calls: Vec::new(),
                tool_call_id: None,
                name: None,
            });
        }
        msgs.extend(messages.iter().zip(contents.iter()).map(|(m, content)| {
            TemplateMessage {
                role: role_name(m.role),
                content,
                tool_calls: m
                    .tool_calls
                    .iter()
                    .map(|c| TemplateToolCall {
                        id: &c.id,
                        kind: "function",
                        function: TemplateFunction {
                            name: &c.name,
                            arguments: &c.args.0,
                        },
                    })
                    .collect(),
                tool_call_id: m.tool_call_id.as_deref(),
                name: m.name.as_deref(),
            }
        }));
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| LlmError::Template(e.to_string()))?;
        tmpl.render(minijinja::context! {
            messages => msgs,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
            tools => tools,
        })
        .map_err(|e| LlmError::Template(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_fallback_renders() {
        let t = ChatTemplate::fallback("llama", "<s>", "</s>").unwrap_or_else(|e| panic!("{e}"));
        let out = t
            .render(
                &[Message::system("Be brief."), Message::human("Hi")],
                None,
                true,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn gemma_fallback_folds_system_prompt() {
        let t =
            ChatTemplate::fallback("gemma3", "<bos>", "<eos>").unwrap_or_else(|e| panic!("{e}"));
        let out = t
            .render(&[Message::system("S"), Message::human("Hi")], None, true)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            out,
            "<bos><start_of_turn>user\nS\n\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('no') }}", "", "")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            t.render(&[], None, true),
            Err(LlmError::Template(_))
        ));
    }

    #[test]
    fn python_string_methods_work() {
        let t = ChatTemplate::new("{{ messages[0]['content'].strip() }}", "", "")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            t.render(&[Message::human("  x  ")], None, false)
                .unwrap_or_else(|e| panic!("{e}")),
            "x"
        );
    }
}
