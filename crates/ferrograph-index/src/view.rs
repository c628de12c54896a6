//! A read-only, cache-friendly copy of the HNSW graph for searching.
//!
//! hnsw_rs builds and stores the graph; its search walks per-point locks and `Arc`s and scores
//! through a generic distance. After every change the index copies the graph into this
//! view: dense point numbers, the vectors in one contiguous array, layer 0 as a CSR adjacency
//! (offsets and neighbours), the few upper-layer points in small per-layer maps. The search
//! is the standard HNSW one (greedy descent through the upper layers, then a beam of width
//! `ef` on layer 0) over the same edges, so it finds what hnsw_rs's would, faster.

use crate::distance::dot;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// A distance with a total order (smaller is closer).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Near(f32, u32);

impl Eq for Near {}

impl PartialOrd for Near {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Near {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0).then(self.1.cmp(&other.1))
    }
}

/// The searchable copy of a graph.
#[derive(Debug, Default)]
pub(crate) struct SearchView {
    dim: usize,
    /// Dense number → chunk id.
    ids: Vec<u64>,
    /// Vectors, `dim` floats per dense number.
    vecs: Vec<f32>,
    /// Layer 0: the neighbours of `p` are `l0[off[p]..off[p + 1]]`.
    off: Vec<u32>,
    l0: Vec<u32>,
    /// Layers 1.. (index 0 is layer 1): neighbours of the points on that layer.
    upper: Vec<HashMap<u32, Vec<u32>>>,
    /// Where searches start (a point of the top layer).
    entry: Option<u32>,
}

/// One point as the graph holds it.
pub(crate) struct ViewPoint<'a> {
    /// Chunk id.
    pub(crate) id: u64,
    /// Its vector.
    pub(crate) vector: &'a [f32],
    /// Neighbour ids per layer, layer 0 first.
    pub(crate) layers: Vec<Vec<u64>>,
}

impl SearchView {
    /// The view of `points`, starting searches at `entry`.
    pub(crate) fn build(dim: usize, points: Vec<ViewPoint<'_>>, entry: Option<u64>) -> Self {
        let dense: HashMap<u64, u32> = points
            .iter()
            .enumerate()
            .map(|(i, p)| (p.id, i as u32))
            .collect();
        let mut v = SearchView {
            dim,
            ids: Vec::with_capacity(points.len()),
            vecs: Vec::with_capacity(points.len() * dim),
            off: Vec::with_capacity(points.len() + 1),
            l0: Vec::new(),
            upper: Vec::new(),
            entry: entry.and_then(|e| dense.get(&e).copied()),
        };
        v.off.push(0);
        for (i, p) in points.iter().enumerate() {
            v.ids.push(p.id);
            let mut vec = p.vector.to_vec();
            vec.resize(dim, 0.0);
            v.vecs.extend_from_slice(&vec);
            for (layer, ns) in p.layers.iter().enumerate() {
                let ns: Vec<u32> = ns.iter().filter_map(|n| dense.get(n).copied()).collect();
                if layer == 0 {
                    v.l0.extend_from_slice(&ns);
                } else if !ns.is_empty() {
                    while v.upper.len() < layer {
                        v.upper.push(HashMap::new());
                    }
                    v.upper[layer - 1].insert(i as u32, ns);
                }
            }
            v.off.push(v.l0.len() as u32);
        }
        v
    }

    /// Points in the view.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    fn vector(&self, p: u32) -> &[f32] {
        let s = p as usize * self.dim;
        &self.vecs[s..s + self.dim]
    }

    fn dist(&self, q: &[f32], p: u32) -> f32 {
        1.0 - dot(q, self.vector(p))
    }

    /// The ids of (up to) `k` nearest points that pass `keep`, nearest first; points failing
    /// it are still walked through.
    pub(crate) fn search(
        &self,
        q: &[f32],
        k: usize,
        ef: usize,
        keep: Option<&dyn Fn(u64) -> bool>,
    ) -> Vec<u64> {
        let Some(mut cur) = self.entry else {
            return Vec::new();
        };
        if k == 0 || q.len() != self.dim {
            return Vec::new();
        }
        let ef = ef.max(k);
        let mut cur_d = self.dist(q, cur);
        for layer in self.upper.iter().rev() {
            loop {
                let mut moved = false;
                if let Some(ns) = layer.get(&cur) {
                    for &n in ns {
                        let d = self.dist(q, n);
                        if d < cur_d {
                            cur_d = d;
                            cur = n;
                            moved = true;
                        }
                    }
                }
                if !moved {
                    break;
                }
            }
        }
        let passes = |p: u32| keep.is_none_or(|f| f(self.ids[p as usize]));
        let mut visited = vec![0u64; self.ids.len().div_ceil(64)];
        let mut seen = |p: u32| {
            let (w, b) = (p as usize / 64, p % 64);
            let fresh = visited[w] & (1 << b) == 0;
            visited[w] |= 1 << b;
            fresh
        };
        seen(cur);
        let mut frontier = BinaryHeap::new(); // min-heap through Reverse
        let mut best: BinaryHeap<Near> = BinaryHeap::with_capacity(ef + 1); // max-heap
        frontier.push(std::cmp::Reverse(Near(cur_d, cur)));
        if passes(cur) {
            best.push(Near(cur_d, cur));
        }
        while let Some(std::cmp::Reverse(Near(d, p))) = frontier.pop() {
            if best.len() >= ef && best.peek().is_some_and(|w| d > w.0) {
                break;
            }
            let (a, b) = (
                self.off[p as usize] as usize,
                self.off[p as usize + 1] as usize,
            );
            for &n in &self.l0[a..b] {
                if !seen(n) {
                    continue;
                }
                let dn = self.dist(q, n);
                let worst = best.peek().map_or(f32::INFINITY, |w| w.0);
                if best.len() < ef || dn < worst {
                    frontier.push(std::cmp::Reverse(Near(dn, n)));
                    if passes(n) {
                        best.push(Near(dn, n));
                        if best.len() > ef {
                            best.pop();
                        }
                    }
                }
            }
        }
        let mut out = best.into_sorted_vec();
        out.truncate(k);
        out.into_iter().map(|n| self.ids[n.1 as usize]).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn unit(v: &[f32]) -> Vec<f32> {
        let n = dot(v, v).sqrt();
        v.iter().map(|x| x / n).collect()
    }

    #[test]
    fn a_line_graph_is_searched_to_the_nearest() {
        // Ten points on a quarter circle, each linked to its neighbours on layer 0.
        let vs: Vec<Vec<f32>> = (0..10)
            .map(|i| {
                let a = i as f32 * 0.15;
                unit(&[a.cos(), a.sin()])
            })
            .collect();
        let points = (0..10u64)
            .map(|i| ViewPoint {
                id: 100 + i,
                vector: &vs[i as usize],
                layers: vec![[i.checked_sub(1), Some(i + 1).filter(|n| *n < 10)]
                    .into_iter()
                    .flatten()
                    .map(|n| 100 + n)
                    .collect()],
            })
            .collect();
        let view = SearchView::build(2, points, Some(100));
        assert_eq!(view.len(), 10);
        let q = unit(&[(1.22f32).cos(), (1.22f32).sin()]);
        assert_eq!(view.search(&q, 3, 4, None), vec![108, 109, 107]);
        let odd = |id: u64| id % 2 == 1;
        assert_eq!(view.search(&q, 2, 4, Some(&odd)), vec![109, 107]);
        assert!(view.search(&q, 0, 4, None).is_empty());
    }
}
