//! Paths that API clients put in a workflow's input, confined to roots configured on the
//! server.
//!
//! A workflow declares which of its input fields name paths ([`InputPath`]) and what it does
//! with them ([`PathRole`]). The CLI trusts its own user and passes paths through; the HTTP
//! server resolves every declared field through [`PathRoots::confine`] before the input reaches
//! the workflow, so a client can neither read a folder outside the configured workspace roots
//! nor make the server create or write one outside its output root. Symbolic links are
//! resolved before the check, and the field is replaced by the resolved path, so the workflow
//! opens what was checked.

use serde_json::Value;
use std::path::{Component, Path, PathBuf};

/// What a workflow does with a path from its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PathRole {
    /// Reads an existing file or folder (a repository, a dataset): it must exist inside one of
    /// the workspace roots.
    Read,
    /// Creates or writes a folder (reports, traces): it must lie inside the output root
    /// (a relative path is taken from there).
    Output,
    /// Pushes to a git remote: the name of a remote the repository configures (letters,
    /// digits, `.`, `_`, `-`), or a path or `file://` URL of an existing repository inside
    /// the workspace roots or the output root. Network URLs are refused: a server's client
    /// may not make it push anywhere else.
    Remote,
}

/// One input field that names a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputPath {
    /// The field of the input object (top level).
    pub field: &'static str,
    /// What the workflow does with it.
    pub role: PathRole,
}

impl InputPath {
    /// A field read from inside the workspace roots.
    pub const fn read(field: &'static str) -> Self {
        InputPath {
            field,
            role: PathRole::Read,
        }
    }

    /// A field written inside the output root.
    pub const fn output(field: &'static str) -> Self {
        InputPath {
            field,
            role: PathRole::Output,
        }
    }

    /// A git remote pushed to (see [`PathRole::Remote`]).
    pub const fn remote(field: &'static str) -> Self {
        InputPath {
            field,
            role: PathRole::Remote,
        }
    }
}

/// Why a path from a client was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// The field is not a string.
    #[error("`{field}` must be a path string")]
    NotAString {
        /// The input field.
        field: &'static str,
    },
    /// The server has no workspace roots, so it reads no client-chosen paths.
    #[error(
        "`{field}`: this server reads no paths from clients (start it with `--workspace DIR` to allow folders under DIR)"
    )]
    NoWorkspaceRoots {
        /// The input field.
        field: &'static str,
    },
    /// The path does not exist (or cannot be resolved).
    #[error("`{field}`: `{path}` does not exist or cannot be read")]
    NotFound {
        /// The input field.
        field: &'static str,
        /// The path as given.
        path: String,
    },
    /// The path resolves outside every allowed root.
    #[error("`{field}`: `{path}` is outside the folders this server allows ({allowed})")]
    Outside {
        /// The input field.
        field: &'static str,
        /// The path as given.
        path: String,
        /// The allowed roots, for the message.
        allowed: String,
    },
    /// A remote is a network URL, which a server's clients may not push to.
    #[error(
        "`{field}`: `{remote}` is a network address; this server pushes only to a remote the repository names or to a repository inside its folders"
    )]
    NetworkRemote {
        /// The input field.
        field: &'static str,
        /// The remote as given.
        remote: String,
    },
    /// An output path climbs with `..` or is otherwise not a plain path.
    #[error("`{field}`: `{path}` may not contain `..` or a root prefix")]
    Climbs {
        /// The input field.
        field: &'static str,
        /// The path as given.
        path: String,
    },
}

/// The folders a server lets its clients name: workspace roots to read from and one output
/// root to write under. Both are resolved (symbolic links followed) when built.
#[derive(Clone, Debug)]
pub struct PathRoots {
    read: Vec<PathBuf>,
    output: PathBuf,
}

