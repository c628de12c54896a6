//! One retry policy for every kind of failure: a node's ([`NodeError`]) and a model call's
//! (`ferrograph_chat::LlmError`). What differs between error types (which errors are
//! transient, which may never be retried, a server's requested wait, the default waits) is
//! the [`Retryable`] trait; the attempts, backoff, jitter and `Retry-After` rules are
//! [`Policy`]'s, written once. [`RetryPolicy`] is the policy of nodes; `ferrograph_chat`'s
//! `RetryPolicy` the policy of model calls.

use crate::node::NodeError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// What a [`Policy`] needs to know about an error type.
pub trait Retryable {
    /// The first wait of the default policy.
    const DEFAULT_INITIAL_BACKOFF: Duration;
    /// The cap of computed waits in the default policy.
    const DEFAULT_MAX_BACKOFF: Duration;

    /// Whether the default policy retries this error (a transient failure).
    fn is_retryable(&self) -> bool;

    /// Whether no policy may retry this error, whatever its predicate says (an interrupt is
    /// a question for a person, not a failure).
    fn never_retry(&self) -> bool {
        false
    }

    /// A wait the failure itself asks for (a server's `Retry-After`).
    fn retry_after(&self) -> Option<Duration> {
        None
    }
}

impl Retryable for NodeError {
    const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(100);
    const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(10);

    fn is_retryable(&self) -> bool {
        NodeError::is_retryable(self)
    }

    fn never_retry(&self) -> bool {
        self.is_interrupt()
    }
}

/// Which errors a [`Policy`] retries.
pub type RetryPredicate<E> = Arc<dyn Fn(&E) -> bool + Send + Sync>;

/// How often and how patiently a failing node is tried again.
pub type RetryPolicy = Policy<NodeError>;

/// How many times and how patiently a failing call (with errors of type `E`) is tried again.
pub struct Policy<E> {
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
    /// The longest wait an error may ask for ([`Retryable::retry_after`]): an error
    /// asking for more ends the retries at once (so that a fallback can take over).
    pub max_retry_after: Duration,
    /// Which errors to retry; by default [`Retryable::is_retryable`].
    pub retry_on: RetryPredicate<E>,
}

impl<E> Clone for Policy<E> {
    fn clone(&self) -> Self {
        Policy {
            max_attempts: self.max_attempts,
            initial_backoff: self.initial_backoff,
            multiplier: self.multiplier,
            max_backoff: self.max_backoff,
            jitter: self.jitter,
            max_retry_after: self.max_retry_after,
            retry_on: Arc::clone(&self.retry_on),
        }
    }
}

impl<E> fmt::Debug for Policy<E> {
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

impl<E: Retryable + 'static> Default for Policy<E> {
    /// Three attempts, waits from the error type's default doubling up to its cap, with
    /// jitter; `Retry-After` waits honoured up to 60 s.
    fn default() -> Self {
        Policy {
            max_attempts: 3,
            initial_backoff: E::DEFAULT_INITIAL_BACKOFF,
            multiplier: 2.0,
            max_backoff: E::DEFAULT_MAX_BACKOFF,
            jitter: true,
            max_retry_after: Duration::from_secs(60),
            retry_on: Arc::new(E::is_retryable),
        }
    }
}

impl<E: Retryable + 'static> Policy<E> {
    /// No retries.
    pub fn none() -> Self {
        Self::attempts(1)
    }

    /// `max_attempts` attempts (at least 1) with the default backoff.
    pub fn attempts(max_attempts: u32) -> Self {
        Policy {
            max_attempts: max_attempts.max(1),
            ..Self::default()
        }
    }
}

impl<E: Retryable> Policy<E> {
    /// Sets the first wait.
    #[must_use]
    pub fn with_backoff(mut self, initial: Duration) -> Self {
        self.initial_backoff = initial;
        self
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

    /// Sets the longest wait an error may ask for.
    #[must_use]
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = max;
        self
    }

    /// Retries only errors for which `f` is true (never those
    /// [`Retryable::never_retry`] rules out).
    #[must_use]
    pub fn retry_on(mut self, f: impl Fn(&E) -> bool + Send + Sync + 'static) -> Self {
        self.retry_on = Arc::new(f);
        self
    }

    /// Whether attempt `attempt` (from 1), which failed with `err`, should be followed by
    /// another.
    pub fn should_retry(&self, attempt: u32, err: &E) -> bool {
        attempt < self.max_attempts && !err.never_retry() && (self.retry_on)(err)
    }

    /// The computed wait after failed attempt `attempt` (from 1), before jitter.
    pub fn backoff_for(&self, attempt: u32) -> Duration {
        exponential_backoff(
            self.initial_backoff,
            self.multiplier,
            self.max_backoff,
            attempt,
        )
    }

    /// How long to wait after `err` ended attempt `attempt`, or `None` to stop (attempts
    /// used up, an error not to retry, or a requested wait longer than allowed).
    pub fn delay_after(&self, attempt: u32, err: &E) -> Option<Duration> {
        if !self.should_retry(attempt, err) {
            return None;
        }
        if let Some(wait) = err.retry_after() {
            return (wait <= self.max_retry_after).then_some(wait);
        }
        let base = self.backoff_for(attempt);
        Some(if self.jitter { jittered(base) } else { base })
    }
}

/// The wait after failed attempt `attempt` (from 1): `initial × multiplier^(attempt − 1)`,
/// capped at `max` (a multiplier below 1 counts as 1).
pub fn exponential_backoff(
    initial: Duration,
    multiplier: f64,
    max: Duration,
    attempt: u32,
) -> Duration {
    let exp = multiplier
        .max(1.0)
        .powi(attempt.saturating_sub(1).min(64) as i32);
    let secs = (initial.as_secs_f64() * exp).min(max.as_secs_f64());
    Duration::from_secs_f64(secs.max(0.0))
}

/// `wait` scaled by a random factor between 0.5 and 1, so that callers failing together do
/// not retry together.
pub fn jittered(wait: Duration) -> Duration {
    use rand::Rng;
    wait.mul_f64(rand::thread_rng().gen_range(0.5..=1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            jitter: false,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(35),
            ..RetryPolicy::default()
        };
        assert_eq!(
            p.delay_after(1, &NodeError::failed("x")),
            Some(Duration::from_millis(10))
        );
        assert_eq!(p.backoff_for(2), Duration::from_millis(20));
        assert_eq!(p.backoff_for(3), Duration::from_millis(35));
        let j = RetryPolicy::default().with_backoff(Duration::from_millis(100));
        for _ in 0..50 {
            let d = j
                .delay_after(1, &NodeError::failed("x"))
                .unwrap_or_default();
            assert!(d >= Duration::from_millis(50) && d <= Duration::from_millis(100));
        }
        assert!(p.should_retry(1, &NodeError::failed("x")));
        assert!(!p.should_retry(3, &NodeError::failed("x")));
        assert!(!p.should_retry(1, &NodeError::fatal("x")));
        assert_eq!(p.delay_after(3, &NodeError::failed("x")), None);
    }

    #[test]
    fn interrupts_are_never_retried() {
        let p = RetryPolicy::attempts(5).retry_on(|_| true);
        assert!(p.should_retry(1, &NodeError::fatal("x")));
        assert!(!p.should_retry(1, &NodeError::Interrupted(Vec::new())));
    }
}
