//! The local ticket store: the offline stand-in for the seed's Jira. Tickets are files in a
//! folder (`KEY.json` or `KEY.md`), or one file; the comment the workflow posts is appended
//! to `KEY.comments.jsonl` next to them, once per comment id.
//!
//! Files inside the folder are opened without following symbolic links and must be plain
//! files: a link planted in the tickets folder (by a ticket's author, say) neither makes the
//! workflow read a file outside it as a ticket nor append a comment to one.

use crate::error::TicketPrError;
use serde::{Deserialize, Serialize};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// What kind of work a ticket asks for.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum TicketType {
    /// Something is broken.
    #[default]
    Bug,
    /// Something new is wanted.
    Story,
}

/// One ticket.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ticket {
    /// Its key, `PROJECT-123`.
    pub key: String,
    /// One line.
    pub summary: String,
    /// What is wrong or wanted.
    #[serde(default)]
    pub description: String,
    /// Bug or story.
    #[serde(rename = "type", default)]
    pub ticket_type: TicketType,
    /// Labels.
    #[serde(default)]
    pub labels: Vec<String>,
    /// A story's acceptance criteria.
    #[serde(default)]
    pub acceptance_criteria: Vec<String>,
}

/// A comment on a ticket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Comment {
    /// Unique per comment: a comment with an id already present is not added again.
    pub id: String,
    /// Who wrote it.
    pub author: String,
    /// Markdown.
    pub body: String,
    /// When, in milliseconds since the Unix epoch.
    pub created_ms: u64,
}

/// Tickets in a folder, or one ticket file.
#[derive(Clone, Debug)]
pub struct TicketStore {
    root: PathBuf,
}

/// Is `key` shaped like a ticket key (letters, digits, `-` and `_`, at most 64)? Keys name
/// files, so anything else (a path, `..`) is refused before the disk is touched.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 64
        && key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Opens `path`, a file the store keeps inside its folder: never through a symbolic link
/// (`O_NOFOLLOW`), never blocking on a FIFO, and only if it is a plain file.
fn open_plain(path: &Path, options: &mut std::fs::OpenOptions) -> std::io::Result<std::fs::File> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK);
    }
    let f = options.open(path).map_err(link_refused)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a plain file",
        ));
    }
    Ok(f)
}

/// Says what `O_NOFOLLOW`'s `ELOOP` means here.
fn link_refused(e: std::io::Error) -> std::io::Error {
    #[cfg(unix)]
    if e.raw_os_error() == Some(nix::libc::ELOOP) {
        return std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a symbolic link: ticket files and comments must be plain files in the tickets folder",
        );
    }
    e
}

/// Reads a file of the store's folder as text (see [`open_plain`]).
fn read_plain(path: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    open_plain(path, std::fs::OpenOptions::new().read(true))?.read_to_string(&mut text)?;
    Ok(text)
}

