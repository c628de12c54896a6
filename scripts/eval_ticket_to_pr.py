#!/usr/bin/env python3
"""SWE-style evaluation of the ticket-to-PR workflow on real bugs of public Python packages.

For each case of tests/eval/ticket-pr-cases.toml (verified by scripts/verify_ticket_cases.py):
download the buggy release's sdist (sha256-checked, cached in .cache/ferrograph/ticket-eval),
make it a git repository, file the case's ticket (written by us from the public report), run
`ferrograph run ticket-to-pr` to its review gate, approve, check out the branch the workflow
made, and run the test the real fix added (or ours, from the report) against it. The test runs
in a network namespace with no network (`unshare -rn`, where the kernel allows one), a 60 s
limit, and its own temporary folder.

Reports per model: fix rate (the test passes on the branch: FAIL_TO_PASS), edits applied (the
branch changes a file), files parse (every changed .py file compiles), the fixed file touched,
time to the gate, and how often the workflow's nets fired (search/replace corrections, line
edits instead of blocks).

    scripts/eval_ticket_to_pr.py [--model NAME|PATH ...] [--case ID ...] [--smoke] [--out DIR]
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def fetch(url: str, sha256: str, cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / url.rsplit("/", 1)[-1]
    if dest.exists() and hashlib.sha256(dest.read_bytes()).hexdigest() == sha256:
        return dest
    with urllib.request.urlopen(url, timeout=120) as r:
        data = r.read()
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise RuntimeError(f"{url}: sha256 {got}, expected {sha256}")
    tmp = dest.with_suffix(dest.suffix + ".part")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return dest


def unpack(archive: Path, into: Path) -> None:
    """Unpacks with the top folder stripped; refuses absolute paths, `..` and links."""
    into.mkdir(parents=True)
    def target(name: str) -> Path | None:
        parts = Path(name).parts[1:]
        if not parts or Path(name).is_absolute() or ".." in parts:
            return None
        return into.joinpath(*parts)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for m in z.infolist():
                t = target(m.filename)
                if t is None or m.is_dir():
                    continue
                t.parent.mkdir(parents=True, exist_ok=True)
                t.write_bytes(z.read(m))
    else:
        with tarfile.open(archive) as tar:
            for m in tar.getmembers():
                t = target(m.name)
                if t is None or not m.isfile():
                    continue
                t.parent.mkdir(parents=True, exist_ok=True)
                f = tar.extractfile(m)
                if f is not None:
                    t.write_bytes(f.read())


def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="eval", GIT_AUTHOR_EMAIL="eval@localhost",
               GIT_COMMITTER_NAME="eval", GIT_COMMITTER_EMAIL="eval@localhost")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout


def sandboxed(cmd: list[str]) -> list[str]:
    """`cmd` in a network namespace with no network, where the kernel allows one."""
    for pre in (["unshare", "-rn"], ["unshare", "-n"]):
        if subprocess.run([*pre, "true"], capture_output=True).returncode == 0:
            return [*pre, *cmd]
    return cmd


def run_test(tree: Path, case: dict) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix="ticket-eval-test-") as d:
        script = Path(d) / "case_test.py"
        script.write_text(case["test"])
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": d,
               "PYTHONPATH": str(tree / case.get("src_root", "")), "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            p = subprocess.run(sandboxed([sys.executable, str(script)]), cwd=d, env=env,
                               capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return False, "timed out after 60 s"
        return p.returncode == 0, (p.stdout + p.stderr)[-1500:]


def compiles(path: Path) -> bool:
    try:
        compile(path.read_text(encoding="utf-8", errors="surrogateescape"), str(path), "exec",
                dont_inherit=True)
        return True
    except (SyntaxError, ValueError):
        return False


def ferrograph(binary: Path, data: Path, model: str, args: list[str], timeout: int) -> tuple[int, str, float]:
    env = dict(os.environ, FERROGRAPH_TICKET_TO_PR_MODEL=model, FERROGRAPH_DATA_DIR=str(data))
    started = time.monotonic()
    try:
        p = subprocess.run([str(binary), *args], env=env, capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout + p.stderr, time.monotonic() - started
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out, time.monotonic() - started


def run_case(case: dict, model: str, binary: Path, work: Path, cache: Path) -> dict:
    key = "BUG-1"  # each case has its own tickets folder
    res = {"case": case["id"], "model": model, "gate": False, "edits_applied": False,
           "files_parse": None, "fixed_file_touched": False, "fixed": False,
           "seconds_to_gate": None, "notes": []}
    root = work / f"{case['id']}-{Path(model).name}"
    if root.exists():
        shutil.rmtree(root)
    repo, tickets, data = root / "repo", root / "tickets", root / "data"
    unpack(fetch(case["buggy_sdist_url"], case["buggy_sha256"], cache), repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"{case['package']} {case['buggy_version']}")
    tickets.mkdir(parents=True)
    (tickets / f"{key}.json").write_text(json.dumps(
        {"key": key, "summary": case["title"], "description": case["ticket"].strip(), "type": "Bug"}))
    code, out, secs = ferrograph(binary, data, model, [
        "run", "--thread", f"eval-{case['id']}", "--quiet", "ticket-to-pr", "--ticket", key,
        "--tickets", str(tickets), "--repo", str(repo)], timeout=900)
    res["seconds_to_gate"] = round(secs, 1)
    (root / "run.log").write_text(out)
    for line in out.splitlines():
        if "search/replace" in line or "dropped" in line or line.startswith("error"):
            res["notes"].append(line.strip()[:300])
    if code != 2:  # 2: interrupted at the review gate
        res["notes"].append(f"run ended with exit {code} before the gate")
        return res
    res["gate"] = True
    code, out2, _ = ferrograph(binary, data, model, ["resume", "--quiet", f"eval-{case['id']}",
                                                      "--approve"], timeout=300)
    (root / "resume.log").write_text(out2)
    branches = [b.strip().lstrip("* ") for b in git(repo, "branch", "--list").splitlines()]
    branches = [b for b in branches if b and b != "main"]
    if code != 0 or not branches:
        res["notes"].append(f"approve ended with exit {code}, branches {branches}")
        return res
    branch = branches[0]
    changed = [p for p in git(repo, "diff", "--name-only", "main", branch).splitlines() if p]
    res["edits_applied"] = any(not p.startswith(("test", "tests/")) and "/test" not in p for p in changed) or bool(changed)
    res["fixed_file_touched"] = any(p in changed for p in case["fixed_files"])
    tree = root / "branch"
    git(repo, "worktree", "add", "-q", str(tree), branch)
    py = [tree / p for p in changed if p.endswith(".py") and (tree / p).exists()]
    res["files_parse"] = all(compiles(p) for p in py) if py else None
    ok, output = run_test(tree, case)
    res["fixed"] = ok
    res["test_output"] = output
    return res


def summarize(results: list[dict]) -> list[dict]:
    out = []
    for model in dict.fromkeys(r["model"] for r in results):
        rs = [r for r in results if r["model"] == model]
        n = len(rs)
        gate = [r["seconds_to_gate"] for r in rs if r["seconds_to_gate"] is not None]
        parse = [r for r in rs if r["files_parse"] is not None]
        out.append({
            "model": model, "cases": n,
            "fix_rate": sum(r["fixed"] for r in rs) / n,
            "reached_gate": sum(r["gate"] for r in rs) / n,
            "edits_applied": sum(r["edits_applied"] for r in rs) / n,
            "files_parse": (sum(bool(r["files_parse"]) for r in parse) / len(parse)) if parse else None,
            "fixed_file_touched": sum(r["fixed_file_touched"] for r in rs) / n,
            "mean_s_to_gate": round(sum(gate) / len(gate), 1) if gate else None,
            "max_s_to_gate": max(gate) if gate else None,
        })
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=str(ROOT / "tests/eval/ticket-pr-cases.toml"))
    ap.add_argument("--model", action="append", dest="models")
    ap.add_argument("--case", action="append", dest="only")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default="eval-ticket-to-pr")
    ap.add_argument("--binary", default=str(ROOT / "target/release/ferrograph"))
    args = ap.parse_args()
    cases = tomllib.loads(Path(args.cases).read_text())["case"]
    if args.smoke:
        cases = [c for c in cases if c.get("smoke")]
    if args.only:
        cases = [c for c in cases if c["id"] in args.only]
    if not cases:
        print("no cases to run", file=sys.stderr)
        return 2
    models = args.models or ["qwen2.5-coder-1.5b-instruct-q4_k_m"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    cache = ROOT / ".cache/ferrograph/ticket-eval"
    results = []
    for model in models:
        for i, case in enumerate(cases, 1):
            try:
                r = run_case(case, model, Path(args.binary), work, cache)
            except Exception as e:  # one broken case is reported, not fatal
                r = {"case": case["id"], "model": model, "gate": False, "edits_applied": False,
                     "files_parse": None, "fixed_file_touched": False, "fixed": False,
                     "seconds_to_gate": None, "notes": [f"harness error: {e}"]}
            results.append(r)
            print(f"[{i}/{len(cases)}] {case['id']} with {model}: "
                  f"{'FIXED' if r['fixed'] else 'not fixed'}; gate {r['gate']}, "
                  f"fixed file touched {r['fixed_file_touched']}, parses {r['files_parse']}, "
                  f"{r['seconds_to_gate']} s to the gate", flush=True)
    summary = summarize(results)
    (out / "results.json").write_text(json.dumps({"summary": summary, "results": results}, indent=2))
    lines = ["| model | cases | fix rate (FAIL_TO_PASS) | reached gate | edits applied | files parse | fixed file touched | s to gate (mean, max) |",
             "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        fp = "–" if s["files_parse"] is None else f"{s['files_parse']:.2f}"
        lines.append(f"| {s['model']} | {s['cases']} | {s['fix_rate']:.2f} | {s['reached_gate']:.2f} | "
                     f"{s['edits_applied']:.2f} | {fp} | {s['fixed_file_touched']:.2f} | "
                     f"{s['mean_s_to_gate']}, {s['max_s_to_gate']} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fixed = sum(r["fixed"] for r in results)
    print(f"{fixed} fixed, {len(results) - fixed} not fixed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
