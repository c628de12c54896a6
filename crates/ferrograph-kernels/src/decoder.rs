//! Our own forward pass for llama-style decoder GGUF models over the [kernels](crate):
//! weights repacked at load, activations quantized to 8-bit blocks per matrix product, fused
//! RMSNorm/RoPE, a KV cache that grows with the sequence (no dense masks, nothing sized by the
//! model's full context) and a persistent worker pool.
//!
//! Architectures ([`Family`]): `llama` (SmolLM2, Llama 2/3 without rope scaling, Mistral
//! without sliding windows), `qwen2` (biases on q/k/v), `qwen3` (per-head q/k norms) and
//! `gemma3` (per-head q/k norms, norms after attention and feed-forward, GELU, scaled
//! embeddings, sliding-window layers with their own rotary base). Their differences are
//! flags on one [`DecoderConfig`]; `tests/architectures.rs` checks each against llama.cpp.
//!
//! `ferrograph_llm::Engine` uses it for these architectures when every tensor type has a
//! kernel, unless `FERROGRAPH_KERNELS=candle` (or `ferrograph_llm::LoadOptions::kernels`)
//! asks for candle's reference path. A clone shares the weights and copies the KV cache, so
//! prompt prefix snapshots stay cheap and independent.

use crate as kernels;
use crate::attention::{
    attention, attention_here, keys_seen, AttnSeq, AttnShape, KvCache, SpareCaches, SLIDING_SLACK,
};
use crate::ops::{add, add_rows, dot8, exp_approx};
use crate::{GgufType, QAct, QMatrix};
use candle_core::quantized::{gguf_file, GgmlDType};
use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;

/// The decoder families the fast path runs (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `llama`: interleaved rotary pairs, SiLU-gated feed-forward.
    Llama,
    /// `qwen2`: like llama with biases on the q/k/v projections and split-half rotary pairs.
    Qwen2,
    /// `qwen3`: split-half rotary pairs and an RMSNorm on every query and key head.
    Qwen3,
    /// `gemma3`: q/k head norms, norms after attention and feed-forward, GELU-gated
    /// feed-forward, embeddings scaled by the square root of their width, and five
    /// sliding-window layers (rotary base 10,000) for every global one.
    Gemma3,
}

impl Family {
    /// The family of a `general.architecture` value, if the fast path runs it.
    pub fn from_architecture(arch: &str) -> Option<Family> {
        Some(match arch {
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "gemma3" => Family::Gemma3,
            _ => return None,
        })
    }

    /// The `general.architecture` value (the metadata key prefix).
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Gemma3 => "gemma3",
        }
    }
}

/// Gemma 3 alternates five sliding-window layers with one global layer.
const GEMMA3_SLIDING_PATTERN: usize = 6;
/// Gemma 3's rotary base in its sliding-window layers.
const GEMMA3_LOCAL_ROPE_BASE: f32 = 10_000.0;

/// Shape and hyper-parameters of a decoder model.
#[derive(Clone, Debug)]
pub struct DecoderConfig {
    /// The architecture.
    pub family: Family,
    /// Embedding width.
    pub dim: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head (`heads * head_dim` may differ from `dim`, as in Gemma 3 and Qwen3).
    pub head_dim: usize,
    /// Feed-forward width.
    pub ffn: usize,
    /// Output rows (vocabulary).
    pub vocab: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RoPE base frequency (of the global layers, for Gemma 3).
    pub rope_base: f32,
    /// Sliding attention window in tokens (Gemma 3's local layers), if any.
    pub sliding_window: Option<usize>,
    /// Attention logit scale.
    pub attn_scale: f32,
}

impl DecoderConfig {
    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Whether layer `l` attends through the sliding window.
    pub fn is_sliding(&self, l: usize) -> bool {
        self.sliding_window.is_some() && !(l + 1).is_multiple_of(GEMMA3_SLIDING_PATTERN)
    }