impl TicketStore {
    /// The store at `path` (a folder of tickets or one ticket file).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TicketPrError> {
        let root = path.as_ref().to_path_buf();
        if !root.exists() {
            return Err(TicketPrError::Tickets(format!(
                "{} does not exist",
                root.display()
            )));
        }
        Ok(TicketStore { root })
    }

    fn folder(&self) -> &Path {
        if self.root.is_file() {
            self.root.parent().unwrap_or(Path::new("."))
        } else {
            &self.root
        }
    }

    /// Every ticket file's key, sorted.
    pub fn keys(&self) -> Result<Vec<String>, TicketPrError> {
        if self.root.is_file() {
            return Ok(vec![self.read_file(&self.root)?.key]);
        }
        let mut keys = Vec::new();
        let rd = std::fs::read_dir(&self.root).map_err(|e| TicketPrError::io(&self.root, e))?;
        for entry in rd.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(key) = name
                .strip_suffix(".json")
                .or_else(|| name.strip_suffix(".md"))
            {
                if valid_key(key) && !name.ends_with(".comments.jsonl") {
                    keys.push(key.to_string());
                }
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// The ticket `key`.
    pub fn get(&self, key: &str) -> Result<Ticket, TicketPrError> {
        if !valid_key(key) {
            return Err(TicketPrError::UnknownTicket(format!(
                "`{key}` is not a ticket key (letters, digits, - and _)"
            )));
        }
        if self.root.is_file() {
            let t = self.read_file(&self.root)?;
            if t.key != key {
                return Err(TicketPrError::UnknownTicket(format!(
                    "{key} (the file {} holds {})",
                    self.root.display(),
                    t.key
                )));
            }
            return Ok(t);
        }
        for ext in ["json", "md"] {
            let p = self.root.join(format!("{key}.{ext}"));
            if p.symlink_metadata().is_ok() {
                let t = self.read_file(&p)?;
                if t.key != key {
                    return Err(TicketPrError::Tickets(format!(
                        "{} holds ticket {}, not {key}",
                        p.display(),
                        t.key
                    )));
                }
                return Ok(t);
            }
        }
        Err(TicketPrError::UnknownTicket(format!(
            "{key} (no {key}.json or {key}.md in {})",
            self.root.display()
        )))
    }

    fn read_file(&self, path: &Path) -> Result<Ticket, TicketPrError> {
        // The store's root, when it is one file, was named by the caller (and confined by
        // the server); files found in the folder are opened without following links.
        let text = if path == self.root {
            std::fs::read_to_string(path)
        } else {
            read_plain(path)
        }
        .map_err(|e| TicketPrError::io(path, e))?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let t = if path.extension().is_some_and(|e| e == "md") {
            parse_markdown(&text, &stem)
        } else {
            serde_json::from_str::<Ticket>(&text).map_err(|e| {
                TicketPrError::Tickets(format!("{} is not a ticket in JSON: {e}", path.display()))
            })
        }?;
        if !valid_key(&t.key) || t.summary.trim().is_empty() {
            return Err(TicketPrError::Tickets(format!(
                "{}: a ticket needs a key (letters, digits, - and _) and a summary",
                path.display()
            )));
        }
        Ok(t)
    }

    fn comments_path(&self, key: &str) -> PathBuf {
        self.folder().join(format!("{key}.comments.jsonl"))
    }

    /// The comments on `key`, oldest first. A torn last line (a write cut short by a crash)
    /// is not a comment.
    pub fn comments(&self, key: &str) -> Result<Vec<Comment>, TicketPrError> {
        let p = self.comments_path(key);
        let text = match read_plain(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(TicketPrError::io(&p, e)),
        };
        Ok(text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .filter_map(|l| serde_json::from_str(l.trim()).ok())
            .collect())
    }

    /// Appends `comment` to `key` unless a comment with its id is there already; returns
    /// whether it was added. The line is written and synced in one call; a torn line left by
    /// an earlier crash is cut off first.
    pub fn add_comment(&self, key: &str, comment: &Comment) -> Result<bool, TicketPrError> {
        if !valid_key(key) {
            return Err(TicketPrError::UnknownTicket(key.to_string()));
        }
        if self.comments(key)?.iter().any(|c| c.id == comment.id) {
            return Ok(false);
        }
        let p = self.comments_path(key);
        let mut f = open_plain(
            &p,
            std::fs::OpenOptions::new()
                .create(true)
                .read(true)
                .write(true)
                .truncate(false),
        )
        .map_err(|e| TicketPrError::io(&p, e))?;
        let mut existing = Vec::new();
        f.read_to_end(&mut existing)
            .map_err(|e| TicketPrError::io(&p, e))?;
        let keep = existing
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i + 1);
        if keep != existing.len() {
            f.set_len(keep as u64)
                .map_err(|e| TicketPrError::io(&p, e))?;
        }
        f.seek(SeekFrom::Start(keep as u64))
            .map_err(|e| TicketPrError::io(&p, e))?;
        let mut line = serde_json::to_string(comment)
            .map_err(|e| TicketPrError::Tickets(format!("comment: {e}")))?;
        line.push('\n');
        f.write_all(line.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| TicketPrError::io(&p, e))?;
        Ok(true)
    }
}

