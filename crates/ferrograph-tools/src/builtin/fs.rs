//! `read_file`, `list_dir` and `grep`, confined to one root directory.
//!
//! Every path argument is relative to the root. A path with a `..` component is refused before
//! touching the disk; the rest are canonicalized (resolving every symlink) and refused unless
//! the result is still inside the canonical root, which gives a clear error for a symlink
//! leading out. The files and directories are then opened through a handle on the root
//! ([`cap_std`]), which resolves every component again inside the root and refuses to leave
//! it, so a symlink swapped in between the check and the open cannot escape either. Metadata
//! is read from the opened file, not by name, and `grep` reads at most its size limit from each
//! file however much the file grows meanwhile. `grep` does not descend into symlinked
//! directories, skips symlinked files that lead outside the root, and stops after
//! [`FsLimits::max_grep_duration`]; `list_dir` stops scanning after
//! [`FsLimits::max_list_scan`] entries.

use crate::registry::ToolRegistry;
use crate::tool::{decode_args, parameters_schema, Tool, ToolContext, ToolError};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Size limits of the file-system tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsLimits {
    /// Most bytes `read_file` returns per call (larger files are read in pages with `offset`).
    pub max_read_bytes: u64,
    /// Most entries `list_dir` returns.
    pub max_list_entries: usize,
    /// Most matching lines `grep` returns.
    pub max_grep_matches: usize,
    /// Files larger than this are skipped by `grep`.
    pub max_grep_file_bytes: u64,
    /// Most files `grep` opens.
    pub max_grep_files: usize,
    /// Longest regular expression `grep` accepts, in bytes.
    pub max_pattern_len: usize,
    /// Matching lines longer than this are cut (in characters).
    pub max_line_chars: usize,
    /// Longest time one `grep` call walks and reads before it answers what it found.
    pub max_grep_duration: Duration,
    /// Most directory entries `list_dir` scans (the count it reports is then a lower bound).
    pub max_list_scan: usize,
}

impl Default for FsLimits {
    fn default() -> Self {
        FsLimits {
            max_read_bytes: 64 * 1024,
            max_list_entries: 1000,
            max_grep_matches: 200,
            max_grep_file_bytes: 2 * 1024 * 1024,
            max_grep_files: 20_000,
            max_pattern_len: 1024,
            max_line_chars: 400,
            max_grep_duration: Duration::from_secs(10),
            max_list_scan: 100_000,
        }
    }
}

#[derive(Debug)]
struct FsInner {
    root: PathBuf,
    /// A handle on `root`: every open goes through it and cannot leave it.
    dir: cap_std::fs::Dir,
    limits: FsLimits,
}

/// The file-system tools over one root directory. Cheap to clone.
///
/// ```no_run
/// # fn demo() -> Result<(), ferrograph_tools::ToolError> {
/// use ferrograph_tools::{builtin::FsTools, ToolRegistry};
/// let mut registry = ToolRegistry::new();
/// FsTools::new("docs")?.register_all(&mut registry)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct FsTools {
    inner: Arc<FsInner>,
}

impl FsTools {
    /// Tools confined to `root` (which must be an existing directory), with default limits.
    pub fn new(root: impl AsRef<Path>) -> Result<Self, ToolError> {
        Self::with_limits(root, FsLimits::default())
    }

    /// Tools confined to `root` with `limits`.
    pub fn with_limits(root: impl AsRef<Path>, limits: FsLimits) -> Result<Self, ToolError> {
        let root = root.as_ref();
        let canonical = std::fs::canonicalize(root).map_err(|source| ToolError::Io {
            path: root.to_path_buf(),
            source,
        })?;
        if !canonical.is_dir() {
            return Err(ToolError::failed(format!(
                "tool root {} is not a directory",
                root.display()
            )));
        }
        let dir = cap_std::fs::Dir::open_ambient_dir(&canonical, cap_std::ambient_authority())
            .map_err(|source| ToolError::Io {
                path: root.to_path_buf(),
                source,
            })?;
        Ok(FsTools {
            inner: Arc::new(FsInner {
                root: canonical,
                dir,
                limits,
            }),
        })
    }

