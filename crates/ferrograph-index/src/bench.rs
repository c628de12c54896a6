//! Benchmark and test helpers: generated vectors, exact k-NN, recall, the index bench (beside
//! hnswlib, see `scripts/bench-index.sh`), the embedding bench (beside sentence-transformers)
//! and the deterministic operation sequence of the crash tests.

use crate::distance::{dot, normalize};
use crate::embed::Embedder;
use crate::error::{IndexError, Result};
use crate::index::{HnswParams, Index, IndexConfig, SearchOptions};
use crate::types::{ChunkMeta, DocumentUpdate, NewChunk};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// `n` unit vectors of `dim` dimensions around `clusters` random centres (Gaussian spread),
/// reproducible from `seed`.
pub fn clustered_vectors(n: usize, dim: usize, clusters: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut gauss = move || -> f32 {
        // Box-Muller
        let u1: f32 = rng.gen_range(f32::EPSILON..1.0);
        let u2: f32 = rng.gen_range(0.0..1.0);
        (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
    };
    let centres: Vec<Vec<f32>> = (0..clusters.max(1))
        .map(|_| {
            let mut c: Vec<f32> = (0..dim).map(|_| gauss()).collect();
            normalize(&mut c);
            c
        })
        .collect();
    (0..n)
        .map(|i| {
            let c = &centres[(i * 7919) % centres.len()];
            let mut v: Vec<f32> = c
                .iter()
                .map(|x| x + 0.35 * gauss() / (dim as f32).sqrt() * 3.0)
                .collect();
            normalize(&mut v);
            v
        })
        .collect()
}

/// Exact top-`k` indices of `data` for each query (parallel).
pub fn exact_knn(data: &[Vec<f32>], queries: &[Vec<f32>], k: usize) -> Vec<Vec<u64>> {
    queries
        .par_iter()
        .map(|q| {
            let mut s: Vec<(f32, u64)> = data
                .iter()
                .enumerate()
                .map(|(i, v)| (dot(q, v), i as u64))
                .collect();
            let k = k.min(s.len());
            if k == 0 {
                return Vec::new();
            }
            s.select_nth_unstable_by(k - 1, |a, b| {
                b.0.partial_cmp(&a.0)
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(a.1.cmp(&b.1))
            });
            s.truncate(k);
            s.sort_by(|a, b| {
                b.0.partial_cmp(&a.0)
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(a.1.cmp(&b.1))
            });
            s.into_iter().map(|x| x.1).collect()
        })
        .collect()
}

/// Mean fraction of each truth list found in the matching result list.
pub fn recall(truth: &[Vec<u64>], got: &[Vec<u64>]) -> f64 {
    if truth.is_empty() {
        return 1.0;
    }
    let mut total = 0.0;
    for (t, g) in truth.iter().zip(got) {
        if t.is_empty() {
            total += 1.0;
            continue;
        }
        let found = t.iter().filter(|x| g.contains(x)).count();
        total += found as f64 / t.len() as f64;
    }
    total / truth.len() as f64
}

/// Chunks carrying generated vectors: chunk `i` has path `vec/<i>`, module `m<i % modules>`.
pub fn vector_chunks(vectors: &[Vec<f32>], modules: usize) -> Vec<NewChunk> {
    vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let mut metadata = BTreeMap::new();
            metadata.insert("module".to_string(), format!("m{}", i % modules.max(1)));
            NewChunk {
                meta: ChunkMeta {
                    path: format!("vec/{i}"),
                    start_line: 1,
                    end_line: 1,
                    language: "vector".into(),
                    metadata,
                },
                text: format!("vector {i}"),
                vector: v.clone(),
            }
        })
        .collect()
}

/// Parameters of the index bench.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AnnBenchOptions {
    /// Vectors indexed.
    pub n: usize,
    /// Their dimension.
    pub dim: usize,
    /// Queries.
    pub queries: usize,
    /// Neighbours per query.
    pub k: usize,
    /// HNSW `M`.
    pub m: usize,
    /// HNSW `ef_construction`.
    pub ef_construction: usize,
    /// `ef` values measured.
    pub efs: Vec<usize>,
    /// Seed.
    pub seed: u64,
}

