//! Tools for ferrograph agents.
//!
//! - [`Tool`]: a name, a description, the JSON Schema of its arguments (from `schemars`) and
//!   an async call from JSON arguments to a JSON result. [`FnTool`] wraps an async closure
//!   over a typed argument struct; the [`tool`] attribute does the same for an async fn.
//! - [`ToolRegistry`]: tools by unique name; [`ToolRegistry::specs`] is what a model is bound
//!   to (`GenerateOptions::tools`).
//! - [`ToolExecutor`]: runs the tool calls of the last AI message concurrently, each with its
//!   own timeout, turning errors, timeouts, unknown tools and bad arguments into tool-result
//!   messages (never failing the graph), recording duration and status, and emitting
//!   `tool_start` / `tool_end` events. [`ToolExecutor::node`] is the graph node;
//!   [`tools_condition`] the router that sends the graph to it.
//! - [`builtin`]: `read_file`, `list_dir` and `grep` confined to a root directory.
//!
//! ```
//! use ferrograph_tools::{tool, ToolError, ToolRegistry};
//! use schemars::JsonSchema;
//! use serde::Deserialize;
//!
//! #[derive(Deserialize, JsonSchema)]
//! struct WeatherArgs {
//!     /// City name.
//!     city: String,
//! }
//!
//! /// Current weather in a city.
//! #[tool]
//! async fn weather(args: WeatherArgs) -> Result<String, ToolError> {
//!     Ok(format!("sunny in {}", args.city))
//! }
//!
//! let mut registry = ToolRegistry::new();
//! registry.register(weather_tool()).unwrap();
//! assert_eq!(registry.list()[0].description, "Current weather in a city.");
//! assert!(registry.register(weather_tool()).is_err()); // duplicate name
//! ```

pub mod builtin;
pub mod node;
pub mod registry;
pub mod tool;

pub use node::{
    has_tool_calls, pending_tool_calls, tools_condition, HasMessages, ToolExecutor,
    DEFAULT_TOOL_TIMEOUT,
};
pub use registry::{valid_tool_name, ToolInfo, ToolRegistry};
pub use tool::{
    decode_args, encode_output, output_text, parameters_schema, BoxError, FnTool, Tool,
    ToolContext, ToolError,
};

/// Turns an async fn into a tool.
///
/// The fn takes a typed argument struct (`Deserialize + JsonSchema`) and optionally a
/// `&ToolContext` (or `ToolContext`) second, and returns `Result<T, E>` with `T: Serialize`
/// and `E: Into<ToolError>`. The fn stays as written; the attribute adds `NAME_tool()`
/// returning an [`FnTool`] named after the fn, described by its doc comment. Override either
/// with `#[tool(name = "...", description = "...")]`.
pub use ferrograph_tools_macros::tool;

#[doc(hidden)]
pub mod __private {
    pub use ferrograph_core::message::Message;
}