    /// The canonical root directory.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// The limits.
    pub fn limits(&self) -> &FsLimits {
        &self.inner.limits
    }

    /// Resolves `path` (relative to the root; `""` or `.` is the root) to a canonical path
    /// inside the root: [`ToolError::Denied`] for `..` components, absolute paths outside the
    /// root and symlinks that lead out of it; [`ToolError::Io`] when it does not exist.
    pub fn resolve(&self, path: &str) -> Result<PathBuf, ToolError> {
        let denied = |reason: &str| ToolError::Denied {
            path: path.to_string(),
            reason: reason.to_string(),
        };
        if path.contains('\0') {
            return Err(denied("the path contains a NUL byte"));
        }
        let p = Path::new(path);
        if p.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(denied("`..` is not allowed"));
        }
        let joined = if p.is_absolute() {
            if !p.starts_with(&self.inner.root) {
                return Err(denied("absolute paths must lie inside the tool root"));
            }
            p.to_path_buf()
        } else {
            self.inner.root.join(p)
        };
        let canonical = std::fs::canonicalize(&joined).map_err(|source| ToolError::Io {
            path: PathBuf::from(path),
            source,
        })?;
        if !canonical.starts_with(&self.inner.root) {
            return Err(denied(
                "it resolves (through a symlink) outside the tool root",
            ));
        }
        Ok(canonical)
    }

    fn relative(&self, path: &Path) -> String {
        let rel = path.strip_prefix(&self.inner.root).unwrap_or(path);
        let s = rel.to_string_lossy().replace('\\', "/");
        if s.is_empty() {
            ".".to_string()
        } else {
            s
        }
    }

    /// `canonical` (a path [`FsTools::resolve`] returned) relative to the root, for opening
    /// through the root's handle.
    fn inside<'a>(&self, canonical: &'a Path) -> &'a Path {
        match canonical.strip_prefix(&self.inner.root) {
            Ok(rel) if !rel.as_os_str().is_empty() => rel,
            _ => Path::new("."),
        }
    }

    /// Maps an error of an open through the root's handle: one that would have left the root
    /// (a symlink swapped in after the check) is [`ToolError::Denied`].
    fn open_error(path: &str, source: std::io::Error) -> ToolError {
        if source.kind() == std::io::ErrorKind::PermissionDenied {
            ToolError::Denied {
                path: path.to_string(),
                reason: format!("it leads outside the tool root ({source})"),
            }
        } else {
            ToolError::Io {
                path: PathBuf::from(path),
                source,
            }
        }
    }

    /// Opens the file at `canonical` through the root's handle.
    fn open_confined(&self, canonical: &Path, shown: &str) -> Result<std::fs::File, ToolError> {
        self.inner
            .dir
            .open(self.inside(canonical))
            .map(cap_std::fs::File::into_std)
            .map_err(|e| Self::open_error(shown, e))
    }

    /// Opens `path` (under the root) for `grep`: through the root's handle, which never
    /// follows an absolute symlink; such a link is followed here only when its target is inside
    /// the root, and the target is opened through the handle again.
    fn open_for_grep(&self, path: &Path) -> Option<std::fs::File> {
        let dir = &self.inner.dir;
        match dir.open(self.inside(path)) {
            Ok(f) => Some(f.into_std()),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                let target = std::fs::canonicalize(path).ok()?;
                if !target.starts_with(&self.inner.root) {
                    return None;
                }
                dir.open(self.inside(&target))
                    .ok()
                    .map(cap_std::fs::File::into_std)
            }
            Err(_) => None,
        }
    }

    /// The `read_file` tool.
    pub fn read_file(&self) -> ReadFileTool {
        ReadFileTool(self.clone())
    }

    /// The `list_dir` tool.
    pub fn list_dir(&self) -> ListDirTool {
        ListDirTool(self.clone())
    }

    /// The `grep` tool.
    pub fn grep(&self) -> GrepTool {
        GrepTool(self.clone())
    }

    /// Registers `read_file`, `list_dir` and `grep`.
    pub fn register_all(&self, registry: &mut ToolRegistry) -> Result<(), ToolError> {
        registry.register(self.read_file())?;
        registry.register(self.list_dir())?;
        registry.register(self.grep())?;
        Ok(())
    }

    fn read_file_sync(&self, args: ReadFileArgs) -> Result<Value, ToolError> {
        let path = self.resolve(&args.path)?;
        let io = |source| ToolError::Io {
            path: PathBuf::from(&args.path),
            source,
        };
        let mut file = self.open_confined(&path, &args.path)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(ToolError::failed(format!("`{}` is not a file", args.path)));
        }
        let size = meta.len();
        let offset = args.offset.unwrap_or(0);
        if offset > size {
            return Err(ToolError::failed(format!(
                "offset {offset} is past the end of `{}` ({size} bytes)",
                args.path
            )));
        }
        let limit = args
            .max_bytes
            .unwrap_or(self.inner.limits.max_read_bytes)
            .min(self.inner.limits.max_read_bytes);
        file.seek(SeekFrom::Start(offset)).map_err(io)?;
        let mut buf = Vec::new();
        file.take(limit).read_to_end(&mut buf).map_err(io)?;
        if buf.contains(&0) {
            return Err(ToolError::failed(format!(
                "`{}` looks like a binary file",
                args.path
            )));
        }
        let end = offset + buf.len() as u64;
        let mut text = String::from_utf8_lossy(&buf).into_owned();
        if end < size {
            text.push_str(&format!(
                "\n[truncated: `{}` has {size} bytes; this is bytes {offset}..{end}; call read_file \
                 again with offset={end} for more]",
                args.path
            ));
        }
        Ok(Value::String(text))
    }

    fn list_dir_sync(&self, args: ListDirArgs) -> Result<Value, ToolError> {
        let given = args.path.unwrap_or_else(|| ".".to_string());
        let path = self.resolve(&given)?;
        let io = |source| ToolError::Io {
            path: PathBuf::from(&given),
            source,
        };
        let mut entries = Vec::new();
        let mut total = 0usize;
        let mut scan_cut = false;
        let listing = self
            .inner
            .dir
            .read_dir(self.inside(&path))
            .map_err(|e| Self::open_error(&given, e))?;
        for entry in listing {
            let entry = entry.map_err(io)?;
            total += 1;
            if total > self.inner.limits.max_list_scan {
                scan_cut = true;
                total -= 1;
                break;
            }
            // Without following symlinks: a symlink is listed as one.
            let file_type = entry.file_type().map_err(io)?;
            let kind = if file_type.is_symlink() {
                "symlink"
            } else if file_type.is_dir() {
                "dir"
            } else {
                "file"
            };
            let size = if file_type.is_file() {
                entry.metadata().ok().map(|m| m.len())
            } else {
                None
            };
            entries.push(DirEntry {
                name: entry.file_name().to_string_lossy().into_owned(),
                kind: kind.to_string(),
                size,
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let truncated = scan_cut || entries.len() > self.inner.limits.max_list_entries;
        entries.truncate(self.inner.limits.max_list_entries);
        let listing = DirListing {
            path: self.relative(&path),
            entries,
            total,
            truncated,
        };
        crate::tool::encode_output(&listing)
    }

    fn grep_sync(&self, args: GrepArgs) -> Result<Value, ToolError> {
        let limits = self.inner.limits;
        if args.pattern.len() > limits.max_pattern_len {
            return Err(ToolError::Limit(format!(
                "the pattern is longer than {} bytes",
                limits.max_pattern_len
            )));
        }
        let re = regex::RegexBuilder::new(&args.pattern)
            .case_insensitive(args.case_insensitive.unwrap_or(false))
            .size_limit(1 << 20)
            .build()
            .map_err(|e| ToolError::invalid_arguments("grep", format!("bad pattern: {e}")))?;
        let start = self.resolve(args.path.as_deref().unwrap_or("."))?;
        let max_matches = args
            .max_matches
            .unwrap_or(limits.max_grep_matches)
            .min(limits.max_grep_matches);
        let mut out = Vec::new();
        let mut files = 0usize;
        let mut truncated = false;
        let started = Instant::now();
        let mut timed_out = false;
        let dir = &self.inner.dir;
        let mut stack = vec![start];
        'walk: while let Some(path) = stack.pop() {
            if started.elapsed() > limits.max_grep_duration {
                timed_out = true;
                truncated = true;
                break;
            }
            let rel = self.inside(&path).to_path_buf();
            let Ok(meta) = dir.symlink_metadata(&rel) else {
                continue;
            };
            if meta.is_dir() {
                let Ok(rd) = dir.read_dir(&rel) else {
                    continue;
                };
                let mut children: Vec<PathBuf> = rd
                    .filter_map(Result::ok)
                    .filter(|e| e.file_name() != ".git")
                    .map(|e| path.join(e.file_name()))
                    .collect();
                // Reverse order on the stack gives a sorted walk.
                children.sort_by(|a, b| b.cmp(a));
                stack.extend(children);
                continue;
            }
            // A file or a symlink, opened through the root's handle: a symlink is followed
            // only while it stays inside the root, and a directory behind one is not entered.
            let Some(file) = self.open_for_grep(&path) else {
                continue;
            };
            let Ok(fmeta) = file.metadata() else {
                continue;
            };
            if !fmeta.is_file() || fmeta.len() > limits.max_grep_file_bytes {
                continue;
            }
            files += 1;
            if files > limits.max_grep_files {
                truncated = true;
                break;
            }
            // Bounded by the limit, not by the size read above: the file may grow meanwhile.
            let mut bytes = Vec::new();
            if file
                .take(limits.max_grep_file_bytes)
                .read_to_end(&mut bytes)
                .is_err()
            {
                continue;
            }
            if bytes.contains(&0) {
                continue;
            }
            let text = String::from_utf8_lossy(&bytes);
            let shown = self.relative(&path);
            for (n, line) in text.lines().enumerate() {
                if re.is_match(line) {
                    if out.len() >= max_matches {
                        truncated = true;
                        break 'walk;
                    }
                    let mut cut: String = line.chars().take(limits.max_line_chars).collect();
                    if line.chars().nth(limits.max_line_chars).is_some() {
                        cut.push('…');
                    }
                    out.push(format!("{shown}:{}: {cut}", n + 1));
                }
            }
        }
        let mut text = if out.is_empty() {
            "no matches".to_string()
        } else {
            out.join("\n")
        };
        if timed_out {
            text.push_str(&format!(
                "\n[stopped after {:.0} s with {} matches in {} files; narrow the pattern or the path]",
                limits.max_grep_duration.as_secs_f64(),
                out.len(),
                files
            ));
        } else if truncated {
            text.push_str(&format!(
                "\n[truncated after {} matches in {} files; narrow the pattern or the path]",
                out.len(),
                files.min(limits.max_grep_files)
            ));
        }
        Ok(Value::String(text))
    }
}

async fn blocking<T, F>(f: F) -> Result<T, ToolError>
where
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ToolError::failed(format!("file-system task failed: {e}")))?
}

