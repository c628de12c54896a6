//! `ferrograph index ...`: build, search, stats, list and remove named retrieval indexes
//! (under `<data dir>/indexes/<name>`), and the retrieval benches.

use anyhow::{Context, Result};
use clap::Subcommand;
use ferrograph_index::bench::{ann_bench, embed_bench, AnnBenchOptions};
use ferrograph_index::{
    index_dir, BertEmbedder, BuildOptions, EmbedOptions, Embedder, Filter, Index, IndexConfig,
    Query, Retriever, DEFAULT_EMBEDDING_MODEL,
};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Subcommand, Debug)]
pub enum IndexCommand {
    /// Indexes a folder into a named index (new and changed files only; removed files are
    /// dropped). Shows a progress bar on stderr.
    Build {
        /// Folder to index.
        dir: PathBuf,
        /// Index name.
        #[arg(long)]
        name: String,
        /// Embedding model: a name from models/models.toml or a model folder.
        #[arg(long, default_value = DEFAULT_EMBEDDING_MODEL)]
        model: String,
        /// Device: cpu, cuda or metal (default: FERROGRAPH_DEVICE, else cpu).
        #[arg(long)]
        device: Option<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Searches a named index.
    Search {
        /// Index name.
        name: String,
        /// Query text.
        query: String,
        /// key=value (also path_prefix=P, key=a|b); repeatable, all must hold.
        #[arg(long = "filter")]
        filters: Vec<String>,
        /// Hits.
        #[arg(long, default_value_t = 10)]
        k: usize,
        /// Drop hits scoring below this.
        #[arg(long)]
        min_score: Option<f32>,
        /// Search each value separately and merge: key=v1,v2,... (with --k-each).
        #[arg(long)]
        per: Option<String>,
        /// Hits per value of --per.
        #[arg(long, default_value_t = 3)]
        k_each: usize,
        /// Candidate list size.
        #[arg(long)]
        ef: Option<usize>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Prints an index's counts.
    Stats {
        /// Index name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Lists the indexes.
    List,
    /// Removes an index.
    Rm {
        /// Index name.
        name: String,
    },
    /// Index bench: build time, QPS and recall@10 at several ef, and exact search, on
    /// generated vectors written to --out for the peer (benches/peers/hnswlib_bench.py).
    BenchAnn {
        /// Vectors.
        #[arg(long, default_value_t = 100_000)]
        n: usize,
        /// Dimension.
        #[arg(long, default_value_t = 128)]
        dim: usize,
        /// Queries.
        #[arg(long, default_value_t = 1000)]
        queries: usize,
        /// HNSW M.
        #[arg(long, default_value_t = 16)]
        m: usize,
        /// HNSW ef_construction.
        #[arg(long, default_value_t = 200)]
        ef_construction: usize,
        /// ef values, comma-separated.
        #[arg(long, default_value = "16,32,64,128,256")]
        efs: String,
        /// Folder for the vectors and the index.
        #[arg(long)]
        out: PathBuf,
    },
    /// Embedding bench: sentences/s of MiniLM on our kernels for the sentences of a file (one
    /// per line), and on candle's `f32` BERT in alternating runs unless `--no-reference`, with
    /// the cosine between the two; writes our vectors for benches/peers/embed_bench.py to
    /// compare.
    BenchEmbed {
        /// Sentences, one per line.
        #[arg(long)]
        sentences: PathBuf,
        /// Batch size.
        #[arg(long, default_value_t = 32)]
        batch: usize,
        /// Timed runs (the best is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Write the vectors here (f32 rows).
        #[arg(long)]
        vectors_out: Option<PathBuf>,
        /// Skip candle's reference pass.
        #[arg(long)]
        no_reference: bool,
    },
}

fn index_path(data_dir: &Path, name: &str) -> Result<PathBuf> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        anyhow::bail!("invalid index name `{name}` (letters, digits, '-', '_', '.')");
    }
    Ok(data_dir.join("indexes").join(name))
}

fn load_embedder(model: &str, device: Option<&str>, batch: usize) -> Result<BertEmbedder> {
    let device = ferrograph_llm::DeviceKind::from_flag_or_env(device)?;
    let opts = EmbedOptions {
        device,
        batch_size: batch,
        ..EmbedOptions::default()
    };
    let p = Path::new(model);
    Ok(if p.join("config.json").exists() {
        BertEmbedder::load(p, opts)?
    } else {
        BertEmbedder::from_manifest(model, opts)?
    })
}

/// The embedder an existing index was built with.
fn embedder_for(index: &Index) -> Result<BertEmbedder> {
    let model = &index.config().model;
    load_embedder(model, None, 32).with_context(|| format!("loading the index's model `{model}`"))
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| anyhow::anyhow!("background task failed: {e}"))?
}