    fn neox_rope(&self) -> bool {
        self.family != Family::Llama
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: QMatrix,
    wk: QMatrix,
    wv: QMatrix,
    /// Qwen2's q/k/v biases.
    bias: Option<[Vec<f32>; 3]>,
    /// Qwen3's and Gemma 3's per-head query and key norms.
    qk_norm: Option<[Vec<f32>; 2]>,
    wo: QMatrix,
    /// Gemma 3's norm of the attention output, before the residual add.
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    gate: QMatrix,
    up: QMatrix,
    down: QMatrix,
    /// Gemma 3's norm of the feed-forward output, before the residual add.
    post_ffn_norm: Option<Vec<f32>>,
    /// Whether this layer attends through the sliding window (with the local rotary base).
    sliding: bool,
}

/// The immutable weights.
pub struct DecoderWeights {
    cfg: DecoderConfig,
    embed: QMatrix,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    output: Option<QMatrix>,
    /// Rotary inverse frequencies of the global layers.
    rope_global: Vec<f32>,
    /// Rotary inverse frequencies of the sliding-window layers, when the model has them.
    rope_local: Option<Vec<f32>>,
    /// KV-cache memory of dropped instances, for new ones.
    spare: SpareCaches,
}

impl std::fmt::Debug for DecoderWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecoderWeights")
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// A model instance: shared weights plus its own KV cache.
#[derive(Clone, Debug)]
pub struct DecoderModel {
    w: Arc<DecoderWeights>,
    /// Per layer, the keys (after RoPE) and values of the cached tokens.
    cache: Vec<KvCache>,
    len: usize,
}

impl Drop for DecoderModel {
    /// The KV cache's memory goes to the model's spare memory, for the next instance.
    fn drop(&mut self) {
        for c in &mut self.cache {
            c.recycle(&self.w.spare);
        }
    }
}

fn md_usize(ct: &gguf_file::Content, key: &str) -> Result<usize, String> {
    crate::gguf_meta::usize(ct, key).ok_or_else(|| format!("missing or not a count: {key}"))
}

fn md_f32(ct: &gguf_file::Content, key: &str) -> Option<f32> {
    crate::gguf_meta::f32(ct, key)
}

fn gguf_type(t: GgmlDType) -> Option<GgufType> {
    Some(match t {
        GgmlDType::F32 => GgufType::F32,
        GgmlDType::F16 => GgufType::F16,
        GgmlDType::Q4_0 => GgufType::Q4_0,
        GgmlDType::Q4_1 => GgufType::Q4_1,
        GgmlDType::Q5_0 => GgufType::Q5_0,
        GgmlDType::Q5_1 => GgufType::Q5_1,
        GgmlDType::Q8_0 => GgufType::Q8_0,
        GgmlDType::Q4K => GgufType::Q4K,
        GgmlDType::Q6K => GgufType::Q6K,
        _ => return None,
    })
}

fn config(ct: &gguf_file::Content) -> Result<DecoderConfig, String> {
    let arch = crate::gguf_meta::string(ct, "general.architecture")
        .ok_or("missing general.architecture")?
        .to_string();
    let family = Family::from_architecture(&arch).ok_or_else(|| format!("architecture {arch}"))?;
    let a = family.architecture();
    let dim = md_usize(ct, &format!("{a}.embedding_length"))?;
    let heads = md_usize(ct, &format!("{a}.attention.head_count"))?;
    let kv_heads = md_usize(ct, &format!("{a}.attention.head_count_kv")).unwrap_or(heads);
    let layers = md_usize(ct, &format!("{a}.block_count"))?;
    let ffn = md_usize(ct, &format!("{a}.feed_forward_length"))?;
    if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 || layers == 0 || dim == 0 {
        return Err(format!(
            "inconsistent heads: dim {dim}, heads {heads}/{kv_heads}"
        ));
    }
    let head_dim = match md_usize(ct, &format!("{a}.attention.key_length")) {
        Ok(k) => k,
        Err(_) if dim % heads == 0 => dim / heads,
        Err(_) => return Err(format!("dim {dim} is not a multiple of {heads} heads")),
    };
    if let Ok(v) = md_usize(ct, &format!("{a}.attention.value_length")) {
        if v != head_dim {
            return Err(format!(
                "value heads of {v} differ from key heads of {head_dim}"
            ));
        }
    }
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err("odd head width".into());
    }
    if let Ok(rd) = md_usize(ct, &format!("{a}.rope.dimension_count")) {
        if rd != head_dim {
            return Err(format!("partial rotary ({rd} of {head_dim})"));
        }
    }
    if ct.metadata.contains_key(&format!("{a}.rope.scaling.type"))
        || ct.tensor_infos.contains_key("rope_freqs.weight")
    {
        return Err("rope scaling".into());
    }
    if md_usize(ct, &format!("{a}.expert_count")).unwrap_or(0) > 0 {
        return Err("mixture of experts".into());
    }
    if family != Family::Gemma3
        && md_usize(ct, &format!("{a}.attention.sliding_window")).is_ok_and(|w| w > 0)
    {
        return Err("sliding-window attention".into());
    }
    if md_f32(ct, &format!("{a}.final_logit_softcapping")).is_some()
        || md_f32(ct, &format!("{a}.attn_logit_softcapping")).is_some()
    {
        return Err("logit soft-capping".into());
    }
    let embed = ct
        .tensor_infos
        .get("token_embd.weight")
        .ok_or("missing token_embd.weight")?;
    let vocab = embed.shape.dims().first().copied().unwrap_or(0);
    let sliding_window = match family {
        Family::Gemma3 => Some(md_usize(ct, "gemma3.attention.sliding_window")?.max(1)),
        _ => None,
    };
    // Gemma 3 27B scales queries by its embedding width per head rather than its head width
    // (llama.cpp tells it by its 62 layers).
    let scale_width = if family == Family::Gemma3 && layers == 62 {
        dim / heads
    } else {
        head_dim
    };
    let default_base = if family == Family::Gemma3 {
        1_000_000.0
    } else {
        10_000.0
    };
    Ok(DecoderConfig {
        family,
        dim,
        layers,
        heads,
        kv_heads,
        head_dim,
        ffn,
        vocab,
        eps: md_f32(ct, &format!("{a}.attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
        rope_base: md_f32(ct, &format!("{a}.rope.freq_base")).unwrap_or(default_base),
        sliding_window,
        attn_scale: 1.0 / (scale_width.max(1) as f32).sqrt(),
    })
}

/// Tensor names and shapes (rows, cols) the model needs; vectors have rows = 1.
fn tensor_plan(cfg: &DecoderConfig, tied: bool) -> Vec<(String, usize, usize)> {
    let (d, q, kv, f, hd) = (cfg.dim, cfg.q_dim(), cfg.kv_dim(), cfg.ffn, cfg.head_dim);
    let mut v = vec![
        ("token_embd.weight".to_string(), cfg.vocab, d),
        ("output_norm.weight".to_string(), 1, d),
    ];
    if !tied {
        v.push(("output.weight".into(), cfg.vocab, d));
    }
    for l in 0..cfg.layers {
        let p = format!("blk.{l}.");
        v.extend([
            (format!("{p}attn_norm.weight"), 1, d),
            (format!("{p}attn_q.weight"), q, d),
            (format!("{p}attn_k.weight"), kv, d),
            (format!("{p}attn_v.weight"), kv, d),
            (format!("{p}attn_output.weight"), d, q),
            (format!("{p}ffn_norm.weight"), 1, d),
            (format!("{p}ffn_gate.weight"), f, d),
            (format!("{p}ffn_up.weight"), f, d),
            (format!("{p}ffn_down.weight"), d, f),
        ]);
        if cfg.family == Family::Qwen2 {
            v.extend([
                (format!("{p}attn_q.bias"), 1, q),
                (format!("{p}attn_k.bias"), 1, kv),
                (format!("{p}attn_v.bias"), 1, kv),
            ]);
        }
        if matches!(cfg.family, Family::Qwen3 | Family::Gemma3) {
            v.extend([
                (format!("{p}attn_q_norm.weight"), 1, hd),
                (format!("{p}attn_k_norm.weight"), 1, hd),
            ]);
        }
        if cfg.family == Family::Gemma3 {
            v.extend([
                (format!("{p}post_attention_norm.weight"), 1, d),
                (format!("{p}post_ffw_norm.weight"), 1, d),
            ]);
        }
    }
    v
}

/// Whether the fast path can run this GGUF: `Err` says why not (then candle's path is used).
pub fn check_supported(ct: &gguf_file::Content) -> Result<(), String> {
    let cfg = config(ct)?;
    let tied = !ct.tensor_infos.contains_key("output.weight");
    for (name, rows, cols) in tensor_plan(&cfg, tied) {
        let info = ct
            .tensor_infos
            .get(&name)
            .ok_or_else(|| format!("missing {name}"))?;
        let ty = gguf_type(info.ggml_dtype)
            .ok_or_else(|| format!("{name}: no kernel for {:?}", info.ggml_dtype))?;
        let dims = info.shape.dims();
        let ok = if rows == 1 {
            dims.iter().product::<usize>() == cols && matches!(ty, GgufType::F32 | GgufType::F16)
        } else {
            dims == [rows, cols]
                && !matches!(ty, GgufType::F32 | GgufType::F16)
                && cols % ty.block_elems() == 0
                && cols % kernels::QK == 0
        };
        if !ok {
            return Err(format!(
                "{name}: {:?} {dims:?}, expected {rows}x{cols}",
                info.ggml_dtype
            ));
        }
    }
    Ok(())
}

struct Reader<'a, R> {
    ct: &'a gguf_file::Content,
    file: &'a mut R,
    file_len: u64,
    /// Where the matrices' buffers go, one after another in the order the forward pass
    /// reads them (the loader reads the tensors in that order).
    arena: kernels::WeightArena,
}

impl<R: Read + Seek> Reader<'_, R> {
    /// Seeks to tensor `name` and returns its type and byte length.
    fn seek(&mut self, name: &str) -> Result<(GgufType, usize), String> {
        let info = self
            .ct
            .tensor_infos
            .get(name)
            .ok_or_else(|| format!("missing {name}"))?;
        let ty = gguf_type(info.ggml_dtype).ok_or_else(|| format!("{name}: unsupported type"))?;
        let elems: usize = info.shape.dims().iter().product();
        let len = ty
            .bytes_for(elems)
            .ok_or_else(|| format!("{name}: not whole blocks"))?;
        let start = self
            .ct
            .tensor_data_offset
            .checked_add(info.offset)
            .ok_or_else(|| format!("{name}: bad offset"))?;
        if start.saturating_add(len as u64) > self.file_len {
            return Err(format!("{name}: data past the end of the file"));
        }
        self.file
            .seek(SeekFrom::Start(start))
            .map_err(|e| format!("{name}: {e}"))?;
        Ok((ty, len))
    }

