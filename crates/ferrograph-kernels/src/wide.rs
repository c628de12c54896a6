//! Matrix products at a higher precision than the 8-bit kernels, for models shipped in
//! floating point whose outputs must stay close to their `f32` reference (sentence encoders:
//! cosine ≥ 0.9999; with 8-bit weights and activations MiniLM's vectors fall to 0.9996 on
//! average and 0.998 at worst).
//!
//! Weights are quantized at load to 12 bits (±[`W_MAX`]) and activations per row to 16 bits
//! (±[`A_MAX`]), both per block of [`QK`] with an `f32` scale. A block's dot product is a sum
//! of exact 16-bit products in 32-bit integers: at most `32 * 32767 * 2047`, below 2^31, so it
//! cannot overflow. Each block sum then adds `sum * (weight scale * activation scale)` to an
//! `f32` accumulator with one fused multiply-add.
//!
//! Weights are stored interleaved by groups of eight rows ([`WideMatrix`]): per block, sixteen
//! chunks of eight rows times two elements, so one 256-bit register holds two weights of each
//! of eight rows and `vpdpwssd` (AVX-512 VNNI) or `vpmaddwd` (AVX2) multiplies them by two
//! broadcast activations. The scalar kernel is the reference: it does the same integer sums
//! and the same multiply-adds in the same order, so every instruction set gives the same bits.

use crate::{pool, Isa, KernelError, OutPtr, QK};

/// Largest weight quant.
pub const W_MAX: f32 = 2047.0;
/// Largest activation quant.
pub const A_MAX: f32 = 32767.0;

/// A weight matrix of `rows` (a multiple of 8) by `cols` (a multiple of [`QK`]) quantized to
/// 12 bits per block, interleaved by groups of eight rows.
#[derive(Clone, Debug)]
pub struct WideMatrix {
    rows: usize,
    cols: usize,
    /// Scales: for group `g`, block `b` (`gb = g * blocks + b`), row `8g + lane`'s is
    /// `d[8 * gb + lane]`.
    d: Vec<f32>,
    /// Quants: element `2c + j` of that row's block is `q[256 * gb + 16 * c + 2 * lane + j]`.
    q: Vec<i16>,
}

/// Rounds to nearest even without a float-to-int conversion (vectorizes): `|v| < 2^22`.
#[inline(always)]
fn round_i32(v: f32) -> i32 {
    const SHIFT: f32 = 12_582_912.0;
    (v + SHIFT).to_bits().wrapping_sub(SHIFT.to_bits()) as i32
}

/// The scale of a block whose largest quant is `max_q`, and its inverse. A block of zeros, or
/// of values so small that the inverse would overflow, gets zero for both.
fn block_scale(block: &[f32], max_q: f32) -> (f32, f32) {
    let scale = block.iter().fold(0f32, |a, v| a.max(v.abs())) / max_q;
    if scale >= f32::MIN_POSITIVE {
        (scale, 1.0 / scale)
    } else {
        (0.0, 0.0)
    }
}

