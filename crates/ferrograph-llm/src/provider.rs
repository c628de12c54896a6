//! Choosing the chat model from configuration: a local GGUF model or a remote
//! OpenAI-compatible server, so that a workflow switches between them with no code change.
//!
//! Environment (read by [`Provider::from_env`] and [`chat_model_from_env`]):
//!
//! | variable | meaning |
//! | --- | --- |
//! | `FERROGRAPH_PROVIDER` | `local` or `remote`; unset: remote when a base URL and model are set, else local |
//! | `FERROGRAPH_REMOTE_BASE_URL` (or `FERROGRAPH_BASE_URL`) | e.g. `http://127.0.0.1:8000/v1` |
//! | `FERROGRAPH_REMOTE_MODEL` | model name on the server |
//! | `FERROGRAPH_REMOTE_API_KEY_ENV` | variable holding the bearer token (default `FERROGRAPH_API_KEY`) |
//! | `FERROGRAPH_REMOTE_TIMEOUT_SECONDS` | total limit per call (default 120) |
//! | `FERROGRAPH_REMOTE_CONNECT_TIMEOUT_SECONDS` | connection limit (default 10) |
//! | `FERROGRAPH_DEFAULT_MODEL` | local model: a name from `models/models.toml` or a GGUF path |
//! | `FERROGRAPH_MODEL`, `FERROGRAPH_DEVICE` | see [`LocalChatModel::from_env`] |

use crate::error::LlmError;
use crate::options::{DeviceKind, LoadOptions};
use crate::{ChatModel, LocalChatModel};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The environment variable holding the bearer token when none is configured.
pub const DEFAULT_API_KEY_ENV: &str = "FERROGRAPH_API_KEY";

/// Where a remote OpenAI-compatible server is and how to call it.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// Base URL of the API, e.g. `http://127.0.0.1:8000/v1` (`/v1` is added when missing);
    /// requests go to `{base_url}/chat/completions`.
    pub base_url: String,
    /// Model name on the server.
    pub model: String,
    /// Environment variable holding the bearer token (default `FERROGRAPH_API_KEY`); no
    /// `Authorization` header is sent when it is unset or empty.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Total limit per call, in seconds (default 120), streaming included.
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Limit for opening the connection, in seconds (default 10).
    #[serde(default)]
    pub connect_timeout_seconds: Option<f64>,
    /// A bearer token given directly (takes precedence over `api_key_env`; never serialized).
    #[serde(skip)]
    pub api_key: Option<String>,
}

