//! Worker process of the ticket-to-pr exactly-once test (`tests/tests/ticket_crash.rs`).
//!
//! ```text
//! ticket_worker setup DIR      writes the TaskMaster fixture under DIR/fx
//! ticket_worker start DIR      runs TASK-101 on thread `t` to the review gate
//! ticket_worker approve DIR    answers the gate with approve
//! ticket_worker continue DIR   continues thread `t` from its last checkpoint
//! ticket_worker inspect DIR    prints what the run left, as JSON
//! ```
//!
//! Checkpoints are in sled (DIR/checkpoints, sync durability), the model is the scripted
//! engineer, the embedder hashes. With `FERROGRAPH_TICKET_PR_CRASH_AT=POINT` the process
//! kills itself with SIGKILL when the run reaches POINT.

use ferrograph::checkpoint_savers::SledSaver;
use ferrograph::prelude::*;
use ferrograph::runtime::JsonInput;
use ferrograph::Registry;
use ferrograph_ticket_pr::fixture::{self, BUG_TICKET};
use ferrograph_ticket_pr::testing::{scripted_model, settings, Behaviour};
use ferrograph_ticket_pr::ticket::TicketStore;
use ferrograph_ticket_pr::NAME;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn registry(dir: &Path) -> Result<Registry, BoxError> {
    let rt = Runtime::new().await?;
    let saver = SledSaver::open(dir.join("checkpoints"))?;
    let mut r = Registry::new();
    ferrograph_ticket_pr::register_with(
        &mut r,
        &rt,
        saver,
        settings(&dir.join("data"), Arc::new(scripted_model(Behaviour::Good))),
    )
    .await?;
    Ok(r)
}

fn inspect(dir: &Path) -> Result<serde_json::Value, BoxError> {
    let repo = git2::Repository::open(dir.join("fx/repo"))?;
    let main = repo.revparse_single("main")?.id();
    let mut branches = serde_json::Map::new();
    for b in repo.branches(Some(git2::BranchType::Local))? {
        let (b, _) = b?;
        let name = b.name()?.unwrap_or("").to_string();
        if name == "main" {
            continue;
        }
        let mut walk = repo.revwalk()?;
        walk.push(b.get().peel_to_commit()?.id())?;
        walk.hide(main)?;
        walk.set_sorting(git2::Sort::TOPOLOGICAL | git2::Sort::REVERSE)?;
        let ids: Vec<String> = walk
            .map(|id| id.map(|i| i.to_string()))
            .collect::<Result<_, _>>()?;
        branches.insert(name, json!(ids));
    }
    let prs =
        ferrograph_ticket_pr::prs::PrStore::new(dir.join("data").join(NAME).join("prs")).list()?;
    let comments = TicketStore::open(dir.join("fx/tickets"))?.comments(BUG_TICKET)?;
    Ok(json!({
        "branches": branches,
        "prs": prs.iter().map(|p| json!({"number": p.number, "commits": p.commits})).collect::<Vec<_>>(),
        "comments": comments.iter().map(|c| c.id.clone()).collect::<Vec<_>>(),
        "head": repo.head()?.shorthand().unwrap_or("").to_string(),
        "clean": repo.statuses(None)?.is_empty(),
    }))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let (cmd, dir) = match args.as_slice() {
        [_, cmd, dir] => (cmd.as_str(), Path::new(dir)),
        _ => return Err("usage: ticket_worker setup|start|approve|continue|inspect DIR".into()),
    };
    let input = match cmd {
        "setup" => {
            fixture::create(&dir.join("fx"))?;
            return Ok(());
        }
        "inspect" => {
            println!("{}", inspect(dir)?);
            return Ok(());
        }
        "start" => JsonInput::Update(json!({
            "ticket_key": BUG_TICKET,
            "tickets": dir.join("fx/tickets").display().to_string(),
            "repo": dir.join("fx/repo").display().to_string(),
            "out": dir.join("out").display().to_string(),
        })),
        "approve" => JsonInput::Resume(Resume::value(json!("approve"))),
        "continue" => JsonInput::Continue,
        other => return Err(format!("unknown command {other}").into()),
    };
    let r = registry(dir).await?;
    let wf = &r.get(NAME).ok_or("no workflow")?.workflow;
    let out = wf.invoke(input, RunConfig::thread("t")).await?;
    println!(
        "{}",
        json!({"status": out.status, "run_status": out.state["status"], "error": out.state["error"]})
    );
    Ok(())
}
