//! The synchronous inference engine: a loaded GGUF model, its tokenizer and chat template, and
//! the generation loop (prefill, sampling, incremental detokenization, stop handling, prompt
//! prefix reuse). The model actor owns one engine; nothing here is shared across threads
//! except the immutable [`Shared`] part.

use crate::error::LlmError;
use crate::options::{GenerateOptions, LoadOptions};
use crate::template::ChatTemplate;
use crate::tokenizer::{tokenizer_from_file, tokenizer_from_gguf, SpecialTokens};
use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use candle_transformers::models::{
    quantized_llama, quantized_phi3, quantized_qwen2, quantized_qwen3,
};
use ferrograph_core::message::Message;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokenizers::{Model, Tokenizer};

/// Architectures (`general.architecture`) this backend can run. Llama-family models (SmolLM2,
/// Llama 2/3, Mistral) use `llama`.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3", "phi3", "gemma3"];

/// What is known about a loaded model.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// Display name (the file stem).
    pub name: String,
    /// The GGUF file.
    pub path: PathBuf,
    /// `general.architecture`.
    pub architecture: String,
    /// Largest context a call may use with this load (the model's, capped by the load options
    /// and the backend's rotary table).
    pub context_length: usize,
    /// Vocabulary size, added tokens included.
    pub vocab_size: usize,
    /// How long loading took.
    pub load_time: Duration,
}

/// The parts of a model that are immutable after loading and may be used from any thread.
#[derive(Debug)]
pub struct Shared {
    /// Model facts.
    pub info: ModelInfo,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// Special token ids.
    pub specials: SpecialTokens,
    /// The chat template.
    pub template: ChatTemplate,
    /// Constrained-decoding machinery (token trie, parser factory), built on first use.
    pub constraints: crate::constrain::Constraints,
    /// What the model actor's batching has done so far.
    pub batching: BatchCounters,
}

/// Counters of the model actor's batched steps (see [`crate::actor`]), updated as it runs.
#[derive(Debug, Default)]
pub struct BatchCounters {
    steps: std::sync::atomic::AtomicU64,
    sequence_steps: std::sync::atomic::AtomicU64,
    peak: std::sync::atomic::AtomicU64,
    prefix_waits: std::sync::atomic::AtomicU64,
}

/// A reading of [`BatchCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Forward passes run by the actor.
    pub steps: u64,
    /// Sequences advanced, summed over the passes (`sequence_steps / steps` is the mean
    /// batch size).
    pub sequence_steps: u64,
    /// The most sequences one pass has advanced.
    pub peak: u64,
    /// Requests that waited for another in the batch to compute the prompt prefix they
    /// share, then started from its snapshot.
    pub prefix_waits: u64,
}

impl BatchCounters {
    /// Records one pass over `n` sequences.
    pub(crate) fn record(&self, n: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        let n = n as u64;
        self.steps.fetch_add(1, Relaxed);
        self.sequence_steps.fetch_add(n, Relaxed);
        self.peak.fetch_max(n, Relaxed);
    }

    /// Records a request waiting for a shared prompt prefix.
    pub(crate) fn record_prefix_wait(&self) {
        self.prefix_waits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The counters now.
    pub fn read(&self) -> BatchStats {
        use std::sync::atomic::Ordering::Relaxed;
        BatchStats {
            steps: self.steps.load(Relaxed),
            sequence_steps: self.sequence_steps.load(Relaxed),
            peak: self.peak.load(Relaxed),
            prefix_waits: self.prefix_waits.load(Relaxed),
        }
    }
}

impl Shared {
    /// Token ids of `text`; special-token strings in it are recognized.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, LlmError> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| LlmError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, optionally with special tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, LlmError> {
        self.tokenizer
            .decode(ids, skip_special)
            .map_err(|e| LlmError::Tokenizer(e.to_string()))
    }

