//! [`ToolRegistry`]: the tools an agent may call, by name.

use crate::tool::{Tool, ToolError};
use ferrograph_core::message::ToolSpec;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// A registered tool as listed: its name, description and argument schema.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolInfo {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// JSON Schema of the arguments.
    pub schema: serde_json::Value,
}

/// The tools an agent may call, in registration order, with unique names. Cheap to clone
/// (tools are shared).
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: Vec<Arc<dyn Tool>>,
}

impl fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.tools.iter().map(|t| t.name().to_string()))
            .finish()
    }
}

/// Whether `name` is a name every tool-calling API accepts (`^[a-zA-Z0-9_-]{1,64}$`).
pub fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `tool`. A name that is already taken is [`ToolError::DuplicateName`]; a
    /// name models cannot call is [`ToolError::InvalidName`].
    pub fn register(&mut self, tool: impl Tool + 'static) -> Result<&mut Self, ToolError> {
        self.register_arc(Arc::new(tool))
    }

    /// Registers a shared tool (see [`ToolRegistry::register`]).
    pub fn register_arc(&mut self, tool: Arc<dyn Tool>) -> Result<&mut Self, ToolError> {
        let name = tool.name();
        if !valid_tool_name(name) {
            return Err(ToolError::InvalidName(name.to_string()));
        }
        if self.get(name).is_some() {
            return Err(ToolError::DuplicateName(name.to_string()));
        }
        self.tools.push(tool);
        Ok(self)
    }

    /// Builder form of [`ToolRegistry::register`].
    pub fn with(mut self, tool: impl Tool + 'static) -> Result<Self, ToolError> {
        self.register(tool)?;
        Ok(self)
    }

    /// The tool named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.iter().find(|t| t.name() == name).cloned()
    }

    /// The tool named `name`, or [`ToolError::UnknownTool`] listing the available names.
    pub fn require(&self, name: &str) -> Result<Arc<dyn Tool>, ToolError> {
        self.get(name).ok_or_else(|| ToolError::UnknownTool {
            name: name.to_string(),
            available: self.names().join(", "),
        })
    }

    /// Names, in registration order.
    pub fn names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.name().to_string()).collect()
    }

    /// Every tool's name, description and argument schema, in registration order.
    pub fn list(&self) -> Vec<ToolInfo> {
        self.tools
            .iter()
            .map(|t| ToolInfo {
                name: t.name().to_string(),
                description: t.description().to_string(),
                schema: t.parameters(),
            })
            .collect()
    }

    /// The tools as offered to a model (`GenerateOptions::tools`).
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|t| t.spec()).collect()
    }

    /// A registry with only the named tools (unknown names are [`ToolError::UnknownTool`]).
    pub fn subset<I, S>(&self, names: I) -> Result<ToolRegistry, ToolError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut out = ToolRegistry::new();
        for name in names {
            out.register_arc(self.require(name.as_ref())?)?;
        }
        Ok(out)
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether there are no tools.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}