    fn bytes(&mut self, name: &str) -> Result<(GgufType, Vec<u8>), String> {
        let (ty, len) = self.seek(name)?;
        let mut buf = vec![0u8; len];
        self.file
            .read_exact(&mut buf)
            .map_err(|e| format!("{name}: {e}"))?;
        Ok((ty, buf))
    }

    /// A matrix, repacked as it is read (no copy of the whole tensor is held), in the arena.
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<QMatrix, String> {
        let (ty, len) = self.seek(name)?;
        let need = QMatrix::gguf_bytes(ty, rows, cols).map_err(|e| format!("{name}: {e}"))?;
        if len != need {
            return Err(format!(
                "{name}: {len} bytes where {ty:?} {rows}x{cols} needs {need}"
            ));
        }
        let mut m = QMatrix::read_gguf(ty, rows, cols, &mut self.file)
            .map_err(|e| format!("{name}: {e}"))?;
        m.move_into(&mut self.arena);
        Ok(m)
    }

    fn vector(&mut self, name: &str, n: usize) -> Result<Vec<f32>, String> {
        let (ty, buf) = self.bytes(name)?;
        let v: Vec<f32> = match ty {
            GgufType::F32 => buf
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            GgufType::F16 => buf
                .chunks_exact(2)
                .map(|c| kernels::f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            _ => return Err(format!("{name}: expected a float vector")),
        };
        if v.len() != n {
            return Err(format!("{name}: {} values, expected {n}", v.len()));
        }
        Ok(v)
    }
}

fn inv_freq(base: f32, head_dim: usize) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / head_dim as f32))
        .collect()
}

