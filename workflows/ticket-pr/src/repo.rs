//! The git side, through libgit2 (`git2`): the base commit, the repository's modules, path
//! checks, unified diffs, and the branch with one commit per changed file, built in memory so
//! that the user's working tree, index and current branch are never touched.

use crate::error::TicketPrError;
use git2::{ObjectType, Oid, Repository, Signature, Status, StatusOptions, TreeWalkMode};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Build files that make a top-level folder a module.
pub const BUILD_FILES: [&str; 9] = [
    "pom.xml",
    "build.gradle",
    "build.gradle.kts",
    "Cargo.toml",
    "package.json",
    "pyproject.toml",
    "setup.py",
    "go.mod",
    "CMakeLists.txt",
];

/// The optional module list at the repository's root.
pub const MODULES_FILE: &str = "ferrograph-modules.toml";

/// Git's mode of a symbolic link.
const LINK_MODE: i32 = 0o120000;

/// One module of the repository.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Module {
    /// Its name (the folder's name unless the config file names it).
    pub name: String,
    /// Its folder, relative to the root, without a trailing `/`.
    pub path: String,
    /// One line for the model: from the config file, or the names of its source files.
    pub description: String,
    /// Its files at the base commit, relative to the root.
    pub files: Vec<String>,
}

/// The name of the module of a repository's top-level source files (a single-module
/// package such as `xmltodict.py` next to `setup.py`); its path is empty.
pub const TOP_LEVEL_MODULE: &str = "top-level";

/// Build and tooling scripts at a repository's root that are not its sources.
const ROOT_SCRIPTS: [&str; 6] = [
    "setup.py",
    "conftest.py",
    "noxfile.py",
    "fabfile.py",
    "tasks.py",
    "build.rs",
];

impl Module {
    /// Whether `path` (normalized, relative to the root) lies in this module: under its
    /// folder, or at the root for the [`TOP_LEVEL_MODULE`].
    pub fn holds(&self, path: &str) -> bool {
        if self.path.is_empty() {
            !path.contains('/')
        } else {
            path.strip_prefix(self.path.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
        }
    }

    /// The prefix retrieval filters this module's chunks by (empty for the top level).
    pub fn prefix(&self) -> String {
        if self.path.is_empty() {
            String::new()
        } else {
            format!("{}/", self.path)
        }
    }
}

/// One file as it should be after the change.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FileChange {
    /// Relative to the repository root.
    pub file_path: String,
    /// What changed and why.
    pub description: String,
    /// The whole new content.
    pub new_content: String,
}

/// Opens the repository whose working tree is `path`.
pub fn open(path: &Path) -> Result<Repository, TicketPrError> {
    let repo = Repository::open(path)
        .map_err(|e| TicketPrError::NotGit(format!("{} ({})", path.display(), e.message())))?;
    if repo.is_bare() {
        return Err(TicketPrError::NotGit(format!(
            "{} (a bare repository has no working tree to take modules from)",
            path.display()
        )));
    }
    Ok(repo)
}

/// Fails when tracked files have uncommitted changes (untracked and ignored files are fine).
pub fn check_clean(repo: &Repository) -> Result<(), TicketPrError> {
    let mut opts = StatusOptions::new();
    opts.include_untracked(false).include_ignored(false);
    let statuses = repo
        .statuses(Some(&mut opts))
        .map_err(TicketPrError::git("reading the working tree's status"))?;
    let dirty: Vec<String> = statuses
        .iter()
        .filter(|s| s.status() != Status::CURRENT && !s.status().contains(Status::IGNORED))
        .filter_map(|s| s.path().map(str::to_string))
        .collect();
    if dirty.is_empty() {
        return Ok(());
    }
    let shown: Vec<&str> = dirty.iter().take(5).map(String::as_str).collect();
    Err(TicketPrError::Dirty {
        repo: repo
            .workdir()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        files: format!(
            "{}{}",
            shown.join(", "),
            if dirty.len() > 5 { ", …" } else { "" }
        ),
    })
}

/// The current branch's name and commit.
pub fn head(repo: &Repository) -> Result<(String, String), TicketPrError> {
    let head = repo.head().map_err(TicketPrError::git(
        "reading HEAD (a repository with no commit?)",
    ))?;
    let commit = head
        .peel_to_commit()
        .map_err(TicketPrError::git("HEAD is not a commit"))?;
    let name = head.shorthand().unwrap_or("HEAD").to_string();
    Ok((name, commit.id().to_string()))
}

