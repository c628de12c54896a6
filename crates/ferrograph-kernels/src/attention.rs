//! Causal attention over the KV cache, for prefill and decode.
//!
//! Two things make it fast at long contexts, where it dominates decoding:
//! - **Grouped heads.** The query heads that share a KV head (grouped-query attention:
//!   SmolLM2 has 3 per KV head, Gemma 3 270M 4) are computed together, so each key and value
//!   row is read from the cache once per group instead of once per head. Decoding at depth is
//!   bound by reading the cache, so this divides that traffic by the group size.
//! - **Split keys, merged softmax** (flash-decoding). Work goes to the kernels' pool as
//!   (row, KV head, key block) items; each computes its block's scores, their maximum, the sum
//!   of their exponentials and the weighted sum of values, and the blocks of one row and head
//!   are merged exactly (rescaling each by `exp(max_block - max)`). A single decoded row is
//!   thus spread over every thread; prefill rows, which are many, take one block each.
//!
//! Scores are kept for one block of one row at a time (per head of the group), never as a whole
//! row-by-key matrix.

use crate::decoder::{dot8, exp_approx};
use parking_lot::Mutex;

/// The fewest keys per block when a row's keys are split over threads.
pub const BLOCK: usize = 256;

/// The shape of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (`heads` is a multiple).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Scale applied to every score.
    pub scale: f32,
}

/// One block's partial result for the `group` heads of one KV head: per head, the running
/// maximum, the sum of exponentials and the un-normalized output row.
#[allow(clippy::too_many_arguments)]
fn block(
    s: &Shape,
    q_rows: &[f32],
    kc: &[f32],
    vc: &[f32],
    g: usize,
    keys: std::ops::Range<usize>,
    scores: &mut Vec<f32>,
    part: &mut [f32],
) {
    let (hd, group) = (s.head_dim, s.heads / s.kv_heads);
    let kv = s.kv_heads * hd;
    let n = keys.len();
    scores.clear();
    scores.resize(group * n, 0.0);
    // Scores: each key row once, against every head of the group.
    for (i, j) in keys.clone().enumerate() {
        let krow = &kc[j * kv + g * hd..j * kv + (g + 1) * hd];
        for h in 0..group {
            let qv = &q_rows[(g * group + h) * hd..(g * group + h + 1) * hd];
            scores[h * n + i] = dot8(qv, krow) * s.scale;
        }
    }
    let stride = hd + 2;
    for h in 0..group {
        let row = &mut scores[h * n..(h + 1) * n];
        let mx = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut sum = 0f32;
        for x in row.iter_mut() {
            *x = exp_approx(*x - mx);
            sum += *x;
        }
        let p = &mut part[h * stride..(h + 1) * stride];
        p[0] = mx;
        p[1] = sum;
        p[2..].fill(0.0);
    }
    // Values: each value row once, into every head's output.
    for (i, j) in keys.enumerate() {
        let vrow = &vc[j * kv + g * hd..j * kv + (g + 1) * hd];
        for h in 0..group {
            let w = scores[h * n + i];
            let acc = &mut part[h * stride + 2..(h + 1) * stride];
            for (a, b) in acc.iter_mut().zip(vrow) {
                *a += w * b;
            }
        }
    }
}

