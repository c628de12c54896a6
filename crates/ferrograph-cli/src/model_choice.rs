//! Which chat model each workflow runs on, and why: the user's choice when there is one
//! (`FERROGRAPH_<WORKFLOW>_MODEL`, `[workflows.NAME] model`, or a model for every workflow),
//! else the model its evaluation chose (`[[workflow_default]]` in `models/models.toml`), else
//! the fast tier (SmolLM2).

use crate::config::{Config, WORKFLOWS_WITH_MODELS};
use anyhow::{Context, Result};
use ferrograph_llm::manifest::{Manifest, DEFAULT_CHAT_MODEL};

/// What configures one model for every workflow, when something does: then no workflow takes
/// its evaluated default (the user chose).
fn global_choice(config: &Config) -> Option<String> {
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| format!("{name}={v}"))
    };
    env("FERROGRAPH_MODEL")
        .or_else(|| env("FERROGRAPH_PROVIDER"))
        .or_else(|| env("FERROGRAPH_CLUSTER_JOIN"))
        .or_else(|| {
            config
                .default_model
                .as_ref()
                .map(|m| format!("default model {m} (FERROGRAPH_DEFAULT_MODEL or the config file)"))
        })
        .or_else(|| {
            config
                .remote
                .as_ref()
                .map(|r| format!("the remote provider {} ({})", r.base_url, r.model))
        })
}

/// The evaluated default of `workflow` that applies (the user configured neither this
/// workflow's model nor one for all), with the manifest it came from.
fn pending_default(
    config: &Config,
    manifest: &Manifest,
    workflow: &str,
) -> Option<(String, String)> {
    if config.workflow_models.contains_key(workflow) || global_choice(config).is_some() {
        return None;
    }
    let d = manifest.workflow_default(workflow)?;
    Some((d.model.clone(), d.why.clone()))
}

/// Fetches (on first use, with progress unless `quiet`) the model the evaluation chose for
/// `workflow`, when that is the model the workflow will run on and it is not on disk yet.
pub(crate) fn fetch_for_run(config: &Config, workflow: &str, quiet: bool) -> Result<()> {
    let manifest = Manifest::default_manifest()?;
    let Some((model, _)) = pending_default(config, &manifest, workflow) else {
        return Ok(());
    };
    if manifest.is_present(&model) {
        return Ok(());
    }
    if !quiet {
        eprintln!("{workflow}: fetching its model {model} (first use)");
    }
    let fetched = if quiet {
        ferrograph_llm::manifest::fetch_models_with(std::slice::from_ref(&model), true)
    } else {
        ferrograph_llm::manifest::fetch_models(std::slice::from_ref(&model))
    };
    fetched.with_context(|| {
        let var = format!(
            "FERROGRAPH_{}_MODEL",
            workflow.to_ascii_uppercase().replace('-', "_")
        );
        format!(
            "fetching {model}, the model chosen for {workflow} by its evaluation (another \
             model: {var}=NAME or a GGUF path, e.g. {var}={DEFAULT_CHAT_MODEL})"
        )
    })
}

/// Puts each workflow's evaluated default into `config.workflow_models` where it applies and
/// the model is on disk (a missing one is fetched by [`fetch_for_run`] for the workflow that
/// runs; the others keep the fast tier rather than downloading every model at start).
pub(crate) fn apply_defaults(config: &mut Config) {
    // No manifest (a binary without its models folder): nothing was chosen.
    let Ok(manifest) = Manifest::default_manifest() else {
        return;
    };
    for workflow in WORKFLOWS_WITH_MODELS {
        let Some((model, why)) = pending_default(config, &manifest, workflow) else {
            continue;
        };
        if manifest.is_present(&model) {
            config
                .workflow_models
                .insert(workflow.to_string(), model.clone());
            config.workflow_model_source.insert(
                workflow.to_string(),
                format!("chosen by its evaluation: {why}"),
            );
        }
    }
}

/// The line a run prints about its model: which one and why. `None` for workflows that
/// take no chat model.
pub(crate) fn describe(config: &Config, workflow: &str) -> Option<String> {
    if !WORKFLOWS_WITH_MODELS.contains(&workflow) {
        return None;
    }
    if let Some(model) = config.workflow_models.get(workflow) {
        let source = config
            .workflow_model_source
            .get(workflow)
            .cloned()
            .unwrap_or_else(|| "configured".into());
        return Some(format!("model: {model} ({source})"));
    }
    if let Some(global) = global_choice(config) {
        return Some(format!("model: {global}"));
    }
    let pending = Manifest::default_manifest()
        .ok()
        .and_then(|m| pending_default(config, &m, workflow));
    let note = match pending {
        Some((model, _)) => format!(
            "; {model}, chosen by its evaluation, is not fetched: `ferrograph models fetch {model}`"
        ),
        None => String::new(),
    };
    Some(format!(
        "model: {DEFAULT_CHAT_MODEL} (the fast tier: the default when nothing else is chosen{note})"
    ))
}
