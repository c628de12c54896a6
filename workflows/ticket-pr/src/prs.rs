//! The local pull requests: one durable record per branch in sled (the offline stand-in for
//! the seed's GitHub PR), numbered in order, created once.

use crate::error::TicketPrError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A pull request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PullRequest {
    /// Its number, from 1.
    pub number: u64,
    /// The ticket.
    pub ticket_key: String,
    /// `[KEY] summary`.
    pub title: String,
    /// Markdown.
    pub body: String,
    /// The repository's working tree.
    pub repo: String,
    /// The branch it merges into, and that branch's commit when the change was made.
    pub base_branch: String,
    /// The base commit.
    pub base_commit: String,
    /// The branch with the change.
    pub head_branch: String,
    /// The change's commits, oldest first.
    pub commits: Vec<String>,
    /// The `git format-patch` series, when written.
    pub patch_path: Option<String>,
    /// The remote the branch was pushed to, if any.
    pub pushed_to: Option<String>,
    /// The run that made it.
    pub thread_id: String,
    /// Milliseconds since the Unix epoch.
    pub created_ms: u64,
}

/// The pull requests under a data folder.
#[derive(Clone, Debug)]
pub struct PrStore {
    path: PathBuf,
}

const COUNTER: &[u8] = b"next_number";

fn record_key(repo: &str, branch: &str) -> Vec<u8> {
    format!("pr\0{repo}\0{branch}").into_bytes()
}

impl PrStore {
    /// The store in `dir` (a sled database, opened for each operation so that other
    /// processes can read it in between).
    pub fn new(dir: impl AsRef<Path>) -> Self {
        PrStore {
            path: dir.as_ref().to_path_buf(),
        }
    }

    fn db(&self) -> Result<sled::Db, TicketPrError> {
        if let Some(parent) = self.path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| TicketPrError::io(parent, e))?;
        }
        // A handle dropped a moment ago may still hold sled's lock: wait for it (bounded).
        Ok(ferrograph::checkpoint_savers::open_sled(
            &self.path,
            std::time::Duration::from_secs(5),
        )?)
    }

    /// Stores `pr` (its `number` is assigned) unless the repository already has a pull
    /// request for its branch, which is returned instead: creating twice creates once.
    pub fn create(&self, pr: PullRequest) -> Result<PullRequest, TicketPrError> {
        let db = self.db()?;
        let key = record_key(&pr.repo, &pr.head_branch);
        let result = db.transaction(|tx| {
            if let Some(existing) = tx.get(&key)? {
                return Ok(Err(existing.to_vec()));
            }
            let next = tx
                .get(COUNTER)?
                .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
                .map_or(1, u64::from_be_bytes);
            let mut pr = pr.clone();
            pr.number = next;
            let bytes = serde_json::to_vec(&pr).map_err(|e| {
                sled::transaction::ConflictableTransactionError::Abort(e.to_string())
            })?;
            tx.insert(COUNTER, &(next + 1).to_be_bytes())?;
            tx.insert(key.as_slice(), bytes)?;
            Ok(Ok(pr))
        });
        let out = match result {
            Ok(Ok(created)) => created,
            Ok(Err(existing)) => decode(&key, &existing)?,
            Err(sled::transaction::TransactionError::Abort(e)) => {
                return Err(TicketPrError::Tickets(format!(
                    "encoding a pull request: {e}"
                )))
            }
            Err(sled::transaction::TransactionError::Storage(e)) => return Err(e.into()),
        };
        db.flush()?;
        Ok(out)
    }

    /// Every pull request, by number.
    pub fn list(&self) -> Result<Vec<PullRequest>, TicketPrError> {
        if !self.path.exists() {
            return Ok(Vec::new());
        }
        let db = self.db()?;
        let mut out = Vec::new();
        for item in db.scan_prefix(b"pr\0") {
            let (k, v) = item?;
            out.push(decode(&k, &v)?);
        }
        out.sort_by_key(|p| p.number);
        Ok(out)
    }

    /// The pull request numbered `number`, or the newest one of ticket `number` when it is
    /// a ticket key.
    pub fn find(&self, which: &str) -> Result<Option<PullRequest>, TicketPrError> {
        let all = self.list()?;
        let which = which.trim_start_matches('#');
        Ok(match which.parse::<u64>() {
            Ok(n) => all.into_iter().find(|p| p.number == n),
            Err(_) => all.into_iter().rev().find(|p| p.ticket_key == which),
        })
    }
}

fn decode(key: &[u8], bytes: &[u8]) -> Result<PullRequest, TicketPrError> {
    serde_json::from_slice(bytes).map_err(|source| TicketPrError::Record {
        key: String::from_utf8_lossy(key).replace('\0', "/"),
        source,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pr(branch: &str) -> PullRequest {
        PullRequest {
            number: 0,
            ticket_key: "T-1".into(),
            title: "[T-1] x".into(),
            body: String::new(),
            repo: "/r".into(),
            base_branch: "main".into(),
            base_commit: "abc".into(),
            head_branch: branch.into(),
            commits: vec![],
            patch_path: None,
            pushed_to: None,
            thread_id: "t".into(),
            created_ms: 0,
        }
    }

    #[test]
    fn a_branch_gets_one_pull_request() {
        let dir = tempfile::tempdir().unwrap();
        let s = PrStore::new(dir.path().join("prs"));
        assert!(s.list().unwrap().is_empty());
        let a = s.create(pr("b1")).unwrap();
        let again = s.create(pr("b1")).unwrap();
        let b = s.create(pr("b2")).unwrap();
        assert_eq!((a.number, again.number, b.number), (1, 1, 2));
        assert_eq!(s.list().unwrap().len(), 2);
        assert_eq!(s.find("#2").unwrap().unwrap().head_branch, "b2");
        assert_eq!(s.find("T-1").unwrap().unwrap().number, 2);
        assert!(s.find("9").unwrap().is_none());
    }
}
