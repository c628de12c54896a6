//! Element-wise and row operations shared by the [decoder](crate::decoder) and the
//! [encoder](crate::encoder): written so that loops over slices vectorize (no libm calls,
//! independent lanes), and each row computed in the same order whatever else is in a batch.

/// `x += y`, element by element.
pub(crate) fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Adds `bias` to every row of `x`.
pub(crate) fn add_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add(row, bias);
    }
}

/// e^x without a libm call, so that loops over slices vectorize: `x = n ln 2 + r` with
/// `|r| <= ln 2 / 2`, a degree-6 Taylor polynomial for e^r (relative error below 2e-7) and
/// 2^n written into the exponent bits. Inputs are clamped to [-87, 88], so results stay
/// normal and finite; NaN stays NaN.
#[inline(always)]
pub(crate) fn exp_approx(x: f32) -> f32 {
    // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
    const SHIFT: f32 = 12_582_912.0;
    // ln 2 in two parts, the first exact in few bits so that `n * LN2_HI` is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * std::f32::consts::LOG2_E + SHIFT;
    let n = shifted - SHIFT;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // n + 127 in the exponent field: 2^n.
    let two_n = (shifted
        .to_bits()
        .wrapping_sub(SHIFT.to_bits())
        .wrapping_add(127))
        << 23;
    p * f32::from_bits(two_n)
}

/// Dot product with eight independent lanes (vectorizes without reassociation).
pub(crate) fn dot8(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Sum of `x` in eight independent lanes (vectorizes without reassociation): the remainder
/// first, then the lanes.
pub(crate) fn sum8(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let mut sum: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for i in 0..8 {
            acc[i] += c[i];
        }
    }
    sum += acc.iter().sum::<f32>();
    sum
}

/// Softmax of `x` in place, with eight independent lanes for the maximum and the sum so that
/// every pass vectorizes.
pub(crate) fn softmax_in_place(x: &mut [f32]) {
    let mut mx = [f32::NEG_INFINITY; 8];
    let chunks = x.chunks_exact(8);
    let mut m = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for c in chunks {
        for i in 0..8 {
            mx[i] = mx[i].max(c[i]);
        }
    }
    m = mx.iter().fold(m, |a, &b| a.max(b));
    for v in x.iter_mut() {
        *v = exp_approx(*v - m);
    }
    let inv = 1.0 / sum8(x);
    x.iter_mut().for_each(|v| *v *= inv);
}

/// erf(x), Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7) with [`exp_approx`],
/// so that it vectorizes.
#[inline(always)]
pub(crate) fn erf_approx(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_7,
        -1.453_152,
        1.061_405_4,
    ];
    let ax = x.abs();
    let t = 1.0 / (1.0 + P * ax);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let y = 1.0 - poly * exp_approx(-ax * ax);
    y.copysign(x)
}

/// GELU as BERT defines it, `x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))`.
#[inline(always)]
pub(crate) fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf_approx(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// LayerNorm of every `w.len()`-wide row of `x` in place: `(x - mean) / sqrt(var + eps) * w +
/// b`, the variance being the mean square of the centred row (two passes, as torch does).
pub(crate) fn layer_norm_in_place(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let d = w.len();
    for row in x.chunks_exact_mut(d) {
        let mean = sum8(row) / d as f32;
        let mut acc = [0f32; 8];
        let chunks = row.chunks_exact(8);
        let mut sq: f32 = chunks
            .remainder()
            .iter()
            .map(|v| (v - mean) * (v - mean))
            .sum();
        for c in chunks {
            for i in 0..8 {
                let v = c[i] - mean;
                acc[i] += v * v;
            }
        }
        sq += acc.iter().sum::<f32>();
        let inv = 1.0 / (sq / d as f32 + eps).sqrt();
        for ((v, g), o) in row.iter_mut().zip(w).zip(b) {
            *v = (*v - mean) * inv * g + o;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erf in f64 by Simpson's rule on `2/sqrt(pi) exp(-t^2)` (error far below 1e-10).
    fn erf_ref(x: f64) -> f64 {
        let n = 20_000;
        let h = x / n as f64;
        let f = |t: f64| (-t * t).exp();
        let mut sum = f(0.0) + f(x);
        for i in 1..n {
            sum += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
        }
        sum * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn erf_approx_is_within_its_bound() {
        for i in -600..=600 {
            let x = i as f32 / 100.0;
            let (got, want) = (f64::from(erf_approx(x)), erf_ref(f64::from(x)));
            assert!((got - want).abs() < 3e-7, "erf({x}) = {got}, want {want}");
        }
        assert_eq!(erf_approx(40.0), 1.0);
        assert_eq!(erf_approx(-40.0), -1.0);
        assert!(erf_approx(f32::NAN).is_nan());
    }

    #[test]
    fn gelu_and_layer_norm_match_their_definitions() {
        for x in [-5.0f32, -1.0, -0.1, 0.0, 0.3, 1.0, 2.5, 8.0] {
            let want = 0.5 * f64::from(x) * (1.0 + erf_ref(f64::from(x) / 2f64.sqrt()));
            assert!((f64::from(gelu_erf(x)) - want).abs() < 1e-6, "gelu({x})");
        }
        let mut row: Vec<f32> = (0..19)
            .map(|i| (i as f32 * 0.37).sin() * 3.0 + 1.0)
            .collect();
        let orig = row.clone();
        let w: Vec<f32> = (0..19).map(|i| 1.0 + i as f32 * 0.01).collect();
        let b: Vec<f32> = (0..19).map(|i| i as f32 * -0.02).collect();
        layer_norm_in_place(&mut row, &w, &b, 1e-12);
        let mean = orig.iter().map(|v| f64::from(*v)).sum::<f64>() / 19.0;
        let var = orig
            .iter()
            .map(|v| (f64::from(*v) - mean).powi(2))
            .sum::<f64>()
            / 19.0;
        for i in 0..19 {
            let want = (f64::from(orig[i]) - mean) / var.sqrt() * f64::from(w[i]) + f64::from(b[i]);
            assert!(
                (f64::from(row[i]) - want).abs() < 1e-5,
                "{i}: {} vs {want}",
                row[i]
            );
        }
    }
}