impl DecoderModel {
    /// Loads the weights of a GGUF whose header is `ct` from `file` (the same file).
    pub fn load<R: Read + Seek>(ct: &gguf_file::Content, file: &mut R) -> Result<Self, String> {
        check_supported(ct)?;
        let cfg = config(ct)?;
        let file_len = file
            .seek(SeekFrom::End(0))
            .map_err(|e| format!("cannot read the file: {e}"))?;
        let mut rd = Reader {
            ct,
            file,
            file_len,
            arena: kernels::WeightArena::new(),
        };
        let (d, q, kv, f, hd) = (cfg.dim, cfg.q_dim(), cfg.kv_dim(), cfg.ffn, cfg.head_dim);
        let embed = rd.matrix("token_embd.weight", cfg.vocab, d)?;
        let norm = rd.vector("output_norm.weight", d)?;
        let output = if ct.tensor_infos.contains_key("output.weight") {
            Some(rd.matrix("output.weight", cfg.vocab, d)?)
        } else {
            None
        };
        let family = cfg.family;
        let mut layers = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let p = format!("blk.{l}.");
            layers.push(Layer {
                attn_norm: rd.vector(&format!("{p}attn_norm.weight"), d)?,
                wq: rd.matrix(&format!("{p}attn_q.weight"), q, d)?,
                wk: rd.matrix(&format!("{p}attn_k.weight"), kv, d)?,
                wv: rd.matrix(&format!("{p}attn_v.weight"), kv, d)?,
                bias: match family {
                    Family::Qwen2 => Some([
                        rd.vector(&format!("{p}attn_q.bias"), q)?,
                        rd.vector(&format!("{p}attn_k.bias"), kv)?,
                        rd.vector(&format!("{p}attn_v.bias"), kv)?,
                    ]),
                    _ => None,
                },
                qk_norm: match family {
                    Family::Qwen3 | Family::Gemma3 => Some([
                        rd.vector(&format!("{p}attn_q_norm.weight"), hd)?,
                        rd.vector(&format!("{p}attn_k_norm.weight"), hd)?,
                    ]),
                    _ => None,
                },
                wo: rd.matrix(&format!("{p}attn_output.weight"), d, q)?,
                post_attn_norm: match family {
                    Family::Gemma3 => {
                        Some(rd.vector(&format!("{p}post_attention_norm.weight"), d)?)
                    }
                    _ => None,
                },
                ffn_norm: rd.vector(&format!("{p}ffn_norm.weight"), d)?,
                gate: rd.matrix(&format!("{p}ffn_gate.weight"), f, d)?,
                up: rd.matrix(&format!("{p}ffn_up.weight"), f, d)?,
                down: rd.matrix(&format!("{p}ffn_down.weight"), d, f)?,
                post_ffn_norm: match family {
                    Family::Gemma3 => Some(rd.vector(&format!("{p}post_ffw_norm.weight"), d)?),
                    _ => None,
                },
                sliding: cfg.is_sliding(l),
            });
        }
        // Sliding-window layers keep only the keys their window can still reach.
        let cache: Vec<KvCache> = layers
            .iter()
            .map(|l: &Layer| match cfg.sliding_window {
                Some(w) if l.sliding => KvCache::sliding(w),
                _ => KvCache::default(),
            })
            .collect();
        let rope_global = inv_freq(cfg.rope_base, hd);
        let rope_local = cfg
            .sliding_window
            .map(|_| inv_freq(GEMMA3_LOCAL_ROPE_BASE, hd));
        Ok(DecoderModel {
            w: Arc::new(DecoderWeights {
                cfg,
                embed,
                layers,
                norm,
                output,
                rope_global,
                rope_local,
                spare: SpareCaches::default(),
            }),
            cache,
            len: 0,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &DecoderConfig {
        &self.w.cfg
    }

    /// Bytes of weights one decode step reads: every layer's matrices and the output head
    /// (the embedding table only for its one row, when the head is a separate matrix).
    pub fn weight_bytes_per_token(&self) -> usize {
        let w = &self.w;
        let layers: usize = w
            .layers
            .iter()
            .map(|l| {
                [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down]
                    .iter()
                    .map(|m| m.bytes())
                    .sum::<usize>()
            })
            .sum();
        layers + w.output.as_ref().unwrap_or(&w.embed).bytes()
    }

    /// Tokens in the KV cache.
    pub fn cached(&self) -> usize {
        self.len
    }

    /// Whether the sequence can go on from its first `len` cached tokens. Always, except where
    /// a sliding-window layer has dropped keys that rows from `len` on would see: it keeps
    /// only its window and 64 tokens more, so a long sequence can be rewound only that far.
    pub fn rewinds_to(&self, len: usize) -> bool {
        self.cache.iter().all(|c| c.rewinds_to(len))
    }

    /// A copy whose KV cache holds only the first `len` cached tokens: a conversation that
    /// shares only the start of this one continues from there. Only what is kept is copied.
    /// `None` when it cannot go on from there ([`DecoderModel::rewinds_to`]).
    pub fn clone_prefix(&self, len: usize) -> Option<Self> {
        let len = len.min(self.len);
        if !self.rewinds_to(len) {
            return None;
        }
        let kv = self.w.cfg.kv_dim();
        Some(DecoderModel {
            w: self.w.clone(),
            cache: self
                .cache
                .iter()
                .map(|c| c.prefix(len, kv, &self.w.spare))
                .collect(),
            len,
        })
    }

    /// Bytes held by the KV cache (half floats, capacity included).
    pub fn cache_bytes(&self) -> usize {
        self.cache.iter().map(KvCache::bytes).sum()
    }

    /// Forgets the KV cache (keeping its memory).
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    fn truncate(&mut self, len: usize) {
        let kv = self.w.cfg.kv_dim();
        for c in &mut self.cache {
            c.truncate(len, kv);
        }
        self.len = len.min(self.len);
    }

    /// Runs `tokens` at positions `pos..` (dropping any cached tokens from `pos` on) and
    /// returns the logits of the last one. A long prompt goes through in passes of at most
    /// [`MAX_PASS_ROWS`] tokens, which bounds the activations' memory and gives the same
    /// logits (every row is computed alone).
    pub fn forward(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<f32>, String> {
        if tokens.is_empty() {
            return Err("no tokens".into());
        }
        let mut logits = Vec::new();
        for (i, chunk) in tokens.chunks(MAX_PASS_ROWS).enumerate() {
            let mut one = [BatchItem {
                model: &mut *self,
                tokens: chunk,
                pos: pos + i * MAX_PASS_ROWS,
                logits,
            }];
            logits = forward_batch(&mut one)?
                .pop()
                .ok_or_else(|| "no logits".to_string())?;
        }
        Ok(logits)
    }
}

/// The most tokens [`DecoderModel::forward`] runs in one pass.
pub const MAX_PASS_ROWS: usize = 512;

/// One sequence's part of a batched forward pass ([`forward_batch`]).
#[derive(Debug)]
pub struct BatchItem<'a> {
    /// The sequence: the shared weights and its own KV cache.
    pub model: &'a mut DecoderModel,
    /// Its new tokens (one while decoding, a chunk of the prompt while prefilling).
    pub tokens: &'a [u32],
    /// The position of its first new token (cached tokens from there on are dropped).
    pub pos: usize,
    /// Where its logits go: [`forward_batch`] returns this vector, cleared and refilled, so
    /// that a caller that passes each sequence's previous logits allocates nothing per decode
    /// step (an empty vector is fine; what it held does not matter).
    pub logits: Vec<f32>,
}

/// Runs several sequences of one model in one forward pass and returns, per sequence, the
/// logits of its last new token.
///
/// The rows of every sequence go through each matrix product together, so the weights are
/// read once per pass rather than once per sequence: decoding four sequences costs little
/// more than decoding one. Positions, rotary angles, KV caches and attention stay per
/// sequence. Every operation is computed row by row in the same order whatever else is in
/// the batch, so a sequence's logits are bit for bit those of [`DecoderModel::forward`] on it
/// alone.
pub fn forward_batch(items: &mut [BatchItem<'_>]) -> Result<Vec<Vec<f32>>, String> {
    let Some(first) = items.first() else {
        return Ok(Vec::new());
    };
    let w = first.model.w.clone();
    let cfg = &w.cfg;
    for it in items.iter() {
        if !Arc::ptr_eq(&it.model.w, &w) {
            return Err("a batch holds sequences of different models".into());
        }
        if it.tokens.is_empty() {
            return Err("no tokens".into());
        }
        if it.pos > it.model.len {
            return Err(format!(
                "position {} is past the {} cached tokens",
                it.pos, it.model.len
            ));
        }
        if !it.model.rewinds_to(it.pos) {
            return Err(format!(
                "cannot go back to position {} of {}: the sliding-window layers keep only \
                 {SLIDING_SLACK} tokens beyond their window",
                it.pos, it.model.len
            ));
        }
    }
    let (d, hd) = (cfg.dim, cfg.head_dim);
    let (qd, kv) = (cfg.q_dim(), cfg.kv_dim());
    // Row ranges of the sequences in the stacked activations.
    let mut spans = Vec::with_capacity(items.len());
    let mut t_n = 0;
    for it in items.iter() {
        spans.push(t_n..t_n + it.tokens.len());
        t_n += it.tokens.len();
    }
    let mut x = vec![0f32; t_n * d];
    for (row, &tok) in x
        .chunks_exact_mut(d)
        .zip(items.iter().flat_map(|it| it.tokens))
    {
        if !w.embed.dequantize_row(tok as usize, row) {
            return Err(format!(
                "token {tok} is outside the vocabulary of {}",
                cfg.vocab
            ));
        }
    }
    for it in items.iter_mut() {
        it.model.truncate(it.pos);
    }
    if cfg.family == Family::Gemma3 {
        let s = (d as f32).sqrt();
        x.iter_mut().for_each(|v| *v *= s);
    }
    // RoPE angles of each sequence's new positions.
    let tables: Vec<(RopeTable, Option<RopeTable>)> = items
        .iter()
        .map(|it| {
            let n = it.tokens.len();
            (
                RopeTable::new(&w.rope_global, it.pos, n),
                w.rope_local.as_ref().map(|f| RopeTable::new(f, it.pos, n)),
            )
        })
        .collect();
    let mut h = vec![0f32; t_n * d];
    let mut act = QAct::default();
    let (mut q, mut k, mut v) = (
        vec![0f32; t_n * qd],
        vec![0f32; t_n * kv],
        vec![0f32; t_n * kv],
    );
    let mut attn = vec![0f32; t_n * qd];
    let mut o = vec![0f32; t_n * d];
    let (mut g, mut u) = (vec![0f32; t_n * cfg.ffn], vec![0f32; t_n * cfg.ffn]);
    let neox = cfg.neox_rope();
    let shape = AttnShape {
        heads: cfg.heads,
        kv_heads: cfg.kv_heads,
        hd,
        scale: cfg.attn_scale,
    };
    // Element-wise work and activation quantization are split over the kernels' pool by
    // token rows (one token, as in decode, runs on the calling thread).
    let pool = kernels::pool::global();
    // Whether each layer's attention takes one dispatch: global layers, then sliding ones.
    let new_rows: Vec<(usize, usize)> = items.iter().map(|it| (it.pos, it.tokens.len())).collect();
    let one_dispatch =
        [None, cfg.sliding_window].map(|w| attention_in_one_dispatch(pool, &new_rows, w));
    for (li, layer) in w.layers.iter().enumerate() {
        rms_norm(&x, &layer.attn_norm, cfg.eps, &mut h);
        act.quantize_on(pool, &h, d);
        kernels::matmul(
            &mut [
                (&layer.wq, &mut q[..]),
                (&layer.wk, &mut k[..]),
                (&layer.wv, &mut v[..]),
            ],
            &act,
        );
        if let Some([bq, bk, bv]) = &layer.bias {
            add_rows(&mut q, bq);
            add_rows(&mut k, bk);
            add_rows(&mut v, bv);
        }
        if let Some([nq, nk]) = &layer.qk_norm {
            rms_norm_in_place(&mut q, nq, cfg.eps);
            rms_norm_in_place(&mut k, nk, cfg.eps);
        }
        // Sliding-window layers attend through the window with the local rotary base.
        let local_layer = layer.sliding && w.rope_local.is_some();
        let window = if local_layer {
            cfg.sliding_window
        } else {
            None
        };
        // Each sequence's rotations and cache append, the sequences split over the pool: the
        // rows were just written by whichever thread computed them, and reading them on one
        // thread waited on the other's caches.
        let mut work: Vec<SeqRope<'_>> = Vec::with_capacity(items.len());
        let (mut q_rest, mut k_rest, mut v_rest) = (&mut q[..], &mut k[..], &v[..]);
        for ((it, span), (global, local)) in items.iter_mut().zip(&spans).zip(&tables) {
            let n = span.len();
            let (qs, qt) = std::mem::take(&mut q_rest).split_at_mut(n * qd);
            let (ks, kt) = std::mem::take(&mut k_rest).split_at_mut(n * kv);
            let (vs, vt) = v_rest.split_at(n * kv);
            (q_rest, k_rest, v_rest) = (qt, kt, vt);
            let (this, later) = it.model.cache[li..].split_at_mut(1);
            work.push(SeqRope {
                cache: &mut this[0],
                next: later.first(),
                pos: it.pos,
                q: qs,
                k: ks,
                v: vs,
                table: match (local, local_layer) {
                    (Some(local), true) => local,
                    _ => global,
                },
            });
        }
        let (kv_heads, spare) = (cfg.kv_heads, &w.spare);
        if one_dispatch[usize::from(local_layer)] {
            // A decode step whose sequences split evenly over the threads: each thread
            // rotates, appends, attends and quantizes its own sequences' rows (the
            // quantization's pieces are the pool's split of the rows, one row a sequence),
            // in one dispatch instead of three.
            let work: Vec<parking_lot::Mutex<SeqRope<'_>>> =
                work.into_iter().map(parking_lot::Mutex::new).collect();
            act.quantize_prepared_on(pool, &mut attn, qd, &|at, rows| {
                for (j, out) in rows.chunks_exact_mut(qd).enumerate() {
                    if let Some(s) = work.get(at / qd + j) {
                        let mut s = s.lock();
                        s.rotate_and_append(hd, kv_heads, neox, spare);
                        s.attend(&shape, window, out);
                    }
                }
            });
        } else {
            pool.for_each_piece(&mut work, 1, &|_, pieces| {
                for s in pieces.iter_mut() {
                    s.rotate_and_append(hd, kv_heads, neox, spare);
                }
            });
            drop(work);
            let seqs: Vec<AttnSeq<'_>> = items
                .iter()
                .zip(&spans)
                .map(|(it, span)| AttnSeq {
                    cache: &it.model.cache[li],
                    pos: it.pos,
                    rows: span.clone(),
                })
                .collect();
            attention(&shape, &q, &seqs, window, &mut attn);
            act.quantize_on(pool, &attn, qd);
        }
        kernels::matmul(&mut [(&layer.wo, &mut o[..])], &act);
        if let Some(n) = &layer.post_attn_norm {
            rms_norm_in_place(&mut o, n, cfg.eps);
        }
        add(&mut x, &o);
        rms_norm(&x, &layer.ffn_norm, cfg.eps, &mut h);
        act.quantize_on(pool, &h, d);
        kernels::matmul(
            &mut [(&layer.gate, &mut g[..]), (&layer.up, &mut u[..])],
            &act,
        );
        let gelu = cfg.family == Family::Gemma3;
        // The gate times the up projection, quantized by the thread that computed its rows.
        act.quantize_prepared_on(pool, &mut g, cfg.ffn, &|at, gate| {
            let up = &u[at..at + gate.len()];
            if gelu {
                gate.iter_mut()
                    .zip(up)
                    .for_each(|(a, b)| *a = gelu_tanh(*a) * b);
            } else {
                gate.iter_mut().zip(up).for_each(|(a, b)| *a = silu(*a) * b);
            }
        });
        kernels::matmul(&mut [(&layer.down, &mut o[..])], &act);
        if let Some(n) = &layer.post_ffn_norm {
            rms_norm_in_place(&mut o, n, cfg.eps);
        }
        add(&mut x, &o);
    }
    for (it, span) in items.iter_mut().zip(&spans) {
        it.model.len = it.pos + span.len();
    }
    // The output head over the last row of each sequence, in one product.
    let n = items.len();
    let mut hl = vec![0f32; n * d];
    for (row, span) in hl.chunks_exact_mut(d).zip(&spans) {
        rms_norm(&x[(span.end - 1) * d..span.end * d], &w.norm, cfg.eps, row);
    }
    act.quantize(&hl, d);
    let head = w.output.as_ref().unwrap_or(&w.embed);
    let vocab = cfg.vocab;
    if let [one] = items {
        // One sequence (every decode step of a lone request): the product writes straight
        // into its buffer, every element (a buffer of the right length is not zeroed first).
        let mut logits = std::mem::take(&mut one.logits);
        logits.resize(vocab, 0.0);
        kernels::matmul(&mut [(head, &mut logits[..])], &act);
        return Ok(vec![logits]);
    }
    // Several: one product into this thread's rows, then each row into its sequence's
    // buffer. Allocating and zeroing the rows and a new vector per sequence at every step
    // cost four sequences of SmolLM2 about 150 µs a step (page faults as much as copies).
    Ok(HEAD_ROWS.with_borrow_mut(|rows| {
        if rows.len() < n * vocab {
            rows.resize(n * vocab, 0.0);
        }
        let rows = &mut rows[..n * vocab];
        kernels::matmul(&mut [(head, &mut *rows)], &act);
        items
            .iter_mut()
            .zip(rows.chunks_exact(vocab))
            .map(|(it, row)| {
                let mut logits = std::mem::take(&mut it.logits);
                logits.clear();
                logits.extend_from_slice(row);
                logits
            })
            .collect()
    }))
}

thread_local! {
    /// The output head's rows of a batch (sequences by vocabulary), kept between passes on
    /// the thread that runs them, so that a decode step neither allocates nor zeroes them.
    static HEAD_ROWS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One sequence's share of a layer's rotations and cache append in [`forward_batch`].
struct SeqRope<'a> {
    cache: &'a mut KvCache,
    /// The next layer's cache, whose lines for the same positions this thread asks for now
    /// (it appends to it in the next layer).
    next: Option<&'a KvCache>,
    /// The sequence's first new position.
    pos: usize,
    q: &'a mut [f32],
    k: &'a mut [f32],
    v: &'a [f32],
    table: &'a RopeTable,
}

impl SeqRope<'_> {
    /// Rotates the sequence's new queries and keys, appends its keys and values to the
    /// layer's cache, and asks for the lines the next layer's append will write.
    fn rotate_and_append(&mut self, hd: usize, kv_heads: usize, neox: bool, spare: &SpareCaches) {
        rope(self.q, hd, &self.table.cos, &self.table.sin, neox);
        rope(self.k, hd, &self.table.cos, &self.table.sin, neox);
        self.cache.append(self.k, self.v, kv_heads, hd, spare);
        if let Some(next) = self.next {
            let rows = self.k.len() / (kv_heads * hd).max(1);
            next.prefetch_append(self.pos, rows, kv_heads, hd);
        }
    }

    /// The attention of the sequence's one new row (rotated and appended) over its cache,
    /// into `out`, on this thread.
    fn attend(&self, shape: &AttnShape, window: Option<usize>, out: &mut [f32]) {
        let seq = AttnSeq {
            cache: self.cache,
            pos: self.pos,
            rows: 0..1,
        };
        attention_here(shape, self.q, &seq, window, out);
    }
}

/// Most that one thread's share of a decode step's attention may exceed another's, in
/// quarters, for [`attention_in_one_dispatch`]: beyond that, sharing attention's units out
/// as threads free up wins back more than the two dispatches cost.
const ONE_DISPATCH_SKEW_QUARTERS: usize = 5;

/// Whether a layer's rotations, appends, attention and attention-output quantization run
/// in one dispatch, each thread doing its own sequences' (the pool's split of them), rather
/// than in three, attention's units shared out as threads free up. `new_rows` holds each
/// sequence's first new position and its count of new rows. One dispatch needs a decode step
/// (one new row a sequence) of at least two sequences on at least two threads, and threads'
/// shares of keys to attend to within 5/4 of each other: one long context among short ones
/// would keep a thread busy while the other waits. The same for every layer of a pass but
/// for the window, so a pass decides it once for its global layers and once for its
/// sliding-window ones. SmolLM2, four sequences on 2 threads: those parts took 668–766 µs a step in one
/// dispatch against 796–886 in three, about 1.5% of the step's time.
fn attention_in_one_dispatch(
    pool: &kernels::pool::Pool,
    new_rows: &[(usize, usize)],
    window: Option<usize>,
) -> bool {
    let n = new_rows.len();
    if n < 2 || pool.threads() < 2 || new_rows.iter().any(|&(_, rows)| rows != 1) {
        return false;
    }
    // Keys each sequence's row sees.
    let keys = |&(pos, _): &(usize, usize)| keys_seen(pos, window).len();
    let shares: Vec<usize> = pool
        .split(n)
        .map(|r| new_rows[r].iter().map(keys).sum())
        .collect();
    let (most, least) = (
        shares.iter().copied().max().unwrap_or(0),
        shares.iter().copied().min().unwrap_or(0),
    );
    4 * most <= ONE_DISPATCH_SKEW_QUARTERS * least
}

/// Cosines and sines of one rotary frequency table at the positions of one forward pass.
struct RopeTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    /// The angles of `inv_freq` at positions `pos..pos + t_n`, `[t][i]`.
    fn new(inv_freq: &[f32], pos: usize, t_n: usize) -> RopeTable {
        let half = inv_freq.len();
        let mut cos = vec![0f32; t_n * half];
        let mut sin = vec![0f32; t_n * half];
        for t in 0..t_n {
            let p = (pos + t) as f32;
            for (i, f) in inv_freq.iter().enumerate() {
                let a = p * f;
                cos[t * half + i] = a.cos();
                sin[t * half + i] = a.sin();
            }
        }
        RopeTable { cos, sin }
    }
}

/// GELU, tanh approximation (as Gemma and llama.cpp compute it), written as
/// `x * sigmoid(2u)` (equal to `0.5 x (1 + tanh u)`) with [`exp_approx`].
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
    x / (1.0 + exp_approx(-2.0 * u))
}

