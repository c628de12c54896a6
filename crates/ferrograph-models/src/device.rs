//! Where a model runs.

use ferrograph_chat::LlmError;
use serde::{Deserialize, Serialize};

/// Where a model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// The CPU (default).
    #[default]
    Cpu,
    /// The first CUDA GPU (needs the `cuda` feature).
    Cuda,
    /// The Metal GPU (needs the `metal` feature).
    Metal,
}

impl DeviceKind {
    /// Reads `FERROGRAPH_DEVICE` (`cpu`, `cuda` or `metal`); CPU when unset.
    pub fn from_env() -> Result<Self, LlmError> {
        match std::env::var("FERROGRAPH_DEVICE") {
            Ok(v) => v.parse(),
            Err(_) => Ok(DeviceKind::Cpu),
        }
    }

    /// The device a `--device` flag names, else [`DeviceKind::from_env`].
    pub fn from_flag_or_env(flag: Option<&str>) -> Result<Self, LlmError> {
        match flag {
            Some(d) => d.parse(),
            None => Self::from_env(),
        }
    }
}

impl std::str::FromStr for DeviceKind {
    type Err = LlmError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "cpu" => Ok(DeviceKind::Cpu),
            "cuda" | "gpu" => Ok(DeviceKind::Cuda),
            "metal" => Ok(DeviceKind::Metal),
            other => Err(LlmError::Validation(format!(
                "unknown device `{other}` (expected cpu, cuda or metal)"
            ))),
        }
    }
}