impl WideMatrix {
    /// Quantizes `data`, `rows` x `cols` row-major.
    pub fn quantize(rows: usize, cols: usize, data: &[f32]) -> Result<WideMatrix, KernelError> {
        if rows == 0 || cols == 0 || !rows.is_multiple_of(8) || !cols.is_multiple_of(QK) {
            return Err(KernelError::Malformed(format!(
                "{rows}x{cols}: rows must be a multiple of 8 and columns of {QK}"
            )));
        }
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(KernelError::Malformed(format!(
                "{rows}x{cols} needs {} values, got {}",
                rows.saturating_mul(cols),
                data.len()
            )));
        }
        if let Some(at) = data.iter().position(|v| !v.is_finite()) {
            return Err(KernelError::Malformed(format!(
                "value {at} is not finite ({})",
                data[at]
            )));
        }
        let nb = cols / QK;
        let mut d = vec![0f32; rows * nb];
        let mut q = vec![0i16; rows * cols];
        for (r, row) in data.chunks_exact(cols).enumerate() {
            let (g, lane) = (r / 8, r % 8);
            for (b, blk) in row.chunks_exact(QK).enumerate() {
                let gb = g * nb + b;
                let (scale, inv) = block_scale(blk, W_MAX);
                d[8 * gb + lane] = scale;
                for (k, v) in blk.iter().enumerate() {
                    let qv = round_i32(v * inv).clamp(-2047, 2047) as i16;
                    q[256 * gb + 16 * (k / 2) + 2 * lane + k % 2] = qv;
                }
            }
        }
        Ok(WideMatrix { rows, cols, d, q })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.d.len() * 4 + self.q.len() * 2
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `row` as floats (`cols` long): what the products multiply by.
    pub fn dequantize_row(&self, row: usize) -> Option<Vec<f32>> {
        if row >= self.rows {
            return None;
        }
        let nb = self.cols / QK;
        let (g, lane) = (row / 8, row % 8);
        let mut out = vec![0f32; self.cols];
        for (b, o) in out.chunks_exact_mut(QK).enumerate() {
            let gb = g * nb + b;
            for (k, o) in o.iter_mut().enumerate() {
                *o = self.d[8 * gb + lane]
                    * f32::from(self.q[256 * gb + 16 * (k / 2) + 2 * lane + k % 2]);
            }
        }
        Some(out)
    }

    /// Group `g`'s scales and quants.
    fn group(&self, g: usize) -> (&[f32], &[i16]) {
        let nb = self.cols / QK;
        (
            &self.d[8 * g * nb..8 * (g + 1) * nb],
            &self.q[256 * g * nb..256 * (g + 1) * nb],
        )
    }
}

/// Rows of activations quantized to 16 bits per block of [`QK`].
#[derive(Clone, Debug, Default)]
pub struct WideAct {
    cols: usize,
    rows: usize,
    q: Vec<i16>,
    d: Vec<f32>,
}

impl WideAct {
    /// Rows held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Quantizes `x` (rows of `cols`, a multiple of [`QK`]) into `self`, the rows split over
    /// `pool`'s threads.
    ///
    /// # Panics
    /// When `cols` is not a multiple of [`QK`] or `x` not whole rows (programming errors).
    pub fn quantize_on(&mut self, pool: &pool::Pool, x: &[f32], cols: usize) {
        assert!(cols.is_multiple_of(QK) && cols > 0 && x.len().is_multiple_of(cols));
        self.cols = cols;
        self.rows = x.len() / cols;
        self.q.resize(x.len(), 0);
        self.d.resize(x.len() / QK, 0.0);
        let d = &mut self.d[..];
        let mut pairs: Vec<(&mut [i16], &mut [f32])> = Vec::new();
        // One piece per thread: the quants and the scales of the same rows.
        let mut rest = (&mut self.q[..], d);
        for r in pool.split(self.rows) {
            let (qh, qt) = std::mem::take(&mut rest.0).split_at_mut(r.len() * cols);
            let (dh, dt) = std::mem::take(&mut rest.1).split_at_mut(r.len() * cols / QK);
            pairs.push((qh, dh));
            rest = (qt, dt);
        }
        let starts: Vec<usize> = pool.split(self.rows).map(|r| r.start * cols).collect();
        let pieces: Vec<parking_lot::Mutex<(&mut [i16], &mut [f32])>> =
            pairs.into_iter().map(parking_lot::Mutex::new).collect();
        pool.run(&|tid| {
            if let (Some(piece), Some(&at)) = (pieces.get(tid), starts.get(tid)) {
                let mut piece = piece.lock();
                let (q, d) = &mut *piece;
                let x = &x[at..at + q.len()];
                for ((xb, qb), db) in x
                    .chunks_exact(QK)
                    .zip(q.chunks_exact_mut(QK))
                    .zip(d.iter_mut())
                {
                    let (scale, inv) = block_scale(xb, A_MAX);
                    *db = scale;
                    for (o, v) in qb.iter_mut().zip(xb) {
                        *o = round_i32(v * inv).clamp(-32767, 32767) as i16;
                    }
                }
            }
        });
    }
}

/// Activation rows `t0..t0 + nt` for a kernel: quants and scales.
pub(crate) struct WideTile<'a> {
    pub q: &'a [i16],
    pub d: &'a [f32],
    pub nb: usize,
}

