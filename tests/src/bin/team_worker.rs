//! Worker process of the team's exactly-once test (`tests/tests/team_crash.rs`).
//!
//! ```text
//! team_worker setup DIR      writes the fixture brief under DIR/fx
//! team_worker start DIR      runs the brief on thread `t` to the stories gate
//! team_worker approve DIR    answers the open gate with approve
//! team_worker continue DIR   continues thread `t` from its last checkpoint
//! team_worker inspect DIR    prints what the run left, as JSON
//! ```
//!
//! Checkpoints are in sled (DIR/checkpoints), the model is the scripted team. With
//! `FERROGRAPH_TEAM_CRASH_AT=POINT` the process kills itself with SIGKILL when the run
//! reaches POINT.

use ferrograph::checkpoint_savers::SledSaver;
use ferrograph::prelude::*;
use ferrograph::runtime::JsonInput;
use ferrograph::Registry;
use ferrograph_team::bus::TeamStore;
use ferrograph_team::testing::{scripted_model, settings, Behaviour};
use ferrograph_team::NAME;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn registry(dir: &Path) -> Result<Registry, BoxError> {
    let rt = Runtime::new().await?;
    let saver = SledSaver::open(dir.join("checkpoints"))?;
    let mut r = Registry::new();
    ferrograph_team::register_with(
        &mut r,
        &rt,
        saver,
        settings(&dir.join("data"), Arc::new(scripted_model(Behaviour::Good))),
    )
    .await?;
    Ok(r)
}

fn inspect(dir: &Path) -> Result<serde_json::Value, BoxError> {
    let store = TeamStore::new(dir.join("data").join(NAME).join("bus"));
    let events = store.events("t")?;
    let mut inboxes = serde_json::Map::new();
    for a in ferrograph_team::events::agent::ALL {
        let ids: Vec<String> = store
            .inbox("t", a)?
            .iter()
            .map(|d| d.envelope.id().to_string())
            .collect();
        inboxes.insert(a.to_string(), json!(ids));
    }
    let ws = dir
        .join("data")
        .join(NAME)
        .join("runs")
        .join("t")
        .join("workspace");
    let (commits, tags) = match git2::Repository::open(&ws) {
        Ok(repo) => {
            let mut walk = repo.revwalk()?;
            walk.push_head()?;
            let commits: Vec<String> = walk
                .map(|c| c.map(|c| c.to_string()))
                .collect::<Result<_, _>>()?;
            let tags: Vec<String> = repo
                .tag_names(None)?
                .iter()
                .flatten()
                .map(str::to_string)
                .collect();
            (commits, tags)
        }
        Err(_) => (Vec::new(), Vec::new()),
    };
    Ok(json!({
        "events": events.iter().map(|e| json!({"id": e.envelope.id(), "name": e.envelope.name(), "attempts": e.attempts, "recipients": e.recipients})).collect::<Vec<_>>(),
        "inboxes": inboxes,
        "commits": commits,
        "tags": tags,
    }))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let (cmd, dir) = match args.as_slice() {
        [_, cmd, dir] => (cmd.as_str(), Path::new(dir)),
        _ => return Err("usage: team_worker setup|start|approve|continue|inspect DIR".into()),
    };
    let input = match cmd {
        "setup" => {
            ferrograph_team::fixture::create(&dir.join("fx"))?;
            return Ok(());
        }
        "inspect" => {
            println!("{}", inspect(dir)?);
            return Ok(());
        }
        "start" => {
            JsonInput::Update(json!({"brief": dir.join("fx/wordstats").display().to_string()}))
        }
        "approve" => JsonInput::Resume(Resume::value(json!("approve"))),
        "continue" => JsonInput::Continue,
        other => return Err(format!("unknown command {other}").into()),
    };
    let r = registry(dir).await?;
    let wf = &r.get(NAME).ok_or("no workflow")?.workflow;
    let out = wf.invoke(input, RunConfig::thread("t")).await?;
    let gate = out
        .interrupts
        .first()
        .map(|i| i.value.0["checkpoint_type"].clone())
        .unwrap_or_default();
    println!(
        "{}",
        json!({"status": out.status, "run_status": out.state["status"], "gate": gate, "error": out.state["error"], "delivered": out.state["outbox"]["delivered"], "pending": out.state["outbox"]["pending"].as_array().map(|p| p.iter().map(|e| e["message_id"].clone()).collect::<Vec<_>>())})
    );
    Ok(())
}