/// The repository's default branch and its commit, which a change is based on whatever
/// branch the user has checked out: the branch `origin/HEAD` points at, else
/// `init.defaultBranch`, `main` or `master` where such a local branch exists, else the
/// current branch.
pub fn default_branch(repo: &Repository) -> Result<(String, String), TicketPrError> {
    let local = |name: &str| -> Option<(String, String)> {
        let b = repo.find_branch(name, git2::BranchType::Local).ok()?;
        let c = b.get().peel_to_commit().ok()?;
        Some((name.to_string(), c.id().to_string()))
    };
    if let Ok(r) = repo.find_reference("refs/remotes/origin/HEAD") {
        if let Some(target) = r.symbolic_target() {
            if let Some(name) = target.strip_prefix("refs/remotes/origin/") {
                if let Some(found) = local(name) {
                    return Ok(found);
                }
                if let Ok(c) = r.peel_to_commit() {
                    return Ok((format!("origin/{name}"), c.id().to_string()));
                }
            }
        }
    }
    let configured = repo
        .config()
        .and_then(|c| c.get_string("init.defaultBranch"))
        .ok();
    for name in configured
        .iter()
        .map(String::as_str)
        .chain(["main", "master"])
    {
        if let Some(found) = local(name) {
            return Ok(found);
        }
    }
    head(repo)
}

fn oid(s: &str) -> Result<Oid, TicketPrError> {
    Oid::from_str(s).map_err(TicketPrError::git(format!("commit id {s}")))
}

/// Every file at `commit` (relative paths, sorted), with its mode.
fn files_at(repo: &Repository, commit: &str) -> Result<Vec<(String, i32)>, TicketPrError> {
    let tree = repo
        .find_commit(oid(commit)?)
        .and_then(|c| c.tree())
        .map_err(TicketPrError::git(format!("reading commit {commit}")))?;
    let mut out = Vec::new();
    tree.walk(TreeWalkMode::PreOrder, |dir, entry| {
        if entry.kind() == Some(ObjectType::Blob) {
            if let Some(name) = entry.name() {
                out.push((format!("{dir}{name}"), entry.filemode()));
            }
        }
        git2::TreeWalkResult::Ok
    })
    .map_err(TicketPrError::git("walking the tree"))?;
    out.sort();
    Ok(out)
}

/// The content of `path` at `commit`, if it is a file there (lossy UTF-8).
pub fn read_at(
    repo: &Repository,
    commit: &str,
    path: &str,
) -> Result<Option<String>, TicketPrError> {
    let tree = repo
        .find_commit(oid(commit)?)
        .and_then(|c| c.tree())
        .map_err(TicketPrError::git(format!("reading commit {commit}")))?;
    let Ok(entry) = tree.get_path(Path::new(path)) else {
        return Ok(None);
    };
    if entry.kind() != Some(ObjectType::Blob) {
        return Ok(None);
    }
    let blob = repo
        .find_blob(entry.id())
        .map_err(TicketPrError::git(format!("reading {path}")))?;
    Ok(Some(String::from_utf8_lossy(blob.content()).into_owned()))
}

/// The text files at `commit` (path → content), for staging a copy of the tree: links,
/// binary files (a NUL byte) and files over `max_file` bytes are left out; `Err` when the
/// text files together exceed `max_total` bytes.
pub fn text_tree(
    repo: &Repository,
    commit: &str,
    max_file: usize,
    max_total: usize,
) -> Result<std::collections::BTreeMap<String, String>, TicketPrError> {
    let tree = repo
        .find_commit(oid(commit)?)
        .and_then(|c| c.tree())
        .map_err(TicketPrError::git(format!("reading commit {commit}")))?;
    let mut out = std::collections::BTreeMap::new();
    let mut total = 0usize;
    for (path, mode) in files_at(repo, commit)? {
        if mode == LINK_MODE {
            continue;
        }
        let Ok(entry) = tree.get_path(Path::new(&path)) else {
            continue;
        };
        let blob = repo
            .find_blob(entry.id())
            .map_err(TicketPrError::git(format!("reading {path}")))?;
        let bytes = blob.content();
        if bytes.len() > max_file || bytes.contains(&0) {
            continue;
        }
        let Ok(text) = std::str::from_utf8(bytes) else {
            continue;
        };
        total += bytes.len();
        if total > max_total {
            return Err(TicketPrError::TreeTooLarge {
                limit_mib: max_total >> 20,
            });
        }
        out.insert(path, text.to_string());
    }
    Ok(out)
}

