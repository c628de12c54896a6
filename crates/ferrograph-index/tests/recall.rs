//! Recall of the HNSW graph against exact search on 20,000 generated vectors, through the
//! public index API, before and after a reopen, with tombstones and with filters.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use ferrograph_index::bench::{clustered_vectors, exact_knn, recall, vector_chunks};
use ferrograph_index::{Filter, GraphSource, HnswParams, Index, IndexConfig, SearchOptions};

const N: usize = 20_000;
const DIM: usize = 64;
const K: usize = 10;

fn graph_recall(index: &Index, queries: &[Vec<f32>], truth: &[Vec<u64>], ef: usize) -> f64 {
    let got: Vec<Vec<u64>> = queries
        .iter()
        .map(|q| {
            index
                .search_ids_only(
                    q,
                    K,
                    &[],
                    SearchOptions {
                        ef: Some(ef),
                        ..Default::default()
                    },
                )
                .unwrap()
                .into_iter()
                .map(|x| x.0)
                .collect()
        })
        .collect();
    recall(truth, &got)
}

#[test]
fn recall_at_10_on_20k_vectors_survives_reopen_deletes_and_filters() {
    let dir = tempfile::tempdir().unwrap();
    let all = clustered_vectors(N + 200, DIM, 64, 7);
    let (base, queries) = all.split_at(N);
    let truth = exact_knn(base, queries, K);
    let config = IndexConfig {
        dim: DIM,
        model: "generated".into(),
        hnsw: HnswParams {
            m: 16,
            ef_construction: 100,
            exact_below: 0,
            ..HnswParams::default()
        },
    };
    let t = std::time::Instant::now();
    {
        let index = Index::create(dir.path(), config).unwrap();
        for batch in vector_chunks(base, 8).chunks(5000) {
            index.add_chunks(batch.to_vec()).unwrap();
        }
        index.save().unwrap();
        let r = graph_recall(&index, queries, &truth, 64);
        eprintln!("built {N} in {:?}: recall@10 {r:.4} at ef 64", t.elapsed());
        assert!(r >= 0.95, "recall@10 {r}");
    }

    // Reopen: the dump is current, so it is loaded (no rebuild) and answers the same.
    let index = Index::open(dir.path()).unwrap();
    assert_eq!(index.stats().graph_source, GraphSource::Loaded);
    assert_eq!(index.len(), N);
    let r = graph_recall(&index, queries, &truth, 64);
    assert!(r >= 0.95, "recall@10 after reopen {r}");

    // Delete every third vector: no deleted id is ever returned, recall against the exact
    // answer over the survivors holds.
    let dead: Vec<u64> = (0..N as u64).filter(|i| i % 3 == 0).collect();
    index.delete_chunks(&dead).unwrap();
    let stats = index.stats();
    // A third deleted is past the rebuild threshold: the graph was rebuilt without them.
    assert_eq!(stats.tombstones, 0, "{stats:?}");
    assert_eq!(stats.graph_points, N - dead.len());
    let keep: Vec<u64> = (0..N as u64).filter(|i| i % 3 != 0).collect();
    let survivors: Vec<Vec<f32>> = keep.iter().map(|i| base[*i as usize].clone()).collect();
    let truth2: Vec<Vec<u64>> = exact_knn(&survivors, queries, K)
        .into_iter()
        .map(|t| t.into_iter().map(|j| keep[j as usize]).collect())
        .collect();
    let got: Vec<Vec<u64>> = queries
        .iter()
        .map(|q| {
            index
                .search_ids_only(q, K, &[], SearchOptions::default())
                .unwrap()
                .into_iter()
                .map(|x| x.0)
                .collect()
        })
        .collect();
    assert!(got.iter().flatten().all(|id| id % 3 != 0));
    let r = recall(&truth2, &got);
    assert!(r >= 0.95, "recall after deletes {r}");

    // A few deletes stay tombstones (below the threshold) and are filtered out.
    let few: Vec<u64> = truth2.iter().take(20).map(|t| t[0]).collect();
    index.delete_chunks(&few).unwrap();
    assert!(index.stats().tombstones > 0);
    for q in queries.iter().take(50) {
        let hits = index
            .search_ids_only(q, K, &[], SearchOptions::default())
            .unwrap();
        assert_eq!(hits.len(), K);
        assert!(hits.iter().all(|(id, _)| !few.contains(id) && id % 3 != 0));
    }

    // Filtered search: module m3 (1/8 of the vectors: answered by the graph's filter or
    // exactly) never leaks another module and finds the exact answer's neighbours.
    let f = [Filter::module("m3")];
    let mut total = 0.0;
    for q in queries.iter().take(50) {
        let got = index.search(q, K, &f, SearchOptions::default()).unwrap();
        assert!(got.iter().all(|h| h.metadata["module"] == "m3"));
        let exact = index.search_exact(q, K, &f).unwrap();
        let ids: Vec<u64> = got.iter().map(|h| h.id).collect();
        total += exact.iter().filter(|h| ids.contains(&h.id)).count() as f64 / K as f64;
    }
    eprintln!("filtered recall@10 {:.4}", total / 50.0);
    assert!(total / 50.0 >= 0.95, "filtered recall {}", total / 50.0);
}
