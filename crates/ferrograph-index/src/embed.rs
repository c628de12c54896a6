//! Sentence embeddings.
//!
//! [`BertEmbedder`] runs a BERT sentence-transformer (all-MiniLM-L6-v2 by default): texts are
//! tokenized (truncated to `max_tokens`), sorted by length and batched, mean-pooled over their
//! tokens and L2-normalized — the same vectors sentence-transformers produces. On the CPU it
//! runs on our kernels ([`ferrograph_kernels::encoder`]: 12-bit weights times 16-bit
//! activations, sequences stacked without padding); candle's `f32` BERT is the reference path
//! (`FERROGRAPH_KERNELS=candle` or [`EmbedOptions::kernels`]) and the one for CUDA and Metal,
//! where each batch pads to its own longest text. [`HashEmbedder`] is a model-free stand-in
//! for tests; [`CountingEmbedder`] counts calls.

use crate::distance::normalize;
use crate::error::{IndexError, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config, HiddenAct};
use ferrograph_kernels::encoder::{EncoderActivation, EncoderConfig, EncoderModel};
use ferrograph_kernels::Kernels;
use ferrograph_models::DeviceKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokenizers::{Tokenizer, TruncationParams};

/// Name of the default embedding model in `models/models.toml`.
pub const DEFAULT_EMBEDDING_MODEL: &str = "all-minilm-l6-v2";

/// Turns texts into unit vectors. Implementations are thread-safe; callers on an async
/// runtime should call [`Embedder::embed`] from a blocking thread (see
/// [`crate::Retriever::search_async`]).
pub trait Embedder: Send + Sync {
    /// Identifies the model; an index records it and refuses vectors from another model.
    fn model_id(&self) -> &str;
    /// Vector dimension.
    fn dim(&self) -> usize;
    /// Embeds texts; one unit vector per text, in order.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>>;
}

impl<E: Embedder + ?Sized> Embedder for Arc<E> {
    fn model_id(&self) -> &str {
        (**self).model_id()
    }
    fn dim(&self) -> usize {
        (**self).dim()
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        (**self).embed(texts)
    }
}

/// How a [`BertEmbedder`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbedOptions {
    /// Device (CPU by default; CUDA and Metal need the crate's `cuda`/`metal` features).
    pub device: DeviceKind,
    /// Texts per forward pass.
    pub batch_size: usize,
    /// Tokens kept per text (MiniLM was trained on 256).
    pub max_tokens: usize,
    /// Which forward pass. `Auto`: our kernels on a CPU with SIMD kernels for an encoder they
    /// support, candle's elsewhere, `FERROGRAPH_KERNELS=candle` forcing candle's and
    /// `FERROGRAPH_KERNELS=fast` ours wherever they run. `Candle`: candle's `f32` BERT.
    /// `Fast`: ours, failing when they cannot run the model or the device is not the CPU.
    pub kernels: Kernels,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions {
            device: DeviceKind::Cpu,
            batch_size: 32,
            max_tokens: 256,
            kernels: Kernels::Auto,
        }
    }
}

/// The forward pass a [`BertEmbedder`] runs.
enum Backend {
    /// Our kernels, on the CPU.
    Kernels(EncoderModel),
    /// candle's `f32` BERT.
    Candle { model: BertModel, device: Device },
}

/// A BERT sentence-embedding model.
pub struct BertEmbedder {
    backend: Backend,
    tokenizer: Tokenizer,
    dim: usize,
    model_id: String,
    options: EmbedOptions,
    dir: PathBuf,
}

impl std::fmt::Debug for BertEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertEmbedder")
            .field("model_id", &self.model_id)
            .field("dir", &self.dir)
            .field("dim", &self.dim)
            .field("options", &self.options)
            .field("backend", &self.backend_name())
            .finish_non_exhaustive()
    }
}

fn device(kind: DeviceKind) -> Result<Device> {
    match kind {
        DeviceKind::Cpu => Ok(Device::Cpu),
        DeviceKind::Cuda => Device::new_cuda(0).map_err(|e| {
            IndexError::Embedding(format!(
                "CUDA device unavailable (build ferrograph-index with `--features cuda`): {e}"
            ))
        }),
        DeviceKind::Metal => Device::new_metal(0).map_err(|e| {
            IndexError::Embedding(format!(
                "Metal device unavailable (build ferrograph-index with `--features metal`): {e}"
            ))
        }),
    }
}

