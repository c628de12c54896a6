//! x86-64 kernels: AVX2 + FMA dot products, and the interleaved kernels also with AVX-VNNI or
//! AVX-512 VNNI (chosen at run time, see [`super::Isa`]).

// Index loops mirror the block layout (block b, activation row t) and address several arrays
// at once; iterator rewrites would obscure the SIMD kernels.
#![allow(clippy::needless_range_loop)]

use super::{Acts, Packed, QK};
use std::arch::x86_64::*;
use std::ops::Range;

/// `$call` with the constant `$nt` set to `$n` (1 to 4; more is 4): tile kernels are
/// instantiated per token count.
macro_rules! by_tokens {
    ($n:expr, $nt:ident => $call:expr) => {
        match $n {
            1 => {
                const $nt: usize = 1;
                $call
            }
            2 => {
                const $nt: usize = 2;
                $call
            }
            3 => {
                const $nt: usize = 3;
                $call
            }
            _ => {
                const $nt: usize = 4;
                $call
            }
        }
    };
}

/// Dot products of the weight blocks `r` with each activation row of `x` (1 to 4), into
/// `out`.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_tile(w: &Packed, r: Range<usize>, x: &Acts<'_>, out: &mut [f32]) {
    // SAFETY: the caller guarantees AVX2 and FMA (this function's contract); `tile` checks the slice bounds it reads.
    unsafe { by_tokens!(out.len(), NT => tile::<NT>(w, r, x, out)) }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// Adds block `b` of weights `wv` times each token's block `b` to `acc` (the integer sums,
/// scaled by `db` and the token's scale) and, for unsigned weights, `mb` times the token's
/// scaled block sum to `macc` (the block's offset term). `mul` are the 16-bit multipliers of the
/// pair sums: ones, or `I8S16`'s sub-scales of the block's halves. `SIGNED` weights go through
/// `maddubs` as |w| times y with w's sign.
///
/// # Safety
/// AVX2 and FMA; `x` holds `NT` tokens of `x.nb` blocks and `b < x.nb` (the caller's bounds).
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn row_block<const NT: usize, const SIGNED: bool>(
    wv: __m256i,
    mul: __m256i,
    db: f32,
    mb: f32,
    b: usize,
    x: &Acts<'_>,
    acc: &mut [__m256; NT],
    macc: &mut [f32; NT],
) {
    // SAFETY: the caller guarantees AVX2 and FMA and that `x` holds `NT` tokens of `x.nb` blocks with `b < x.nb` (this function's contract), so every load and unchecked index below is in bounds.
    unsafe {
        let aw = if SIGNED { _mm256_sign_epi8(wv, wv) } else { wv };
        for t in 0..NT {
            let xb = t * x.nb + b;
            let y = _mm256_loadu_si256(x.q.as_ptr().add(xb * QK) as *const __m256i);
            let y = if SIGNED { _mm256_sign_epi8(y, wv) } else { y };
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, y), mul);
            let sc = _mm256_set1_ps(db * *x.d.get_unchecked(xb));
            acc[t] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), acc[t]);
            if !SIGNED {
                macc[t] += mb * *x.s.get_unchecked(xb);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile<const NT: usize>(w: &Packed, r: Range<usize>, x: &Acts<'_>, out: &mut [f32]) {
    // SAFETY: the caller guarantees AVX2 and FMA; the asserts above bound every pointer read and unchecked index below.
    unsafe {
        let nb = x.nb;
        // Every pointer read below is within these bounds.
        assert!(out.len() >= NT && r.len() == nb);
        assert!(x.q.len() >= NT * nb * QK && x.d.len() >= NT * nb && x.s.len() >= NT * nb);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); NT];
        let mut macc = [0f32; NT];
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
                    row_block::<NT, false>(wv, ones, d[b], m[b], b, x, &mut acc, &mut macc);
                }
            }
            // Interleaved matrices go through `dot_x8`.
            Packed::U4x8 { .. }
            | Packed::U4x8Half { .. }
            | Packed::U5x8 { .. }
            | Packed::I8x8 { .. }
            | Packed::I8S16x8 { .. } => {}
            Packed::U8 { d, m, q } => {
                let (d, m, q) = (&d[r.clone()], &m[r.clone()], &q[r.start * QK..r.end * QK]);
                for b in 0..nb {
                    let wv = _mm256_loadu_si256(q.as_ptr().add(QK * b) as *const __m256i);
                    row_block::<NT, false>(wv, ones, d[b], m[b], b, x, &mut acc, &mut macc);
                }
            }
            Packed::I8 { d, q } => {
                let (d, q) = (&d[r.clone()], &q[r.start * QK..r.end * QK]);
                for b in 0..nb {
                    let wv = _mm256_loadu_si256(q.as_ptr().add(QK * b) as *const __m256i);
                    row_block::<NT, true>(wv, ones, d[b], 0.0, b, x, &mut acc, &mut macc);
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
                    let scv =
                        _mm256_set_m128i(_mm_set1_epi16(s[2 * b + 1]), _mm_set1_epi16(s[2 * b]));
                    row_block::<NT, true>(wv, scv, d[b], 0.0, b, x, &mut acc, &mut macc);
                }
            }
        }
        for t in 0..NT {
            out[t] = hsum(acc[t]) + macc[t];
        }
    }
}

