//! AVX2 + FMA dot products (x86-64).

// Index loops mirror the block layout (block b, activation row t) and address several arrays
// at once; iterator rewrites would obscure the SIMD kernels.
#![allow(clippy::needless_range_loop)]

use super::{Acts, Packed, QK};
use std::arch::x86_64::*;
use std::ops::Range;

/// Dot products of the weight blocks `r` with each activation row of `x` (1 to 4), into
/// `out`.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_tile(w: &Packed, r: Range<usize>, x: &Acts<'_>, out: &mut [f32]) {
    match out.len() {
        1 => tile::<1>(w, r, x, out),
        2 => tile::<2>(w, r, x, out),
        3 => tile::<3>(w, r, x, out),
        _ => tile::<4>(w, r, x, out),
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile<const NT: usize>(w: &Packed, r: Range<usize>, x: &Acts<'_>, out: &mut [f32]) {
    let nb = x.nb;
    // Every pointer read below is within these bounds.
    assert!(out.len() >= NT && r.len() == nb);
    assert!(x.q.len() >= NT * nb * QK && x.d.len() >= NT * nb && x.s.len() >= NT * nb);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); NT];
    let mut macc = [0f32; NT];
    let xq = x.q.as_ptr();
    match w {
        Packed::U4 { d, m, q } => {
            let (d, m, q) = (&d[r.clone()], &m[r.clone()], &q[r.start * 16..r.end * 16]);
            let m4 = _mm_set1_epi8(0x0f);
            for b in 0..nb {
                // SAFETY (reads): `q` holds `16 * nb` bytes and activations `NT * nb * QK`
                // (asserted above).
                let raw = _mm_loadu_si128(q.as_ptr().add(16 * b) as *const __m128i);
                let lo = _mm_and_si128(raw, m4);
                let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
                let wv = _mm256_set_m128i(hi, lo);
                let (db, mb) = (d[b], m[b]);
                for t in 0..NT {
                    let xb = t * nb + b;
                    let y = _mm256_loadu_si256(xq.add(xb * QK) as *const __m256i);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, y), ones);
                    let sc = _mm256_set1_ps(db * *x.d.get_unchecked(xb));
                    acc[t] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), acc[t]);
                    macc[t] += mb * *x.s.get_unchecked(xb);
                }
            }
        }
        // Interleaved matrices go through `dot_x8`.
        Packed::U4x8 { .. }
        | Packed::U8x8 { .. }
        | Packed::I8x8 { .. }
        | Packed::I8S16x8 { .. } => {}
        Packed::U8 { d, m, q } => {
            let (d, m, q) = (&d[r.clone()], &m[r.clone()], &q[r.start * QK..r.end * QK]);
            for b in 0..nb {
                let wv = _mm256_loadu_si256(q.as_ptr().add(QK * b) as *const __m256i);
                let (db, mb) = (d[b], m[b]);
                for t in 0..NT {
                    let xb = t * nb + b;
                    let y = _mm256_loadu_si256(xq.add(xb * QK) as *const __m256i);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, y), ones);
                    let sc = _mm256_set1_ps(db * *x.d.get_unchecked(xb));
                    acc[t] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), acc[t]);
                    macc[t] += mb * *x.s.get_unchecked(xb);
                }
            }
        }
        Packed::I8 { d, q } => {
            let (d, q) = (&d[r.clone()], &q[r.start * QK..r.end * QK]);
            for b in 0..nb {
                let wv = _mm256_loadu_si256(q.as_ptr().add(QK * b) as *const __m256i);
                let aw = _mm256_sign_epi8(wv, wv);
                let db = d[b];
                for t in 0..NT {
                    let xb = t * nb + b;
                    let y = _mm256_loadu_si256(xq.add(xb * QK) as *const __m256i);
                    let sy = _mm256_sign_epi8(y, wv);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sy), ones);
                    let sc = _mm256_set1_ps(db * *x.d.get_unchecked(xb));
                    acc[t] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), acc[t]);
                }
            }
        }
        Packed::I8S16 { d, s, q } => {
            let (d, s, q) = (
                &d[r.clone()],
                &s[r.start * 2..r.end * 2],
                &q[r.start * QK..r.end * QK],
            );
            for b in 0..nb {
                let wv = _mm256_loadu_si256(q.as_ptr().add(QK * b) as *const __m256i);
                let aw = _mm256_sign_epi8(wv, wv);
                let scv = _mm256_set_m128i(_mm_set1_epi16(s[2 * b + 1]), _mm_set1_epi16(s[2 * b]));
                let db = d[b];
                for t in 0..NT {
                    let xb = t * nb + b;
                    let y = _mm256_loadu_si256(xq.add(xb * QK) as *const __m256i);
                    let sy = _mm256_sign_epi8(y, wv);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sy), scv);
                    let sc = _mm256_set1_ps(db * *x.d.get_unchecked(xb));
                    acc[t] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), acc[t]);
                }
            }
        }
    }
    for t in 0..NT {
        out[t] = hsum(acc[t]) + macc[t];
    }
}

