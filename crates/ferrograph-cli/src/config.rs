//! Configuration: flags, then `FERROGRAPH_*` environment variables, then a TOML file, then
//! defaults.

use anyhow::{Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Settings read from `ferrograph.toml`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Where threads and indexes live.
    pub data_dir: Option<PathBuf>,
    /// Supersteps per run.
    pub max_steps: Option<u64>,
    /// Limit for a whole run, in seconds.
    pub max_runtime_seconds: Option<f64>,
    /// Limit per tool call, in seconds.
    pub tool_timeout_seconds: Option<f64>,
    /// Default model (a name from models/models.toml or a GGUF path).
    pub default_model: Option<String>,
    /// Local model that model calls fall back to once the default's retries are exhausted
    /// (a name from models/models.toml or a GGUF path).
    pub fallback_model: Option<String>,
    /// A remote OpenAI-compatible provider.
    pub remote: Option<RemoteConfig>,
    /// Settings of single workflows (`[workflows.tutor]`).
    #[serde(default)]
    pub workflows: std::collections::BTreeMap<String, WorkflowConfig>,
}

/// Settings of one workflow.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowConfig {
    /// Its model: a name from models/models.toml, a GGUF path, `remote` (the configured
    /// remote provider) or `none`.
    pub model: Option<String>,
}

/// Workflows whose model `FERROGRAPH_<NAME>_MODEL` sets.
pub const WORKFLOWS_WITH_MODELS: [&str; 5] = ["triage", "fraud", "tutor", "ticket-to-pr", "team"];

/// A remote OpenAI-compatible provider.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// Base URL, e.g. `http://127.0.0.1:8000/v1`.
    pub base_url: String,
    /// Model name on the server.
    pub model: String,
    /// Environment variable holding the bearer token.
    pub api_key_env: Option<String>,
}

/// The effective configuration.
#[derive(Debug)]
pub struct Config {
    /// Where threads and indexes live.
    pub data_dir: PathBuf,
    /// Supersteps per run.
    pub max_steps: u64,
    /// The step limit when one was configured (flag, variable or file), for agent loops
    /// that count their own steps (the fraud planner's default is 20).
    pub max_steps_set: Option<u64>,
    /// Limit for a whole run.
    pub run_timeout: Option<Duration>,
    /// Limit per tool call.
    pub tool_timeout: Option<Duration>,
    /// Default model.
    pub default_model: Option<String>,
    /// Fallback model.
    pub fallback_model: Option<String>,
    /// Remote provider.
    pub remote: Option<RemoteConfig>,
    /// Models chosen for single workflows: `FERROGRAPH_<NAME>_MODEL`, then
    /// `[workflows.NAME] model` in the file.
    pub workflow_models: std::collections::BTreeMap<String, String>,
    /// Where each of `workflow_models` came from (`FERROGRAPH_TRIAGE_MODEL`, the file, or the
    /// evaluation's choice in the manifest), for the line a run prints about its model.
    pub workflow_model_source: std::collections::BTreeMap<String, String>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn env_parse<T: std::str::FromStr>(name: &str) -> Result<Option<T>>
where
    T::Err: std::fmt::Display,
{
    match env(name) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<T>()
            .map(Some)
            .map_err(|e| anyhow::anyhow!("{name}={v:?} is not valid: {e}")),
    }
}

/// The user's data directory for ferrograph.
pub fn default_data_dir() -> PathBuf {
    if let Some(x) = env("XDG_DATA_HOME") {
        return Path::new(&x).join("ferrograph");
    }
    match env("HOME") {
        Some(h) => Path::new(&h).join(".local/share/ferrograph"),
        None => PathBuf::from(".ferrograph"),
    }
}

/// `v` seconds as a duration: positive, finite and at most a year, or an error naming `what`.
pub(crate) fn seconds(v: f64, what: &str) -> Result<Duration> {
    if !v.is_finite() || v <= 0.0 {
        anyhow::bail!("{what} must be a positive number of seconds, got {v}");
    }
    // Bounded so that no deadline computed from it can overflow (`1e20` used to panic).
    const YEAR: f64 = 365.0 * 86_400.0;
    if v > YEAR {
        anyhow::bail!("{what} must be at most a year ({YEAR} seconds), got {v}");
    }
    Ok(Duration::from_secs_f64(v))
}