/// The kernels of interleaved matrices (see [`Packed::U4x8`]), stamped out per instruction
/// set: `$features` are the entry points' target features, `$vnni` says whether `$dpbusd`
/// (a VNNI `u8 x i8` dot product of four-byte groups added to 32-bit lanes) replaces AVX2's
/// `maddubs` / `madd` / `add` sequence. Both forms compute the same integer sums: AVX2's
/// 16-bit intermediates stay below 2^15 (bounds beside each kernel), VNNI's are 32-bit.
macro_rules! x8_kernels {
    ($module:ident, $features:literal, $vnni:literal, $dpbusd:path, $masks:literal) => {
        pub(crate) mod $module {
            // See the note on the enclosing module.
            #![allow(clippy::needless_range_loop)]

            use super::super::{Acts, GroupQuants, Interleaved, Scales, QK};
            use std::arch::x86_64::*;

            /// Whether the integer sums go through VNNI's `dpbusd`.
            const VNNI: bool = $vnni;
            /// Whether AVX-512BW's byte masks complete 5-bit quants (a masked add of 16 per
            /// register, its mask the word of fifth bits itself) instead of spreading the word
            /// over the bytes ([`Spread`]).
            const MASKS: bool = $masks;

            /// Dot products of the eight interleaved rows of `g` with each activation row of `x` (1 to
            /// 4), into `out[8 * t + lane]`. Each layout has its own entry point, kept out of line: with
            /// every tile inlined into one function (as `-C target-cpu=native` allows) decode ran about 6%
            /// slower.
            ///
            /// # Safety
            /// The CPU must support `$features`.
            pub(crate) unsafe fn dot_x8(g: &Interleaved<'_>, x: &Acts<'_>, out: &mut [f32]) {
                // SAFETY: the caller guarantees `$features` (this function's contract); the callees check the bounds they read.
                unsafe {
                    match g.q {
                        GroupQuants::Nibbles(q, paired) => dot_u4x8(g, q, paired, x, out),
                        GroupQuants::Nibbles5(q, h) => dot_u5x8(g, q, h, x, out),
                        GroupQuants::Signed(q) => {
                            // SAFETY: `i8` and `u8` have the same size and alignment; the kernel reads the
                            // bytes through SIMD loads and treats them as signed.
                            let q = std::slice::from_raw_parts(q.as_ptr() as *const u8, q.len());
                            if g.s.is_some() {
                                dot_bytes_x8::<true, 4>(g, q, x, out)
                            } else {
                                dot_bytes_x8::<true, 1>(g, q, x, out)
                            }
                        }
                    }
                }
            }

            #[target_feature(enable = $features)]
            #[inline(never)]
            unsafe fn dot_u4x8(g: &Interleaved<'_>, q: &[u8], paired: bool, x: &Acts<'_>, out: &mut [f32]) {
                // SAFETY: the caller guarantees `$features`; `tile_u4x8` checks the bounds it reads.
                unsafe {
                    by_tokens!(out.len() / 8, NT => tile_u4x8::<NT>(g, q, paired, x, out))
                }
            }

            #[target_feature(enable = $features)]
            #[inline(never)]
            unsafe fn dot_u5x8(g: &Interleaved<'_>, q: &[u8], h: &[u32], x: &Acts<'_>, out: &mut [f32]) {
                // SAFETY: the caller guarantees `$features`; `tile_u5x8` checks the bounds it reads.
                unsafe {
                    by_tokens!(out.len() / 8, NT => tile_u5x8::<NT>(g, q, h, x, out))
                }
            }

            #[target_feature(enable = $features)]
            #[inline(never)]
            unsafe fn dot_bytes_x8<const SIGNED: bool, const RUN: usize>(
                g: &Interleaved<'_>,
                q: &[u8],
                x: &Acts<'_>,
                out: &mut [f32],
            ) {
                // SAFETY: the caller guarantees `$features`; `tile_bytes_x8` checks the bounds it reads.
                unsafe {
                    by_tokens!(out.len() / 8, NT => tile_bytes_x8::<NT, SIGNED, RUN>(g, q, x, out))
                }
            }

            /// The lengths every `*_x8` kernel relies on: `q_len` bytes of quants.
            #[inline]
            fn check_x8(
                g: &Interleaved<'_>,
                q_len: usize,
                q: &[u8],
                x: &Acts<'_>,
                out: &[f32],
                nt: usize,
            ) {
                let nb = x.nb;
                assert!(nb > 0 && g.d.len() == 8 * nb && q.len() == q_len);
                assert!(g.m.is_none_or(|m| m.len() == 8 * nb) && g.s.is_none_or(|s| s.len() == 32 * nb));
                assert!(out.len() >= 8 * nt);
                assert!(x.q.len() >= nt * nb * QK && x.d.len() >= nt * nb && x.s.len() >= nt * nb);
            }

            /// The eight rows' scales (or offsets) of block `b`, as `f32` (half floats converted
            /// exactly).
            ///
            /// # Safety
            /// The CPU must support `$features`, and `v` hold at least `8 * (b + 1)` values.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn load8(v: Scales<'_>, b: usize) -> __m256 {
                // SAFETY: the caller guarantees `$features` and the length (this function's contract).
                unsafe {
                    match v {
                        Scales::F32(v) => _mm256_loadu_ps(v.as_ptr().add(8 * b)),
                        Scales::F16(v) => _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(8 * b) as *const __m128i)),
                        Scales::F16Times(v, by) => _mm256_mul_ps(
                            _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(8 * b) as *const __m128i)),
                            _mm256_set1_ps(by),
                        ),
                    }
                }
            }

            /// Adds the block's scaled sums (and offsets, when the group has them) of every token to
            /// `acc`.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn scale_block<const NT: usize>(
                g: &Interleaved<'_>,
                b: usize,
                isum: &[__m256i; NT],
                x: &Acts<'_>,
                acc: &mut [__m256; NT],
            ) {
                // SAFETY: the caller guarantees `$features` and passes in-bounds blocks (this function's contract).
                unsafe {
                    let nb = x.nb;
                    // SAFETY (reads): `d` and `m` hold 8 values per block (checked by `check_x8`).
                    let dv = load8(g.d, b);
                    for t in 0..NT {
                        let sc = _mm256_mul_ps(dv, _mm256_set1_ps(*x.d.get_unchecked(t * nb + b)));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), sc, acc[t]);
                    }
                    if let Some(m) = g.m {
                        let mv = load8(m, b);
                        for t in 0..NT {
                            acc[t] = _mm256_fmadd_ps(mv, _mm256_set1_ps(*x.s.get_unchecked(t * nb + b)), acc[t]);
                        }
                    }
                }
            }

            /// Adds, per token, the products of a chunk's low and high nibbles (`lo`, `hi`: chunk `c`
            /// of block `b`, 5-bit quants included) with the token's activation bytes `4c..4c + 4`
            /// and `16 + 4c..16 + 4c + 4` to `sums`: 32-bit lanes with VNNI, 16-bit pairs without
            /// (the caller bounds how many it adds before widening).
            ///
            /// # Safety
            /// The CPU must support `$features`, and `x` hold block `b` of `NT` tokens.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn add_nibble_products<const NT: usize>(
                lo: __m256i,
                hi: __m256i,
                x: &Acts<'_>,
                b: usize,
                c: usize,
                sums: &mut [__m256i; NT],
            ) {
                // SAFETY: the caller guarantees `$features` and that `x` holds block `b` of `NT`
                // tokens (`QK` bytes each); unaligned loads accept any address.
                unsafe {
                    for t in 0..NT {
                        let y = x.q.as_ptr().add((t * x.nb + b) * QK);
                        let ylo = _mm256_set1_epi32((y.add(4 * c) as *const i32).read_unaligned());
                        let yhi = _mm256_set1_epi32((y.add(16 + 4 * c) as *const i32).read_unaligned());
                        if VNNI {
                            sums[t] = $dpbusd(sums[t], lo, ylo);
                            sums[t] = $dpbusd(sums[t], hi, yhi);
                        } else {
                            let p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_maddubs_epi16(hi, yhi));
                            sums[t] = _mm256_add_epi16(sums[t], p);
                        }
                    }
                }
            }

            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn tile_u4x8<const NT: usize>(
                g: &Interleaved<'_>,
                q: &[u8],
                paired: bool,
                x: &Acts<'_>,
                out: &mut [f32],
            ) {
                // SAFETY: the caller guarantees `$features`; the asserts at the top bound every pointer read below.
                unsafe {
                    let nb = x.nb;
                    // Blocks `step` bytes apart, chunks `chunk` (the layouts of `GroupQuants::Nibbles`):
                    // the last chunk ends `chunk - 32` bytes before `step * nb`.
                    let (step, chunk) = crate::nibble_steps(paired);
                    // Every pointer access below is within these bounds.
                    check_x8(g, (step * nb).saturating_sub(chunk - 32), q, x, out, NT);
                    let m4 = _mm256_set1_epi8(0x0f);
                    let ones = _mm256_set1_epi16(1);
                    let mut acc = [_mm256_setzero_ps(); NT];
                    for b in 0..nb {
                        if x.ahead > 0 {
                            // A pair's lines hold the partner group's chunks too, which its own
                            // call reads next.
                            crate::prefetch_lines(q.as_ptr().wrapping_add(step * b), x.ahead, step / 64);
                        }
                        // Per token, the eight rows' block sums in 16-bit pairs. Each product is at most
                        // 15 * 127 and each lane adds 16 of them (8 instructions x 2): below 2^15.
                        let mut isum = [_mm256_setzero_si256(); NT];
                        for c in 0..4 {
                            // SAFETY (reads): `q` holds four chunks of 32 bytes per block at these
                            // offsets, activations `QK` bytes per block and token (checked above);
                            // unaligned loads accept any address.
                            let raw = _mm256_loadu_si256(q.as_ptr().add(step * b + chunk * c) as *const __m256i);
                            let lo = _mm256_and_si256(raw, m4);
                            let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                            add_nibble_products(lo, hi, x, b, c, &mut isum);
                        }
                        if !VNNI {
                            for v in isum.iter_mut() {
                                *v = _mm256_madd_epi16(*v, ones);
                            }
                        }
                        scale_block(g, b, &isum, x, &mut acc);
                    }
                    for t in 0..NT {
                        _mm256_storeu_ps(out.as_mut_ptr().add(8 * t), acc[t]);
                    }
                }
            }

            /// The constants that turn a word of fifth bits into 16 or 0 per byte.
            struct Spread {
                /// Byte `k` takes byte `k / 8` of the word.
                bytes: __m256i,
                /// Byte `k` keeps bit `k % 8`.
                bit: __m256i,
                sixteen: __m256i,
            }

            impl Spread {
                #[target_feature(enable = $features)]
                #[inline]
                fn new() -> Spread {
                    Spread {
                        bytes: _mm256_setr_epi8(
                            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                        ),
                        bit: _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64),
                        sixteen: _mm256_set1_epi8(16),
                    }
                }

                /// 16 in byte `k` where bit `k` of `w` is set, else 0.
                #[target_feature(enable = $features)]
                #[inline]
                fn fifth(&self, w: u32) -> __m256i {
                    let b = _mm256_shuffle_epi8(_mm256_set1_epi32(w as i32), self.bytes);
                    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, self.bit), self.bit), self.sixteen)
                }
            }

            /// `U5x8`: the nibbles as in `tile_u4x8`, each register completed with its fifth bits
            /// (a 32-bit word spread to one bit per byte, turned into 16 where set). Per token,
            /// the 16-bit stage of AVX2 takes four products of at most 31 * 128 * 2 (below 2^15)
            /// before widening: two chunks, low and high nibbles.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn tile_u5x8<const NT: usize>(
                g: &Interleaved<'_>,
                q: &[u8],
                h: &[u32],
                x: &Acts<'_>,
                out: &mut [f32],
            ) {
                // SAFETY: the caller guarantees `$features`; the asserts at the top bound every pointer read below.
                unsafe {
                    let nb = x.nb;
                    // Every pointer access below is within these bounds.
                    check_x8(g, 128 * nb, q, x, out, NT);
                    assert!(h.len() == 8 * nb);
                    let m4 = _mm256_set1_epi8(0x0f);
                    let ones = _mm256_set1_epi16(1);
                    let spread = Spread::new();
                    let mut acc = [_mm256_setzero_ps(); NT];
                    let hp = h.as_ptr();
                    for b in 0..nb {
                        if x.ahead > 0 {
                            crate::prefetch_lines(q.as_ptr().add(128 * b), x.ahead, 2);
                        }
                        let mut isum = [_mm256_setzero_si256(); NT];
                        for half in 0..2 {
                            let mut part = [_mm256_setzero_si256(); NT];
                            for c in 2 * half..2 * half + 2 {
                                // SAFETY (reads): `q` holds 128 bytes per block and `h` eight words,
                                // activations `QK` bytes per block and token (checked above);
                                // unaligned loads accept any address.
                                let raw = _mm256_loadu_si256(q.as_ptr().add(128 * b + 32 * c) as *const __m256i);
                                let (wl, wh) = (*hp.add(8 * b + c), *hp.add(8 * b + 4 + c));
                                let lo = _mm256_and_si256(raw, m4);
                                let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                                let (lo, hi) = if MASKS {
                                    // Bit `k` of the word is byte `k`'s fifth bit: the word is the mask.
                                    (
                                        _mm256_mask_add_epi8(lo, wl, lo, spread.sixteen),
                                        _mm256_mask_add_epi8(hi, wh, hi, spread.sixteen),
                                    )
                                } else {
                                    (_mm256_or_si256(lo, spread.fifth(wl)), _mm256_or_si256(hi, spread.fifth(wh)))
                                };
                                // With VNNI straight into the 32-bit sums; without, into the 16-bit stage.
                                add_nibble_products(lo, hi, x, b, c, if VNNI { &mut isum } else { &mut part });
                            }
                            if !VNNI {
                                for t in 0..NT {
                                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(part[t], ones));
                                }
                            }
                        }
                        scale_block(g, b, &isum, x, &mut acc);
                    }
                    for t in 0..NT {
                        _mm256_storeu_ps(out.as_mut_ptr().add(8 * t), acc[t]);
                    }
                }
            }

            /// The byte layouts (`I8x8`, `I8S16x8`). `SIGNED` quants go through `maddubs` as |w|
            /// times y with w's sign. `RUN` groups of four bytes are summed in 16-bit lanes before
            /// widening: 4 when a pair of products stays below 2^13 (quants up to 31 unsigned or 32 in
            /// magnitude, so four pairs fit 16 bits), 1 for full 8-bit quants (a pair reaches
            /// 2 * 128 * 127). Runs of 4 are the block's halves, which is where `I8S16x8`'s sub-scales
            /// apply (as the `madd` multipliers).
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn tile_bytes_x8<const NT: usize, const SIGNED: bool, const RUN: usize>(
                g: &Interleaved<'_>,
                q: &[u8],
                x: &Acts<'_>,
                out: &mut [f32],
            ) {
                // SAFETY: the caller guarantees `$features`; the asserts at the top bound every pointer read below.
                unsafe {
                    let nb = x.nb;
                    // Every pointer access below is within these bounds.
                    check_x8(g, 256 * nb, q, x, out, NT);
                    let ones = _mm256_set1_epi16(1);
                    let mut acc = [_mm256_setzero_ps(); NT];
                    let xq = x.q.as_ptr();
                    // Sub-scales apply per half: signed quants in runs of 4 are `I8S16x8`'s (a constant,
                    // so the unsigned and 8-bit kernels carry no test for them).
                    let has_subs = SIGNED && RUN == 4;
                    let subs = if has_subs { g.s } else { None };
                    // With VNNI, every layout without sub-scales goes straight into the 32-bit sums:
                    // no 16-bit stage to bound.
                    let direct_vnni = VNNI && !has_subs;
                    for b in 0..nb {
                        if x.ahead > 0 {
                            crate::prefetch_lines(q.as_ptr().add(256 * b), x.ahead, 4);
                        }
                        let mut isum = [_mm256_setzero_si256(); NT];
                        for run in 0..8 / RUN {
                            let mut part = [_mm256_setzero_si256(); NT];
                            for c in RUN * run..RUN * (run + 1) {
                                // SAFETY (reads): `q` holds 256 bytes per block, activations `QK` bytes per
                                // block and token (checked above); unaligned loads accept any address.
                                let wv = _mm256_loadu_si256(q.as_ptr().add(256 * b + 32 * c) as *const __m256i);
                                let aw = if SIGNED { _mm256_sign_epi8(wv, wv) } else { wv };
                                for t in 0..NT {
                                    let y = xq.add((t * nb + b) * QK + 4 * c);
                                    let yv = _mm256_set1_epi32((y as *const i32).read_unaligned());
                                    let yv = if SIGNED { _mm256_sign_epi8(yv, wv) } else { yv };
                                    if direct_vnni {
                                        isum[t] = $dpbusd(isum[t], aw, yv);
                                        continue;
                                    }
                                    let p = _mm256_maddubs_epi16(aw, yv);
                                    part[t] = if RUN == 1 {
                                        p
                                    } else {
                                        _mm256_add_epi16(part[t], p)
                                    };
                                }
                            }
                            if direct_vnni {
                                continue;
                            }
                            let mul = match subs {
                                // SAFETY (read): 32 sub-scales per block (checked above); `run` is the half.
                                Some(s) => _mm256_loadu_si256(s.as_ptr().add(32 * b + 16 * run) as *const __m256i),
                                None => ones,
                            };
                            for t in 0..NT {
                                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(part[t], mul));
                            }
                        }
                        scale_block(g, b, &isum, x, &mut acc);
                    }
                    for t in 0..NT {
                        _mm256_storeu_ps(out.as_mut_ptr().add(8 * t), acc[t]);
                    }
                }
            }
        }
    };
}