/// Dot products of the eight interleaved rows of one [`Packed::U4x8`] group (`d`, `m`: 8 per
/// block; `q`: 128 bytes per block) with each activation row of `x` (1 to 4), into
/// `out[8 * t + lane]`.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_u4x8(d: &[f32], m: &[f32], q: &[u8], x: &Acts<'_>, out: &mut [f32]) {
    match out.len() / 8 {
        1 => tile_x8::<1>(d, m, q, x, out),
        2 => tile_x8::<2>(d, m, q, x, out),
        3 => tile_x8::<3>(d, m, q, x, out),
        _ => tile_x8::<4>(d, m, q, x, out),
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile_x8<const NT: usize>(d: &[f32], m: &[f32], q: &[u8], x: &Acts<'_>, out: &mut [f32]) {
    let nb = x.nb;
    // Every pointer access below is within these bounds.
    assert!(d.len() == 8 * nb && m.len() == 8 * nb && q.len() == 128 * nb);
    assert!(out.len() >= 8 * NT);
    assert!(x.q.len() >= NT * nb * QK && x.d.len() >= NT * nb && x.s.len() >= NT * nb);
    let m4 = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); NT];
    let xq = x.q.as_ptr();
    for b in 0..nb {
        // Per token, the eight rows' block sums in 16-bit pairs. Each product is at most
        // 15 * 127 and each lane adds 16 of them (8 instructions x 2): below 2^15.
        let mut isum = [_mm256_setzero_si256(); NT];
        for c in 0..4 {
            // SAFETY (reads): `q` holds 128 bytes per block, activations `QK` bytes per
            // block and token (asserted above); unaligned loads accept any address.
            let raw = _mm256_loadu_si256(q.as_ptr().add(128 * b + 32 * c) as *const __m256i);
            let lo = _mm256_and_si256(raw, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            for t in 0..NT {
                let y = xq.add((t * nb + b) * QK);
                let ylo = _mm256_set1_epi32((y.add(4 * c) as *const i32).read_unaligned());
                let yhi = _mm256_set1_epi32((y.add(16 + 4 * c) as *const i32).read_unaligned());
                let p =
                    _mm256_add_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_maddubs_epi16(hi, yhi));
                isum[t] = _mm256_add_epi16(isum[t], p);
            }
        }
        let dv = _mm256_loadu_ps(d.as_ptr().add(8 * b));
        let mv = _mm256_loadu_ps(m.as_ptr().add(8 * b));
        for t in 0..NT {
            let xb = t * nb + b;
            let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(isum[t], ones));
            let sc = _mm256_mul_ps(dv, _mm256_set1_ps(*x.d.get_unchecked(xb)));
            acc[t] = _mm256_fmadd_ps(p, sc, acc[t]);
            acc[t] = _mm256_fmadd_ps(mv, _mm256_set1_ps(*x.s.get_unchecked(xb)), acc[t]);
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.as_mut_ptr().add(8 * t), acc[t]);
    }
}

