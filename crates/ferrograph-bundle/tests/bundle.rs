//! Bundles end to end on a small model folder: create, verify, install, and every kind of
//! damaged or hostile archive refused with nothing installed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test]

use ferrograph_bundle::{create, install, verify, BundleError, BundleManifest, CreateOptions};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A models folder with two small "models", a fake binary, and an empty download cache; the
/// environment points at them (once, for every test of this binary).
struct Fixture {
    _dir: tempfile::TempDir,
    models: PathBuf,
    binary: PathBuf,
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let models = dir.path().join("models");
        let alpha = b"alpha weights ".repeat(5000);
        let beta = b"beta weights".to_vec();
        std::fs::create_dir_all(models.join("alpha")).unwrap();
        std::fs::create_dir_all(models.join("beta")).unwrap();
        std::fs::write(models.join("alpha/alpha.gguf"), &alpha).unwrap();
        std::fs::write(models.join("beta/model.safetensors"), &beta).unwrap();
        let toml = format!(
            r#"
[[model]]
name = "alpha"
kind = "chat"
architecture = "llama"
license = "Apache-2.0"
required = true
package = "alpha-pkg"
version = "1.0"
description = "a test chat model"
[[model.files]]
file = "alpha/alpha.gguf"
dest = "alpha.gguf"
sha256 = "{}"
bytes = {}

[[model]]
name = "beta"
kind = "embedding"
architecture = "bert"
license = "MIT"
package = "beta-pkg"
version = "2.0"
[[model.files]]
file = "beta/model.safetensors"
dest = "model.safetensors"
sha256 = "{}"
bytes = {}

[[model]]
name = "gamma"
kind = "chat"
architecture = "llama"
license = "MIT"
package = "gamma-pkg"
version = "1.0"
[[model.files]]
file = "gamma/g.gguf"
dest = "g.gguf"
sha256 = "{}"
bytes = 5

[[model]]
name = "delta"
kind = "chat"
architecture = "llama"
license = "MIT"
package = "delta-pkg"
version = "1.0"
[[model.files]]
file = "delta/d.gguf"
dest = "d.gguf"
sha256 = "{}"
bytes = 5
"#,
            sha(&alpha),
            alpha.len(),
            sha(&beta),
            beta.len(),
            sha(b"right"),
            sha(b"right"),
        );
        // gamma is on disk but damaged (same size, other bytes); delta was never fetched.
        std::fs::create_dir_all(models.join("gamma")).unwrap();
        std::fs::write(models.join("gamma/g.gguf"), b"wrong").unwrap();
        std::fs::write(models.join("models.toml"), toml).unwrap();
        let binary = dir.path().join("ferrograph-fake");
        std::fs::write(&binary, b"#!/bin/sh\necho bundled\n").unwrap();
        std::env::set_var("FERROGRAPH_MODELS_DIR", &models);
        std::env::set_var("FERROGRAPH_CACHE_DIR", dir.path().join("cache"));
        Fixture {
            _dir: dir,
            models,
            binary,
        }
    })
}

fn options(models: &[&str], out: &Path) -> CreateOptions {
    let mut o = CreateOptions::new(models.iter().map(|m| m.to_string()).collect(), out);
    o.binary = Some(fixture().binary.clone());
    o.third_party = false;
    o
}

fn make_bundle(dir: &Path, models: &[&str]) -> PathBuf {
    let out = dir.join("b.tar.gz");
    create(&options(models, &out)).unwrap();
    out
}

/// The archive's entries as (path, bytes), in order.
fn entries(archive: &Path) -> Vec<(String, Vec<u8>)> {
    let gz = flate2::read::GzDecoder::new(std::fs::File::open(archive).unwrap());
    let mut tar = tar::Archive::new(gz);
    tar.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            e.read_to_end(&mut bytes).unwrap();
            (name, bytes)
        })
        .collect()
}

