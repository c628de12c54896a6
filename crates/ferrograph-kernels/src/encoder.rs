//! Our own forward pass for BERT-style sentence encoders (all-MiniLM-L6-v2 and other
//! `BertModel` checkpoints with absolute positions) over the [kernels](crate).
//!
//! Weights come in floating point (safetensors); the matrices are quantized at load to 12 bits
//! and multiplied with 16-bit activations by the [`wide`](crate::wide) kernels. 8-bit weights
//! and activations, as the decoder uses, move MiniLM's sentence vectors too far from the
//! `f32` model's (cosine down to 0.998); these stay within 0.9999. Embeddings, biases,
//! LayerNorms, attention and pooling are `f32`.
//!
//! A pass takes several sequences of different lengths stacked row by row, with no padding:
//! the matrix products run over all their tokens at once, and attention runs per sequence
//! over its own tokens only. Every row is computed in the same order whatever else is in the
//! pass, so a sequence's output does not depend on what it is batched with.
//! [`EncoderModel::mean_pooled`] returns the mean of the last hidden states over each
//! sequence's tokens, which is what sentence-transformers' mean pooling computes.

use crate as kernels;
use crate::ops::{add, add_rows, gelu_erf, layer_norm_in_place, softmax_in_place};
use crate::wide::{matmul_wide, WideAct, WideMatrix};
use crate::KernelError;
use parking_lot::Mutex;

/// The feed-forward activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncoderActivation {
    /// `x * Phi(x)` with the normal CDF through erf (BERT's `gelu`, not the tanh
    /// approximation), erf computed to within 1.5e-7.
    GeluErf,
    /// ReLU.
    Relu,
}

/// Shape of a BERT encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderConfig {
    /// Hidden size.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Encoder layers.
    pub layers: usize,
    /// Feed-forward size.
    pub intermediate: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Positions (the longest sequence it takes).
    pub max_positions: usize,
    /// LayerNorm epsilon.
    pub eps: f32,
    /// Feed-forward activation.
    pub activation: EncoderActivation,
}

impl EncoderConfig {
    /// Why these kernels cannot run an encoder of this shape, if they cannot.
    pub fn supported(&self) -> Result<(), String> {
        self.check().map_err(|e| match e {
            KernelError::Malformed(why) => why,
            other => other.to_string(),
        })
    }

