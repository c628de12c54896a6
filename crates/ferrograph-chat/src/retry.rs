//! Retrying model calls: [`RetryPolicy`] and [`RetryModel`] (see [`ChatModelExt::with_retry`]).
//!
//! Only errors that [`LlmError::is_retryable`] calls transient are retried (rate limits,
//! overload, timeouts, failed connections); schema and validation errors return at once.
//! Waits grow exponentially with jitter; a server's `Retry-After` is honoured.
//!
//! [`ChatModelExt::with_retry`]: crate::ChatModelExt::with_retry

use crate::error::LlmError;
use crate::model::ChatModel;
use crate::options::GenerateOptions;
use crate::sink::TokenSink;
use async_trait::async_trait;
use ferrograph_core::message::Message;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Which errors a [`RetryPolicy`] retries.
pub type RetryPredicate = Arc<dyn Fn(&LlmError) -> bool + Send + Sync>;

/// How many times and how patiently a failing model call is tried again.
#[derive(Clone)]
pub struct RetryPolicy {
    /// Total attempts, the first included (1 means no retry).
    pub max_attempts: u32,
    /// Wait before the second attempt.
    pub initial_backoff: Duration,
    /// Growth factor of the wait per attempt.
    pub multiplier: f64,
    /// Upper bound of a computed wait.
    pub max_backoff: Duration,
    /// Randomize each computed wait between 50% and 100% of its value.
    pub jitter: bool,
    /// The longest `Retry-After` honoured: a server asking for a longer wait makes the call
    /// fail at once with its error (so that a fallback can take over).
    pub max_retry_after: Duration,
    /// Which errors to retry; by default [`LlmError::is_retryable`].
    pub retry_on: RetryPredicate,
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("initial_backoff", &self.initial_backoff)
            .field("multiplier", &self.multiplier)
            .field("max_backoff", &self.max_backoff)
            .field("jitter", &self.jitter)
            .field("max_retry_after", &self.max_retry_after)
            .finish()
    }
}

impl Default for RetryPolicy {
    /// Three attempts, waits from 500 ms doubling up to 20 s with jitter, `Retry-After`
    /// honoured up to 60 s.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(500),
            multiplier: 2.0,
            max_backoff: Duration::from_secs(20),
            jitter: true,
            max_retry_after: Duration::from_secs(60),
            retry_on: Arc::new(LlmError::is_retryable),
        }
    }
}

impl RetryPolicy {
    /// `max_attempts` attempts (at least 1) with the default backoff.
    pub fn attempts(max_attempts: u32) -> Self {
        RetryPolicy {
            max_attempts: max_attempts.max(1),
            ..Self::default()
        }
    }

    /// Sets the first wait and the cap of computed waits.
    #[must_use]
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }

    /// Turns jitter on or off.
    #[must_use]
    pub fn jitter(mut self, on: bool) -> Self {
        self.jitter = on;
        self
    }

    /// Sets the longest `Retry-After` honoured.
    #[must_use]
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = max;
        self
    }

    /// Retries only errors for which `f` is true. Errors that are not
    /// [retryable](LlmError::is_retryable) are never retried, whatever `f` says.
    #[must_use]
    pub fn retry_on(mut self, f: impl Fn(&LlmError) -> bool + Send + Sync + 'static) -> Self {
        self.retry_on = Arc::new(f);
        self
    }

    /// The computed wait after failed attempt number `attempt` (from 1), before jitter.
    pub fn backoff_for(&self, attempt: u32) -> Duration {
        ferrograph_core::node::exponential_backoff(
            self.initial_backoff,
            self.multiplier,
            self.max_backoff,
            attempt,
        )
    }

    /// How long to wait after `error` ended attempt `attempt`, or `None` to stop (the error
    /// is not retryable, attempts are used up, or the server asks for too long a wait).
    pub fn delay_after(&self, attempt: u32, error: &LlmError) -> Option<Duration> {
        if attempt >= self.max_attempts || !error.is_retryable() || !(self.retry_on)(error) {
            return None;
        }
        if let Some(after) = error.retry_after() {
            return (after <= self.max_retry_after).then_some(after);
        }
        let base = self.backoff_for(attempt);
        Some(if self.jitter {
            ferrograph_core::node::jittered(base)
        } else {
            base
        })
    }

    /// Runs `op` (called with the attempt number, from 1) until it succeeds, fails with an
    /// error not worth retrying, or runs out of attempts; returns the last error then.
    ///
    /// Works for any call returning `Result<T, LlmError>`, for example a structured-output
    /// call, whose schema errors are not retried.
    pub async fn run<T, F, Fut>(&self, mut op: F) -> Result<T, LlmError>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, LlmError>>,
    {
        let mut attempt = 1u32;
        loop {
            match op(attempt).await {
                Ok(v) => return Ok(v),
                Err(e) => match self.delay_after(attempt, &e) {
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
        let answer = self
            .policy
            .run(|attempt| {
                attempts = attempt;
                self.model.invoke(messages, options, sink.clone())
            })
            .await?;
        Ok(answer.with_metadata("attempts", attempts.to_string()))
    }
}