#[derive(Deserialize)]
struct ModulesFile {
    modules: Vec<ModuleSpec>,
}

#[derive(Deserialize)]
struct ModuleSpec {
    name: String,
    path: String,
    #[serde(default)]
    description: String,
}

/// The repository's modules at `commit`: those named in `ferrograph-modules.toml` when the
/// repository has one (`[[modules]]` with `name`, `path`, `description`), else every
/// top-level folder holding a build file ([`BUILD_FILES`]), else every top-level folder.
pub fn modules(repo: &Repository, commit: &str) -> Result<Vec<Module>, TicketPrError> {
    let files = files_at(repo, commit)?;
    let specs: Vec<ModuleSpec> = match read_at(repo, commit, MODULES_FILE)? {
        Some(text) => {
            toml::from_str::<ModulesFile>(&text)
                .map_err(|e| TicketPrError::Modules(format!("{MODULES_FILE}: {e}")))?
                .modules
        }
        None => {
            let mut tops: Vec<String> = files
                .iter()
                .filter_map(|(p, _)| p.split_once('/').map(|(top, _)| top.to_string()))
                .filter(|t| !t.starts_with('.'))
                .collect();
            tops.dedup();
            let with_build: Vec<String> = tops
                .iter()
                .filter(|t| {
                    BUILD_FILES
                        .iter()
                        .any(|b| files.iter().any(|(p, _)| *p == format!("{t}/{b}")))
                })
                .cloned()
                .collect();
            let chosen = if with_build.is_empty() {
                tops
            } else {
                with_build
            };
            let mut specs: Vec<ModuleSpec> = chosen
                .into_iter()
                .map(|t| ModuleSpec {
                    name: t.clone(),
                    path: t,
                    description: String::new(),
                })
                .collect();
            // Sources at the root (a one-file package): a module of their own, so that the
            // file the fix belongs in can be offered and changed.
            if files.iter().any(|(p, mode)| is_root_source(p, *mode)) {
                specs.push(ModuleSpec {
                    name: TOP_LEVEL_MODULE.into(),
                    path: String::new(),
                    description: String::new(),
                });
            }
            specs
        }
    };
    let mut out = Vec::new();
    for spec in specs {
        let path = spec.path.trim_matches('/').to_string();
        if !path.is_empty() || spec.name != TOP_LEVEL_MODULE {
            normalize(&path).map_err(|why| {
                TicketPrError::Modules(format!("module {}: path `{}`: {why}", spec.name, spec.path))
            })?;
        }
        let prefix = format!("{path}/");
        let mine: Vec<String> = files
            .iter()
            .filter(|(p, mode)| {
                *mode != LINK_MODE
                    && if path.is_empty() {
                        is_root_source(p, *mode)
                    } else {
                        p.starts_with(&prefix)
                    }
            })
            .map(|(p, _)| p.clone())
            .collect();
        if mine.is_empty() {
            return Err(TicketPrError::Modules(format!(
                "module {} has no files under {}",
                spec.name,
                if path.is_empty() { "the root" } else { &prefix }
            )));
        }
        let description = if spec.description.trim().is_empty() {
            describe(&mine)
        } else {
            spec.description.trim().to_string()
        };
        out.push(Module {
            name: spec.name,
            path,
            description,
            files: mine,
        });
    }
    if out.is_empty() {
        return Err(TicketPrError::Modules(
            "the repository has no folders to take modules from".into(),
        ));
    }
    Ok(out)
}

/// Whether a root-level entry is a source file of the package (not a build script, not a
/// link, not documentation).
fn is_root_source(path: &str, mode: i32) -> bool {
    !path.contains('/')
        && mode != LINK_MODE
        && !path.starts_with('.')
        && !ROOT_SCRIPTS.contains(&path)
        && !BUILD_FILES.contains(&path)
        && ferrograph_index::chunk::language_for_path(path).is_some_and(|l| l != "markdown")
}