impl BertEmbedder {
    /// Loads `config.json`, `tokenizer.json` and `model.safetensors` from `dir`. The model id
    /// is the folder's name.
    pub fn load(dir: &Path, options: EmbedOptions) -> Result<Self> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| IndexError::io(&cfg_path, e))?;
        let config: Config = serde_json::from_str(&text)
            .map_err(|e| IndexError::Embedding(format!("{}: {e}", cfg_path.display())))?;
        let tok_path = dir.join("tokenizer.json");
        let mut tokenizer = Tokenizer::from_file(&tok_path)
            .map_err(|e| IndexError::Embedding(format!("{}: {e}", tok_path.display())))?;
        let max_tokens = options
            .max_tokens
            .max(8)
            .min(config.max_position_embeddings.max(1));
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_tokens,
                ..Default::default()
            }))
            .map_err(IndexError::embedding)?;
        let weights = dir.join("model.safetensors");
        if !weights.exists() {
            return Err(IndexError::Embedding(format!(
                "{} is missing; fetch it with `ferrograph models fetch {DEFAULT_EMBEDDING_MODEL}`",
                weights.display()
            )));
        }
        // Reading (not mapping) the weights keeps this crate free of unsafe code.
        let bytes = std::fs::read(&weights).map_err(|e| IndexError::io(&weights, e))?;
        // `FERROGRAPH_KERNELS=fast` from the environment asks for our kernels where they run;
        // only an explicit `Kernels::Fast` makes it an error on a GPU.
        let on_cpu = options.device == DeviceKind::Cpu;
        let backend = match (options.kernels.resolve(), on_cpu) {
            (Kernels::Candle, _) => candle_backend(bytes, &config, options.device)?,
            (Kernels::Fast, false) if options.kernels == Kernels::Fast => {
                return Err(IndexError::Embedding(format!(
                    "our kernels run on the CPU, not {:?}; use candle's path there",
                    options.device
                )));
            }
            (Kernels::Fast, true) => Backend::Kernels(kernels_backend(&bytes, &config, &weights)?),
            (_, false) => candle_backend(bytes, &config, options.device)?,
            // Without SIMD our encoder's products run a scalar loop: candle's is faster.
            _ if ferrograph_kernels::detected_isa() == ferrograph_kernels::Isa::Scalar => {
                tracing::info!("no SIMD kernels on this CPU; embedding with candle's path");
                candle_backend(bytes, &config, options.device)?
            }
            _ => match kernels_backend(&bytes, &config, &weights) {
                Ok(model) => Backend::Kernels(model),
                Err(why) => {
                    tracing::info!(model = %dir.display(), %why, "our kernels cannot run this encoder; using candle's");
                    candle_backend(bytes, &config, options.device)?
                }
            },
        };
        let model_id = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "bert".into());
        Ok(BertEmbedder {
            backend,
            tokenizer,
            dim: config.hidden_size,
            model_id,
            options: EmbedOptions {
                max_tokens,
                batch_size: options.batch_size.max(1),
                ..options
            },
            dir: dir.to_path_buf(),
        })
    }

    /// Loads a model of `models/models.toml` by name, fetching it first when it is missing
    /// (see [`ferrograph_models::manifest::ensure_model`]).
    pub fn from_manifest(name: &str, options: EmbedOptions) -> Result<Self> {
        let path = ferrograph_models::manifest::ensure_model(name)?;
        let dir = path
            .parent()
            .ok_or_else(|| IndexError::Embedding(format!("{} has no folder", path.display())))?;
        Self::load(dir, options)
    }

    /// The model's folder of the manifest, without fetching: [`ferrograph_chat::LlmError::ModelMissing`]
    /// (naming the fetch command) when it is not there.
    pub fn locate(name: &str) -> Result<PathBuf> {
        let manifest = ferrograph_models::manifest::Manifest::default_manifest()?;
        let path = manifest.model_path(name)?;
        Ok(path.parent().map(Path::to_path_buf).unwrap_or_default())
    }

    /// The default model (all-MiniLM-L6-v2), fetched when missing.
    pub fn default_model(options: EmbedOptions) -> Result<Self> {
        Self::from_manifest(DEFAULT_EMBEDDING_MODEL, options)
    }

    /// The options in use.
    pub fn options(&self) -> EmbedOptions {
        self.options
    }

    /// Which forward pass runs: `kernels` (ours) or `candle`.
    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            Backend::Kernels(_) => "kernels",
            Backend::Candle { .. } => "candle",
        }
    }

    /// Our encoder, when it is the one running.
    pub fn encoder(&self) -> Option<&EncoderModel> {
        match &self.backend {
            Backend::Kernels(model) => Some(model),
            Backend::Candle { .. } => None,
        }
    }

    /// Mean-pooled, normalized vectors of one batch of token sequences.
    fn forward(&self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let mut out = match &self.backend {
            Backend::Kernels(model) => {
                // A text with no tokens (a tokenizer without special tokens) pools to the zero
                // vector, as on candle's path.
                let full: Vec<&[u32]> = batch.iter().copied().filter(|t| !t.is_empty()).collect();
                let mut pooled = model
                    .mean_pooled(&full)
                    .map_err(IndexError::embedding)?
                    .into_iter();
                batch
                    .iter()
                    .map(|t| {
                        if t.is_empty() {
                            Some(vec![0f32; self.dim])
                        } else {
                            pooled.next()
                        }
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        IndexError::Embedding("the encoder returned too few vectors".into())
                    })?
            }
            Backend::Candle { model, device } => candle_forward(model, device, batch)?,
        };
        for v in &mut out {
            normalize(v);
        }
        Ok(out)
    }
}

