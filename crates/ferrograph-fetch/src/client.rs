//! The HTTP client: checked, atomic downloads with a progress bar.

use crate::error::FetchError;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The default PyPI Simple API root.
pub const DEFAULT_PYPI_INDEX: &str = "https://pypi.org/simple";

/// How long to wait for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long one read or write may stall.
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts for transient failures (interrupted transfers, HTTP 429 and 5xx).
const ATTEMPTS: u32 = 3;

/// Whether a download shows a progress bar.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Progress {
    /// A bar on stderr with bytes, total and rate (hidden when stderr is not a terminal).
    #[default]
    Bar,
    /// Nothing.
    Quiet,
}

impl Progress {
    /// [`Progress::Quiet`] when `quiet`, else [`Progress::Bar`].
    pub fn quiet_if(quiet: bool) -> Self {
        if quiet {
            Progress::Quiet
        } else {
            Progress::Bar
        }
    }
}

/// A blocking HTTP client for registry downloads.
///
/// It trusts the platform's certificate store (and the bundled webpki roots), connects within
/// 15 s, lets a read stall at most 60 s, and identifies itself as `ferrograph/<version>`.
///
/// Its methods may be called from inside an async runtime: the blocking work runs on a
/// short-lived thread of its own (reqwest's blocking client refuses to run on a runtime
/// thread), while the calling thread waits.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::blocking::Client,
    pypi_index: String,
}

/// Runs `f` on a fresh thread, outside any async runtime the caller may be in.
pub(crate) fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| match s.spawn(f).join() {
        Ok(v) => v,
        Err(payload) => std::panic::resume_unwind(payload),
    })
}