x8_kernels!(
    x8_avx2,
    "avx2,fma,f16c",
    false,
    _mm256_dpbusd_avx_epi32,
    false
);
x8_kernels!(
    x8_avx_vnni,
    "avx2,fma,f16c,avxvnni",
    true,
    _mm256_dpbusd_avx_epi32,
    false
);
x8_kernels!(
    x8_avx512_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl,avx512bw",
    true,
    _mm256_dpbusd_epi32,
    true
);

/// Where a run of the 16-row kernels writes: `rows` outputs per token from `ptr`, `len`
/// elements in all.
pub(crate) struct OutRows {
    /// The first output.
    pub ptr: *mut f32,
    /// Elements writable from `ptr`.
    pub len: usize,
    /// Outputs per token (the matrix's rows).
    pub rows: usize,
}

/// Stamps out the kernels of two interleaved groups at once (sixteen rows) in 512-bit
/// registers, with GFNI (`x16_avx512_gfni`) and without (`x16_avx512`): group `g`'s eight
/// rows in the low half of each register, group `g + 1`'s in the high half. Each
/// `vpdpbusd` then multiplies sixteen rows by four activation bytes, twice the work of the
/// 8-row kernels' instruction at the same rate on CPUs with two 512-bit units, and the block
/// scales cost half as many instructions per row. One call runs every pair of a piece of a
/// product and writes the outputs in place, so that the per-group work around the 8-row
/// kernels (slicing a group, a call, copying its tile out) is not paid per pair.
///
/// Every lane computes exactly what the 8-row kernel computes for its row (the same integer
/// sums, then the same multiply, conversion and multiply-adds in the same order), so the two
/// give the same bits and a product may mix them.
macro_rules! x16_kernels {
    ($name:ident, $features:literal, $gfni:expr) => {
        pub(crate) mod $name {
            // See the note on the enclosing module.
            #![allow(clippy::needless_range_loop)]

            use super::super::{Acts, GroupQuants, Interleaved, Scales, QK};
            use super::OutRows;
            use std::arch::x86_64::*;
            use std::ops::Range;

            /// Whether the high nibbles are taken with GFNI (see `pair_u4x16`).
            const GFNI: bool = $gfni;

            /// The layouts with a 16-row kernel, as a whole matrix's arrays.
            enum PairLayout<'a> {
                /// `U4x8`: 4-bit quants, `f32` scales and offsets.
                U4 {
                    q: &'a [u8],
                    d: &'a [f32],
                    m: &'a [f32],
                    paired: bool,
                },
                /// `U4x8Half`: 4-bit quants, half-float scales and offsets (`m` empty when each
                /// offset is the scale times `by`).
                U4Half {
                    q: &'a [u8],
                    d: &'a [u16],
                    m: &'a [u16],
                    by: f32,
                    paired: bool,
                },
                /// `I8x8`: signed bytes, half-float scales.
                I8 { q: &'a [i8], d: &'a [u16] },
            }

            impl<'a> PairLayout<'a> {
                fn of(all: &Interleaved<'a>) -> Option<PairLayout<'a>> {
                    match (all.q, all.d, all.m, all.s) {
                        (GroupQuants::Nibbles(q, paired), Scales::F32(d), Some(Scales::F32(m)), None) => {
                            Some(PairLayout::U4 { q, d, m, paired })
                        }
                        (GroupQuants::Nibbles(q, paired), Scales::F16(d), Some(Scales::F16(m)), None) => {
                            Some(PairLayout::U4Half {
                                q,
                                d,
                                m,
                                by: 0.0,
                                paired,
                            })
                        }
                        (
                            GroupQuants::Nibbles(q, paired),
                            Scales::F16(d),
                            Some(Scales::F16Times(_, by)),
                            None,
                        ) => Some(PairLayout::U4Half {
                            q,
                            d,
                            m: &[],
                            by,
                            paired,
                        }),
                        (GroupQuants::Signed(q), Scales::F16(d), None, None) => {
                            Some(PairLayout::I8 { q, d })
                        }
                        _ => None,
                    }
                }

                /// Whether the arrays hold the first `groups` groups of `nb` blocks.
                fn holds(&self, groups: usize, nb: usize) -> bool {
                    let n = 8 * nb * groups;
                    match self {
                        PairLayout::U4 { q, d, m, .. } => {
                            q.len() >= 16 * n && d.len() >= n && m.len() >= n
                        }
                        PairLayout::U4Half { q, d, m, .. } => {
                            q.len() >= 16 * n && d.len() >= n && (m.is_empty() || m.len() >= n)
                        }
                        PairLayout::I8 { q, d } => q.len() >= 32 * n && d.len() >= n,
                    }
                }
            }

            /// Whether the layout of `all` has a 16-row kernel: `U4x8` (4-bit quants, `f32` scales and
            /// offsets), `U4x8Half` (the same with half floats) and `I8x8` (signed bytes, half-float
            /// scales).
            // Both modules have it, the same; the crate asks `x16_avx512`'s.
            #[allow(dead_code)]
            pub(crate) fn has_x16(all: &Interleaved<'_>) -> bool {
                PairLayout::of(all).is_some()
            }

            /// Products of the groups `groups` of `all` (a whole matrix of `nb` blocks per row, in
            /// pairs: an even count, from an even group) with the tile `x` of tokens `t0..t0 + n` (1 to
            /// 4), written to `out.ptr[(t0 + t) * out.rows + 8 * g + lane]`. Layouts without a 16-row
            /// kernel ([`has_x16`]) write nothing.
            ///
            /// # Panics
            /// When the groups or the outputs are out of bounds, or the count or the first group is
            /// odd.
            ///
            /// # Safety
            /// The CPU must support AVX-512 F, BW, VL and VNNI, and F16C; `out` must be valid for
            /// writes of `out.len` elements, none of them accessed by another thread meanwhile.
            pub(crate) unsafe fn run_x16(
                all: &Interleaved<'_>,
                nb: usize,
                groups: Range<usize>,
                x: &Acts<'_>,
                t0: usize,
                out: &OutRows,
            ) {
                let Some(layout) = PairLayout::of(all) else {
                    return;
                };
                let nt = x.d.len().checked_div(nb).unwrap_or(0);
                assert!(groups.len().is_multiple_of(2) && groups.start.is_multiple_of(2));
                assert!((1..=4).contains(&nt) && x.nb == nb);
                assert!(layout.holds(groups.end, nb));
                assert!(x.q.len() >= nt * nb * QK && x.s.len() >= nt * nb && x.sums.len() >= nt * nb);
                assert!(8 * groups.end <= out.rows && (t0 + nt - 1) * out.rows + 8 * groups.end <= out.len);
                // SAFETY: the caller guarantees the features and the output's validity; the asserts
                // above bound every read and write of the callee.
                unsafe { by_tokens!(nt, NT => run_pairs::<NT>(&layout, groups, x, t0, out)) }
            }

            #[target_feature(enable = $features)]
            #[inline(never)]
            unsafe fn run_pairs<const NT: usize>(
                layout: &PairLayout<'_>,
                groups: Range<usize>,
                x: &Acts<'_>,
                t0: usize,
                out: &OutRows,
            ) {
                let nb = x.nb;
                // SAFETY: the caller guarantees the features; `run_x16`'s asserts bound the group
                // pointers (each pair's two groups lie below `groups.end`), the activations and the
                // outputs.
                unsafe {
                    for g in groups.step_by(2) {
                        // Both layouts of nibbles keep a pair's bytes at the same place.
                        let acc = match *layout {
                            PairLayout::U4 { q, d, m, paired } => pair_u4x16_of::<NT, _>(
                                paired,
                                q.as_ptr().add(128 * nb * g),
                                F32Pair(d.as_ptr().add(8 * nb * g)),
                                Offsets::Own(F32Pair(m.as_ptr().add(8 * nb * g))),
                                x,
                            ),
                            PairLayout::U4Half { q, d, m, by, paired } => {
                                let d = F16Pair(d.as_ptr().add(8 * nb * g));
                                let m = if m.is_empty() {
                                    Offsets::Times(by)
                                } else {
                                    Offsets::Own(F16Pair(m.as_ptr().add(8 * nb * g)))
                                };
                                pair_u4x16_of::<NT, _>(paired, q.as_ptr().add(128 * nb * g), d, m, x)
                            }
                            PairLayout::I8 { q, d } => pair_i8x16::<NT>(
                                q.as_ptr().add(256 * nb * g),
                                d.as_ptr().add(8 * nb * g),
                                x,
                            ),
                        };
                        for t in 0..NT {
                            _mm512_storeu_ps(out.ptr.add((t0 + t) * out.rows + 8 * g), acc[t]);
                        }
                    }
                }
            }

            /// One pair of `I8x8` groups. `vpdpbusd` multiplies unsigned bytes by signed ones; the
            /// 8-row kernels make the weights unsigned as their magnitudes, with their signs moved to
            /// each token's bytes (an instruction per token and chunk, which 512-bit registers lack).
            /// Here the weights are offset by 128 instead (`w ^ 0x80` is `w + 128` as an unsigned
            /// byte), shared by every token, and each sum starts at `-128` times the token's block
            /// sum: `sum (w + 128) y - 128 sum y = sum w y`, the same integer.
            ///
            /// # Safety
            /// The features; `q` and `d` readable for two groups of `x.nb` blocks; `x` holding `NT`
            /// tokens.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn pair_i8x16<const NT: usize>(
                q: *const i8,
                d: *const u16,
                x: &Acts<'_>,
            ) -> [__m512; NT] {
                let nb = x.nb;
                // SAFETY: the caller's contract bounds every read: block `blk < nb` of either group.
                unsafe {
                    let (qb, db) = (q.add(256 * nb), d.add(8 * nb));
                    let bias = _mm512_set1_epi8(-128);
                    let mut acc = [_mm512_setzero_ps(); NT];
                    for blk in 0..nb {
                        if x.ahead > 0 {
                            crate::prefetch_lines(q.add(256 * blk).cast(), x.ahead, 4);
                            crate::prefetch_lines(qb.add(256 * blk).cast(), x.ahead, 4);
                        }
                        // Two chains per token (even and odd chunks); the first starts at the offset's
                        // correction.
                        let mut isum = [_mm512_setzero_si512(); NT];
                        let mut isum_odd = [_mm512_setzero_si512(); NT];
                        for t in 0..NT {
                            isum[t] = _mm512_set1_epi32(-128 * *x.sums.get_unchecked(t * nb + blk));
                        }
                        for c in 0..8 {
                            let ra = _mm256_loadu_si256(q.add(256 * blk + 32 * c) as *const __m256i);
                            let rb = _mm256_loadu_si256(qb.add(256 * blk + 32 * c) as *const __m256i);
                            let w = _mm512_xor_si512(
                                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ra), rb),
                                bias,
                            );
                            for t in 0..NT {
                                let y = x.q.as_ptr().add((t * nb + blk) * QK + 4 * c);
                                let yv = _mm512_set1_epi32((y as *const i32).read_unaligned());
                                if c % 2 == 0 {
                                    isum[t] = _mm512_dpbusd_epi32(isum[t], w, yv);
                                } else {
                                    isum_odd[t] = _mm512_dpbusd_epi32(isum_odd[t], w, yv);
                                }
                            }
                        }
                        // The 8-row kernel's `scale_block` (no offsets), sixteen lanes wide.
                        let half = |p: *const u16| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
                        let dv = join(half(d.add(8 * blk)), half(db.add(8 * blk)));
                        for t in 0..NT {
                            let isum = _mm512_add_epi32(isum[t], isum_odd[t]);
                            let sc = _mm512_mul_ps(dv, _mm512_set1_ps(*x.d.get_unchecked(t * nb + blk)));
                            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, acc[t]);
                        }
                    }
                    acc
                }
            }

            /// A pair of groups' per-row values of a block (scales or offsets): eight of the first
            /// group's at `8 * blk` from the pointer, eight of the second's `8 * nb` further.
            trait PairValues: Copy {
                /// Bytes per value.
                const SIZE: usize;

                /// Block `blk`'s sixteen values, the first group's in lanes 0..8, as `f32`.
                ///
                /// # Safety
                /// The features; both groups' values of block `blk` readable.
                unsafe fn load(self, blk: usize, nb: usize) -> __m512;

                /// Where the first group's values start.
                fn base(self) -> *const u8;

                /// Where block `blk`'s values of the first and second group start.
                fn at(self, blk: usize, nb: usize) -> [*const u8; 2] {
                    let b = self.base();
                    [
                        b.wrapping_add(8 * blk * Self::SIZE),
                        b.wrapping_add(8 * (nb + blk) * Self::SIZE),
                    ]
                }
            }

            /// `f32` values.
            #[derive(Clone, Copy)]
            struct F32Pair(*const f32);

            impl PairValues for F32Pair {
                const SIZE: usize = 4;

                #[inline]
                #[target_feature(enable = $features)]
                unsafe fn load(self, blk: usize, nb: usize) -> __m512 {
                    // SAFETY: the caller's contract bounds both reads.
                    unsafe {
                        join(
                            _mm256_loadu_ps(self.0.add(8 * blk)),
                            _mm256_loadu_ps(self.0.add(8 * (nb + blk))),
                        )
                    }
                }

                fn base(self) -> *const u8 {
                    self.0.cast()
                }
            }

            /// Half-float values (converted exactly).
            #[derive(Clone, Copy)]
            struct F16Pair(*const u16);

            impl PairValues for F16Pair {
                const SIZE: usize = 2;

                #[inline]
                #[target_feature(enable = $features)]
                unsafe fn load(self, blk: usize, nb: usize) -> __m512 {
                    // SAFETY: the caller's contract bounds both reads.
                    unsafe {
                        let lo = _mm_loadu_si128(self.0.add(8 * blk) as *const __m128i);
                        let hi = _mm_loadu_si128(self.0.add(8 * (nb + blk)) as *const __m128i);
                        _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi))
                    }
                }

                fn base(self) -> *const u8 {
                    self.0.cast()
                }
            }

            /// A pair's offsets: stored, or each the scale times a constant (Q4_0's -8).
            #[derive(Clone, Copy)]
            enum Offsets<V> {
                Own(V),
                Times(f32),
            }

            /// Asks for the lines holding block `blk`'s values of both groups, every `64 / (8 *
            /// V::SIZE)` blocks: a line holds that many blocks' values of a group, so a stride of 64
            /// bytes asks for each line once, however the values are aligned, without testing each
            /// block's address (which cost the 16-row kernel about 4% at four tokens with the
            /// weights in cache).
            #[inline]
            fn prefetch_values<V: PairValues>(v: V, blk: usize, nb: usize, ahead: usize) {
                if blk.is_multiple_of(64 / (8 * V::SIZE)) {
                    for p in v.at(blk, nb) {
                        crate::prefetch_lines(p, ahead, 1);
                    }
                }
            }

            /// [`pair_u4x16`] for either layout of nibbles: `paired` where the pair's chunks lie side
            /// by side.
            ///
            /// # Safety
            /// As [`pair_u4x16`].
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn pair_u4x16_of<const NT: usize, V: PairValues>(
                paired: bool,
                q: *const u8,
                d: V,
                m: Offsets<V>,
                x: &Acts<'_>,
            ) -> [__m512; NT] {
                // SAFETY: the caller's contract is `pair_u4x16`'s.
                unsafe {
                    if paired {
                        pair_u4x16::<NT, V, true>(q, d, m, x)
                    } else {
                        pair_u4x16::<NT, V, false>(q, d, m, x)
                    }
                }
            }

            /// One pair: `U4x8` (or `U4x8Half`) twice. Per block, each chunk of the two groups'
            /// nibbles in one register (low half the first group's, from `q`, `d`, `m`; high half the
            /// next group's, `nb` blocks further): one 64-byte load where the pair's chunks lie side by
            /// side (`TOGETHER`, `pairs` of `Packed::U4x8`), two loads and an insert where they do not.
            /// Both nibbles' products with the token's bytes go straight into 32-bit sums, then the
            /// scales and offsets as the 8-row kernel applies them (half floats converted exactly, so
            /// the same values). The high nibbles are one GFNI affine transform (each byte's bits
            /// 4..8 moved to 0..4, the rest zero) where the module has GFNI, a shift and a mask where
            /// it does not: the same bytes.
            ///
            /// # Safety
            /// The features; `q`, `d`, `m` readable for two groups of `x.nb` blocks; `x` holding `NT`
            /// tokens.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn pair_u4x16<const NT: usize, V: PairValues, const TOGETHER: bool>(
                q: *const u8,
                d: V,
                m: Offsets<V>,
                x: &Acts<'_>,
            ) -> [__m512; NT] {
                let nb = x.nb;
                // SAFETY: the caller's contract bounds every read: block `blk < nb` of either group.
                unsafe {
                    let qb = q.add(128 * nb);
                    let m4 = _mm512_set1_epi8(0x0f);
                    // Row `7 - i` of the bit matrix picks input bit `i + 4` for output bit `i < 4`.
                    let high = _mm512_set1_epi64(0x1020_4080_0000_0000);
                    let mut acc = [_mm512_setzero_ps(); NT];
                    for blk in 0..nb {
                        if x.ahead > 0 {
                            if TOGETHER {
                                crate::prefetch_lines(q.add(256 * blk), x.ahead, 4);
                            } else {
                                crate::prefetch_lines(q.add(128 * blk), x.ahead, 2);
                                crate::prefetch_lines(qb.add(128 * blk), x.ahead, 2);
                            }
                            // The scales and offsets, a quarter or an eighth of the quants' bytes, as
                            // far ahead.
                            let ahead = x.ahead * V::SIZE / 16;
                            prefetch_values(d, blk, nb, ahead);
                            if let Offsets::Own(m) = m {
                                prefetch_values(m, blk, nb, ahead);
                            }
                        }
                        // Two chains of sums per token (low and high nibbles), added at the end:
                        // integer sums, so the same value, with half the wait on each `vpdpbusd`.
                        let mut isum = [_mm512_setzero_si512(); NT];
                        let mut isum_hi = [_mm512_setzero_si512(); NT];
                        for c in 0..4 {
                            let raw = if TOGETHER {
                                _mm512_loadu_si512(q.add(256 * blk + 64 * c) as *const __m512i)
                            } else {
                                let ra = _mm256_loadu_si256(q.add(128 * blk + 32 * c) as *const __m256i);
                                let rb = _mm256_loadu_si256(qb.add(128 * blk + 32 * c) as *const __m256i);
                                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ra), rb)
                            };
                            let lo = _mm512_and_si512(raw, m4);
                            let hi = if GFNI {
                                _mm512_gf2p8affine_epi64_epi8::<0>(raw, high)
                            } else {
                                _mm512_and_si512(_mm512_srli_epi16::<4>(raw), m4)
                            };
                            for t in 0..NT {
                                let y = x.q.as_ptr().add((t * nb + blk) * QK);
                                let ylo = _mm512_set1_epi32((y.add(4 * c) as *const i32).read_unaligned());
                                let yhi =
                                    _mm512_set1_epi32((y.add(16 + 4 * c) as *const i32).read_unaligned());
                                isum[t] = _mm512_dpbusd_epi32(isum[t], lo, ylo);
                                isum_hi[t] = _mm512_dpbusd_epi32(isum_hi[t], hi, yhi);
                            }
                        }
                        // The 8-row kernel's `scale_block`, sixteen lanes wide.
                        let dv = d.load(blk, nb);
                        let mv = match m {
                            Offsets::Own(m) => m.load(blk, nb),
                            Offsets::Times(by) => _mm512_mul_ps(dv, _mm512_set1_ps(by)),
                        };
                        for t in 0..NT {
                            let isum = _mm512_add_epi32(isum[t], isum_hi[t]);
                            let sc = _mm512_mul_ps(dv, _mm512_set1_ps(*x.d.get_unchecked(t * nb + blk)));
                            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, acc[t]);
                            acc[t] = _mm512_fmadd_ps(
                                mv,
                                _mm512_set1_ps(*x.s.get_unchecked(t * nb + blk)),
                                acc[t],
                            );
                        }
                    }
                    acc
                }
            }

            /// `lo` in lanes 0..8, `hi` in lanes 8..16.
            #[target_feature(enable = $features)]
            #[inline]
            fn join(lo: __m256, hi: __m256) -> __m512 {
                _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                    _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
                    _mm256_castps_pd(hi),
                ))
            }
        }
    };
}