/// Attention of the `t_n` new rows of `q` (positions `pos..pos + t_n`, row-major
/// `[t][heads][head_dim]`) over the cache `kc`/`vc` (`[position][kv_heads][head_dim]`, holding
/// at least `pos + t_n` positions), written to `out` (shaped like `q`). With a `window`, the
/// row at position `p` sees positions `p + 1 - window ..= p` only.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    s: &Shape,
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    pos: usize,
    t_n: usize,
    window: Option<usize>,
    out: &mut [f32],
) {
    let (hd, kvh) = (s.head_dim, s.kv_heads);
    let group = s.heads / kvh;
    let d = s.heads * hd;
    let pool = crate::pool::global();
    let threads = pool.threads();
    let keys_of = |t: usize| {
        let n = pos + t + 1;
        window.map_or(0, |w| n.saturating_sub(w))..n
    };
    // Blocks per row: one for prefill; for a row or two with a long context, enough blocks of
    // at least BLOCK keys to give every thread work.
    let splits = if t_n * kvh >= 2 * threads {
        1
    } else {
        let longest = keys_of(t_n - 1).len();
        (2 * threads)
            .div_ceil(t_n * kvh)
            .min(longest.div_ceil(BLOCK))
            .max(1)
    };
    let items = t_n * kvh * splits;
    let stride = hd + 2;
    let per_item = group * stride;
    let mut parts = vec![0f32; items * per_item];
    {
        let slots: Vec<Mutex<&mut [f32]>> = parts.chunks_mut(per_item).map(Mutex::new).collect();
        let work = |first: usize, step: usize| {
            let mut scores = Vec::new();
            for item in (first..items).step_by(step) {
                let (tg, sp) = (item / splits, item % splits);
                let (t, g) = (tg / kvh, tg % kvh);
                let keys = keys_of(t);
                let len = keys.len().div_ceil(splits);
                let a = (keys.start + sp * len).min(keys.end);
                let b = (a + len).min(keys.end);
                // An empty block (more splits than keys) comes out with a sum of 0, which
                // drops out of the merge.
                let mut slot = slots[item].lock();
                block(
                    s,
                    &q[t * d..(t + 1) * d],
                    kc,
                    vc,
                    g,
                    a..b,
                    &mut scores,
                    &mut slot,
                );
            }
        };
        // Small calls (a short decode) stay on the calling thread.
        let total_keys: usize = (0..t_n).map(|t| keys_of(t).len()).sum();
        if threads > 1 && total_keys * s.heads >= 4096 {
            pool.run(&|tid| work(tid, threads));
        } else {
            work(0, 1);
        }
    }
    // Merge each row and head's blocks.
    for t in 0..t_n {
        for g in 0..kvh {
            let base = (t * kvh + g) * splits;
            for h in 0..group {
                let head = g * group + h;
                let o = &mut out[t * d + head * hd..t * d + (head + 1) * hd];
                let at = |sp: usize| &parts[(base + sp) * per_item + h * stride..][..stride];
                let mx = (0..splits).fold(f32::NEG_INFINITY, |m, sp| m.max(at(sp)[0]));
                let mut sum = 0f32;
                o.fill(0.0);
                for sp in 0..splits {
                    let p = at(sp);
                    if p[1] == 0.0 {
                        continue;
                    }
                    let w = exp_approx(p[0] - mx);
                    sum += w * p[1];
                    for (a, b) in o.iter_mut().zip(&p[2..]) {
                        *a += w * b;
                    }
                }
                let inv = 1.0 / sum;
                o.iter_mut().for_each(|a| *a *= inv);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    /// Attention the plain way, in f64: every head on its own, whole rows of scores.
    fn reference(
        s: &Shape,
        q: &[f32],
        kc: &[f32],
        vc: &[f32],
        pos: usize,
        t_n: usize,
        window: Option<usize>,
    ) -> Vec<f32> {
        let (hd, group) = (s.head_dim, s.heads / s.kv_heads);
        let (d, kv) = (s.heads * hd, s.kv_heads * hd);
        let mut out = vec![0f32; t_n * d];
        for t in 0..t_n {
            let n = pos + t + 1;
            let first = window.map_or(0, |w| n.saturating_sub(w));
            for h in 0..s.heads {
                let g = h / group;
                let qv = &q[t * d + h * hd..t * d + (h + 1) * hd];
                let scores: Vec<f64> = (first..n)
                    .map(|j| {
                        let k = &kc[j * kv + g * hd..j * kv + (g + 1) * hd];
                        qv.iter()
                            .zip(k)
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum::<f64>()
                            * f64::from(s.scale)
                    })
                    .collect();
                let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|x| (x - mx).exp()).collect();
                let sum: f64 = e.iter().sum();
                for c in 0..hd {
                    let v: f64 = (first..n)
                        .zip(&e)
                        .map(|(j, w)| w * f64::from(vc[j * kv + g * hd + c]))
                        .sum();
                    out[t * d + h * hd + c] = (v / sum) as f32;
                }
            }
        }
        out
    }

    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_plain_attention_for_prefill_decode_windows_and_splits() {
        // SmolLM2's shape (9 heads over 3 KV heads) and Gemma 3's (4 over 1), at decode
        // (one row, split over threads at depth) and prefill, with and without a window.
        for (heads, kv_heads, hd) in [(9, 3, 64), (4, 1, 256), (2, 2, 16)] {
            let s = Shape {
                heads,
                kv_heads,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
            };
            for (pos, t_n, window) in [
                (0, 1, None),
                (0, 7, None),
                (3000, 1, None),
                (1500, 2, None),
                (40, 33, None),
                (3000, 1, Some(512)),
                (600, 9, Some(100)),
            ] {
                let total = pos + t_n;
                let q = noise(t_n * heads * hd, 1 + pos as u64);
                // Keys scaled up so that the softmax is far from uniform.
                let kc: Vec<f32> = noise(total * kv_heads * hd, 2)
                    .iter()
                    .map(|x| 3.0 * x)
                    .collect();
                let vc = noise(total * kv_heads * hd, 3);
                let mut got = vec![0f32; t_n * heads * hd];
                attention(&s, &q, &kc, &vc, pos, t_n, window, &mut got);
                let want = reference(&s, &q, &kc, &vc, pos, t_n, window);
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(worst < 2e-5, "heads {heads}/{kv_heads} hd {hd} pos {pos} t {t_n} window {window:?}: off by {worst}");
            }
        }
    }
}