/// "sources: Task, TaskService; tests: TaskServiceTest" from a module's files.
fn describe(files: &[String]) -> String {
    let stem = |p: &String| {
        Path::new(p)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
    };
    let is_source =
        |p: &String| ferrograph_index::chunk::language_for_path(p).is_some_and(|l| l != "markdown");
    let (tests, sources): (Vec<&String>, Vec<&String>) = files
        .iter()
        .filter(|p| is_source(p))
        .partition(|p| is_test_path(p));
    let names = |v: Vec<&String>| {
        let mut n: Vec<String> = v.into_iter().filter_map(stem).collect();
        n.dedup();
        n.truncate(8);
        n.join(", ")
    };
    match (sources.is_empty(), tests.is_empty()) {
        (false, false) => format!("sources: {}; tests: {}", names(sources), names(tests)),
        (false, true) => format!("sources: {}", names(sources)),
        (true, false) => format!("tests: {}", names(tests)),
        (true, true) => "no source files".into(),
    }
}

/// Whether `path` looks like a test (a `test`/`tests`/`e2e` folder or a test-named file).
pub fn is_test_path(path: &str) -> bool {
    let lower = path.to_lowercase();
    lower
        .split('/')
        .any(|c| c == "test" || c == "tests" || c == "e2e" || c == "__tests__")
        || Path::new(&lower)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .is_some_and(|s| s.ends_with("test") || s.starts_with("test_") || s.ends_with(".spec"))
}

/// `path` with `/` separators and no empty, `.` or `..` components; refused when absolute.
pub fn normalize(path: &str) -> Result<String, String> {
    let p = path.trim();
    if p.is_empty() {
        return Err("empty path".into());
    }
    if p.starts_with('/') || p.starts_with('\\') || p.contains(':') {
        return Err("absolute paths are refused".into());
    }
    if p.contains('\\') || p.contains('\0') {
        return Err("use / as the separator".into());
    }
    let parts: Vec<&str> = p.split('/').collect();
    if parts
        .iter()
        .any(|c| c.is_empty() || *c == "." || *c == "..")
    {
        return Err("`..`, `.` and empty components are refused".into());
    }
    if parts.iter().any(|c| c.eq_ignore_ascii_case(".git")) {
        return Err("the .git folder is refused".into());
    }
    Ok(parts.join("/"))
}

/// Checks a proposed path: normalized, inside one of `allowed` modules, and not through a
/// symbolic link (or a file used as a folder) at `commit`. Returns the normalized path.
pub fn check_path(
    repo: &Repository,
    commit: &str,
    path: &str,
    allowed: &[Module],
) -> Result<String, TicketPrError> {
    let refuse = |why: String| TicketPrError::PathRefused {
        path: path.to_string(),
        why,
    };
    let p = normalize(path).map_err(refuse)?;
    if !allowed.iter().any(|m| m.holds(&p)) {
        let names: Vec<&str> = allowed
            .iter()
            .map(|m| {
                if m.path.is_empty() {
                    "the top level"
                } else {
                    m.path.as_str()
                }
            })
            .collect();
        return Err(refuse(format!(
            "outside the selected modules ({})",
            names.join(", ")
        )));
    }
    let tree = repo
        .find_commit(oid(commit)?)
        .and_then(|c| c.tree())
        .map_err(TicketPrError::git(format!("reading commit {commit}")))?;
    let parts: Vec<&str> = p.split('/').collect();
    for i in 1..=parts.len() {
        let prefix = parts[..i].join("/");
        let Ok(entry) = tree.get_path(Path::new(&prefix)) else {
            break;
        };
        if entry.filemode() == LINK_MODE {
            return Err(refuse(format!("{prefix} is a symbolic link")));
        }
        if i < parts.len() && entry.kind() != Some(ObjectType::Tree) {
            return Err(refuse(format!("{prefix} is a file, not a folder")));
        }
    }
    Ok(p)
}

/// A branch name from the ticket: `ticket/<key>-<summary words>`, lower case, at most 60
/// characters, the same for the same ticket.
pub fn branch_name(key: &str, summary: &str) -> String {
    let mut slug = String::new();
    for word in summary
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let w = word.to_ascii_lowercase();
        if slug.len() + w.len() + 1 > 40 {
            break;
        }
        if !slug.is_empty() {
            slug.push('-');
        }
        slug.push_str(&w);
    }
    let key = key.to_ascii_lowercase();
    if slug.is_empty() {
        format!("ticket/{key}")
    } else {
        format!("ticket/{key}-{slug}")
    }
}

