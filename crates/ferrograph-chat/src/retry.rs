//! Retrying model calls: [`RetryPolicy`] and [`RetryModel`] (see [`ChatModelExt::with_retry`]).
//!
//! The policy is the workspace's one [`ferrograph_core::retry::Policy`], for [`LlmError`]:
//! only errors that [`LlmError::is_retryable`] calls transient are retried (rate limits,
//! overload, timeouts, failed connections), whatever the predicate says; schema and validation
//! errors return at once. Waits grow exponentially from 500 ms to 20 s with jitter; a
//! server's `Retry-After` is honoured up to `max_retry_after`.
//!
//! [`ChatModelExt::with_retry`]: crate::ChatModelExt::with_retry

use crate::error::LlmError;
use crate::model::ChatModel;
use crate::options::GenerateOptions;
use crate::sink::TokenSink;
use async_trait::async_trait;
use ferrograph_core::message::Message;
use ferrograph_core::Retryable;
use std::future::Future;
use std::time::Duration;

/// How many times and how patiently a failing model call is tried again.
pub type RetryPolicy = ferrograph_core::retry::Policy<LlmError>;

impl Retryable for LlmError {
    const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(500);
    const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(20);

    fn is_retryable(&self) -> bool {
        LlmError::is_retryable(self)
    }

    fn never_retry(&self) -> bool {
        !LlmError::is_retryable(self)
    }

    fn retry_after(&self) -> Option<Duration> {
        LlmError::retry_after(self)
    }
}

/// Runs `op` (called with the attempt number, from 1) under `policy` until it succeeds, fails
/// with an error not worth retrying, or runs out of attempts; returns the last error then.
///
/// Works for any call returning `Result<T, LlmError>`, for example a structured-output call,
/// whose schema errors are not retried.
pub async fn run_with_retry<T, F, Fut>(policy: &RetryPolicy, mut op: F) -> Result<T, LlmError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, LlmError>>,
{
    let mut attempt = 1u32;
    loop {
        match op(attempt).await {
            Ok(v) => return Ok(v),
            Err(e) => match policy.delay_after(attempt, &e) {
                Some(wait) => {
                    tracing::warn!(attempt, error = %e, wait_ms = wait.as_millis() as u64, "retrying model call");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                None => return Err(e),
            },
        }
    }
}

/// A chat model whose failed calls are retried by a [`RetryPolicy`]. The answer's metadata
/// records `attempts`.
///
/// Tokens streamed by a failed attempt have already reached the sink; a retried call streams
/// its answer again from the start.
#[derive(Clone, Debug)]
pub struct RetryModel<M> {
    model: M,
    policy: RetryPolicy,
}

impl<M> RetryModel<M> {
    /// `model` retried by `policy`.
    pub fn new(model: M, policy: RetryPolicy) -> Self {
        RetryModel { model, policy }
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The wrapped model.
    pub fn inner(&self) -> &M {
        &self.model
    }
}

#[async_trait]
impl<M: ChatModel> ChatModel for RetryModel<M> {
    fn model_name(&self) -> String {
        self.model.model_name()
    }

    async fn invoke(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
        sink: Option<TokenSink>,
    ) -> Result<Message, LlmError> {
        let mut attempts = 0;
        let answer = run_with_retry(&self.policy, |attempt| {
            attempts = attempt;
            self.model.invoke(messages, options, sink.clone())
        })
        .await?;
        Ok(answer.with_metadata("attempts", attempts.to_string()))
    }
}