impl PathRoots {
    /// Roots from folders that must exist (`read`) and an output folder (created if missing).
    pub fn new(
        read: impl IntoIterator<Item = PathBuf>,
        output: impl AsRef<Path>,
    ) -> std::io::Result<Self> {
        let read = read
            .into_iter()
            .map(|p| {
                std::fs::canonicalize(&p).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("workspace root {}: {e}", p.display()))
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let output = output.as_ref();
        std::fs::create_dir_all(output)?;
        let output = std::fs::canonicalize(output)?;
        Ok(PathRoots { read, output })
    }

    /// The resolved workspace roots.
    pub fn read_roots(&self) -> &[PathBuf] {
        &self.read
    }

    /// The resolved output root.
    pub fn output_root(&self) -> &Path {
        &self.output
    }

    /// Resolves every declared path field of `input` (an object) in place; fields that are
    /// absent, null or empty are left alone (the workflow's defaults apply).
    pub fn confine(&self, fields: &[InputPath], input: &mut Value) -> Result<(), PathError> {
        let Some(obj) = input.as_object_mut() else {
            return Ok(());
        };
        for f in fields {
            let Some(v) = obj.get_mut(f.field) else {
                continue;
            };
            let given = match v {
                Value::Null => continue,
                Value::String(s) if s.is_empty() => continue,
                Value::String(s) => s.clone(),
                _ => return Err(PathError::NotAString { field: f.field }),
            };
            let resolved = match f.role {
                PathRole::Read => self.resolve_read(f.field, &given)?,
                PathRole::Output => self.resolve_output(f.field, &given)?,
                PathRole::Remote => match self.resolve_remote(f.field, &given)? {
                    Some(p) => p,
                    None => continue,
                },
            };
            *v = Value::String(resolved.display().to_string());
        }
        Ok(())
    }

    fn resolve_read(&self, field: &'static str, given: &str) -> Result<PathBuf, PathError> {
        if self.read.is_empty() {
            return Err(PathError::NoWorkspaceRoots { field });
        }
        let p = Path::new(given);
        let candidates: Vec<PathBuf> = if p.is_absolute() {
            vec![p.to_path_buf()]
        } else {
            self.read.iter().map(|r| r.join(p)).collect()
        };
        let mut found = false;
        for c in candidates {
            let Ok(real) = std::fs::canonicalize(&c) else {
                continue;
            };
            found = true;
            if self.read.iter().any(|r| real.starts_with(r)) {
                return Ok(real);
            }
        }
        if found {
            Err(PathError::Outside {
                field,
                path: given.to_string(),
                allowed: join_roots(&self.read),
            })
        } else {
            Err(PathError::NotFound {
                field,
                path: given.to_string(),
            })
        }
    }

    /// A remote's name is left as it is (`None`); a path must be an existing folder inside
    /// the workspace roots or the output root.
    fn resolve_remote(
        &self,
        field: &'static str,
        given: &str,
    ) -> Result<Option<PathBuf>, PathError> {
        let is_name = given
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            && !given.starts_with(['.', '-']);
        if is_name {
            return Ok(None);
        }
        let path = match given.strip_prefix("file://") {
            Some(p) => p,
            None if given.contains("://") || looks_like_scp(given) => {
                return Err(PathError::NetworkRemote {
                    field,
                    remote: given.to_string(),
                })
            }
            None => given,
        };
        let real = std::fs::canonicalize(path).map_err(|_| PathError::NotFound {
            field,
            path: given.to_string(),
        })?;
        let inside =
            self.read.iter().any(|r| real.starts_with(r)) || real.starts_with(&self.output);
        if !inside {
            let mut allowed = self.read.clone();
            allowed.push(self.output.clone());
            return Err(PathError::Outside {
                field,
                path: given.to_string(),
                allowed: join_roots(&allowed),
            });
        }
        Ok(Some(real))
    }

    fn resolve_output(&self, field: &'static str, given: &str) -> Result<PathBuf, PathError> {
        let p = Path::new(given);
        let climbs = p
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::Prefix(_)));
        if climbs {
            return Err(PathError::Climbs {
                field,
                path: given.to_string(),
            });
        }
        let full = if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.output.join(p)
        };
        // The longest part that exists is resolved (links followed); what follows it does not
        // exist yet, holds no `..`, and so cannot leave the resolved part.
        let mut existing = full.as_path();
        let mut rest = Vec::new();
        let real = loop {
            match std::fs::canonicalize(existing) {
                Ok(r) => break r,
                Err(_) => match (existing.parent(), existing.file_name()) {
                    (Some(parent), Some(name)) => {
                        rest.push(name.to_os_string());
                        existing = parent;
                    }
                    _ => {
                        return Err(PathError::NotFound {
                            field,
                            path: given.to_string(),
                        })
                    }
                },
            }
        };
        if !real.starts_with(&self.output) {
            return Err(PathError::Outside {
                field,
                path: given.to_string(),
                allowed: self.output.display().to_string(),
            });
        }
        let mut out = real;
        for name in rest.into_iter().rev() {
            out.push(name);
        }
        Ok(out)
    }
}

/// git's scp-like address, `user@host:path` or `host:path` (a colon before any slash).
fn looks_like_scp(s: &str) -> bool {
    match (s.find(':'), s.find('/')) {
        (Some(colon), Some(slash)) => colon < slash,
        (Some(_), None) => true,
        _ => false,
    }
}