/// Writes entries back as a bundle; names are written raw (no validation), so hostile names
/// can be made.
fn write_entries(archive: &Path, list: &[(String, Vec<u8>, tar::EntryType)]) {
    let gz = flate2::write::GzEncoder::new(
        std::fs::File::create(archive).unwrap(),
        flate2::Compression::fast(),
    );
    let mut b = tar::Builder::new(gz);
    for (name, bytes, kind) in list {
        let mut h = tar::Header::new_old();
        let raw = &mut h.as_old_mut().name;
        raw[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(*kind);
        h.set_size(if kind.is_symlink() {
            0
        } else {
            bytes.len() as u64
        });
        h.set_mode(0o644);
        if kind.is_symlink() {
            h.set_link_name("/etc/passwd").unwrap();
        }
        h.set_cksum();
        let data: &[u8] = if kind.is_symlink() { &[] } else { bytes };
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap();
}

fn rewrite(
    archive: &Path,
    edit: impl Fn(&mut BundleManifest, &mut Vec<(String, Vec<u8>, tar::EntryType)>),
) {
    let mut list: Vec<_> = entries(archive)
        .into_iter()
        .map(|(n, b)| (n, b, tar::EntryType::Regular))
        .collect();
    let mut manifest: BundleManifest = serde_json::from_slice(&list[0].1).unwrap();
    edit(&mut manifest, &mut list);
    list[0].1 = serde_json::to_vec(&manifest).unwrap();
    write_entries(archive, &list);
}

/// Asserts that nothing was installed under `prefix` (no file at all, no staging folder).
fn assert_nothing_installed(prefix: &Path) {
    let found: Vec<_> = walk(prefix);
    assert!(found.is_empty(), "left behind: {found:?}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.push(p.clone());
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn a_bundle_installs_and_the_installed_files_match() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let archive = make_bundle(tmp.path(), &["alpha", "beta"]);
    let checked = verify(&archive).unwrap();
    assert!(checked.runs_here);
    assert_eq!(checked.manifest.models, vec!["alpha", "beta"]);

    let prefix = tmp.path().join("opt");
    let done = install(&archive, &prefix).unwrap();
    assert_eq!(done.binary, prefix.join("bin/ferrograph"));
    assert_eq!(
        std::fs::read(prefix.join("models/alpha/alpha.gguf")).unwrap(),
        std::fs::read(f.models.join("alpha/alpha.gguf")).unwrap()
    );
    assert_eq!(
        std::fs::read(prefix.join("bin/ferrograph")).unwrap(),
        std::fs::read(&f.binary).unwrap()
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(prefix.join("bin/ferrograph"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111, "binary not executable: {mode:o}");
    }
    assert!(
        std::fs::read_to_string(prefix.join("licenses/ferrograph/LICENSE"))
            .unwrap()
            .contains("Apache License")
    );
    let notice = std::fs::read_to_string(prefix.join("licenses/models/beta/NOTICE.txt")).unwrap();
    assert!(
        notice.contains("MIT") && notice.contains("beta-pkg 2.0"),
        "{notice}"
    );
    let record: BundleManifest =
        serde_json::from_slice(&std::fs::read(prefix.join("bundle.json")).unwrap()).unwrap();
    assert_eq!(record, done.manifest);
    for file in &record.files {
        let bytes = std::fs::read(prefix.join(&file.path)).unwrap();
        assert_eq!(sha(&bytes), file.sha256, "{}", file.path);
    }
    assert!(!walk(&prefix)
        .iter()
        .any(|p| p.to_string_lossy().contains("staging")));

    // Installing again over it works, and files of another bundle stay.
    std::fs::create_dir_all(prefix.join("models/gamma")).unwrap();
    std::fs::write(prefix.join("models/gamma/g.gguf"), b"kept").unwrap();
    install(&archive, &prefix).unwrap();
    assert_eq!(
        std::fs::read(prefix.join("models/gamma/g.gguf")).unwrap(),
        b"kept"
    );
}

#[test]
fn the_third_party_list_names_the_crates_compiled_in() {
    fixture();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("b.tar.gz");
    let mut o = options(&["beta"], &out);
    o.third_party = true;
    create(&o).unwrap();
    let all = entries(&out);
    let (_, index) = all
        .iter()
        .find(|(n, _)| n == "licenses/THIRD-PARTY.md")
        .expect("THIRD-PARTY.md packed");
    let index = String::from_utf8_lossy(index);
    assert!(index.contains("| sha2 |"), "{index}");
    assert!(index.contains("| tar |"), "{index}");
}

#[test]
fn models_that_are_unknown_or_not_fetched_are_refused_at_creation() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("b.tar.gz");
    match create(&options(&["nope"], &out)) {
        Err(BundleError::UnknownModel { name, known }) => {
            assert_eq!(name, "nope");
            assert!(known.contains("alpha"));
        }
        other => panic!("{other:?}"),
    }
    for (name, problem) in [("gamma", "sha256"), ("delta", "missing")] {
        match create(&options(&["alpha", name], &out)) {
            Err(e @ BundleError::ModelNotReady { .. }) => {
                let text = e.to_string();
                assert!(text.contains(problem), "{text}");
                assert!(
                    text.contains(&format!("ferrograph models fetch {name}")),
                    "{text}"
                );
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    let _ = f;
    assert!(!out.exists());
}

/// Builds a fresh bundle, damages it with `edit`, and returns the error of installing it,
/// after checking that `verify` fails too and that nothing was installed.
fn install_damaged(
    edit: impl Fn(&mut BundleManifest, &mut Vec<(String, Vec<u8>, tar::EntryType)>),
) -> BundleError {
    fixture();
    let tmp = tempfile::tempdir().unwrap();
    let archive = make_bundle(tmp.path(), &["alpha", "beta"]);
    rewrite(&archive, edit);
    let prefix = tmp.path().join("opt");
    let err = install(&archive, &prefix).expect_err("damaged bundle installed");
    assert_nothing_installed(&prefix);
    assert!(
        !prefix.exists(),
        "the install folder made for a refused bundle was left"
    );
    assert!(!tmp.path().join("evil").exists());
    if !matches!(
        err,
        BundleError::WrongPlatform { .. } | BundleError::MissingCpuFeatures { .. }
    ) {
        assert!(
            verify(&archive).is_err(),
            "verify accepted what install refused"
        );
    }
    err
}

#[test]
fn an_altered_file_is_refused_and_nothing_is_installed() {
    let err = install_damaged(|_, list| {
        let model = list
            .iter_mut()
            .find(|(n, _, _)| n == "models/alpha/alpha.gguf")
            .unwrap();
        // Same length, one byte changed, late in the archive: files before it were already
        // staged when the damage is found.
        let last = model.1.len() - 1;
        model.1[last] ^= 1;
    });
    match err {
        BundleError::Mismatch { entry, reason, .. } => {
            assert_eq!(entry, "models/alpha/alpha.gguf");
            assert!(reason.contains("sha256"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn extra_missing_and_resized_files_are_refused() {
    let extra = install_damaged(|_, list| {
        list.push(("bin/extra".into(), b"x".to_vec(), tar::EntryType::Regular));
    });
    assert!(
        matches!(&extra, BundleError::Mismatch { entry, reason, .. } if entry == "bin/extra" && reason.contains("not listed")),
        "{extra:?}"
    );
    let missing = install_damaged(|_, list| {
        list.retain(|(n, _, _)| n != "models/beta/model.safetensors");
    });
    assert!(
        matches!(&missing, BundleError::Mismatch { reason, .. } if reason.contains("missing")),
        "{missing:?}"
    );
    let resized = install_damaged(|_, list| {
        list.iter_mut()
            .find(|(n, _, _)| n == "bin/ferrograph")
            .unwrap()
            .1
            .push(b'!');
    });
    assert!(
        matches!(&resized, BundleError::Mismatch { reason, .. } if reason.contains("bytes")),
        "{resized:?}"
    );
    let twice = install_damaged(|_, list| {
        let copy = list[1].clone();
        list.push(copy);
    });
    assert!(
        matches!(&twice, BundleError::Mismatch { reason, .. } if reason.contains("twice")),
        "{twice:?}"
    );
}

#[test]
fn paths_out_of_the_install_folder_and_links_are_refused() {
    for hostile in [
        "../evil",
        "bin/../../evil",
        "/tmp/evil",
        "evil",
        ".profile/x",
    ] {
        let err = install_damaged(|manifest, list| {
            let body = b"#!/bin/sh\nrm -rf ~\n".to_vec();
            manifest.files.push(ferrograph_bundle::BundleFile {
                path: hostile.to_string(),
                sha256: sha(&body),
                bytes: body.len() as u64,
                executable: false,
            });
            list.push((hostile.to_string(), body, tar::EntryType::Regular));
        });
        assert!(
            matches!(&err, BundleError::UnsafeEntry { entry, .. } if entry == hostile),
            "{hostile}: {err:?}"
        );
    }
    // An entry that is not listed and not a plain file: refused as unsafe before anything else.
    let link = install_damaged(|_, list| {
        list.insert(
            1,
            (
                "bin/ferrograph-link".into(),
                Vec::new(),
                tar::EntryType::Symlink,
            ),
        );
    });
    assert!(
        matches!(&link, BundleError::UnsafeEntry { reason, .. } if reason.contains("not a plain file")),
        "{link:?}"
    );
}

#[test]
fn bundles_for_another_machine_or_format_are_refused_before_writing() {
    let arch = install_damaged(|m, _| m.platform.arch = "sparc64".into());
    assert!(
        matches!(arch, BundleError::WrongPlatform { .. }),
        "{arch:?}"
    );
    let cpu = install_damaged(|m, _| m.platform.cpu_features.push("avx512-future".into()));
    match cpu {
        BundleError::MissingCpuFeatures { missing, .. } => {
            assert_eq!(missing, vec!["avx512-future".to_string()])
        }
        other => panic!("{other:?}"),
    }
    let format = install_damaged(|m, _| m.format = 99);
    assert!(
        matches!(format, BundleError::UnsupportedFormat { found: 99, .. }),
        "{format:?}"
    );
    let first = install_damaged(|_, list| list.swap(0, 1));
    assert!(matches!(first, BundleError::NotABundle { .. }), "{first:?}");
}

#[test]
fn garbage_and_truncated_archives_are_refused() {
    fixture();
    let tmp = tempfile::tempdir().unwrap();
    let garbage = tmp.path().join("garbage.tar.gz");
    std::fs::write(&garbage, b"this is not a bundle at all").unwrap();
    let prefix = tmp.path().join("opt");
    assert!(matches!(
        install(&garbage, &prefix),
        Err(BundleError::NotABundle { .. })
    ));
    assert_nothing_installed(&prefix);

    let archive = make_bundle(tmp.path(), &["alpha", "beta"]);
    let bytes = std::fs::read(&archive).unwrap();
    let cut = tmp.path().join("cut.tar.gz");
    for len in [bytes.len() / 3, bytes.len() * 2 / 3, bytes.len() - 20] {
        std::fs::write(&cut, &bytes[..len]).unwrap();
        let err = install(&cut, &prefix).expect_err("truncated bundle installed");
        assert!(
            matches!(
                err,
                BundleError::NotABundle { .. } | BundleError::Mismatch { .. }
            ),
            "{len}: {err:?}"
        );
        assert_nothing_installed(&prefix);
    }
    let missing = install(&tmp.path().join("absent.tar.gz"), &prefix);
    assert!(
        matches!(missing, Err(BundleError::Io { .. })),
        "{missing:?}"
    );
}
