//! The team's git workspace (libgit2 through `git2`, as ticket-to-pr chose): a repository per
//! run where the engineer's and DevOps' files are committed, releases are tagged, and every
//! step can be replayed after a crash without a second commit or tag.

use crate::error::TeamError;
use git2::{Oid, Repository, Signature};
use std::collections::BTreeMap;
use std::path::Path;

/// The branch the team works on.
pub const BRANCH: &str = "main";

/// Refuses anything but plain relative paths of safe names (`name.py`,
/// `.github/workflows/ci.yml`): no `..`, no `.git`, nothing absolute.
pub fn check_path(p: &str) -> Result<(), TeamError> {
    let ok_part = |c: &str| {
        !c.is_empty()
            && c != "."
            && c != ".."
            && !c.eq_ignore_ascii_case(".git")
            && c.chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "_.-".contains(ch))
    };
    if p.is_empty() || p.len() > 120 || p.starts_with('/') || !p.split('/').all(ok_part) {
        return Err(TeamError::HostilePath(p.to_string()));
    }
    Ok(())
}

fn signature(who: &str) -> Result<Signature<'static>, TeamError> {
    Ok(Signature::now(
        who,
        &format!("{who}@team.ferrograph.local"),
    )?)
}

/// Opens the workspace at `dir`, creating it with a first commit of `readme` if needed.
pub fn open_or_init(dir: &Path, readme: &str) -> Result<Repository, TeamError> {
    if dir.join(".git").exists() {
        return Ok(Repository::open(dir)?);
    }
    std::fs::create_dir_all(dir).map_err(|e| TeamError::io(dir, e))?;
    let repo = Repository::init_opts(dir, git2::RepositoryInitOptions::new().initial_head(BRANCH))?;
    {
        let mut files = BTreeMap::new();
        files.insert("README.md".to_string(), readme.to_string());
        let tree = tree_with(&repo, None, &files)?;
        let tree = repo.find_tree(tree)?;
        let sig = signature("product_owner")?;
        repo.commit(
            Some(&format!("refs/heads/{BRANCH}")),
            &sig,
            &sig,
            "Start the requirement's workspace",
            &tree,
            &[],
        )?;
    }
    checkout(&repo)?;
    Ok(repo)
}

fn tree_with(
    repo: &Repository,
    base: Option<Oid>,
    files: &BTreeMap<String, String>,
) -> Result<Oid, TeamError> {
    let mut index = git2::Index::new()?;
    if let Some(b) = base {
        index.read_tree(&repo.find_commit(b)?.tree()?)?;
    }
    for (path, text) in files {
        check_path(path)?;
        let blob = repo.blob(text.as_bytes())?;
        index.add(&git2::IndexEntry {
            ctime: git2::IndexTime::new(0, 0),
            mtime: git2::IndexTime::new(0, 0),
            dev: 0,
            ino: 0,
            mode: 0o100644,
            uid: 0,
            gid: 0,
            file_size: text.len() as u32,
            id: blob,
            flags: path.len().min(0xfff) as u16,
            flags_extended: 0,
            path: path.as_bytes().to_vec(),
        })?;
    }
    Ok(index.write_tree_to(repo)?)
}

/// The branch's head commit.
pub fn head(repo: &Repository) -> Result<String, TeamError> {
    Ok(repo
        .find_reference(&format!("refs/heads/{BRANCH}"))?
        .peel_to_commit()?
        .id()
        .to_string())
}

fn checkout(repo: &Repository) -> Result<(), TeamError> {
    repo.set_head(&format!("refs/heads/{BRANCH}"))?;
    repo.checkout_head(Some(git2::build::CheckoutBuilder::new().force()))?;
    Ok(())
}

/// Commits `files` (added or replaced) on top of `parent`, by `author`, and checks the
/// working tree out. Replayed after a crash (the branch already holds this exact commit on
/// `parent`), it returns that commit instead of making a second one. A branch that moved
/// elsewhere is an error.
pub fn commit(
    repo: &Repository,
    parent: &str,
    files: &BTreeMap<String, String>,
    message: &str,
    author: &str,
) -> Result<String, TeamError> {
    let parent_oid = Oid::from_str(parent)?;
    let tree = tree_with(repo, Some(parent_oid), files)?;
    let head = repo
        .find_reference(&format!("refs/heads/{BRANCH}"))?
        .peel_to_commit()?;
    if head.id() != parent_oid {
        let replay = head.parent_id(0).ok() == Some(parent_oid)
            && head.tree_id() == tree
            && head.message() == Some(message);
        if replay {
            return Ok(head.id().to_string());
        }
        return Err(TeamError::Git(git2::Error::from_str(&format!(
            "branch {BRANCH} moved to {} while the team expected {parent}",
            head.id()
        ))));
    }
    if repo.find_commit(parent_oid)?.tree_id() == tree {
        return Ok(parent.to_string());
    }
    let sig = signature(author)?;
    let tree = repo.find_tree(tree)?;
    let parent_commit = repo.find_commit(parent_oid)?;
    let oid = repo.commit(
        Some(&format!("refs/heads/{BRANCH}")),
        &sig,
        &sig,
        message,
        &tree,
        &[&parent_commit],
    )?;
    checkout(repo)?;
    Ok(oid.to_string())
}