/// Reads a Markdown ticket:
///
/// ```text
/// # TASK-102: Add a priority to tasks
/// Type: Story
/// Labels: api, core
///
/// The description, any number of paragraphs.
///
/// ## Acceptance criteria
/// - A task has a priority: LOW, MEDIUM or HIGH
/// ```
///
/// The key comes from the heading (`KEY: summary`) or else the file name.
pub fn parse_markdown(text: &str, file_key: &str) -> Result<Ticket, TicketPrError> {
    let mut t = Ticket {
        key: file_key.to_string(),
        ..Ticket::default()
    };
    let mut description = Vec::new();
    let mut in_criteria = false;
    let mut seen_title = false;
    for line in text.lines() {
        let l = line.trim();
        if let Some(h) = l.strip_prefix("# ").filter(|_| !seen_title) {
            seen_title = true;
            match h.split_once(':') {
                Some((k, s)) if valid_key(k.trim()) => {
                    t.key = k.trim().to_string();
                    t.summary = s.trim().to_string();
                }
                _ => t.summary = h.trim().to_string(),
            }
            continue;
        }
        if let Some(h) = l.strip_prefix("## ") {
            in_criteria = h.to_lowercase().contains("acceptance");
            continue;
        }
        if in_criteria {
            if let Some(item) = l.strip_prefix("- ").or_else(|| l.strip_prefix("* ")) {
                t.acceptance_criteria.push(item.trim().to_string());
            }
            continue;
        }
        let lower = l.to_lowercase();
        if let Some(v) = lower.strip_prefix("type:") {
            t.ticket_type = match v.trim() {
                "story" | "feature" => TicketType::Story,
                "bug" => TicketType::Bug,
                other => {
                    return Err(TicketPrError::Tickets(format!(
                        "ticket {file_key}: unknown type `{other}` (Bug or Story)"
                    )))
                }
            };
            continue;
        }
        if lower.starts_with("labels:") {
            t.labels = l["labels:".len()..]
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            continue;
        }
        if seen_title {
            description.push(line);
        }
    }
    t.description = description.join("\n").trim().to_string();
    if !seen_title {
        return Err(TicketPrError::Tickets(format!(
            "ticket {file_key}: a Markdown ticket starts with `# KEY: summary`"
        )));
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn markdown_and_json_tickets_read_alike() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("T-2.md"),
            "# T-2: Add a priority\nType: Story\nLabels: api, core\n\nTasks need a priority.\n\n## Acceptance criteria\n- LOW, MEDIUM, HIGH\n- defaults to MEDIUM\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("T-1.json"),
            r#"{"key":"T-1","summary":"Crash","description":"NPE","type":"Bug"}"#,
        )
        .unwrap();
        let s = TicketStore::open(dir.path()).unwrap();
        assert_eq!(s.keys().unwrap(), ["T-1", "T-2"]);
        let t = s.get("T-2").unwrap();
        assert_eq!(t.ticket_type, TicketType::Story);
        assert_eq!(t.labels, ["api", "core"]);
        assert_eq!(t.acceptance_criteria.len(), 2);
        assert_eq!(t.description, "Tasks need a priority.");
        assert_eq!(s.get("T-1").unwrap().ticket_type, TicketType::Bug);
        assert!(matches!(s.get("T-9"), Err(TicketPrError::UnknownTicket(_))));
        assert!(matches!(
            s.get("../etc/passwd"),
            Err(TicketPrError::UnknownTicket(_))
        ));
        std::fs::write(dir.path().join("T-3.json"), "not json").unwrap();
        let e = s.get("T-3").unwrap_err().to_string();
        assert!(e.contains("not a ticket in JSON"), "{e}");
    }

    #[test]
    fn one_ticket_file_is_a_store_of_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("T-7.md");
        std::fs::write(&file, "# T-7: One file\nType: Bug\n\nBroken.\n").unwrap();
        let s = TicketStore::open(&file).unwrap();
        assert_eq!(s.keys().unwrap(), ["T-7"]);
        assert_eq!(s.get("T-7").unwrap().description, "Broken.");
        assert!(matches!(s.get("T-8"), Err(TicketPrError::UnknownTicket(_))));
        let c = Comment {
            id: "pr-1".into(),
            author: "ferrograph".into(),
            body: "x".into(),
            created_ms: 1,
        };
        assert!(s.add_comment("T-7", &c).unwrap());
        assert!(dir.path().join("T-7.comments.jsonl").is_file());
        assert!(TicketStore::open(dir.path().join("missing")).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn links_in_the_tickets_folder_are_neither_read_nor_appended_to() {
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim.txt");
        std::fs::write(&victim, "precious\n").unwrap();
        let secret = outside.path().join("secret.json");
        std::fs::write(&secret, r#"{"key":"T-2","summary":"read through a link"}"#).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("T-1.json"),
            r#"{"key":"T-1","summary":"a real ticket"}"#,
        )
        .unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("T-1.comments.jsonl")).unwrap();
        std::os::unix::fs::symlink(&secret, dir.path().join("T-2.json")).unwrap();
        let s = TicketStore::open(dir.path()).unwrap();
        let c = Comment {
            id: "c1".into(),
            author: "ferrograph".into(),
            body: "appended?".into(),
            created_ms: 0,
        };
        let err = s.add_comment("T-1", &c).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert!(s.comments("T-1").is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        let err = s.get("T-2").unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert_eq!(s.get("T-1").unwrap().summary, "a real ticket");
        // A FIFO is not waited on.
        let made = std::process::Command::new("mkfifo")
            .arg(dir.path().join("T-3.comments.jsonl"))
            .status()
            .unwrap();
        assert!(made.success());
        let err = s.add_comment("T-3", &c).unwrap_err().to_string();
        assert!(err.contains("not a plain file"), "{err}");
    }

    #[test]
    fn a_comment_is_added_once_and_a_torn_line_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("T-1.json"),
            r#"{"key":"T-1","summary":"x"}"#,
        )
        .unwrap();
        let s = TicketStore::open(dir.path()).unwrap();
        let c = Comment {
            id: "run-1".into(),
            author: "ferrograph".into(),
            body: "PR #1".into(),
            created_ms: 1,
        };
        // A crash cut an earlier write short.
        std::fs::write(
            dir.path().join("T-1.comments.jsonl"),
            "{\"id\":\"run-0\",\"au",
        )
        .unwrap();
        assert!(s.comments("T-1").unwrap().is_empty());
        assert!(s.add_comment("T-1", &c).unwrap());
        assert!(!s.add_comment("T-1", &c).unwrap());
        assert_eq!(s.comments("T-1").unwrap(), vec![c]);
    }
}
