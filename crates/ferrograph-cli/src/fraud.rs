//! `ferrograph fraud …`: the fraud workflow's dataset and its store of finished
//! investigations (list, show, audit trail).

use anyhow::{Context, Result};
use clap::Subcommand;
use ferrograph_fraud::dataset::{generate, Dataset, DEFAULT_SEED};
use ferrograph_fraud::store::FraudStore;
use std::path::{Path, PathBuf};

/// What `ferrograph fraud` does.
#[derive(Subcommand, Debug)]
pub enum FraudCommand {
    /// Generates the synthetic transaction dataset (deterministic for a seed).
    GenData {
        /// Folder to write (default: <data dir>/fraud/data).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Seed.
        #[arg(long, default_value_t = DEFAULT_SEED)]
        seed: u64,
    },
    /// Lists the transactions pending review (the cases), with what was planted.
    Cases {
        /// Dataset folder (default: <data dir>/fraud/data; generated if missing).
        #[arg(long)]
        data: Option<PathBuf>,
    },
    /// Lists finished investigations.
    List,
    /// Prints one investigation: state, tool log, insights, recommendations, audit.
    Show {
        /// Investigation id (the thread id of its run).
        id: String,
    },
    /// Prints the audit trail (of one investigation, or all).
    Audit {
        /// Investigation id.
        id: Option<String>,
    },
}

/// Runs a `fraud` subcommand with `data_dir` as the data directory.
pub fn run(what: FraudCommand, data_dir: &Path) -> Result<()> {
    let default_data = data_dir.join("fraud").join("data");
    let store = || {
        let dir = data_dir.join("fraud").join("store");
        FraudStore::open(&dir).with_context(|| {
            format!(
                "opening the fraud store {} (is `ferrograph serve` holding it?)",
                dir.display()
            )
        })
    };
    match what {
        FraudCommand::GenData { out, seed } => {
            let dir = out.unwrap_or(default_data);
            let ds = generate(seed);
            ds.write(&dir)
                .with_context(|| format!("writing {}", dir.display()))?;
            let m = ds.manifest();
            crate::print::line(format!(
                "wrote {} accounts, {} merchants, {} transactions ({} labelled fraud), {} cases to {} (seed {seed})",
                m.accounts,
                m.merchants,
                m.transactions,
                ds.transactions.iter().filter(|t| t.fraud_label.is_some()).count(),
                m.cases,
                dir.display()
            ));
        }
        FraudCommand::Cases { data } => {
            let dir = data.unwrap_or(default_data);
            let ds = Dataset::load_or_generate(&dir, DEFAULT_SEED)
                .with_context(|| format!("loading {}", dir.display()))?;
            for c in &ds.cases {
                let t = ds.transaction(&c.transaction_id);
                crate::print::line(format!(
                    "{}  {:>9.2} EUR  {:<18} {}",
                    c.transaction_id,
                    t.map_or(0.0, |t| t.amount),
                    c.planted,
                    c.description
                ));
            }
        }
        FraudCommand::List => {
            for v in store()?.investigations()? {
                crate::print::line(format!(
                    "{:<28} {:<11} {:<10} {:<8} conf {:.3}  {}",
                    v["investigation_id"].as_str().unwrap_or("?"),
                    v["transaction_id"].as_str().unwrap_or("?"),
                    v["status"].as_str().unwrap_or("?"),
                    v["severity"].as_str().unwrap_or("?"),
                    v["confidence_score"].as_f64().unwrap_or(0.0),
                    v["completed_at"].as_str().unwrap_or("")
                ));
            }
        }
        FraudCommand::Show { id } => {
            let v = store()?.investigation(&id)?.with_context(|| {
                format!("no stored investigation `{id}` (see `ferrograph fraud list`)")
            })?;
            crate::print::line(serde_json::to_string_pretty(&v)?);
        }
        FraudCommand::Audit { id } => {
            for e in store()?.audit(id.as_deref())? {
                crate::print::line(serde_json::to_string(&e)?);
            }
        }
    }
    Ok(())
}
