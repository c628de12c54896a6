//! Portable dot products: the fallback and the reference for the SIMD kernels.

use super::{Acts, Interleaved, Packed, QK};
use std::ops::Range;

/// Dot products of the weight blocks `r` with each activation row of `x`, into `out`.
pub(crate) fn dot_tile(w: &Packed, r: Range<usize>, x: &Acts<'_>, out: &mut [f32]) {
    let nb = x.nb;
    for (t, o) in out.iter_mut().enumerate() {
        let mut acc = 0f32;
        for (i, blk) in r.clone().enumerate() {
            let xb = t * nb + i;
            let xq = &x.q[xb * QK..xb * QK + QK];
            let dx = x.d[xb];
            match w {
                Packed::U4 { d, m, q } => {
                    let qs = &q[blk * 16..blk * 16 + 16];
                    let mut s = 0i32;
                    for j in 0..16 {
                        s += (qs[j] & 0x0f) as i32 * xq[j] as i32;
                        s += (qs[j] >> 4) as i32 * xq[j + 16] as i32;
                    }
                    acc += d[blk] * dx * s as f32 + m[blk] * x.s[xb];
                }
                // Interleaved matrices go through `dot_x8`.
                Packed::U4x8 { .. }
                | Packed::U4x8Half { .. }
                | Packed::U5x8 { .. }
                | Packed::I8x8 { .. }
                | Packed::I8S16x8 { .. } => {}
                Packed::U8 { d, m, q } => {
                    let qs = &q[blk * QK..blk * QK + QK];
                    let s: i32 = qs.iter().zip(xq).map(|(a, b)| *a as i32 * *b as i32).sum();
                    acc += d[blk] * dx * s as f32 + m[blk] * x.s[xb];
                }
                Packed::I8 { d, q } => {
                    let qs = &q[blk * QK..blk * QK + QK];
                    let s: i32 = qs.iter().zip(xq).map(|(a, b)| *a as i32 * *b as i32).sum();
                    acc += d[blk] * dx * s as f32;
                }
                Packed::I8S16 { d, s: sc, q } => {
                    let qs = &q[blk * QK..blk * QK + QK];
                    let mut s = 0i32;
                    for half in 0..2 {
                        let h: i32 = qs[16 * half..16 * half + 16]
                            .iter()
                            .zip(&xq[16 * half..16 * half + 16])
                            .map(|(a, b)| *a as i32 * *b as i32)
                            .sum();
                        s += h * sc[blk * 2 + half] as i32;
                    }
                    acc += d[blk] * dx * s as f32;
                }
            }
        }
        *o = acc;
    }
}

/// Dot products of the eight interleaved rows of `g` with each activation row of `x`, into
/// `out[8 * t + lane]`.
pub(crate) fn dot_x8(g: &Interleaved<'_>, x: &Acts<'_>, out: &mut [f32]) {
    let nb = x.nb;
    for (t, row) in out.chunks_exact_mut(8).enumerate() {
        for (lane, o) in row.iter_mut().enumerate() {
            let mut acc = 0f32;
            for b in 0..nb {
                let xb = t * nb + b;
                let xq = &x.q[xb * QK..xb * QK + QK];
                let mut sum = 0i32;
                for h in 0..2 {
                    let part: i32 = (16 * h..16 * h + 16)
                        .map(|k| g.q.value(b, lane, k) * xq[k] as i32)
                        .sum();
                    sum += part * g.s.map_or(1, |s| s[32 * b + 16 * h + 2 * lane] as i32);
                }
                acc += g.d.get(8 * b + lane) * x.d[xb] * sum as f32
                    + g.m.map_or(0.0, |m| m.get(8 * b + lane) * x.s[xb]);
            }
            *o = acc;
        }
    }
}