fn join_roots(roots: &[PathBuf]) -> String {
    roots
        .iter()
        .map(|r| r.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FIELDS: &[InputPath] = &[InputPath::read("repo"), InputPath::output("out")];

    fn setup() -> (tempfile::TempDir, PathRoots) {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("ws/project")).unwrap();
        std::fs::create_dir_all(t.path().join("secret")).unwrap();
        let roots = PathRoots::new([t.path().join("ws")], t.path().join("data")).unwrap();
        (t, roots)
    }

    #[test]
    fn paths_inside_the_roots_are_resolved() {
        let (t, roots) = setup();
        let mut v = json!({"repo": "project", "out": "runs/one", "other": 3});
        roots.confine(FIELDS, &mut v).unwrap();
        let ws = std::fs::canonicalize(t.path().join("ws/project")).unwrap();
        assert_eq!(v["repo"], json!(ws.display().to_string()));
        let data = std::fs::canonicalize(t.path().join("data")).unwrap();
        assert_eq!(v["out"], json!(data.join("runs/one").display().to_string()));
        assert_eq!(v["other"], json!(3));
        let mut abs = json!({"repo": ws.display().to_string()});
        roots.confine(FIELDS, &mut abs).unwrap();
        // Absent, null and empty fields are left to the workflow's defaults.
        let mut none = json!({"repo": null, "out": ""});
        roots.confine(FIELDS, &mut none).unwrap();
        assert_eq!(none, json!({"repo": null, "out": ""}));
    }

    #[test]
    fn remotes_are_names_or_repositories_inside_the_roots() {
        let (t, roots) = setup();
        std::fs::create_dir_all(t.path().join("data/bare.git")).unwrap();
        std::fs::create_dir_all(t.path().join("secret/bare.git")).unwrap();
        const REMOTE: &[InputPath] = &[InputPath::remote("remote")];
        for name in ["origin", "upstream-2", "my_fork.main"] {
            let mut v = json!({ "remote": name });
            roots.confine(REMOTE, &mut v).unwrap();
            assert_eq!(v["remote"], json!(name), "a name is left to the repository");
        }
        let inside = std::fs::canonicalize(t.path().join("data/bare.git")).unwrap();
        let ws = std::fs::canonicalize(t.path().join("ws/project")).unwrap();
        for given in [
            inside.display().to_string(),
            format!("file://{}", inside.display()),
            ws.display().to_string(),
        ] {
            let mut v = json!({ "remote": given });
            roots.confine(REMOTE, &mut v).unwrap();
            assert!(v["remote"].as_str().unwrap().starts_with('/'), "{v}");
        }
        let secret = t.path().join("secret/bare.git").display().to_string();
        for (given, outside) in [
            (secret.clone(), true),
            (format!("file://{secret}"), true),
            (
                format!("{}/ws/../secret/bare.git", t.path().display()),
                true,
            ),
            ("https://example.com/x.git".to_string(), false),
            ("ssh://git@example.com/x.git".to_string(), false),
            ("git@example.com:x.git".to_string(), false),
            ("example.com:x".to_string(), false),
        ] {
            let mut v = json!({ "remote": given });
            let err = roots.confine(REMOTE, &mut v).unwrap_err();
            if outside {
                assert!(matches!(err, PathError::Outside { .. }), "{given}: {err}");
            } else {
                assert!(
                    matches!(err, PathError::NetworkRemote { .. }),
                    "{given}: {err}"
                );
            }
        }
        let mut missing = json!({"remote": "/no/such/repo.git"});
        assert!(matches!(
            roots.confine(REMOTE, &mut missing),
            Err(PathError::NotFound { .. })
        ));
    }

    #[test]
    fn paths_outside_the_roots_are_refused() {
        let (t, roots) = setup();
        let secret = t.path().join("secret").display().to_string();
        for (field, value) in [
            ("repo", secret.clone()),
            ("repo", "../secret".into()),
            ("repo", "/".into()),
            ("out", secret.clone()),
            ("out", "../secret".into()),
            ("out", "runs/../../secret".into()),
            ("out", "/tmp/anywhere".into()),
        ] {
            let mut v = json!({ field: value });
            let err = roots.confine(FIELDS, &mut v).unwrap_err();
            assert!(
                matches!(err, PathError::Outside { .. } | PathError::Climbs { .. }),
                "{field}={value}: {err}"
            );
        }
        let mut missing = json!({"repo": "nope"});
        assert!(matches!(
            roots.confine(FIELDS, &mut missing),
            Err(PathError::NotFound { .. })
        ));
        let mut number = json!({"repo": 3});
        assert!(matches!(
            roots.confine(FIELDS, &mut number),
            Err(PathError::NotAString { .. })
        ));
    }

    #[cfg(unix)]
    #[test]
    fn symbolic_links_are_followed_before_the_check() {
        let (t, roots) = setup();
        std::os::unix::fs::symlink(t.path().join("secret"), t.path().join("ws/link")).unwrap();
        std::os::unix::fs::symlink(t.path().join("secret"), t.path().join("data/out")).unwrap();
        let mut v = json!({"repo": "link"});
        assert!(matches!(
            roots.confine(FIELDS, &mut v),
            Err(PathError::Outside { .. })
        ));
        let mut v = json!({"out": "out/reports"});
        assert!(matches!(
            roots.confine(FIELDS, &mut v),
            Err(PathError::Outside { .. })
        ));
    }

    #[test]
    fn without_workspace_roots_nothing_is_read() {
        let t = tempfile::tempdir().unwrap();
        let roots = PathRoots::new(Vec::new(), t.path().join("data")).unwrap();
        let mut v = json!({"repo": t.path().display().to_string()});
        assert!(matches!(
            roots.confine(FIELDS, &mut v),
            Err(PathError::NoWorkspaceRoots { .. })
        ));
        let mut out = json!({"out": "x"});
        roots.confine(FIELDS, &mut out).unwrap();
    }
}
