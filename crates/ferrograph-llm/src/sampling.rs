//! Token sampling: greedy, temperature, top-k, top-p and a repetition penalty, driven by a
//! seeded generator so that the same seed and input give the same output.

use crate::options::GenerateOptions;
use rand::distributions::{Distribution, WeightedIndex};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Picks the next token from logits.
#[derive(Debug)]
pub struct Sampler {
    temperature: f32,
    top_k: Option<usize>,
    top_p: Option<f32>,
    repetition_penalty: f32,
    repeat_last_n: usize,
    rng: StdRng,
}

impl Sampler {
    /// A sampler for `options` (a random seed when none is given).
    pub fn new(options: &GenerateOptions) -> Self {
        let seed = options.seed.unwrap_or_else(rand::random);
        Sampler {
            temperature: options.temperature,
            top_k: options.top_k,
            top_p: options.top_p,
            repetition_penalty: options.repetition_penalty,
            repeat_last_n: options.repeat_last_n,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// Whether this sampler always takes the most likely token.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == Some(1)
    }

    /// Chooses a token from `logits` given the tokens so far (`history`, for the repetition
    /// penalty). `logits` is modified in place.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        if self.repetition_penalty != 1.0 {
            let start = history.len().saturating_sub(self.repeat_last_n);
            let mut seen: Vec<u32> = history[start..].to_vec();
            seen.sort_unstable();
            seen.dedup();
            for t in seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l >= 0.0 {
                        *l / self.repetition_penalty
                    } else {
                        *l * self.repetition_penalty
                    };
                }
            }
        }
        if self.is_greedy() {
            return argmax(logits);
        }
        // Candidates sorted by logit, best first (ties broken by id for determinism).
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let key = |i: &u32| logits[*i as usize];
        let k = self.top_k.unwrap_or(idx.len()).min(idx.len()).max(1);
        if k < idx.len() {
            idx.select_nth_unstable_by(k - 1, |a, b| key(b).total_cmp(&key(a)).then(a.cmp(b)));
            idx.truncate(k);
        }
        idx.sort_unstable_by(|a, b| key(b).total_cmp(&key(a)).then(a.cmp(b)));
        let max = key(&idx[0]);
        let mut probs: Vec<f32> = idx
            .iter()
            .map(|i| ((key(i) - max) / self.temperature).exp())
            .collect();
        let sum: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        if let Some(top_p) = self.top_p {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (n, p) in probs.iter().enumerate() {
                acc += p;
                if acc >= top_p {
                    keep = n + 1;
                    break;
                }
            }
            probs.truncate(keep);
            idx.truncate(keep);
        }
        match WeightedIndex::new(&probs) {
            Ok(dist) => idx[dist.sample(&mut self.rng)],
            Err(_) => idx[0],
        }
    }
}

/// Index of the largest value (the first one on ties); 0 for an empty slice. NaNs are never
/// the largest, except in the first place, which is then the answer (as a scan that keeps
/// the first value until a greater one comes would have it).
///
/// Two passes that vectorize (a greedy decode step runs it over the whole vocabulary, about
/// 50,000 values): the largest value, sixteen lanes at a time with `>` (which passes NaNs
/// over), then the first place that holds it.
pub fn argmax(v: &[f32]) -> u32 {
    const LANES: usize = 16;
    let Some(&first) = v.first() else {
        return 0;
    };
    if first.is_nan() {
        return 0;
    }
    let mut lanes = [first; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    let best = lanes
        .into_iter()
        .chain(tail.iter().copied())
        .fold(first, |m, x| if x > m { x } else { m });
    v.iter().position(|&x| x == best).unwrap_or(0) as u32
}

/// The repetition guard: bans every token that would complete an `n`-gram the answer
/// (`generated`) already contains. It acts only where the choice is free (more than
/// `FREE_CHOICE` tokens allowed, so enum values and JSON structure that a grammar narrows are
/// left alone) and never bans every allowed token. Returns how many tokens it banned.
pub fn block_repeated_ngrams(logits: &mut [f32], generated: &[u32], n: usize) -> usize {
    const FREE_CHOICE: usize = 8;
    if n < 2 || generated.len() < n {
        return 0;
    }
    let prefix = &generated[generated.len() - (n - 1)..];
    let mut banned: Vec<u32> = Vec::new();
    for i in 0..generated.len() - (n - 1) {
        if &generated[i..i + n - 1] == prefix {
            let next = generated[i + n - 1];
            if !banned.contains(&next) {
                banned.push(next);
            }
        }
    }
    if banned.is_empty() {
        return 0;
    }
    let allowed = logits.iter().filter(|l| l.is_finite()).count();
    let banned_allowed = banned
        .iter()
        .filter(|t| logits.get(**t as usize).is_some_and(|l| l.is_finite()))
        .count();
    if allowed <= FREE_CHOICE || banned_allowed >= allowed {
        return 0;
    }
    for t in &banned {
        if let Some(l) = logits.get_mut(*t as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
    banned_allowed
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_repetition_guard_bans_loop_completions_only_where_the_choice_is_free() {
        use super::block_repeated_ngrams;
        // "a b c a b" -> "c" would repeat "a b c".
        let generated = [1u32, 2, 3, 1, 2];
        let mut logits = vec![0.0f32; 32];
        assert_eq!(block_repeated_ngrams(&mut logits, &generated, 3), 1);
        assert_eq!(logits[3], f32::NEG_INFINITY);
        assert!(logits[4].is_finite());
        // No repeat of the prefix: nothing banned.
        let mut logits = vec![0.0f32; 32];
        assert_eq!(block_repeated_ngrams(&mut logits, &[1, 2, 3, 4, 5], 3), 0);
        // A grammar that allows only the looping token (or a handful): left alone.
        let mut logits = vec![f32::NEG_INFINITY; 32];
        logits[3] = 0.0;
        logits[9] = 0.0;
        assert_eq!(block_repeated_ngrams(&mut logits, &generated, 3), 0);
        assert!(logits[3].is_finite());
    }

    use super::*;

    /// The plain scan `argmax` replaced: the first value, kept until a greater one comes.
    fn scan(v: &[f32]) -> u32 {
        let mut best = 0usize;
        for (i, x) in v.iter().enumerate() {
            if *x > v[best] {
                best = i;
            }
        }
        best as u32
    }

    proptest::proptest! {
        #[test]
        fn argmax_is_the_first_largest_value(
            v in proptest::collection::vec(
                proptest::prop_oneof![
                    8 => -3.0f32..3.0,
                    1 => proptest::sample::select(vec![f32::NAN, f32::NEG_INFINITY, f32::INFINITY, 0.0, -0.0, 2.5]),
                ],
                0..100,
            ),
        ) {
            proptest::prop_assert_eq!(argmax(&v), scan(&v));
        }
    }

    #[test]
    fn greedy_takes_argmax() {
        let mut s = Sampler::new(&GenerateOptions::greedy());
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0], &[]), 1);
    }

    #[test]
    fn repetition_penalty_changes_choice() {
        let mut s = Sampler::new(&GenerateOptions::greedy().repetition_penalty(2.0));
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0], &[1]), 2);
    }

    #[test]
    fn seeded_sampling_is_reproducible() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |seed| {
            let mut s = Sampler::new(&GenerateOptions::sampled(1.0, seed).top_p(0.95));
            (0..50)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = Sampler::new(&GenerateOptions::sampled(5.0, 1).top_k(1));
        for _ in 0..10 {
            assert_eq!(s.sample(&mut [0.1, 3.0, 2.9], &[]), 1);
        }
    }
}
