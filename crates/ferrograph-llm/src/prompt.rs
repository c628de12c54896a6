//! Prompt templates with typed variables.
//!
//! A template is minijinja text (`{{ name }}`, `{% for x in items %}`...) rendered from a
//! value of a `Serialize` type `V`: `PromptTemplate<V>` only renders `V`s, so the variables a
//! workflow passes are checked by the compiler. A variable the template uses that `V` does not
//! provide is [`PromptError::MissingVariable`] (undefined values are never rendered as empty
//! text).
//!
//! ```
//! use ferrograph_llm::prompt::{ChatPrompt, PromptTemplate};
//! use serde::Serialize;
//!
//! #[derive(Serialize)]
//! struct Vars<'a> {
//!     product: &'a str,
//!     symptoms: Vec<&'a str>,
//! }
//!
//! let t = PromptTemplate::<Vars<'_>>::new("Triage {{ product }}: {{ symptoms | join(', ') }}").unwrap();
//! let text = t.render(&Vars { product: "sled", symptoms: vec!["slow", "crash"] }).unwrap();
//! assert_eq!(text, "Triage sled: slow, crash");
//!
//! let chat = ChatPrompt::<Vars<'_>>::new()
//!     .system("You triage bugs in {{ product }}.").unwrap()
//!     .human("Symptoms: {{ symptoms | join(', ') }}").unwrap();
//! let messages = chat.format(&Vars { product: "sled", symptoms: vec!["slow"] }, &[]).unwrap();
//! assert_eq!(messages[1].content, "Symptoms: slow");
//! ```

use crate::error::LlmError;
use ferrograph_core::message::{Message, Role};
use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;
use std::collections::BTreeSet;
use std::fmt;
use std::marker::PhantomData;

/// Why a prompt could not be built or rendered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PromptError {
    /// The template text does not parse.
    #[error("invalid prompt template: {0}")]
    Syntax(#[source] minijinja::Error),
    /// The template uses a variable the values do not provide.
    #[error("prompt variable `{name}` is missing (the template uses: {expected})")]
    MissingVariable {
        /// The missing variable.
        name: String,
        /// Every variable the template uses, comma-separated.
        expected: String,
    },
    /// The variables are not a map of names to values (a struct or a map).
    #[error("prompt variables must serialize to a map of names to values: {0}")]
    NotAMap(String),
    /// Rendering failed (an undefined nested field, a failing filter...).
    #[error("prompt rendering failed: {0}")]
    Render(#[source] minijinja::Error),
}

impl From<PromptError> for LlmError {
    fn from(e: PromptError) -> Self {
        LlmError::Validation(e.to_string())
    }
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env
}

/// A text template rendered from values of type `V`.
pub struct PromptTemplate<V: ?Sized = serde_json::Value> {
    source: String,
    variables: BTreeSet<String>,
    env: Environment<'static>,
    _v: PhantomData<fn(&V)>,
}

impl<V: ?Sized> Clone for PromptTemplate<V> {
    fn clone(&self) -> Self {
        PromptTemplate {
            source: self.source.clone(),
            variables: self.variables.clone(),
            env: environment(),
            _v: PhantomData,
        }
    }
}

impl<V: ?Sized> fmt::Debug for PromptTemplate<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PromptTemplate")
            .field("source", &self.source)
            .field("variables", &self.variables)
            .finish()
    }
}

impl<V: Serialize + ?Sized> PromptTemplate<V> {
    /// Parses `source`; [`PromptError::Syntax`] when it is not a valid template.
    pub fn new(source: impl Into<String>) -> Result<Self, PromptError> {
        let source = source.into();
        let env = environment();
        let globals: BTreeSet<String> = env.globals().map(|(k, _)| k.to_string()).collect();
        let variables = env
            .template_from_str(&source)
            .map_err(PromptError::Syntax)?
            .undeclared_variables(false)
            .into_iter()
            .filter(|v| !globals.contains(v))
            .collect();
        Ok(PromptTemplate {
            source,
            variables,
            env,
            _v: PhantomData,
        })
    }

