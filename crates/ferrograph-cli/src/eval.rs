//! `ferrograph eval triage`: the triage workflow on real bugs from public packages. Each
//! case's buggy release is downloaded at run time (sha256-checked, unpacked into the
//! git-ignored cache), searched with plain lexical and plain vector search as baselines, then
//! triaged once per model; the measures go to `results.json`, a Markdown table and one SVG
//! plot per measure.

use anyhow::{bail, Context, Result};
use ferrograph::prelude::*;
use ferrograph::runtime::{JsonInput, Workflow};
use ferrograph_llm::{ChatModel, LocalChatModel};
use ferrograph_triage::eval::{
    baseline_query, load_cases, markdown_table, rank_of, summarize, svg_bars, CaseResult, EvalCase,
    ModelSummary,
};
use ferrograph_triage::{
    agents, llm::AgentLlm, retrieval, TriageSettings, TriageState, TriageWorkflow,
};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What `ferrograph eval triage` was asked to do.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// The case file.
    pub cases: PathBuf,
    /// Models: manifest names or GGUF paths; `none` runs without a model.
    pub models: Vec<String>,
    /// Only the cases marked `smoke`.
    pub smoke: bool,
    /// Only these case ids (all when empty).
    pub only: Vec<String>,
    /// Where results, table and plots go.
    pub out: PathBuf,
    /// No progress bars.
    pub quiet: bool,
}

/// A model under evaluation.
pub(crate) struct EvalModel {
    pub(crate) label: String,
    pub(crate) model: Option<Arc<dyn ChatModel>>,
}

pub(crate) fn resolve_model(spec: &str) -> Result<EvalModel> {
    if spec == "none" {
        return Ok(EvalModel {
            label: "none (evidence and retrieval only)".into(),
            model: None,
        });
    }
    let path = Path::new(spec);
    let (label, path) = if path.extension().is_some_and(|e| e == "gguf") {
        if !path.is_file() {
            bail!("model file {} not found", path.display());
        }
        (
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| spec.to_string()),
            path.to_path_buf(),
        )
    } else {
        (
            spec.to_string(),
            ferrograph_llm::manifest::ensure_model(spec)?,
        )
    };
    Ok(EvalModel {
        label,
        model: Some(Arc::new(LocalChatModel::new(path))),
    })
}

/// The cache folder of the evaluation (downloads, unpacked sources, indexes).
fn eval_cache() -> PathBuf {
    ferrograph_fetch::cache_dir().join("eval")
}

/// Downloads (or finds in the cache) and unpacks a case's buggy release; returns the
/// package's root folder.
fn prepare(client: &ferrograph_fetch::Client, case: &EvalCase, quiet: bool) -> Result<PathBuf> {
    fetch_package(
        client,
        &eval_cache(),
        &case.artifact_url,
        &case.artifact_file,
        Some(&case.sha256),
        &case.id,
        quiet,
    )
    .with_context(|| format!("case {}", case.id))
}

/// Downloads `url` (or finds it in `cache`/downloads as `file`, checked against `sha256`) and
/// unpacks it once into `cache`/src/`name`; returns the package's root folder.
pub(crate) fn fetch_package(
    client: &ferrograph_fetch::Client,
    cache: &Path,
    url: &str,
    file: &str,
    sha256: Option<&str>,
    name: &str,
    quiet: bool,
) -> Result<PathBuf> {
    let archive = cache.join("downloads").join(file);
    client
        .download(
            url,
            &archive,
            sha256,
            ferrograph_fetch::Progress::quiet_if(quiet),
        )
        .with_context(|| format!("downloading {url}"))?;
    let dest = cache.join("src").join(name);
    if !dest.is_dir() {
        ferrograph_fetch::unpack(&archive, &dest)
            .with_context(|| format!("unpacking {}", archive.display()))?;
    }
    Ok(package_root(&dest))
}

/// An archive's single top folder (`pkg-1.0/`), or the folder itself.
fn package_root(dir: &Path) -> PathBuf {
    let entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    match entries.as_slice() {
        [only] if only.is_dir() => only.clone(),
        _ => dir.to_path_buf(),
    }
}

fn settings(data: &Path, model: Option<Arc<dyn ChatModel>>) -> TriageSettings {
    TriageSettings {
        data_dir: data.to_path_buf(),
        llm: model.map(|m| AgentLlm::new(m, None)),
        max_iterations: 12,
        max_rounds: 2,
        tool_timeout: Duration::from_secs(30),
        embedder: retrieval::minilm(),
        team: Vec::new(),
        labels: agents::default_labels(),
    }
}

/// The text of the files a triage showed or named (the names in them are not invented).
fn code_of(root: &Path, s: &TriageState) -> String {
    let mut text = String::new();
    if let Some(c) = &s.codebase {
        for f in c.relevant_files.iter().take(6) {
            if let Ok(t) = std::fs::read_to_string(root.join(&f.path)) {
                text.push_str(&t);
                text.push('\n');
            }
        }
    }
    text
}