impl std::fmt::Debug for RemoteConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key_env", &self.api_key_env)
            .field("timeout_seconds", &self.timeout_seconds)
            .field("connect_timeout_seconds", &self.connect_timeout_seconds)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl RemoteConfig {
    /// A server at `base_url` serving `model`, with default timeouts and token variable.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        RemoteConfig {
            base_url: base_url.into(),
            model: model.into(),
            api_key_env: None,
            timeout_seconds: None,
            connect_timeout_seconds: None,
            api_key: None,
        }
    }

    /// Sets the total limit per call.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout_seconds = Some(timeout.as_secs_f64());
        self
    }

    /// Sets the connection limit.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout_seconds = Some(timeout.as_secs_f64());
        self
    }

    /// Sets the variable holding the bearer token.
    #[must_use]
    pub fn api_key_env(mut self, var: impl Into<String>) -> Self {
        self.api_key_env = Some(var.into());
        self
    }

    /// Sets the bearer token directly.
    #[must_use]
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// The total limit per call.
    pub fn total_timeout(&self) -> Duration {
        secs(self.timeout_seconds, 120.0)
    }

    /// The connection limit.
    pub fn connect_timeout_duration(&self) -> Duration {
        secs(self.connect_timeout_seconds, 10.0)
    }

    /// The bearer token: the one given, else the configured variable's value.
    pub fn bearer_token(&self) -> Option<String> {
        if let Some(k) = self.api_key.as_ref().filter(|k| !k.is_empty()) {
            return Some(k.clone());
        }
        let var = self.api_key_env.as_deref().unwrap_or(DEFAULT_API_KEY_ENV);
        std::env::var(var).ok().filter(|v| !v.trim().is_empty())
    }

    /// The chat-completions endpoint.
    pub fn endpoint(&self) -> String {
        let base = self.base_url.trim_end_matches('/');
        if base.ends_with("/v1") {
            format!("{base}/chat/completions")
        } else {
            format!("{base}/v1/chat/completions")
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), LlmError> {
        let bad = |m: String| Err(LlmError::Config(m));
        if !(self.base_url.starts_with("http://") || self.base_url.starts_with("https://")) {
            return bad(format!(
                "remote base URL `{}` must start with http:// or https://",
                self.base_url
            ));
        }
        if self.model.trim().is_empty() {
            return bad("the remote model name is empty".into());
        }
        for (what, v) in [
            ("timeout", self.timeout_seconds),
            ("connect timeout", self.connect_timeout_seconds),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0) {
                    return bad(format!(
                        "remote {what} must be a positive number of seconds"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A timeout in seconds from configuration; non-positive or non-finite values fall back to
/// `default`, and values beyond a year are taken as a year (`1e300` used to panic).
fn secs(v: Option<f64>, default: f64) -> Duration {
    let v = v.filter(|v| v.is_finite() && *v > 0.0).unwrap_or(default);
    Duration::from_secs_f64(v.clamp(0.0, 365.0 * 86_400.0))
}

/// Which chat model a workflow uses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "provider", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Provider {
    /// A GGUF model run on this machine.
    Local {
        /// A name from `models/models.toml` or a GGUF path; `None` for the default model
        /// (`FERROGRAPH_MODEL` or the manifest's SmolLM2).
        #[serde(default)]
        model: Option<String>,
        /// Device to run on.
        #[serde(default)]
        device: DeviceKind,
    },
    /// An OpenAI-compatible server (vLLM, llama.cpp server, Ollama, LiteLLM...).
    Remote(RemoteConfig),
}

impl Default for Provider {
    fn default() -> Self {
        Provider::Local {
            model: None,
            device: DeviceKind::Cpu,
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl Provider {
    /// The provider described by the `FERROGRAPH_*` environment (see the module docs).
    pub fn from_env() -> Result<Self, LlmError> {
        Self::from_lookup(env)
    }

    /// Like [`Provider::from_env`], reading variables through `get` (for tests and for
    /// configuration layers that merge files and flags).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, LlmError> {
        let base_url = get("FERROGRAPH_REMOTE_BASE_URL").or_else(|| get("FERROGRAPH_BASE_URL"));
        let model = get("FERROGRAPH_REMOTE_MODEL");
        let kind = get("FERROGRAPH_PROVIDER").map(|k| k.trim().to_ascii_lowercase());
        let remote = match kind.as_deref() {
            Some("remote") => true,
            Some("local") => false,
            None => base_url.is_some() && model.is_some(),
            Some(other) => {
                return Err(LlmError::Config(format!(
                    "FERROGRAPH_PROVIDER={other:?}: expected `local` or `remote`"
                )))
            }
        };
        if remote {
            let (Some(base_url), Some(model)) = (base_url, model) else {
                return Err(LlmError::Config(
                    "the remote provider needs FERROGRAPH_REMOTE_BASE_URL and \
                     FERROGRAPH_REMOTE_MODEL"
                        .into(),
                ));
            };
            let secs_of =
                |name: &str| match get(name) {
                    None => Ok(None),
                    Some(v) => v.trim().parse::<f64>().map(Some).map_err(|e| {
                        LlmError::Config(format!("{name}={v:?} is not a number: {e}"))
                    }),
                };
            let config = RemoteConfig {
                base_url,
                model,
                api_key_env: get("FERROGRAPH_REMOTE_API_KEY_ENV"),
                timeout_seconds: secs_of("FERROGRAPH_REMOTE_TIMEOUT_SECONDS")?,
                connect_timeout_seconds: secs_of("FERROGRAPH_REMOTE_CONNECT_TIMEOUT_SECONDS")?,
                api_key: None,
            };
            config.validate()?;
            return Ok(Provider::Remote(config));
        }
        let device = match get("FERROGRAPH_DEVICE") {
            Some(d) => d.parse()?,
            None => DeviceKind::Cpu,
        };
        Ok(Provider::Local {
            model: get("FERROGRAPH_DEFAULT_MODEL"),
            device,
        })
    }

    /// Builds the chat model (see [`chat_model_from_config`]).
    pub fn build(&self) -> Result<Arc<dyn ChatModel>, LlmError> {
        chat_model_from_config(self)
    }
}

/// Resolves a local model setting: a GGUF path, or a manifest name.
fn local_model_path(model: Option<&str>) -> Result<PathBuf, LlmError> {
    match model {
        None => crate::manifest::default_chat_model_path(),
        Some(m) => {
            let p = Path::new(m);
            if m.ends_with(".gguf") || p.exists() {
                if !p.exists() {
                    return Err(LlmError::ModelMissing {
                        path: p.to_path_buf(),
                        name: crate::manifest::name_for_path(p).unwrap_or_else(|| m.to_string()),
                    });
                }
                Ok(p.to_path_buf())
            } else {
                crate::manifest::Manifest::default_manifest()?.model_path(m)
            }
        }
    }
}

/// The chat model `provider` describes: a [`LocalChatModel`] (loaded lazily on the first
/// call) or, with the `remote` feature, a [`RemoteChatModel`](crate::remote::RemoteChatModel).
/// Without the feature a remote provider is [`LlmError::Config`].
pub fn chat_model_from_config(provider: &Provider) -> Result<Arc<dyn ChatModel>, LlmError> {
    match provider {
        Provider::Local { model, device } => {
            let path = local_model_path(model.as_deref())?;
            crate::engine::check_gguf_file(&path)?;
            let load = LoadOptions {
                device: *device,
                ..LoadOptions::default()
            };
            Ok(Arc::new(LocalChatModel::with_options(path, load)))
        }
        Provider::Remote(config) => remote_model(config),
    }
}

#[cfg(feature = "remote")]
fn remote_model(config: &RemoteConfig) -> Result<Arc<dyn ChatModel>, LlmError> {
    Ok(Arc::new(crate::remote::RemoteChatModel::new(
        config.clone(),
    )?))
}

#[cfg(not(feature = "remote"))]
fn remote_model(config: &RemoteConfig) -> Result<Arc<dyn ChatModel>, LlmError> {
    Err(LlmError::Config(format!(
        "a remote provider ({}) needs ferrograph-llm built with the `remote` feature",
        config.base_url
    )))
}

/// The chat model configured by the environment ([`Provider::from_env`]).
pub fn chat_model_from_env() -> Result<Arc<dyn ChatModel>, LlmError> {
    chat_model_from_config(&Provider::from_env()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn provider_from_environment() {
        assert_eq!(
            Provider::from_lookup(lookup(&[])).unwrap_or_else(|e| panic!("{e}")),
            Provider::default()
        );
        let remote = Provider::from_lookup(lookup(&[
            ("FERROGRAPH_REMOTE_BASE_URL", "http://127.0.0.1:9/v1"),
            ("FERROGRAPH_REMOTE_MODEL", "smol"),
            ("FERROGRAPH_REMOTE_TIMEOUT_SECONDS", "5"),
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        let Provider::Remote(cfg) = &remote else {
            panic!("{remote:?}")
        };
        assert_eq!(cfg.endpoint(), "http://127.0.0.1:9/v1/chat/completions");
        assert_eq!(cfg.total_timeout(), Duration::from_secs(5));
        // Explicitly local wins over a configured remote.
        let local = Provider::from_lookup(lookup(&[
            ("FERROGRAPH_PROVIDER", "local"),
            ("FERROGRAPH_REMOTE_BASE_URL", "http://127.0.0.1:9"),
            ("FERROGRAPH_REMOTE_MODEL", "smol"),
            ("FERROGRAPH_DEFAULT_MODEL", "x.gguf"),
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(local, Provider::Local { model: Some(ref m), .. } if m == "x.gguf"));
        assert!(matches!(
            Provider::from_lookup(lookup(&[("FERROGRAPH_PROVIDER", "remote")])),
            Err(LlmError::Config(_))
        ));
        assert!(matches!(
            Provider::from_lookup(lookup(&[("FERROGRAPH_PROVIDER", "cloud")])),
            Err(LlmError::Config(_))
        ));
        assert!(matches!(
            Provider::from_lookup(lookup(&[
                ("FERROGRAPH_PROVIDER", "remote"),
                ("FERROGRAPH_BASE_URL", "ftp://x"),
                ("FERROGRAPH_REMOTE_MODEL", "m"),
            ])),
            Err(LlmError::Config(_))
        ));
        let missing = chat_model_from_config(&Provider::Local {
            model: Some("/nonexistent/model.gguf".into()),
            device: DeviceKind::Cpu,
        });
        assert!(matches!(missing, Err(LlmError::ModelMissing { .. })));
    }

    #[test]
    fn provider_parses_from_toml_and_hides_the_key() {
        let p: Provider = toml::from_str(
            "provider = \"remote\"\nbase_url = \"http://h:1\"\nmodel = \"m\"\napi_key_env = \"K\"",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let Provider::Remote(cfg) = p else {
            panic!("not remote")
        };
        assert_eq!(cfg.endpoint(), "http://h:1/v1/chat/completions");
        let shown = format!("{:?}", cfg.clone().api_key("sk-secret"));
        assert!(!shown.contains("sk-secret"), "{shown}");
        assert_eq!(
            cfg.api_key("sk-secret").bearer_token().as_deref(),
            Some("sk-secret")
        );
    }
}
