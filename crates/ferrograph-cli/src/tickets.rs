//! `ferrograph tickets …` and `ferrograph prs …`: the ticket-to-pr workflow's local tickets
//! (and the fixture) and its pull requests.

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use ferrograph_ticket_pr::prs::{PrStore, PullRequest};
use ferrograph_ticket_pr::ticket::TicketStore;
use std::path::{Path, PathBuf};

/// What `ferrograph tickets` does.
#[derive(Subcommand, Debug)]
pub enum TicketsCommand {
    /// Writes the TaskMaster fixture: a git repository (DIR/repo) and its tickets
    /// (DIR/tickets: TASK-101, a bug; TASK-102, a story).
    Fixture {
        /// Folder to write into (must not hold `repo` or `tickets` yet).
        dir: PathBuf,
    },
    /// Lists the tickets of a folder.
    List {
        /// The ticket folder.
        #[arg(long)]
        tickets: PathBuf,
    },
    /// Prints a ticket and its comments.
    Show {
        /// The ticket's key.
        key: String,
        /// The ticket folder.
        #[arg(long)]
        tickets: PathBuf,
    },
}

/// What `ferrograph prs` does.
#[derive(Subcommand, Debug)]
pub enum PrsCommand {
    /// Lists the pull requests.
    List,
    /// Prints a pull request (by number, or the newest of a ticket key).
    Show {
        /// `3`, `#3` or a ticket key.
        which: String,
    },
    /// Prints a pull request's patch series (`git format-patch` format).
    Diff {
        /// `3`, `#3` or a ticket key.
        which: String,
    },
}

/// Runs `ferrograph tickets`.
pub fn run_tickets(what: TicketsCommand) -> Result<()> {
    match what {
        TicketsCommand::Fixture { dir } => {
            let f = ferrograph_ticket_pr::fixture::create(&dir)?;
            println!("repository: {}", f.repo.display());
            println!("tickets:    {}", f.tickets.display());
            println!(
                "next: ferrograph run ticket-to-pr --ticket {} --tickets {} --repo {}",
                ferrograph_ticket_pr::fixture::BUG_TICKET,
                f.tickets.display(),
                f.repo.display()
            );
        }
        TicketsCommand::List { tickets } => {
            let store = TicketStore::open(&tickets)?;
            for key in store.keys()? {
                match store.get(&key) {
                    Ok(t) => println!("{key}\t{:?}\t{}", t.ticket_type, t.summary),
                    Err(e) => println!("{key}\t(unreadable: {e})"),
                }
            }
        }
        TicketsCommand::Show { key, tickets } => {
            let store = TicketStore::open(&tickets)?;
            let t = store.get(&key)?;
            println!("{}: {}\ntype: {:?}", t.key, t.summary, t.ticket_type);
            if !t.labels.is_empty() {
                println!("labels: {}", t.labels.join(", "));
            }
            println!("\n{}", t.description);
            if !t.acceptance_criteria.is_empty() {
                println!("\nacceptance criteria:");
                for a in &t.acceptance_criteria {
                    println!("- {a}");
                }
            }
            for c in store.comments(&key)? {
                println!("\ncomment {} by {}:\n{}", c.id, c.author, c.body);
            }
        }
    }
    Ok(())
}

fn find(store: &PrStore, which: &str) -> Result<PullRequest> {
    match store.find(which)? {
        Some(p) => Ok(p),
        None => bail!("no pull request {which} (see `ferrograph prs list`)"),
    }
}

/// Runs `ferrograph prs` on the store under `data_dir`.
pub fn run_prs(what: PrsCommand, data_dir: &Path) -> Result<()> {
    let store = PrStore::new(data_dir.join("ticket-to-pr").join("prs"));
    match what {
        PrsCommand::List => {
            let all = store.list()?;
            if all.is_empty() {
                println!("no pull requests yet");
            }
            for p in all {
                println!(
                    "#{}\t{}\t{} → {}\t{} commit(s)",
                    p.number,
                    p.title,
                    p.head_branch,
                    p.base_branch,
                    p.commits.len()
                );
            }
        }
        PrsCommand::Show { which } => {
            let p = find(&store, &which)?;
            println!("#{} {}", p.number, p.title);
            println!("repository: {}", p.repo);
            println!(
                "{} → {} (base {})",
                p.head_branch,
                p.base_branch,
                p.base_commit.get(..10).unwrap_or(&p.base_commit)
            );
            for c in &p.commits {
                println!("commit {c}");
            }
            if let Some(patch) = &p.patch_path {
                println!("patch: {patch}");
            }
            if let Some(r) = &p.pushed_to {
                println!("pushed to: {r}");
            }
            println!("run: {}\n\n{}", p.thread_id, p.body);
        }
        PrsCommand::Diff { which } => {
            let p = find(&store, &which)?;
            let path = p
                .patch_path
                .context("this pull request has no patch file")?;
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
            print!("{text}");
        }
    }
    Ok(())
}