impl Default for AnnBenchOptions {
    fn default() -> Self {
        AnnBenchOptions {
            n: 100_000,
            dim: 128,
            queries: 1000,
            k: 10,
            m: 16,
            ef_construction: 200,
            efs: vec![16, 32, 64, 128, 256],
            seed: 42,
        }
    }
}

/// One `ef` setting's results.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EfResult {
    /// `ef`.
    pub ef: usize,
    /// Queries per second, one thread.
    pub qps: f64,
    /// Recall@k against exact search.
    pub recall: f64,
}

/// The index bench's results.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AnnBenchReport {
    /// Engine name.
    pub engine: String,
    /// Parameters.
    pub options: AnnBenchOptions,
    /// Seconds to build the HNSW graph from the vectors (all cores).
    pub build_graph_s: f64,
    /// Seconds to add the vectors to the index (sled commit, fsync, graph insert).
    pub build_total_s: f64,
    /// Per `ef`.
    pub results: Vec<EfResult>,
    /// Exact search (all vectors scanned), one thread.
    pub exact_qps: f64,
}

fn write_f32(path: &Path, rows: &[Vec<f32>]) -> Result<()> {
    let mut f =
        std::io::BufWriter::new(std::fs::File::create(path).map_err(|e| IndexError::io(path, e))?);
    for r in rows {
        for x in r {
            f.write_all(&x.to_le_bytes())
                .map_err(|e| IndexError::io(path, e))?;
        }
    }
    f.flush().map_err(|e| IndexError::io(path, e))
}

/// Runs the index bench: generates vectors, writes them (and the queries and exact answers)
/// under `out` for the peers (`base.f32`, `queries.f32`, `truth.u64`, `params.json`), builds
/// an index in `out/index`, then measures one-thread QPS and recall at each `ef` and exact
/// search.
pub fn ann_bench(opts: &AnnBenchOptions, out: &Path) -> Result<AnnBenchReport> {
    std::fs::create_dir_all(out).map_err(|e| IndexError::io(out, e))?;
    let all = clustered_vectors(opts.n + opts.queries, opts.dim, 64, opts.seed);
    let (base, queries) = all.split_at(opts.n);
    let truth = exact_knn(base, queries, opts.k);
    write_f32(&out.join("base.f32"), base)?;
    write_f32(&out.join("queries.f32"), queries)?;
    {
        let p = out.join("truth.u64");
        let bytes: Vec<u8> = truth
            .iter()
            .flatten()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        std::fs::write(&p, bytes).map_err(|e| IndexError::io(&p, e))?;
        let p = out.join("params.json");
        let j = serde_json::to_vec_pretty(opts).map_err(|e| IndexError::corrupt(&p, e))?;
        std::fs::write(&p, j).map_err(|e| IndexError::io(&p, e))?;
    }
    let dir = out.join("index");
    let _ = std::fs::remove_dir_all(&dir);
    let config = IndexConfig {
        dim: opts.dim,
        model: "bench".into(),
        hnsw: HnswParams {
            m: opts.m,
            ef_construction: opts.ef_construction,
            ef_search: 64,
            exact_below: 0,
            ..HnswParams::default()
        },
    };
    let index = Index::create(&dir, config)?;
    let t = Instant::now();
    for batch in vector_chunks(base, 16).chunks(4096) {
        index.add_chunks(batch.to_vec())?;
    }
    let build_total_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    index.rebuild_graph();
    let build_graph_s = t.elapsed().as_secs_f64();
    // Chunk ids are assigned in order from 0, so they equal the vector indices.
    let mut results = Vec::new();
    for &ef in &opts.efs {
        let so = SearchOptions {
            ef: Some(ef),
            ..Default::default()
        };
        // Warm up.
        for q in queries.iter().take(20) {
            index.search_ids_only(q, opts.k, &[], so)?;
        }
        let t = Instant::now();
        let mut got = Vec::with_capacity(queries.len());
        for q in queries {
            got.push(
                index
                    .search_ids_only(q, opts.k, &[], so)?
                    .into_iter()
                    .map(|x| x.0)
                    .collect::<Vec<u64>>(),
            );
        }
        let secs = t.elapsed().as_secs_f64();
        results.push(EfResult {
            ef,
            qps: queries.len() as f64 / secs,
            recall: recall(&truth, &got),
        });
    }
    let nq = queries.len().min(200);
    let t = Instant::now();
    for q in &queries[..nq] {
        index.search_ids_only(
            q,
            opts.k,
            &[],
            SearchOptions {
                exact: true,
                ..Default::default()
            },
        )?;
    }
    let exact_qps = nq as f64 / t.elapsed().as_secs_f64();
    Ok(AnnBenchReport {
        engine: "ferrograph-index (hnsw_rs)".into(),
        options: opts.clone(),
        build_graph_s,
        build_total_s,
        results,
        exact_qps,
    })
}