    fn check(&self) -> Result<(), KernelError> {
        let bad = |why: String| Err(KernelError::Malformed(why));
        if self.heads == 0 || !self.hidden.is_multiple_of(self.heads) {
            return bad(format!(
                "{} heads do not divide the hidden size {}",
                self.heads, self.hidden
            ));
        }
        for (what, n) in [
            ("hidden size", self.hidden),
            ("feed-forward size", self.intermediate),
        ] {
            if n == 0 || !n.is_multiple_of(kernels::QK) {
                return bad(format!(
                    "the {what} {n} is not a multiple of {}",
                    kernels::QK
                ));
            }
        }
        if self.layers == 0 || self.vocab == 0 || self.max_positions == 0 {
            return bad("no layers, vocabulary or positions".into());
        }
        Ok(())
    }

    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

/// One encoder layer: fused query/key/value, attention output, feed-forward, two LayerNorms
/// after their residual additions (BERT's post-norm).
struct EncoderLayer {
    /// Query, key and value stacked: `3 * hidden` rows.
    qkv: WideMatrix,
    qkv_bias: Vec<f32>,
    out: WideMatrix,
    out_bias: Vec<f32>,
    attn_norm: [Vec<f32>; 2],
    up: WideMatrix,
    up_bias: Vec<f32>,
    down: WideMatrix,
    down_bias: Vec<f32>,
    ffn_norm: [Vec<f32>; 2],
}

/// A BERT encoder on the kernels. Read-only once loaded: one model serves any number of
/// threads.
pub struct EncoderModel {
    cfg: EncoderConfig,
    /// Word embeddings, `vocab x hidden`.
    word: Vec<f32>,
    /// Position embeddings plus token type 0's (every sequence is one segment),
    /// `max_positions x hidden`.
    position: Vec<f32>,
    embed_norm: [Vec<f32>; 2],
    layers: Vec<EncoderLayer>,
}

impl std::fmt::Debug for EncoderModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncoderModel")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// [`WideMatrix::quantize`] with the tensor's name in its error.
fn quantize(name: &str, rows: usize, cols: usize, data: &[f32]) -> Result<WideMatrix, KernelError> {
    WideMatrix::quantize(rows, cols, data).map_err(|e| match e {
        KernelError::Malformed(why) => KernelError::Malformed(format!("{name}: {why}")),
        other => other,
    })
}

/// Gives a tensor's shape and values, row-major, by name (see [`EncoderModel::load`]).
pub type TensorSource<'a> = dyn FnMut(&str) -> Result<(Vec<usize>, Vec<f32>), KernelError> + 'a;

/// Tokens per pass at most (whole sequences; a longer one runs alone). Bounds the
/// activations' memory: about 30 KiB per token for MiniLM.
pub const MAX_PASS_TOKENS: usize = 4096;

impl EncoderModel {
    /// Builds the model from its tensors, named as in Hugging Face's `BertModel`
    /// (`embeddings.word_embeddings.weight`, `encoder.layer.0.attention.self.query.weight`,
    /// ...; any `bert.` prefix already removed). `tensor(name)` returns the shape and the
    /// values, row-major; shapes are checked.
    pub fn load(
        cfg: EncoderConfig,
        tensor: &mut TensorSource<'_>,
    ) -> Result<EncoderModel, KernelError> {
        cfg.check()?;
        let (h, ff) = (cfg.hidden, cfg.intermediate);
        let types = tensor("embeddings.token_type_embeddings.weight")?;
        if types.0.len() != 2 || types.0[1] != h || types.0[0] == 0 || types.1.len() < h {
            return Err(KernelError::Malformed(format!(
                "embeddings.token_type_embeddings.weight has shape {:?}, expected [n, {h}]",
                types.0
            )));
        }
        let mut get = |name: &str, shape: &[usize]| -> Result<Vec<f32>, KernelError> {
            let (got, values) = tensor(name)?;
            if got != shape || values.len() != shape.iter().product::<usize>() {
                return Err(KernelError::Malformed(format!(
                    "{name} has shape {got:?}, expected {shape:?}"
                )));
            }
            Ok(values)
        };
        let word = get("embeddings.word_embeddings.weight", &[cfg.vocab, h])?;
        let mut position = get(
            "embeddings.position_embeddings.weight",
            &[cfg.max_positions, h],
        )?;
        add_rows(&mut position, &types.1[..h]);
        let embed_norm = [
            get("embeddings.LayerNorm.weight", &[h])?,
            get("embeddings.LayerNorm.bias", &[h])?,
        ];
        let mut layers = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let p = |s: &str| format!("encoder.layer.{l}.{s}");
            let mut qkv_w = Vec::with_capacity(3 * h * h);
            let mut qkv_bias = Vec::with_capacity(3 * h);
            for part in ["query", "key", "value"] {
                qkv_w.extend(get(&p(&format!("attention.self.{part}.weight")), &[h, h])?);
                qkv_bias.extend(get(&p(&format!("attention.self.{part}.bias")), &[h])?);
            }
            layers.push(EncoderLayer {
                qkv: quantize(
                    &p("attention.self.{query,key,value}.weight"),
                    3 * h,
                    h,
                    &qkv_w,
                )?,
                qkv_bias,
                out: quantize(
                    &p("attention.output.dense.weight"),
                    h,
                    h,
                    &get(&p("attention.output.dense.weight"), &[h, h])?,
                )?,
                out_bias: get(&p("attention.output.dense.bias"), &[h])?,
                attn_norm: [
                    get(&p("attention.output.LayerNorm.weight"), &[h])?,
                    get(&p("attention.output.LayerNorm.bias"), &[h])?,
                ],
                up: quantize(
                    &p("intermediate.dense.weight"),
                    ff,
                    h,
                    &get(&p("intermediate.dense.weight"), &[ff, h])?,
                )?,
                up_bias: get(&p("intermediate.dense.bias"), &[ff])?,
                down: quantize(
                    &p("output.dense.weight"),
                    h,
                    ff,
                    &get(&p("output.dense.weight"), &[h, ff])?,
                )?,
                down_bias: get(&p("output.dense.bias"), &[h])?,
                ffn_norm: [
                    get(&p("output.LayerNorm.weight"), &[h])?,
                    get(&p("output.LayerNorm.bias"), &[h])?,
                ],
            });
        }
        Ok(EncoderModel {
            cfg,
            word,
            position,
            embed_norm,
            layers,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &EncoderConfig {
        &self.cfg
    }

    /// Bytes of weights held.
    pub fn bytes(&self) -> usize {
        let floats = self.word.len()
            + self.position.len()
            + 2 * self.cfg.hidden
            + self
                .layers
                .iter()
                .map(|l| {
                    l.qkv_bias.len()
                        + l.out_bias.len()
                        + l.up_bias.len()
                        + l.down_bias.len()
                        + 4 * self.cfg.hidden
                })
                .sum::<usize>();
        floats * 4
            + self
                .layers
                .iter()
                .map(|l| l.qkv.bytes() + l.out.bytes() + l.up.bytes() + l.down.bytes())
                .sum::<usize>()
    }

    /// The mean of the last hidden states over each sequence's tokens (token ids as the
    /// tokenizer gives them, special tokens included), one `hidden`-long vector per sequence,
    /// not normalized. Sequences are stacked into passes of up to [`MAX_PASS_TOKENS`] tokens.
    ///
    /// Fails with [`KernelError::Input`] on an empty sequence, one longer than the model's
    /// positions, or a token outside its vocabulary.
    pub fn mean_pooled(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>, KernelError> {
        for (i, s) in seqs.iter().enumerate() {
            if s.is_empty() {
                return Err(KernelError::Input(format!("sequence {i} has no tokens")));
            }
            if s.len() > self.cfg.max_positions {
                return Err(KernelError::Input(format!(
                    "sequence {i} has {} tokens; the model takes at most {}",
                    s.len(),
                    self.cfg.max_positions
                )));
            }
            if let Some(t) = s.iter().find(|&&t| t as usize >= self.cfg.vocab) {
                return Err(KernelError::Input(format!(
                    "token {t} of sequence {i} is outside the vocabulary of {}",
                    self.cfg.vocab
                )));
            }
        }
        let mut out = Vec::with_capacity(seqs.len());
        let mut start = 0;
        while start < seqs.len() {
            let mut end = start + 1;
            let mut tokens = seqs[start].len();
            while end < seqs.len() && tokens + seqs[end].len() <= MAX_PASS_TOKENS {
                tokens += seqs[end].len();
                end += 1;
            }
            out.extend(self.pass(&seqs[start..end]));
            start = end;
        }
        Ok(out)
    }

    /// One pass over `seqs` (checked by the caller), stacked.
    fn pass(&self, seqs: &[&[u32]]) -> Vec<Vec<f32>> {
        let cfg = &self.cfg;
        let (h, ff) = (cfg.hidden, cfg.intermediate);
        let mut spans = Vec::with_capacity(seqs.len());
        let mut t_n = 0;
        for s in seqs {
            spans.push(t_n..t_n + s.len());
            t_n += s.len();
        }
        let pool = kernels::pool::global();
        let mut x = vec![0f32; t_n * h];
        for (s, span) in seqs.iter().zip(&spans) {
            for (p, &tok) in s.iter().enumerate() {
                let row = &mut x[(span.start + p) * h..(span.start + p + 1) * h];
                let t = tok as usize;
                row.copy_from_slice(&self.word[t * h..(t + 1) * h]);
                add(row, &self.position[p * h..(p + 1) * h]);
            }
        }
        let [nw, nb] = &self.embed_norm;
        pool.for_each_piece(&mut x, h, &|_, rows| {
            layer_norm_in_place(rows, nw, nb, cfg.eps)
        });
        let mut act = WideAct::default();
        let mut qkv = vec![0f32; t_n * 3 * h];
        let mut ctx = vec![0f32; t_n * h];
        let mut o = vec![0f32; t_n * h];
        let mut u = vec![0f32; t_n * ff];
        for layer in &self.layers {
            act.quantize_on(pool, &x, h);
            matmul_wide(&mut [(&layer.qkv, &mut qkv[..])], &act);
            pool.for_each_piece(&mut qkv, 3 * h, &|_, rows| add_rows(rows, &layer.qkv_bias));
            attention(cfg, &qkv, &spans, &mut ctx);
            act.quantize_on(pool, &ctx, h);
            matmul_wide(&mut [(&layer.out, &mut o[..])], &act);
            let residual = |o: &[f32], x: &mut [f32], bias: &[f32], norm: &[Vec<f32>; 2]| {
                pool.for_each_piece(x, h, &|at, rows| {
                    for (r, row) in rows.chunks_exact_mut(h).enumerate() {
                        let o = &o[at + r * h..at + (r + 1) * h];
                        for ((v, a), b) in row.iter_mut().zip(o).zip(bias) {
                            *v += a + b;
                        }
                    }
                    layer_norm_in_place(rows, &norm[0], &norm[1], cfg.eps);
                });
            };
            residual(&o, &mut x, &layer.out_bias, &layer.attn_norm);
            act.quantize_on(pool, &x, h);
            matmul_wide(&mut [(&layer.up, &mut u[..])], &act);
            let activation = cfg.activation;
            pool.for_each_piece(&mut u, ff, &|_, rows| {
                for row in rows.chunks_exact_mut(ff) {
                    match activation {
                        EncoderActivation::GeluErf => {
                            for (v, b) in row.iter_mut().zip(&layer.up_bias) {
                                *v = gelu_erf(*v + b);
                            }
                        }
                        EncoderActivation::Relu => {
                            for (v, b) in row.iter_mut().zip(&layer.up_bias) {
                                *v = (*v + b).max(0.0);
                            }
                        }
                    }
                }
            });
            act.quantize_on(pool, &u, ff);
            matmul_wide(&mut [(&layer.down, &mut o[..])], &act);
            residual(&o, &mut x, &layer.down_bias, &layer.ffn_norm);
        }
        spans
            .iter()
            .map(|span| {
                let mut mean = vec![0f32; h];
                for row in x[span.start * h..span.end * h].chunks_exact(h) {
                    add(&mut mean, row);
                }
                let n = span.len() as f32;
                mean.iter_mut().for_each(|v| *v /= n);
                mean
            })
            .collect()
    }
}

/// Bidirectional attention of every sequence over its own tokens. `qkv` holds each token's
/// query, key and value rows side by side (`3 * hidden`); the context rows go to `ctx`.
///
/// A unit of work is one (sequence, head), spread over the pool. Its keys are gathered
/// transposed and its values row by row; query rows are taken four at a time
/// ([`head_attention`]).
fn attention(cfg: &EncoderConfig, qkv: &[f32], spans: &[std::ops::Range<usize>], ctx: &mut [f32]) {
    let (h, heads, hd) = (cfg.hidden, cfg.heads, cfg.head_dim());
    let units: Vec<(usize, usize)> = (0..spans.len())
        .flat_map(|s| (0..heads).map(move |head| (s, head)))
        .collect();
    let results: Vec<Mutex<Vec<f32>>> = units
        .iter()
        .map(|&(s, _)| Mutex::new(vec![0f32; spans[s].len() * hd]))
        .collect();
    let one_unit = |ui: usize, scratch: &mut HeadScratch| {
        let (s, head) = units[ui];
        let span = &spans[s];
        let rows = HeadRows {
            qkv: &qkv[span.start * 3 * h..span.end * 3 * h],
            stride: 3 * h,
            q: head * hd,
            k: h + head * hd,
            v: 2 * h + head * hd,
            n: span.len(),
            hd,
        };
        head_attention(&rows, scratch, &mut results[ui].lock());
    };
    let pool = kernels::pool::global();
    let threads = pool.threads().min(units.len()).max(1);
    pool.run(&|tid| {
        if tid >= threads {
            return;
        }
        let mut scratch = HeadScratch::default();
        for ui in (tid..units.len()).step_by(threads) {
            one_unit(ui, &mut scratch);
        }
    });
    for (&(s, head), res) in units.iter().zip(&results) {
        let res = res.lock();
        for (t, r) in res.chunks_exact(hd).enumerate() {
            let at = (spans[s].start + t) * h + head * hd;
            ctx[at..at + hd].copy_from_slice(r);
        }
    }
}

/// One head of one sequence in the stacked `q | k | v` rows: token `t`'s query is
/// `qkv[t * stride + q..][..hd]`, and so on.
struct HeadRows<'a> {
    qkv: &'a [f32],
    stride: usize,
    q: usize,
    k: usize,
    v: usize,
    /// Tokens.
    n: usize,
    /// Head size.
    hd: usize,
}

impl HeadRows<'_> {
    fn row(&self, t: usize, part: usize) -> &[f32] {
        let at = t * self.stride + part;
        &self.qkv[at..at + self.hd]
    }
}

/// Buffers reused across units.
#[derive(Default)]
struct HeadScratch {
    /// Keys transposed, `hd x padded`.
    kt: Vec<f32>,
    /// Values, `n x` ([`DIM_BLOCK`] times the blocks of `hd`), zero past `hd`.
    v: Vec<f32>,
    /// Four query rows' scores, `4 x padded`.
    scores: Vec<f32>,
    /// Their probabilities key by key, `n x 4`.
    probs: Vec<f32>,
}

/// Keys per block of scores: two 256-bit registers per query row.
const KEY_BLOCK: usize = 16;
/// Query rows computed together.
const QUERY_ROWS: usize = 4;
/// Output dimensions accumulated in registers at once (per query row).
const DIM_BLOCK: usize = 16;

/// [`crate::x86::attn_avx2::scores`] on any CPU: the same fused multiply-adds in the same
/// order.
fn scores_block(
    simd: bool,
    qs: &[f32],
    kt: &[f32],
    padded: usize,
    j0: usize,
    hd: usize,
) -> [[f32; KEY_BLOCK]; QUERY_ROWS] {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is set only when this CPU has AVX2 and FMA (`attention_simd`).
        return unsafe { crate::x86::attn_avx2::scores(qs, kt, padded, j0, hd) };
    }
    let _ = simd;
    let mut acc = [[0f32; KEY_BLOCK]; QUERY_ROWS];
    for d in 0..hd {
        let k = &kt[d * padded + j0..d * padded + j0 + KEY_BLOCK];
        for (r, a) in acc.iter_mut().enumerate() {
            let q = qs[r * hd + d];
            for (x, kl) in a.iter_mut().zip(k) {
                *x = q.mul_add(*kl, *x);
            }
        }
    }
    acc
}

/// [`crate::x86::attn_avx2::weighted_values`] on any CPU: the same fused multiply-adds in the
/// same order.
fn values_block(
    simd: bool,
    probs: &[f32],
    v: &[f32],
    vw: usize,
    d0: usize,
    n: usize,
) -> [[f32; DIM_BLOCK]; QUERY_ROWS] {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is set only when this CPU has AVX2 and FMA (`attention_simd`).
        return unsafe { crate::x86::attn_avx2::weighted_values(probs, v, vw, d0, n) };
    }
    let _ = simd;
    let mut acc = [[0f32; DIM_BLOCK]; QUERY_ROWS];
    for j in 0..n {
        let vr = &v[j * vw + d0..j * vw + d0 + DIM_BLOCK];
        for (r, a) in acc.iter_mut().enumerate() {
            let p = probs[QUERY_ROWS * j + r];
            for (x, vl) in a.iter_mut().zip(vr) {
                *x = p.mul_add(*vl, *x);
            }
        }
    }
    acc
}