/// Moves the branch back to `to` (a compensation) and checks it out.
pub fn reset_branch(repo: &Repository, to: &str) -> Result<(), TeamError> {
    let oid = Oid::from_str(to)?;
    repo.reference(
        &format!("refs/heads/{BRANCH}"),
        oid,
        true,
        "compensation: reset",
    )?;
    checkout(repo)
}

/// Every file of a commit.
pub fn files_at(repo: &Repository, commit: &str) -> Result<BTreeMap<String, String>, TeamError> {
    let tree = repo.find_commit(Oid::from_str(commit)?)?.tree()?;
    let mut out = BTreeMap::new();
    let mut err = None;
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        if entry.kind() == Some(git2::ObjectType::Blob) {
            match entry.to_object(repo).and_then(|o| o.peel_to_blob()) {
                Ok(b) => {
                    let name = format!("{dir}{}", entry.name().unwrap_or_default());
                    out.insert(name, String::from_utf8_lossy(b.content()).into_owned());
                }
                Err(e) => {
                    err = Some(e);
                    return git2::TreeWalkResult::Abort;
                }
            }
        }
        git2::TreeWalkResult::Ok
    })?;
    match err {
        Some(e) => Err(e.into()),
        None => Ok(out),
    }
}

/// Tags `commit` as `name` (annotated). A tag already on that commit is kept (a replay);
/// one on another commit is an error.
pub fn tag(repo: &Repository, name: &str, commit: &str, message: &str) -> Result<(), TeamError> {
    let oid = Oid::from_str(commit)?;
    if let Ok(r) = repo.find_reference(&format!("refs/tags/{name}")) {
        let at = r.peel_to_commit()?.id();
        if at == oid {
            return Ok(());
        }
        return Err(TeamError::Git(git2::Error::from_str(&format!(
            "tag {name} already names {at}"
        ))));
    }
    let obj = repo.find_object(oid, None)?;
    repo.tag(name, &obj, &signature("devops_engineer")?, message, false)?;
    Ok(())
}

/// Deletes tag `name` if it exists (a compensation).
pub fn delete_tag(repo: &Repository, name: &str) -> Result<(), TeamError> {
    match repo.tag_delete(name) {
        Ok(()) => Ok(()),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Whether tag `name` exists.
pub fn has_tag(repo: &Repository, name: &str) -> bool {
    repo.find_reference(&format!("refs/tags/{name}")).is_ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn commits_once_tags_once_and_compensates() {
        let dir = tempfile::tempdir().unwrap();
        let repo = open_or_init(&dir.path().join("ws"), "# brief\n").unwrap();
        let base = head(&repo).unwrap();
        let files: BTreeMap<String, String> =
            [("calc.py".to_string(), "x = 1\n".to_string())].into();
        let c1 = commit(&repo, &base, &files, "feat: calc", "sse").unwrap();
        let again = commit(&repo, &base, &files, "feat: calc", "sse").unwrap();
        assert_eq!(c1, again, "a replay does not commit twice");
        assert!(dir.path().join("ws/calc.py").exists(), "checked out");
        let other: BTreeMap<String, String> =
            [("calc.py".to_string(), "x = 2\n".to_string())].into();
        assert!(
            commit(&repo, &base, &other, "feat: other", "sse").is_err(),
            "the branch moved"
        );
        assert_eq!(files_at(&repo, &c1).unwrap()["calc.py"], "x = 1\n");
        tag(&repo, "v1", &c1, "release").unwrap();
        tag(&repo, "v1", &c1, "release").unwrap();
        assert!(tag(&repo, "v1", &base, "release").is_err());
        delete_tag(&repo, "v1").unwrap();
        assert!(!has_tag(&repo, "v1"));
        reset_branch(&repo, &base).unwrap();
        assert_eq!(head(&repo).unwrap(), base);
        assert!(!dir.path().join("ws/calc.py").exists());
        for bad in [
            "../x.py",
            "/etc/passwd",
            ".git/config",
            "a/../../b",
            "",
            "x y.py",
        ] {
            assert!(check_path(bad).is_err(), "{bad}");
        }
        check_path("ci/ci.yml").unwrap();
    }
}
