//! Portable dot products: the fallback and the reference for the SIMD kernels.

use super::{Acts, Packed, QK};
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
