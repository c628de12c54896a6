//! Making a bundle.

use crate::error::BundleError;
use crate::licences;
use crate::manifest::{
    bundle_path, BundleFile, BundleManifest, HashingReader, FORMAT, MANIFEST_NAME,
};
use crate::platform::Platform;
use ferrograph_models::manifest::sha256_file;
use ferrograph_models::Manifest;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// What to put in a bundle and where to write it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CreateOptions {
    /// The models, by manifest name (each must be fetched and verified).
    pub models: Vec<String>,
    /// The archive to write (replaced atomically when it exists).
    pub out: PathBuf,
    /// The binary to pack; `None` packs the running executable. Its platform is recorded as
    /// the running build's, so name only a binary built for the same target and flags.
    pub binary: Option<PathBuf>,
    /// Pack the third-party crate list and licence texts (on by default).
    pub third_party: bool,
}

impl CreateOptions {
    /// A bundle of `models` written to `out`, with the running binary and every licence file.
    pub fn new(models: Vec<String>, out: impl Into<PathBuf>) -> Self {
        Self {
            models,
            out: out.into(),
            binary: None,
            third_party: true,
        }
    }
}

/// What [`create`] wrote.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Created {
    /// The archive.
    pub path: PathBuf,
    /// Files packed (besides `bundle.json`).
    pub files: usize,
    /// Their total size, uncompressed.
    pub bytes: u64,
    /// The archive's size.
    pub archive_bytes: u64,
    /// Its manifest.
    pub manifest: BundleManifest,
}

/// Where a packed file's contents come from.
enum Source {
    /// A file on disk, checked against the record's sha256 as it is packed; `model` names the
    /// model it belongs to (its sha256 comes from the model manifest, not from a hash taken
    /// earlier).
    File {
        path: PathBuf,
        model: Option<String>,
    },
    /// Bytes made here.
    Bytes(Vec<u8>),
}

/// One file to pack.
struct Item {
    record: BundleFile,
    source: Source,
}

impl Item {
    fn bytes(rel: &Path, bytes: Vec<u8>) -> Self {
        let sha256 = ferrograph_fetch::hex(&Sha256::digest(&bytes));
        Self {
            record: BundleFile {
                path: bundle_path(rel),
                sha256,
                bytes: bytes.len() as u64,
                executable: false,
            },
            source: Source::Bytes(bytes),
        }
    }
}

