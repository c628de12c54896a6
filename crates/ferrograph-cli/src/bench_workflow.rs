//! `ferrograph bench workflow triage`: the triage workflow end to end on a local model, run
//! with the model's prefix cache off and on (the same input, the same warm index), reporting
//! end-to-end latency, latency and tokens per agent, and what the prefix cache saved.

use anyhow::{Context, Result};
use ferrograph::prelude::*;
use ferrograph::runtime::{JsonInput, Workflow};
use ferrograph_llm::{ChatModel, LoadOptions, LocalChatModel};
use ferrograph_triage::{llm::AgentLlm, retrieval, TriageSettings, TriageState, TriageWorkflow};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Totals of one agent over a run.
#[derive(Debug, Default, Serialize)]
pub struct AgentTotals {
    /// Runs of the agent.
    pub runs: u32,
    /// Wall time, summed.
    pub ms: u64,
    /// Model calls.
    pub calls: u32,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Prompt tokens served from the prefix cache.
    pub cached_prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
}

/// One measured run.
#[derive(Debug, Serialize)]
pub struct RunReport {
    /// Whether the prefix cache was on.
    pub prefix_cache: bool,
    /// End-to-end wall time.
    pub total_ms: u64,
    /// Per agent.
    pub agents: BTreeMap<String, AgentTotals>,
    /// Agent iterations.
    pub iterations: u32,
    /// Final status.
    pub status: String,
}

/// The whole bench.
#[derive(Debug, Serialize)]
pub struct WorkflowBench {
    /// Model file.
    pub model: String,
    /// Time to build (or refresh) the repository and docs indexes before the runs.
    pub index_ms: u64,
    /// Prefix cache off, then on.
    pub runs: Vec<RunReport>,
}

async fn one_run(
    data: &Path,
    model: &Path,
    prefix_cache: bool,
    input: serde_json::Value,
) -> Result<RunReport> {
    let load = LoadOptions {
        prefix_cache_entries: if prefix_cache { 4 } else { 0 },
        ..LoadOptions::default()
    };
    let llm: Arc<dyn ChatModel> = Arc::new(LocalChatModel::with_options(model, load));
    let settings = TriageSettings {
        data_dir: data.to_path_buf(),
        llm: Some(AgentLlm::new(llm, None)),
        max_iterations: 12,
        max_rounds: 2,
        tool_timeout: Duration::from_secs(30),
        embedder: retrieval::minilm(),
        team: Vec::new(),
        labels: ferrograph_triage::agents::default_labels(),
    };
    let rt = Runtime::new().await?;
    let wf = TriageWorkflow::load(&rt, Arc::new(MemorySaver::new()), &settings)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let started = Instant::now();
    let out = wf
        .invoke(
            JsonInput::Update(input),
            RunConfig::thread(if prefix_cache {
                "bench-cache"
            } else {
                "bench-nocache"
            }),
        )
        .await?;
    let total_ms = started.elapsed().as_millis() as u64;
    let s: TriageState = serde_json::from_value(out.state)?;
    let mut agents: BTreeMap<String, AgentTotals> = BTreeMap::new();
    for r in &s.agent_runs {
        let t = agents.entry(r.agent.clone()).or_default();
        t.runs += 1;
        t.ms += r.duration_ms;
        for c in &r.calls {
            t.calls += 1;
            t.prompt_tokens += c.prompt_tokens;
            t.cached_prompt_tokens += c.cached_prompt_tokens;
            t.completion_tokens += c.completion_tokens;
        }
    }
    Ok(RunReport {
        prefix_cache,
        total_ms,
        agents,
        iterations: s.iterations,
        status: s.status,
    })
}

/// Runs the bench on `issue`, `repo` and `docs` with the local `model`.
pub async fn bench_triage(
    model: &Path,
    issue: &Path,
    repo: &Path,
    docs: Option<&Path>,
) -> Result<WorkflowBench> {
    let dir = tempfile::tempdir()?;
    let mut args = vec![
        "--issue".to_string(),
        issue.display().to_string(),
        "--repo".into(),
        repo.display().to_string(),
        "--out".into(),
        dir.path().join("out").display().to_string(),
    ];
    if let Some(d) = docs {
        args.extend(["--docs".to_string(), d.display().to_string()]);
    }
    let input = ferrograph_triage::parse_args(&args).map_err(anyhow::Error::msg)?;
    // Build the indexes first, so both runs find them warm.
    let started = Instant::now();
    let r = retrieval::Retrieval::new(
        dir.path().join("triage").join("indexes"),
        retrieval::minilm(),
    );
    r.retriever(&repo.display().to_string())
        .await
        .map_err(anyhow::Error::msg)
        .context("indexing the repository")?;
    if let Some(d) = docs {
        r.retriever(&d.display().to_string())
            .await
            .map_err(anyhow::Error::msg)
            .context("indexing the docs")?;
    }
    let index_ms = started.elapsed().as_millis() as u64;
    drop(r);
    let mut runs = Vec::new();
    for cache in [false, true] {
        runs.push(one_run(dir.path(), model, cache, input.clone()).await?);
    }
    Ok(WorkflowBench {
        model: model.display().to_string(),
        index_ms,
        runs,
    })
}

/// A Markdown summary.
pub fn summary(b: &WorkflowBench) -> String {
    let mut s = format!(
        "triage on {} (indexes built in {} ms before the runs)\n\n",
        b.model, b.index_ms
    );
    s.push_str("| prefix cache | end-to-end ms | iterations | status |\n|---|---:|---:|---|\n");
    for r in &b.runs {
        s.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            if r.prefix_cache { "on" } else { "off" },
            r.total_ms,
            r.iterations,
            r.status
        ));
    }
    s.push_str("\n| agent | cache | runs | ms | calls | prompt tok | cached tok | generated tok |\n|---|---|---:|---:|---:|---:|---:|---:|\n");
    for r in &b.runs {
        for (name, t) in &r.agents {
            s.push_str(&format!(
                "| {name} | {} | {} | {} | {} | {} | {} | {} |\n",
                if r.prefix_cache { "on" } else { "off" },
                t.runs,
                t.ms,
                t.calls,
                t.prompt_tokens,
                t.cached_prompt_tokens,
                t.completion_tokens
            ));
        }
    }
    if let [off, on] = &b.runs[..] {
        let cached: u32 = on.agents.values().map(|t| t.cached_prompt_tokens).sum();
        let prompt: u32 = on.agents.values().map(|t| t.prompt_tokens).sum();
        s.push_str(&format!(
            "\nprefix cache: {cached} of {prompt} prompt tokens served from cache ({:.0}%); end to end {} ms → {} ms ({:+.1}%). The runs may take different paths (the critic's verdicts), so compare per-agent times too.\n",
            100.0 * f64::from(cached) / f64::from(prompt.max(1)),
            off.total_ms,
            on.total_ms,
            100.0 * (on.total_ms as f64 - off.total_ms as f64) / (off.total_ms.max(1) as f64)
        ));
    }
    s
}

/// The fixture paths under the repository root (`tests/fixtures/triage`).
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from("tests/fixtures/triage").join(rel)
}