/// Arguments of `read_file`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// Path of the file, relative to the root directory.
    pub path: String,
    /// Byte offset to start reading at (default 0).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Most bytes to read (capped by the tool's limit).
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

/// Arguments of `list_dir`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDirArgs {
    /// Directory to list, relative to the root directory (default: the root).
    #[serde(default)]
    pub path: Option<String>,
}

/// Arguments of `grep`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    /// Regular expression (Rust `regex` syntax) matched against each line.
    pub pattern: String,
    /// File or directory to search, relative to the root directory (default: the root).
    #[serde(default)]
    pub path: Option<String>,
    /// Match without regard to case.
    #[serde(default)]
    pub case_insensitive: Option<bool>,
    /// Most matching lines to return (capped by the tool's limit).
    #[serde(default)]
    pub max_matches: Option<usize>,
}

/// One entry of a `list_dir` result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DirEntry {
    /// File name.
    pub name: String,
    /// `file`, `dir` or `symlink`.
    pub kind: String,
    /// Size in bytes (files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// A `list_dir` result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DirListing {
    /// The directory, relative to the root.
    pub path: String,
    /// Entries, sorted by name.
    pub entries: Vec<DirEntry>,
    /// How many entries the directory has.
    pub total: usize,
    /// Whether `entries` was cut at the limit.
    pub truncated: bool,
}