/// Whether the attention blocks run their AVX2 versions.
fn attention_simd() -> bool {
    crate::detected_isa() != crate::Isa::Scalar
}

/// Softmax attention of one head: every query row over every key, into `out` (`n x hd`).
/// Scores for [`QUERY_ROWS`] queries and [`KEY_BLOCK`] keys are accumulated in registers
/// along the head's dimensions, then each row's softmax, then the values summed in key order.
/// Each output is computed in the same order as [`head_attention_reference`], so the two agree
/// bit for bit.
fn head_attention(rows: &HeadRows<'_>, scratch: &mut HeadScratch, out: &mut [f32]) {
    head_attention_with(attention_simd(), rows, scratch, out)
}

/// [`head_attention`] with the SIMD blocks or the scalar ones.
fn head_attention_with(
    simd: bool,
    rows: &HeadRows<'_>,
    scratch: &mut HeadScratch,
    out: &mut [f32],
) {
    let (n, hd) = (rows.n, rows.hd);
    let scale = 1.0 / (hd as f32).sqrt();
    let padded = n.div_ceil(KEY_BLOCK) * KEY_BLOCK;
    let HeadScratch {
        kt,
        v,
        scores,
        probs,
    } = scratch;
    kt.clear();
    kt.resize(hd * padded, 0.0);
    let vw = hd.div_ceil(DIM_BLOCK) * DIM_BLOCK;
    v.clear();
    v.resize(n * vw, 0.0);
    for j in 0..n {
        for (d, x) in rows.row(j, rows.k).iter().enumerate() {
            kt[d * padded + j] = *x;
        }
        v[j * vw..j * vw + hd].copy_from_slice(rows.row(j, rows.v));
    }
    scores.clear();
    scores.resize(QUERY_ROWS * padded, 0.0);
    let mut qs = vec![0f32; QUERY_ROWS * hd];
    for i0 in (0..n).step_by(QUERY_ROWS) {
        let m = QUERY_ROWS.min(n - i0);
        for (r, qr) in qs.chunks_exact_mut(hd).enumerate() {
            if r < m {
                for (a, b) in qr.iter_mut().zip(rows.row(i0 + r, rows.q)) {
                    *a = b * scale;
                }
            } else {
                qr.fill(0.0);
            }
        }
        for j0 in (0..padded).step_by(KEY_BLOCK) {
            let acc = scores_block(simd, &qs, kt, padded, j0, hd);
            for (r, a) in acc.iter().enumerate() {
                scores[r * padded + j0..r * padded + j0 + KEY_BLOCK].copy_from_slice(a);
            }
        }
        for r in 0..m {
            softmax_in_place(&mut scores[r * padded..r * padded + n]);
        }
        // The values weighted by the probabilities, summed in key order, for every query row
        // and a block of dimensions at a time in registers. The probabilities are laid out
        // key by key first, so that the inner loops have fixed lengths.
        probs.clear();
        probs.resize(n * QUERY_ROWS, 0.0);
        for r in 0..m {
            for (j, p) in scores[r * padded..r * padded + n].iter().enumerate() {
                probs[j * QUERY_ROWS + r] = *p;
            }
        }
        for d0 in (0..vw).step_by(DIM_BLOCK) {
            let acc = values_block(simd, probs, v, vw, d0, n);
            for (r, a) in acc.iter().enumerate().take(m) {
                let w = DIM_BLOCK.min(hd - d0);
                out[(i0 + r) * hd + d0..(i0 + r) * hd + d0 + w].copy_from_slice(&a[..w]);
            }
        }
    }
}