    /// The top-level variables the template uses.
    pub fn variables(&self) -> impl Iterator<Item = &str> {
        self.variables.iter().map(String::as_str)
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the template with `vars`.
    pub fn render(&self, vars: &V) -> Result<String, PromptError> {
        let value = serde_json::to_value(vars).map_err(|e| PromptError::NotAMap(e.to_string()))?;
        let map = match &value {
            serde_json::Value::Object(map) => map,
            serde_json::Value::Null if self.variables.is_empty() => {
                return self
                    .env
                    .render_str(&self.source, ())
                    .map_err(PromptError::Render)
            }
            other => return Err(PromptError::NotAMap(format!("got {other}"))),
        };
        if let Some(missing) = self
            .variables
            .iter()
            .find(|v| !map.contains_key(v.as_str()))
        {
            return Err(PromptError::MissingVariable {
                name: missing.clone(),
                expected: self
                    .variables
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        self.env
            .render_str(&self.source, &value)
            .map_err(PromptError::Render)
    }
}

/// One part of a [`ChatPrompt`].
enum Part<V: ?Sized> {
    Message(Role, Box<PromptTemplate<V>>),
    History,
}

impl<V: ?Sized> Clone for Part<V> {
    fn clone(&self) -> Self {
        match self {
            Part::Message(r, t) => Part::Message(*r, t.clone()),
            Part::History => Part::History,
        }
    }
}

impl<V: ?Sized> fmt::Debug for Part<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Part::Message(r, t) => f.debug_tuple("Message").field(r).field(t).finish(),
            Part::History => f.write_str("History"),
        }
    }
}

/// A list of message templates (system, human, AI) rendered from values of type `V`, with an
/// optional place for the conversation history.
pub struct ChatPrompt<V: ?Sized = serde_json::Value> {
    parts: Vec<Part<V>>,
}

impl<V: ?Sized> Clone for ChatPrompt<V> {
    fn clone(&self) -> Self {
        ChatPrompt {
            parts: self.parts.clone(),
        }
    }
}

impl<V: ?Sized> fmt::Debug for ChatPrompt<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.parts).finish()
    }
}

impl<V: Serialize + ?Sized> Default for ChatPrompt<V> {
    fn default() -> Self {
        ChatPrompt { parts: Vec::new() }
    }
}

impl<V: Serialize + ?Sized> ChatPrompt<V> {
    /// An empty chat prompt.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a message template with `role`.
    pub fn message(mut self, role: Role, template: &str) -> Result<Self, PromptError> {
        self.parts.push(Part::Message(
            role,
            Box::new(PromptTemplate::new(template)?),
        ));
        Ok(self)
    }

    /// Adds a system message template.
    pub fn system(self, template: &str) -> Result<Self, PromptError> {
        self.message(Role::System, template)
    }

    /// Adds a human message template.
    pub fn human(self, template: &str) -> Result<Self, PromptError> {
        self.message(Role::Human, template)
    }

    /// Adds an AI message template (for few-shot examples).
    pub fn ai(self, template: &str) -> Result<Self, PromptError> {
        self.message(Role::Ai, template)
    }

    /// Marks where the `history` passed to [`ChatPrompt::format`] goes.
    #[must_use]
    pub fn history(mut self) -> Self {
        self.parts.push(Part::History);
        self
    }

    /// Renders every template with `vars`, inserting `history` at its place (or nowhere when
    /// the prompt has no history part).
    pub fn format(&self, vars: &V, history: &[Message]) -> Result<Vec<Message>, PromptError> {
        let mut out = Vec::with_capacity(self.parts.len() + history.len());
        for part in &self.parts {
            match part {
                Part::Message(role, t) => {
                    let text = t.render(vars)?;
                    out.push(match role {
                        Role::System => Message::system(text),
                        Role::Human => Message::human(text),
                        Role::Ai | Role::Tool => Message::ai(text),
                    });
                }
                Part::History => out.extend_from_slice(history),
            }
        }
        Ok(out)
    }
}
