"""LangGraph side of the durable-checkpoint benchmark: SqliteSaver on the workloads of
``ferrograph bench checkpoint`` (``benches/checkpoint.rs``).

* ``chain10``  -- ten no-op nodes chained ``START -> n0 -> ... -> n9 -> END`` over
  ``{"counter": int}``; every run is a fresh thread. Each run writes 11 checkpoints (the input
  and one per node).
* ``chat500``  -- one thread, 250 turns: each turn invokes with one ``HumanMessage`` and an
  ``ai`` node answers with one ``AIMessage`` (``add_messages`` reducer), so the conversation
  reaches 500 messages. Each turn writes 2 checkpoints.
* ``chain10_x64`` -- 64 ``chain10`` runs at once (a thread pool of 16 workers, the GIL and
  SqliteSaver's lock permitting) on one SqliteSaver: amortized cost per checkpointed step.

Each workload runs with ``durability="sync"`` (the fair peer of ferrograph's sync mode: every
checkpoint is committed before the next step) and with LangGraph's default (``"async"``).
``chain10`` also runs without a checkpointer as the baseline.

A *checkpointed step* is one row of the ``checkpoints`` table; per-step times are a run's (or
turn's) wall time divided by the checkpoints it wrote, counted in the database. Bytes per step
sum the lengths of every column of the ``checkpoints`` and ``writes`` rows (keys, blobs,
metadata) divided by the checkpoints. SqliteSaver runs SQLite in WAL mode with Python's
default ``synchronous=FULL``, so each commit is fsynced.

Run (after ``scripts/setup-peers.sh``)::

    benches/peers/.venv/bin/python benches/peers/langgraph_checkpoint.py [--quick]

Prints one JSON document on stdout (progress on stderr)::

    {"engine": "langgraph", "version": ..., "results": [{"workload", "checkpointer",
     "durability", "us_per_step", "p50_us_per_step", "p99_us_per_step", "bytes_per_step",
     "steps", "runs", ...}, ...]}
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, TypedDict

for _var in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING"):
    os.environ[_var] = "false"

from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402

CHAIN_LEN = 10


class ChainState(TypedDict):
    counter: int


class ChatState(TypedDict):
    messages: Annotated[list, add_messages]


def _noop(_state: Any) -> dict[str, Any]:
    return {}


def build_chain10(checkpointer: Any) -> Any:
    builder = StateGraph(ChainState)
    for i in range(CHAIN_LEN):
        builder.add_node(f"n{i}", _noop)
    builder.add_edge(START, "n0")
    for i in range(CHAIN_LEN - 1):
        builder.add_edge(f"n{i}", f"n{i + 1}")
    builder.add_edge(f"n{CHAIN_LEN - 1}", END)
    return builder.compile(checkpointer=checkpointer)


def _ai(state: ChatState) -> dict[str, Any]:
    n = len(state["messages"])
    return {
        "messages": [
            AIMessage(content=f"Answer number {n}: thank you for your question, here is a short reply.")
        ]
    }


def build_chat(checkpointer: Any) -> Any:
    builder = StateGraph(ChatState)
    builder.add_node("ai", _ai)
    builder.add_edge(START, "ai")
    builder.add_edge("ai", END)
    return builder.compile(checkpointer=checkpointer)


class Db:
    """A SqliteSaver on a fresh temporary file, and byte accounting over its tables."""

    def __init__(self) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="lg-ckpt-bench-")
        self.path = os.path.join(self.dir.name, "checkpoints.sqlite")
        self.conn = sqlite3.connect(self.path, check_same_thread=False)
        self.saver = SqliteSaver(self.conn)
        self.saver.setup()

    def totals(self) -> tuple[int, int]:
        """(checkpoint rows, bytes of every column of checkpoints and writes)."""
        with self.saver.lock:
            cur = self.conn.cursor()
            rows, cbytes = cur.execute(
                "SELECT count(*), coalesce(sum(length(thread_id) + length(checkpoint_ns) + "
                "length(checkpoint_id) + coalesce(length(parent_checkpoint_id), 0) + "
                "coalesce(length(type), 0) + length(checkpoint) + length(metadata)), 0) "
                "FROM checkpoints"
            ).fetchone()
            (wbytes,) = cur.execute(
                "SELECT coalesce(sum(length(thread_id) + length(checkpoint_ns) + "
                "length(checkpoint_id) + length(task_id) + 8 + length(channel) + "
                "coalesce(length(type), 0) + coalesce(length(value), 0)), 0) FROM writes"
            ).fetchone()
        return int(rows), int(cbytes) + int(wbytes)

    def close(self) -> None:
        self.conn.close()
        self.dir.cleanup()


def _pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[round((len(sorted_values) - 1) * q)]


def _summary(samples: list[float]) -> tuple[float, float, float]:
    s = sorted(samples)
    return sum(s) / len(s), _pct(s, 0.5), _pct(s, 0.99)


def _kwargs(durability: str | None) -> dict[str, Any]:
    return {} if durability is None else {"durability": durability}


def bench_chain10(durability: str | None, seconds: float, checkpointer: bool) -> dict[str, Any]:
    db = Db() if checkpointer else None
    graph = build_chain10(db.saver if db else None)
    kwargs = _kwargs(durability) if checkpointer else {}

    def config() -> dict[str, Any] | None:
        return {"configurable": {"thread_id": uuid.uuid4().hex}} if checkpointer else None

    for _ in range(5):
        graph.invoke({"counter": 0}, config(), **kwargs)
    rows0, bytes0 = db.totals() if db else (0, 0)
    gc.collect()
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(samples) < 10:
        cfg = config()
        t = time.perf_counter_ns()
        graph.invoke({"counter": 0}, cfg, **kwargs)
        samples.append((time.perf_counter_ns() - t) / 1e3)
    rows1, bytes1 = db.totals() if db else (0, 0)
    runs = len(samples)
    per_run = (rows1 - rows0) / runs if db else CHAIN_LEN + 1
    mean, p50, p99 = _summary([s / per_run for s in samples])
    if db:
        db.close()
    return {
        "workload": "chain10",
        "checkpointer": "sqlite" if checkpointer else "none",
        "durability": (durability or "async(default)") if checkpointer else "none",
        "us_per_step": mean,
        "p50_us_per_step": p50,
        "p99_us_per_step": p99,
        "bytes_per_step": (bytes1 - bytes0) / max(1, rows1 - rows0) if db else 0.0,
        "checkpoints_per_run": per_run,
        "steps": int(rows1 - rows0) if db else runs * (CHAIN_LEN + 1),
        "runs": runs,
    }


def bench_chat(durability: str | None, turns: int) -> dict[str, Any]:
    db = Db()
    graph = build_chat(db.saver)
    kwargs = _kwargs(durability)
    config = {"configurable": {"thread_id": "chat"}}
    samples: list[float] = []
    rows_before, bytes_before = db.totals()
    late_bytes = late_rows = 0
    gc.collect()
    for turn in range(turns):
        r0, b0 = db.totals()
        msg = HumanMessage(content=f"Question number {turn}: could you tell me something interesting?")
        t = time.perf_counter_ns()
        out = graph.invoke({"messages": [msg]}, config, **kwargs)
        elapsed = (time.perf_counter_ns() - t) / 1e3
        r1, b1 = db.totals()
        samples.append(elapsed / max(1, r1 - r0))
        if turn >= turns - turns // 5:
            late_bytes += b1 - b0
            late_rows += r1 - r0
        if len(out["messages"]) != 2 * (turn + 1):
            raise RuntimeError(f"chat lost messages at turn {turn}")
    rows, total_bytes = db.totals()
    mean, p50, p99 = _summary(samples)
    db.close()
    return {
        "workload": "chat500",
        "checkpointer": "sqlite",
        "durability": durability or "async(default)",
        "messages": 2 * turns,
        "us_per_step": mean,
        "p50_us_per_step": p50,
        "p99_us_per_step": p99,
        "bytes_per_step": (total_bytes - bytes_before) / max(1, rows - rows_before),
        "bytes_per_step_last_fifth": late_bytes / max(1, late_rows),
        "steps": rows - rows_before,
        "runs": turns,
    }


def bench_concurrent(durability: str | None, rounds: int, width: int = 64) -> dict[str, Any]:
    db = Db()
    graph = build_chain10(db.saver)
    kwargs = _kwargs(durability)

    def one(_: int) -> None:
        graph.invoke({"counter": 0}, {"configurable": {"thread_id": uuid.uuid4().hex}}, **kwargs)

    rows0, _ = db.totals()
    with ThreadPoolExecutor(max_workers=16) as pool:
        t = time.perf_counter()
        for _ in range(rounds):
            list(pool.map(one, range(width)))
        elapsed = time.perf_counter() - t
    rows1, _ = db.totals()
    db.close()
    return {
        "workload": f"chain10_x{width}",
        "checkpointer": "sqlite",
        "durability": durability or "async(default)",
        "concurrent_runs": width,
        "us_per_step": elapsed * 1e6 / max(1, rows1 - rows0),
        "steps": rows1 - rows0,
        "runs": rounds * width,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (chat of 200 messages)")
    args = parser.parse_args(argv)
    seconds = 0.7 if args.quick else 4.0
    turns = 100 if args.quick else 250
    rounds = 1 if args.quick else 3

    results = [bench_chain10(None, seconds, checkpointer=False)]
    for durability in ("sync", None):
        results.append(bench_chain10(durability, seconds, checkpointer=True))
        results.append(bench_chat(durability, turns))
        results.append(bench_concurrent(durability, rounds))
    for r in results:
        print(
            f"langgraph {r['workload']:<12} {r['checkpointer']:<7} {r['durability']:<15} "
            f"{r['us_per_step']:10.1f} us/step  p50 {r.get('p50_us_per_step', float('nan')):10.1f}  "
            f"p99 {r.get('p99_us_per_step', float('nan')):10.1f}  "
            f"{r.get('bytes_per_step', float('nan')):9.0f} B/step",
            file=sys.stderr,
        )
    json.dump(
        {
            "engine": "langgraph",
            "version": importlib.metadata.version("langgraph"),
            "checkpoint_sqlite_version": importlib.metadata.version("langgraph-checkpoint-sqlite"),
            "sqlite_version": sqlite3.sqlite_version,
            "python": platform.python_version(),
            "results": results,
        },
        sys.stdout,
        indent=2,
    )
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