/// A unified diff of `path` from `old` (absent: a new file) to `new`, with git's headers.
pub fn unified_diff(path: &str, old: Option<&str>, new: &str) -> Result<String, TicketPrError> {
    let mut opts = git2::DiffOptions::new();
    opts.context_lines(3);
    let old_bytes = old.map(str::as_bytes);
    let patch = git2::Patch::from_buffers(
        old_bytes.unwrap_or(&[]),
        old.map(|_| Path::new(path)),
        new.as_bytes(),
        Some(Path::new(path)),
        Some(&mut opts),
    )
    .map_err(TicketPrError::git(format!("diffing {path}")))?;
    let mut patch = patch;
    let buf = patch
        .to_buf()
        .map_err(TicketPrError::git(format!("diffing {path}")))?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    if old.is_none() {
        // libgit2 names the missing side's path `a/<path>`; git says /dev/null.
        return Ok(text.replacen(&format!("--- a/{path}\n"), "--- /dev/null\n", 1));
    }
    Ok(text)
}

/// The commit message of `change` under ticket `key`.
pub fn commit_message(key: &str, change: &FileChange) -> String {
    let first = change
        .description
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .trim_end_matches('.');
    let first = if first.is_empty() {
        format!("update {}", change.file_path)
    } else {
        first.to_string()
    };
    format!("fix({key}): {first}\n\nFile: {}\n", change.file_path)
}

/// Where [`apply`] reports progress (the crash tests stop the process at these points).
pub type ApplyHook<'a> = &'a mut dyn FnMut(&str);

/// Makes `branch` hold one commit per change on top of `base` (first change first), with
/// messages from [`commit_message`], without touching the working tree or the current
/// branch. Idempotent: when the branch already holds some of these commits (same trees and
/// messages, from an earlier attempt killed midway) it goes on from there; when it holds
/// anything else it fails with [`TicketPrError::BranchConflict`] and changes nothing.
/// Returns the commit ids, oldest first.
pub fn apply(
    repo: &Repository,
    base: &str,
    branch: &str,
    key: &str,
    changes: &[FileChange],
    hook: ApplyHook<'_>,
) -> Result<Vec<String>, TicketPrError> {
    let base_commit = repo
        .find_commit(oid(base)?)
        .map_err(TicketPrError::git(format!(
            "finding the base commit {base}"
        )))?;
    let base_tree = base_commit
        .tree()
        .map_err(TicketPrError::git("reading the base tree"))?;
    // The planned trees, in memory: the repository's index file is never written.
    let mut index = git2::Index::new().map_err(TicketPrError::git("an in-memory index"))?;
    index
        .read_tree(&base_tree)
        .map_err(TicketPrError::git("reading the base tree"))?;
    let mut plan: Vec<(Oid, String)> = Vec::new();
    for change in changes {
        let blob = repo
            .blob(change.new_content.as_bytes())
            .map_err(TicketPrError::git(format!("storing {}", change.file_path)))?;
        let mode = base_tree
            .get_path(Path::new(&change.file_path))
            .map(|e| e.filemode() as u32)
            .unwrap_or(0o100644);
        let entry = git2::IndexEntry {
            ctime: git2::IndexTime::new(0, 0),
            mtime: git2::IndexTime::new(0, 0),
            dev: 0,
            ino: 0,
            mode,
            uid: 0,
            gid: 0,
            file_size: change.new_content.len() as u32,
            id: blob,
            flags: change.file_path.len().min(0xfff) as u16,
            flags_extended: 0,
            path: change.file_path.as_bytes().to_vec(),
        };
        index
            .add(&entry)
            .map_err(TicketPrError::git(format!("staging {}", change.file_path)))?;
        let tree = index
            .write_tree_to(repo)
            .map_err(TicketPrError::git("writing a tree"))?;
        plan.push((tree, commit_message(key, change)));
    }
    let refname = format!("refs/heads/{branch}");
    let conflict = |detail: String| TicketPrError::BranchConflict {
        branch: branch.to_string(),
        detail,
    };
    // What an earlier attempt already committed.
    let mut done: Vec<Oid> = Vec::new();
    let mut tip = base_commit.id();
    if let Ok(r) = repo.find_reference(&refname) {
        let head = r
            .peel_to_commit()
            .map_err(TicketPrError::git(format!("reading {branch}")))?;
        let mut chain = Vec::new();
        let mut c = head.clone();
        while c.id() != base_commit.id() {
            if chain.len() > plan.len() {
                return Err(conflict(format!(
                    "more than the {} commits planned on top of {}",
                    plan.len(),
                    short(base)
                )));
            }
            chain.push(c.clone());
            c = match c.parent(0) {
                Ok(p) => p,
                Err(_) => {
                    return Err(conflict(format!(
                        "it does not start from the base commit {}",
                        short(base)
                    )))
                }
            };
        }
        chain.reverse();
        for (i, c) in chain.iter().enumerate() {
            let (tree, msg) = &plan[i];
            if c.tree_id() != *tree || c.message().unwrap_or("") != msg {
                return Err(conflict(format!(
                    "commit {} is not the planned commit {} of {}",
                    short(&c.id().to_string()),
                    i + 1,
                    plan.len()
                )));
            }
        }
        done = chain.iter().map(|c| c.id()).collect();
        tip = head.id();
    }
    let sig = repo
        .signature()
        .or_else(|_| Signature::now("ferrograph", "ferrograph@localhost"))
        .map_err(TicketPrError::git("a signature"))?;
    for (i, (tree_id, msg)) in plan.iter().enumerate().skip(done.len()) {
        let tree = repo
            .find_tree(*tree_id)
            .map_err(TicketPrError::git("finding a planned tree"))?;
        let parent = repo
            .find_commit(tip)
            .map_err(TicketPrError::git("finding the parent commit"))?;
        let id = repo
            .commit(None, &sig, &sig, msg, &tree, &[&parent])
            .map_err(TicketPrError::git(format!(
                "committing {}",
                changes[i].file_path
            )))?;
        let log = format!("ferrograph: {}", msg.lines().next().unwrap_or(""));
        if i == 0 {
            repo.reference(&refname, id, false, &log)
        } else {
            repo.reference_matching(&refname, id, true, tip, &log)
        }
        .map_err(TicketPrError::git(format!("moving {branch}")))?;
        done.push(id);
        tip = id;
        hook(&format!("commit-{}", i + 1));
    }
    Ok(done.iter().map(Oid::to_string).collect())
}