/// Dot products of the eight interleaved rows of one [`Packed::I8x8`] group (`d`: 8 per
/// block; `q`: 256 bytes per block) with each activation row of `x` (1 to 4), into
/// `out[8 * t + lane]`.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_i8x8(d: &[f32], q: &[i8], x: &Acts<'_>, out: &mut [f32]) {
    match out.len() / 8 {
        1 => tile_i8x8::<1>(d, q, x, out),
        2 => tile_i8x8::<2>(d, q, x, out),
        3 => tile_i8x8::<3>(d, q, x, out),
        _ => tile_i8x8::<4>(d, q, x, out),
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile_i8x8<const NT: usize>(d: &[f32], q: &[i8], x: &Acts<'_>, out: &mut [f32]) {
    let nb = x.nb;
    // Every pointer access below is within these bounds.
    assert!(d.len() == 8 * nb && q.len() == 256 * nb);
    assert!(out.len() >= 8 * NT);
    assert!(x.q.len() >= NT * nb * QK && x.d.len() >= NT * nb);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); NT];
    let xq = x.q.as_ptr();
    for b in 0..nb {
        let mut isum = [_mm256_setzero_si256(); NT];
        for c in 0..8 {
            // SAFETY (reads): `q` holds 256 bytes per block, activations `QK` bytes per
            // block and token (asserted above); unaligned loads accept any address.
            let wv = _mm256_loadu_si256(q.as_ptr().add(256 * b + 32 * c) as *const __m256i);
            // |w| times y with w's sign: unsigned by signed, as `maddubs` needs. A pair of
            // products is at most 2 * 128 * 127, which fits 16 bits.
            let aw = _mm256_sign_epi8(wv, wv);
            for t in 0..NT {
                let y = xq.add((t * nb + b) * QK + 4 * c);
                let yv = _mm256_set1_epi32((y as *const i32).read_unaligned());
                let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(yv, wv));
                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, ones));
            }
        }
        let dv = _mm256_loadu_ps(d.as_ptr().add(8 * b));
        for t in 0..NT {
            let sc = _mm256_mul_ps(dv, _mm256_set1_ps(*x.d.get_unchecked(t * nb + b)));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), sc, acc[t]);
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.as_mut_ptr().add(8 * t), acc[t]);
    }
}

/// Dot products of the eight interleaved rows of one [`Packed::I8S16x8`] group (`d`: 8 per
/// block; `s`: 32 per block; `q`: 256 bytes per block) with each activation row of `x` (1 to
/// 4), into `out[8 * t + lane]`.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_i8s16x8(d: &[f32], s: &[i16], q: &[i8], x: &Acts<'_>, out: &mut [f32]) {
    match out.len() / 8 {
        1 => tile_i8s16x8::<1>(d, s, q, x, out),
        2 => tile_i8s16x8::<2>(d, s, q, x, out),
        3 => tile_i8s16x8::<3>(d, s, q, x, out),
        _ => tile_i8s16x8::<4>(d, s, q, x, out),
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile_i8s16x8<const NT: usize>(
    d: &[f32],
    s: &[i16],
    q: &[i8],
    x: &Acts<'_>,
    out: &mut [f32],
) {
    let nb = x.nb;
    // Every pointer access below is within these bounds.
    assert!(d.len() == 8 * nb && s.len() == 32 * nb && q.len() == 256 * nb);
    assert!(out.len() >= 8 * NT);
    assert!(x.q.len() >= NT * nb * QK && x.d.len() >= NT * nb);
    let mut acc = [_mm256_setzero_ps(); NT];
    let xq = x.q.as_ptr();
    for b in 0..nb {
        let mut isum = [_mm256_setzero_si256(); NT];
        for h in 0..2 {
            // Per token, the eight rows' half-block sums in 16-bit pairs: |q| <= 32, so a pair
            // is at most 2 * 32 * 127 and four of them stay below 2^15.
            let mut half = [_mm256_setzero_si256(); NT];
            for c in 4 * h..4 * h + 4 {
                // SAFETY (reads): `q` holds 256 bytes per block, activations `QK` bytes per
                // block and token (asserted above); unaligned loads accept any address.
                let wv = _mm256_loadu_si256(q.as_ptr().add(256 * b + 32 * c) as *const __m256i);
                let aw = _mm256_sign_epi8(wv, wv);
                for t in 0..NT {
                    let y = xq.add((t * nb + b) * QK + 4 * c);
                    let yv = _mm256_set1_epi32((y as *const i32).read_unaligned());
                    let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(yv, wv));
                    half[t] = _mm256_add_epi16(half[t], p);
                }
            }
            let sv = _mm256_loadu_si256(s.as_ptr().add(32 * b + 16 * h) as *const __m256i);
            for t in 0..NT {
                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(half[t], sv));
            }
        }
        let dv = _mm256_loadu_ps(d.as_ptr().add(8 * b));
        for t in 0..NT {
            let sc = _mm256_mul_ps(dv, _mm256_set1_ps(*x.d.get_unchecked(t * nb + b)));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), sc, acc[t]);
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.as_mut_ptr().add(8 * t), acc[t]);
    }
}

