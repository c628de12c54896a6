//! Load progress: the model file is read through a counting reader, and the bytes read so far
//! go to a callback — by default a one-line bar on stderr, drawn only when stderr is a
//! terminal (logs and CI output stay clean).

use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Called with (bytes read, file size) while a model loads, and once more with
/// `bytes == size` when it is done.
pub type ProgressCallback = Arc<dyn Fn(u64, u64) + Send + Sync>;

fn hook() -> &'static RwLock<Option<ProgressCallback>> {
    static HOOK: RwLock<Option<ProgressCallback>> = RwLock::new(None);
    &HOOK
}

/// Sends the load progress of every model loaded from now on to `callback` instead of the
/// stderr bar (`None` restores the default).
pub fn set_load_progress(callback: Option<ProgressCallback>) {
    if let Ok(mut h) = hook().write() {
        *h = callback;
    }
}

/// The callback in effect: the one set with [`set_load_progress`], else a stderr bar when
/// stderr is a terminal, else none.
pub fn current(label: &str) -> Option<ProgressCallback> {
    if let Some(cb) = hook().read().ok().and_then(|h| h.clone()) {
        return Some(cb);
    }
    if std::io::stderr().is_terminal() {
        return Some(stderr_bar(label.to_string()));
    }
    None
}

/// A progress bar on stderr, redrawn at most every 100 ms.
pub fn stderr_bar(label: String) -> ProgressCallback {
    let last = std::sync::Mutex::new(None::<Instant>);
    Arc::new(move |done: u64, total: u64| {
        let finished = total > 0 && done >= total;
        if let Ok(mut last) = last.lock() {
            if !finished && last.is_some_and(|t| t.elapsed() < Duration::from_millis(100)) {
                return;
            }
            *last = Some(Instant::now());
        }
        let _ = std::io::stderr().write_all(render_bar(&label, done, total, finished).as_bytes());
    })
}

/// One frame of the bar: `\r` + label, a 30-cell bar, percent and MiB.
fn render_bar(label: &str, done: u64, total: u64, finished: bool) -> String {
    let frac = if total == 0 {
        1.0
    } else {
        (done as f64 / total as f64).clamp(0.0, 1.0)
    };
    let cells = 30usize;
    let full = ((frac * cells as f64).round() as usize).min(cells);
    format!(
        "\rloading {label} [{}{}] {:>3.0}% {:.0}/{:.0} MiB{}",
        "#".repeat(full),
        "-".repeat(cells - full),
        frac * 100.0,
        done as f64 / 1048576.0,
        total as f64 / 1048576.0,
        if finished { "\n" } else { "" }
    )
}

/// A reader that reports how far into the file reads have got.
pub struct ProgressReader<R> {
    inner: R,
    total: u64,
    high: u64,
    pos: u64,
    callback: Option<ProgressCallback>,
}

impl<R> std::fmt::Debug for ProgressReader<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressReader")
            .field("total", &self.total)
            .field("high", &self.high)
            .finish()
    }
}

impl<R: Read + Seek> ProgressReader<R> {
    /// Wraps `inner` (a file of `total` bytes, positioned at its start).
    pub fn new(inner: R, total: u64, callback: Option<ProgressCallback>) -> Self {
        ProgressReader {
            inner,
            total,
            high: 0,
            pos: 0,
            callback,
        }
    }

    /// Reports completion.
    pub fn finish(&mut self) {
        if let Some(cb) = &self.callback {
            cb(self.total, self.total);
        }
    }
}

impl<R: Read> Read for ProgressReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        if self.pos > self.high {
            self.high = self.pos;
            if let Some(cb) = &self.callback {
                cb(self.high.min(self.total), self.total);
            }
        }
        Ok(n)
    }
}

impl<R: Seek> Seek for ProgressReader<R> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        self.pos = self.inner.seek(to)?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn reports_bytes_read() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let cb: ProgressCallback = Arc::new(move |d, t| {
            if let Ok(mut v) = s.lock() {
                v.push((d, t));
            }
        });
        let mut r = ProgressReader::new(std::io::Cursor::new(vec![7u8; 100]), 100, Some(cb));
        let mut buf = [0u8; 40];
        assert_eq!(r.read(&mut buf).ok(), Some(40));
        assert_eq!(r.seek(SeekFrom::Start(90)).ok(), Some(90));
        assert_eq!(r.read(&mut buf).ok(), Some(10));
        r.finish();
        let v = seen.lock().map(|v| v.clone()).unwrap_or_default();
        assert_eq!(v, vec![(40, 100), (100, 100), (100, 100)]);
    }

    #[test]
    fn bar_renders() {
        let s = render_bar("m", 50, 100, false);
        assert!(s.contains("[###############---------------]  50%"), "{s}");
        assert!(render_bar("m", 100, 100, true).ends_with('\n'));
    }
}