/// [`head_attention`] written plainly, one query and one key at a time: the test's reference.
#[cfg(test)]
fn head_attention_reference(rows: &HeadRows<'_>, out: &mut [f32]) {
    let (n, hd) = (rows.n, rows.hd);
    let scale = 1.0 / (hd as f32).sqrt();
    for i in 0..n {
        let q: Vec<f32> = rows.row(i, rows.q).iter().map(|x| x * scale).collect();
        let mut sc: Vec<f32> = (0..n)
            .map(|j| {
                let k = rows.row(j, rows.k);
                let mut s = 0f32;
                for d in 0..hd {
                    s = q[d].mul_add(k[d], s);
                }
                s
            })
            .collect();
        softmax_in_place(&mut sc);
        let o = &mut out[i * hd..(i + 1) * hd];
        o.fill(0.0);
        for (j, p) in sc.iter().enumerate() {
            for (a, b) in o.iter_mut().zip(rows.row(j, rows.v)) {
                *a = p.mul_add(*b, *a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_attention_equals_the_plain_loop_bit_for_bit() {
        for (n, hd) in [(1, 32), (2, 32), (5, 8), (17, 32), (40, 64), (131, 32)] {
            let stride = 3 * hd + 5;
            let qkv: Vec<f32> = (0..n * stride)
                .map(|i| ((i as f32) * 0.618).sin() * 2.0)
                .collect();
            let rows = HeadRows {
                qkv: &qkv,
                stride,
                q: 1,
                k: 1 + hd,
                v: 1 + 2 * hd,
                n,
                hd,
            };
            let mut want = vec![0f32; n * hd];
            head_attention_reference(&rows, &mut want);
            for simd in [false, attention_simd()] {
                let mut got = vec![1f32; n * hd];
                head_attention_with(simd, &rows, &mut HeadScratch::default(), &mut got);
                assert_eq!(got, want, "n {n} hd {hd} simd {simd}");
            }
        }
    }
}