/// Writes a bundle: checks every named model against the model manifest (size and sha256),
/// then writes `bundle.json` and the files into `out` (through a temporary file renamed at
/// the end, so `out` is never half-written). A file that changes while it is packed fails
/// the bundle.
pub fn create(options: &CreateOptions) -> Result<Created, BundleError> {
    let manifest = Manifest::default_manifest()?;
    let mut items = Vec::new();

    let binary = match &options.binary {
        Some(path) => path.clone(),
        None => std::env::current_exe().map_err(|e| BundleError::io("the running binary", e))?,
    };
    let sha = sha256_file(&binary)?;
    let size = std::fs::metadata(&binary)
        .map_err(|e| BundleError::io(&binary, e))?
        .len();
    items.push(Item {
        record: BundleFile {
            path: "bin/ferrograph".into(),
            sha256: sha,
            bytes: size,
            executable: true,
        },
        source: Source::File {
            path: binary,
            model: None,
        },
    });

    let toml_path = manifest.dir.join("models.toml");
    let toml = std::fs::read(&toml_path).map_err(|e| BundleError::io(&toml_path, e))?;
    items.push(Item::bytes(Path::new("models/models.toml"), toml));

    let mut licence_items = vec![Item::bytes(
        Path::new("licenses/ferrograph/LICENSE"),
        licences::FERROGRAPH_LICENCE.as_bytes().to_vec(),
    )];
    let mut names: Vec<String> = Vec::new();
    for name in &options.models {
        if names.contains(name) {
            continue;
        }
        let entry = manifest
            .get(name)
            .ok_or_else(|| BundleError::UnknownModel {
                name: name.clone(),
                known: manifest
                    .models
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        for f in &entry.files {
            let path = entry.dir(&manifest.dir).join(&f.dest);
            let not_ready = |problem: &str| BundleError::ModelNotReady {
                name: name.clone(),
                file: path.clone(),
                problem: problem.to_string(),
            };
            let md = std::fs::metadata(&path).map_err(|_| not_ready("is missing"))?;
            if md.len() != f.bytes {
                return Err(not_ready(&format!(
                    "has {} bytes, the manifest says {}",
                    md.len(),
                    f.bytes
                )));
            }
            // Its sha256 is checked while it is packed (one read, not two).
            items.push(Item {
                record: BundleFile {
                    path: bundle_path(&Path::new("models").join(&entry.name).join(&f.dest)),
                    sha256: f.sha256.clone(),
                    bytes: f.bytes,
                    executable: false,
                },
                source: Source::File {
                    path,
                    model: Some(name.clone()),
                },
            });
        }
        for licence in licences::model_licences(entry) {
            licence_items.push(Item::bytes(
                &Path::new("licenses").join(licence.rel),
                licence.bytes,
            ));
        }
        names.push(name.clone());
    }
    if options.third_party {
        for licence in licences::third_party() {
            licence_items.push(Item::bytes(
                &Path::new("licenses").join(licence.rel),
                licence.bytes,
            ));
        }
    }
    items.extend(licence_items);

    let bundle = BundleManifest {
        format: FORMAT,
        ferrograph_version: env!("CARGO_PKG_VERSION").to_string(),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default(),
        platform: Platform::of_this_build(),
        models: names,
        files: items.iter().map(|i| i.record.clone()).collect(),
    };
    write_archive(&options.out, &bundle, &items)?;
    let archive_bytes = std::fs::metadata(&options.out)
        .map_err(|e| BundleError::io(&options.out, e))?
        .len();
    Ok(Created {
        path: options.out.clone(),
        files: items.len(),
        bytes: bundle.total_bytes(),
        archive_bytes,
        manifest: bundle,
    })
}

/// Writes the archive into a temporary file beside `out`, then renames it onto `out`.
fn write_archive(out: &Path, bundle: &BundleManifest, items: &[Item]) -> Result<(), BundleError> {
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|e| BundleError::io(&dir, e))?;
    let file_name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "bundle".into());
    let tmp = dir.join(format!(".{file_name}.{}.partial", std::process::id()));
    let result = (|| {
        let file = std::fs::File::create(&tmp).map_err(|e| BundleError::io(&tmp, e))?;
        let gz = flate2::write::GzEncoder::new(
            std::io::BufWriter::new(file),
            flate2::Compression::fast(),
        );
        let mut tar = tar::Builder::new(gz);
        let json = serde_json::to_vec_pretty(bundle).map_err(|e| {
            BundleError::io(
                &tmp,
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })?;
        append(
            &mut tar,
            &tmp,
            MANIFEST_NAME,
            json.len() as u64,
            false,
            bundle.created_unix,
            &mut json.as_slice(),
        )?;
        for item in items {
            let r = &item.record;
            let source: Box<dyn Read> = match &item.source {
                Source::Bytes(bytes) => Box::new(bytes.as_slice()),
                Source::File { path, .. } => Box::new(
                    std::fs::File::open(path)
                        .map_err(|e| BundleError::io(path, e))?
                        .take(r.bytes),
                ),
            };
            let mut reader = HashingReader::new(source);
            append(
                &mut tar,
                &tmp,
                &r.path,
                r.bytes,
                r.executable,
                bundle.created_unix,
                &mut reader,
            )?;
            if reader.sha256() != r.sha256 {
                return Err(match &item.source {
                    Source::File {
                        path,
                        model: Some(name),
                    } => BundleError::ModelNotReady {
                        name: name.clone(),
                        file: path.clone(),
                        problem: "does not have the manifest's sha256".into(),
                    },
                    Source::File { path, .. } => BundleError::Mismatch {
                        archive: out.to_path_buf(),
                        entry: r.path.clone(),
                        reason: format!("{} changed while it was being packed", path.display()),
                    },
                    Source::Bytes(_) => BundleError::Mismatch {
                        archive: out.to_path_buf(),
                        entry: r.path.clone(),
                        reason: "changed while it was being packed".into(),
                    },
                });
            }
        }
        let gz = tar.into_inner().map_err(|e| BundleError::io(&tmp, e))?;
        let buffered = gz.finish().map_err(|e| BundleError::io(&tmp, e))?;
        let file = buffered
            .into_inner()
            .map_err(|e| BundleError::io(&tmp, e.into_error()))?;
        file.sync_all().map_err(|e| BundleError::io(&tmp, e))?;
        std::fs::rename(&tmp, out).map_err(|e| BundleError::io(out, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Appends one regular file of `size` bytes read from `data`.
fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    archive: &Path,
    path: &str,
    size: u64,
    executable: bool,
    mtime: u64,
    data: &mut dyn Read,
) -> Result<(), BundleError> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(size);
    header.set_mode(if executable { 0o755 } else { 0o644 });
    header.set_mtime(mtime);
    header.set_uid(0);
    header.set_gid(0);
    tar.append_data(&mut header, path, data)
        .map_err(|e| BundleError::io(archive, e))
}