/// SiLU, `x * sigmoid(x)`, with [`exp_approx`].
#[inline(always)]
fn silu(x: f32) -> f32 {
    x / (1.0 + exp_approx(-x))
}

/// RMSNorm of every `w.len()`-wide chunk of `x` into `out`.
fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ms = dot8(xr, xr) / d as f32;
        let scale = 1.0 / (ms + eps).sqrt();
        for ((o, a), g) in or.iter_mut().zip(xr).zip(w) {
            *o = a * scale * g;
        }
    }
}

/// RMSNorm of every `w.len()`-wide chunk of `x` (a row, or one head of a row) in place.
fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for xr in x.chunks_exact_mut(d) {
        let ms = dot8(xr, xr) / d as f32;
        let scale = 1.0 / (ms + eps).sqrt();
        for (a, g) in xr.iter_mut().zip(w) {
            *a *= scale * g;
        }
    }
}

/// Rotary embedding of every head of every row: interleaved pairs `(2i, 2i+1)` (GGML
/// "normal", llama) or split halves `(i, i + hd/2)` (GGML "neox": Qwen, Gemma).
fn rope(x: &mut [f32], hd: usize, cos: &[f32], sin: &[f32], neox: bool) {
    let half = hd / 2;
    let t_n = cos.len() / half;
    let row = x.len() / t_n;
    for (t, xr) in x.chunks_exact_mut(row).enumerate() {
        let (c, s) = (
            &cos[t * half..(t + 1) * half],
            &sin[t * half..(t + 1) * half],
        );
        for head in xr.chunks_exact_mut(hd) {
            if neox {
                let (lo, hi) = head.split_at_mut(half);
                for (((a, b), &c), &s) in lo.iter_mut().zip(hi).zip(c).zip(s) {
                    (*a, *b) = (*a * c - *b * s, *a * s + *b * c);
                }
            } else {
                for ((p, &c), &s) in head.chunks_exact_mut(2).zip(c).zip(s) {
                    let (a, b) = (p[0], p[1]);
                    p[0] = a * c - b * s;
                    p[1] = a * s + b * c;
                }
            }
        }
    }
}

