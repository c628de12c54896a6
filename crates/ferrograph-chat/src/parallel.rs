//! Running model sub-calls in parallel and merging their answers into a typed result.
//!
//! - [`parallel!`](crate::parallel): awaits several futures at once and builds a struct from
//!   their results, one field per future; the first error cancels the others.
//! - [`invoke_all`]: one model, several requests, answers in request order.
//!
//! ```
//! use ferrograph_chat::{parallel, LlmError};
//!
//! struct Draft { summary: String, risks: Vec<String>, score: u32 }
//!
//! # async fn demo() -> Result<(), LlmError> {
//! async fn summary() -> Result<String, LlmError> { Ok("ok".into()) }
//! async fn risks() -> Result<Vec<String>, LlmError> { Ok(vec![]) }
//! let draft: Draft = parallel!(Draft {
//!     summary: summary(),
//!     risks: risks(),
//!     score: async { Ok::<u32, LlmError>(3) },
//! })
//! .await?;
//! assert_eq!(draft.score, 3);
//! # Ok(()) }
//! ```

use crate::error::LlmError;
use crate::model::ChatModel;
use crate::options::GenerateOptions;
use ferrograph_core::message::Message;

/// Awaits every `field: future` pair concurrently and, when all succeed, builds
/// `Type { field: value, ... }`; the first error is returned (and the other futures are
/// dropped). Evaluates to a future of `Result<Type, E>`, where every future's error converts
/// into `E` (`LlmError` unless the result type says otherwise).
#[macro_export]
macro_rules! parallel {
    ($($ty:ident)::+ { $($field:ident : $fut:expr),+ $(,)? }) => {
        async {
            $crate::__private::futures::try_join!($($fut),+)
                .map(|($($field,)+)| $($ty)::+ { $($field),+ })
        }
    };
}

/// Invokes `model` on each `(messages, options)` request concurrently; returns the answers in
/// request order, or the first error.
pub async fn invoke_all<M: ChatModel + ?Sized>(
    model: &M,
    requests: &[(Vec<Message>, GenerateOptions)],
) -> Result<Vec<Message>, LlmError> {
    futures::future::try_join_all(
        requests
            .iter()
            .map(|(messages, options)| model.invoke(messages, options, None)),
    )
    .await
}
