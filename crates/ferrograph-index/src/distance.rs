//! Similarity of unit vectors.
//!
//! hnsw_rs's `DistCosine`/`DistDot` assert on rounding (a dot product of unit vectors slightly
//! above 1 panics). [`DistUnitCosine`] computes `1 - a·b` clamped to `[0, 2]` and never panics:
//! unequal lengths compare the common prefix and NaN maps to the largest distance.

use hnsw_rs::anndists::dist::Distance;

/// Dot product of the common prefix of `a` and `b` (the SIMD kernel lives with the other
/// kernels, see [`ferrograph_kernels::vector::dot`]).
pub use ferrograph_kernels::vector::dot;

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
        for len in [0, 1, 7, 8, 9, 31, 32, 33, 37, 77, 128, 384] {
            let a: Vec<f32> = (0..len).map(|i| (i as f32).sin()).collect();
            let b: Vec<f32> = (0..len + 3).map(|i| (i as f32 * 0.7).cos()).collect();
            let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((dot(&a, &b) - naive).abs() < 1e-4, "len {len}");
            assert!((dot(&b, &a) - naive).abs() < 1e-4, "len {len}");
        }
        let a: Vec<f32> = (0..37).map(|i| (i as f32).sin()).collect();
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
