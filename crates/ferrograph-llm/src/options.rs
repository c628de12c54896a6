//! How a model is loaded ([`LoadOptions`]); what one generation asks for is in the chat
//! contract ([`GenerateOptions`] and its siblings, re-exported here).

pub use ferrograph_chat::options::{GenerateOptions, ResponseFormat, ToolChoice};
pub use ferrograph_models::DeviceKind;
use serde::{Deserialize, Serialize};

/// The candle device for `kind`.
pub(crate) fn candle_device(kind: DeviceKind) -> Result<candle_core::Device, crate::LlmError> {
    match kind {
        DeviceKind::Cpu => Ok(candle_core::Device::Cpu),
        DeviceKind::Cuda => candle_core::Device::new_cuda(0).map_err(|e| {
            crate::LlmError::Validation(format!(
                "CUDA device unavailable (build with `--features cuda`): {e}"
            ))
        }),
        DeviceKind::Metal => candle_core::Device::new_metal(0).map_err(|e| {
            crate::LlmError::Validation(format!(
                "Metal device unavailable (build with `--features metal`): {e}"
            ))
        }),
    }
}

/// How a model is loaded. Models are cached per process by path and these options.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct LoadOptions {
    /// Device to run on.
    pub device: DeviceKind,
    /// Largest context any call may use; rotary tables and caches are sized by it (capped by
    /// the model's own context length). 8,192 by default: a code model's task (a ticket and
    /// two or three whole files) takes 4–6k tokens, and the half-float KV cache grows with
    /// the tokens actually used (28 KiB a position for Qwen2.5-Coder-1.5B).
    pub max_context: usize,
    /// How many requests may wait in the model actor's queue before callers wait to enqueue.
    pub queue_capacity: usize,
    /// How many requests the model actor decodes together, each with its own KV cache, in
    /// one forward pass per step (continuous batching; 1 serves one request at a time).
    /// Only our kernels batch; candle's models always serve one at a time.
    /// `FERROGRAPH_MAX_BATCH` overrides it.
    pub max_batch: usize,
    /// How many prompt-prefix KV snapshots the model keeps for reuse across calls (0 disables
    /// prefix reuse).
    pub prefix_cache_entries: usize,
    /// Bytes the kept prefix snapshots' KV caches may hold together (least recently used
    /// evicted first; a prefix larger than this is not kept). Our kernels' half-float caches
    /// take 22.5 KiB per position for SmolLM2-135M, 18 KiB for Gemma 3 270M.
    pub prefix_cache_bytes: usize,
    /// Which CPU forward pass runs the model: our own kernels where the architecture and
    /// tensor types are supported (`auto`, the default; `FERROGRAPH_KERNELS=candle|fast`
    /// overrides it), or always candle's reference path.
    pub kernels: ferrograph_kernels::decoder::Kernels,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            device: DeviceKind::Cpu,
            max_context: 8192,
            queue_capacity: 64,
            max_batch: 8,
            prefix_cache_entries: 4,
            prefix_cache_bytes: 256 << 20,
            kernels: ferrograph_kernels::decoder::Kernels::Auto,
        }
    }
}