/// The scalar kernel, the reference: group `(d, q)` times the tile's rows, into `out[8 * t +
/// lane]`.
pub(crate) fn dot_group_scalar(d: &[f32], q: &[i16], x: &WideTile<'_>, out: &mut [f32]) {
    let nb = x.nb;
    for (t, o) in out.chunks_exact_mut(8).enumerate() {
        for (lane, o) in o.iter_mut().enumerate() {
            let mut acc = 0f32;
            for b in 0..nb {
                let mut sum = 0i32;
                for c in 0..16 {
                    for j in 0..2 {
                        let w = i32::from(q[256 * b + 16 * c + 2 * lane + j]);
                        let a = i32::from(x.q[(t * nb + b) * QK + 2 * c + j]);
                        sum += w * a;
                    }
                }
                acc = (sum as f32).mul_add(d[8 * b + lane] * x.d[t * nb + b], acc);
            }
            *o = acc;
        }
    }
}

/// Tokens per block of the outer loop: their activations stay in the core's cache while every
/// group of weight rows passes over them.
const TOKEN_BLOCK: usize = 128;

/// `out_j[t * rows_j + r] = dot(w_j row r, x row t)` for every job `(w_j, out_j)`, over the
/// kernels' pool with the best instruction set of this CPU.
///
/// # Panics
/// When an output's length is not `x.rows * w.rows` or `x.cols != w.cols` (programming
/// errors).
pub fn matmul_wide(jobs: &mut [(&WideMatrix, &mut [f32])], x: &WideAct) {
    matmul_wide_with(crate::detected_isa(), pool::global(), jobs, x)
}

/// [`matmul_wide`] with an explicit instruction set and pool.
pub fn matmul_wide_with(
    isa: Isa,
    pool: &pool::Pool,
    jobs: &mut [(&WideMatrix, &mut [f32])],
    x: &WideAct,
) {
    let isa = if crate::isa_available(isa) {
        isa
    } else {
        Isa::Scalar
    };
    let (t_n, nb) = (x.rows, x.cols / QK);
    // Every group of eight rows of every job, numbered across jobs.
    let mut outs = Vec::with_capacity(jobs.len());
    let mut groups = 0;
    for (w, out) in jobs.iter_mut() {
        assert_eq!(w.cols, x.cols, "matmul_wide: inner dimensions differ");
        assert_eq!(out.len(), t_n * w.rows, "matmul_wide: output size");
        outs.push((*w, OutPtr(out.as_mut_ptr(), out.len()), groups));
        groups += w.rows / 8;
    }
    let threads = pool.threads().min(groups.max(1));
    let work = |tid: usize| {
        if tid >= threads {
            return;
        }
        let (lo, hi) = (groups * tid / threads, groups * (tid + 1) / threads);
        let mut tile = [0f32; 32];
        for tb in (0..t_n).step_by(TOKEN_BLOCK) {
            let te = (tb + TOKEN_BLOCK).min(t_n);
            for &(w, out, first) in &outs {
                let (a, b) = (lo.max(first), hi.min(first + w.rows / 8));
                for g in a..b.max(a) {
                    let g = g - first;
                    let (d, q) = w.group(g);
                    let mut t0 = tb;
                    while t0 < te {
                        let nt = (te - t0).min(4);
                        let xt = WideTile {
                            q: &x.q[t0 * x.cols..(t0 + nt) * x.cols],
                            d: &x.d[t0 * nb..(t0 + nt) * nb],
                            nb,
                        };
                        dot_group(isa, d, q, &xt, &mut tile[..8 * nt]);
                        // SAFETY: each (token, group) is written by exactly one thread, whose
                        // group range holds it.
                        unsafe { out.write_group_tile(w.rows, g, t0, &tile[..8 * nt]) };
                        t0 += nt;
                    }
                }
            }
        }
    };
    pool.run(&work);
}

