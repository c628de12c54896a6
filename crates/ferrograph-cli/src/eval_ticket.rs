//! `ferrograph eval ticket-to-pr`: a SWE-style fix rate on real bugs of public Python
//! packages (`tests/eval/ticket-pr-cases.toml`). Per case and model: the buggy release's sdist
//! is downloaded (sha256-checked, cached), copied into a fresh git repository, the case's
//! ticket (our words, from the public report) is filed, the workflow runs to its review gate
//! in this process, the change is approved, and the test the real fix added (verified to fail
//! on the buggy release and pass on the fixed one) runs against the branch the workflow
//! made, in the sandbox. Results: `results.json`, `summary.md`, SVG plots.

use anyhow::{bail, Context, Result};
use ferrograph::prelude::*;
use ferrograph::runtime::JsonInput;
use ferrograph::Resume;
use ferrograph_ticket_pr::eval::{self, CaseResult, EvalCase, Summary};
use ferrograph_ticket_pr::{TicketPrSettings, TicketPrState, NAME};
use ferrograph_triage::eval::svg_bars;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// What `ferrograph eval ticket-to-pr` was asked to do.
#[derive(Debug, Clone, clap::Args)]
pub struct TicketEvalOptions {
    /// The case file.
    #[arg(long, default_value = "tests/eval/ticket-pr-cases.toml")]
    pub cases: PathBuf,
    /// A model to evaluate: a manifest name or a GGUF path. Repeat for several; default the
    /// workflow's chosen model.
    #[arg(long = "model")]
    pub models: Vec<String>,
    /// Only the cases marked `smoke` (two; what CI runs).
    #[arg(long)]
    pub smoke: bool,
    /// Only this case (repeatable).
    #[arg(long = "case")]
    pub only: Vec<String>,
    /// At most this many cases (after `--smoke` and `--case`), in the file's order.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Output folder: results.json, summary.md, plots, and each run's repository and record.
    #[arg(long, default_value = "eval-ticket-to-pr")]
    pub out: PathBuf,
    /// No download progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Runs the evaluation; returns the summaries (also written under `out`).
pub async fn run(opts: &TicketEvalOptions, default_model: &str) -> Result<Vec<Summary>> {
    let mut cases = eval::load_cases(&opts.cases)?;
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
    if let Some(n) = opts.limit {
        cases.truncate(n);
    }
    if cases.is_empty() {
        bail!("no cases to run in {}", opts.cases.display());
    }
    let models = if opts.models.is_empty() {
        vec![default_model.to_string()]
    } else {
        opts.models.clone()
    };
    let models: Vec<crate::eval::EvalModel> = models
        .iter()
        .map(|m| crate::eval::resolve_model(m))
        .collect::<Result<_>>()?;
    ferrograph_llm::manifest::ensure_model("all-minilm-l6-v2")?;
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("creating {}", opts.out.display()))?;
    let client = ferrograph_fetch::Client::new()?;
    let cache = ferrograph_fetch::cache_dir().join("ticket-eval");
    let mut sources = Vec::new();
    for case in &cases {
        let file = case
            .buggy_sdist_url
            .rsplit('/')
            .next()
            .unwrap_or("sdist.tar.gz")
            .to_string();
        let root = crate::eval::fetch_package(
            &client,
            &cache,
            &case.buggy_sdist_url,
            &file,
            Some(&case.buggy_sha256),
            &case.id,
            opts.quiet,
        )
        .with_context(|| format!("case {}", case.id))?;
        sources.push(root);
    }

    let mut all = Vec::new();
    let mut summaries = Vec::new();
    for m in &models {
        let Some(model) = m.model.clone() else {
            bail!("ticket to PR has no path without a model: name a model");
        };
        let mut results = Vec::new();
        for (i, (case, src)) in cases.iter().zip(&sources).enumerate() {
            let dir = opts
                .out
                .join("runs")
                .join(crate::eval::slug(&m.label))
                .join(&case.id);
            let r = match run_case(case, src, &dir, &m.label, model.clone()).await {
                Ok(r) => r,
                Err(e) => CaseResult {
                    case: case.id.clone(),
                    model: m.label.clone(),
                    note: format!("{e:#}"),
                    ..CaseResult::default()
                },
            };
            eprintln!(
                "[{}/{}] {} with {}: {}; gate {} after {:.0} s; changed {}; own tests {}; {}",
                i + 1,
                cases.len(),
                case.id,
                m.label,
                if r.fixed { "FIXED" } else { "not fixed" },
                if r.gate { "reached" } else { "not reached" },
                r.seconds_to_gate,
                if r.changed.is_empty() {
                    "nothing".to_string()
                } else {
                    r.changed.join(", ")
                },
                r.own_tests_label(),
                r.note
            );
            results.push(r);
        }
        summaries.push(eval::summarize(&m.label, &results));
        all.extend(results);
    }
    write_outputs(opts, &cases, &summaries, &all)?;
    Ok(summaries)
}

/// Copies `src` (an unpacked sdist) to `to`, files only, no links.
fn copy_tree(src: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let dest = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &dest)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &dest)?;
        }
    }
    Ok(())
}

