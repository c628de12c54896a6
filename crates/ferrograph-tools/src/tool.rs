//! The [`Tool`] trait, its context and errors, and [`FnTool`] (an async fn as a tool).

use async_trait::async_trait;
use ferrograph_core::message::ToolSpec;
use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Boxed error source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a tool call (or registering a tool) failed.
///
/// When a tool runs inside the [tool node](crate::ToolExecutor) these errors do not fail the
/// graph: they become tool-result messages with status `error` (or `timeout`), so that the
/// model can read what went wrong and try again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The arguments do not match the tool's schema.
    #[error("invalid arguments for tool `{tool}`: {message}")]
    InvalidArguments {
        /// The tool.
        tool: String,
        /// What is wrong with them.
        message: String,
        /// The decoding error, when there is one.
        #[source]
        source: Option<serde_json::Error>,
    },
    /// No tool of this name is registered.
    #[error("unknown tool `{name}`; available tools: {available}")]
    UnknownTool {
        /// The name asked for.
        name: String,
        /// Comma-separated names of the registered tools.
        available: String,
    },
    /// A tool of this name is already registered.
    #[error("a tool named `{0}` is already registered")]
    DuplicateName(String),
    /// The tool name is not usable (empty, or characters models cannot call).
    #[error("invalid tool name `{0}`: use 1-64 characters among a-z, A-Z, 0-9, `_` and `-`")]
    InvalidName(String),
    /// The tool ran past its timeout.
    #[error("tool `{tool}` timed out after {timeout:?}")]
    Timeout {
        /// The tool.
        tool: String,
        /// Its timeout.
        timeout: Duration,
    },
    /// A path argument points outside the tool's root directory (`..` or a symlink leading
    /// out), or is otherwise refused.
    #[error("access to `{path}` denied: {reason}")]
    Denied {
        /// The path as given.
        path: String,
        /// Why.
        reason: String,
    },
    /// A limit (file size, result count, pattern size) was exceeded.
    #[error("limit exceeded: {0}")]
    Limit(String),
    /// Reading the file system failed.
    #[error("io error on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The tool failed.
    #[error("{message}")]
    Failed {
        /// What went wrong.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
}

impl ToolError {
    /// A failure with a message.
    pub fn failed(message: impl Into<String>) -> Self {
        ToolError::Failed {
            message: message.into(),
            source: None,
        }
    }

    /// A failure wrapping an error.
    pub fn from_error(err: impl Into<BoxError>) -> Self {
        let err = err.into();
        ToolError::Failed {
            message: err.to_string(),
            source: Some(err),
        }
    }

    /// Arguments that do not match the schema.
    pub fn invalid_arguments(tool: impl Into<String>, message: impl Into<String>) -> Self {
        ToolError::InvalidArguments {
            tool: tool.into(),
            message: message.into(),
            source: None,
        }
    }

    /// Short name of the error kind, recorded in the tool result's metadata.
    pub fn kind(&self) -> &'static str {
        match self {
            ToolError::InvalidArguments { .. } => "invalid_arguments",
            ToolError::UnknownTool { .. } => "unknown_tool",
            ToolError::DuplicateName(_) => "duplicate_name",
            ToolError::InvalidName(_) => "invalid_name",
            ToolError::Timeout { .. } => "timeout",
            ToolError::Denied { .. } => "denied",
            ToolError::Limit(_) => "limit",
            ToolError::Io { .. } => "io",
            ToolError::Failed { .. } => "failed",
        }
    }
}

impl From<String> for ToolError {
    fn from(s: String) -> Self {
        ToolError::failed(s)
    }
}

impl From<&str> for ToolError {
    fn from(s: &str) -> Self {
        ToolError::failed(s)
    }
}

impl From<BoxError> for ToolError {
    fn from(e: BoxError) -> Self {
        ToolError::from_error(e)
    }
}

impl From<std::io::Error> for ToolError {
    fn from(e: std::io::Error) -> Self {
        ToolError::from_error(e)
    }
}

impl From<serde_json::Error> for ToolError {
    fn from(e: serde_json::Error) -> Self {
        ToolError::from_error(e)
    }
}

impl From<std::convert::Infallible> for ToolError {
    fn from(e: std::convert::Infallible) -> Self {
        match e {}
    }
}

/// What a tool call knows about where it runs.
#[derive(Clone, Debug, Default)]
pub struct ToolContext {
    /// Id of the tool call being answered.
    pub call_id: String,
    /// Name of the tool being called.
    pub tool: String,
    /// Graph node that runs the tool ("" outside a graph).
    pub node: String,
    /// Thread of the run, when it has one.
    pub thread_id: Option<String>,
    /// The timeout this call runs under.
    pub timeout: Option<Duration>,
    /// The long-term store of the graph that runs the tool, if it has one.
    pub store: Option<std::sync::Arc<dyn ferrograph_core::Store>>,
}

impl ToolContext {
    /// A context for calling a tool directly (tests, scripts).
    pub fn detached(tool: impl Into<String>) -> Self {
        ToolContext {
            call_id: "detached".into(),
            tool: tool.into(),
            ..ToolContext::default()
        }
    }
}