fn short(id: &str) -> &str {
    id.get(..10).unwrap_or(id)
}

/// The commits `base..head` as a `git format-patch` series (one mbox message per commit).
pub fn format_patch(repo: &Repository, commits: &[String]) -> Result<String, TicketPrError> {
    let mut out = String::new();
    let total = commits.len();
    for (i, id) in commits.iter().enumerate() {
        let commit = repo
            .find_commit(oid(id)?)
            .map_err(TicketPrError::git(format!("finding commit {id}")))?;
        let mut opts = git2::EmailCreateOptions::new();
        opts.start_number(i + 1);
        if total > 1 {
            opts.subject_prefix("PATCH");
        }
        let email = git2::Email::from_commit(&commit, &mut opts)
            .map_err(TicketPrError::git(format!("formatting commit {id}")))?;
        let text = String::from_utf8_lossy(email.as_slice()).into_owned();
        out.push_str(&if total > 1 {
            text.replacen("[PATCH]", &format!("[PATCH {}/{total}]", i + 1), 1)
        } else {
            text
        });
    }
    Ok(out)
}

/// Pushes `branch` to `remote` (a configured remote's name, a path or a URL). A bare word
/// that is not one of the repository's remotes is an error, never a path taken from the
/// process's working directory.
pub fn push(repo: &Repository, remote: &str, branch: &str) -> Result<(), TicketPrError> {
    let mut r = match repo.find_remote(remote) {
        Ok(r) => r,
        Err(_) if !remote.contains('/') && !remote.contains(':') => {
            return Err(TicketPrError::UnknownRemote(remote.to_string()))
        }
        Err(_) => repo
            .remote_anonymous(remote)
            .map_err(TicketPrError::git(format!("remote {remote}")))?,
    };
    let spec = format!("+refs/heads/{branch}:refs/heads/{branch}");
    r.push(&[spec.as_str()], None)
        .map_err(TicketPrError::git(format!("pushing {branch} to {remote}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn repo_with(files: &[(&str, &str)]) -> (tempfile::TempDir, Repository, String) {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        for (p, c) in files {
            let full = dir.path().join(p);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(full, c).unwrap();
        }
        let mut index = repo.index().unwrap();
        index
            .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
            .unwrap();
        index.write().unwrap();
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        let sig = Signature::now("t", "t@t").unwrap();
        let id = repo
            .commit(Some("HEAD"), &sig, &sig, "init", &tree, &[])
            .unwrap();
        drop(tree);
        (dir, repo, id.to_string())
    }

    #[test]
    fn modules_come_from_build_files_or_the_config_file() {
        let (_d, repo, base) = repo_with(&[
            ("core/pom.xml", "<project/>"),
            ("core/src/Task.java", "class Task {}"),
            ("api/pom.xml", "<project/>"),
            ("api/src/Api.java", "class Api {}"),
            ("docs/notes.md", "# notes"),
        ]);
        let m = modules(&repo, &base).unwrap();
        let names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["api", "core"], "docs has no build file");
        assert!(m[1].description.contains("Task"), "{}", m[1].description);

        let (_d, repo, base) = repo_with(&[
            (
                MODULES_FILE,
                "[[modules]]\nname = \"service\"\npath = \"core\"\ndescription = \"the domain\"\n",
            ),
            ("core/src/Task.java", "class Task {}"),
        ]);
        let m = modules(&repo, &base).unwrap();
        assert_eq!(m[0].name, "service");
        assert_eq!(m[0].description, "the domain");
        assert_eq!(m[0].files, ["core/src/Task.java"]);
    }

    #[test]
    fn a_one_file_package_at_the_root_is_a_module_of_its_own() {
        let (_d, repo, base) = repo_with(&[
            ("setup.py", "from setuptools import setup\nsetup()\n"),
            ("xmltodict.py", "def parse(x):\n    return x\n"),
            ("README.md", "# xmltodict"),
            ("tests/test_xmltodict.py", "import xmltodict\n"),
        ]);
        let m = modules(&repo, &base).unwrap();
        let names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["tests", TOP_LEVEL_MODULE]);
        let top = &m[1];
        assert_eq!(top.files, ["xmltodict.py"], "no build script or README");
        assert!(top.holds("xmltodict.py") && top.holds("test_new.py"));
        assert!(!top.holds("tests/test_xmltodict.py"));
        assert!(m[0].holds("tests/test_xmltodict.py") && !m[0].holds("tests2/x.py"));
        // Paths are fenced by it like any module's.
        assert_eq!(
            check_path(&repo, &base, "xmltodict.py", &m[1..]).unwrap(),
            "xmltodict.py"
        );
        for bad in ["tests/test_xmltodict.py", "../xmltodict.py", ".git/config"] {
            assert!(check_path(&repo, &base, bad, &m[1..]).is_err(), "{bad}");
        }
    }

    #[test]
    fn hostile_paths_are_refused() {
        let (dir, repo, base) = repo_with(&[("core/pom.xml", "x"), ("api/pom.xml", "y")]);
        std::os::unix::fs::symlink("/etc", dir.path().join("core/link")).unwrap();
        let mut index = repo.index().unwrap();
        index.add_path(Path::new("core/link")).unwrap();
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        let sig = Signature::now("t", "t@t").unwrap();
        let parent = repo.find_commit(oid(&base).unwrap()).unwrap();
        let base = repo
            .commit(Some("HEAD"), &sig, &sig, "link", &tree, &[&parent])
            .unwrap()
            .to_string();
        let core = modules(&repo, &base)
            .unwrap()
            .into_iter()
            .filter(|m| m.name == "core")
            .collect::<Vec<_>>();
        for bad in [
            "../outside.java",
            "/etc/passwd",
            "core/../api/x.java",
            "api/x.java",
            "core/link/passwd",
            "core/pom.xml/x",
            "core/.git/config",
            "",
        ] {
            let e = check_path(&repo, &base, bad, &core).unwrap_err();
            assert!(matches!(e, TicketPrError::PathRefused { .. }), "{bad}: {e}");
        }
        assert_eq!(
            check_path(&repo, &base, "core/src/New.java", &core).unwrap(),
            "core/src/New.java"
        );
    }

    #[test]
    fn apply_commits_once_per_file_and_resumes_a_partial_branch() {
        let (dir, repo, base) = repo_with(&[("core/a.txt", "a\n"), ("core/b.txt", "b\n")]);
        let changes = vec![
            FileChange {
                file_path: "core/a.txt".into(),
                description: "a gets a second line".into(),
                new_content: "a\na2\n".into(),
            },
            FileChange {
                file_path: "core/c.txt".into(),
                description: "add c".into(),
                new_content: "c\n".into(),
            },
        ];
        // An attempt that stopped after the first commit.
        let mut stop_after_first = vec![];
        let first = apply(&repo, &base, "ticket/t-1", "T-1", &changes[..1], &mut |p| {
            stop_after_first.push(p.to_string())
        })
        .unwrap();
        assert_eq!(first.len(), 1);
        let all = apply(&repo, &base, "ticket/t-1", "T-1", &changes, &mut |_| {}).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0], first[0], "the first commit is not made again");
        let again = apply(&repo, &base, "ticket/t-1", "T-1", &changes, &mut |_| {}).unwrap();
        assert_eq!(again, all, "a finished branch is left as it is");
        // The working tree and HEAD did not move.
        assert_eq!(head(&repo).unwrap().1, base);
        assert!(!dir.path().join("core/c.txt").exists());
        check_clean(&repo).unwrap();
        // Another change list conflicts with the branch.
        let mut other = changes.clone();
        other[1].new_content = "different\n".into();
        let e = apply(&repo, &base, "ticket/t-1", "T-1", &other, &mut |_| {}).unwrap_err();
        assert!(matches!(e, TicketPrError::BranchConflict { .. }), "{e}");
        let patch = format_patch(&repo, &all).unwrap();
        assert!(
            patch.contains("Subject: [PATCH 1/2] fix(T-1): a gets a second line"),
            "{patch}"
        );
        assert!(patch.contains("+a2"), "{patch}");
    }

    #[test]
    fn diffs_are_unified_and_dirty_trees_are_refused() {
        let d = unified_diff("core/a.txt", Some("a\nb\n"), "a\nc\n").unwrap();
        assert!(
            d.contains("--- a/core/a.txt") && d.contains("-b\n") && d.contains("+c\n"),
            "{d}"
        );
        let d = unified_diff("core/n.txt", None, "n\n").unwrap();
        assert!(d.contains("--- /dev/null") && d.contains("+n\n"), "{d}");
        let (dir, repo, _) = repo_with(&[("core/a.txt", "a\n")]);
        std::fs::write(dir.path().join("core/a.txt"), "changed\n").unwrap();
        assert!(matches!(
            check_clean(&repo),
            Err(TicketPrError::Dirty { .. })
        ));
        assert!(matches!(
            open(&dir.path().join("core")),
            Err(TicketPrError::NotGit(_))
        ));
    }

    #[test]
    fn changes_are_based_on_the_default_branch_not_the_checked_out_one() {
        let (_d, repo, base) = repo_with(&[("a.txt", "a")]);
        let initial = head(&repo).unwrap().0;
        // The user works on a feature branch with a commit of its own.
        let feature = {
            let c = repo.find_commit(oid(&base).unwrap()).unwrap();
            repo.branch("feature", &c, false).unwrap();
            repo.set_head("refs/heads/feature").unwrap();
            let tree = c.tree().unwrap();
            let sig = Signature::now("t", "t@t").unwrap();
            repo.commit(Some("HEAD"), &sig, &sig, "wip", &tree, &[&c])
                .unwrap()
        };
        assert_eq!(
            head(&repo).unwrap(),
            ("feature".into(), feature.to_string())
        );
        let (name, commit) = default_branch(&repo).unwrap();
        if ["main", "master"].contains(&initial.as_str()) {
            assert_eq!((name, commit), (initial.clone(), base.clone()));
        }
        // origin/HEAD wins when the repository has one.
        repo.reference("refs/remotes/origin/trunk", feature, true, "t")
            .unwrap();
        repo.reference_symbolic(
            "refs/remotes/origin/HEAD",
            "refs/remotes/origin/trunk",
            true,
            "t",
        )
        .unwrap();
        assert_eq!(
            default_branch(&repo).unwrap(),
            ("origin/trunk".into(), feature.to_string())
        );
        repo.branch(
            "trunk",
            &repo.find_commit(oid(&base).unwrap()).unwrap(),
            false,
        )
        .unwrap();
        assert_eq!(
            default_branch(&repo).unwrap(),
            ("trunk".into(), base.clone())
        );
    }

    #[test]
    fn a_bare_word_that_names_no_remote_is_an_error_not_a_path() {
        let (d, repo, _base) = repo_with(&[("a.txt", "a")]);
        // Even with a folder of that name where the process runs.
        std::fs::create_dir_all(d.path().join("nosuch")).unwrap();
        let branch = head(&repo).unwrap().0;
        let err = push(&repo, "nosuch", &branch).unwrap_err();
        assert!(matches!(err, TicketPrError::UnknownRemote(_)), "{err}");
    }

    #[test]
    fn branch_names_are_stable_slugs() {
        assert_eq!(
            branch_name(
                "TASK-101",
                "Overdue list crashes: NullPointerException on tasks without a due date"
            ),
            "ticket/task-101-overdue-list-crashes"
        );
        assert_eq!(branch_name("T-1", "!!!"), "ticket/t-1");
    }
}