x16_kernels!(
    x16_avx512,
    "avx2,fma,f16c,avx512f,avx512vnni,avx512vl,avx512bw",
    false
);
x16_kernels!(
    x16_avx512_gfni,
    "avx2,fma,f16c,avx512f,avx512vnni,avx512vl,avx512bw,gfni",
    true
);

/// The [`crate::wide`] kernels: 12-bit weights times 16-bit activations, eight rows of a group
/// per 256-bit register, with `vpdpwssd` (AVX-512 VNNI) or `vpmaddwd` (AVX2).
macro_rules! wide_kernels {
    ($name:ident, $features:literal, $vnni:expr) => {
        pub(crate) mod $name {
            use crate::wide::WideTile;
            use crate::QK;
            use std::arch::x86_64::*;

            /// Group `(d, q)` (eight rows) times the tile's rows (1 to 4), into `out[8 * t +
            /// lane]`: the same sums and multiply-adds as `wide::dot_group_scalar`.
            ///
            /// # Safety
            /// The CPU must support `$features`.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn dot_group(d: &[f32], q: &[i16], x: &WideTile<'_>, out: &mut [f32]) {
                // SAFETY: the caller guarantees `$features`; `tile` checks the bounds it reads.
                unsafe { by_tokens!(out.len() / 8, NT => tile::<NT>(d, q, x, out)) }
            }

            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn tile<const NT: usize>(d: &[f32], q: &[i16], x: &WideTile<'_>, out: &mut [f32]) {
                let nb = x.nb;
                // Every pointer access below is within these bounds.
                assert!(d.len() == 8 * nb && q.len() == 256 * nb && out.len() >= 8 * NT);
                assert!(x.q.len() >= NT * nb * QK && x.d.len() >= NT * nb);
                // SAFETY: the caller guarantees `$features`; the asserts above bound every read.
                unsafe {
                    let mut acc = [_mm256_setzero_ps(); NT];
                    let (wq, xq) = (q.as_ptr(), x.q.as_ptr());
                    for b in 0..nb {
                        // Two sums per token (even and odd chunks), so that eight chains of
                        // multiply-adds run at once instead of four; integer sums are exact
                        // in any order.
                        let mut isum = [[_mm256_setzero_si256(); NT]; 2];
                        for c in 0..16 {
                            // SAFETY (reads): 256 quants per block; unaligned loads accept any
                            // address; two activation quants per chunk and token.
                            let wv = _mm256_loadu_si256(wq.add(256 * b + 16 * c) as *const __m256i);
                            let s = &mut isum[c % 2];
                            for t in 0..NT {
                                let y = (xq.add((t * nb + b) * QK + 2 * c) as *const i32).read_unaligned();
                                let yv = _mm256_set1_epi32(y);
                                s[t] = if $vnni {
                                    _mm256_dpwssd_epi32(s[t], wv, yv)
                                } else {
                                    _mm256_add_epi32(s[t], _mm256_madd_epi16(wv, yv))
                                };
                            }
                        }
                        let [even, odd] = isum;
                        let mut isum = even;
                        for t in 0..NT {
                            isum[t] = _mm256_add_epi32(isum[t], odd[t]);
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
            }
        }
    };
}

wide_kernels!(wide_avx2, "avx2,fma", false);
wide_kernels!(wide_avx512_vnni, "avx2,fma,avx512vnni,avx512vl", true);

/// The encoder's attention blocks ([`crate::encoder`]) with AVX2 and FMA: the same fused
/// multiply-adds in the same order as the scalar versions there.
pub(crate) mod attn_avx2 {
    use std::arch::x86_64::*;

    /// Scores of four query rows (`qs`, four rows of `hd`) against keys `j0..j0 + 16` of the
    /// transposed keys `kt` (`hd` rows of `padded`): `out[r][l] = sum_d qs[r][d] * kt[d][j0 +
    /// l]`, summed in `d` order with fused multiply-adds.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn scores(
        qs: &[f32],
        kt: &[f32],
        padded: usize,
        j0: usize,
        hd: usize,
    ) -> [[f32; 16]; 4] {
        assert!(qs.len() >= 4 * hd && j0 + 16 <= padded && kt.len() >= hd * padded);
        let mut out = [[0f32; 16]; 4];
        // SAFETY: AVX2 and FMA are present (the caller's contract); the assert above bounds
        // every read: `d < hd`, `j0 + 16 <= padded`, `r * hd + d < 4 * hd`.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; 4];
            for d in 0..hd {
                let k = kt.as_ptr().add(d * padded + j0);
                let (k0, k1) = (_mm256_loadu_ps(k), _mm256_loadu_ps(k.add(8)));
                for r in 0..4 {
                    let q = _mm256_set1_ps(*qs.get_unchecked(r * hd + d));
                    acc[r][0] = _mm256_fmadd_ps(q, k0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(q, k1, acc[r][1]);
                }
            }
            for r in 0..4 {
                _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r][0]);
                _mm256_storeu_ps(out[r].as_mut_ptr().add(8), acc[r][1]);
            }
        }
        out
    }

    /// Four query rows' weighted sums of the values `v` (rows of `vw`), dimensions `d0..d0 +
    /// 16`, over keys `0..n` in order: `out[r][l] = sum_j probs[j][r] * v[j][d0 + l]` (`probs`
    /// holds four probabilities per key), with fused multiply-adds.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn weighted_values(
        probs: &[f32],
        v: &[f32],
        vw: usize,
        d0: usize,
        n: usize,
    ) -> [[f32; 16]; 4] {
        assert!(probs.len() >= 4 * n && d0 + 16 <= vw && v.len() >= n * vw);
        let mut out = [[0f32; 16]; 4];
        // SAFETY: AVX2 and FMA are present (the caller's contract); the assert above bounds
        // every read: `j < n`, `d0 + 16 <= vw`, `4 * j + r < 4 * n`.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; 4];
            for j in 0..n {
                let vr = v.as_ptr().add(j * vw + d0);
                let (v0, v1) = (_mm256_loadu_ps(vr), _mm256_loadu_ps(vr.add(8)));
                for r in 0..4 {
                    let p = _mm256_set1_ps(*probs.get_unchecked(4 * j + r));
                    acc[r][0] = _mm256_fmadd_ps(p, v0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(p, v1, acc[r][1]);
                }
            }
            for r in 0..4 {
                _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r][0]);
                _mm256_storeu_ps(out[r].as_mut_ptr().add(8), acc[r][1]);
            }
        }
        out
    }
}

