//! Lexical search over an index's chunks (BM25, through the `bm25` crate's embedder and
//! scorer) and reciprocal rank fusion of ranked lists.
//!
//! The lexical index is built from the chunks the sled store holds (the store stays the one
//! source of truth; this is a cache rebuilt in memory, milliseconds for a repository of a few
//! thousand chunks). Its tokenizer is made for code: an identifier is kept whole and also
//! split at `_`, `::`, `.` and camelCase humps, so `apply_discounts` matches a query for
//! `apply_discounts` exactly and a query for "discounts" too.

use crate::index::Index;
use crate::types::Hit;
use crate::Result;
use bm25::{Embedder, EmbedderBuilder, Scorer, Tokenizer};
use std::collections::HashMap;

/// Words too common in code and prose to rank by.
const STOP: &[&str] = &[
    "the", "and", "for", "with", "that", "this", "from", "are", "was", "not", "but", "into", "its",
    "has", "have", "when", "then", "than", "def", "self", "cls", "return", "import", "class",
    "none", "true", "false", "pass", "raise", "if", "else", "elif", "in", "is", "or", "of", "to",
    "a", "an", "it", "be", "as", "at", "by", "on", "fn", "let", "mut", "pub", "use", "impl",
    "struct", "const", "self_", "str", "int", "i", "we", "you", "my", "me",
];

/// Splits text into code-aware tokens (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct CodeTokenizer;

impl Tokenizer for CodeTokenizer {
    fn tokenize(&self, input_text: &str) -> Vec<String> {
        code_tokens(input_text)
    }
}