/// Runs an `index` subcommand.
pub async fn run(cmd: IndexCommand, data_dir: &Path) -> Result<ExitCode> {
    match cmd {
        IndexCommand::Build {
            dir,
            name,
            model,
            device,
            json,
        } => {
            let path = index_path(data_dir, &name)?;
            if !dir.is_dir() {
                anyhow::bail!("{} is not a folder", dir.display());
            }
            let report = blocking(move || {
                let embedder = load_embedder(&model, device.as_deref(), 32)?;
                std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
                let index = Index::open_or_create(
                    &path,
                    IndexConfig::new(embedder.dim(), embedder.model_id()),
                )?;
                let bar = indicatif::ProgressBar::new(0);
                bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                if let Ok(style) = indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} files, {msg}",
                ) {
                    bar.set_style(style);
                }
                let report = index_dir(
                    &index,
                    &embedder,
                    &dir,
                    &BuildOptions::default(),
                    &mut |p| {
                        bar.set_length(p.files_total as u64);
                        bar.set_position(p.files_done as u64);
                        bar.set_message(format!("{} chunks embedded", p.chunks_embedded));
                    },
                )?;
                bar.finish_and_clear();
                Ok((report, index.stats()))
            })
            .await?;
            let (report, stats) = report;
            if json {
                crate::print::line(serde_json::to_string_pretty(
                    &serde_json::json!({ "report": report, "stats": stats }),
                )?);
            } else {
                crate::print::line(format!(
                    "index `{name}`: {} files seen, {} indexed, {} unchanged, {} removed, {} skipped; \
                     {} chunks embedded in {:.1} s; {} chunks in {} documents",
                    report.files_seen,
                    report.files_indexed,
                    report.files_unchanged,
                    report.files_removed,
                    report.files_skipped,
                    report.chunks_embedded,
                    report.elapsed.as_secs_f64(),
                    stats.chunks,
                    stats.documents
                ));
            }
        }
        IndexCommand::Search {
            name,
            query,
            filters,
            k,
            min_score,
            per,
            k_each,
            ef,
            json,
        } => {
            let path = index_path(data_dir, &name)?;
            let mut q = Query::new(query);
            q.k = k;
            q.min_score = min_score;
            q.ef = ef;
            for f in &filters {
                q.filters.push(Filter::parse(f)?);
            }
            if let Some(per) = per {
                let (key, values) = per
                    .split_once('=')
                    .with_context(|| format!("--per `{per}` is not key=v1,v2"))?;
                q = q.per_filter(key, values.split(','), k_each);
            }
            let hits = blocking(move || {
                let index = Arc::new(Index::open(&path)?);
                let embedder = Arc::new(embedder_for(&index)?);
                let r = Retriever::new(index, embedder)?;
                Ok(r.search(&q)?)
            })
            .await?;
            if json {
                crate::print::line(serde_json::to_string_pretty(&hits)?);
            } else {
                for h in hits {
                    let first = h
                        .text
                        .lines()
                        .map(str::trim)
                        .find(|l| !l.is_empty())
                        .unwrap_or("")
                        .chars()
                        .take(80)
                        .collect::<String>();
                    crate::print::line(format!(
                        "{:.3}  {}:{}-{}  [{}]  {}",
                        h.score,
                        h.path,
                        h.start_line,
                        h.end_line,
                        h.metadata.get("module").map(String::as_str).unwrap_or(""),
                        first
                    ));
                }
            }
        }
        IndexCommand::Stats { name, json } => {
            let path = index_path(data_dir, &name)?;
            let stats = blocking(move || Ok(Index::open(&path)?.stats())).await?;
            if json {
                crate::print::line(serde_json::to_string_pretty(&stats)?);
            } else {
                crate::print::line(format!(
                    "index `{name}` at {}\n  chunks {}  documents {}  model {} ({} dims)\n  \
                     graph: {} points, {} tombstones, {} orphans, {:?}, saved {}\n  \
                     hnsw M {} ef_construction {} ef_search {}\n  generation {}  disk {:.1} MiB",
                    stats.dir.display(),
                    stats.chunks,
                    stats.documents,
                    stats.model,
                    stats.dim,
                    stats.graph_points,
                    stats.tombstones,
                    stats.orphans,
                    stats.graph_source,
                    stats.graph_saved,
                    stats.hnsw.m,
                    stats.hnsw.ef_construction,
                    stats.hnsw.ef_search,
                    stats.generation,
                    stats.disk_bytes as f64 / 1048576.0
                ));
            }
        }
        IndexCommand::List => {
            let root = data_dir.join("indexes");
            let mut names: Vec<String> = std::fs::read_dir(&root)
                .map(|rd| {
                    rd.flatten()
                        .filter(|e| ferrograph_index::is_index(&e.path()))
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            names.sort();
            for n in names {
                crate::print::line(n);
            }
        }
        IndexCommand::Rm { name } => {
            let path = index_path(data_dir, &name)?;
            if Index::remove(&path)? {
                crate::print::line(format!("removed index `{name}`"));
            } else {
                anyhow::bail!("no index named `{name}` in {}", data_dir.display());
            }
        }
        IndexCommand::BenchAnn {
            n,
            dim,
            queries,
            m,
            ef_construction,
            efs,
            out,
        } => {
            let efs = efs
                .split(',')
                .map(|s| s.trim().parse::<usize>())
                .collect::<Result<Vec<_>, _>>()
                .context("--efs must be comma-separated integers")?;
            let opts = AnnBenchOptions {
                n,
                dim,
                queries,
                m,
                ef_construction,
                efs,
                ..AnnBenchOptions::default()
            };
            let report = blocking(move || Ok(ann_bench(&opts, &out)?)).await?;
            crate::print::line(serde_json::to_string_pretty(&report)?);
        }
        IndexCommand::BenchEmbed {
            sentences,
            batch,
            runs,
            vectors_out,
            no_reference,
        } => {
            let text = std::fs::read_to_string(&sentences)
                .with_context(|| format!("reading {}", sentences.display()))?;
            let lines: Vec<String> = text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_string)
                .collect();
            let report = blocking(move || {
                let e = load_embedder(DEFAULT_EMBEDDING_MODEL, None, batch)?;
                let reference = if no_reference {
                    None
                } else {
                    Some(BertEmbedder::from_manifest(
                        DEFAULT_EMBEDDING_MODEL,
                        EmbedOptions {
                            batch_size: batch,
                            kernels: ferrograph_index::Kernels::Candle,
                            ..e.options()
                        },
                    )?)
                };
                Ok(embed_bench(
                    (e.backend_name(), &e),
                    reference
                        .as_ref()
                        .map(|r| (r.backend_name(), r as &dyn Embedder)),
                    &lines,
                    batch,
                    runs,
                    vectors_out.as_deref(),
                )?)
            })
            .await?;
            crate::print::line(serde_json::to_string_pretty(&report)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}
