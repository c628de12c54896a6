//! The real all-MiniLM-L6-v2 from `models/` (fetched by `scripts/fetch-models.sh`; fetched
//! here when missing, and a clear failure in CI when that fails): embeddings, and this
//! repository's own sources (three crates' `src` and the README) chunked, embedded and indexed:
//! recall@10 of the graph against exact search, sensible answers, filters, and reopening
//! without re-embedding.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use ferrograph_index::build::{chunk_file, collect_files, content_hash, embedding_text};
use ferrograph_index::{
    BertEmbedder, BuildOptions, CountingEmbedder, DocumentUpdate, EmbedOptions, Embedder, Filter,
    GraphSource, HnswParams, Index, IndexConfig, NewChunk, Query, Retriever, SearchOptions,
    DEFAULT_EMBEDDING_MODEL,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

fn embedder() -> Option<Arc<CountingEmbedder<BertEmbedder>>> {
    static E: OnceLock<Option<Arc<CountingEmbedder<BertEmbedder>>>> = OnceLock::new();
    E.get_or_init(|| {
        match BertEmbedder::from_manifest(
            DEFAULT_EMBEDDING_MODEL,
            // 128 tokens per chunk (not 256) halves the cost of embedding the repository on
            // CI's 2 cores; recall and filters do not depend on it.
            EmbedOptions {
                max_tokens: 128,
                ..EmbedOptions::default()
            },
        ) {
            Ok(e) => Some(Arc::new(CountingEmbedder::new(e))),
            Err(e) => {
                if std::env::var_os("CI").is_some() {
                    panic!("cannot load {DEFAULT_EMBEDDING_MODEL} in CI (run scripts/fetch-models.sh): {e}");
                }
                eprintln!(
                    "\n\n!!!!!! SKIPPING MiniLM TESTS: {e}\n!!!!!! run scripts/fetch-models.sh {DEFAULT_EMBEDDING_MODEL}\n"
                );
                None
            }
        }
    })
    .clone()
}

macro_rules! embedder_or_skip {
    () => {
        match embedder() {
            Some(e) => e,
            None => return,
        }
    };
}

fn cos(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn minilm_embeddings_are_unit_batched_consistently_and_semantic() {
    let e = embedder_or_skip!();
    assert_eq!(e.dim(), 384);
    let texts = [
        "The cat sits on the mat.",
        "A kitten is resting on a rug.",
        "Quarterly revenue grew by twelve percent.",
        "fn main() { println!(\"hello\"); }",
        "",
    ];
    let batch = e.embed(&texts).unwrap();
    for v in &batch {
        assert!((cos(v, v) - 1.0).abs() < 1e-4);
    }
    // Batching (padding, length sorting) does not change a text's vector.
    for (t, v) in texts.iter().zip(&batch) {
        let alone = &e.embed(&[t]).unwrap()[0];
        assert!(cos(alone, v) > 0.9999, "{t:?}: {}", cos(alone, v));
    }
    assert!(
        cos(&batch[0], &batch[1]) > 0.5,
        "{}",
        cos(&batch[0], &batch[1])
    );
    assert!(cos(&batch[0], &batch[1]) > cos(&batch[0], &batch[2]) + 0.3);
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

/// The crates whose sources make the test corpus: a fixed set, so that the test's cost does not
/// grow with the repository (all crates took 200 s to embed on CI's 2 cores).
const CORPUS_CRATES: [&str; 3] = [
    "ferrograph-core",
    "ferrograph-runtime",
    "ferrograph-checkpoint",
];

/// [`CORPUS_CRATES`]' `src/**/*.rs` and README.md as documents.
fn corpus(e: &dyn Embedder) -> Vec<DocumentUpdate> {
    let root = repo_root();
    let opts = BuildOptions::default();
    let mut files = Vec::new();
    for krate in CORPUS_CRATES {
        let mut found = collect_files(&root.join("crates").join(krate).join("src"), &opts).unwrap();
        found.retain(|(_, rel)| rel.ends_with(".rs"));
        for (_, rel) in &mut found {
            *rel = format!("crates/{krate}/src/{rel}");
        }
        files.extend(found);
    }
    files.push((root.join("README.md"), "README.md".into()));
    let mut docs = Vec::new();
    let mut texts = Vec::new();
    for (abs, rel) in &files {
        let Ok(text) = std::fs::read_to_string(abs) else {
            continue;
        };
        let chunks = chunk_file(rel, &text, &opts.chunk);
        for (m, t) in &chunks {
            texts.push(embedding_text(m, t));
        }
        docs.push((rel.clone(), content_hash(&text), chunks));
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let t = std::time::Instant::now();
    let mut vectors = e.embed(&refs).unwrap().into_iter();
    eprintln!(
        "embedded {} chunks of {} files in {:?}",
        refs.len(),
        docs.len(),
        t.elapsed()
    );
    docs.into_iter()
        .map(|(path, hash, chunks)| DocumentUpdate {
            path,
            content_hash: hash,
            chunks: chunks
                .into_iter()
                .map(|(meta, text)| NewChunk {
                    meta,
                    text,
                    vector: vectors.next().unwrap(),
                })
                .collect(),
        })
        .collect()
}

const QUERIES: [&str; 20] = [
    "where are checkpoints written to sled",
    "how does the runtime schedule supersteps",
    "parse the command line arguments",
    "HTTP server routes and authentication token",
    "sampling temperature top-k top-p",
    "chat template rendering with minijinja",
    "load a GGUF model file",
    "resume an interrupted thread",
    "fork a thread at a checkpoint",
    "stream events to the client",
    "graph compile error unknown node",
    "schema migration of stored state",
    "benchmark the graph overhead",
    "tool call timeout",
    "configuration from environment variables",
    "hnsw graph dump fsync rename",
    "mean pooling attention mask normalize",
    "retry with backoff on rate limit",
    "reducer that appends messages",
    "how to run the tests",
];

#[test]
fn repository_corpus_recall_filters_and_reopen_without_reembedding() {
    let e = embedder_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let config = IndexConfig {
        dim: e.dim(),
        model: e.model_id().to_string(),
        hnsw: HnswParams {
            exact_below: 0,
            ..HnswParams::default()
        },
    };
    let docs = corpus(e.as_ref());
    let n_chunks: usize = docs.iter().map(|d| d.chunks.len()).sum();
    assert!(n_chunks > 500, "corpus too small: {n_chunks}");
    {
        let index = Index::create(dir.path(), config).unwrap();
        index.upsert_documents(docs).unwrap();
        index.save().unwrap();
    }
    let before = e.texts();

    // Reopen: the graph is loaded, nothing is embedded.
    let index = Arc::new(Index::open(dir.path()).unwrap());
    assert_eq!(index.stats().graph_source, GraphSource::Loaded);
    assert_eq!(index.len(), n_chunks);
    assert_eq!(e.texts(), before, "reopening embedded something");
    // Even a rebuild of the graph uses the stored vectors.
    index.rebuild_graph();
    assert_eq!(e.texts(), before);

    let retriever = Retriever::new(index.clone(), e.clone() as Arc<dyn Embedder>).unwrap();
    let qv = e.embed(&QUERIES).unwrap();
    // Queries: the natural-language ones and 80 chunks' own first lines.
    let mut queries: Vec<Vec<f32>> = qv.clone();
    let ids = index.ids();
    let probes: Vec<String> = ids
        .iter()
        .step_by((ids.len() / 80).max(1))
        .take(80)
        .map(|id| {
            index
                .get(*id)
                .unwrap()
                .unwrap()
                .text
                .lines()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let probe_refs: Vec<&str> = probes.iter().map(String::as_str).collect();
    queries.extend(e.embed(&probe_refs).unwrap());
    let mut total = 0.0;
    for q in &queries {
        let got = index
            .search_ids_only(q, 10, &[], SearchOptions::default())
            .unwrap();
        let exact = index
            .search_ids_only(
                q,
                10,
                &[],
                SearchOptions {
                    exact: true,
                    ..Default::default()
                },
            )
            .unwrap();
        let g: Vec<u64> = got.iter().map(|x| x.0).collect();
        total += exact.iter().filter(|x| g.contains(&x.0)).count() as f64 / exact.len() as f64;
    }
    let recall = total / queries.len() as f64;
    eprintln!(
        "repository corpus: {n_chunks} chunks, recall@10 {recall:.4} over {} queries",
        queries.len()
    );
    assert!(recall >= 0.95, "recall@10 {recall}");

    // Sensible answers.
    let hits = retriever
        .search(&Query::new("where are checkpoints written to sled").k(5))
        .unwrap();
    assert!(
        hits.iter().any(|h| h.path.contains("checkpoint")),
        "{:#?}",
        hits.iter().map(|h| &h.path).collect::<Vec<_>>()
    );
    assert!(hits
        .iter()
        .all(|h| h.start_line >= 1 && h.end_line >= h.start_line));

    // Filters: per module, with a global merge, and a minimum score.
    let modules = CORPUS_CRATES;
    let q = Query::new("error type with thiserror")
        .k(9)
        .per_filter("module", modules, 3);
    let hits = retriever.search(&q).unwrap();
    assert_eq!(hits.len(), 9);
    for m in modules {
        assert_eq!(
            hits.iter().filter(|h| h.metadata["module"] == m).count(),
            3,
            "{m}"
        );
    }
    assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
    let hits = retriever
        .search(
            &Query::new("tokenizer")
                .k(10)
                .filter(Filter::language("markdown")),
        )
        .unwrap();
    assert!(hits
        .iter()
        .all(|h| h.language == "markdown" && h.path == "README.md"));
    let hits = retriever
        .search(&Query::new("tokenizer").k(50).min_score(0.99))
        .unwrap();
    assert!(hits.iter().all(|h| h.score >= 0.99));

    // Async path.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let hits = rt
        .block_on(retriever.search_async(Query::new("load a GGUF model").k(3)))
        .unwrap();
    assert_eq!(hits.len(), 3);
}
