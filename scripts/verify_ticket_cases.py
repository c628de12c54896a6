#!/usr/bin/env python3
"""Verify the ticket-to-PR evaluation cases in tests/eval/ticket-pr-cases.toml.

For every case (or only those named with --case) this script:

1. downloads the buggy and the fixed sdist into a cache folder (default
   .cache/ferrograph/ticket-eval under the repository root, which is git-ignored)
   and checks each archive against its recorded sha256;
2. unpacks both archives into <cache>/trees/, stripping the single top folder and
   refusing members with absolute paths or `..` components and skipping links;
3. checks that every path in `fixed_files` exists in both trees and differs
   between them;
4. runs the case's `test` with python3 in a fresh temporary folder with
   PYTHONPATH=<unpacked>/<src_root> and a 60 s timeout: it must FAIL (non-zero
   exit) on the buggy tree and PASS (exit 0) on the fixed tree.

It prints one line per case and a final `N passed, M failed` line, and exits 1
if any case failed. Standard library only (Python 3.11+).

Usage:
    python3 scripts/verify_ticket_cases.py [--case ID ...] [--cache DIR]
                                           [--cases FILE] [--verbose]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import urllib.request
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CASES = REPO_ROOT / "tests" / "eval" / "ticket-pr-cases.toml"
DEFAULT_CACHE = REPO_ROOT / ".cache" / "ferrograph" / "ticket-eval"
TEST_TIMEOUT_S = 60
DOWNLOAD_TIMEOUT_S = 120

REQUIRED_KEYS = (
    "id", "package", "buggy_version", "fixed_version",
    "buggy_sdist_url", "buggy_sha256", "fixed_sdist_url", "fixed_sha256",
    "report_url", "src_root", "fixed_files", "test_origin", "title", "ticket", "test",
)


class CaseError(Exception):
    """A check failed for one case."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(url: str, sha256: str, cache: Path) -> Path:
    """Download url into the cache folder (once) and check its sha256."""
    name = posixpath.basename(url.split("?", 1)[0])
    if not name or name in (".", ".."):
        raise CaseError(f"bad archive URL {url!r}")
    dest = cache / name
    if dest.exists() and sha256_of(dest) == sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    try:
        req = urllib.request.Request(url, headers={"User-Agent": "ferrograph-ticket-eval"})
        with urllib.request.urlopen(req, timeout=DOWNLOAD_TIMEOUT_S) as resp, tmp.open("wb") as out:
            shutil.copyfileobj(resp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CaseError(f"download failed for {url}: {e}") from e
    got = sha256_of(tmp)
    if got != sha256:
        tmp.unlink(missing_ok=True)
        raise CaseError(f"sha256 mismatch for {name}: expected {sha256}, got {got}")
    tmp.replace(dest)
    return dest


def _safe_rel(name: str) -> str | None:
    """Return the member path with the top folder stripped, or None for the top
    folder itself. Raise CaseError on absolute paths or `..` components."""
    norm = name.replace("\\", "/")
    if norm.startswith("/") or (len(norm) > 1 and norm[1] == ":"):
        raise CaseError(f"archive member with absolute path: {name!r}")
    parts = [p for p in norm.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise CaseError(f"archive member with '..': {name!r}")
    if len(parts) <= 1:
        return None
    return "/".join(parts[1:])


def _top_folders(names: list[str]) -> set[str]:
    tops = set()
    for n in names:
        parts = [p for p in n.replace("\\", "/").split("/") if p not in ("", ".")]
        if parts:
            tops.add(parts[0])
    return tops


def unpack(archive: Path, dest: Path) -> None:
    """Unpack archive into dest, stripping the single top folder."""
    tmp = dest.with_name(dest.name + ".part")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                infos = zf.infolist()
                if len(_top_folders([i.filename for i in infos])) != 1:
                    raise CaseError(f"{archive.name}: expected exactly one top folder")
                for info in infos:
                    rel = _safe_rel(info.filename)
                    if rel is None:
                        continue
                    target = tmp / rel
                    if info.is_dir():
                        target.mkdir(parents=True, exist_ok=True)
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(info) as src, target.open("wb") as out:
                        shutil.copyfileobj(src, out)
        else:
            with tarfile.open(archive) as tf:
                members = tf.getmembers()
                if len(_top_folders([m.name for m in members])) != 1:
                    raise CaseError(f"{archive.name}: expected exactly one top folder")
                for m in members:
                    rel = _safe_rel(m.name)
                    if rel is None:
                        continue
                    target = tmp / rel
                    if m.isdir():
                        target.mkdir(parents=True, exist_ok=True)
                    elif m.isfile():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        src = tf.extractfile(m)
                        if src is None:
                            raise CaseError(f"{archive.name}: cannot read {m.name!r}")
                        with src, target.open("wb") as out:
                            shutil.copyfileobj(src, out)
                    elif m.issym() or m.islnk():
                        # Links are not needed to import a pure-Python package and
                        # could point outside the tree: skip them.
                        continue
                    else:
                        raise CaseError(f"{archive.name}: unsupported member {m.name!r}")
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CaseError(f"cannot unpack {archive.name}: {e}") from e
    except CaseError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)


def prepare_tree(case: dict, which: str, cache: Path) -> Path:
    url = case[f"{which}_sdist_url"]
    sha = case[f"{which}_sha256"]
    archive = fetch(url, sha, cache)
    dest = cache / "trees" / f"{sha[:16]}"
    marker = dest / ".ferrograph-unpacked"
    if not marker.exists():
        unpack(archive, dest)
        marker.write_text(archive.name + "\n")
    return dest


def run_test(code: str, pythonpath: Path) -> tuple[int | None, str]:
    """Run code with python3 in a temporary folder. Returns (rc, output);
    rc is None on timeout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(pythonpath)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTHONHOME", None)
    env.pop("PYTHONSTARTUP", None)
    with tempfile.TemporaryDirectory(prefix="ticket-eval-") as tmp:
        script = Path(tmp) / "case_test.py"
        script.write_text(code)
        try:
            proc = subprocess.run(
                ["python3", "-B", str(script)],
                cwd=tmp, env=env, capture_output=True, text=True, timeout=TEST_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as e:
            return None, str(e.stdout or "") + str(e.stderr or "")
    return proc.returncode, proc.stdout + proc.stderr


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "(no output)"


def verify_case(case: dict, cache: Path, verbose: bool) -> None:
    missing = [k for k in REQUIRED_KEYS if k not in case]
    if missing:
        raise CaseError(f"missing keys: {', '.join(missing)}")
    if case["test_origin"] not in ("fix", "ours"):
        raise CaseError(f"test_origin must be 'fix' or 'ours', not {case['test_origin']!r}")
    if not case["fixed_files"]:
        raise CaseError("fixed_files is empty")

    buggy = prepare_tree(case, "buggy", cache)
    fixed = prepare_tree(case, "fixed", cache)

    for rel in case["fixed_files"]:
        if rel.startswith("/") or ".." in rel.split("/"):
            raise CaseError(f"bad fixed_files path {rel!r}")
        b, f = buggy / rel, fixed / rel
        if not b.is_file():
            raise CaseError(f"fixed file {rel} missing in buggy tree")
        if not f.is_file():
            raise CaseError(f"fixed file {rel} missing in fixed tree")
        if b.read_bytes() == f.read_bytes():
            raise CaseError(f"fixed file {rel} is identical in both trees")

    src_root = case["src_root"].strip("/")
    for which, tree, want_pass in (("buggy", buggy, False), ("fixed", fixed, True)):
        pp = tree / src_root if src_root else tree
        if not pp.is_dir():
            raise CaseError(f"src_root {src_root!r} missing in {which} tree")
        rc, out = run_test(case["test"], pp)
        if verbose:
            print(f"  [{case['id']}] {which} {case[which + '_version']}: rc={rc}: {last_line(out)}")
        if rc is None:
            raise CaseError(f"test timed out after {TEST_TIMEOUT_S}s on {which} {case[which + '_version']}")
        if want_pass and rc != 0:
            raise CaseError(
                f"test fails on fixed {case['fixed_version']} (rc={rc}): {last_line(out)}")
        if not want_pass and rc == 0:
            raise CaseError(f"test passes on buggy {case['buggy_version']} (expected a failure)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", default=[], metavar="ID",
                    help="verify only this case (repeatable)")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                    help=f"download/unpack folder (default {DEFAULT_CACHE.relative_to(REPO_ROOT)})")
    ap.add_argument("--cases", type=Path, default=DEFAULT_CASES, help="case file (TOML)")
    ap.add_argument("--verbose", "-v", action="store_true", help="print each test run")
    args = ap.parse_args(argv)

    with args.cases.open("rb") as f:
        cases = tomllib.load(f).get("case", [])
    ids = [c.get("id") for c in cases]
    dups = sorted({i for i in ids if ids.count(i) > 1})
    if dups:
        print(f"duplicate case ids: {', '.join(map(str, dups))}")
        return 1
    if args.case:
        unknown = [i for i in args.case if i not in ids]
        if unknown:
            print(f"unknown case id(s): {', '.join(unknown)}")
            return 1
        cases = [c for c in cases if c["id"] in args.case]

    cache = args.cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    passed = failed = 0
    for case in cases:
        cid = case.get("id", "?")
        try:
            verify_case(case, cache, args.verbose)
        except CaseError as e:
            failed += 1
            print(f"{cid}: FAILED: {e}", flush=True)
        else:
            passed += 1
            print(f"{cid}: ok", flush=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