/// The embedding bench's results.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EmbedBenchReport {
    /// Model id.
    pub model: String,
    /// Which forward pass was measured (`kernels` or `candle`).
    pub engine: String,
    /// Sentences embedded.
    pub sentences: usize,
    /// Batch size.
    pub batch_size: usize,
    /// Seconds (best of the runs).
    pub seconds: f64,
    /// Sentences per second.
    pub sentences_per_s: f64,
    /// The reference forward pass, measured in the same runs (alternating), when asked for.
    pub reference: Option<EmbedReference>,
}

/// The reference engine's figures in [`EmbedBenchReport`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EmbedReference {
    /// Which forward pass.
    pub engine: String,
    /// Seconds (best of the runs).
    pub seconds: f64,
    /// Sentences per second.
    pub sentences_per_s: f64,
    /// Mean cosine between the two engines' vectors of each sentence.
    pub cosine_mean: f64,
    /// Smallest such cosine.
    pub cosine_min: f64,
}

/// Embeds `sentences` `runs` times (after one warm-up batch) with `embedder` and, in
/// alternating runs, with `reference` when given, and reports the best run of each and how
/// close their vectors are; writes `embedder`'s vectors to `vectors_out` (f32 little-endian
/// rows) when given, so the peer can compare.
pub fn embed_bench(
    embedder: (&str, &dyn Embedder),
    reference: Option<(&str, &dyn Embedder)>,
    sentences: &[String],
    batch_size: usize,
    runs: usize,
    vectors_out: Option<&Path>,
) -> Result<EmbedBenchReport> {
    let refs: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let time = |e: &dyn Embedder| -> Result<(f64, Vec<Vec<f32>>)> {
        let t = Instant::now();
        let v = e.embed(&refs)?;
        Ok((t.elapsed().as_secs_f64(), v))
    };
    embedder.1.embed(&refs[..refs.len().min(8)])?;
    if let Some((_, r)) = reference {
        r.embed(&refs[..refs.len().min(8)])?;
    }
    let (mut best, mut best_ref) = (f64::INFINITY, f64::INFINITY);
    let (mut vectors, mut ref_vectors) = (Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        let (s, v) = time(embedder.1)?;
        (best, vectors) = (best.min(s), v);
        if let Some((_, r)) = reference {
            let (s, v) = time(r)?;
            (best_ref, ref_vectors) = (best_ref.min(s), v);
        }
    }
    if let Some(p) = vectors_out {
        write_f32(p, &vectors)?;
    }
    let reference = reference.map(|(name, _)| {
        let cos: Vec<f64> = vectors
            .iter()
            .zip(&ref_vectors)
            .map(|(a, b)| f64::from(dot(a, b)))
            .collect();
        EmbedReference {
            engine: name.to_string(),
            seconds: best_ref,
            sentences_per_s: sentences.len() as f64 / best_ref,
            cosine_mean: cos.iter().sum::<f64>() / cos.len().max(1) as f64,
            cosine_min: cos.iter().copied().fold(f64::INFINITY, f64::min),
        }
    });
    Ok(EmbedBenchReport {
        model: embedder.1.model_id().to_string(),
        engine: embedder.0.to_string(),
        sentences: sentences.len(),
        batch_size,
        seconds: best,
        sentences_per_s: sentences.len() as f64 / best,
        reference,
    })
}

/// The index configuration of the crash tests (small dimension, the graph always used).
pub fn crash_config() -> IndexConfig {
    IndexConfig {
        dim: 32,
        model: "hash-32".into(),
        hnsw: HnswParams {
            m: 8,
            ef_construction: 64,
            ef_search: 64,
            exact_below: 0,
            max_tombstone_ratio: 0.3,
        },
    }
}