/// The decoder's attention blocks over its f16 KV cache ([`crate::attention`]): keys are
/// stored transposed by blocks of [`crate::attention::KEY_BLOCK`] positions, values one row
/// per position; both are widened to `f32` with F16C and summed with fused multiply-adds.
pub(crate) mod attn_f16 {
    use std::arch::x86_64::*;

    /// Sixteen f16 values at `p`, widened to two vectors of eight `f32`.
    ///
    /// # Safety
    /// F16C and AVX must be present and `p..p + 16` readable.
    #[inline(always)]
    unsafe fn load16(p: *const u16) -> (__m256, __m256) {
        // SAFETY: the caller's contract.
        unsafe {
            let raw = _mm256_loadu_si256(p.cast());
            (
                _mm256_cvtph_ps(_mm256_castsi256_si128(raw)),
                _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(raw)),
            )
        }
    }

    /// `crate::attention::to_f16` of the first multiple of eight elements of `src` into
    /// `dst` (clamped to the finite half-float range, NaN kept, rounded to nearest even);
    /// returns how many.
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn to_f16(src: &[f32], dst: &mut [u16]) -> usize {
        let n = src.len().min(dst.len()) / 8 * 8;
        let max = crate::attention::F16_MAX;
        let (lo, hi) = (_mm256_set1_ps(-max), _mm256_set1_ps(max));
        for i in (0..n).step_by(8) {
            // SAFETY: `i + 8 <= n` elements of both; unaligned loads and stores.
            unsafe {
                // `maxps`/`minps` return their second operand for NaN: NaN stays NaN.
                let x = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_loadu_ps(src.as_ptr().add(i))));
                let h = _mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(x);
                _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), h);
            }
        }
        n
    }

    /// Scores of four query rows (`qs`, four rows of `hd`) against one block of sixteen keys
    /// (`kt`: `hd` rows of sixteen f16 lanes): `out[r][l] = sum_d qs[r][d] * kt[d][l]`,
    /// summed in `d` order with fused multiply-adds.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn scores(qs: &[f32], kt: &[u16], hd: usize) -> [[f32; 16]; 4] {
        assert!(qs.len() >= 4 * hd && kt.len() >= 16 * hd);
        let mut out = [[0f32; 16]; 4];
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract); the assert above
        // bounds every read: `d < hd`, so `16 * d + 16 <= kt.len()` and `r * hd + d < 4 * hd`.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; 4];
            for d in 0..hd {
                let (k0, k1) = load16(kt.as_ptr().add(16 * d));
                for r in 0..4 {
                    let q = _mm256_set1_ps(*qs.get_unchecked(r * hd + d));
                    acc[r][0] = _mm256_fmadd_ps(q, k0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(q, k1, acc[r][1]);
                }
            }
            for r in 0..4 {
                _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r][0]);
                _mm256_storeu_ps(out[r].as_mut_ptr().add(8), acc[r][1]);
            }
        }
        out
    }

    /// Adds to four query rows' outputs (`acc`, four rows of `hd`) the values of the keys
    /// `lanes` of one block weighted by their probabilities: `acc[r][d] += probs[r][l] *
    /// v[l][d]` for `l` in order, with fused multiply-adds; value row `l` starts at `l *
    /// stride` in `v`. `hd` is a multiple of 16.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn add_weighted_values(
        probs: &[[f32; 16]; 4],
        lanes: std::ops::Range<usize>,
        v: &[u16],
        stride: usize,
        hd: usize,
        acc: &mut [f32],
    ) {
        assert!(hd.is_multiple_of(16) && acc.len() >= 4 * hd && lanes.end <= 16);
        if lanes.is_empty() {
            return;
        }
        assert!((lanes.end - 1) * stride + hd <= v.len());
        // SAFETY: AVX2, FMA and F16C are present (the caller's contract); the asserts above
        // bound every access: value rows `l < lanes.end` end within `v`, `d0 + 16 <= hd`, and
        // `r * hd + d0 + 16 <= 4 * hd <= acc.len()`.
        unsafe {
            for d0 in (0..hd).step_by(16) {
                let mut a = [[_mm256_setzero_ps(); 2]; 4];
                for r in 0..4 {
                    let p = acc.as_ptr().add(r * hd + d0);
                    a[r] = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))];
                }
                for l in lanes.clone() {
                    let (v0, v1) = load16(v.as_ptr().add(l * stride + d0));
                    for r in 0..4 {
                        let p = _mm256_set1_ps(*probs.get_unchecked(r).get_unchecked(l));
                        a[r][0] = _mm256_fmadd_ps(p, v0, a[r][0]);
                        a[r][1] = _mm256_fmadd_ps(p, v1, a[r][1]);
                    }
                }
                for r in 0..4 {
                    let p = acc.as_mut_ptr().add(r * hd + d0);
                    _mm256_storeu_ps(p, a[r][0]);
                    _mm256_storeu_ps(p.add(8), a[r][1]);
                }
            }
        }
    }
}