/// A tool a model can call: a name, a description, the JSON Schema of its arguments, and an
/// async call from JSON arguments to a JSON result.
///
/// A string result is sent to the model as is; any other JSON value as its JSON text.
/// Implement it by hand, wrap an async closure with [`FnTool`], or put `#[tool]` on an async
/// fn (see [`macro@crate::tool`]).
#[async_trait]
pub trait Tool: Send + Sync {
    /// Name the model calls it by (unique within a registry).
    fn name(&self) -> &str;

    /// What it does, for the model.
    fn description(&self) -> &str;

    /// JSON Schema of the arguments object.
    fn parameters(&self) -> Value;

    /// Runs the tool.
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError>;

    /// The tool as offered to a model.
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(self.name(), self.description(), self.parameters())
    }
}

#[async_trait]
impl<T: Tool + ?Sized> Tool for Arc<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn description(&self) -> &str {
        (**self).description()
    }
    fn parameters(&self) -> Value {
        (**self).parameters()
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        (**self).call(args, ctx).await
    }
}

/// The JSON Schema of `T` as a tool's parameters: an object schema without the `$schema`
/// marker (some servers reject it).
pub fn parameters_schema<T: JsonSchema>() -> Value {
    let mut v = serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut v {
        map.remove("$schema");
        if !map.contains_key("type") && !map.contains_key("$ref") {
            map.insert("type".into(), Value::String("object".into()));
        }
    }
    v
}

/// Decodes JSON arguments as `A`; [`ToolError::InvalidArguments`] when they do not match.
/// `null` (no arguments) is read as an empty object.
pub fn decode_args<A: DeserializeOwned>(tool: &str, args: Value) -> Result<A, ToolError> {
    let args = match args {
        Value::Null => Value::Object(Default::default()),
        // Some models send the arguments object as a JSON string.
        Value::String(s) if s.trim_start().starts_with('{') => {
            serde_json::from_str(&s).map_err(|e| ToolError::InvalidArguments {
                tool: tool.to_string(),
                message: e.to_string(),
                source: Some(e),
            })?
        }
        other => other,
    };
    serde_json::from_value(args).map_err(|e| ToolError::InvalidArguments {
        tool: tool.to_string(),
        message: e.to_string(),
        source: Some(e),
    })
}

/// Converts a tool's typed return value to JSON.
pub fn encode_output<O: Serialize>(out: &O) -> Result<Value, ToolError> {
    serde_json::to_value(out).map_err(ToolError::from_error)
}

type CallFn =
    Arc<dyn Fn(Value, ToolContext) -> BoxFuture<'static, Result<Value, ToolError>> + Send + Sync>;

/// An async function with a typed argument struct, as a [`Tool`].
///
/// ```
/// use ferrograph_tools::{FnTool, Tool, ToolContext, ToolError};
/// use schemars::JsonSchema;
/// use serde::Deserialize;
///
/// #[derive(Deserialize, JsonSchema)]
/// struct AddArgs {
///     /// First term.
///     a: i64,
///     /// Second term.
///     b: i64,
/// }
///
/// # tokio_test_block(async {
/// let add = FnTool::new("add", "Adds two integers.", |args: AddArgs| async move {
///     Ok::<_, ToolError>(args.a + args.b)
/// });
/// let out = add.call(serde_json::json!({"a": 2, "b": 3}), &ToolContext::detached("add")).await;
/// assert_eq!(out.unwrap(), serde_json::json!(5));
/// # });
/// # fn tokio_test_block(f: impl std::future::Future<Output = ()>) {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone)]
pub struct FnTool {
    name: String,
    description: String,
    parameters: Value,
    call: CallFn,
}

impl fmt::Debug for FnTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnTool")
            .field("name", &self.name)
            .field("description", &self.description)
            .finish()
    }
}

impl FnTool {
    /// A tool running `f` on arguments decoded as `A` (its JSON Schema is the tool's
    /// parameters). `f` returns any serializable value, or an error convertible to
    /// [`ToolError`].
    pub fn new<A, F, Fut, O, E>(
        name: impl Into<String>,
        description: impl Into<String>,
        f: F,
    ) -> Self
    where
        A: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, E>> + Send + 'static,
        O: Serialize,
        E: Into<ToolError>,
    {
        Self::with_context(name, description, move |args: A, _ctx: ToolContext| f(args))
    }

    /// Like [`FnTool::new`], with the call's [`ToolContext`] passed to `f`.
    pub fn with_context<A, F, Fut, O, E>(
        name: impl Into<String>,
        description: impl Into<String>,
        f: F,
    ) -> Self
    where
        A: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(A, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, E>> + Send + 'static,
        O: Serialize,
        E: Into<ToolError>,
    {
        let name = name.into();
        let tool_name = name.clone();
        let f = Arc::new(f);
        let call: CallFn = Arc::new(move |args: Value, ctx: ToolContext| {
            let decoded = decode_args::<A>(&tool_name, args);
            let f = f.clone();
            Box::pin(async move {
                let out = f(decoded?, ctx).await.map_err(Into::into)?;
                encode_output(&out)
            })
        });
        FnTool {
            name,
            description: description.into(),
            parameters: parameters_schema::<A>(),
            call,
        }
    }

    /// Replaces the description.
    #[must_use]
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }
}

#[async_trait]
impl Tool for FnTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        self.parameters.clone()
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        (self.call)(args, ctx.clone()).await
    }
}

/// The text a tool result is sent to the model as: a string as is, anything else as JSON.
pub fn output_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