/// Runs the evaluation; returns the summaries (also written under `out`).
pub async fn run(opts: &EvalOptions) -> Result<Vec<ModelSummary>> {
    let mut cases = load_cases(&opts.cases)?;
    if opts.smoke {
        cases.retain(|c| c.smoke);
    }
    if !opts.only.is_empty() {
        if let Some(missing) = opts
            .only
            .iter()
            .find(|id| !cases.iter().any(|c| &c.id == *id))
        {
            bail!("no case `{missing}` in {}", opts.cases.display());
        }
        cases.retain(|c| opts.only.contains(&c.id));
    }
    if cases.is_empty() {
        bail!("no cases to run in {}", opts.cases.display());
    }
    let models = if opts.models.is_empty() {
        vec![ferrograph_llm::manifest::DEFAULT_CHAT_MODEL.to_string()]
    } else {
        opts.models.clone()
    };
    let models: Vec<EvalModel> = models
        .iter()
        .map(|m| resolve_model(m))
        .collect::<Result<_>>()?;
    ferrograph_llm::manifest::ensure_model("all-minilm-l6-v2")?;
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("creating {}", opts.out.display()))?;

    // Downloads and baselines (their search also builds each case's index, which the
    // triage runs then reuse).
    let client = ferrograph_fetch::Client::new()?;
    let data = eval_cache().join("data");
    let retrieval =
        retrieval::Retrieval::new(data.join("triage").join("indexes"), retrieval::minilm());
    let mut prepared = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let root = prepare(&client, case, opts.quiet)?;
        let folder = root.display().to_string();
        let started = Instant::now();
        let query = baseline_query(&case.title, &case.issue);
        let lexical = retrieval
            .lexical_baseline(&folder, &query)
            .await
            .map_err(|e| anyhow::anyhow!("case {}: {e}", case.id))?;
        let vector = retrieval
            .vector_baseline(&folder, &query)
            .await
            .map_err(|e| anyhow::anyhow!("case {}: {e}", case.id))?;
        let repo_files = retrieval
            .repo_files_with(&folder, None)
            .await
            .map_err(|e| anyhow::anyhow!("case {}: {e}", case.id))?;
        if let Some(f) = case
            .fixed_files
            .iter()
            .find(|f| !repo_files.iter().any(|r| r == *f))
        {
            bail!(
                "case {}: fixed file {f} is not among the {} indexed files of {}",
                case.id,
                repo_files.len(),
                root.display()
            );
        }
        let baselines = (
            rank_of(&lexical, &case.fixed_files),
            rank_of(&vector, &case.fixed_files),
        );
        eprintln!(
            "[{}/{}] {} {} {}: {} files indexed in {:.1} s; lexical rank {}, vector rank {}",
            i + 1,
            cases.len(),
            case.id,
            case.package,
            case.buggy_version,
            repo_files.len(),
            started.elapsed().as_secs_f64(),
            show_rank(baselines.0),
            show_rank(baselines.1)
        );
        prepared.push((case, root, repo_files, baselines));
    }

    // The workflows open the same indexes: the baselines' handles are closed first.
    drop(retrieval);
    let vocabulary = agents::default_labels();
    let mut all: Vec<CaseResult> = Vec::new();
    let mut summaries = Vec::new();
    for m in &models {
        let rt = Runtime::new().await?;
        let wf = TriageWorkflow::load(
            &rt,
            Arc::new(MemorySaver::new()),
            &settings(&data, m.model.clone()),
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut results = Vec::new();
        for (i, (case, root, repo_files, baselines)) in prepared.iter().enumerate() {
            let run_dir = opts.out.join("runs").join(slug(&m.label)).join(&case.id);
            std::fs::create_dir_all(&run_dir)?;
            let issue = run_dir.join("issue.md");
            std::fs::write(&issue, case.issue_markdown())?;
            let args: Vec<String> = vec![
                "--issue".into(),
                issue.display().to_string(),
                "--repo".into(),
                root.display().to_string(),
                "--out".into(),
                run_dir.display().to_string(),
            ];
            let input = ferrograph_triage::parse_args(&args)
                .map_err(|e| anyhow::anyhow!("case {}: {e}", case.id))?;
            let started = Instant::now();
            let thread = format!("eval-{}-{}", slug(&m.label), case.id);
            let out = wf
                .invoke(JsonInput::Update(input), RunConfig::thread(thread))
                .await
                .with_context(|| format!("case {} with {}", case.id, m.label))?;
            let seconds = started.elapsed().as_secs_f64();
            let s: TriageState = serde_json::from_value(out.state)?;
            let r = CaseResult::from_state(
                case,
                &m.label,
                &s,
                repo_files,
                &code_of(root, &s),
                &vocabulary,
                *baselines,
                seconds,
            );
            eprintln!(
                "[{}/{}] {} with {}: {} rank {} (lexical {}, vector {}); {} of {} fields degenerate, {} invented names, {} composed; {:.1} s",
                i + 1,
                prepared.len(),
                case.id,
                m.label,
                r.status,
                show_rank(r.rank),
                show_rank(r.lexical_rank),
                show_rank(r.vector_rank),
                r.text.degenerate(),
                r.text.fields.len(),
                r.text.invented(),
                r.text.composed,
                seconds
            );
            results.push(r);
        }
        summaries.push(summarize(&m.label, &results));
        all.extend(results);
    }

    write_outputs(opts, &cases, &summaries, &all)?;
    Ok(summaries)
}