/// `read_file`: reads a text file under the root, in pages of at most
/// [`FsLimits::max_read_bytes`].
#[derive(Clone, Debug)]
pub struct ReadFileTool(FsTools);

/// `list_dir`: lists a directory under the root.
#[derive(Clone, Debug)]
pub struct ListDirTool(FsTools);

/// `grep`: searches text files under the root for lines matching a regular expression.
#[derive(Clone, Debug)]
pub struct GrepTool(FsTools);

#[async_trait]
impl Tool for ReadFileTool {
    fn name(&self) -> &str {
        "read_file"
    }
    fn description(&self) -> &str {
        "Read a text file under the workspace root. Large files are returned in pages: \
         call again with the offset given at the end of the text."
    }
    fn parameters(&self) -> Value {
        parameters_schema::<ReadFileArgs>()
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let args: ReadFileArgs = decode_args(self.name(), args)?;
        let fs = self.0.clone();
        blocking(move || fs.read_file_sync(args)).await
    }
}

#[async_trait]
impl Tool for ListDirTool {
    fn name(&self) -> &str {
        "list_dir"
    }
    fn description(&self) -> &str {
        "List the files and directories in a directory under the workspace root."
    }
    fn parameters(&self) -> Value {
        parameters_schema::<ListDirArgs>()
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let args: ListDirArgs = decode_args(self.name(), args)?;
        let fs = self.0.clone();
        blocking(move || fs.list_dir_sync(args)).await
    }
}