/// `op` over sixteen lanes as a fixed tree: lane `i` with lane `i + 8`, then `i + 4`, `i + 2`,
/// `i + 1` (the order of `attention::lane_tree`); lane 0 of the result.
#[target_feature(enable = "avx2,avx512f")]
#[inline]
fn tree16(x: __m512, op: impl Fn(__m256, __m256) -> __m256) -> f32 {
    let h = op(
        _mm512_castps512_ps256(x),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x))),
    );
    let h = op(h, _mm256_permute2f128_ps::<0x01>(h, h));
    let h = op(h, _mm256_permute_ps::<0b01_00_11_10>(h));
    let h = op(h, _mm256_permute_ps::<0b10_11_00_01>(h));
    _mm256_cvtss_f32(h)
}

/// The attention blocks of [`attn_f16`] sixteen lanes to a register, with AVX-512: each lane
/// performs the same operations in the same order as there (and as the scalar blocks), so the
/// results are the same bits. Two key blocks' scores are summed at once (eight chains of
/// multiply-adds, as the 256-bit version has for one); a block's online-softmax steps, a row
/// per register and the four rows side by side, go with its weighted values in one call
/// (heads of 32 dimensions or more; narrower ones use the 256-bit values and the portable
/// softmax step).
pub(crate) mod attn_f16_512 {
    // Index loops address the tile's rows in several arrays at once.
    #![allow(clippy::needless_range_loop)]

