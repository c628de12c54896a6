//! Filters never leak: whatever the filters, the query, the deletions and the search path
//! (graph, graph with filter, exact), every hit is live and passes every filter; and when
//! few chunks match, the answer is the exact one.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use ferrograph_index::bench::clustered_vectors;
use ferrograph_index::{
    ChunkMeta, Filter, HnswParams, Index, IndexConfig, NewChunk, SearchOptions,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashSet};
use std::sync::OnceLock;

const N: usize = 3000;
const DIM: usize = 32;
const MODULES: [&str; 5] = ["core", "llm", "index", "tools", "cli"];
const LANGS: [&str; 3] = ["rust", "python", "markdown"];

struct Fixture {
    _dir: tempfile::TempDir,
    index: Index,
    deleted: HashSet<u64>,
    queries: Vec<Vec<f32>>,
}

fn meta(i: usize) -> ChunkMeta {
    // Skewed: `cli` is rare (2%), so filters on it go exact; others are large.
    let module = if i.is_multiple_of(50) {
        "cli"
    } else {
        MODULES[i % 4]
    };
    let mut metadata = BTreeMap::new();
    metadata.insert("module".to_string(), module.to_string());
    metadata.insert("tier".to_string(), (i % 3).to_string());
    ChunkMeta {
        path: format!("crates/{module}/src/f{}.rs", i % 17),
        start_line: 1,
        end_line: 2,
        language: LANGS[(i / 7) % 3].to_string(),
        metadata,
    }
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let vs = clustered_vectors(N + 64, DIM, 16, 3);
        let config = IndexConfig {
            dim: DIM,
            model: "generated".into(),
            hnsw: HnswParams {
                m: 12,
                ef_construction: 64,
                exact_below: 0,
                max_tombstone_ratio: 0.5,
                ..HnswParams::default()
            },
        };
        let index = Index::create(dir.path(), config).unwrap();
        let chunks: Vec<NewChunk> = (0..N)
            .map(|i| NewChunk {
                meta: meta(i),
                text: format!("chunk {i}"),
                vector: vs[i].clone(),
            })
            .collect();
        index.add_chunks(chunks).unwrap();
        // Tombstones: every 11th chunk.
        let deleted: HashSet<u64> = (0..N as u64).filter(|i| i % 11 == 5).collect();
        index
            .delete_chunks(&deleted.iter().copied().collect::<Vec<_>>())
            .unwrap();
        assert!(index.stats().tombstones > 0);
        Fixture {
            _dir: dir,
            index,
            deleted,
            queries: vs[N..].to_vec(),
        }
    })
}

fn filter_strategy() -> impl Strategy<Value = Filter> {
    prop_oneof![
        (0..MODULES.len()).prop_map(|i| Filter::module(MODULES[i])),
        (0..LANGS.len()).prop_map(|i| Filter::language(LANGS[i])),
        (0..MODULES.len()).prop_map(|i| Filter::path_prefix(format!("crates/{}/", MODULES[i]))),
        (0..3usize).prop_map(|t| Filter::eq("tier", t.to_string())),
        (0..MODULES.len(), 0..MODULES.len()).prop_map(|(a, b)| Filter::OneOf {
            key: "module".into(),
            values: vec![MODULES[a].into(), MODULES[b].into()],
        }),
        Just(Filter::eq("missing", "x")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn filtered_hits_never_leak(
        filters in proptest::collection::vec(filter_strategy(), 0..3),
        q in 0..64usize,
        k in 1..40usize,
        ef in prop_oneof![Just(None), (1..200usize).prop_map(Some)],
    ) {
        let f = fixture();
        let query = &f.queries[q];
        let opts = SearchOptions { ef, ..Default::default() };
        let hits = f.index.search(query, k, &filters, opts).unwrap();
        let exact = f.index.search_exact(query, k, &filters).unwrap();
        for h in hits.iter().chain(&exact) {
            prop_assert!(!f.deleted.contains(&h.id), "deleted id {} returned", h.id);
            let m = ChunkMeta {
                path: h.path.clone(),
                start_line: h.start_line,
                end_line: h.end_line,
                language: h.language.clone(),
                metadata: h.metadata.clone(),
            };
            for flt in &filters {
                prop_assert!(flt.matches(&m), "{:?} leaked {:?}", flt, h);
            }
        }
        prop_assert!(hits.len() <= k);
        // Scores are sorted and ids unique.
        prop_assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
        let ids: HashSet<u64> = hits.iter().map(|h| h.id).collect();
        prop_assert_eq!(ids.len(), hits.len());
        // As many hits as exact search finds (never fewer results than exist).
        prop_assert_eq!(hits.len(), exact.len());
    }
}

#[test]
fn min_score_and_per_value_filters() {
    let f = fixture();
    let q = &f.queries[0];
    let all = f
        .index
        .search(q, 20, &[], SearchOptions::default())
        .unwrap();
    let cut = all[5].score;
    let some = f
        .index
        .search(
            q,
            20,
            &[],
            SearchOptions {
                min_score: Some(cut),
                ..Default::default()
            },
        )
        .unwrap();
    assert!(some.len() >= 6 && some.iter().all(|h| h.score >= cut));
}
