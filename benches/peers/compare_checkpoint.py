#!/usr/bin/env python3
"""Side-by-side durable-checkpoint benchmark: ferrograph's SledSaver vs LangGraph's SqliteSaver.

Runs, one after the other, in one invocation:

1. ferrograph: ``--ferrograph-cmd`` (default ``target/release/ferrograph bench checkpoint
   --json``), run from the repository root, with ``--quick`` appended when given;
2. LangGraph: ``benches/peers/langgraph_checkpoint.py`` under the peers venv
   (``benches/peers/.venv/bin/python``, see ``scripts/setup-peers.sh``).

and prints a Markdown table per workload (``chain10``, ``chat500``, ``chain10_x64``): our sled
saver in sync mode against SqliteSaver with ``durability="sync"`` (the fair pairing) and with
LangGraph's default durability, with the ratio LangGraph / ferrograph of the mean and p50 cost
per checkpointed step (higher means ferrograph is cheaper), and the bytes written per step.
The ``chain10`` rows without a checkpointer give each engine's baseline, and the row
``overhead`` subtracts it (the cost of checkpointing alone). The ferrograph report also gives
the cost of a bare sled flush on this machine, a floor for one run's step in sync mode.

Usage::

    python3 benches/peers/compare_checkpoint.py [--quick] [--json]
        [--ferrograph-cmd "CMD ..."] [--langgraph-python PATH]

Only the standard library is needed to run this script itself.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

PEERS_DIR = Path(__file__).resolve().parent
REPO_ROOT = PEERS_DIR.parent.parent
LANGGRAPH_SCRIPT = PEERS_DIR / "langgraph_checkpoint.py"
DEFAULT_LANGGRAPH_PYTHON = PEERS_DIR / ".venv" / "bin" / "python"
DEFAULT_FERROGRAPH_CMD = "target/release/ferrograph bench checkpoint --json"
WORKLOADS = ("chain10", "chat500", "chain10_x64")


class BenchError(Exception):
    """A side could not be run or printed unusable output."""


def run_engine(label: str, argv: list[str]) -> dict[str, Any]:
    print(f"compare_checkpoint: running {label}: {shlex.join(argv)}", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, check=False)
    except (FileNotFoundError, PermissionError) as err:
        raise BenchError(f"{label}: cannot run {argv[0]!r}: {err}") from None
    if proc.returncode != 0:
        raise BenchError(f"{label}: exited with status {proc.returncode}: {shlex.join(argv)}")
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError as err:
        head = proc.stdout.strip()[:500] or "<empty>"
        raise BenchError(f"{label}: stdout is not JSON ({err}); it began with:\n{head}") from None
    if not isinstance(report, dict) or not isinstance(report.get("results"), list):
        raise BenchError(f'{label}: the report has no "results" list')
    return report


def find(report: dict[str, Any], workload: str, checkpointer: str, durability: str | None = None) -> dict[str, Any] | None:
    for r in report["results"]:
        if r.get("workload") == workload and r.get("checkpointer") == checkpointer:
            if durability is None or str(r.get("durability", "")).startswith(durability):
                return r
    return None


def ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
        return a / b
    return None


def fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def build_rows(ferro: dict[str, Any], lang: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for workload in WORKLOADS:
        ours = find(ferro, workload, "sled", "sync")
        for lang_durability in ("sync", "async"):
            theirs = find(lang, workload, "sqlite", lang_durability)
            rows.append(
                {
                    "workload": workload,
                    "ferrograph": "sled sync",
                    "langgraph": f"sqlite {theirs['durability'] if theirs else lang_durability}",
                    "ferrograph_us_per_step": ours and ours.get("us_per_step"),
                    "langgraph_us_per_step": theirs and theirs.get("us_per_step"),
                    "ferrograph_p50": ours and ours.get("p50_us_per_step"),
                    "langgraph_p50": theirs and theirs.get("p50_us_per_step"),
                    "ferrograph_p99": ours and ours.get("p99_us_per_step"),
                    "langgraph_p99": theirs and theirs.get("p99_us_per_step"),
                    "ratio_mean": ratio(theirs and theirs.get("us_per_step"), ours and ours.get("us_per_step")),
                    "ratio_p50": ratio(theirs and theirs.get("p50_us_per_step"), ours and ours.get("p50_us_per_step")),
                    "ferrograph_bytes_per_step": ours and ours.get("bytes_per_step"),
                    "langgraph_bytes_per_step": theirs and theirs.get("bytes_per_step"),
                }
            )
    # Checkpointing overhead alone on chain10: minus each engine's run without a checkpointer.
    ours_none, theirs_none = find(ferro, "chain10", "none"), find(lang, "chain10", "none")
    ours_sled = find(ferro, "chain10", "sled", "sync")
    theirs_sync = find(lang, "chain10", "sqlite", "sync")
    if ours_none and theirs_none and ours_sled and theirs_sync:
        o = ours_sled["us_per_step"] - ours_none["us_per_step"]
        t = theirs_sync["us_per_step"] - theirs_none["us_per_step"]
        rows.append(
            {
                "workload": "chain10 overhead",
                "ferrograph": "sled sync - none",
                "langgraph": "sqlite sync - none",
                "ferrograph_us_per_step": o,
                "langgraph_us_per_step": t,
                "ratio_mean": ratio(t, o),
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]], ferro: dict[str, Any], lang: dict[str, Any]) -> None:
    print(
        f"Durable checkpoints, cost per checkpointed step (µs): ferrograph {ferro.get('version')} "
        f"(sled {ferro.get('sled_version', '?')}) vs LangGraph {lang.get('version')} "
        f"(langgraph-checkpoint-sqlite {lang.get('checkpoint_sqlite_version')}, SQLite "
        f"{lang.get('sqlite_version')})\n"
    )
    print(
        "| workload | ferrograph | LangGraph | ours µs/step | theirs µs/step | ratio (mean) "
        "| ours p50 | theirs p50 | ratio (p50) | ours p99 | theirs p99 | ours B/step | theirs B/step |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        rm = r.get("ratio_mean")
        rp = r.get("ratio_p50")
        print(
            f"| {r['workload']} | {r['ferrograph']} | {r['langgraph']} "
            f"| {fmt(r.get('ferrograph_us_per_step'))} | {fmt(r.get('langgraph_us_per_step'))} "
            f"| {fmt(rm)}{'×' if rm is not None else ''} "
            f"| {fmt(r.get('ferrograph_p50'))} | {fmt(r.get('langgraph_p50'))} "
            f"| {fmt(rp)}{'×' if rp is not None else ''} "
            f"| {fmt(r.get('ferrograph_p99'))} | {fmt(r.get('langgraph_p99'))} "
            f"| {fmt(r.get('ferrograph_bytes_per_step'), 0)} | {fmt(r.get('langgraph_bytes_per_step'), 0)} |"
        )
    flush = ferro.get("flush")
    if isinstance(flush, dict):
        fa = flush.get("direct_flush_us") or flush.get("flush_async_us", {})
        print(
            f"\nA bare sled flush here (called directly): p50 {fmt(fa.get('p50'))} µs, p99 {fmt(fa.get('p99'))} µs "
            "(sync mode flushes once per step, so a single run's step cannot be cheaper); "
            "chain10_x64 shares flushes between concurrent runs (group commit)."
        )
    chain = next(
        (r for r in ferro.get("results", []) if r.get("workload") == "chain10" and r.get("durability") == "sync"),
        None,
    )
    floor = chain.get("interleaved_flush_us") if isinstance(chain, dict) else None
    if isinstance(floor, dict) and floor.get("step_p50_over_flush_p50") is not None:
        ratio = floor["step_p50_over_flush_p50"]
        wf = floor.get("write_and_flush_us", {})
        print(
            "One run's sync step against sled alone, measured after each of its runs (same database, same "
            f"disk, same moment): step p50 {fmt(chain.get('p50_us_per_step'))} µs / mean {fmt(chain.get('us_per_step'))} µs; "
            f"a bare flush p50 {fmt(floor.get('p50'))} µs ({ratio:.2f}×); sled writing a record of a step's size "
            f"and flushing it p50 {fmt(wf.get('p50'))} µs / mean {fmt(wf.get('mean'))} µs "
            f"({fmt(floor.get('step_p50_over_write_and_flush_p50'), 2)}× / {fmt(floor.get('step_mean_over_write_and_flush_mean'), 2)}×). "
            f"Target (≤ 1.15× a bare flush): {'meets' if ratio <= 1.15 else 'misses'} it."
        )
    concurrent = next((r for r in rows if r["workload"] == "chain10_x64" and r["langgraph"].startswith("sqlite sync")), None)
    if concurrent and concurrent.get("ratio_mean") is not None:
        verdict = "meets" if concurrent["ratio_mean"] >= 60 else "misses"
        print(
            f"Target (≥ 60× cheaper per step than SqliteSaver sync with 64 concurrent runs): "
            f"{verdict} it at {concurrent['ratio_mean']:.1f}×."
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run on both sides")
    parser.add_argument("--json", action="store_true", help="print both reports and the rows as JSON")
    parser.add_argument("--ferrograph-cmd", default=DEFAULT_FERROGRAPH_CMD, help="command printing ferrograph's JSON")
    parser.add_argument("--langgraph-python", default=str(DEFAULT_LANGGRAPH_PYTHON), help="python of the peers venv")
    args = parser.parse_args(argv)
    try:
        ferro_argv = shlex.split(args.ferrograph_cmd) + (["--quick"] if args.quick else [])
        ferro = run_engine("ferrograph", ferro_argv)
        lang_argv = [args.langgraph_python, str(LANGGRAPH_SCRIPT)] + (["--quick"] if args.quick else [])
        lang = run_engine("langgraph", lang_argv)
    except BenchError as err:
        print(f"compare_checkpoint: {err}", file=sys.stderr)
        return 1
    rows = build_rows(ferro, lang)
    if args.json:
        json.dump({"ferrograph": ferro, "langgraph": lang, "rows": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(rows, ferro, lang)
    return 0


if __name__ == "__main__":
    sys.exit(main())