/// One group of eight weight rows times up to four activation rows.
fn dot_group(isa: Isa, d: &[f32], q: &[i16], x: &WideTile<'_>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        // `matmul_wide_with` runs only instruction sets `isa_available` finds on this CPU,
        // which is what each kernel requires.
        match isa {
            Isa::Avx2 | Isa::AvxVnni => {
                // SAFETY: AVX2 and FMA are present (see above).
                return unsafe { crate::x86::wide_avx2::dot_group(d, q, x, out) };
            }
            Isa::Avx512Vnni => {
                // SAFETY: AVX-512 VNNI and VL are present (see above).
                return unsafe { crate::x86::wide_avx512_vnni::dot_group(d, q, x, out) };
            }
            Isa::Scalar => {}
        }
    }
    let _ = isa;
    dot_group_scalar(d, q, x, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(rows: usize, cols: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..rows * cols)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let v = (s % 20_001) as f32 / 10_000.0 - 1.0;
                // An outlier column, as BERT's hidden states have.
                if i % cols == 7 {
                    v * 40.0
                } else {
                    v
                }
            })
            .collect()
    }

    #[test]
    fn every_instruction_set_gives_the_scalar_bits_and_the_product_is_close() {
        let pool = pool::Pool::new(2);
        for (rows, cols, t_n) in [(8, 32, 1), (24, 64, 3), (16, 384, 9), (40, 96, 130)] {
            let w = data(rows, cols, 1);
            let x = data(t_n, cols, 2);
            let wm = WideMatrix::quantize(rows, cols, &w).unwrap();
            let mut act = WideAct::default();
            act.quantize_on(&pool, &x, cols);
            let mut want = vec![0f32; t_n * rows];
            matmul_wide_with(Isa::Scalar, &pool, &mut [(&wm, &mut want[..])], &act);
            for isa in Isa::ALL {
                if !crate::isa_available(isa) {
                    continue;
                }
                let mut got = vec![0f32; t_n * rows];
                matmul_wide_with(isa, &pool, &mut [(&wm, &mut got[..])], &act);
                assert_eq!(got, want, "{isa:?} {rows}x{cols}x{t_n}");
            }
            // Against the f64 product: within the rounding bound of each block, half a
            // weight step times |x| plus half an activation step times |w|.
            for t in 0..t_n {
                for r in 0..rows {
                    let (wr, xr) = (&w[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                    let exact: f64 = wr
                        .iter()
                        .zip(xr)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    let mut bound = 0f64;
                    for (wb, xb) in wr.chunks(QK).zip(xr.chunks(QK)) {
                        let amax =
                            |v: &[f32]| f64::from(v.iter().fold(0f32, |a, v| a.max(v.abs())));
                        let (sw, sx) = (amax(wb) / f64::from(W_MAX), amax(xb) / f64::from(A_MAX));
                        for (a, b) in wb.iter().zip(xb) {
                            bound += 0.5 * sw * f64::from(b.abs()) + 0.5 * sx * f64::from(a.abs());
                        }
                    }
                    let got = f64::from(want[t * rows + r]);
                    assert!(
                        (got - exact).abs() <= bound * 1.01 + 1e-5,
                        "{rows}x{cols} t{t} r{r}: {got} vs {exact} (bound {bound})"
                    );
                }
            }
        }
    }

    #[test]
    fn quantized_weights_round_trip_within_half_a_step() {
        let w = data(16, 64, 3);
        let m = WideMatrix::quantize(16, 64, &w).unwrap();
        for r in 0..16 {
            let row = m.dequantize_row(r).unwrap();
            for (b, blk) in w[r * 64..(r + 1) * 64].chunks(QK).enumerate() {
                let step = blk.iter().fold(0f32, |a, v| a.max(v.abs())) / W_MAX;
                for (k, v) in blk.iter().enumerate() {
                    assert!((row[b * QK + k] - v).abs() <= 0.5 * step * 1.0001);
                }
            }
        }
        assert!(m.dequantize_row(16).is_none());
        assert!(WideMatrix::quantize(12, 64, &data(12, 64, 1)).is_err());
        assert!(WideMatrix::quantize(8, 40, &data(8, 40, 1)).is_err());
        let mut bad = data(8, 32, 1);
        bad[5] = f32::NAN;
        assert!(WideMatrix::quantize(8, 32, &bad).is_err());
    }
}
