#!/usr/bin/env python3
"""Side-by-side graph-execution benchmark: ferrograph vs LangGraph.

Runs both engines on the same two graphs (``chain10``: ten chained no-op nodes;
``fanout100``: one dispatch node fanning out 100 ``Send`` workers into a join)
under three checkpointing setups, pairs the results and prints a Markdown table.

1. ferrograph: ``--ferrograph-cmd`` (default
   ``target/release/ferrograph bench graph --json``), run from the repository
   root, with ``--quick`` appended when given.
2. LangGraph: ``benches/peers/langgraph_graph.py`` under the peers venv
   (``benches/peers/.venv/bin/python``, created by ``scripts/setup-peers.sh``).

The two engines run one after the other, never concurrently. Both print JSON of
the form ``{"engine": ..., "version": ..., "results": [{"graph", "checkpointer",
"us_per_node_step", "us_per_run", "p50_us_per_run", "p99_us_per_run", "runs"},
...]}``. Checkpointers are paired as

    ferrograph ``none``   <-> LangGraph ``none``
    ferrograph ``memory`` <-> LangGraph ``inmemory`` (InMemorySaver)
    ferrograph ``sled``   <-> LangGraph ``sqlite``   (SqliteSaver on a temp file)

The ratio column is LangGraph time / ferrograph time (higher means ferrograph is
faster); a configuration only one side reported is shown as ``n/a``.

Usage (from anywhere; normally via ``scripts/bench-peers.sh``)::

    python3 benches/peers/compare_graph.py [--quick] [--json]
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
LANGGRAPH_SCRIPT = PEERS_DIR / "langgraph_graph.py"
DEFAULT_LANGGRAPH_PYTHON = PEERS_DIR / ".venv" / "bin" / "python"
DEFAULT_FERROGRAPH_CMD = "target/release/ferrograph bench graph --json"

# Canonical checkpointer slot -> (ferrograph name, LangGraph name), in table order.
CHECKPOINTER_PAIRS: dict[str, tuple[str, str]] = {
    "none": ("none", "none"),
    "memory": ("memory", "inmemory"),
    "durable": ("sled", "sqlite"),
}
_FERRO_TO_SLOT = {ferro: slot for slot, (ferro, _) in CHECKPOINTER_PAIRS.items()}
_LANG_TO_SLOT = {lang: slot for slot, (_, lang) in CHECKPOINTER_PAIRS.items()}

GRAPH_ORDER = ("chain10", "fanout100")


class BenchError(Exception):
    """A side of the benchmark could not be run or produced unusable output."""


# --------------------------------------------------------------------------- running


def run_engine(label: str, argv: list[str], hint: str) -> dict[str, Any]:
    """Run one engine's benchmark command and return its parsed JSON report.

    The child's stderr (progress lines) is passed straight through; stdout must
    be a single JSON document.
    """
    print(f"compare_graph: running {label}: {shlex.join(argv)}", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, check=False)
    except FileNotFoundError:
        raise BenchError(f"{label}: command not found: {argv[0]!r} ({hint})") from None
    except PermissionError:
        raise BenchError(f"{label}: command not executable: {argv[0]!r} ({hint})") from None
    if proc.returncode != 0:
        raise BenchError(f"{label}: command exited with status {proc.returncode}: {shlex.join(argv)}")
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError as err:
        head = proc.stdout.strip()[:500] or "<empty>"
        raise BenchError(f"{label}: stdout is not valid JSON ({err}); output began with:\n{head}") from None
    if not isinstance(report, dict) or not isinstance(report.get("results"), list):
        raise BenchError(f'{label}: JSON report has no "results" list')
    for entry in report["results"]:
        if not isinstance(entry, dict) or "graph" not in entry or "checkpointer" not in entry:
            raise BenchError(f'{label}: malformed result entry (needs "graph" and "checkpointer"): {entry!r}')
    return report


# --------------------------------------------------------------------------- pairing


def _ratio(numerator: Any, denominator: Any) -> float | None:
    if isinstance(numerator, (int, float)) and isinstance(denominator, (int, float)) and denominator > 0:
        return numerator / denominator
    return None


def pair_results(ferro: dict[str, Any], lang: dict[str, Any]) -> list[dict[str, Any]]:
    """Match results by (graph, checkpointer slot); unmatched ones get a null side."""
    table: dict[tuple[str, str], dict[str, Any]] = {}

    def slot_row(graph: str, slot: str) -> dict[str, Any]:
        ferro_name, lang_name = CHECKPOINTER_PAIRS.get(slot, (None, None))
        return table.setdefault(
            (graph, slot),
            {
                "graph": graph,
                "checkpointer": slot,
                "ferrograph_checkpointer": ferro_name,
                "langgraph_checkpointer": lang_name,
                "ferrograph": None,
                "langgraph": None,
            },
        )

    for entry in ferro["results"]:
        name = entry["checkpointer"]
        slot = _FERRO_TO_SLOT.get(name, f"ferrograph:{name}")
        row = slot_row(entry["graph"], slot)
        row["ferrograph_checkpointer"] = name
        row["ferrograph"] = entry
    for entry in lang["results"]:
        name = entry["checkpointer"]
        slot = _LANG_TO_SLOT.get(name, f"langgraph:{name}")
        row = slot_row(entry["graph"], slot)
        row["langgraph_checkpointer"] = name
        row["langgraph"] = entry

    slots = list(CHECKPOINTER_PAIRS)

    def order(key: tuple[str, str]) -> tuple[int, str, int, str]:
        graph, slot = key
        g = GRAPH_ORDER.index(graph) if graph in GRAPH_ORDER else len(GRAPH_ORDER)
        s = slots.index(slot) if slot in slots else len(slots)
        return (g, graph, s, slot)

    rows = [table[key] for key in sorted(table, key=order)]
    for row in rows:
        fg, lg = row["ferrograph"] or {}, row["langgraph"] or {}
        # LangGraph time / ferrograph time; per-step and per-run ratios are
        # reported separately in case an engine counts node steps differently.
        row["ratio_per_node_step"] = _ratio(lg.get("us_per_node_step"), fg.get("us_per_node_step"))
        row["ratio_per_run"] = _ratio(lg.get("us_per_run"), fg.get("us_per_run"))
    return rows


# --------------------------------------------------------------------------- output


def _fmt_us(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "n/a"
    if value < 10:
        return f"{value:.2f}"
    if value < 1000:
        return f"{value:.1f}"
    return f"{value:,.0f}"


def _fmt_ratio(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 100:
        return f"{value:.0f}×"
    if value >= 10:
        return f"{value:.1f}×"
    return f"{value:.2f}×"


def _checkpointer_label(row: dict[str, Any]) -> str:
    lang, ferro = row["langgraph_checkpointer"], row["ferrograph_checkpointer"]
    if lang == ferro:
        return lang or row["checkpointer"]
    return f"{lang or 'n/a'} ↔ {ferro or 'n/a'}"


def _engine_banner(report: dict[str, Any], name: str) -> str:
    extras = [f"{key} {report[key]}" for key in ("python", "durability") if key in report]
    version = report.get("version", "?")
    return f"{name} {version}" + (f" ({', '.join(extras)})" if extras else "")


def render_markdown(rows: list[dict[str, Any]], ferro: dict[str, Any], lang: dict[str, Any]) -> str:
    header = [
        "graph",
        "checkpointer (LangGraph ↔ ferrograph)",
        "LangGraph µs/node step",
        "ferrograph µs/node step",
        "ratio",
        "LangGraph µs/run",
        "ferrograph µs/run",
        "ratio/run",
    ]
    lines = [
        f"{_engine_banner(lang, 'LangGraph')} vs {_engine_banner(ferro, 'ferrograph')}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---", "---"] + ["---:"] * (len(header) - 2)) + "|",
    ]
    for row in rows:
        fg, lg = row["ferrograph"] or {}, row["langgraph"] or {}
        # µs/node step is the headline for chains, µs/run for fan-out graphs
        # (one run = the whole 100-way fan-out); both are shown for every row.
        cells = [
            row["graph"],
            _checkpointer_label(row),
            _fmt_us(lg.get("us_per_node_step")),
            _fmt_us(fg.get("us_per_node_step")),
            _fmt_ratio(row["ratio_per_node_step"]),
            _fmt_us(lg.get("us_per_run")),
            _fmt_us(fg.get("us_per_run")),
            _fmt_ratio(row["ratio_per_run"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Ratio = LangGraph time / ferrograph time (higher = ferrograph faster). "
        "Means over all timed runs; see --json for p50/p99 and run counts.",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Compare ferrograph and LangGraph graph-execution overhead.",
    )
    parser.add_argument("--quick", action="store_true", help="short runs on both sides (forwarded as --quick)")
    parser.add_argument("--json", action="store_true", help="print the merged comparison as JSON, not Markdown")
    parser.add_argument(
        "--ferrograph-cmd",
        default=DEFAULT_FERROGRAPH_CMD,
        help=f"command printing ferrograph's JSON report, run from the repo root (default: {DEFAULT_FERROGRAPH_CMD!r})",
    )
    parser.add_argument(
        "--langgraph-python",
        default=str(DEFAULT_LANGGRAPH_PYTHON),
        help="Python interpreter with LangGraph installed (default: benches/peers/.venv/bin/python)",
    )
    args = parser.parse_args(argv)

    quick = ["--quick"] if args.quick else []
    ferro_argv = shlex.split(args.ferrograph_cmd) + quick
    lang_argv = [args.langgraph_python, str(LANGGRAPH_SCRIPT)] + quick

    try:
        if not ferro_argv:
            raise BenchError("ferrograph: --ferrograph-cmd is empty")
        ferro = run_engine(
            "ferrograph",
            ferro_argv,
            "build it with `cargo build --release -p ferrograph-cli`, or run scripts/bench-peers.sh",
        )
        lang = run_engine("LangGraph", lang_argv, "create the venv with scripts/setup-peers.sh")
    except BenchError as err:
        print(f"compare_graph: error: {err}", file=sys.stderr)
        return 1

    rows = pair_results(ferro, lang)
    if args.json:
        meta = lambda report: {k: v for k, v in report.items() if k != "results"}  # noqa: E731
        json.dump({"ferrograph": meta(ferro), "langgraph": meta(lang), "rows": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_markdown(rows, ferro, lang))
    return 0


if __name__ == "__main__":
    sys.exit(main())
