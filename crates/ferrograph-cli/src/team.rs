//! `ferrograph team …`: the team workflow's fixture brief and its runs' records (the run's
//! folder and the event bus).

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use ferrograph_team::bus::TeamStore;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// What `ferrograph team` does.
#[derive(Subcommand, Debug)]
pub enum TeamCommand {
    /// Writes the fixture briefs under DIR: `wordstats/` (a brief with a reference
    /// implementation), `wordstats-no-reference.md` and `vague.md`.
    Fixture {
        /// Folder to write into.
        dir: PathBuf,
    },
    /// A run's state: lifecycle, stories, design, code, quality, deployment, blockers.
    Show {
        /// The run (its thread id).
        run: String,
        /// The folder given as `--out` when the run started (default: the data folder's).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// A run's audit trail, with the output of every test run.
    Audit {
        /// The run (its thread id).
        run: String,
        /// The folder given as `--out` when the run started.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The agents' conversations with their model in a run (the conversation store).
    Memory {
        /// The run (its thread id).
        run: String,
        /// Only this agent (`po_agent`, `sse_agent`, …).
        #[arg(long)]
        agent: Option<String>,
    },
    /// A run's messages in dispatch order, with their recipients and delivery attempts.
    Events {
        /// The run (its thread id).
        run: String,
        /// The folder given as `--out` when the run started.
        #[arg(long)]
        out: Option<PathBuf>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
}

fn run_dir(data_dir: &Path, run: &str, out: Option<&Path>) -> Result<PathBuf> {
    if run.is_empty() || run.contains('/') || run.contains("..") {
        bail!("`{run}` is not a run id");
    }
    let dir = match out {
        Some(o) => o.join(run),
        None => data_dir.join(ferrograph_team::NAME).join("runs").join(run),
    };
    if !dir.is_dir() {
        bail!(ferrograph_team::TeamError::UnknownRun(run.to_string()));
    }
    Ok(dir)
}

fn jsonl(path: &Path) -> Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("a line of {}", path.display())))
        .collect()
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Prints `text`; a closed pipe (`ferrograph team audit RUN | head`) is not an error.
fn emit(text: &str) -> Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Runs `ferrograph team`.
pub fn run(what: TeamCommand, data_dir: &Path) -> Result<()> {
    let mut o = String::new();
    report(what, data_dir, &mut o)?;
    emit(&o)
}

fn report(what: TeamCommand, data_dir: &Path, o: &mut String) -> Result<()> {
    use std::fmt::Write as _;
    match what {
        TeamCommand::Fixture { dir } => {
            let f = ferrograph_team::fixture::create(&dir)?;
            let _ = writeln!(o, "brief:                      {}", f.brief.display());
            let _ = writeln!(o, "brief without reference:    {}", f.brief_only.display());
            let _ = writeln!(o, "vague brief:                {}", f.vague.display());
            let _ = writeln!(o, "next: ferrograph run team --brief {}", f.brief.display());
        }
        TeamCommand::Show { run, out } => {
            let dir = run_dir(data_dir, &run, out.as_deref())?;
            let summary: Value = read(&dir.join("run.json"))
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or(Value::Null);
            let _ = writeln!(o, "run {run}: {}", dir.display());
            for k in ["lifecycle", "status", "current_agent", "updated_at"] {
                if let Some(v) = summary
                    .get(k)
                    .and_then(Value::as_str)
                    .filter(|v| !v.is_empty())
                {
                    let _ = writeln!(o, "{k}: {v}");
                }
            }
            let transitions = jsonl(&dir.join("transitions.jsonl")).unwrap_or_default();
            if !transitions.is_empty() {
                let path: Vec<String> = std::iter::once(
                    transitions[0]["from_state"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                )
                .chain(
                    transitions
                        .iter()
                        .map(|t| t["to_state"].as_str().unwrap_or("").to_string()),
                )
                .collect();
                let _ = writeln!(o, "path: {}", path.join(" → "));
            }
            for (title, file) in [
                ("requirement", "requirements.md"),
                ("stories", "stories.md"),
                ("design", "spec.md"),
                ("runbook", "runbook.md"),
            ] {
                if let Some(t) = read(&dir.join(file)) {
                    let _ = writeln!(o, "\n── {title} ({file}) ──\n{}", t.trim_end());
                }
            }
            if let Some(v) = summary
                .get("blockers")
                .and_then(Value::as_array)
                .filter(|b| !b.is_empty())
            {
                let _ = writeln!(o, "\n── blockers ──");
                for b in v {
                    let _ = writeln!(
                        o,
                        "{} ({}): {}\n  route: {}",
                        b["blocker_id"].as_str().unwrap_or(""),
                        if b["resolved"] == true {
                            "resolved"
                        } else {
                            "open"
                        },
                        b["description"].as_str().unwrap_or(""),
                        b["route"].as_str().unwrap_or("")
                    );
                }
            }
            let ws = dir.join("workspace");
            if ws.is_dir() {
                let _ = writeln!(
                    o,
                    "\nworkspace: {} (git -C {} log --oneline)",
                    ws.display(),
                    ws.display()
                );
            }
            if let Some(d) = summary.get("deployment_path").and_then(Value::as_str) {
                let _ = writeln!(o, "release: {d}");
            }
            let _ = writeln!(o, "audit trail: ferrograph team audit {run}\nevents:      ferrograph team events {run}");
        }
        TeamCommand::Audit { run, out } => {
            let dir = run_dir(data_dir, &run, out.as_deref())?;
            for a in jsonl(&dir.join("audit.jsonl"))? {
                let at = a["at"].as_str().unwrap_or("");
                let _ = writeln!(
                    o,
                    "{} {:<13} {:<12} {}",
                    &at[..at.len().min(19)],
                    a["agent"].as_str().unwrap_or(""),
                    a["kind"].as_str().unwrap_or(""),
                    a["detail"].as_str().unwrap_or("")
                );
                if a["kind"] == "tests" {
                    let data: Value = a["data"]
                        .as_str()
                        .and_then(|d| serde_json::from_str(d).ok())
                        .unwrap_or(Value::Null);
                    if let Some(text) = data["output"].as_str() {
                        for l in text.trim_end().lines() {
                            let _ = writeln!(o, "    │ {l}");
                        }
                    }
                }
            }
        }
        TeamCommand::Memory { run, agent } => {
            let store = TeamStore::new(data_dir.join(ferrograph_team::NAME).join("bus"));
            let all = store.full_history(&run)?;
            if all.is_empty() {
                bail!(ferrograph_team::TeamError::UnknownRun(run));
            }
            for (a, entries) in all {
                if agent.as_deref().is_some_and(|x| x != a) {
                    continue;
                }
                let _ = writeln!(o, "══ {a} ({} entries)", entries.len());
                for e in entries {
                    let _ = writeln!(
                        o,
                        "── {} {} ({} tokens)\n{}",
                        e.entry_id,
                        e.role,
                        e.token_count.map_or("?".into(), |t| t.to_string()),
                        e.content.trim_end()
                    );
                }
            }
        }
        TeamCommand::Events { run, out, json } => {
            let dir = run_dir(data_dir, &run, out.as_deref())?;
            let store = TeamStore::new(data_dir.join(ferrograph_team::NAME).join("bus"));
            let records = match store.events(&run) {
                Ok(r) => serde_json::to_value(r)?
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
                // The bus is held by a running server: the run's copy of the log.
                Err(e) => {
                    eprintln!("note: {e}; reading {}", dir.join("events.jsonl").display());
                    jsonl(&dir.join("events.jsonl"))?
                }
            };
            for (n, r) in records.into_iter().enumerate() {
                if json {
                    let _ = writeln!(o, "{r}");
                    continue;
                }
                let e = &r["envelope"];
                let to: Vec<&str> = r["recipients"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let _ = writeln!(
                    o,
                    "{:>4} {:<22} from {:<13} to {:<28} attempts {} id {}",
                    n + 1,
                    e["event_name"].as_str().unwrap_or(""),
                    e["source_agent"].as_str().unwrap_or(""),
                    to.join(", "),
                    r["attempts"],
                    e["message_id"].as_str().unwrap_or("")
                );
            }
        }
    }
    Ok(())
}