/// Dot products of the eight interleaved rows of one [`Packed::U8x8`] group (`d`, `m`: 8 per
/// block; `q`: 256 bytes per block) with each activation row of `x` (1 to 4), into
/// `out[8 * t + lane]`.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_u8x8(d: &[f32], m: &[f32], q: &[u8], x: &Acts<'_>, out: &mut [f32]) {
    match out.len() / 8 {
        1 => tile_u8x8::<1>(d, m, q, x, out),
        2 => tile_u8x8::<2>(d, m, q, x, out),
        3 => tile_u8x8::<3>(d, m, q, x, out),
        _ => tile_u8x8::<4>(d, m, q, x, out),
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile_u8x8<const NT: usize>(
    d: &[f32],
    m: &[f32],
    q: &[u8],
    x: &Acts<'_>,
    out: &mut [f32],
) {
    let nb = x.nb;
    // Every pointer access below is within these bounds.
    assert!(d.len() == 8 * nb && m.len() == 8 * nb && q.len() == 256 * nb);
    assert!(out.len() >= 8 * NT);
    assert!(x.q.len() >= NT * nb * QK && x.d.len() >= NT * nb && x.s.len() >= NT * nb);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); NT];
    let xq = x.q.as_ptr();
    for b in 0..nb {
        let mut isum = [_mm256_setzero_si256(); NT];
        for h in 0..2 {
            // Quants are at most 31: a pair of products is at most 2 * 31 * 127 and four of
            // them stay below 2^15.
            let mut half = [_mm256_setzero_si256(); NT];
            for c in 4 * h..4 * h + 4 {
                // SAFETY (reads): `q` holds 256 bytes per block, activations `QK` bytes per
                // block and token (asserted above); unaligned loads accept any address.
                let wv = _mm256_loadu_si256(q.as_ptr().add(256 * b + 32 * c) as *const __m256i);
                for t in 0..NT {
                    let y = xq.add((t * nb + b) * QK + 4 * c);
                    let yv = _mm256_set1_epi32((y as *const i32).read_unaligned());
                    half[t] = _mm256_add_epi16(half[t], _mm256_maddubs_epi16(wv, yv));
                }
            }
            for t in 0..NT {
                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(half[t], ones));
            }
        }
        let dv = _mm256_loadu_ps(d.as_ptr().add(8 * b));
        let mv = _mm256_loadu_ps(m.as_ptr().add(8 * b));
        for t in 0..NT {
            let xb = t * nb + b;
            let sc = _mm256_mul_ps(dv, _mm256_set1_ps(*x.d.get_unchecked(xb)));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), sc, acc[t]);
            acc[t] = _mm256_fmadd_ps(mv, _mm256_set1_ps(*x.s.get_unchecked(xb)), acc[t]);
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.as_mut_ptr().add(8 * t), acc[t]);
    }
}