    use crate::attention::KEY_BLOCK;
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// Sixteen f16 values at `p`, widened to `f32`.
    ///
    /// # Safety
    /// AVX-512F and `p..p + 16` readable.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
    #[inline]
    unsafe fn load16(p: *const u16) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }

    /// [`super::attn_f16::scores`] of two key blocks at once (`kt_a`, `kt_b`).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, VL and BW, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
    pub(crate) unsafe fn scores_pair(
        qs: &[f32],
        kt_a: &[u16],
        kt_b: &[u16],
        hd: usize,
    ) -> [[[f32; KEY_BLOCK]; 4]; 2] {
        assert!(qs.len() >= 4 * hd && kt_a.len() >= 16 * hd && kt_b.len() >= 16 * hd);
        let mut out = [[[0f32; KEY_BLOCK]; 4]; 2];
        // SAFETY: the features are present (the caller's contract); the assert above bounds
        // every read: `d < hd`, so `16 * d + 16 <= kt.len()` and `r * hd + d < 4 * hd`.
        unsafe {
            let (mut a, mut b) = ([_mm512_setzero_ps(); 4], [_mm512_setzero_ps(); 4]);
            for d in 0..hd {
                let ka = load16(kt_a.as_ptr().add(16 * d));
                let kb = load16(kt_b.as_ptr().add(16 * d));
                for r in 0..4 {
                    let q = _mm512_set1_ps(*qs.get_unchecked(r * hd + d));
                    a[r] = _mm512_fmadd_ps(q, ka, a[r]);
                    b[r] = _mm512_fmadd_ps(q, kb, b[r]);
                }
            }
            for r in 0..4 {
                _mm512_storeu_ps(out[0][r].as_mut_ptr(), a[r]);
                _mm512_storeu_ps(out[1][r].as_mut_ptr(), b[r]);
            }
        }
        out
    }

    /// `crate::ops::exp_approx` on sixteen lanes: the same operations (no fused ones).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
    #[inline]
    fn exp16(x: __m512) -> __m512 {
        const SHIFT: f32 = 12_582_912.0;
        const LN2_HI: f32 = 0.693_359_4;
        const LN2_LO: f32 = -2.121_944_4e-4;
        let c = _mm512_set1_ps;
        // `clamp`: NaN stays NaN (`max`/`min` return their second operand for NaN).
        let x = _mm512_min_ps(c(88.0), _mm512_max_ps(c(-87.0), x));
        let shifted = _mm512_add_ps(_mm512_mul_ps(x, c(std::f32::consts::LOG2_E)), c(SHIFT));
        let n = _mm512_sub_ps(shifted, c(SHIFT));
        let r = _mm512_sub_ps(
            _mm512_sub_ps(x, _mm512_mul_ps(n, c(LN2_HI))),
            _mm512_mul_ps(n, c(LN2_LO)),
        );
        let step = |k: f32, inner: __m512| _mm512_add_ps(c(k), _mm512_mul_ps(r, inner));
        // From the innermost: `1/120 + r * (1/720)`.
        let p = step(1.0 / 120.0, c(1.0 / 720.0));
        let p = step(1.0 / 24.0, p);
        let p = step(1.0 / 6.0, p);
        let p = step(0.5, p);
        let p = step(1.0, p);
        let p = step(1.0, p);
        let two_n = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_sub_epi32(
                _mm512_castps_si512(shifted),
                _mm512_set1_epi32(SHIFT.to_bits() as i32),
            ),
            _mm512_set1_epi32(127),
        ));
        _mm512_mul_ps(p, _mm512_castsi512_ps(two_n))
    }

    /// `f32::max` on each lane: a NaN in either gives the other.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
    #[inline]
    fn max_num(a: __m256, b: __m256) -> __m256 {
        // `maxps` gives its second operand when either is NaN; a NaN second operand is then
        // replaced by the first.
        let m = _mm256_max_ps(a, b);
        _mm256_mask_mov_ps(m, _mm256_cmp_ps_mask::<_CMP_UNORD_Q>(b, b), a)
    }

    /// The largest of sixteen lanes as `attention::lane_tree` takes it.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
    #[inline]
    fn tree_max(x: __m512) -> f32 {
        super::tree16(x, |a, b| max_num(a, b))
    }

    /// The sum of sixteen lanes as `attention::lane_tree` takes it.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
    #[inline]
    fn tree_sum(x: __m512) -> f32 {
        super::tree16(x, |a, b| _mm256_add_ps(a, b))
    }

    /// One key block for a tile of four rows: each row's `attention::softmax_step` (its
    /// scores `p[r]` become probabilities, zero outside `valid[r]`), then
    /// `attention::add_values_block` over `lanes`, with each row's rescaling of its outputs
    /// applied as they are loaded. The same operations on each value as there (a rescale by
    /// 1 leaves a value as it is), so the same bits; the four rows' steps are independent
    /// chains, interleaved.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, VL and BW, FMA and F16C.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
    pub(crate) unsafe fn softmax_values<const W: usize>(
        p: &mut [[f32; KEY_BLOCK]; 4],
        valid: &[Range<usize>; 4],
        m: &mut [f32; 4],
        l: &mut [f32; 4],
        lanes: Range<usize>,
        v: &[u16],
        stride: usize,
        hd: usize,
        acc: &mut [f32],
    ) {
        assert!(hd.is_multiple_of(16 * W) && acc.len() >= 4 * hd && lanes.end <= KEY_BLOCK);
        assert!(lanes.is_empty() || (lanes.end - 1) * stride + hd <= v.len());
        // The four rows' steps side by side: their maxima, then the rescaling factors in one
        // register (lanes 0..4), then their probabilities and normalizers.
        let mut live = [false; 4];
        let mut masks = [0 as __mmask16; 4];
        let mut x = [_mm512_setzero_ps(); 4];
        let mut m_new = [0f32; 16];
        for r in 0..4 {
            let valid = valid[r].clone();
            live[r] = !valid.is_empty() && valid.end <= KEY_BLOCK;
            if !live[r] {
                continue;
            }
            masks[r] = (((1u32 << valid.end) - 1) & !((1u32 << valid.start) - 1)) as __mmask16;
            // SAFETY: `p[r]` holds sixteen floats; the features are the caller's contract.
            x[r] = unsafe {
                _mm512_mask_mov_ps(
                    _mm512_set1_ps(f32::NEG_INFINITY),
                    masks[r],
                    _mm512_loadu_ps(p[r].as_ptr()),
                )
            };
            m_new[r] = m[r].max(tree_max(x[r]));
        }
        let mut f = [1f32; 16];
        // SAFETY: `m_new` and `f` hold sixteen floats, `m` four (a masked load of lanes 0..4).
        unsafe {
            let (mo, mn) = (
                _mm512_maskz_loadu_ps(0x000f, m.as_ptr()),
                _mm512_loadu_ps(m_new.as_ptr()),
            );
            // `exp_approx(m - m_new)`, or 0 where no key was seen yet (`m` is -inf).
            let seen = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(mo, _mm512_set1_ps(f32::NEG_INFINITY));
            _mm512_storeu_ps(
                f.as_mut_ptr(),
                _mm512_maskz_mov_ps(seen, exp16(_mm512_sub_ps(mo, mn))),
            );
        }
        for r in 0..4 {
            if !live[r] {
                p[r] = [0.0; KEY_BLOCK];
                f[r] = 1.0;
                continue;
            }
            let e = _mm512_maskz_mov_ps(
                masks[r],
                exp16(_mm512_sub_ps(x[r], _mm512_set1_ps(m_new[r]))),
            );
            // SAFETY: `p[r]` holds sixteen floats.
            unsafe { _mm512_storeu_ps(p[r].as_mut_ptr(), e) };
            l[r] = l[r] * f[r] + tree_sum(e);
            m[r] = m_new[r];
        }
        // SAFETY: the features are present (the caller's contract); the asserts above bound
        // every access: value rows `l < lanes.end` end within `v`, `d0 + 16 * W <= hd`, and
        // `r * hd + d0 + 16 * W <= 4 * hd <= acc.len()`.
        unsafe {
            for d0 in (0..hd).step_by(16 * W) {
                let mut a = [[_mm512_setzero_ps(); W]; 4];
                for r in 0..4 {
                    let fr = _mm512_set1_ps(f[r]);
                    for w in 0..W {
                        let at = acc.as_ptr().add(r * hd + d0 + 16 * w);
                        a[r][w] = _mm512_mul_ps(_mm512_loadu_ps(at), fr);
                    }
                }
                for l in lanes.clone() {
                    let mut vv = [_mm512_setzero_ps(); W];
                    for w in 0..W {
                        vv[w] = load16(v.as_ptr().add(l * stride + d0 + 16 * w));
                    }
                    for r in 0..4 {
                        let pr = _mm512_set1_ps(*p.get_unchecked(r).get_unchecked(l));
                        for w in 0..W {
                            a[r][w] = _mm512_fmadd_ps(pr, vv[w], a[r][w]);
                        }
                    }
                }
                for r in 0..4 {
                    for w in 0..W {
                        _mm512_storeu_ps(acc.as_mut_ptr().add(r * hd + d0 + 16 * w), a[r][w]);
                    }
                }
            }
        }
    }
}