/// One operation of the crash-test sequence.
#[derive(Clone, Debug)]
pub enum CrashOp {
    /// Replace documents.
    Upsert(Vec<DocumentUpdate>),
    /// Delete documents.
    Delete(Vec<String>),
    /// Append chunks.
    Add(Vec<NewChunk>),
    /// Save the graph.
    Save,
    /// Rebuild the graph, then save it.
    Rebuild,
}

const WORDS: [&str; 16] = [
    "graph",
    "node",
    "edge",
    "checkpoint",
    "thread",
    "model",
    "token",
    "index",
    "vector",
    "search",
    "filter",
    "module",
    "crash",
    "sled",
    "write",
    "read",
];

fn crash_chunk(
    embedder: &dyn Embedder,
    path: &str,
    module: String,
    text: String,
) -> Result<NewChunk> {
    let vector = embedder
        .embed(&[text.as_str()])?
        .into_iter()
        .next()
        .unwrap_or_default();
    let mut metadata = BTreeMap::new();
    metadata.insert("module".to_string(), module);
    Ok(NewChunk {
        meta: ChunkMeta {
            path: path.to_string(),
            start_line: 1,
            end_line: 1,
            language: "text".into(),
            metadata,
        },
        text,
        vector,
    })
}

/// The deterministic operation number `step` of the crash tests. Embedding failures (the
/// hash embedder has none) yield an empty upsert.
pub fn crash_ops(step: usize, embedder: &dyn Embedder) -> CrashOp {
    let words = |a: usize, n: usize| -> String {
        (0..n)
            .map(|i| WORDS[(a * 31 + i * 7) % WORDS.len()])
            .collect::<Vec<_>>()
            .join(" ")
    };
    if step % 10 == 4 {
        return CrashOp::Save;
    }
    if step % 23 == 22 {
        return CrashOp::Rebuild;
    }
    if step % 7 == 3 {
        return CrashOp::Delete(vec![format!("docs/d{}.txt", (step * 5) % 24)]);
    }
    if step % 11 == 6 {
        let path = format!("adds/a{}.txt", step % 3);
        let chunks = (0..2)
            .filter_map(|c| {
                crash_chunk(
                    embedder,
                    &path,
                    "adds".into(),
                    format!("add {step} {c} {}", words(step + c, 5)),
                )
                .ok()
            })
            .collect();
        return CrashOp::Add(chunks);
    }
    let mut js = vec![step % 24, (step * 7 + 3) % 24];
    js.dedup();
    let docs = js
        .into_iter()
        .map(|j| {
            let path = format!("docs/d{j}.txt");
            let n = 1 + (step + j) % 6;
            let chunks = (0..n)
                .filter_map(|c| {
                    crash_chunk(
                        embedder,
                        &path,
                        format!("m{}", j % 4),
                        format!(
                            "doc {j} version {step} chunk {c} {}",
                            words(step * 3 + j + c, 6)
                        ),
                    )
                    .ok()
                })
                .collect();
            DocumentUpdate {
                path,
                content_hash: format!("v{step}"),
                chunks,
            }
        })
        .collect();
    CrashOp::Upsert(docs)
}

/// The documents (path → chunk texts, sorted) after applying crash steps `0..steps`.
pub fn crash_model(steps: usize, embedder: &dyn Embedder) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in 0..steps {
        match crash_ops(s, embedder) {
            CrashOp::Upsert(docs) => {
                for d in docs {
                    m.insert(d.path, d.chunks.into_iter().map(|c| c.text).collect());
                }
            }
            CrashOp::Delete(paths) => {
                for p in paths {
                    m.remove(&p);
                }
            }
            CrashOp::Add(chunks) => {
                for c in chunks {
                    m.entry(c.meta.path).or_default().push(c.text);
                }
            }
            CrashOp::Save | CrashOp::Rebuild => {}
        }
    }
    m.retain(|_, v| !v.is_empty());
    for v in m.values_mut() {
        v.sort();
    }
    m
}

/// The documents an index holds (path → chunk texts, sorted), as [`crash_model`] lists them.
pub fn index_contents(index: &Index) -> Result<BTreeMap<String, Vec<String>>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for id in index.ids() {
        if let Some(h) = index.get(id)? {
            m.entry(h.path).or_default().push(h.text);
        }
    }
    for v in m.values_mut() {
        v.sort();
    }
    Ok(m)
}