fn show_rank(r: Option<usize>) -> String {
    r.map_or_else(|| "-".into(), |r| r.to_string())
}

pub(crate) fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn write_outputs(
    opts: &EvalOptions,
    cases: &[EvalCase],
    summaries: &[ModelSummary],
    results: &[CaseResult],
) -> Result<()> {
    let doc = json!({
        "cases_file": opts.cases.display().to_string(),
        "cases": cases.iter().map(|c| json!({
            "id": c.id, "package": c.package, "ecosystem": c.ecosystem,
            "buggy_version": c.buggy_version, "fixed_version": c.fixed_version,
            "report_url": c.report_url, "fixed_files": c.fixed_files,
        })).collect::<Vec<_>>(),
        "summaries": summaries,
        "results": results,
        "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "version": env!("CARGO_PKG_VERSION"),
    });
    std::fs::write(
        opts.out.join("results.json"),
        serde_json::to_string_pretty(&doc)?,
    )?;
    let table = markdown_table(summaries);
    let mut per_case = String::from(
        "\n| case | model | rank | lexical | vector | degenerate | invented | composed | s |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        per_case.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |\n",
            r.case,
            r.model,
            show_rank(r.rank),
            show_rank(r.lexical_rank),
            show_rank(r.vector_rank),
            r.text.degenerate(),
            r.text.invented(),
            r.text.composed,
            r.seconds
        ));
    }
    std::fs::write(opts.out.join("summary.md"), format!("{table}{per_case}"))?;
    let labels: Vec<String> = summaries.iter().map(|s| s.model.clone()).collect();
    let pick = |f: &dyn Fn(&ModelSummary) -> f64| summaries.iter().map(f).collect::<Vec<f64>>();
    let plots: Vec<(&str, String)> = vec![
        (
            "hit_at_1.svg",
            svg_bars(
                "hit@1: fixed file first",
                "share of cases",
                &labels,
                &[
                    ("triage workflow".into(), pick(&|s| s.hit1)),
                    ("plain lexical (BM25)".into(), pick(&|s| s.lexical_hit1)),
                    ("plain vector (MiniLM)".into(), pick(&|s| s.vector_hit1)),
                ],
                1.0,
            ),
        ),
        (
            "hit_at_5.svg",
            svg_bars(
                "hit@5: fixed file among the first five",
                "share of cases",
                &labels,
                &[
                    ("triage workflow".into(), pick(&|s| s.hit5)),
                    ("plain lexical (BM25)".into(), pick(&|s| s.lexical_hit5)),
                    ("plain vector (MiniLM)".into(), pick(&|s| s.vector_hit5)),
                ],
                1.0,
            ),
        ),
        (
            "text_quality.svg",
            svg_bars(
                "Text fields: degenerate or empty, composed in code, retried",
                "share of fields",
                &labels,
                &[
                    ("degenerate or empty".into(), pick(&|s| s.degenerate_rate)),
                    ("composed (fallback)".into(), pick(&|s| s.fallback_rate)),
                    ("model's second answer".into(), pick(&|s| s.retry_rate)),
                    ("schema-valid calls".into(), pick(&|s| s.schema_valid_rate)),
                ],
                1.0,
            ),
        ),
        (
            "invented_names.svg",
            svg_bars(
                "Invented names, labels, paths or people (all cases)",
                "count",
                &labels,
                &[("invented".into(), pick(&|s| s.invented_names as f64))],
                0.0,
            ),
        ),
        (
            "latency.svg",
            svg_bars(
                "Seconds per case (warm index)",
                "seconds",
                &labels,
                &[
                    ("mean".into(), pick(&|s| s.mean_seconds)),
                    ("slowest".into(), pick(&|s| s.max_seconds)),
                ],
                0.0,
            ),
        ),
    ];
    for (name, svg) in plots {
        std::fs::write(opts.out.join(name), svg)?;
    }
    println!("{table}");
    println!(
        "results: {} (summary.md, results.json, hit_at_1.svg, hit_at_5.svg, text_quality.svg, invented_names.svg, latency.svg)",
        opts.out.display()
    );
    Ok(())
}
