"""LangGraph side of the ferrograph-vs-LangGraph graph-execution benchmark.

Builds in LangGraph the same two graphs that `ferrograph bench graph` runs and
times `graph.invoke(...)` end to end, measuring pure engine overhead (every node
is a no-op or close to it):

* ``chain10``   -- ``StateGraph`` over ``{"counter": int}`` with ten no-op nodes
  chained ``START -> n0 -> ... -> n9 -> END``; each node returns ``{}``.
  Headline metric: microseconds per node step = total time / (runs * 10).
* ``fanout100`` -- ``START -> dispatch``; a conditional edge out of ``dispatch``
  returns ``[Send("worker", {"item": i}) for i in range(100)]``; each ``worker``
  returns ``{"items": [item]}`` (reduced with ``operator.add``); then
  ``worker -> join -> END``, so ``join`` runs once after all workers.
  Headline metric: microseconds per whole run (102 node executions, so
  ``us_per_node_step`` is reported as ``us_per_run / 102``).

Each graph runs with no checkpointer (``none``), with ``InMemorySaver``
(``inmemory``) and with ``SqliteSaver`` on a fresh temporary database file
(``sqlite``). Checkpointed runs use a fresh ``thread_id`` per run. Durability is
LangGraph's default (``"async"``) unless ``--durability`` says otherwise.

Every configuration is warmed up, then invoked repeatedly for a fixed time
budget (about 2.5 s; 0.3 s with ``--quick``); each invocation is timed on its
own, giving the mean and the p50/p99 of per-run times.

Run (after ``scripts/setup-peers.sh``), from the repository root::

    benches/peers/.venv/bin/python benches/peers/langgraph_graph.py [--quick]

Output is one JSON document on stdout (progress goes to stderr)::

    {"engine": "langgraph", "version": "1.2.22", "results": [
      {"graph": "chain10", "checkpointer": "none", "us_per_node_step": ...,
       "us_per_run": ..., "p50_us_per_run": ..., "p99_us_per_run": ...,
       "runs": N}, ...]}
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import operator
import os
import platform
import sqlite3
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from typing import Annotated, Any, Callable, Iterator, TypedDict

# Keep LangSmith tracing out of the measurement whatever the environment says.
for _var in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING"):
    os.environ[_var] = "false"

from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Send  # noqa: E402

CHAIN_LEN = 10
FANOUT = 100
FANOUT_NODE_EXECUTIONS = FANOUT + 2  # dispatch + workers + join

GRAPHS = ("chain10", "fanout100")
CHECKPOINTERS = ("none", "inmemory", "sqlite")


# --------------------------------------------------------------------------- graphs


class ChainState(TypedDict):
    counter: int


class FanoutState(TypedDict):
    items: Annotated[list[int], operator.add]
    item: int


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


def _fan_out(_state: FanoutState) -> list[Send]:
    return [Send("worker", {"item": i}) for i in range(FANOUT)]


def _worker(state: FanoutState) -> dict[str, Any]:
    return {"items": [state["item"]]}


def build_fanout100(checkpointer: Any) -> Any:
    builder = StateGraph(FanoutState)
    builder.add_node("dispatch", _noop)
    builder.add_node("worker", _worker)
    builder.add_node("join", _noop)
    builder.add_edge(START, "dispatch")
    builder.add_conditional_edges("dispatch", _fan_out, ["worker"])
    builder.add_edge("worker", "join")
    builder.add_edge("join", END)
    return builder.compile(checkpointer=checkpointer)


# name -> (builder, initial input, node executions per run, result check)
GRAPH_SPECS: dict[str, tuple[Callable[[Any], Any], dict[str, Any], int, Callable[[Any], bool]]] = {
    "chain10": (
        build_chain10,
        {"counter": 0},
        CHAIN_LEN,
        lambda out: out == {"counter": 0},
    ),
    "fanout100": (
        build_fanout100,
        {"items": [], "item": 0},
        FANOUT_NODE_EXECUTIONS,
        lambda out: sorted(out["items"]) == list(range(FANOUT)),
    ),
}


# --------------------------------------------------------------------------- timing


def _make_checkpointer(kind: str, stack: ExitStack) -> Any:
    if kind == "none":
        return None
    if kind == "inmemory":
        return InMemorySaver()
    if kind == "sqlite":
        tmpdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="lg-bench-"))
        conn = sqlite3.connect(os.path.join(tmpdir, "checkpoints.sqlite"), check_same_thread=False)
        stack.callback(conn.close)
        return SqliteSaver(conn)
    raise ValueError(f"unknown checkpointer {kind!r}")


def _configs(checkpointed: bool) -> Iterator[dict[str, Any] | None]:
    while True:
        yield {"configurable": {"thread_id": uuid.uuid4().hex}} if checkpointed else None


def _percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty list."""
    rank = max(1, -(-len(sorted_values) * pct // 100))  # ceil(n * pct / 100)
    return sorted_values[int(rank) - 1]


def bench_one(
    graph_name: str,
    checkpointer_kind: str,
    seconds: float,
    warmup_seconds: float,
    durability: str | None,
) -> dict[str, Any]:
    build, initial, steps_per_run, check = GRAPH_SPECS[graph_name]
    invoke_kwargs: dict[str, Any] = {}
    if durability is not None and checkpointer_kind != "none":
        invoke_kwargs["durability"] = durability

    with ExitStack() as stack:
        graph = build(_make_checkpointer(checkpointer_kind, stack))
        configs = _configs(checkpointer_kind != "none")

        out = graph.invoke(dict(initial), next(configs), **invoke_kwargs)
        if not check(out):
            raise RuntimeError(f"{graph_name}/{checkpointer_kind}: unexpected output {out!r}")

        deadline = time.perf_counter() + warmup_seconds
        while time.perf_counter() < deadline:
            graph.invoke(dict(initial), next(configs), **invoke_kwargs)

        gc.collect()
        samples_ns: list[int] = []
        clock = time.perf_counter_ns
        deadline_ns = clock() + int(seconds * 1e9)
        while True:
            config = next(configs)
            state = dict(initial)
            start = clock()
            graph.invoke(state, config, **invoke_kwargs)
            end = clock()
            samples_ns.append(end - start)
            if end >= deadline_ns and len(samples_ns) >= 10:
                break

    runs = len(samples_ns)
    per_run_us = sorted(ns / 1e3 for ns in samples_ns)
    us_per_run = sum(samples_ns) / 1e3 / runs
    return {
        "graph": graph_name,
        "checkpointer": checkpointer_kind,
        "us_per_node_step": us_per_run / steps_per_run,
        "us_per_run": us_per_run,
        "p50_us_per_run": _percentile(per_run_us, 50),
        "p99_us_per_run": _percentile(per_run_us, 99),
        "runs": runs,
    }


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="~0.3 s per configuration instead of ~2.5 s")
    parser.add_argument("--seconds", type=float, help="timed seconds per configuration (overrides --quick)")
    parser.add_argument("--graph", choices=GRAPHS, action="append", help="only this graph (repeatable)")
    parser.add_argument(
        "--checkpointer", choices=CHECKPOINTERS, action="append", help="only this checkpointer (repeatable)"
    )
    parser.add_argument(
        "--durability",
        choices=("sync", "async", "exit"),
        help="LangGraph durability mode for checkpointed runs (default: LangGraph's own, 'async')",
    )
    args = parser.parse_args(argv)

    seconds = args.seconds if args.seconds is not None else (0.3 if args.quick else 2.5)
    warmup = min(0.5, max(0.1, seconds / 5))

    results = []
    for graph_name in args.graph or GRAPHS:
        for kind in args.checkpointer or CHECKPOINTERS:
            res = bench_one(graph_name, kind, seconds, warmup, args.durability)
            print(
                f"langgraph {graph_name:<9} {kind:<8} {res['us_per_node_step']:9.2f} us/step "
                f"{res['us_per_run']:10.1f} us/run  p50 {res['p50_us_per_run']:10.1f}  "
                f"p99 {res['p99_us_per_run']:10.1f}  ({res['runs']} runs)",
                file=sys.stderr,
            )
            results.append(res)

    json.dump(
        {
            "engine": "langgraph",
            "version": importlib.metadata.version("langgraph"),
            "checkpoint_sqlite_version": importlib.metadata.version("langgraph-checkpoint-sqlite"),
            "python": platform.python_version(),
            "durability": args.durability or "async",
            "results": results,
        },
        sys.stdout,
        indent=2,
    )
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
