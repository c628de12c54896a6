//! Similarity of unit vectors.
//!
//! hnsw_rs's `DistCosine`/`DistDot` assert on rounding (a dot product of unit vectors slightly
//! above 1 panics). [`DistUnitCosine`] computes `1 - a·b` clamped to `[0, 2]` and never panics:
//! unequal lengths compare the common prefix and NaN maps to the largest distance.

use hnsw_rs::anndists::dist::Distance;

/// Dot product, written so the compiler vectorizes it (eight independent accumulators).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Scales `v` to unit length in place; a zero or non-finite vector is left as zeros.
/// Returns whether the vector was usable.
pub fn normalize(v: &mut [f32]) -> bool {
    let norm = dot(v, v).sqrt();
    if !norm.is_finite() || norm <= f32::MIN_POSITIVE {
        v.iter_mut().for_each(|x| *x = 0.0);
        return false;
    }
    v.iter_mut().for_each(|x| *x /= norm);
    true
}

/// Cosine distance of unit vectors, `1 - a·b` clamped to `[0, 2]`; never panics.
#[derive(Clone, Copy, Debug, Default)]
pub struct DistUnitCosine;

impl Distance<f32> for DistUnitCosine {
    fn eval(&self, va: &[f32], vb: &[f32]) -> f32 {
        let d = 1.0 - dot(va, vb);
        if d.is_nan() {
            2.0
        } else {
            d.clamp(0.0, 2.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_naive_and_distance_is_clamped() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.7).cos()).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-4);
        let mut u = a.clone();
        assert!(normalize(&mut u));
        let d = DistUnitCosine.eval(&u, &u);
        assert!((0.0..1e-5).contains(&d));
        assert_eq!(DistUnitCosine.eval(&[f32::NAN], &[1.0]), 2.0);
        assert_eq!(DistUnitCosine.eval(&[1.0, 2.0], &[1.0]), 0.0);
        let mut z = vec![0.0; 4];
        assert!(!normalize(&mut z));
    }
}