async fn run_case(
    case: &EvalCase,
    src: &Path,
    dir: &Path,
    label: &str,
    model: Arc<dyn ferrograph_llm::ChatModel>,
) -> Result<CaseResult> {
    let mut r = CaseResult {
        case: case.id.clone(),
        model: label.to_string(),
        ..CaseResult::default()
    };
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let (repo, tickets, data) = (dir.join("repo"), dir.join("tickets"), dir.join("data"));
    copy_tree(src, &repo)?;
    eval::commit_all(&repo, &format!("{} {}", case.package, case.buggy_version))?;
    eval::write_ticket(&tickets, case)?;
    let rt = Runtime::new().await?;
    let mut registry = ferrograph::Registry::new();
    let settings = TicketPrSettings {
        data_dir: data.join(NAME),
        llm: Some(ferrograph_ticket_pr::code_llm(model, None)),
        make_embedder: ferrograph_index::embed::minilm(),
        crash_at: None,
        test_limits: Some(ferrograph_sandbox::Limits::default()),
    };
    ferrograph_ticket_pr::register_with(&mut registry, &rt, Arc::new(MemorySaver::new()), settings)
        .await?;
    let wf = registry
        .get(NAME)
        .map(|e| e.workflow.clone())
        .context("the workflow did not register")?;
    let input = json!({
        "ticket_key": eval::TICKET_KEY,
        "tickets": tickets.display().to_string(),
        "repo": repo.display().to_string(),
        "out": data.join("out").display().to_string(),
    });
    let started = Instant::now();
    let out = wf
        .invoke(JsonInput::Update(input), RunConfig::thread("eval"))
        .await?;
    r.seconds_to_gate = started.elapsed().as_secs_f64();
    let state: TicketPrState = serde_json::from_value(out.state.clone())?;
    std::fs::write(dir.join("messages.txt"), state.messages.join("\n"))?;
    std::fs::write(
        dir.join("state.json"),
        serde_json::to_string_pretty(&out.state)?,
    )?;
    r.record_run(&state);
    if out.status != "interrupted" {
        r.note = state
            .error
            .clone()
            .unwrap_or_else(|| format!("ended {} before the gate", out.status));
        return Ok(r);
    }
    r.gate = true;
    let done = wf
        .invoke(
            JsonInput::Resume(Resume::value(json!("approve"))),
            RunConfig::thread("eval"),
        )
        .await?;
    let state: TicketPrState = serde_json::from_value(done.state)?;
    if state.branch.is_empty() || state.error.is_some() {
        r.note = state
            .error
            .unwrap_or_else(|| "approval made no branch".into());
        return Ok(r);
    }
    let (files, changed) = eval::branch_files(&repo, &state.branch)?;
    r.record_branch(case, &changed, &files);
    let (fixed, output) = eval::judge(
        case,
        &files,
        &dir.join("judge"),
        &ferrograph_sandbox::Limits::default(),
    )
    .await?;
    r.fixed = fixed;
    r.test_output = output;
    Ok(r)
}

fn write_outputs(
    opts: &TicketEvalOptions,
    cases: &[EvalCase],
    summaries: &[Summary],
    results: &[CaseResult],
) -> Result<()> {
    let doc = json!({
        "cases_file": opts.cases.display().to_string(),
        "cases": cases.iter().map(|c| json!({
            "id": c.id, "package": c.package, "buggy_version": c.buggy_version,
            "fixed_version": c.fixed_version, "report_url": c.report_url,
            "fixed_files": c.fixed_files, "test_origin": c.test_origin,
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
    let table = eval::markdown(summaries, results);
    std::fs::write(opts.out.join("summary.md"), &table)?;
    let labels: Vec<String> = summaries.iter().map(|s| s.model.clone()).collect();
    let pick = |f: &dyn Fn(&Summary) -> f64| summaries.iter().map(f).collect::<Vec<f64>>();
    let plots = [
        (
            "fix_rate.svg",
            svg_bars(
                "Ticket to PR on real bugs: fixed, and on the way",
                "share of cases",
                &labels,
                &[
                    (
                        "fixed (the real fix's test passes)".into(),
                        pick(&|s| s.fix_rate),
                    ),
                    ("fixed file touched".into(), pick(&|s| s.fixed_file_touched)),
                    (
                        "own tests show the fix".into(),
                        pick(&|s| s.own_tests_show_fix),
                    ),
                    ("reached the gate".into(), pick(&|s| s.reached_gate)),
                ],
                1.0,
            ),
        ),
        (
            "seconds_to_gate.svg",
            svg_bars(
                "Seconds to the review gate",
                "seconds",
                &labels,
                &[
                    ("mean".into(), pick(&|s| s.mean_seconds_to_gate)),
                    ("slowest".into(), pick(&|s| s.max_seconds_to_gate)),
                ],
                0.0,
            ),
        ),
    ];
    for (name, svg) in plots {
        std::fs::write(opts.out.join(name), svg)?;
    }
    let first = table.split("\n\n").next().unwrap_or(&table);
    println!("{first}");
    println!(
        "results: {} (summary.md, results.json, fix_rate.svg, seconds_to_gate.svg, runs/)",
        opts.out.display()
    );
    Ok(())
}