/// Our encoder's shape from the model's `config.json` (as candle parsed it), or why our kernels
/// cannot run it.
fn encoder_config(config: &Config) -> std::result::Result<EncoderConfig, String> {
    let activation = match config.hidden_act {
        HiddenAct::Gelu => EncoderActivation::GeluErf,
        HiddenAct::Relu => EncoderActivation::Relu,
        other => return Err(format!("activation {other:?}")),
    };
    let cfg = EncoderConfig {
        hidden: config.hidden_size,
        heads: config.num_attention_heads,
        layers: config.num_hidden_layers,
        intermediate: config.intermediate_size,
        vocab: config.vocab_size,
        max_positions: config.max_position_embeddings,
        eps: config.layer_norm_eps as f32,
        activation,
    };
    cfg.supported()?;
    Ok(cfg)
}

/// Our encoder from the safetensors `bytes` (read from `weights`).
fn kernels_backend(bytes: &[u8], config: &Config, weights: &Path) -> Result<EncoderModel> {
    let fail = |why: String| {
        IndexError::Embedding(format!(
            "{}: our kernels cannot run this encoder ({why})",
            weights.display()
        ))
    };
    let cfg = encoder_config(config).map_err(fail)?;
    let tensors = candle_core::safetensors::load_buffer(bytes, &Device::Cpu)
        .map_err(|e| fail(e.to_string()))?;
    // Tensor names carry the model type as a prefix (`bert.embeddings...`) or none: decided
    // once for the whole file, as candle's loader does.
    let model_type = config.model_type.as_deref().unwrap_or("bert");
    let prefix = if tensors.contains_key("embeddings.word_embeddings.weight") {
        String::new()
    } else {
        format!("{model_type}.")
    };
    let mut tensor = |name: &str| {
        let full = format!("{prefix}{name}");
        let t = tensors.get(&full).ok_or_else(|| {
            ferrograph_kernels::KernelError::Malformed(format!("tensor {full} is missing"))
        })?;
        let values = t
            .to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| ferrograph_kernels::KernelError::Malformed(format!("{full}: {e}")))?;
        Ok((t.dims().to_vec(), values))
    };
    EncoderModel::load(cfg, &mut tensor).map_err(|e| fail(e.to_string()))
}

/// candle's BERT from the safetensors `bytes` on `device`.
fn candle_backend(bytes: Vec<u8>, config: &Config, device: DeviceKind) -> Result<Backend> {
    let dev = self::device(device)?;
    let vb = VarBuilder::from_buffered_safetensors(bytes, DType::F32, &dev)
        .map_err(IndexError::embedding)?;
    let model = BertModel::load(vb, config).map_err(IndexError::embedding)?;
    Ok(Backend::Candle { model, device: dev })
}

/// Mean-pooled vectors of one batch on candle: padded to the longest sequence, masked.
fn candle_forward(model: &BertModel, device: &Device, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
    let b = batch.len();
    let len = batch.iter().map(|t| t.len()).max().unwrap_or(0).max(1);
    let mut ids = vec![0u32; b * len];
    let mut mask = vec![0u32; b * len];
    for (i, t) in batch.iter().enumerate() {
        ids[i * len..i * len + t.len()].copy_from_slice(t);
        mask[i * len..i * len + t.len()]
            .iter_mut()
            .for_each(|m| *m = 1);
    }
    let e = IndexError::embedding;
    let ids = Tensor::from_vec(ids, (b, len), device).map_err(e)?;
    let mask = Tensor::from_vec(mask, (b, len), device).map_err(e)?;
    let types = ids.zeros_like().map_err(e)?;
    let hidden = model.forward(&ids, &types, Some(&mask)).map_err(e)?;
    let maskf = mask
        .to_dtype(DType::F32)
        .map_err(e)?
        .unsqueeze(2)
        .map_err(e)?;
    let summed = hidden.broadcast_mul(&maskf).map_err(e)?.sum(1).map_err(e)?;
    let counts = maskf
        .sum(1)
        .map_err(e)?
        .clamp(1e-9f32, f32::MAX)
        .map_err(e)?;
    let mean = summed.broadcast_div(&counts).map_err(e)?;
    mean.to_vec2::<f32>().map_err(e)
}

