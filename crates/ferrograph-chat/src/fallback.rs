//! Falling back to other models: [`FallbackModel`], and [`ChatModelExt`], which adds
//! `with_retry` and `with_fallbacks` to every chat model.
//!
//! ```
//! use ferrograph_chat::{ChatModel, ChatModelExt, RetryPolicy};
//! # fn demo(primary: impl ChatModel + 'static, backup: impl ChatModel + 'static) {
//! // Retry the primary on rate limits (never on schema or validation errors), then try the
//! // backup once.
//! let model = primary
//!     .with_retry(RetryPolicy::attempts(3))
//!     .with_fallbacks([backup]);
//! # }
//! ```

use crate::error::LlmError;
use crate::model::ChatModel;
use crate::options::GenerateOptions;
use crate::retry::{RetryModel, RetryPolicy};
use crate::sink::TokenSink;
use async_trait::async_trait;
use ferrograph_core::message::Message;
use std::fmt;
use std::sync::Arc;

/// Which errors of a model make a [`FallbackModel`] try the next one.
pub type FallbackPredicate = Arc<dyn Fn(&LlmError) -> bool + Send + Sync>;

/// Whether an error is worth trying another model for: everything except an invalid request
/// ([`LlmError::Validation`]) or configuration, which another model would refuse too.
pub fn default_fallback_on(error: &LlmError) -> bool {
    !matches!(error, LlmError::Validation(_) | LlmError::Config(_))
}

/// A model that, when its primary fails, tries each fallback once, in order, and returns the
/// first answer (or the last error). Retries belong to the models it wraps: with
/// `primary.with_retry(policy).with_fallbacks([backup])` the fallback runs after the
/// primary's retries are exhausted.
///
/// The answer's metadata records `fallback_index` (0 for the primary) when a fallback
/// answered.
#[derive(Clone)]
pub struct FallbackModel {
    models: Vec<Arc<dyn ChatModel>>,
    fallback_on: FallbackPredicate,
}

impl fmt::Debug for FallbackModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FallbackModel")
            .field(
                "models",
                &self
                    .models
                    .iter()
                    .map(|m| m.model_name())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl FallbackModel {
    /// `primary`, then each of `fallbacks`.
    pub fn new(
        primary: Arc<dyn ChatModel>,
        fallbacks: impl IntoIterator<Item = Arc<dyn ChatModel>>,
    ) -> Self {
        let mut models = vec![primary];
        models.extend(fallbacks);
        FallbackModel {
            models,
            fallback_on: Arc::new(default_fallback_on),
        }
    }

    /// Falls back only on errors for which `f` is true.
    #[must_use]
    pub fn fallback_on(mut self, f: impl Fn(&LlmError) -> bool + Send + Sync + 'static) -> Self {
        self.fallback_on = Arc::new(f);
        self
    }

    /// The models, primary first.
    pub fn models(&self) -> &[Arc<dyn ChatModel>] {
        &self.models
    }
}

#[async_trait]
impl ChatModel for FallbackModel {
    fn model_name(&self) -> String {
        self.models
            .first()
            .map(|m| m.model_name())
            .unwrap_or_default()
    }

    async fn invoke(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
        sink: Option<TokenSink>,
    ) -> Result<Message, LlmError> {
        let mut last = None;
        for (i, model) in self.models.iter().enumerate() {
            match model.invoke(messages, options, sink.clone()).await {
                Ok(answer) if i == 0 => return Ok(answer),
                Ok(answer) => return Ok(answer.with_metadata("fallback_index", i.to_string())),
                Err(e) => {
                    let go_on = (self.fallback_on)(&e);
                    if i + 1 < self.models.len() && go_on {
                        tracing::warn!(model = %model.model_name(), error = %e, "model failed; trying the next fallback");
                    }
                    if !go_on {
                        return Err(e);
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| LlmError::Config("a fallback chain has no model".into())))
    }
}

/// Composition methods for every [`ChatModel`].
pub trait ChatModelExt: ChatModel + Sized + 'static {
    /// This model with failed calls retried by `policy` (see [`RetryPolicy`]).
    fn with_retry(self, policy: RetryPolicy) -> RetryModel<Self> {
        RetryModel::new(self, policy)
    }

    /// This model, then each of `fallbacks` once when it fails (see [`FallbackModel`]).
    fn with_fallbacks<I, F>(self, fallbacks: I) -> FallbackModel
    where
        I: IntoIterator<Item = F>,
        F: ChatModel + 'static,
    {
        FallbackModel::new(
            Arc::new(self),
            fallbacks
                .into_iter()
                .map(|f| Arc::new(f) as Arc<dyn ChatModel>),
        )
    }

    /// This model as a shared trait object.
    fn boxed(self) -> Arc<dyn ChatModel> {
        Arc::new(self)
    }
}

impl<M: ChatModel + Sized + 'static> ChatModelExt for M {}