/// The tokens of `text`: each identifier lowercased, then its parts when it has several.
pub fn code_tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for word in text.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
        let word = word.trim_matches('_');
        if word.len() < 2 || word.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let lower = word.to_lowercase();
        let parts = split_identifier(word);
        if !STOP.contains(&lower.as_str()) {
            out.push(lower.clone());
        }
        if parts.len() > 1 {
            for p in parts {
                if p.len() >= 2 && !STOP.contains(&p.as_str()) && p != lower {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// `applyDiscounts` / `apply_discounts` / `HTTPServer` → their lowercased parts.
fn split_identifier(word: &str) -> Vec<String> {
    let mut parts = Vec::new();
    for piece in word.split('_').filter(|p| !p.is_empty()) {
        let chars: Vec<char> = piece.chars().collect();
        let mut cur = String::new();
        for (i, &c) in chars.iter().enumerate() {
            let boundary = i > 0
                && c.is_uppercase()
                && (chars[i - 1].is_lowercase()
                    || chars.get(i + 1).is_some_and(|n| n.is_lowercase())
                        && chars[i - 1].is_uppercase());
            if boundary && !cur.is_empty() {
                parts.push(cur.to_lowercase());
                cur.clear();
            }
            cur.push(c);
        }
        if !cur.is_empty() {
            parts.push(cur.to_lowercase());
        }
    }
    parts
}

/// BM25 over the chunks of one [`Index`], in memory.
pub struct LexicalIndex {
    embedder: Embedder<u32, CodeTokenizer>,
    scorer: Scorer<u64, u32>,
    chunks: HashMap<u64, Hit>,
}

impl std::fmt::Debug for LexicalIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LexicalIndex")
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

impl LexicalIndex {
    /// Builds the lexical index of every live chunk of `index` (path and text).
    pub fn build(index: &Index) -> Result<LexicalIndex> {
        let mut chunks = HashMap::new();
        for id in index.ids() {
            if let Some(hit) = index.get(id)? {
                chunks.insert(id, hit);
            }
        }
        Ok(Self::from_chunks(chunks))
    }

    /// Builds it from chunks already read.
    pub fn from_chunks(chunks: HashMap<u64, Hit>) -> LexicalIndex {
        let texts: Vec<String> = chunks
            .values()
            .map(|h| format!("{}\n{}", h.path, h.text))
            .collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let embedder: Embedder<u32, CodeTokenizer> =
            EmbedderBuilder::with_tokenizer_and_fit_to_corpus(CodeTokenizer, &refs).build();
        let mut scorer = Scorer::<u64, u32>::new();
        for (id, h) in &chunks {
            scorer.upsert(id, embedder.embed(&format!("{}\n{}", h.path, h.text)));
        }
        LexicalIndex {
            embedder,
            scorer,
            chunks,
        }
    }

    /// How many chunks it holds.
    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Every chunk, by id.
    pub fn chunks(&self) -> &HashMap<u64, Hit> {
        &self.chunks
    }

    /// The `k` chunks that score best for `query` (BM25 score in [`Hit::score`]), best first;
    /// ties broken by id. A query without a usable token finds nothing.
    pub fn search(&self, query: &str, k: usize) -> Vec<Hit> {
        let mut tokens = code_tokens(query);
        tokens.sort();
        tokens.dedup();
        if tokens.is_empty() {
            return Vec::new();
        }
        let q = self.embedder.embed(&tokens.join(" "));
        let mut scored = self.scorer.matches(&q);
        scored.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.id.cmp(&b.id)));
        scored
            .into_iter()
            .take(k)
            .filter_map(|s| {
                self.chunks.get(&s.id).map(|h| Hit {
                    score: s.score,
                    ..h.clone()
                })
            })
            .collect()
    }
}

/// Reciprocal rank fusion: each list (ids best first) with its weight adds
/// `weight / (k + rank)` (rank from 1) to every id it holds. Returns ids by fused score, best
/// first, ties broken by id. `k = 60` is the usual constant.
pub fn reciprocal_rank_fusion(lists: &[(f32, Vec<u64>)], k: f32) -> Vec<(u64, f32)> {
    let mut score: HashMap<u64, f32> = HashMap::new();
    for (weight, ids) in lists {
        let mut seen = std::collections::HashSet::new();
        for (rank, id) in ids.iter().enumerate() {
            if seen.insert(*id) {
                *score.entry(*id).or_insert(0.0) += weight / (k + rank as f32 + 1.0);
            }
        }
    }
    let mut out: Vec<(u64, f32)> = score.into_iter().collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::BTreeMap;

    fn hit(id: u64, path: &str, text: &str) -> Hit {
        Hit {
            id,
            score: 0.0,
            path: path.into(),
            start_line: 1,
            end_line: 10,
            language: "python".into(),
            metadata: BTreeMap::new(),
            text: text.into(),
        }
    }

    #[test]
    fn code_tokens_keep_identifiers_and_their_parts() {
        let t = code_tokens("def apply_discounts(subtotal): HTTPServer.parseURL");
        for want in [
            "apply_discounts",
            "apply",
            "discounts",
            "subtotal",
            "httpserver",
            "http",
            "server",
            "parseurl",
            "parse",
            "url",
        ] {
            assert!(t.contains(&want.to_string()), "{want} missing from {t:?}");
        }
        assert!(!t.contains(&"def".to_string()));
    }

    #[test]
    fn bm25_ranks_the_chunk_with_the_rare_identifier_first() {
        let mut chunks = HashMap::new();
        chunks.insert(1, hit(1, "pkg/invoice.py", "def total(self):\n    net = apply_discounts(self.subtotal(), self.codes)\n    return net"));
        chunks.insert(2, hit(2, "pkg/discounts.py", "def apply_discounts(subtotal, codes):\n    percent = sum(c.value for c in codes)\n    return subtotal * (1 - percent)"));
        chunks.insert(
            3,
            hit(
                3,
                "pkg/tax.py",
                "def vat(amount, region):\n    return amount * RATES[region]",
            ),
        );
        chunks.insert(
            4,
            hit(
                4,
                "README.md",
                "ledgerlite makes invoices with tax and discounts",
            ),
        );
        let lx = LexicalIndex::from_chunks(chunks);
        let hits = lx.search("percent codes apply_discounts", 3);
        assert_eq!(hits[0].path, "pkg/discounts.py");
        assert!(lx.search("vat region", 1)[0].path == "pkg/tax.py");
        assert!(lx.search("!!! ...", 5).is_empty());
    }

    #[test]
    fn fusion_adds_weighted_reciprocal_ranks() {
        let fused = reciprocal_rank_fusion(
            &[(1.0, vec![1, 2, 3]), (1.0, vec![2, 3, 1]), (2.0, vec![3])],
            60.0,
        );
        assert_eq!(fused[0].0, 3);
        assert_eq!(fused[1].0, 2);
        assert_eq!(fused[2].0, 1);
        assert!((fused[0].1 - (1.0 / 63.0 + 1.0 / 62.0 + 2.0 / 61.0)).abs() < 1e-6);
    }
}