impl Embedder for BertEmbedder {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let encs = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(IndexError::embedding)?;
        let toks: Vec<&[u32]> = encs.iter().map(|e| e.get_ids()).collect();
        let mut order: Vec<usize> = (0..toks.len()).collect();
        order.sort_by_key(|i| std::cmp::Reverse(toks[*i].len()));
        let mut out = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(self.options.batch_size) {
            let batch: Vec<&[u32]> = chunk.iter().map(|i| toks[*i]).collect();
            let vs = self.forward(&batch)?;
            for (i, v) in chunk.iter().zip(vs) {
                out[*i] = v;
            }
        }
        Ok(out)
    }
}

/// A deterministic, model-free embedder: hashed word and character-trigram features,
/// normalized. Similar texts get similar vectors; meant for tests and as an offline fallback,
/// not for quality retrieval.
#[derive(Clone, Debug)]
pub struct HashEmbedder {
    dim: usize,
    id: String,
}

impl HashEmbedder {
    /// An embedder of `dim` dimensions (model id `hash-<dim>`).
    pub fn new(dim: usize) -> Self {
        HashEmbedder {
            dim: dim.max(1),
            id: format!("hash-{}", dim.max(1)),
        }
    }

    fn h(s: &[u8]) -> u64 {
        // FNV-1a
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in s {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    }

    fn one(&self, text: &str) -> Vec<f32> {
        let mut v = vec![0f32; self.dim];
        let lower = text.to_lowercase();
        for w in lower.split(|c: char| !c.is_alphanumeric() && c != '_') {
            if w.is_empty() {
                continue;
            }
            let h = Self::h(w.as_bytes());
            let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
            v[(h % self.dim as u64) as usize] += sign;
            let b = w.as_bytes();
            for t in b.windows(3) {
                let h = Self::h(t);
                let sign = if h >> 63 == 0 { 0.5 } else { -0.5 };
                v[(h % self.dim as u64) as usize] += sign;
            }
        }
        if !normalize(&mut v) {
            v[0] = 1.0;
        }
        v
    }
}

impl Embedder for HashEmbedder {
    fn model_id(&self) -> &str {
        &self.id
    }
    fn dim(&self) -> usize {
        self.dim
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        Ok(texts.iter().map(|t| self.one(t)).collect())
    }
}

/// Wraps an embedder and counts the texts it embeds (to check that reopening an index or
/// rebuilding its graph never re-embeds).
pub struct CountingEmbedder<E> {
    inner: E,
    texts: AtomicUsize,
    calls: AtomicUsize,
}

impl<E: Embedder> CountingEmbedder<E> {
    /// Wraps `inner`.
    pub fn new(inner: E) -> Self {
        CountingEmbedder {
            inner,
            texts: AtomicUsize::new(0),
            calls: AtomicUsize::new(0),
        }
    }
    /// Texts embedded so far.
    pub fn texts(&self) -> usize {
        self.texts.load(Ordering::Relaxed)
    }
    /// Calls so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::Relaxed)
    }
}

impl<E: Embedder> Embedder for CountingEmbedder<E> {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }
    fn dim(&self) -> usize {
        self.inner.dim()
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.texts.fetch_add(texts.len(), Ordering::Relaxed);
        self.inner.embed(texts)
    }
}

/// Makes an embedder when first needed (workflows take one, so that tests can swap in a
/// cheaper embedder than MiniLM).
pub type EmbedderFactory = std::sync::Arc<
    dyn Fn() -> std::result::Result<std::sync::Arc<dyn Embedder>, String> + Send + Sync,
>;

/// The default embedder, all-MiniLM-L6-v2 from `models/`, as an [`EmbedderFactory`], on
/// the device named by `FERROGRAPH_DEVICE` (the CPU when unset), like the default chat model.
pub fn minilm() -> EmbedderFactory {
    std::sync::Arc::new(|| {
        let device = DeviceKind::from_env().map_err(|e| e.to_string())?;
        BertEmbedder::default_model(EmbedOptions {
            device,
            ..EmbedOptions::default()
        })
        .map(|e| std::sync::Arc::new(e) as std::sync::Arc<dyn Embedder>)
        .map_err(|e| e.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distance::dot;

    #[test]
    fn hash_embedder_is_deterministic_and_unit() {
        let e = HashEmbedder::new(64);
        let v = e
            .embed(&["fn main() {}", "fn main() {}", "", "zebra"])
            .unwrap();
        assert_eq!(v[0], v[1]);
        assert!((dot(&v[0], &v[0]) - 1.0).abs() < 1e-5);
        assert!((dot(&v[2], &v[2]) - 1.0).abs() < 1e-5);
        let c = CountingEmbedder::new(e);
        c.embed(&["a", "b"]).unwrap();
        assert_eq!((c.calls(), c.texts()), (1, 2));
    }
}