impl Config {
    /// Loads the configuration. `config_file` comes from `--config`; otherwise
    /// `FERROGRAPH_CONFIG`, then `<data dir>/ferrograph.toml` if it exists.
    pub fn load(config_file: Option<&Path>, data_dir_flag: Option<&Path>) -> Result<Config> {
        let env_dir = env("FERROGRAPH_DATA_DIR").map(PathBuf::from);
        let explicit = config_file
            .map(Path::to_path_buf)
            .or_else(|| env("FERROGRAPH_CONFIG").map(PathBuf::from));
        let guess_dir = data_dir_flag
            .map(Path::to_path_buf)
            .or_else(|| env_dir.clone())
            .unwrap_or_else(default_data_dir);
        let file: FileConfig = match explicit {
            Some(p) => {
                let text = std::fs::read_to_string(&p)
                    .with_context(|| format!("reading config file {}", p.display()))?;
                toml::from_str(&text).with_context(|| format!("parsing {}", p.display()))?
            }
            None => {
                let p = guess_dir.join("ferrograph.toml");
                match std::fs::read_to_string(&p) {
                    Ok(text) => {
                        toml::from_str(&text).with_context(|| format!("parsing {}", p.display()))?
                    }
                    Err(_) => FileConfig::default(),
                }
            }
        };
        let data_dir = data_dir_flag
            .map(Path::to_path_buf)
            .or(env_dir)
            .or(file.data_dir)
            .unwrap_or_else(default_data_dir);
        let max_steps_set = env_parse::<u64>("FERROGRAPH_MAX_STEPS")?.or(file.max_steps);
        let max_steps = max_steps_set.unwrap_or(25);
        let run_timeout = match env_parse::<f64>("FERROGRAPH_MAX_RUNTIME_SECONDS")?
            .or(file.max_runtime_seconds)
        {
            Some(v) => Some(seconds(v, "max runtime")?),
            None => None,
        };
        let tool_timeout = match env_parse::<f64>("FERROGRAPH_TOOL_TIMEOUT_SECONDS")?
            .or(file.tool_timeout_seconds)
        {
            Some(v) => Some(seconds(v, "tool timeout")?),
            None => None,
        };
        let default_model = env("FERROGRAPH_DEFAULT_MODEL").or(file.default_model);
        let fallback_model = env("FERROGRAPH_FALLBACK_MODEL").or(file.fallback_model);
        let remote = match (
            env("FERROGRAPH_REMOTE_BASE_URL"),
            env("FERROGRAPH_REMOTE_MODEL"),
        ) {
            (Some(base_url), Some(model)) => Some(RemoteConfig {
                base_url,
                model,
                api_key_env: env("FERROGRAPH_REMOTE_API_KEY_ENV"),
            }),
            _ => file.remote,
        };
        let mut workflow_models = std::collections::BTreeMap::new();
        let mut workflow_model_source = std::collections::BTreeMap::new();
        for (name, w) in &file.workflows {
            if let Some(m) = &w.model {
                workflow_models.insert(name.clone(), m.clone());
                workflow_model_source.insert(
                    name.clone(),
                    format!("[workflows.{name}] model in the config file"),
                );
            }
        }
        for name in WORKFLOWS_WITH_MODELS {
            // `ticket-to-pr` reads FERROGRAPH_TICKET_TO_PR_MODEL.
            let var = format!(
                "FERROGRAPH_{}_MODEL",
                name.to_ascii_uppercase().replace('-', "_")
            );
            if let Some(m) = env(&var) {
                workflow_models.insert(name.to_string(), m);
                workflow_model_source.insert(name.to_string(), format!("set by {var}"));
            }
        }
        Ok(Config {
            workflow_models,
            workflow_model_source,
            data_dir,
            max_steps,
            max_steps_set,
            run_timeout,
            tool_timeout,
            default_model,
            fallback_model,
            remote,
        })
    }

    /// Where the checkpoint database lives.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.data_dir.join("checkpoints")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_out_of_range_are_errors_that_name_the_value() {
        for bad in [1e20, 1e300, f64::INFINITY, f64::NAN, 0.0, -1.0, 3.2e7] {
            let e = seconds(bad, "max runtime").unwrap_err().to_string();
            assert!(e.contains("max runtime"), "{bad}: {e}");
        }
        assert_eq!(
            seconds(1.5, "tool timeout").unwrap(),
            Duration::from_millis(1500)
        );
    }
}
