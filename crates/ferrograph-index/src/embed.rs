//! Sentence embeddings.
//!
//! [`BertEmbedder`] runs a BERT sentence-transformer (all-MiniLM-L6-v2 by default) with
//! candle: texts are tokenized (truncated to `max_tokens`), sorted by length and batched so
//! each batch pads only to its own longest text, mean-pooled over the attention mask and
//! L2-normalized — the same vectors sentence-transformers produces. [`HashEmbedder`] is a
//! model-free stand-in for tests; [`CountingEmbedder`] counts calls.

use crate::distance::normalize;
use crate::error::{IndexError, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
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
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions {
            device: DeviceKind::Cpu,
            batch_size: 32,
            max_tokens: 256,
        }
    }
}

/// A BERT sentence-embedding model on candle.
pub struct BertEmbedder {
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
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
        let max_tokens = options.max_tokens.clamp(8, config.max_position_embeddings);
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
        let dev = device(options.device)?;
        // Reading (not mapping) the weights keeps this crate free of unsafe code.
        let bytes = std::fs::read(&weights).map_err(|e| IndexError::io(&weights, e))?;
        let vb = VarBuilder::from_buffered_safetensors(bytes, DType::F32, &dev)
            .map_err(IndexError::embedding)?;
        let model = BertModel::load(vb, &config).map_err(IndexError::embedding)?;
        let model_id = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "bert".into());
        Ok(BertEmbedder {
            model,
            tokenizer,
            device: dev,
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

    fn forward(&self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
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
        let ids = Tensor::from_vec(ids, (b, len), &self.device).map_err(e)?;
        let mask = Tensor::from_vec(mask, (b, len), &self.device).map_err(e)?;
        let types = ids.zeros_like().map_err(e)?;
        let hidden = self.model.forward(&ids, &types, Some(&mask)).map_err(e)?;
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
        let mut out: Vec<Vec<f32>> = mean.to_vec2::<f32>().map_err(e)?;
        for v in &mut out {
            normalize(v);
        }
        Ok(out)
    }
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
