//! The fixture: TaskMaster, a small Java project in the seed's shape (core / api / e2e),
//! made into a git repository at run time, with a planted service bug (`TASK-101`: the
//! overdue list dereferences a missing due date) and a story that adds a field
//! (`TASK-102`: a priority). `ferrograph tickets fixture DIR` writes it; the tests use it.

use crate::error::TicketPrError;
use git2::{Repository, RepositoryInitOptions, Signature};
use std::path::{Path, PathBuf};

/// The bug ticket.
pub const BUG_TICKET: &str = "TASK-101";
/// The story ticket.
pub const STORY_TICKET: &str = "TASK-102";

const REPO_FILES: &[(&str, &str)] = &[
    ("README.md", include_str!("../fixture/repo/README.md")),
    ("taskmaster-api/pom.xml", include_str!("../fixture/repo/taskmaster-api/pom.xml")),
    ("taskmaster-api/src/main/java/com/taskmaster/api/TaskController.java", include_str!("../fixture/repo/taskmaster-api/src/main/java/com/taskmaster/api/TaskController.java")),
    ("taskmaster-api/src/main/java/com/taskmaster/api/TaskRequest.java", include_str!("../fixture/repo/taskmaster-api/src/main/java/com/taskmaster/api/TaskRequest.java")),
    ("taskmaster-api/src/main/java/com/taskmaster/api/TaskResponse.java", include_str!("../fixture/repo/taskmaster-api/src/main/java/com/taskmaster/api/TaskResponse.java")),
    ("taskmaster-core/pom.xml", include_str!("../fixture/repo/taskmaster-core/pom.xml")),
    ("taskmaster-core/src/main/java/com/taskmaster/core/Task.java", include_str!("../fixture/repo/taskmaster-core/src/main/java/com/taskmaster/core/Task.java")),
    ("taskmaster-core/src/main/java/com/taskmaster/core/TaskRepository.java", include_str!("../fixture/repo/taskmaster-core/src/main/java/com/taskmaster/core/TaskRepository.java")),
    ("taskmaster-core/src/main/java/com/taskmaster/core/TaskService.java", include_str!("../fixture/repo/taskmaster-core/src/main/java/com/taskmaster/core/TaskService.java")),
    ("taskmaster-core/src/test/java/com/taskmaster/core/TaskServiceTest.java", include_str!("../fixture/repo/taskmaster-core/src/test/java/com/taskmaster/core/TaskServiceTest.java")),
    ("taskmaster-e2e/package.json", include_str!("../fixture/repo/taskmaster-e2e/package.json")),
    ("taskmaster-e2e/tests/tasks.spec.ts", include_str!("../fixture/repo/taskmaster-e2e/tests/tasks.spec.ts")),
];

const TICKET_FILES: &[(&str, &str)] = &[
    (
        "TASK-101.json",
        include_str!("../fixture/tickets/TASK-101.json"),
    ),
    (
        "TASK-102.md",
        include_str!("../fixture/tickets/TASK-102.md"),
    ),
];

/// Where [`create`] put the fixture.
#[derive(Clone, Debug)]
pub struct Fixture {
    /// The git repository (branch `main`, one commit).
    pub repo: PathBuf,
    /// The ticket folder.
    pub tickets: PathBuf,
}

/// Writes the fixture under `dir` (`dir/repo`, `dir/tickets`); refuses a `dir` that already
/// holds either.
pub fn create(dir: &Path) -> Result<Fixture, TicketPrError> {
    let repo_dir = dir.join("repo");
    let tickets = dir.join("tickets");
    for p in [&repo_dir, &tickets] {
        if p.exists() {
            return Err(TicketPrError::Tickets(format!(
                "{} exists already; choose an empty folder",
                p.display()
            )));
        }
    }
    for (rel, text) in REPO_FILES {
        write(&repo_dir.join(rel), text)?;
    }
    for (rel, text) in TICKET_FILES {
        write(&tickets.join(rel), text)?;
    }
    let mut opts = RepositoryInitOptions::new();
    opts.initial_head("main");
    let repo = Repository::init_opts(&repo_dir, &opts)
        .map_err(TicketPrError::git("creating the fixture repository"))?;
    let mut index = repo
        .index()
        .map_err(TicketPrError::git("the fixture's index"))?;
    index
        .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
        .and_then(|()| index.write())
        .map_err(TicketPrError::git("staging the fixture"))?;
    let tree_id = index
        .write_tree()
        .map_err(TicketPrError::git("the fixture's tree"))?;
    let tree = repo
        .find_tree(tree_id)
        .map_err(TicketPrError::git("the fixture's tree"))?;
    let sig = Signature::now("TaskMaster developers", "dev@taskmaster.invalid")
        .map_err(TicketPrError::git("a signature"))?;
    repo.commit(Some("HEAD"), &sig, &sig, "TaskMaster 1.0", &tree, &[])
        .map_err(TicketPrError::git("committing the fixture"))?;
    Ok(Fixture {
        repo: repo_dir,
        tickets,
    })
}

fn write(path: &Path, text: &str) -> Result<(), TicketPrError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| TicketPrError::io(parent, e))?;
    }
    std::fs::write(path, text).map_err(|e| TicketPrError::io(path, e))
}