impl Client {
    /// A client for the default registries (PyPI: `FERROGRAPH_PYPI_INDEX` when set, a Simple
    /// API root such as a mirror's, else [`DEFAULT_PYPI_INDEX`]).
    pub fn new() -> Result<Self, FetchError> {
        let http = off_runtime(|| {
            reqwest::blocking::Client::builder()
                .user_agent(concat!("ferrograph/", env!("CARGO_PKG_VERSION")))
                .connect_timeout(CONNECT_TIMEOUT)
                .timeout(IO_TIMEOUT)
                .build()
        })
        .map_err(|e| FetchError::Invalid(format!("cannot build the HTTP client: {e}")))?;
        let pypi_index = std::env::var("FERROGRAPH_PYPI_INDEX")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_PYPI_INDEX.to_string());
        Ok(Client {
            http,
            pypi_index: pypi_index.trim_end_matches('/').to_string(),
        })
    }

    /// The same client with another PyPI Simple API root (for example a mirror's
    /// `https://host/simple`).
    pub fn with_pypi_index(mut self, index: impl Into<String>) -> Self {
        self.pypi_index = index.into().trim_end_matches('/').to_string();
        self
    }

    /// The PyPI Simple API root in use, without a trailing slash.
    pub fn pypi_index(&self) -> &str {
        &self.pypi_index
    }

    /// Downloads `url` to `dest` and returns `dest`.
    ///
    /// The body is streamed into a temporary file next to `dest` while its sha256 is
    /// computed; when `expected_sha256` is given and differs, the temporary file is removed
    /// and [`FetchError::Checksum`] returned, else it is renamed onto `dest` (so `dest` is
    /// either absent or complete). When `dest` already exists with the expected sha256 —
    /// or at all, when no sha256 is given — nothing is downloaded. Interrupted transfers and
    /// HTTP 429/5xx are retried twice; HTTP 404/410 is [`FetchError::NotFound`].
    pub fn download(
        &self,
        url: &str,
        dest: &Path,
        expected_sha256: Option<&str>,
        progress: Progress,
    ) -> Result<PathBuf, FetchError> {
        let expected = expected_sha256.map(str::to_ascii_lowercase);
        if dest.is_file() {
            match &expected {
                None => return Ok(dest.to_path_buf()),
                Some(want) if &sha256_file(dest)? == want => return Ok(dest.to_path_buf()),
                Some(_) => {}
            }
        }
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&dir).map_err(|e| FetchError::io(&dir, e))?;
        off_runtime(|| {
            let mut attempt = 1;
            loop {
                match self.download_once(url, dest, &dir, expected.as_deref(), progress) {
                    Err(e) if e.is_transient() && attempt < ATTEMPTS => {
                        std::thread::sleep(Duration::from_secs(u64::from(attempt)));
                        attempt += 1;
                    }
                    other => return other,
                }
            }
        })
    }

    fn download_once(
        &self,
        url: &str,
        dest: &Path,
        dir: &Path,
        expected: Option<&str>,
        progress: Progress,
    ) -> Result<PathBuf, FetchError> {
        let mut response = self.send(url, None)?;
        let total = response.content_length();
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".part")
            .tempfile_in(dir)
            .map_err(|e| FetchError::io(dir, e))?;
        let bar = progress_bar(progress, total, &name);
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut written = 0u64;
        loop {
            let n = match response.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    bar.abandon();
                    return Err(FetchError::Interrupted {
                        url: url.to_string(),
                        source,
                    });
                }
            };
            let chunk = buf.get(..n).unwrap_or_default();
            hasher.update(chunk);
            tmp.write_all(chunk)
                .map_err(|e| FetchError::io(tmp.path(), e))?;
            written += n as u64;
            bar.set_position(written);
        }
        bar.finish_and_clear();
        if let Some(total) = total.filter(|t| *t != written) {
            return Err(FetchError::Interrupted {
                url: url.to_string(),
                source: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("got {written} of {total} bytes"),
                ),
            });
        }
        let actual = hex(&hasher.finalize());
        if let Some(want) = expected {
            if actual != want {
                return Err(FetchError::Checksum {
                    what: url.to_string(),
                    expected: want.to_string(),
                    actual,
                });
            }
        }
        finish_file(tmp.as_file()).map_err(|e| FetchError::io(tmp.path(), e))?;
        tmp.persist(dest)
            .map_err(|e| FetchError::io(dest, e.error))?;
        Ok(dest.to_path_buf())
    }

    /// GET `url` (with an `Accept` header when given): the response when its status is a
    /// success, [`FetchError::NotFound`] for 404/410, [`FetchError::Http`] otherwise.
    /// Must run off any async runtime (see [`off_runtime`]).
    fn send(
        &self,
        url: &str,
        accept: Option<&str>,
    ) -> Result<reqwest::blocking::Response, FetchError> {
        let mut request = self.http.get(url);
        if let Some(accept) = accept {
            request = request.header(reqwest::header::ACCEPT, accept);
        }
        let response = request.send().map_err(|source| {
            if source.is_builder() {
                FetchError::Invalid(format!("bad URL {url}: {source}"))
            } else {
                FetchError::Unreachable {
                    url: url.to_string(),
                    source,
                }
            }
        })?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND || status == reqwest::StatusCode::GONE {
            return Err(FetchError::NotFound {
                what: url.to_string(),
            });
        }
        if !status.is_success() {
            return Err(FetchError::Http {
                url: url.to_string(),
                status: status.as_u16(),
            });
        }
        Ok(response)
    }

    /// The body of `url` as text (for registry pages), retried like downloads.
    pub(crate) fn get_text(&self, url: &str, accept: Option<&str>) -> Result<String, FetchError> {
        off_runtime(|| {
            let mut attempt = 1;
            loop {
                let result = self.send(url, accept).and_then(|r| {
                    r.text().map_err(|e| FetchError::Interrupted {
                        url: url.to_string(),
                        source: std::io::Error::other(e),
                    })
                });
                match result {
                    Err(e) if e.is_transient() && attempt < ATTEMPTS => {
                        std::thread::sleep(Duration::from_secs(u64::from(attempt)));
                        attempt += 1;
                    }
                    other => return other,
                }
            }
        })
    }
}

fn progress_bar(progress: Progress, total: Option<u64>, name: &str) -> indicatif::ProgressBar {
    if progress == Progress::Quiet {
        return indicatif::ProgressBar::hidden();
    }
    let target = indicatif::ProgressDrawTarget::stderr();
    let bar = match total {
        Some(total) => {
            let bar = indicatif::ProgressBar::with_draw_target(Some(total), target);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar
        }
        None => {
            let bar = indicatif::ProgressBar::with_draw_target(None, target);
            if let Ok(style) =
                indicatif::ProgressStyle::with_template("{spinner} {msg} {bytes} {bytes_per_sec}")
            {
                bar.set_style(style);
            }
            bar
        }
    };
    bar.set_message(name.to_string());
    bar
}

/// Readies a finished temporary file for its final place: flushed to disk and, on Unix,
/// readable by all like an ordinary new file (temporary files are created private).
pub(crate) fn finish_file(file: &std::fs::File) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    }
    file.sync_all()
}

/// The sha256 of a file, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut f = std::fs::File::open(path).map_err(|e| FetchError::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| FetchError::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(buf.get(..n).unwrap_or_default());
    }
    Ok(hex(&h.finalize()))
}

/// Lowercase hex of `bytes` (a digest).
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_lowercase() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
    }

    #[test]
    fn sha256_of_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(
            sha256_file(&p).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn off_runtime_returns_the_value() {
        assert_eq!(off_runtime(|| 6 * 7), 42);
    }
}