#[async_trait]
impl Tool for GrepTool {
    fn name(&self) -> &str {
        "grep"
    }
    fn description(&self) -> &str {
        "Search text files under the workspace root for lines matching a regular expression; \
         returns `path:line: text` lines."
    }
    fn parameters(&self) -> Value {
        parameters_schema::<GrepArgs>()
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let args: GrepArgs = decode_args(self.name(), args)?;
        let fs = self.0.clone();
        blocking(move || fs.grep_sync(args)).await
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// The check and the open are separate steps; a symlink swapped in between (the race a
    /// hostile process on the same machine can win) is refused by the open itself.
    #[test]
    fn a_symlink_swapped_in_after_the_check_does_not_escape() {
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret.txt");
        std::fs::write(&secret, "outside the root").unwrap();
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("notes.txt");
        std::fs::write(&file, "inside").unwrap();
        let fs = FsTools::new(root.path()).unwrap();

        let checked = fs.resolve("notes.txt").unwrap();
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&secret, &file).unwrap();
        let err = fs.open_confined(&checked, "notes.txt").unwrap_err();
        assert!(matches!(err, ToolError::Denied { .. }), "{err}");
        // What the tool did before: open the checked path by name, and read the secret.
        assert_eq!(
            std::fs::read_to_string(&checked).unwrap(),
            "outside the root"
        );
    }

    #[test]
    fn grep_reads_at_most_its_limit_and_stops_on_time() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("a.txt"), "x\n".repeat(1000)).unwrap();
        let limits = FsLimits {
            max_grep_file_bytes: 10_000,
            max_grep_duration: Duration::ZERO,
            ..FsLimits::default()
        };
        let fs = FsTools::with_limits(root.path(), limits).unwrap();
        let out = fs
            .grep_sync(GrepArgs {
                pattern: "x".into(),
                path: None,
                case_insensitive: None,
                max_matches: None,
            })
            .unwrap();
        assert!(out.as_str().unwrap().contains("stopped after"), "{out}");
    }
}
