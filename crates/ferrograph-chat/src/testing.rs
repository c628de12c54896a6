//! A scripted [`ChatModel`] for tests of graph logic, retries and fallbacks: no weights, no
//! server. Behind the `testing` feature; the workspace's tests share it instead of each
//! writing its own. It proves the logic around a model, never that a model is useful: the
//! workflows' end-to-end tests run the real local model.

use crate::error::LlmError;
use crate::model::ChatModel;
use crate::options::GenerateOptions;
use crate::sink::TokenSink;
use async_trait::async_trait;
use ferrograph_core::message::Message;
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One call as the script sees it.
#[derive(Debug)]
pub struct ScriptCall<'a> {
    /// Calls before this one (0 for the first).
    pub index: usize,
    /// The conversation asked about.
    pub messages: &'a [Message],
    /// The call's options (tools, response format, ...).
    pub options: &'a GenerateOptions,
}

impl ScriptCall<'_> {
    /// The requested JSON schema's name and the schema, or `("", Null)` for free text.
    pub fn json_schema(&self) -> (&str, serde_json::Value) {
        match &self.options.response_format {
            Some(crate::options::ResponseFormat::JsonSchema { name, schema }) => {
                (name.as_str(), schema.clone())
            }
            _ => ("", serde_json::Value::Null),
        }
    }

    /// The last message's text (the task, in the workflows' prompts).
    pub fn last_prompt(&self) -> String {
        self.messages
            .last()
            .map(|m| m.content.clone())
            .unwrap_or_default()
    }
}

type Script = dyn Fn(ScriptCall<'_>) -> Result<Message, LlmError> + Send + Sync;

/// A model answering from a script, counting its calls.
#[derive(Clone)]
pub struct ScriptedModel {
    name: String,
    calls: Arc<AtomicUsize>,
    delay: Duration,
    script: Arc<Script>,
}

impl fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedModel")
            .field("name", &self.name)
            .field("calls", &self.calls())
            .finish()
    }
}

impl ScriptedModel {
    /// A model named `name` answering each call with `script`.
    pub fn new(
        name: impl Into<String>,
        script: impl Fn(ScriptCall<'_>) -> Result<Message, LlmError> + Send + Sync + 'static,
    ) -> Self {
        ScriptedModel {
            name: name.into(),
            calls: Arc::new(AtomicUsize::new(0)),
            delay: Duration::ZERO,
            script: Arc::new(script),
        }
    }

    /// A model giving `answers` in order (`Ok(text)` an AI message, `Err` the error), then
    /// failing with [`LlmError::Overloaded`] ("script exhausted").
    pub fn queue(name: impl Into<String>, answers: Vec<Result<String, LlmError>>) -> Self {
        let answers = Mutex::new(VecDeque::from(answers));
        Self::new(name, move |_| {
            let next = answers.lock().ok().and_then(|mut q| q.pop_front());
            match next {
                Some(Ok(text)) => Ok(Message::ai(text)),
                Some(Err(e)) => Err(e),
                None => Err(LlmError::Overloaded("script exhausted".into())),
            }
        })
    }

    /// Waits `delay` before each answer (for timeouts and parallel calls).
    #[must_use]
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// How many calls it has answered (or is answering).
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// A shared handle on the call count, readable after the model moved away.
    pub fn call_counter(&self) -> Arc<AtomicUsize> {
        self.calls.clone()
    }
}

#[async_trait]
impl ChatModel for ScriptedModel {
    fn model_name(&self) -> String {
        self.name.clone()
    }

    async fn invoke(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
        _sink: Option<TokenSink>,
    ) -> Result<Message, LlmError> {
        let index = self.calls.fetch_add(1, Ordering::SeqCst);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        (self.script)(ScriptCall {
            index,
            messages,
            options,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn a_queue_answers_in_order_then_is_exhausted() {
        let m = ScriptedModel::queue(
            "q",
            vec![Ok("one".into()), Err(LlmError::Backend("down".into()))],
        );
        let opts = GenerateOptions::default();
        let ask = [Message::human("hi")];
        assert_eq!(m.invoke(&ask, &opts, None).await.unwrap().content, "one");
        assert!(matches!(
            m.invoke(&ask, &opts, None).await,
            Err(LlmError::Backend(_))
        ));
        assert!(matches!(
            m.invoke(&ask, &opts, None).await,
            Err(LlmError::Overloaded(_))
        ));
        assert_eq!(m.calls(), 3);
    }
}