    /// The prompt tokens for `messages` and, when the conversation starts with a system
    /// message, how many of them encode that message alone (a prefix worth caching).
    pub fn chat_prompt(
        &self,
        messages: &[Message],
        tools: Option<&[serde_json::Value]>,
        assistant_prefix: &str,
    ) -> Result<(Vec<u32>, Option<usize>), LlmError> {
        let mut text = self.template.render(messages, tools, true)?;
        text.push_str(assistant_prefix);
        let mut ids = Vec::new();
        if self.specials.add_bos && !text.starts_with(&self.specials.bos_text) {
            if let Some(bos) = self.specials.bos {
                ids.push(bos);
            }
        }
        let offset = ids.len();
        ids.extend(self.encode(&text)?);
        let mut hint = None;
        if messages.len() > 1 && tools.is_none() {
            if let Ok(prefix) = self.template.render(&messages[..1], None, false) {
                if !prefix.is_empty() && text.starts_with(&prefix) {
                    let p = self.encode(&prefix)?;
                    if ids[offset..].starts_with(&p) {
                        hint = Some(offset + p.len());
                    }
                }
            }
        }
        Ok((ids, hint))
    }
}

pub(crate) enum Weights {
    Llama(quantized_llama::ModelWeights),
    Qwen2(quantized_qwen2::ModelWeights),
    Qwen3(quantized_qwen3::ModelWeights),
    Phi3(quantized_phi3::ModelWeights),
    /// Our own kernels ([`ferrograph_kernels::decoder`]).
    Fast(ferrograph_kernels::decoder::DecoderModel),
}

impl Weights {
    /// The logits of the token after `tokens` (fed from position `pos`): our kernels return
    /// the last row as it comes out of the head; candle's models go through tensors on
    /// `device`.
    fn logits(
        &mut self,
        tokens: &[u32],
        pos: usize,
        device: &Device,
    ) -> Result<Vec<f32>, LlmError> {
        let row = |tokens: &[u32]| {
            Tensor::new(tokens, device)
                .and_then(|t| t.unsqueeze(0))
                .map_err(LlmError::backend)
        };
        let out = match self {
            Weights::Fast(m) => return m.forward(tokens, pos).map_err(LlmError::Backend),
            Weights::Llama(m) => m.forward(&row(tokens)?, pos),
            Weights::Qwen2(m) => m.forward(&row(tokens)?, pos),
            Weights::Qwen3(m) => m.forward(&row(tokens)?, pos),
            Weights::Phi3(m) => m.forward(&row(tokens)?, pos),
        }
        .map_err(LlmError::backend)?;
        let flat = out
            .flatten_all()
            .and_then(|t| t.to_dtype(candle_core::DType::F32))
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(LlmError::backend)?;
        // Some architectures return logits for every position: keep the last row.
        let vocab = out.dims().last().copied().unwrap_or(flat.len());
        Ok(flat[flat.len().saturating_sub(vocab)..].to_vec())
    }

    /// Forgets the KV cache.
    fn reset(&mut self) {
        match self {
            Weights::Llama(m) => m.clear_kv_cache(),
            Weights::Qwen2(m) => m.clear_kv_cache(),
            Weights::Qwen3(m) => m.clear_kv_cache(),
            Weights::Fast(m) => m.reset(),
            // These reset their cache on a forward at position 0.
            Weights::Phi3(_) => {}
        }
    }

    /// A copy sharing the weights (cheap: tensors are reference counted), when the backend
    /// model can be cloned.
    fn try_clone(&self) -> Option<Weights> {
        match self {
            Weights::Llama(m) => Some(Weights::Llama(m.clone())),
            Weights::Qwen3(m) => Some(Weights::Qwen3(m.clone())),
            Weights::Phi3(m) => Some(Weights::Phi3(m.clone())),
            Weights::Fast(m) => Some(Weights::Fast(m.clone())),
            Weights::Qwen2(_) => None,
        }
    }

    /// A snapshot of the first `len` cached tokens, when the backend can rewind its cache
    /// (our kernels can; candle's models only append).
    fn clone_prefix(&self, len: usize) -> Option<Weights> {
        match self {
            Weights::Fast(m) => m.clone_prefix(len).map(Weights::Fast),
            _ => None,
        }
    }