/// Which forward pass runs a model: ours or candle's (`ferrograph_llm::LoadOptions::kernels`
/// for chat models, `ferrograph_index::EmbedOptions::kernels` for sentence encoders).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Kernels {
    /// Our kernels when supported, else candle; `FERROGRAPH_KERNELS=candle|fast` overrides.
    #[default]
    Auto,
    /// Always candle's (the reference path: its quantized chat models, its `f32` BERT).
    Candle,
    /// Our kernels; loading fails when the model is not supported by them.
    Fast,
}

impl Kernels {
    /// `Auto` resolved against `FERROGRAPH_KERNELS`.
    pub fn resolve(self) -> Kernels {
        match self {
            Kernels::Auto => match std::env::var("FERROGRAPH_KERNELS").as_deref() {
                Ok("candle") => Kernels::Candle,
                Ok("fast") => Kernels::Fast,
                // The default: our kernels where the architecture and tensor types are
                // supported (tests/kernels.rs checks them against candle's path, and the
                // SmolLM2 tests run on them), candle's path elsewhere.
                _ => Kernels::Auto,
            },
            k => k,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_takes_one_dispatch_only_for_even_decode_steps() {
        // Sequences at positions `pos`, each with `rows` new rows.
        let decide = |threads: usize, pos: &[usize], rows: usize, window: Option<usize>| {
            let new_rows: Vec<(usize, usize)> = pos.iter().map(|&p| (p, rows)).collect();
            attention_in_one_dispatch(&kernels::pool::Pool::new(threads), &new_rows, window)
        };
        // Four sequences at about the same depth, split two and two: one dispatch.
        assert!(decide(2, &[30, 33, 31, 32], 1, None));
        assert!(decide(2, &[40, 41], 1, None));
        // One thread, one sequence, or a prompt's rows: the three dispatches.
        assert!(!decide(1, &[30, 33, 31, 32], 1, None));
        assert!(!decide(2, &[30], 1, None));
        assert!(!decide(2, &[30, 33, 31, 32], 2, None));
        // A long context with short ones: the first thread's share would be far the larger.
        assert!(!decide(2, &[2000, 10, 12, 11], 1, None));
        // Three on two threads: one against two.
        assert!(!decide(2, &[30, 30, 30], 1, None));
        // Through a window, what a row sees is at most the window: uneven contexts, even
        // shares.
        assert!(!decide(2, &[2000, 1000, 1500, 600], 1, None));
        assert!(decide(2, &[2000, 1000, 1500, 600], 1, Some(512)));
    }

    /// Points spread over `[lo, hi]`, both ends included.
    fn grid(lo: f32, hi: f32, n: usize) -> impl Iterator<Item = f32> {
        (0..=n).map(move |i| lo + (hi - lo) * i as f32 / n as f32)
    }

    #[test]
    fn exp_approx_is_within_a_few_ulps_of_exp() {
        for x in grid(-87.0, 88.0, 200_000).chain([0.0, -0.0, 1e-8, -1e-8]) {
            let want = f64::from(x).exp();
            let got = f64::from(exp_approx(x));
            assert!(
                ((got - want) / want).abs() < 4e-7,
                "exp({x}) = {got}, want {want}"
            );
        }
        // Clamped, finite and normal outside the range; NaN stays NaN.
        assert!(exp_approx(1000.0).is_finite() && exp_approx(1000.0) > 1e38);
        assert!(exp_approx(-1000.0).is_normal() && exp_approx(-1000.0) < 1e-37);
        assert!(exp_approx(f32::NAN).is_nan());
    }

    #[test]
    fn activations_match_their_definitions() {
        for x in grid(-20.0, 20.0, 100_000) {
            let xd = f64::from(x);
            let u = (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3));
            let gelu_x = 0.5 * xd * (1.0 + u.tanh());
            let sigmoid_x = xd / (1.0 + (-xd).exp());
            for (name, got, want) in [("gelu", gelu_tanh(x), gelu_x), ("silu", silu(x), sigmoid_x)]
            {
                // f32 rounding of the exponent's argument alone moves the result by about
                // |argument| * 6e-8 relative: the bound scales with it.
                let err = (f64::from(got) - want).abs();
                let bound = 1e-6 * (1.0 + 2.0 * u.abs().max(xd.abs())) * want.abs();
                assert!(err <= bound.max(1e-12), "{name}({x}) = {got}, want {want}");
            }
        }
    }
}