/// Activation quantization ([`crate::QAct`]) with AVX2: the scalar `quantize_blocks`'s
/// arithmetic eight lanes at a time, with the same result bit for bit (the largest magnitude,
/// the scale and its inverse as there; `cvtps2dq` rounds to nearest even, as the scalar
/// version's shift trick does, for the values within +-127 that both see; NaN products are 0
/// in both).
pub(crate) mod quant {
    use crate::QK;
    use std::arch::x86_64::*;

    /// Quantizes the blocks of `x` into `out`.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn quantize_blocks(x: &[f32], out: crate::QBlocksMut<'_>) {
        let blocks = x.len() / QK;
        assert!(out.holds(blocks));
        let crate::QBlocksMut { q, d, s, sums } = out;
        // SAFETY: AVX2 and FMA are present (the caller's contract); the assert above bounds
        // every read and write: block `b < blocks` reads `x[32b..32b + 32]` and writes
        // `q[32b..32b + 32]`, `d[b]`, `s[b]`, `sums[b]`.
        unsafe {
            let sign = _mm256_set1_ps(-0.0);
            // `packs` interleaves 128-bit lanes; this puts the 32-bit groups back in order.
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            for b in 0..blocks {
                let p = x.as_ptr().add(QK * b);
                let v = [
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                ];
                // `max(|v|, m)` keeps `m` where `|v|` is NaN, as `f32::max` does.
                let mut m = _mm256_setzero_ps();
                for vi in v {
                    m = _mm256_max_ps(_mm256_andnot_ps(sign, vi), m);
                }
                let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
                let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
                let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
                let scale = amax / 127.0;
                let idv = _mm256_set1_ps(crate::quant_inverse(scale));
                // NaN products (NaN or infinite inputs) become 0, as in the scalar version.
                let qi = v.map(|vi| {
                    let p = _mm256_mul_ps(vi, idv);
                    _mm256_cvtps_epi32(_mm256_and_ps(p, _mm256_cmp_ps::<_CMP_ORD_Q>(p, p)))
                });
                let sum = _mm256_add_epi32(
                    _mm256_add_epi32(qi[0], qi[1]),
                    _mm256_add_epi32(qi[2], qi[3]),
                );
                let s4 = _mm_add_epi32(
                    _mm256_castsi256_si128(sum),
                    _mm256_extracti128_si256::<1>(sum),
                );
                let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
                let total = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2)));
                let w16 = _mm256_packs_epi16(
                    _mm256_packs_epi32(qi[0], qi[1]),
                    _mm256_packs_epi32(qi[2], qi[3]),
                );
                let bytes = _mm256_permutevar8x32_epi32(w16, order);
                _mm256_storeu_si256(q.as_mut_ptr().add(QK * b).cast(), bytes);
                *d.get_unchecked_mut(b) = scale;
                *s.get_unchecked_mut(b) = scale * total as f32;
                *sums.get_unchecked_mut(b) = total;
            }
        }
    }
}

/// Activation quantization with AVX-512: [`quant`]'s bits, sixteen blocks at a time. A first
/// pass takes each block's largest magnitude, the scales and their inverses are computed
/// for the sixteen blocks in one register (the same divisions, each correctly rounded), and a
/// second pass quantizes each block from L1 with one register per sixteen values.
pub(crate) mod quant512 {
    use crate::QK;
    use std::arch::x86_64::*;

    /// Blocks per pass.
    const CHUNK: usize = 16;

    /// The largest of sixteen lanes (none NaN).
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw")]
    #[inline]
    fn lanes_max(m: __m512) -> f32 {
        super::tree16(m, |a, b| _mm256_max_ps(a, b))
    }

    /// Quantizes the blocks of `x` into `out`: the bits of [`super::quant::quantize_blocks`].
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, VL and BW, AVX2 and FMA.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw")]
    pub(crate) unsafe fn quantize_blocks(x: &[f32], out: crate::QBlocksMut<'_>) {
        let blocks = x.len() / QK;
        assert!(out.holds(blocks));
        let crate::QBlocksMut { q, d, s, sums } = out;
        // SAFETY: the features are present (the caller's contract); the assert above bounds
        // every read and write: block `b < blocks` reads `x[32b..32b + 32]` and writes
        // `q[32b..32b + 32]`, `d[b]`, `s[b]`, `sums[b]`; the per-chunk arrays hold `CHUNK`.
        unsafe {
            let sign = _mm512_set1_ps(-0.0);
            let inf = _mm512_set1_ps(f32::INFINITY);
            for b0 in (0..blocks).step_by(CHUNK) {
                let n = CHUNK.min(blocks - b0);
                let lanes: __mmask16 = ((1u32 << n) - 1) as __mmask16;
                let mut amax = [0f32; CHUNK];
                for i in 0..n {
                    let p = x.as_ptr().add(QK * (b0 + i));
                    // `max(|v|, m)` keeps `m` where `|v|` is NaN, as `f32::max` does.
                    let m = _mm512_max_ps(
                        _mm512_andnot_ps(sign, _mm512_loadu_ps(p)),
                        _mm512_setzero_ps(),
                    );
                    let m = _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(p.add(16))), m);
                    amax[i] = lanes_max(m);
                }
                // `scale = amax / 127` and `crate::quant_inverse(scale)`, sixteen at once.
                let scale = _mm512_div_ps(_mm512_loadu_ps(amax.as_ptr()), _mm512_set1_ps(127.0));
                let id = _mm512_div_ps(_mm512_set1_ps(1.0), scale);
                let keep = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(scale, _mm512_setzero_ps())
                    & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_andnot_ps(sign, id), inf);
                let mut ids = [0f32; CHUNK];
                _mm512_storeu_ps(ids.as_mut_ptr(), _mm512_maskz_mov_ps(keep, id));
                let mut totals = [0i32; CHUNK];
                for i in 0..n {
                    let p = x.as_ptr().add(QK * (b0 + i));
                    let idv = _mm512_set1_ps(ids[i]);
                    // NaN products (NaN or infinite inputs) become 0, as in the scalar version.
                    let quant = |v: __m512| {
                        let prod = _mm512_mul_ps(v, idv);
                        _mm512_maskz_cvtps_epi32(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(prod, prod), prod)
                    };
                    let (q0, q1) = (quant(_mm512_loadu_ps(p)), quant(_mm512_loadu_ps(p.add(16))));
                    totals[i] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
                    let dst = q.as_mut_ptr().add(QK * (b0 + i));
                    _mm_storeu_si128(dst.cast(), _mm512_cvtsepi32_epi8(q0));
                    _mm_storeu_si128(dst.add(16).cast(), _mm512_cvtsepi32_epi8(q1));
                }
                let tv = _mm512_loadu_si512(totals.as_ptr().cast());
                _mm512_mask_storeu_ps(d.as_mut_ptr().add(b0), lanes, scale);
                _mm512_mask_storeu_ps(
                    s.as_mut_ptr().add(b0),
                    lanes,
                    _mm512_mul_ps(scale, _mm512_cvtepi32_ps(tv)),
                );
                _mm512_mask_storeu_epi32(sums.as_mut_ptr().add(b0).cast(), lanes, tv);
            }
        }
    }
}
