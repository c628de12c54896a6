//! Downloads: against a local HTTP server (always), and against the real PyPI and crates.io
//! (skipped, with a note, when they cannot be reached).

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use ferrograph_fetch::{
    crate_file_checked, extract_member, pypi_file, sha256_file, unpack, Client, FetchError,
    FileKind, Progress,
};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Serves `body` (with `status`) to every request on a local port; returns the base URL and
/// the request counter.
fn serve(status: &'static str, body: Vec<u8>) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            counter.fetch_add(1, Ordering::SeqCst);
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    (format!("http://{addr}"), hits)
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn checked_download_skip_and_mismatch() {
    let body = b"some archive bytes".to_vec();
    let (base, hits) = serve("200 OK", body.clone());
    let client = Client::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("{base}/f.bin");

    // A wrong sha256 is an error and leaves nothing behind.
    let dest = dir.path().join("sub/f.bin");
    let e = client
        .download(&url, &dest, Some(&sha(b"other")), Progress::Quiet)
        .unwrap_err();
    assert!(matches!(e, FetchError::Checksum { .. }), "{e}");
    assert!(!dest.exists());
    assert!(entries(&dir.path().join("sub")).is_empty());

    // The right one writes the file.
    let good = sha(&body);
    let out = client
        .download(&url, &dest, Some(&good.to_uppercase()), Progress::Quiet)
        .unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), body);
    assert_eq!(entries(&dir.path().join("sub")), vec!["f.bin"]);
    assert_eq!(hits.load(Ordering::SeqCst), 2);

    // Present and verified: no request.
    client
        .download(&url, &dest, Some(&good), Progress::Bar)
        .unwrap();
    assert_eq!(hits.load(Ordering::SeqCst), 2);

    // Present but corrupt: downloaded again.
    std::fs::write(&dest, b"corrupt").unwrap();
    client
        .download(&url, &dest, Some(&good), Progress::Quiet)
        .unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), body);
    assert_eq!(hits.load(Ordering::SeqCst), 3);
}

#[test]
fn http_errors() {
    let (base, _) = serve("404 Not Found", b"no".to_vec());
    let client = Client::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let e = client
        .download(
            &format!("{base}/x"),
            &dir.path().join("x"),
            None,
            Progress::Quiet,
        )
        .unwrap_err();
    assert!(matches!(e, FetchError::NotFound { .. }), "{e}");

    let (base, _) = serve("403 Forbidden", b"no".to_vec());
    let e = client
        .download(
            &format!("{base}/x"),
            &dir.path().join("x"),
            None,
            Progress::Quiet,
        )
        .unwrap_err();
    assert!(matches!(e, FetchError::Http { status: 403, .. }), "{e}");
    assert!(entries(dir.path()).is_empty());
}

#[test]
fn unreachable_is_one_line() {
    // Nothing listens on a port we just closed.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{port}/x");
    let e = client
        .download(&url, &dir.path().join("x"), None, Progress::Quiet)
        .unwrap_err();
    assert!(e.is_unreachable(), "{e}");
    assert_eq!(e.url(), Some(url.as_str()));
    let text = e.to_string();
    assert!(text.starts_with(&format!("cannot reach {url}: ")), "{text}");
    assert!(!text.contains('\n'), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_inside_an_async_runtime() {
    // reqwest's blocking client panics on a runtime thread; ours hops off it.
    let (base, _) = serve("200 OK", b"x".to_vec());
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("x");
    let client = Client::new().unwrap();
    client
        .download(&format!("{base}/x"), &dest, None, Progress::Quiet)
        .unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"x");
    drop(client);
}

/// Skips (returns `None` with a note) when `e` says the registry is unreachable.
fn online<T>(what: &str, r: Result<T, FetchError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) if e.is_unreachable() => {
            eprintln!("!!!!!! SKIPPING {what}: network unreachable ({e})");
            None
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

#[test]
fn real_pypi_wheel_and_sdist_of_six() {
    let client = Client::new().unwrap();
    let Some(wheel) = online(
        "the PyPI test",
        pypi_file(&client, "Six", "1.16.0", FileKind::Wheel),
    ) else {
        return;
    };
    assert_eq!(wheel.filename, "six-1.16.0-py2.py3-none-any.whl");
    let sha = wheel.sha256.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join(&wheel.filename);
    let Some(path) = online(
        "the PyPI download",
        client.download(&wheel.url, &dest, Some(&sha), Progress::Quiet),
    ) else {
        return;
    };
    assert_eq!(sha256_file(&path).unwrap(), sha);
    let out = extract_member(&path, "six.py", &dir.path().join("six.py"), None).unwrap();
    assert!(std::fs::read_to_string(out)
        .unwrap()
        .contains("__version__ = \"1.16.0\""));

    let sdist = pypi_file(&client, "six", "1.16.0", FileKind::Sdist).unwrap();
    assert_eq!(sdist.filename, "six-1.16.0.tar.gz");
    let e = pypi_file(&client, "six", "0.0.0.0", FileKind::Wheel).unwrap_err();
    assert!(matches!(e, FetchError::NotFound { .. }), "{e}");
    let e = pypi_file(
        &client,
        "ferrograph-surely-no-such-package-x1",
        "1",
        FileKind::Wheel,
    )
    .unwrap_err();
    assert!(matches!(e, FetchError::NotFound { .. }), "{e}");
}

#[test]
fn real_crate_download_and_unpack() {
    let client = Client::new().unwrap();
    let Some(file) = online(
        "the crates.io test",
        crate_file_checked(&client, "itoa", "1.0.0"),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join(&file.filename);
    let Some(path) = online(
        "the crates.io download",
        client.download(&file.url, &archive, file.sha256.as_deref(), Progress::Quiet),
    ) else {
        return;
    };
    let out = unpack(&path, &dir.path().join("src")).unwrap();
    assert!(out.join("itoa-1.0.0/Cargo.toml").is_file());
    let e = crate_file_checked(&client, "itoa", "0.0.0-nope").unwrap_err();
    assert!(matches!(e, FetchError::NotFound { .. }), "{e}");
}