    /// Bytes its KV cache holds: counted for our kernels, estimated for candle's models from
    /// their `tokens` cached positions.
    fn cache_bytes(&self, tokens: usize, candle_per_token: usize) -> usize {
        match self {
            Weights::Fast(m) => m.cache_bytes(),
            _ => tokens.saturating_mul(candle_per_token),
        }
    }

    /// Whether [`Weights::clone_prefix`] to `len` tokens works: for our kernels, unless a
    /// sliding-window layer already dropped what the tokens from there on would see.
    fn rewinds_to(&self, len: usize) -> bool {
        matches!(self, Weights::Fast(m) if m.rewinds_to(len))
    }

    /// Whether a clone is an independent snapshot of the KV cache (caches built by
    /// concatenation are; preallocated ones may share storage).
    pub(crate) fn snapshots(&self) -> bool {
        matches!(
            self,
            Weights::Llama(_) | Weights::Phi3(_) | Weights::Fast(_)
        )
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` or `max_context` was reached.
    Length,
    /// The caller went away.
    Cancelled,
}

impl FinishReason {
    /// The OpenAI-style name (`stop`, `length`, `cancelled`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// The result of one generation.
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated text (special tokens and the stop string excluded).
    pub text: String,
    /// Generated token ids (the stop token excluded).
    pub tokens: Vec<u32>,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens served from a cached prefix.
    pub cached_prompt_tokens: usize,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Time to compute the prompt (prefill).
    pub prefill_time: Duration,
    /// Time from the start of the call to the first sampled token.
    pub time_to_first_token: Duration,
    /// Time spent generating after the first token.
    pub decode_time: Duration,
    /// Work done by the output grammar, when the call was constrained.
    pub constraint: Option<crate::constrain::ConstraintStats>,
}

struct PrefixEntry {
    tokens: Vec<u32>,
    weights: Weights,
    /// What its KV cache holds ([`Weights::cache_bytes`]).
    bytes: usize,
    last_used: u64,
}

/// A loaded model with its generation loop. Not `Sync`: owned by one actor.
pub struct Engine {
    pub(crate) shared: std::sync::Arc<Shared>,
    /// The model without any KV cache; `None` only while a non-clonable model is lent out to
    /// a generation.
    pub(crate) base: Option<Weights>,
    device: Device,
    prefixes: Vec<PrefixEntry>,
    max_prefixes: usize,
    /// Bytes the kept prefixes' KV caches may hold together.
    max_prefix_bytes: usize,
    /// KV cache bytes per position of candle's models (`f32` keys and values in every
    /// layer), from the GGUF's shape; ours are counted exactly.
    candle_kv_bytes_per_token: usize,
    clock: u64,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.shared.info.name)
            .finish()
    }
}

fn read_content(path: &Path, file: &mut std::fs::File) -> Result<gguf_file::Content, LlmError> {
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic)
        .map_err(|e| LlmError::invalid(path, format!("cannot read header: {e}")))?;
    if &magic != b"GGUF" {
        return Err(LlmError::invalid(path, "not a GGUF file (bad magic)"));
    }
    file.seek(SeekFrom::Start(0))
        .map_err(|source| LlmError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    // The reader validates lengths, but a malformed file must never take the process down.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        gguf_file::Content::read(file)
    }))
    .map_err(|_| LlmError::invalid(path, "GGUF reader panicked on malformed input"))?
    .map_err(|e| LlmError::invalid(path, format!("malformed GGUF: {e}")))
}

/// Opens the GGUF at `path` and reads its header: a missing file is
/// [`LlmError::ModelMissing`] (naming the fetch command), an unreadable or malformed one
/// [`LlmError::Io`] or [`LlmError::InvalidModel`].
fn open_gguf(path: &Path) -> Result<(std::fs::File, gguf_file::Content), LlmError> {
    if !path.exists() {
        return Err(LlmError::ModelMissing {
            path: path.to_path_buf(),
            name: fetch_name(path),
        });
    }
    let mut file = std::fs::File::open(path).map_err(|source| LlmError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let ct = read_content(path, &mut file)?;
    Ok((file, ct))
}

/// Reads the GGUF header at `path` and checks that every tensor's data lies inside the file:
/// the check a model setting gets before any run starts, so that a truncated download or copy
/// fails the command instead of every model call of a run. Reads the header only.
pub(crate) fn check_gguf_file(path: &Path) -> Result<(), LlmError> {
    let (file, ct) = open_gguf(path)?;
    let len = file
        .metadata()
        .map_err(|source| LlmError::Io {
            path: path.to_path_buf(),
            source,
        })?
        .len();
    // The first tensor, in file order, whose data runs past the end (the one a cut hit).
    let past_end = ct
        .tensor_infos
        .iter()
        .map(|(name, info)| {
            let dtype = info.ggml_dtype;
            let bytes =
                (info.shape.elem_count() / dtype.block_size()) as u64 * dtype.type_size() as u64;
            let end = ct
                .tensor_data_offset
                .saturating_add(info.offset)
                .saturating_add(bytes);
            (info.offset, name, end)
        })
        .filter(|&(_, _, end)| end > len)
        .min();
    if let Some((_, name, end)) = past_end {
        let again = match crate::manifest::name_for_path(path) {
            Some(model) => format!("fetch it again (`ferrograph models fetch {model}`)"),
            None => "copy it again".to_string(),
        };
        return Err(LlmError::invalid(
            path,
            format!(
                "tensor {name} ends at byte {end}, past the end of the file ({len} bytes): \
                 the file is truncated; {again}"
            ),
        ));
    }
    Ok(())
}

/// KV cache bytes per position of candle's models for this GGUF: `f32` keys and values of
/// every key/value head in every layer (0 when the shape is not in the metadata).
fn candle_kv_bytes_per_token(ct: &gguf_file::Content, arch: &str) -> usize {
    let get = |k: &str| ferrograph_kernels::gguf_meta::usize(ct, &format!("{arch}.{k}"));
    let (Some(layers), Some(heads)) = (get("block_count"), get("attention.head_count")) else {
        return 0;
    };
    let kv_heads = get("attention.head_count_kv").unwrap_or(heads);
    let head_dim = get("attention.key_length")
        .or_else(|| get("embedding_length").map(|d| d / heads.max(1)))
        .unwrap_or(0);
    layers * 2 * kv_heads * head_dim * std::mem::size_of::<f32>()
}

fn md_str(ct: &gguf_file::Content, key: &str) -> Option<String> {
    ferrograph_kernels::gguf_meta::string(ct, key).map(str::to_string)
}

/// Token ids of `tokenizer`, added tokens included. `Tokenizer::get_vocab_size(true)` copies
/// the whole vocabulary into a map to count it; this does not.
fn vocab_size(tokenizer: &Tokenizer) -> usize {
    let base = tokenizer.get_model().get_vocab_size();
    let added = tokenizer
        .get_added_tokens_decoder()
        .keys()
        .map(|&id| id as usize + 1)
        .max()
        .unwrap_or(0);
    base.max(added)
}

/// The manifest name for a model path, for "fetch it with ..." messages.
fn fetch_name(path: &Path) -> String {
    crate::manifest::name_for_path(path).unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    })
}

impl Engine {
    /// Loads a GGUF model. Errors are typed: a missing file names the fetch command, a
    /// malformed one is [`LlmError::InvalidModel`], an unknown architecture lists the supported
    /// ones.
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Self, LlmError> {
        let start = Instant::now();
        let (file, mut ct) = open_gguf(path)?;
        let arch = md_str(&ct, "general.architecture")
            .ok_or_else(|| LlmError::invalid(path, "no general.architecture"))?;
        if !SUPPORTED_ARCHITECTURES.contains(&arch.as_str()) {
            return Err(LlmError::UnsupportedArchitecture {
                architecture: arch,
                path: path.to_path_buf(),
                supported: SUPPORTED_ARCHITECTURES.join(", "),
            });
        }
        let model_ctx =
            ferrograph_kernels::gguf_meta::usize(&ct, &format!("{arch}.context_length"))
                .unwrap_or(4096);
        let candle_kv_bytes_per_token = candle_kv_bytes_per_token(&ct, &arch);
        let mut context_length = model_ctx.min(options.max_context.max(1));
        match arch.as_str() {
            "llama" => context_length = context_length.min(quantized_llama::MAX_SEQ_LEN),
            "qwen2" | "qwen3" | "phi3" => {
                // These size their rotary tables by the metadata's context length: cap it at
                // what this load can use.
                ct.metadata.insert(
                    format!("{arch}.context_length"),
                    gguf_file::Value::U32(context_length as u32),
                );
                if arch == "qwen3" {
                    // candle's Qwen3 builds its rotary table and masks in `general.dtype`,
                    // half precision when the key is absent (as in llama.cpp's files): the
                    // angles then drift by tenths of a radian past position 128. Ask for f32.
                    ct.metadata
                        .insert("general.dtype".into(), gguf_file::Value::U32(0));
                }
            }
            _ => {}
        }

        let (tokenizer, specials) = if ct.metadata.contains_key("tokenizer.ggml.tokens") {
            tokenizer_from_gguf(&ct, path)?
        } else {
            let beside = path.with_file_name("tokenizer.json");
            if !beside.exists() {
                return Err(LlmError::invalid(
                    path,
                    "no tokenizer in the GGUF metadata and no tokenizer.json beside it",
                ));
            }
            (tokenizer_from_file(&beside)?, SpecialTokens::default())
        };
        let template = match md_str(&ct, "tokenizer.chat_template") {
            Some(src) => ChatTemplate::new(&src, &specials.bos_text, &specials.eos_text)?,
            None => ChatTemplate::fallback(&arch, &specials.bos_text, &specials.eos_text)?,
        };
        // The vocabulary's strings, scores and merges are the tokenizer's now: free the
        // header's copies before the weights are read (tens of MiB for a large vocabulary).
        for key in [
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.scores",
            "tokenizer.ggml.token_type",
            "tokenizer.ggml.merges",
        ] {
            ct.metadata.remove(key);
        }

        let device = crate::options::candle_device(options.device)?;
        // Weights are read through a counting reader: a progress bar on a terminal, or the
        // callback set with `progress::set_load_progress`.
        let total = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut file = crate::progress::ProgressReader::new(
            file,
            total,
            crate::progress::current(&fetch_name(path)),
        );
        let bad = |e: candle_core::Error| LlmError::invalid(path, e);
        let kernels = options.kernels.resolve();
        let support = ferrograph_kernels::decoder::check_supported(&ct);
        let fast = match (kernels, &support) {
            (ferrograph_kernels::decoder::Kernels::Candle, _) => false,
            (_, Ok(())) if device.is_cpu() => true,
            (ferrograph_kernels::decoder::Kernels::Fast, Err(why)) => {
                return Err(LlmError::invalid(path, format!("no fast kernels: {why}")))
            }
            _ => false,
        };
        if arch == "gemma3" && !fast {
            // candle's quantized Gemma 3 gates its feed-forward with SiLU where Gemma uses
            // GELU, applies no sliding window while decoding, and cannot extend a cached
            // prefix: its logits are far from llama.cpp's (tests/architectures.rs).
            let why = match support {
                Ok(()) if !device.is_cpu() => "it runs on the CPU only".to_string(),
                Ok(()) => "FERROGRAPH_KERNELS=candle asks for candle's path".to_string(),
                Err(why) => why,
            };
            return Err(LlmError::Config(format!(
                "Gemma 3 runs on ferrograph's own kernels only (candle's quantized Gemma 3 \
                 computes different logits), and they cannot run {}: {why}",
                path.display()
            )));
        }
        let weights =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match arch.as_str() {
                _ if fast => ferrograph_kernels::decoder::DecoderModel::load(&ct, &mut file)
                    .map(Weights::Fast)
                    .map_err(candle_core::Error::Msg),
                "llama" => quantized_llama::ModelWeights::from_gguf(ct, &mut file, &device)
                    .map(Weights::Llama),
                "qwen2" => quantized_qwen2::ModelWeights::from_gguf(ct, &mut file, &device)
                    .map(Weights::Qwen2),
                "qwen3" => quantized_qwen3::ModelWeights::from_gguf(ct, &mut file, &device)
                    .map(Weights::Qwen3),
                "phi3" => quantized_phi3::ModelWeights::from_gguf(false, ct, &mut file, &device)
                    .map(Weights::Phi3),
                other => Err(candle_core::Error::Msg(format!(
                    "internal: no candle model for {other}"
                ))),
            }))
            .map_err(|_| LlmError::invalid(path, "model loader panicked on malformed input"))?
            .map_err(bad)?;

        file.finish();
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        let info = ModelInfo {
            name,
            path: path.to_path_buf(),
            architecture: arch,
            context_length,
            vocab_size: vocab_size(&tokenizer),
            load_time: start.elapsed(),
        };
        tracing::info!(model = %info.name, arch = %info.architecture, ms = info.load_time.as_millis() as u64, "model loaded");
        Ok(Engine {
            shared: std::sync::Arc::new(Shared {
                info,
                tokenizer,
                specials,
                template,
                constraints: Default::default(),
                batching: Default::default(),
            }),
            base: Some(weights),
            device,
            prefixes: Vec::new(),
            max_prefixes: options.prefix_cache_entries,
            max_prefix_bytes: options.prefix_cache_bytes,
            candle_kv_bytes_per_token,
            clock: 0,
        })
    }

    /// The immutable part (tokenizer, template, info).
    pub fn shared(&self) -> std::sync::Arc<Shared> {
        self.shared.clone()
    }

    /// Which forward pass runs the model: `fast` (our kernels, [`ferrograph_kernels::decoder`]) or `candle`.
    pub fn kernels_name(&self) -> &'static str {
        match self.base {
            Some(Weights::Fast(_)) => "fast",
            _ => "candle",
        }
    }

    /// Bytes of weights one decode step reads, on our kernels (`None` on candle's models).
    pub fn weight_bytes_per_token(&self) -> Option<usize> {
        match &self.base {
            Some(Weights::Fast(m)) => Some(m.weight_bytes_per_token()),
            _ => None,
        }
    }

    pub(crate) fn logits(
        &self,
        w: &mut Weights,
        tokens: &[u32],
        pos: usize,
    ) -> Result<Vec<f32>, LlmError> {
        w.logits(tokens, pos, &self.device)
    }

    pub(crate) fn remember(&mut self, tokens: Vec<u32>, weights: &Weights) {
        if self.max_prefixes == 0 || !weights.snapshots() || tokens.is_empty() {
            return;
        }
        let Some(snapshot) = weights.try_clone() else {
            return;
        };
        self.clock += 1;
        if let Some(e) = self.prefixes.iter_mut().find(|e| e.tokens == tokens) {
            e.last_used = self.clock;
            return;
        }
        let bytes = snapshot.cache_bytes(tokens.len(), self.candle_kv_bytes_per_token);
        if bytes > self.max_prefix_bytes {
            tracing::debug!(
                tokens = tokens.len(),
                bytes,
                budget = self.max_prefix_bytes,
                "prefix too large for the prefix cache"
            );
            return;
        }
        // Least recently used first, until both the entry count and the byte budget fit.
        while !self.prefixes.is_empty()
            && (self.prefixes.len() >= self.max_prefixes
                || self.prefix_bytes() + bytes > self.max_prefix_bytes)
        {
            if let Some(oldest) = self
                .prefixes
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i)
            {
                self.prefixes.swap_remove(oldest);
            }
        }
        self.prefixes.push(PrefixEntry {
            tokens,
            weights: snapshot,
            bytes,
            last_used: self.clock,
        });
    }

    /// Whether prompt prefixes are kept for reuse at all.
    pub(crate) fn keeps_prefixes(&self) -> bool {
        self.max_prefixes > 0 && self.max_prefix_bytes > 0
    }

    /// Bytes held by the kept prefixes' KV caches.
    pub fn prefix_bytes(&self) -> usize {
        self.prefixes.iter().map(|e| e.bytes).sum()
    }

    /// Prompt prefixes kept for reuse.
    pub fn prefix_entries(&self) -> usize {
        self.prefixes.len()
    }

    /// Weights to start from for `prompt`: a cached snapshot of its longest known prefix (at
    /// least one token must remain to compute), or the fresh model. The flag says the base
    /// model itself was lent out and must be given back with [`Engine::give_back`].
    ///
    /// Where the backend can rewind its cache, a snapshot that shares only the start of the
    /// prompt also serves (at least [`MIN_SHARED_PREFIX`] tokens): the next turn of a chat
    /// repeats the system prompt and the earlier turns, then differs.
    pub(crate) fn start_state(
        &mut self,
        prompt: &[u32],
    ) -> Result<(Weights, usize, bool), LlmError> {
        self.clock += 1;
        let clock = self.clock;
        let mut best: Option<(usize, usize)> = None;
        for (i, e) in self.prefixes.iter().enumerate() {
            let shared = if e.tokens.len() < prompt.len() && prompt.starts_with(&e.tokens) {
                e.tokens.len()
            } else {
                let n = common_prefix(&e.tokens, prompt).min(prompt.len() - 1);
                if n >= MIN_SHARED_PREFIX && e.weights.rewinds_to(n) {
                    n
                } else {
                    0
                }
            };
            if shared > 0 && best.is_none_or(|(n, _)| shared > n) {
                best = Some((shared, i));
            }
        }
        if let Some((n, i)) = best {
            let e = &mut self.prefixes[i];
            let w = if n == e.tokens.len() {
                e.weights.try_clone()
            } else {
                e.weights.clone_prefix(n)
            };
            if let Some(w) = w {
                e.last_used = clock;
                return Ok((w, n, false));
            }
        }
        self.fresh_state()
    }

    /// The model with an empty KV cache: a clone of the base when it can be cloned, otherwise
    /// the base itself, lent out (the flag says so).
    fn fresh_state(&mut self) -> Result<(Weights, usize, bool), LlmError> {
        let base = self
            .base
            .as_ref()
            .ok_or_else(|| LlmError::Backend("model weights were lost after a panic".into()))?;
        if let Some(mut w) = base.try_clone() {
            w.reset();
            return Ok((w, 0, false));
        }
        let mut w = self
            .base
            .take()
            .ok_or_else(|| LlmError::Backend("model weights were lost after a panic".into()))?;
        w.reset();
        Ok((w, 0, true))
    }

    pub(crate) fn give_back(&mut self, mut w: Weights, lent: bool) {
        if lent {
            w.reset();
            self.base = Some(w);
        }
    }

    /// Generates a continuation of `prompt`. `on_piece` receives text pieces as they are
    /// final (they concatenate to the result's text); `cancelled` is polled between tokens.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        prefix_hint: Option<usize>,
        options: &GenerateOptions,
        on_piece: &mut dyn FnMut(&str),
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Generation, LlmError> {
        let mut seq = self.start(prompt, prefix_hint, options)?;
        let shared = self.shared.clone();
        let run = (|| {
            while seq.next_feed(&shared, None, on_piece, cancelled)? {
                let logits = self.logits(&mut seq.w, &seq.feed, seq.pos)?;
                self.fed(&mut seq, logits)?;
            }
            Ok(())
        })();
        match run {
            Ok(()) => self.finish(seq, on_piece),
            Err(e) => {
                self.release(seq);
                Err(e)
            }
        }
    }

    /// A validation error naming the first token id outside the model's vocabulary.
    pub(crate) fn check_vocabulary<'a>(
        &self,
        tokens: impl IntoIterator<Item = &'a u32>,
    ) -> Result<(), LlmError> {
        let vocab = self.shared.info.vocab_size;
        match tokens.into_iter().find(|&&t| t as usize >= vocab) {
            Some(bad) => Err(LlmError::Validation(format!(
                "token id {bad} is outside the vocabulary ({vocab} tokens)"
            ))),
            None => Ok(()),
        }
    }

    /// Forgets every cached prompt prefix (benchmarks start cold).
    pub(crate) fn forget_prefixes(&mut self) {
        self.prefixes.clear();
    }

    /// Runs the raw forward pass for benchmarks: prefill `prompt`, then `n` greedy decode
    /// steps that ignore end-of-sequence. Returns (prefill, first token, decode) durations.
    pub fn bench_forward(
        &mut self,
        prompt: &[u32],
        n: usize,
    ) -> Result<(Duration, Duration, Duration), LlmError> {
        let start = Instant::now();
        self.prefixes.clear();
        let (mut w, _, lent) = self.start_state(prompt)?;
        let result = self.bench_from(&mut w, prompt, n, start);
        self.give_back(w, lent);
        result
    }

    /// Logits for the token after `prompt` and after each token of `continuation` fed in
    /// turn (teacher forcing): `continuation.len() + 1` rows, one per position, each of
    /// vocabulary size. The prompt is prefilled in one forward pass and the continuation then
    /// decoded one token at a time through the KV cache, as generation does; the prompt-prefix
    /// cache is not used. For scoring text and for checks against reference implementations.
    pub fn teacher_forced_logits(
        &mut self,
        prompt: &[u32],
        continuation: &[u32],
    ) -> Result<Vec<Vec<f32>>, LlmError> {
        if prompt.is_empty() {
            return Err(LlmError::Validation("empty prompt".into()));
        }
        let total = prompt.len() + continuation.len();
        if total >= self.shared.info.context_length {
            return Err(LlmError::Validation(format!(
                "{total} tokens do not fit the context of {}",
                self.shared.info.context_length
            )));
        }
        self.check_vocabulary(prompt.iter().chain(continuation))?;
        let (mut w, _, lent) = self.fresh_state()?;
        let rows = self.forced_rows(&mut w, prompt, continuation);
        self.give_back(w, lent);
        rows
    }

    fn forced_rows(
        &self,
        w: &mut Weights,
        prompt: &[u32],
        continuation: &[u32],
    ) -> Result<Vec<Vec<f32>>, LlmError> {
        let mut rows = Vec::with_capacity(continuation.len() + 1);
        rows.push(self.logits(w, prompt, 0)?);
        for (i, &tok) in continuation.iter().enumerate() {
            rows.push(self.logits(w, &[tok], prompt.len() + i)?);
        }
        Ok(rows)
    }

    fn bench_from(
        &mut self,
        w: &mut Weights,
        prompt: &[u32],
        n: usize,
        start: Instant,
    ) -> Result<(Duration, Duration, Duration), LlmError> {
        let mut logits = self.logits(w, prompt, 0)?;
        let prefill = start.elapsed();
        let mut tok = crate::sampling::argmax(&logits);
        let ttft = start.elapsed();
        let t = Instant::now();
        for pos in prompt.len()..prompt.len() + n {
            logits = self.logits(w, &[tok], pos)?;
            tok = crate::sampling::argmax(&logits);
        }
        Ok((prefill, ttft, t.elapsed()))
    }
}

/// The fewest tokens a cached conversation must share with a prompt to be rewound and
/// reused (below this, copying its cache costs about what it saves).
pub(crate) const MIN_SHARED_PREFIX: usize = 16;

/// How many tokens `a` and `b` start with in common.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
